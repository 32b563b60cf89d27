"""Hydra imports every module of ``hydra_plugins`` when it starts: feedline registers its config schemas
here, so they exist before any config is composed (``python train.py``, the compose API in a test or a
notebook, or another project with ``pkg://feedline.conf`` on its search path)."""

from feedline.conf import register

register()
