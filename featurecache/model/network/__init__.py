"""The AF3 network: its modules from the input embedder to the confidence head (Algorithms 2-31),
the atom/token gathers and activation checkpointing they share. Imports only model/config.py,
featurecache.kernels and the schema; never the objectives or the parallel room."""
