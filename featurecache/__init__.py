"""featurecache: ahead-of-time feature caching and fast kernels for AlphaFold3-style training.

Heavy parts (torch, LMDB, Ray) are imported lazily so that `featurecache.kernels` needs only
torch and triton, and the command line starts quickly.
"""

__version__ = "0.1.0"

__all__ = ["CacheDataset", "collate", "__version__"]


def __getattr__(name):
    if name in ("CacheDataset", "collate"):
        from featurecache import loader

        return getattr(loader, name)
    raise AttributeError(f"module 'featurecache' has no attribute {name!r}")
