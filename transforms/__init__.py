"""Decode, transform stacks and collate: payload -> uint8 CHW tensor -> batch."""

from feedline.public import exports

__getattr__, __dir__ = exports(__name__)
