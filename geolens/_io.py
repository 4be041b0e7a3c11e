"""Writes that a killed process cannot leave half done: the old file (or folder), or the new one, or none.

Example:
    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "a.json"
    >>> _ = atomic_write_text(path, "{}"); path.read_text()
    '{}'
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

__all__ = ["atomic_directory", "atomic_file", "atomic_write_text"]


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to a temporary file beside ``path``, then rename it into place (one ``os.replace``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` (hidden: ``.`` prefix, ``.tmp`` suffix) for a writer that wants a
    file name (Parquet, torch); when the block ends without error it is synced to disk and renamed onto ``path``.

    Example:
        >>> import tempfile, pathlib
        >>> target = pathlib.Path(tempfile.mkdtemp()) / "a.bin"
        >>> with atomic_file(target) as tmp:
        ...     _ = tmp.write_bytes(b"ok")
        >>> target.read_bytes()
        b'ok'
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb+") as handle:  # durable before it becomes visible
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def atomic_directory(path: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty staging folder beside ``path``; when the block ends without error it becomes ``path``.

    An existing ``path`` is moved aside, the staging folder renamed into place and
    the old one removed: at every moment ``path`` is the old folder, the new one,
    or absent. On an error the staging folder is removed and ``path`` is untouched.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    old = None
    if path.exists():
        old = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".old"))
        os.replace(path, old / "x")
    os.replace(staging, path)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
