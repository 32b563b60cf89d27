"""LightningDataModules: wire a source, transform stacks and a collate into Lightning's hooks."""
