"""The hdf5 family: one HDF5 file of images and labels, opened in the process that reads it."""

from feedline.public import exports as _exports

__getattr__, __dir__ = _exports(__name__)
