"""An epoch of the train loader: its order, who reads what of it, and where a resumed run picks it up."""
