"""``Rebuildable``: an object that remembers the arguments it was built with, as a config that builds it again.

Sources and collates inherit it, so a datamodule handed them as Python objects (from a script, or from
LightningCLI flags) can still save a config in its checkpoint: ``{"_target_": "<class path>", **arguments}``
(the class's public path, ``feedline.datasets.FolderSource``, where it has one),
when every argument is a plain value (str, number, bool, None, lists and dicts of those). Standard library
only.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping

from feedline.public import public_path


def plain(value):
    """``value`` as plain containers (OmegaConf's ListConfig/DictConfig included), or raise TypeError."""
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, Mapping) or hasattr(value, "items") and hasattr(value, "keys"):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)) or type(value).__name__ == "ListConfig":
        return [plain(v) for v in value]
    raise TypeError(f"{type(value).__name__} is not a plain value")


class Rebuildable:
    def __new__(cls, *args, **kwargs):
        self = super().__new__(cls)
        try:
            bound = inspect.signature(cls.__init__).bind(self, *args, **kwargs)
            arguments = {
                k: plain(v) for k, v in list(bound.arguments.items())[1:] if k not in ("args", "kwargs")
            }
            self._rebuild_config = {"_target_": public_path(cls), **arguments}
        except TypeError:  # an argument that is no plain value (or a call __init__ will refuse anyway)
            self._rebuild_config = None
        return self

    def rebuild_config(self) -> dict | None:
        """The config that builds this object again, or None when an argument was not a plain value."""
        return getattr(self, "_rebuild_config", None)
