"""``feedline-index ROOT``: build (or refresh) the folder index of a class-folder tree, and show it.

feedline-index ROOT [--cache-dir D] [--extensions .jpg .png] [--refresh auto|always|never] [--list]
"""

from __future__ import annotations

import argparse
import logging
import sys

from feedline.datasets.cache import REFRESH_MODES
from feedline.datasets.folder.index import open_index
from feedline.datasets.paths import IMG_EXTENSIONS


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="feedline-index", description=__doc__.split("\n")[0])
    parser.add_argument("root", help="class-folder tree: ROOT/<class>/**/<image>")
    parser.add_argument("--cache-dir", default=None, help="default: $FEEDLINE_CACHE_DIR or ~/.cache/feedline")
    parser.add_argument("--extensions", nargs="+", default=list(IMG_EXTENSIONS))
    parser.add_argument("--refresh", choices=REFRESH_MODES, default="auto")
    parser.add_argument(
        "--workers",
        default="auto",
        help="scan workers (auto: 16 threads on network filesystems, else a process per CPU)",
    )
    parser.add_argument("--list", action="store_true", help="print 'relative/path<TAB>label' per sample")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        index = open_index(
            args.root, args.extensions, args.cache_dir, args.refresh, key="ROOT", workers=args.workers
        )
    except FileNotFoundError as err:
        parser.exit(2, f"error: {err}\n")
    out = sys.stdout
    if args.list:
        for i in range(len(index)):
            out.write(f"{index.relpath(i)}\t{index.label(i)}\n")
        return 0
    out.write(f"root:    {index.root}\n")
    out.write(f"classes: {len(index.classes)}\n")
    out.write(f"samples: {len(index)}\n")
    out.write(f"cache:   {index.directory}\n")
    width = max(len(c) for c in index.classes)
    for label, (name, count) in enumerate(zip(index.classes, index.counts)):
        out.write(f"  {label:>5}  {name:<{width}}  {count}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
