"""Builders of small real test databases and synthetic batches, for tests and benchmarks only.

Nothing in the run-time package imports this folder.
"""
