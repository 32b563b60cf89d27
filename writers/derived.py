"""Sources whose files are written from another source on first use: one config makes and reads them.

``experiment=backends`` trains on three forms of the same data; the HDF5 file and the lazy layout do not
exist until the first run's ``prepare()`` writes them from ``origin`` (any source). They are readers with
a writing step in front, so they live here, beside the writers, and the readers never import a writer.
"""

from __future__ import annotations

import logging
import os

from feedline.datasets.folder.lazy import LazyFolderSource
from feedline.datasets.hdf5.source import HDF5Source
from feedline.writers.lock import writer_lock
from feedline.writers.options import HDF5WriteOptions

log = logging.getLogger(__name__)


class ConvertedHDF5Source(HDF5Source):
    """``hdf5`` over ``path``; ``prepare()`` converts every sample of ``origin`` into it when the file
    does not exist yet (``convert_options``: the ``out.*`` keys of ``convert.py``, less ``path``)."""

    def __init__(self, path: str, origin, convert_options: dict | None = None, **kwargs):
        self.origin = origin
        self.convert_options = dict(convert_options or {})
        super().__init__(path, **kwargs)

    def _check_now(self) -> bool:
        return os.path.exists(self.path)

    @property
    def classes(self) -> list[str]:
        if self._inspected is None and not os.path.exists(self.path):
            return self.origin.classes  # not converted yet: the same classes, in the same order
        return super().classes

    def prepare(self) -> None:
        if not os.path.exists(self.path):
            from feedline.writers.hdf5 import convert_source

            # several nodes may get here at once: one converts, the others wait for it and read its file
            with writer_lock(self.path, "conversion", "source.path", wait=True):
                if not os.path.exists(self.path):
                    options = HDF5WriteOptions(path=self.path, **self.convert_options)
                    summary = convert_source(self.origin, options, lock=False)
                    log.info("converted %d images from %r into %s", summary["images"], self.origin, self.path)
        super().prepare()


class LaidOutLazyFolderSource(LazyFolderSource):
    """``lazy_folder`` over ``root``; ``prepare()`` lays ``origin`` (a class-folder source: folder,
    digits) out into ``root`` first, as hard links where it can (a no-op once the layout is complete)."""

    def __init__(self, root: str, origin, **kwargs):
        self.origin = origin
        super().__init__(root, **kwargs)

    def _check_root(self, root: str) -> str:
        return os.path.abspath(os.path.expanduser(str(root)))  # prepare() makes it

    @property
    def classes(self) -> list[str]:
        if self._manifest is None and not os.path.isdir(self.root):
            return self.origin.classes  # not laid out yet: the same classes
        return super().classes

    def prepare(self) -> None:
        from feedline.writers.lazy_layout import layout

        self.origin.prepare()
        log.info(layout(self.origin.root, self.root, cache_dir=self.cache_dir, wait=True))
        super().prepare()
