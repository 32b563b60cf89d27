"""What a checkpoint keeps of the data: the parts (source, transforms, collate) built from their config, and what a recorded config may name when it is built again."""
