"""Sources: where samples live. Each implements ``classes``, ``prepare()`` and ``split(name)``."""

from feedline.public import exports

__getattr__, __dir__ = exports(__name__)
