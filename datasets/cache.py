"""The cache every source keeps beside the data: where it lives, when it is stale, how it is written.

    <cache_dir>/<kind>/<name>-<digest>/     one directory per cached thing (an index, a manifest, labels)

``cache_dir`` is ``source.cache_dir`` when set, else ``$FEEDLINE_CACHE_DIR``, else ``~/.cache/feedline``.
Only this user's files are read there (``storage/cache_trust.py``, the chunk cache's rule too): ``<cache_dir>`` and
``<kind>`` are made 0o700 and checked, and a directory of one cached thing is checked with every file in it
(one ``lstat`` each) when ``cache_path`` names it, at start-up: another user's directory or file, one others
can write to, or a symlink is refused by name with the fix, never read, replaced or removed.
The digest hashes what the cached content depends on (the absolute root, the extensions, a file's size
and mtime), so two datasets never share a directory and a changed input gets a new one. Every file is
written under a temporary name in the same directory and renamed into place: a reader sees the old file or
the new one, never half of one, and a killed writer leaves only a hidden temporary behind. Each file's
checksum is recorded when it is written, so a file damaged later is found and rebuilt, never trusted.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import socket
import tempfile
import zlib
from pathlib import Path

import numpy as np

from feedline.storage.cache_trust import UntrustedCacheError, check_entries, make_private, private_dirs

REFRESH_MODES = ("auto", "always", "never")


def check_refresh(value) -> str:
    """``source.refresh`` as one of REFRESH_MODES, or an error naming the key."""
    if str(value) not in REFRESH_MODES:
        raise ValueError(f"source.refresh={value!r} is not one of: {', '.join(REFRESH_MODES)}")
    return str(value)


SETTING = "source.cache_dir (or paths.cache_dir, FEEDLINE_CACHE_DIR)"  # what moves a cache, in errors


def default_cache_dir() -> str:
    return os.environ.get("FEEDLINE_CACHE_DIR") or os.path.join("~", ".cache", "feedline")


def cache_path(kind: str, name: str, key, cache_dir: str | os.PathLike | None = None) -> Path:
    """The cache directory of one thing: ``<cache_dir>/<kind>/<name>-<digest of key>``, once it can be
    trusted: ``<cache_dir>`` and ``<kind>`` made where missing and checked (``cache_trust.private_dirs``),
    and the directory itself, where it is there, checked with every file in it (``check_entries``).

    ``name`` makes the directory recognisable (a root's base name); ``key`` (JSON-serialisable) is what
    the content depends on."""
    digest = hashlib.sha1(json.dumps(key).encode("utf-8", "surrogateescape")).hexdigest()[:12]
    base = os.path.expanduser(str(cache_dir or default_cache_dir()))
    try:
        parent = private_dirs(base, [kind], SETTING)
    except UntrustedCacheError:
        raise
    except OSError as err:  # a read-only mount, a file in the way
        raise OSError(
            err.errno,
            f"cannot make the cache directory {os.path.join(base, kind)}: {err.strerror}; point "
            f"{SETTING} at a writable directory",
        ) from None
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name or "root")
    path = Path(parent) / f"{safe[:40]}-{digest}"
    check_entries(str(path), SETTING)
    return path


def disk_full(err: OSError, directory) -> OSError:
    """``err`` as it is, unless the disk is full: then an error that names the cache directory and how to
    move it."""
    if err.errno not in (errno.ENOSPC, errno.EDQUOT):
        return err
    return OSError(
        err.errno,
        f"the cache directory {directory} is full ({err.strerror}): free space there, or move the cache with "
        f"paths.cache_dir=/other/disk (source.cache_dir for one source) or FEEDLINE_CACHE_DIR=/other/disk",
    )


def temporary_prefix(name: str) -> str:
    """The prefix of a temporary that ``remove_stale`` can trace to its writer: ``.<name>.tmp-<host>-<pid>-``."""
    return f".{name}.tmp-{socket.gethostname()}-{os.getpid()}-"


def remove_stale(directory: Path, name: str) -> None:
    """Remove the temporaries of ``name`` left in ``directory`` by writers on this host that are gone (a
    build killed mid-write). Those of live writers, and of other hosts sharing the disk, stay."""
    host = socket.gethostname()
    for entry in directory.glob(f".{name}.tmp-{host}-*-*"):
        pid = entry.name[len(f".{name}.tmp-{host}-") :].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else _remove(str(entry))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def save_array(path: str | os.PathLike, array: np.ndarray, extra: dict | None = None) -> Path:
    """``np.save`` to ``path`` atomically (parents created), with a checksum record beside it
    (``<path>.sum``) that ``check_array`` verifies; ``extra``: more fields for that record (what a reader
    may then take from it instead of reading the array)."""
    path = Path(path)
    crc = _write_atomically(path, lambda f: write_array(f, array))
    write_text(_sum_path(path), json.dumps({**file_record(path, crc), **(extra or {})}))
    return path


def save_blocks(path: str | os.PathLike, dtype, length: int, blocks, extra=None) -> Path:
    """A 1-D ``.npy`` of ``length`` entries of ``dtype`` written atomically from ``blocks`` (an iterable of arrays,
    in order), never held whole; the same file and record as ``save_array`` of their concatenation. ``extra``:
    the record's further fields, or a callable that returns them once every block is written."""
    path, dtype = Path(path), np.dtype(dtype)

    def write(f) -> int:
        out = _Checksummed(f)
        header = {
            "descr": np.lib.format.dtype_to_descr(dtype),
            "fortran_order": False,
            "shape": (int(length),),
        }
        np.lib.format.write_array_header_1_0(out, header)
        written = 0
        for block in blocks:
            block = np.ascontiguousarray(block, dtype=dtype)
            out.write(block.data)
            written += len(block)
        if written != length:
            raise ValueError(f"{path.name}: {written} entries written, {length} announced")
        return out.crc

    crc = _write_atomically(path, write)
    extra = extra() if callable(extra) else extra
    write_text(_sum_path(path), json.dumps({**file_record(path, crc), **(extra or {})}))
    return path


def array_record(path: str | os.PathLike) -> dict | None:
    """The record ``save_array`` wrote beside ``path``, or None where it is missing or unreadable."""
    try:
        record = json.loads(_sum_path(Path(path)).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def add_to_record(path: str | os.PathLike, fields: dict) -> None:
    """Add ``fields`` to the record beside ``path`` (its checksum and stat fields kept): what was learned of the
    file after it was written (by a full read that found it sound)."""
    record = array_record(path)
    if record is not None:
        write_text(_sum_path(Path(path)), json.dumps({**record, **fields}))


def check_array(path: str | os.PathLike) -> str | None:
    """Why the array cached at ``path`` cannot be trusted (missing, or changed since it was written), or
    None. O(1) while the file is untouched; a changed file is checksummed."""
    path = Path(path)
    try:
        record = json.loads(_sum_path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return f"{path.name} has no checksum record" if path.exists() else f"{path.name} is missing"
    except (OSError, ValueError) as err:
        return f"its checksum record is unreadable ({err})"
    return check_record(path, record)


def _sum_path(path: Path) -> Path:
    return path.with_name(path.name + ".sum")


# -- integrity: what a cache file was when it was written --------------------------------------------
def crc32(path: str | os.PathLike) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            crc = zlib.crc32(chunk, crc)
    return crc


def file_record(path: str | os.PathLike, crc: int) -> dict:
    """The checksum of a file just written (taken as it was written), with the stat fields that tell, later,
    whether it was touched."""
    st = os.stat(path)
    return {"crc32": crc, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino}


class _Checksummed:
    """A file object that checksums what is written through it, so nothing is read back to checksum it."""

    def __init__(self, f):
        self.f, self.crc = f, 0

    def write(self, data) -> int:
        self.crc = zlib.crc32(data, self.crc)
        return self.f.write(data)


def write_array(f, array: np.ndarray) -> int:
    """``np.save`` into the open binary file ``f``; returns the CRC32 of the bytes written."""
    out = _Checksummed(f)
    np.save(out, array)
    return out.crc


def check_record(path: str | os.PathLike, record: dict) -> str | None:
    """None when ``path`` is still what ``record`` describes, else why not. A file whose size, mtime and
    inode are unchanged is trusted without being read (it was checksummed when written), so a million-entry
    index still loads in milliseconds; any write to it changes its mtime and gets it checksummed."""
    name = os.path.basename(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return f"{name} is missing"
    if (st.st_size, st.st_mtime_ns, st.st_ino) == (record["size"], record["mtime_ns"], record["ino"]):
        return None
    if st.st_size != record["size"]:
        return f"{name} is {st.st_size} bytes, {record['size']} were written (truncated or overwritten)"
    if crc32(path) != record["crc32"]:
        return f"{name} changed after it was written (checksum mismatch)"
    return None


def json_checksum(document: dict) -> int:
    """A checksum of a JSON document's content (its own ``checksum`` key left out)."""
    body = {k: v for k, v in document.items() if k != "checksum"}
    return zlib.crc32(json.dumps(body, sort_keys=True, ensure_ascii=False).encode("utf-8", "surrogateescape"))


def checked_meta(directory, fmt: int) -> dict | None:
    """``directory``'s meta.json, None where there is none; ValueError where it does not match its checksum or
    was written in another ``format`` (the caller rebuilds what it describes)."""
    path = Path(directory) / "meta.json"
    if not path.exists():
        return None
    meta = json.loads(path.read_text(encoding="utf-8"))
    if meta.get("checksum") != json_checksum(meta) or meta.get("format") != fmt:
        raise ValueError("meta.json does not match its checksum")
    return meta


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically (parents created)."""
    path = Path(path)
    _write_atomically(path, lambda f: f.write(text.encode("utf-8", "surrogateescape")))
    return path


def _write_atomically(path: Path, write):
    """``write(binary file)`` into a temporary beside ``path``, renamed into place; returns what it returns.
    Nothing is left behind when it fails, and a full disk says which cache directory is full."""
    make_private(str(path.parent))  # a cached thing's directory (its parents made by cache_path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            result = write(f)
        os.replace(tmp, path)
    except OSError as err:
        _remove(tmp)
        raise disk_full(err, path.parent) from err
    except BaseException:
        _remove(tmp)
        raise
    return result


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.remove(path)


def stale_dirs(root: str, dirs, limit: int = 5) -> list[str]:
    """Directories whose mtime changed (or that vanished) since they were recorded: O(directories) stats."""
    changed = []
    for rel, mtime_ns in dirs:
        try:
            now = os.stat(os.path.join(root, rel) if rel else root).st_mtime_ns
        except OSError:
            now = None
        if now != mtime_ns:
            changed.append(rel or ".")
            if len(changed) >= limit:
                break
    return changed
