"""What the command lines share (building objects from config), and the small non-Hydra command lines."""
