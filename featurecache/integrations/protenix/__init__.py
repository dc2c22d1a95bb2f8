"""Protenix (ByteDance's AlphaFold3 reproduction): its checkpoints and its trainer's data, from featurecache."""
