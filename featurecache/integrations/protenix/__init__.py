"""Protenix (ByteDance's AlphaFold3 reproduction): its checkpoints and its trainer's data, from featurecache.

`ProtenixDataset` (dataset.py) is the cache as Protenix's data source; the module needs Protenix
itself (pip install protenix==2.0.0) and is imported only by its users.
"""

from featurecache.integrations.protenix.dataset import ProtenixDataset

__all__ = ["ProtenixDataset"]
