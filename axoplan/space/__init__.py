"""The space of 4D layouts: one layout (``layout``: sizes, rank order, the mesh) and every
candidate of a GPU count with the searched options, as arrays (``candidates``)."""
