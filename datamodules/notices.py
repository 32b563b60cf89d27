"""Lightning's notices that no feedline user can act on, each removed by a filter narrowed to that one message.

Applied once, when feedline's LightningDataModule is imported (``image.py``), so ``train.py`` and a user's own
script that imports feedline print the same: feedline's lines, Lightning's progress and the summary.

- Lightning's product tips (``💡 Tip: ... litlogger``, ``... litmodels``): advertisements for hosted services,
  logged at INFO on every run.
- ``isinstance(treespec, LeafSpec) is deprecated``: Lightning 2.6's own ``_pytree.py`` calling an API that torch
  2.9+ deprecated; printed once per rank, fixed only by a Lightning release.
"""

from __future__ import annotations

import logging
import warnings

_TIP = "💡 Tip:"


class _NoProductTips(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_TIP)


def quiet_lightning() -> None:
    """Install the filters (idempotent)."""
    for name in (  # rank_zero_info logs through the logger of whichever of these was imported last
        "lightning.pytorch.utilities.rank_zero",
        "lightning.fabric.utilities.rank_zero",
        "pytorch_lightning.utilities.rank_zero",
        "lightning_fabric.utilities.rank_zero",
    ):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _NoProductTips) for f in logger.filters):
            logger.addFilter(_NoProductTips())
    warnings.filterwarnings(
        "ignore",
        message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        module=r"(lightning\.pytorch|pytorch_lightning)\.utilities\._pytree",
    )
