"""The shards writer: any source in, a shards dataset out (``convert.py out.format=shards``).

    write.py     convert_source / convert: the order, the parts, the atomic write into out.path
    output.py    where out.path (or its part) is, and what may be replaced there
    scratch.py   this machine's lock, and a URL's scratch folder before the upload (``writers/upload.py``)
    runner.py    LitData's ``optimize`` in a process group of its own, with a progress bar here
    sidecar.py   what feedline adds to LitData's chunks: labels, skipped inputs, feedline.json

``convert_source`` and ``convert`` are served here, where ``feedline.writers.hdf5`` serves its own.
"""

from feedline.moved import old_names
from feedline.writers.shards.write import convert, convert_source

__all__ = ["convert", "convert_source"]


__getattr__ = old_names(__name__)  # names that moved to another module keep working for one release
