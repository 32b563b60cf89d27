"""What ``bench.py`` measures and how it reports it: loader rate, stage breakdown, verdict."""
