"""Old name of featurecache.kernels.runtime, kept so that existing importers (benchmarks) work
until they import runtime; nothing in the package uses it."""

from featurecache.kernels.runtime import interpreted, kernel_config, override_config  # noqa: F401
