"""The folder family: class-folder trees read through a cached index, lazy folders named 0..n-1, the digits default, and unlabeled folders for predict."""

from feedline.public import exports as _exports

__getattr__, __dir__ = _exports(__name__)
