"""geolens's version: the one place it is written (the package metadata reads it when the wheel is built)."""

__version__ = "0.4.0"
