"""Callbacks: Lightning's (throughput) and Hydra's (the sweep summary)."""
