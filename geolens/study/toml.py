"""Reading a study file (TOML), and the TOML forms of a study's texts.

A study file holds the fields of a :class:`~geolens.study.Study` (``tomllib`` reads it);
:func:`read_study_file` checks its keys and returns them, relative paths kept for the
study to resolve from the file's folder. Texts come as a list, or as a table:
``{default = n}`` (BBC News, optionally ``seed =``), ``{files = [...]}`` (one text per file),
``{lines = "file"}`` (one text per non-empty line) — in a file, and in Python alike.

Example:
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     _ = Path(tmp, "texts.txt").write_text("the cat\\n\\na dog\\n")
    ...     texts_from({"lines": "texts.txt"}, Path(tmp))
    ['the cat', 'a dog']
"""

from __future__ import annotations

import numbers
import os
import tomllib
from pathlib import Path
from typing import Any, Mapping

__all__ = ["check_table", "local_path", "read_study_file", "texts_from"]


def check_table(value: Any, what: str) -> Mapping[Any, Any]:
    """``value`` if it is a mapping (a TOML table, a dict), else a ``TypeError`` naming ``what``."""
    if not isinstance(value, Mapping):
        raise TypeError(f"{what} must be a table (a dict, a TOML table), got {type(value).__name__} {value!r}")
    return value


def local_path(value: str, base_dir: Path | None) -> str:
    """``value`` as a path, a relative one taken from ``base_dir`` (the study file's folder) when there is one."""
    path = Path(value).expanduser()
    if base_dir is not None and not path.is_absolute():
        path = base_dir / path
    return str(path)


def read_study_file(path: Path, keys: set[str]) -> dict[str, Any]:
    """The fields of the study file at ``path``, each key among ``keys`` and ``models`` required.

    A model table's inline ``metadata`` joins the file's ``[metadata]`` table (the file's own wins), so
    a study that replaces ``models=`` keeps it.
    """
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except RecursionError:  # tomllib follows nested arrays and tables by recursion
        raise ValueError(f"{path} is not readable TOML: nested deeper than Python's parser can follow") from None
    except ValueError as err:  # TOMLDecodeError, and an integer past Python's digit limit
        raise ValueError(f"{path} is not valid TOML: {err}") from None
    unknown = sorted(set(data) - keys)
    if unknown:
        raise ValueError(f"{path}: unknown keys {unknown}; a study file has {sorted(keys)}")
    if "models" not in data:
        raise ValueError(f"{path}: no [models] table")
    models = {}
    metadata = {label: dict(check_table(values, f"{path}: metadata.{label}"))
                for label, values in check_table(data.get("metadata", {}), f"{path}: metadata").items()}
    for label, entry in check_table(data["models"], f"{path}: models").items():
        if isinstance(entry, dict) and "metadata" in entry:
            entry = dict(entry)
            metadata[label] = {**check_table(entry.pop("metadata"), f"{path}: models.{label}.metadata"),
                               **metadata.get(label, {})}
        models[label] = entry
    data.update(models=models, metadata=metadata)
    return data


def _read_text(value: Any, base_dir: Path | None, what: str) -> tuple[Path, str]:
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
        raise TypeError(f"{what} must be a file name, got {type(value).__name__} {value!r}")
    path = Path(local_path(os.fspath(value), base_dir))
    if not path.is_file():
        raise FileNotFoundError(f"{what}: {path} {'is not a file' if path.exists() else 'does not exist'}")
    try:
        return path, path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"{what}: cannot read {path} as UTF-8 text ({err})") from None


def texts_from(value: Any, base_dir: Path | None, what: str = "texts") -> list[str]:
    """Texts from a list, or a TOML table: ``{default = 32}`` (BBC News), ``{files = [...]}`` (one text per file),
    ``{lines = "file"}`` (one text per non-empty line). Each way must give at least one non-blank text."""
    if isinstance(value, str):
        value = [value]
    if isinstance(value, Mapping):
        keys = set(value)
        if keys == {"default"} or keys == {"default", "seed"}:
            from geolens.data import default_texts

            n, seed = value["default"], value.get("seed", 0)
            if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
                raise ValueError(f"{what}: {{default = n}} needs a whole number of texts n >= 1, got {n!r}")
            if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
                raise ValueError(f"{what}: {{default = n, seed = s}} needs a whole number seed >= 0, got {seed!r}")
            return list(default_texts(n=int(n), seed=int(seed)))
        if keys == {"files"}:
            files = value["files"]
            if isinstance(files, (str, os.PathLike)) or not isinstance(files, (list, tuple)) or not files:
                raise TypeError(f"{what}: {{files = [...]}} needs a non-empty list of file names, got {files!r}")
            texts = []
            for name in files:
                path, text = _read_text(name, base_dir, f"{what}: files")
                if not text.strip():
                    raise ValueError(f"{what}: file {path} is empty (every file is one text)")
                texts.append(text)
            return texts
        if keys == {"lines"}:
            path, text = _read_text(value["lines"], base_dir, f"{what}: lines")
            texts = [line.strip() for line in text.splitlines() if line.strip()]
            if not texts:
                raise ValueError(f"{what}: file {path} has no non-blank line (each line is one text)")
            return texts
        raise ValueError(f"{what}: a table must be {{default = n}}, {{files = [...]}} or {{lines = 'file'}}; "
                         f"got keys {sorted(keys)}")
    try:
        texts = list(value)
    except TypeError:
        raise TypeError(f"{what} must be a list of strings or a table, got {type(value).__name__}") from None
    if not texts or not all(isinstance(t, str) and t.strip() for t in texts):
        raise ValueError(f"{what} must be a non-empty list of non-empty strings")
    return texts
