"""feedline's configs: the YAML groups (``pkg://feedline.conf``) and the typed schemas they extend.

``register()`` puts the schemas into Hydra's ConfigStore under ``feedline_schema/``. Hydra calls it at
start-up through ``hydra_plugins/feedline_schemas.py``, so every config composes from a fresh interpreter,
whatever was imported before. Standard library and Hydra only.
"""

from __future__ import annotations


def register() -> None:
    from hydra.core.config_store import ConfigStore

    from feedline.datamodules.options import DataConfig
    from feedline.writers.options import HDF5WriteOptions

    store = ConfigStore.instance()
    store.store(group="feedline_schema", name="data", node=DataConfig)
    store.store(group="feedline_schema", name="hdf5_out", node=HDF5WriteOptions)
