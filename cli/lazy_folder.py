"""``feedline-lazy-folder``: lay out a class-folder tree as a lazy_folder tree, or verify one.

feedline-lazy-folder layout SRC DST [--move] [--cache-dir D]
feedline-lazy-folder verify ROOT [--extension .jpg]
"""

from __future__ import annotations

import argparse
import logging
import sys

from feedline.datasets.folder.lazy_checks import LayoutError, verify_tree
from feedline.writers.lock import OutputBusyError


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="feedline-lazy-folder", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    lay = commands.add_parser("layout", help="lay out a class-folder tree as 0..n-1 files per class")
    lay.add_argument("src", help="class-folder tree (ImageFolder layout)")
    lay.add_argument("dst", help="new tree; hard links when on the same filesystem, copies otherwise")
    lay.add_argument("--move", action="store_true", help="move the files instead (SRC is emptied)")
    lay.add_argument("--cache-dir", default=None, help="where SRC's folder index is cached")
    ver = commands.add_parser("verify", help="check every class holds exactly 0..n-1, without reading images")
    ver.add_argument("root")
    ver.add_argument("--extension", default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    try:
        if args.command == "layout":
            from feedline.writers.lazy_layout import layout

            print(layout(args.src, args.dst, move=args.move, cache_dir=args.cache_dir))
            return 0
        reports = verify_tree(args.root, args.extension)
    except (FileNotFoundError, LayoutError, OutputBusyError) as err:
        parser.exit(2, f"error: {err}\n")
    bad = [r for r in reports if not r.ok]
    for r in bad:
        print(r.describe())
    print(f"{len(reports)} classes, {sum(r.count for r in reports)} samples, {len(bad)} with defects")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
