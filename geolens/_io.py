"""Writes that a killed process cannot leave half done: the old file (or folder), or the new one, or none.

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
import glob
import os
import secrets
import shutil
import time
from pathlib import Path
from typing import Callable, Iterator

__all__ = ["atomic_file", "atomic_folder", "atomic_write_text", "check_file_target", "check_folder_target",
           "check_writable_folder", "publish_folder", "remove_stale_staging"]

# A staging folder untouched this long was left by a killed process (a live writer is far younger).
STALE_STAGING_S = 3600.0


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


@contextlib.contextmanager
def atomic_folder(
    path: str | os.PathLike, *, keep: Callable[[Path], bool] | None = None, stale_after_s: float = STALE_STAGING_S,
) -> Iterator[Path]:
    """Yield a path for a writer that makes a whole folder there (``save_pretrained``); when the block ends
    without error, that folder becomes ``path`` with one rename (:func:`publish_folder`).

    The yielded path does not exist yet. It lies in a hidden staging folder beside ``path``
    (``.<name>-tmp-<random>``), which the writer may also use as scratch space (the yielded path's
    ``parent``) and which is removed afterwards, error or not. ``keep`` is passed to
    :func:`publish_folder`. Staging folders of ``path`` older than ``stale_after_s`` seconds, left by
    killed processes, are removed first (:func:`remove_stale_staging`).

    Example:
        >>> import tempfile
        >>> target = Path(tempfile.mkdtemp()) / "model"
        >>> with atomic_folder(target) as out:
        ...     out.mkdir(); _ = (out / "config.json").write_text("{}")
        >>> sorted(p.name for p in target.parent.iterdir()), (target / "config.json").read_text()
        (['model'], '{}')
    """
    path = check_folder_target(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(path, stale_after_s)
    staging = _staging_beside(path)
    try:
        yield staging / path.name
        publish_folder(staging / path.name, path, keep=keep)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _staging_beside(path: Path) -> Path:
    """A new hidden folder beside ``path`` (``.<name>-tmp-<random>``), made with ``open``'s permissions."""
    for _ in range(100):
        staging = path.parent / f"{_staging_prefix(path)}{secrets.token_hex(4)}"
        try:
            staging.mkdir()
            return staging
        except FileExistsError:
            continue
    raise FileExistsError(f"no free staging folder name beside {path}")


def _staging_prefix(path: Path) -> str:
    return f".{path.name}-tmp-"


def publish_folder(folder: Path, path: Path, *, keep: Callable[[Path], bool] | None = None) -> None:
    """Move the finished ``folder`` onto ``path`` with one rename.

    A folder already at ``path`` is removed first (debris, or the previous version), unless
    ``keep(path)`` says it is whole: a concurrent writer finished first, so its folder stays and
    ``folder`` is left for the caller to remove.

    Example:
        >>> import tempfile
        >>> root = Path(tempfile.mkdtemp())
        >>> (root / "new").mkdir(); (root / "old").mkdir(); _ = (root / "old" / "half").write_text("x")
        >>> publish_folder(root / "new", root / "old"); sorted(p.name for p in root.iterdir())
        ['old']
        >>> list((root / "old").iterdir())
        []
    """
    if not folder.is_dir():  # checked before the old folder goes: a writer that made nothing loses nothing
        raise FileNotFoundError(f"{folder} was not made: nothing to move onto {path}")
    if path.exists() and not (keep is not None and keep(path)):
        shutil.rmtree(path)
    try:
        os.replace(folder, path)
    except OSError:
        if keep is None or not keep(path):
            raise


def remove_stale_staging(path: Path, stale_after_s: float = STALE_STAGING_S) -> None:
    """Remove the staging folders of ``path`` (:func:`atomic_folder`'s) untouched for ``stale_after_s`` seconds.

    Example:
        >>> import tempfile
        >>> root = Path(tempfile.mkdtemp())
        >>> (root / ".model-tmp-1234").mkdir(); os.utime(root / ".model-tmp-1234", (0, 0))
        >>> remove_stale_staging(root / "model"); list(root.iterdir())
        []
    """
    for staging in path.parent.glob(glob.escape(_staging_prefix(path)) + "*"):
        with contextlib.suppress(OSError):
            if staging.is_dir() and time.time() - staging.stat().st_mtime > stale_after_s:
                shutil.rmtree(staging)
