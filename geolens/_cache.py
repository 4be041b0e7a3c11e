"""The geolens cache folder (converted models, trained lenses, the zoo): one rule for every layer."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_root"]


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """The geolens cache folder: argument, else ``$GEOLENS_CACHE``, else ``~/.cache/geolens``.

    Raises ``ValueError`` naming where the path came from if it is an existing file.

    Example:
        >>> cache_root("/tmp/x").as_posix()
        '/tmp/x'
    """
    if cache_dir is not None:
        root, source = Path(cache_dir).expanduser(), "cache_dir"
    elif os.environ.get("GEOLENS_CACHE"):
        root, source = Path(os.environ["GEOLENS_CACHE"]).expanduser(), "$GEOLENS_CACHE"
    else:
        root, source = Path.home() / ".cache" / "geolens", "the default cache folder"
    if root.exists() and not root.is_dir():
        raise ValueError(f"{source} = {root} is a file; the geolens cache must be a folder")
    return root
