"""Hydra imports every module of ``hydra_plugins`` when it starts: feedline registers its config schemas
here, so they exist before any config is composed (``python train.py``, the compose API in a test or a
notebook, or another project with ``pkg://feedline.conf`` on its search path)."""

from feedline.conf import register

register()

# --help lists the groups a user picks from (conf/hydra/default.yaml's help template calls this resolver),
# in a project's own script too
from feedline.cli.help import register as register_help  # noqa: E402

register_help()
