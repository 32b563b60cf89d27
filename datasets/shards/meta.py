"""What a shards dataset says about itself, read once and checked before anything trusts it.

    index.json      LitData's index: the chunks in row order, each {"filename", "chunk_size", "chunk_bytes"}
    feedline.json   feedline's sidecar: the classes, the sample count, the settings it was written with, and
                    each chunk's digest ({"chunk_digests": {"algorithm": "sha256", "chunks": {name: hex}}})
    labels.npy      every sample's label in row order (int64, one dimension)

A local directory and an object-storage prefix are read by the same functions (through ``storage/stores.py``), so
the two can never check differently. Every value the reader relies on is checked for its type and range
where the file is loaded, and a file that fails names itself, the entry and the key, and says to copy or
convert the dataset again: an edited or damaged file stops the run at start, never deep in a worker.

A chunk's digest is checked where a chunk is downloaded (``storage/chunk_cache.py``, as its bytes arrive, before it
is published): a chunk replaced in a bucket by another of the same size and labels is refused there. A
local chunk is never hashed on read (that would cost CPU per image): it is checked by its size, its offsets
table and its samples' labels (``chunks.py``). A dataset written before digests were recorded has none, and
is read as before.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from feedline.datasets.cache import cache_path, check_array, json_checksum, save_array, write_text
from feedline.datasets.shards.fields import fields_of_schema
from feedline.datasets.shards.leaves import LayoutError, layout_of
from feedline.storage.cache_trust import UntrustedCacheError, make_private
from feedline.storage.stores import LocalStore

SIDECAR = "feedline.json"
LABELS = "labels.npy"
FORMAT = "feedline-shards/1"  # (image bytes, int label) tuples
FIELDS_FORMAT = "feedline-shards/2"  # dicts of named fields (``datasets/shards/leaves.py``, ``fields.py``)
TUPLE = ["bytes", "int"]  # the data_format of a version-1 sample
CHUNK = re.compile(r"chunk-\d+-\d+\.bin")  # LitData's chunk names: a plain name in the dataset's folder
CHUNK_LINES = re.compile(rf"(?:{CHUNK.pattern}\n)*{CHUNK.pattern}")  # lines of them (no name holds a newline)
MAX_BYTES = 2**32 - 1  # a chunk's offsets are uint32
DIGEST = "sha256"  # how the writer digests each chunk (recorded with the digests)
DIGESTS = {"sha256": 64, "blake2b": 128}  # the algorithms a sidecar may name: hex digits of a digest of each
AGAIN = "copy the dataset again, or convert it again"


class ChunkError(RuntimeError):
    """A chunk is missing, truncated, or not in the layout feedline reads: the dataset, not a sample, is bad."""


def as_store(where):
    """A store (``storage/stores.py``) as it is, a local directory's path as a ``LocalStore``."""
    return where if hasattr(where, "read") else LocalStore(str(where))


def join(rel: str, name: str) -> str:
    return f"{rel}/{name}" if rel else name


def read_json(store, rel: str, error: type[Exception]) -> dict:
    """The JSON object in ``rel`` of ``store``, or ``error`` naming the file (a garbled or truncated copy)."""
    where = store.where(rel)
    try:
        value = json.loads(store.read(rel))
    except (ValueError, RecursionError) as err:  # JSONDecodeError, UnicodeDecodeError; nested past any use
        raise error(f"{where} is not readable JSON ({type(err).__name__}: {err}): {AGAIN}") from None
    if not isinstance(value, dict):
        raise error(f"{where} holds {type(value).__name__}, not a JSON object: {AGAIN}")
    return value


# -- index.json ----------------------------------------------------------------------------------------------
def load_index(where, rel: str = "") -> list[dict]:
    """The chunks of the dataset directory ``rel`` of ``where`` (a path or a store), from its index.json, once
    the layout is one feedline reads and every entry is a chunk of this directory with whole counts."""
    store = as_store(where)
    shown = store.where(join(rel, "index.json"))
    return _entries(read_json(store, join(rel, "index.json"), ChunkError), shown)


def _entries(index: dict, shown: str) -> list[dict]:
    """index.json's (``index``, read from ``shown``) chunks, each entry checked (``load_index``)."""
    if not isinstance(index.get("chunks"), list):
        raise ChunkError(f"{shown}: no list of chunks; {AGAIN}")
    config = index.get("config") or {}
    if not isinstance(config, dict):
        raise ChunkError(f"{shown}: its config is {type(config).__name__}, not an object; {AGAIN}")
    for name in ("compression", "encryption"):
        if config.get(name):
            raise ChunkError(
                f"{shown}: {name}={config[name]!r}; feedline reads uncompressed, unencrypted chunks (the images are "
                f"compressed files already). Write the dataset again with python convert.py out.format=shards"
            )
    sample_layout(config, shown)
    if _entries_sound(index["chunks"]):
        return index["chunks"]
    seen: set[str] = set()  # one is not: the first that is not is named
    return [_checked_entry(entry, k, shown, seen) for k, entry in enumerate(index["chunks"])]


def _entries_sound(entries: list) -> bool:
    """Whether every entry passes ``_checked_entry``, checked a column at a time (a million entries in a
    second): False where any may not, and ``_checked_entry`` then names the first that does not."""
    try:
        if not all(type(entry) is dict for entry in entries):
            return False
        names = [entry["filename"] for entry in entries]
        columns = [[entry[key] for entry in entries] for key in ("chunk_size", "chunk_bytes")]
    except KeyError:
        return False
    if not (all(type(name) is str for name in names) and _all_chunk_names(names)) or len(set(names)) != len(
        names
    ):
        return False
    for column, least in zip(columns, (0, 8)):
        if not all(type(value) is int for value in column):
            return False
        try:
            values = np.asarray(column, dtype=np.int64)
        except OverflowError:
            return False
        if len(values) and not (least <= values.min() and values.max() <= MAX_BYTES):
            return False
    return True


def _all_chunk_names(names: list[str]) -> bool:
    """Whether each of ``names`` (str) is a chunk's name (``CHUNK``), with one match over them all."""
    joined = "\n".join(names)
    return not names or (joined.count("\n") == len(names) - 1 and CHUNK_LINES.fullmatch(joined) is not None)


def sample_layout(config: dict, shown: str):
    """None for a version-1 index ((image bytes, int label) tuples), else each leaf's (path, serializer) of
    its dict samples (``leaves.layout_of``), or a ChunkError naming the index."""
    formats = config.get("data_format")
    if config.get("item_loader") == "PyTreeLoader" and formats == TUPLE and not _dict_spec(config):
        return None
    try:
        if config.get("item_loader") != "PyTreeLoader" or not _dict_spec(config):
            raise LayoutError("")
        return layout_of(config)
    except LayoutError as err:
        raise ChunkError(
            f"{shown}: samples of {formats} read by {config.get('item_loader')}"
            f"{' (' + str(err) + ')' if str(err) else ''}; feedline reads (image bytes, int label) samples and "
            f"dicts of named fields as python convert.py out.format=shards writes them"
        ) from None


def _dict_spec(config: dict) -> bool:
    """Whether the samples' tree (LitData's data_spec) is a dict at its root."""
    try:
        spec = json.loads(config.get("data_spec") or "null")
    except (TypeError, ValueError):
        return False
    return (
        isinstance(spec, list)
        and len(spec) == 2
        and isinstance(spec[1], dict)
        and spec[1].get("type") == "builtins.dict"
    )


def index_layout(where, rel: str = ""):
    """The sample layout of ``rel``'s index.json (``sample_layout``): None for version-1 samples."""
    store = as_store(where)
    return sample_layout(read_json(store, join(rel, "index.json"), ChunkError).get("config") or {}, "")


def _checked_entry(entry, k: int, shown: str, seen: set) -> dict:
    """Entry ``k`` of index.json's chunks: a chunk's plain file name, listed once, its sample count and size in
    bytes whole numbers in range (a bool, a float or a string is not a count)."""
    if not isinstance(entry, dict):
        raise ChunkError(f"{shown}: chunks[{k}] is {type(entry).__name__}, not an object; {AGAIN}")
    name = entry.get("filename")
    what = f"{shown}: chunks[{k}]" + (f" ({name})" if isinstance(name, str) and CHUNK.fullmatch(name) else "")

    def bad(key: str, why: str) -> ChunkError:
        return ChunkError(f"{what}: {key} {why}; the index was edited or damaged: {AGAIN}")

    for key in ("filename", "chunk_size", "chunk_bytes"):
        if key not in entry:
            raise bad(key, "is missing")
    if not isinstance(name, str) or not CHUNK.fullmatch(name):
        raise bad("filename", f"{name!r} is not a chunk's name in the dataset's folder (chunk-<w>-<n>.bin)")
    if name in seen:
        raise bad("filename", f"{name!r} is listed twice")
    seen.add(name)
    for key, least in (("chunk_size", 0), ("chunk_bytes", 8)):
        test, text = _whole(least, MAX_BYTES)
        if not test(entry[key]):
            raise bad(key, f"{entry[key]!r} is not {text}")
    return entry


def index_identity(directory: str) -> tuple[int, int]:
    """(inode, mtime_ns) of ``directory``'s index.json: a new conversion writes a new one."""
    st = os.stat(os.path.join(directory, "index.json"))
    return st.st_ino, st.st_mtime_ns


# -- the chunk index, once per node ---------------------------------------------------------------------------
# index.json lists one entry per chunk: 1.67 million of them for a billion samples, tens of MB of JSON and
# seconds of checks. It is parsed and checked once per node (the first process to read this version of it)
# into arrays cached beside feedline's other caches, and every other process maps them (``chunk_index``).
INDEX_FORMAT = 1  # of the cached arrays
INDEX_ARRAYS = ("sizes", "nbytes", "starts", "names")


class ChunkIndex(NamedTuple):
    """What index.json says of each chunk of a dataset's parts, as arrays (memory-mapped where cached):
    ``sizes`` (samples), ``nbytes`` (file size), ``starts`` (first row of each chunk, and the total last),
    ``names`` (file names, fixed-width bytes), ``firsts`` (each part's first chunk), ``layout`` (the parts'
    one sample layout, ``sample_layout``), ``stats`` (per part, what its index.json was: (inode, mtime_ns)),
    ``where``: the cache directory that holds the arrays, or None (parsed in this process, not cached)."""

    sizes: np.ndarray
    nbytes: np.ndarray
    starts: np.ndarray
    names: np.ndarray
    firsts: list[int]
    layout: list | None
    stats: list[tuple[int, int]]
    where: str | None


def _index_key(directories: list[str]) -> tuple[list, list[tuple[int, int]]]:
    """What each part's index.json is now (real path, size, mtime_ns, inode, ctime_ns): the cache's key; and
    its (inode, mtime_ns), what a chunk checks its dataset by before it is opened (``Chunks._check_current``)."""
    key, stats = [], []
    for directory in directories:
        st = os.stat(os.path.join(directory, "index.json"))
        key.append([os.path.realpath(directory), st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns])
        stats.append((st.st_ino, st.st_mtime_ns))
    return key, stats


def parse_index(directories: list[str], layouts) -> ChunkIndex:
    """Every chunk of ``directories`` (a dataset's parts, in order) from their index.json files, each read
    once and each entry checked (``load_index``): the per-chunk parser, run once per node. ``layouts(parts,
    layout_of_part)``: the parts' one sample layout (``chunks.part_layouts``)."""
    sizes, nbytes, names, firsts, layout_of = [], [], [], [], {}
    for directory in directories:
        store = as_store(directory)
        index = read_json(store, "index.json", ChunkError)
        layout_of[directory] = sample_layout(index.get("config") or {}, "")  # as ``index_layout`` reads it
        firsts.append(len(names))
        for chunk in _entries(index, store.where("index.json")):
            names.append(chunk["filename"].encode())
            sizes.append(chunk["chunk_size"])
            nbytes.append(chunk["chunk_bytes"])
        del index
    layout = layouts(directories, layout_of.__getitem__)
    sizes = np.asarray(sizes, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    return ChunkIndex(
        sizes,
        np.asarray(nbytes, dtype=np.int64),
        starts,
        np.asarray(names, dtype=bytes) if names else np.zeros(0, dtype="S1"),
        firsts,
        layout,
        [],
        None,
    )


def chunk_index(directories: list[str], layouts, cache_dir=None, cache: bool = True) -> ChunkIndex:
    """The chunks of the local dataset ``directories`` (its parts, in order): the arrays cached for their
    index.json files as they are now (their path, size, mtime and inode), mapped, or parsed and checked here
    (``parse_index``) and cached for the node's other processes. ``cache=False``, or a cache that cannot be
    written (a read-only disk): parsed, not cached. A cache directory of another user is refused by name."""
    directories = [str(d) for d in directories]
    try:
        key, stats = _index_key(directories)
    except OSError:  # no index.json: the parser says so, as it always did
        return parse_index(directories, layouts)
    where = None
    if cache:
        try:
            where = cache_path("shards-index", os.path.basename(directories[0].rstrip("/")), key, cache_dir)
            found = load_chunk_index(where, key)
            if found is not None:
                return found._replace(stats=stats)
        except UntrustedCacheError:
            raise
        except OSError:
            where = None
    if where is None:
        return parse_index(directories, layouts)._replace(stats=stats)
    with _parsing(where):  # the node's processes that start together: one parses, the others map its arrays
        found = load_chunk_index(where, key)
        if found is not None:
            return found._replace(stats=stats)
        parsed = parse_index(directories, layouts)._replace(stats=stats)
        try:
            return _save_index(where, key, parsed)._replace(stats=stats)
        except UntrustedCacheError:
            raise
        except OSError:  # a full or read-only disk: this process keeps what it parsed
            return parsed


@contextlib.contextmanager
def _parsing(where):
    """Held while one process parses an index into ``where``: an exclusive ``flock`` on a file there, which
    the kernel releases when its holder dies. Without one (a file system that has no locks) each parses."""
    fd = None
    try:
        make_private(str(where))
        fd = os.open(os.path.join(where, ".parsing"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
    except UntrustedCacheError:
        raise
    except OSError:
        pass
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)


def _save_index(where, key: list, parsed: ChunkIndex) -> ChunkIndex:
    for name in INDEX_ARRAYS:
        save_array(os.path.join(where, f"{name}.npy"), getattr(parsed, name))
    meta = {"format": INDEX_FORMAT, "key": key, "firsts": parsed.firsts, "layout": parsed.layout}
    meta["checksum"] = json_checksum(meta)
    write_text(os.path.join(where, "index.json"), json.dumps(meta))  # written last: the entry is whole
    return load_chunk_index(where, key) or parsed


def load_chunk_index(where, key: list | None = None) -> ChunkIndex | None:
    """The chunk index cached in ``where`` (each array mapped), when it is whole, unchanged since it was
    written and (with ``key``) of those index.json files; else None. O(1): a stat per file."""
    try:
        with open(os.path.join(where, "index.json"), encoding="utf-8") as f:
            meta = json.load(f)
        if not isinstance(meta, dict) or meta.get("checksum") != json_checksum(meta):
            return None
        if meta.get("format") != INDEX_FORMAT or (key is not None and meta.get("key") != key):
            return None
        arrays = {}
        for name in INDEX_ARRAYS:
            path = os.path.join(where, f"{name}.npy")
            if check_array(path) is not None:
                return None
            arrays[name] = np.load(path, mmap_mode="r")
    except (OSError, ValueError):
        return None
    return ChunkIndex(
        firsts=[int(first) for first in meta["firsts"]],
        layout=meta["layout"],
        stats=[],
        where=str(where),
        **arrays,
    )


# -- feedline.json -------------------------------------------------------------------------------------------
def _whole(least: int = 0, most: int | None = None):
    """A field's test and its words: a whole number in range (a bool, a float or a string is not one)."""

    def test(value) -> bool:
        return type(value) is int and least <= value and (most is None or value <= most)

    return test, f"a whole number >= {least}" if most is None else f"a whole number in {least}..{most}"


def _or_null(check):
    test, text = check
    return (lambda value: value is None or test(value)), f"null or {text}"


def _text(value) -> bool:
    return isinstance(value, str)


# What the sidecar may hold: each field's test and what it must be. Only "classes" and "samples" must be
# there (older conversions lack some of the others); a field that is there is always checked.
FIELDS = {
    "classes": (
        lambda v: isinstance(v, list) and bool(v) and all(isinstance(n, str) and n for n in v),
        "a list of class names",
    ),
    "samples": _whole(),
    "skipped": _whole(),
    "chunks": _whole(),
    "max_side": _whole(),
    "quality": _whole(1, 100),
    "shuffle": (lambda v: isinstance(v, bool), "true or false"),
    "seed": _whole(),
    "rows": _whole(),
    "part": _or_null(_whole()),
    "parts": _or_null(_whole(1)),
    "source": (_text, "a description of the source"),
    "source_kind": (_text, "the name of the source's records type"),
    "mode": (lambda v: v == "encoded", '"encoded" (shards hold image files; out.mode=raw is not written)'),
    "chunk_bytes": _whole(1),
}
REQUIRED = ("classes", "samples")
HEX = re.compile(r"[0-9a-f]+")


def file_digest(path: str, algorithm: str = DIGEST) -> str:
    """The hex digest of the whole file ``path`` (the writer's, of each chunk it wrote)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, algorithm).hexdigest()


def _check_digests(value, shown: str) -> None:
    """The sidecar's ``chunk_digests``: an algorithm of ``DIGESTS`` and a digest of that length per chunk name,
    or a ValueError naming the file and the first entry that is not (never the whole map: it has one entry
    per chunk)."""

    def bad(where: str, why: str) -> ValueError:
        return ValueError(f"{shown}: chunk_digests{where} {why}; the sidecar was edited or damaged: {AGAIN}")

    if not isinstance(value, dict) or set(value) != {"algorithm", "chunks"}:
        keys = sorted(value) if isinstance(value, dict) else type(value).__name__
        raise bad("", f"holds {keys}, not an algorithm and its chunks' digests")
    algorithm, chunks = value["algorithm"], value["chunks"]
    if algorithm not in DIGESTS:
        raise bad('["algorithm"]', f"{algorithm!r} is not one of {', '.join(DIGESTS)}")
    if not isinstance(chunks, dict):
        raise bad('["chunks"]', f"is {type(chunks).__name__}, not an object of chunk names and digests")
    if _digests_sound(chunks, DIGESTS[algorithm]):
        return
    for name, digest in chunks.items():  # one is not: the first that is not is named
        if not CHUNK.fullmatch(name):
            raise bad(
                '["chunks"]', f"names {name!r}, not a chunk of the dataset's folder (chunk-<w>-<n>.bin)"
            )
        if not (isinstance(digest, str) and len(digest) == DIGESTS[algorithm] and HEX.fullmatch(digest)):
            raise bad(
                f'["chunks"][{name!r}]',
                f"= {digest!r} is not a {algorithm} digest ({DIGESTS[algorithm]} hex digits)",
            )


def _digests_sound(chunks: dict, digits: int) -> bool:
    """Whether each of ``chunks`` is a chunk's name and a digest of ``digits`` hex digits, checked with one
    match over all the names and one over all the digests."""
    digests = list(chunks.values())
    if not (_all_chunk_names(list(chunks)) and all(type(d) is str and len(d) == digits for d in digests)):
        return False
    return HEX.fullmatch("".join(digests)) is not None or not digests


def chunk_digests(sidecar: dict, entries: list[dict], shown: str) -> list[tuple[str, str] | None]:
    """Per chunk of ``entries`` (index.json's, in order), the (algorithm, hex digest) the sidecar records, or
    None for each where it records none (an earlier feedline's). A sidecar that records digests records one
    per chunk index.json names, no other: else a ValueError naming it (``shown``) and the chunk."""
    if "chunk_digests" not in sidecar:
        return [None] * len(entries)
    recorded = sidecar["chunk_digests"]
    algorithm, digests = recorded["algorithm"], recorded["chunks"]
    names = [entry["filename"] for entry in entries]
    missing = [name for name in names if name not in digests]
    extra = sorted(set(digests) - set(names))
    if missing or extra:
        which = f"none for {missing[0]}" if missing else f"one for {extra[0]}, which index.json does not list"
        raise ValueError(
            f"{shown}: records the digests of {len(digests)} chunks, index.json lists {len(names)} ({which}): its "
            f"files are not of one conversion (copied together from two, or edited); {AGAIN}"
        )
    return [(algorithm, digests[name]) for name in names]


SIDECAR_FORMAT = 1  # of a sidecar's cached copy


class RecordedDigests(Mapping):
    """A local sidecar's ``chunk_digests["chunks"]`` as its cached copy gives it: how many there are (what
    ``labels.check_counts`` compares) without the digests themselves; the first look at one reads the sidecar
    whole (``read_sidecar(..., cache=False)``). A local chunk is never hashed: only a download needs them."""

    def __init__(self, path: str, count: int):
        self.path, self.count, self._digests = path, int(count), None

    def _all(self) -> dict:
        if self._digests is None:
            directory = os.path.dirname(self.path)
            self._digests = read_sidecar(directory, cache=False)["chunk_digests"]["chunks"]
        return self._digests

    def __len__(self) -> int:
        return self.count

    def __iter__(self):
        return iter(self._all())

    def __getitem__(self, name: str) -> str:
        return self._all()[name]

    def __reduce__(self):
        return RecordedDigests, (self.path, self.count)


def read_sidecar(where, rel: str = "", cache_dir=None, cache: bool = True) -> dict:
    """``rel``'s feedline.json, every field it holds of its type and range, or a ValueError naming the file
    and the field.

    A local sidecar is checked whole once per node, then read from a copy cached beside feedline's other
    caches (keyed by its path, size, mtime and inode) without its chunks' digests: they are one per chunk
    (150 MB of JSON for a billion samples), and only a download checks them (``RecordedDigests``)."""
    store = as_store(where)
    if not cache or store.remote:
        return _read_sidecar(store, rel)
    path = store.where(join(rel, SIDECAR))
    try:
        st = os.stat(path)
        key = [os.path.realpath(path), st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns]
        directory = cache_path("shards-sidecar", os.path.basename(os.path.dirname(key[0])), key, cache_dir)
        found = _cached_sidecar(directory, key, path)
    except UntrustedCacheError:
        raise
    except OSError:  # no sidecar (the reader says so), or no cache to write
        return _read_sidecar(store, rel)
    if found is not None:
        return found
    sidecar = _read_sidecar(store, rel)
    body = {k: v for k, v in sidecar.items() if k != "chunk_digests"}
    digests = sidecar.get("chunk_digests")
    record = {"format": SIDECAR_FORMAT, "key": key, "sidecar": body}
    if digests is not None:
        record["digests"] = [digests["algorithm"], len(digests["chunks"])]
    record["checksum"] = json_checksum(record)
    try:
        write_text(os.path.join(directory, SIDECAR), json.dumps(record))
    except UntrustedCacheError:
        raise
    except OSError:
        pass  # a full disk: read whole again next time
    return sidecar


def _cached_sidecar(directory, key: list, path: str) -> dict | None:
    """The sidecar cached in ``directory`` for ``key``, or None."""
    try:
        with open(os.path.join(directory, SIDECAR), encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("checksum") != json_checksum(record):
        return None
    if record.get("format") != SIDECAR_FORMAT or record.get("key") != key:
        return None
    sidecar = record["sidecar"]
    if "digests" in record:
        algorithm, count = record["digests"]
        sidecar["chunk_digests"] = {"algorithm": algorithm, "chunks": RecordedDigests(path, count)}
    return sidecar


def _read_sidecar(store, rel: str) -> dict:
    """``read_sidecar``, the whole file parsed and checked (every chunk's digest)."""
    shown = store.where(join(rel, SIDECAR))
    sidecar = read_json(store, join(rel, SIDECAR), ValueError)
    if sidecar.get("format") not in (FORMAT, FIELDS_FORMAT):
        raise ValueError(f"{shown}: format {sidecar.get('format')!r}, not {FORMAT!r} nor {FIELDS_FORMAT!r}")
    if any(key not in sidecar for key in REQUIRED):
        raise ValueError(f"{shown}: no list of classes and count of samples; convert the dataset again")
    named = sidecar["format"] == FIELDS_FORMAT
    if named:  # the field schema, whole (a target without a class list has no classes)
        fields = fields_of_schema(sidecar.get("fields"), sidecar.get("target"), shown)
        if sidecar["classes"] != fields.classes:
            raise ValueError(
                f"{shown}: classes {sidecar['classes'][:5]} are not those of its target field "
                f"{fields.target!r}; the sidecar was edited or damaged: {AGAIN}"
            )
    for key, (test, text) in FIELDS.items():
        if named and key == "classes" and sidecar[key] == []:
            continue
        if key in sidecar and not test(sidecar[key]):
            raise ValueError(
                f"{shown}: {key}={sidecar[key]!r} is not {text}; the sidecar was edited or damaged: {AGAIN}"
            )
    if "chunk_digests" in sidecar:
        _check_digests(sidecar["chunk_digests"], shown)
    part, parts = sidecar.get("part"), sidecar.get("parts")
    if (part is None) != (parts is None) or (parts is not None and part >= parts):
        raise ValueError(f"{shown}: part={part!r} of parts={parts!r} is no part of a conversion; {AGAIN}")
    return sidecar
