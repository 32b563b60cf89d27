"""WebDataset tars: which files ``source.path`` names, and what one tar holds, read once with ``tarfile``.

A tar's members are grouped into samples by WebDataset's rule: a member's key is its name up to the first
dot of its file name (``train/000123.jpg`` -> ``train/000123``), the rest its extension (``jpg``,
``seg.png``), and a sample is a run of consecutive members of one key (a key that comes back later is
refused, naming it: ``_group``). A sample is its image (the first of IMAGE_EXTENSIONS it has) and its label: ``<key>.cls`` (a
class number as text) or a field of ``<key>.json`` (a number or a class name). What is kept of a sample is
where its image's bytes lie in the tar (offset, size), so a reader takes them with one ``pread``; a
sample without an image or a label is left out, and said why.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import re
import tarfile

from feedline.datasets.paths import IMG_EXTENSIONS

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = tuple(e.lstrip(".") for e in IMG_EXTENSIONS)  # a sample's image: the first it has
BLOCK = 512  # tar's block: a header, and the unit of the end-of-archive marker
COMPRESSED = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ": "xz", b"\x28\xb5\x2f\xfd": "zstd"}
_KEY = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # WebDataset's base_plus_ext


class TarError(ValueError):
    """A tar that cannot be indexed (truncated, corrupt, compressed), or one that changed after it was."""


def expand_braces(pattern: str) -> list[str]:
    """WebDataset's shard lists, as bash spells them: ``{000000..000009}`` (zero padding kept), ``{a,b}``."""
    found = re.search(r"\{([^{}]*)\}", pattern)
    if not found:
        return [pattern]
    head, body, tail = pattern[: found.start()], found.group(1), pattern[found.end() :]
    span = re.fullmatch(r"(\d+)\.\.(\d+)", body)
    if span:
        first, last = span.groups()
        width = max(len(first), len(last)) if first.startswith("0") or last.startswith("0") else 0
        step = 1 if int(last) >= int(first) else -1
        parts = [str(n).zfill(width) for n in range(int(first), int(last) + step, step)]
    else:
        parts = body.split(",")
    return [name for part in parts for name in expand_braces(head + part + tail)]


def find_tars(path: str, key: str = "source.path") -> list[str]:
    """The tars ``path`` names, absolute, in order: a directory's ``*.tar`` (sorted), one tar, or a pattern
    (``shards-{000000..000009}.tar``, ``shards-*.tar``). Each must exist: a missing one is named."""
    tars = []
    for name in expand_braces(os.path.expanduser(str(path))):
        if os.path.isdir(name):
            found = sorted(glob.glob(os.path.join(glob.escape(name), "*.tar")))
            if not found:
                raise FileNotFoundError(f"{key} '{name}' holds no *.tar files (WebDataset shards)")
        elif glob.has_magic(name):
            found = sorted(glob.glob(name))
            if not found:
                raise FileNotFoundError(f"{key} '{path}': no file matches {name}")
        elif os.path.isfile(name):
            found = [name]
        else:
            where = f" (one of the shards {path} names)" if name != str(path) else ""
            raise FileNotFoundError(f"{key} '{name}' does not exist{where} (set {key}=... or check the path)")
        tars.extend(os.path.abspath(t) for t in found)
    return list(dict.fromkeys(tars))


def split_name(name: str) -> tuple[str, str] | None:
    """(key, extension) of a member's name by WebDataset's rule; None for a name without an extension."""
    found = _KEY.match(name)
    return (found.group(1), found.group(2).lower()) if found else None


def scan_tar(path: str, label_key: str) -> tuple[list[tuple], list[str]]:
    """The samples of one tar as (image member name, offset, size, label: int or str), in the tar's order,
    and the samples left out as "path: key (why)". A tar that is compressed, truncated or corrupt is a
    TarError naming it."""
    size = check_plain(path)
    try:
        with tarfile.open(path, "r:") as tar:
            groups = _group(tar, path)
            _check_end(tar, path, size)
            samples, skipped = [], []
            for key, members in groups.items():
                image = next((members[e] for e in IMAGE_EXTENSIONS if e in members), None)
                label, why = _label(tar, members, label_key) if image else (None, "no image")
                if why:
                    skipped.append(f"{path}: {key} ({why})")
                else:
                    samples.append((image.name, image.offset_data, image.size, label))
    except (tarfile.TarError, EOFError) as err:
        raise TarError(
            f"{path} is not a complete tar ({err}): it is truncated or corrupt; replace it"
        ) from None
    return samples, skipped


def check_plain(path: str) -> int:
    """The tar's size; a TarError where it is compressed (its members have no offsets to read at)."""
    with open(path, "rb") as f:
        head = f.read(6)
    for magic, kind in COMPRESSED.items():
        if head.startswith(magic):
            raise TarError(
                f"{path} is {kind}-compressed: images are read at their offsets in a plain tar; decompress it"
            )
    return os.path.getsize(path)


def _group(tar: tarfile.TarFile, path: str) -> dict[str, dict[str, tarfile.TarInfo]]:
    """The tar's samples, key -> {extension: member}, in order: WebDataset's grouping, a run of consecutive
    members with one key. A key that comes back after another sample's members, or a member twice in one
    sample, is a TarError naming the tar and the key. WebDataset would read the first as two samples of one
    key, and they are most often one sample twice (tars concatenated, a writer restarted with its counter
    reset): drawn twice an epoch, and as likely in train as in val. Which it is cannot be told from the tar,
    so it is refused rather than trained on either way (keeping the first alone, as this once did, silently
    dropped every later sample of the key)."""
    groups: dict[str, dict[str, tarfile.TarInfo]] = {}
    first: dict[str, str] = {}  # key -> the name of its first member, for the error
    current = None
    for member in tar:
        named = split_name(member.name) if member.isfile() else None
        if not named:
            continue
        key, ext = named
        if key != current and key in groups:
            raise TarError(
                f"{path} holds sample {key!r} twice: {first[key]} and, after other samples, {member.name}. "
                f"WebDataset reads a sample's files as one only where they follow each other, so these are two "
                f"samples of one key, most often one sample twice (tars concatenated, or a writer restarted with "
                f"its counter reset). Write each sample once, under a key of its own, and index the tar again"
            )
        if key == current and ext in groups[key]:
            raise TarError(
                f"{path} holds {groups[key][ext].name} twice in sample {key!r} (a member written twice): "
                f"WebDataset refuses it too. Write each sample's files once"
            )
        current = key
        first.setdefault(key, member.name)
        groups.setdefault(key, {})[ext] = member
    return groups


def _check_end(tar: tarfile.TarFile, path: str, size: int) -> None:
    """``tarfile`` ends a listing quietly at a header it cannot read (garbage, or cut short): what follows
    the last member must be the end-of-archive marker (zero blocks), or nothing (then only whole samples
    can be missing: a warning says so)."""
    tar.fileobj.seek(tar.offset)
    tail = tar.fileobj.read(BLOCK)
    if tail.strip(b"\0"):
        raise tarfile.ReadError(f"an unreadable header at byte {tar.offset} of {size}")
    if not tail and tar.offset:
        log.warning(
            "%s ends without tar's end-of-archive marker: it may have been cut short between samples", path
        )


def _label(tar: tarfile.TarFile, members: dict, label_key: str) -> tuple[int | str | None, str | None]:
    """(label, None), or (None, why there is none): ``.cls`` holds a class number, ``.json`` a field
    ``label_key`` holding a class number or a class name."""
    if "cls" in members:
        text = tar.extractfile(members["cls"]).read().decode("utf-8", "replace").strip()
        try:
            value = int(text)
        except ValueError:
            return None, f".cls holds {text[:40]!r}, not a class number"
    elif "json" in members:
        try:
            document = json.loads(tar.extractfile(members["json"]).read())
        except ValueError as err:
            return None, f".json is not JSON: {err}"
        if not isinstance(document, dict) or label_key not in document:
            return None, f".json has no {label_key!r} (source.label_key)"
        value = document[label_key]
        if isinstance(value, bool) or not isinstance(value, (int, str)) or value == "":
            return None, f".json {label_key!r} is {value!r}, not a class number or name"
    else:
        return None, "no label: no .cls or .json"
    if isinstance(value, int) and value < 0:
        return None, f"negative label {value}"
    return value, None
