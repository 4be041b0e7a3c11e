"""The geolens cache folder (converted models, trained lenses, the zoo): one rule for every layer."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_root"]


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """The geolens cache folder: argument, else ``$GEOLENS_CACHE``, else ``~/.cache/geolens``.

    Example:
        >>> cache_root("/tmp/x").as_posix()
        '/tmp/x'
    """
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    if os.environ.get("GEOLENS_CACHE"):
        return Path(os.environ["GEOLENS_CACHE"]).expanduser()
    return Path.home() / ".cache" / "geolens"
