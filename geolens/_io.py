"""Writes that a killed process cannot leave half done: the old file, or the new one, or none.

Files are created with mode ``0o666`` less the process's umask, as ``open`` would create them (not
``tempfile.mkstemp``'s ``0o600``): a report shared through a group-readable folder stays readable.

Example:
    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "a.json"
    >>> _ = atomic_write_text(path, "{}"); path.read_text()
    '{}'
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path
from typing import Iterator

__all__ = ["atomic_file", "atomic_write_text", "check_file_target", "check_folder_target", "check_writable_folder"]


def check_file_target(path: str | os.PathLike, what: str = "a file") -> Path:
    """``path`` as a ``Path`` where a file may be written: raises ``ValueError`` if it is an existing folder
    (a rename would fail, or replace a folder of someone's files), or if a folder above it is a file.

    Example:
        >>> import tempfile
        >>> check_file_target(tempfile.mkdtemp(), "a result")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: /tmp/... is a folder; a result is written as a file: pass a file path
    """
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{path} is a folder; {what} is written as a file: pass a file path")
    above = _file_in_the_way(path.parent)
    if above is not None:
        raise ValueError(f"{above} is a file, so {path} cannot be written (a folder above it must be a folder)")
    return path


def _file_in_the_way(path: Path) -> Path | None:
    """The nearest of ``path`` and the folders above it that exists, if it is not a folder."""
    for part in (path, *path.parents):
        if part.exists():
            return None if part.is_dir() else part
    return None


def check_folder_target(path: str | os.PathLike, what: str = "it") -> Path:
    """``path`` as a ``Path`` where a folder may be (or is) made: raises ``ValueError`` if it, or a folder
    above it, is an existing file (nothing is replaced by a folder).

    Example:
        >>> import tempfile
        >>> file = tempfile.mkstemp()[1]
        >>> check_folder_target(file, "a tuned lens")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: /tmp/... is a file; a tuned lens is saved as a folder: pass a folder path (nothing was written)
    """
    path = Path(path)
    part = _file_in_the_way(path)
    if part is not None:
        where = "" if part == path else f" (in {path})"
        raise ValueError(f"{part} is a file{where}; {what} is saved as a folder: pass a folder path "
                         "(nothing was written)")
    return path


def check_writable_folder(path: str | os.PathLike, what: str = "the output folder") -> Path:
    """``path`` as a ``Path`` where files can be written: the folder if it exists, else the nearest folder
    above it (where it would be made); raises ``ValueError`` naming it if this process may not write there.

    Checked before any work starts, so a run into a read-only folder stops at once instead of after
    computing its first results.

    Example:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> check_writable_folder(folder / "new" / "report") == folder / "new" / "report"
        True
    """
    path = Path(path)
    existing = next((part for part in (path, *path.parents) if part.exists()), Path("."))
    if not os.access(existing, os.W_OK | os.X_OK):
        where = "" if existing == path else f" (it would be made in {existing})"
        raise ValueError(f"cannot write {what} {path}: no permission to write in {existing}{where}")
    return path


def _temp_beside(path: Path) -> tuple[int, str]:
    """A new hidden file beside ``path`` (``.<name>.<random>.tmp``), open for writing: ``(fd, its path)``.

    Created with mode ``0o666``, which the kernel cuts by the umask (and a folder's default ACL), as
    ``open(path, "w")`` would; ``tempfile.mkstemp`` would make it ``0o600`` whatever the umask.

    Example:
        >>> import tempfile, stat
        >>> folder = Path(tempfile.mkdtemp())
        >>> old = os.umask(0o027)
        >>> fd, tmp = _temp_beside(folder / "a.csv"); os.close(fd); _ = os.umask(old)
        >>> oct(stat.S_IMODE(os.stat(tmp).st_mode)), Path(tmp).name.startswith(".a.csv.")
        ('0o640', True)
    """
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666), str(tmp)
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {path}")


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to a temporary file beside ``path``, then rename it into place (one ``os.replace``)."""
    path = check_file_target(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _temp_beside(path)
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
    path = check_file_target(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _temp_beside(path)
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
