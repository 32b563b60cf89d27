"""Decode, transform stacks and collate: payload -> uint8 CHW tensor -> batch."""
