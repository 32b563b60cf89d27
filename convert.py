"""Convert any configured source into one HDF5 file that `source=hdf5` trains from.

python convert.py source=folder source.root=/data/train out.path=/data/train.h5
python convert.py source=folder source.root=/data/train out.path=/data/train-256.h5 out.max_side=256
python convert.py source=folder source.root=/data/train out.path=/data/train-raw.h5 out.mode=raw out.max_side=256
python convert.py source=folder source.root=/data/train out.format=shards out.path=/data/train-shards
python convert.py source=coco source.annotations=... source.images=... out.format=shards out.path=/data/coco-shards
"""

from __future__ import annotations

import logging

import hydra
from omegaconf import DictConfig, OmegaConf

from feedline.cli.help import register as register_help
from feedline.cli.instantiate import instantiate, require, short_errors
from feedline.cli.secrets import from_command_line

log = logging.getLogger("feedline")


def run_convert(cfg: DictConfig) -> dict:
    """Read every sample of ``cfg.source`` (its val share included) and write ``cfg.out.path``."""
    from feedline.datamodules.checkpoint.parts import check_arguments
    from feedline.writers.hdf5 import check_output

    require(cfg, "source", "out")
    options = OmegaConf.to_object(cfg.out)  # a WriteOptions: the schema conf/convert.yaml extends
    check_output(options)
    if options.format == "shards":
        from feedline.writers.shards import convert_source
    else:
        from feedline.writers.hdf5 import convert_source
    check_arguments(cfg.source, "source")  # source._target_= that keeps another source's keys, named
    source = instantiate(cfg.source, "source")
    summary = convert_source(source, options)  # refuses an out.path that is the source's data, first
    log.info(
        "converted %d images into %s: %.1f MB, %d skipped, %.1f s (%.0f images/s)%s",
        summary["images"],
        summary["path"],
        summary["bytes"] / 1e6,
        summary["skipped"],
        summary["seconds"],
        summary["images_per_s"] or 0,
        f"; skipped inputs: {summary['report']}" if summary["report"] else "",
    )
    return summary


register_help()  # --help lists the config groups a user picks from, each with its line


@from_command_line  # a secret given by value moves into the environment before Hydra reads it
@hydra.main(version_base="1.3", config_path="conf", config_name="convert")
def main(cfg: DictConfig) -> None:
    with short_errors():
        run_convert(cfg)


if __name__ == "__main__":
    main()
