"""Sources: where samples live. Each implements ``classes``, ``prepare()`` and ``split(name)``."""
