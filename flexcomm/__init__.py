"""flexcomm: data-parallel training that adapts to networks that change under it."""

__version__ = "0.1.0"
