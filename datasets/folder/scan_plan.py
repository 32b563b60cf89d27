"""How a class-folder tree is listed: threads, processes or serially, and how many (``source.scan_workers``).

Network filesystems (NFS, Lustre, GPFS, CIFS, FUSE, ...) make each listing a round trip, which threads
hide; on a local disk listing is CPU-bound, and ``datasets/folder/scan.py`` runs fresh interpreters instead.
"""

from __future__ import annotations

import os

from feedline.datasets.folder.scan import available_cpus

NETWORK_FILESYSTEMS = {
    "nfs",
    "nfs4",
    "cifs",
    "smb3",
    "smbfs",
    "lustre",
    "gpfs",
    "beegfs",
    "ceph",
    "cephfs",
    "glusterfs",
    "9p",
    "afs",
    "panfs",
    "wekafs",
    "orangefs",
    "pvfs2",
    "davfs",
}


def filesystem_type(path: str, mounts: str = "/proc/self/mounts") -> str:
    """The type of the filesystem holding ``path`` (the longest mount point above it in the mount
    table), or "" when unknown."""
    path = os.path.realpath(path)
    best, fstype = "", ""
    try:
        with open(mounts, encoding="utf-8", errors="replace") as f:
            for line in f:
                fields = line.split()
                if len(fields) < 3:
                    continue
                mount = fields[1].replace("\\040", " ")
                inside = path == mount or path.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) >= len(best):
                    best, fstype = mount, fields[2]
    except OSError:
        return ""
    return fstype


def check_scan_workers(value) -> int | str:
    """``source.scan_workers``: "auto" (or null), or a count from 1 to ``max(64, 8 per CPU)``: each is a
    thread or a process listing class folders, and more would only contend."""
    if value in ("auto", None):
        return "auto"
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    limit = max(64, 8 * available_cpus())
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
        raise ValueError(
            f"source.scan_workers={value!r} must be 'auto' or an integer from 1 (serial) to {limit} "
            f"(8 per CPU, at least 64)"
        )
    return value


def scan_plan(root: str, workers="auto") -> tuple[str, int]:
    """How to list the class directories: ("threads" | "processes" | "serial", how many).

    Network filesystems (listings wait on round trips): 16 threads. Local disks (listings are CPU-bound
    and threads convoy on the GIL): one worker process per CPU, up to 8. An explicit ``workers`` keeps
    that choice of kind and sets the count; 1 means serial.
    """
    fstype = filesystem_type(root)
    network = fstype in NETWORK_FILESYSTEMS or fstype.startswith("fuse")
    workers = check_scan_workers(workers)
    if workers == "auto":
        workers = 16 if network else min(8, available_cpus())
    if workers == 1:
        return "serial", 1
    return ("threads" if network else "processes"), workers
