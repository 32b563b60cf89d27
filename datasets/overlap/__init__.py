"""Which data a source reads, so that two sources of one run never share samples unless they are told to."""
