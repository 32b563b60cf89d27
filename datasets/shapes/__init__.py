"""The embedded shapes data set (``source=shapes``): images of coloured shapes with segmentation masks, the
shapes present, the area they cover and a caption, written once into the cache as real files."""
