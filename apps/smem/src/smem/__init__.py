"""smem: local agent memory on one SQLite file."""

__version__ = "0.1.0"
