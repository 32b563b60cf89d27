"""Writers: any source in, one format out (HDF5 files, lazy_folder layouts). Readers never import them."""
