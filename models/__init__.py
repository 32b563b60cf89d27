"""LightningModules and networks the default runs and tests train."""
