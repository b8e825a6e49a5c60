"""Benchmarks: run each as ``python bench/<name>.py --help``; see ``docs/benchmarks.md``."""
