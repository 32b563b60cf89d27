"""feedline's configs: the YAML groups (``pkg://feedline.conf``) and the typed schemas they extend.

``register()`` puts the schemas into Hydra's ConfigStore under ``feedline_schema/``. Hydra calls it at
start-up through ``hydra_plugins/feedline_schemas.py``, so every config composes from a fresh interpreter,
whatever was imported before. Standard library and Hydra only.
"""

from __future__ import annotations


def register() -> None:
    from hydra.core.config_store import ConfigStore

    from feedline.datamodules.options import DataConfig
    from feedline.datasets.options import (
        CocoOptions,
        FolderOptions,
        HDF5Options,
        LazyFolderOptions,
        ManifestOptions,
        SegFolderOptions,
        ShapesCocoOptions,
        ShapesOptions,
        ShardsOptions,
        WdsOptions,
    )
    from feedline.diagnostics.options import BenchOptions
    from feedline.writers.options import ConvertedHDF5Options, LaidOutLazyFolderOptions, WriteOptions

    store = ConfigStore.instance()
    store.store(group="feedline_schema", name="data", node=DataConfig)
    store.store(group="feedline_schema", name="out", node=WriteOptions)
    store.store(group="feedline_schema", name="bench", node=BenchOptions)
    sources = {
        "folder": FolderOptions,
        "lazy_folder": LazyFolderOptions,
        "hdf5": HDF5Options,
        "shards": ShardsOptions,
        "wds": WdsOptions,
        "manifest": ManifestOptions,
        "shapes": ShapesOptions,
        "seg_folder": SegFolderOptions,
        "coco": CocoOptions,
        "shapes_coco": ShapesCocoOptions,
        "converted_hdf5": ConvertedHDF5Options,
        "laid_out_lazy_folder": LaidOutLazyFolderOptions,
    }
    for name, node in sources.items():
        store.store(group="feedline_schema/source", name=name, node=node)
