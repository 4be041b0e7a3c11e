"""Names retired in a release: calling with one raises an error that names its replacement.

A rename keeps its old name answering for one minor version, so that code written for the last
release fails at once with the fix in the message instead of running with a default it did not
ask for. Keywords go through :func:`renamed_keywords` (a ``TypeError``, as Python raises for any
unknown keyword), a settings dataclass's fields through :func:`renamed_fields` and settings passed on as
``**overrides`` through :func:`refuse_renamed`; module attributes (classes, functions) through :func:`renamed_attributes`,
a module-level ``__getattr__`` (an ``AttributeError``, which ``from ... import`` turns into an
``ImportError``).

Example:
    >>> @renamed_keywords(n_positions="n_tokens")
    ... def sample(tokens, *, n_tokens=8):
    ...     return n_tokens
    >>> sample("abc", n_tokens=4)
    4
    >>> sample("abc", n_positions=4)
    Traceback (most recent call last):
    ...
    TypeError: sample() got the keyword 'n_positions', renamed to 'n_tokens' in geolens 0.4.0
    >>> refuse_renamed("report", {"probe_texts": 50}, {"probe_texts": "probe_n_texts"})
    Traceback (most recent call last):
    ...
    TypeError: report() got the keyword 'probe_texts', renamed to 'probe_n_texts' in geolens 0.4.0
    >>> __getattr__ = renamed_attributes(__name__, {"OldResult": "NewResult"})
    >>> __getattr__("OldResult")
    Traceback (most recent call last):
    ...
    AttributeError: geolens._renames.OldResult was renamed to NewResult in geolens 0.4.0
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any, Callable, Iterable, Mapping, TypeVar

__all__ = ["RENAMED_IN", "hashed_options", "refuse_renamed", "renamed_attributes", "renamed_fields",
           "renamed_keywords"]

RENAMED_IN = "0.4.0"  # the release whose renames still answer with their replacement

F = TypeVar("F", bound=Callable[..., Any])
C = TypeVar("C", bound=type)


def refuse_renamed(caller: str, keywords: Iterable[str], old_to_new: Mapping[str, str]) -> None:
    """Raise a ``TypeError`` naming the new keyword if ``keywords`` hold an old one (the first in ``old_to_new``'s order).

    For calls that pass settings on as ``**overrides``, where the new names are no parameters to check against.
    """
    given = set(keywords)
    for old in (old for old in old_to_new if old in given):
        raise TypeError(f"{caller}() got the keyword {old!r}, renamed to {old_to_new[old]!r} in geolens {RENAMED_IN}")


def renamed_keywords(**old_to_new: str) -> Callable[[F], F]:
    """Make ``function`` raise a ``TypeError`` naming the new keyword when called with an old one.

    The wrapped function keeps its signature (``inspect.signature`` follows ``__wrapped__``) and
    records the renames in ``__renamed_keywords__`` for the API tests and the docs.
    """
    def decorate(function: F) -> F:
        parameters = inspect.signature(function).parameters
        for old, new in old_to_new.items():
            if new not in parameters:
                raise ValueError(f"{function.__qualname__} has no parameter {new!r} to rename {old!r} to")
            if old in parameters:
                raise ValueError(f"{function.__qualname__} still has the old parameter {old!r}")

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            refuse_renamed(function.__name__, kwargs, old_to_new)
            return function(*args, **kwargs)

        wrapper.__renamed_keywords__ = dict(old_to_new)  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]
    return decorate


def renamed_fields(**old_to_new: str) -> Callable[[C], C]:
    """Make a dataclass's constructor (and so ``dataclasses.replace``) raise a ``TypeError`` naming the new field
    when given an old one; the renames are kept in ``__renamed_fields__``.

    Example:
        >>> @renamed_fields(lens_steps="lens_max_steps")
        ... @dataclasses.dataclass
        ... class Budget:
        ...     lens_max_steps: int = 40
        >>> Budget(lens_max_steps=2).lens_max_steps
        2
        >>> Budget(lens_steps=2)
        Traceback (most recent call last):
        ...
        TypeError: Budget() got the keyword 'lens_steps', renamed to 'lens_max_steps' in geolens 0.4.0
    """
    def decorate(cls: C) -> C:
        names = {field.name for field in dataclasses.fields(cls)}
        for old, new in old_to_new.items():
            if new not in names:
                raise ValueError(f"{cls.__qualname__} has no field {new!r} to rename {old!r} to")
            if old in names:
                raise ValueError(f"{cls.__qualname__} still has the old field {old!r}")
        init = cls.__init__

        @functools.wraps(init)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            refuse_renamed(cls.__name__, kwargs, old_to_new)
            init(self, *args, **kwargs)

        cls.__init__ = __init__  # type: ignore[misc]
        cls.__renamed_fields__ = dict(old_to_new)  # type: ignore[attr-defined]
        return cls
    return decorate


def renamed_attributes(module: str, old_to_new: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that answers each old name with an error naming the new one."""
    def module_getattr(name: str) -> Any:
        if name in old_to_new:
            raise AttributeError(f"{module}.{name} was renamed to {old_to_new[name]} in geolens {RENAMED_IN}")
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    module_getattr.renamed = dict(old_to_new)  # type: ignore[attr-defined]
    return module_getattr


def hashed_options(options: Mapping[str, Any], renamed: Mapping[str, str]) -> dict[str, Any]:
    """``options`` with each renamed key spelt as before the rename, for a study cell's hash only.

    ``renamed`` maps old names to new, as a function's ``__renamed_keywords__`` does, so that the
    cells of a study written before the rename keep their hashes and are found finished. A
    reference-recipe ``lens_budget`` (``method="reference"``, or one with ``tokens_per_step``)
    spells ``max_steps`` as ``steps`` again, as 0.3.0 wrote it.

    Example:
        >>> renamed = {"lens_texts": "lens_tokens"}
        >>> hashed_options({"lens_tokens": ["a"], "lens_budget": {"max_steps": 2, "tokens_per_step": 8}}, renamed)
        {'lens_texts': ['a'], 'lens_budget': {'steps': 2, 'tokens_per_step': 8}}
        >>> hashed_options({"k": 8}, {})
        {'k': 8}
    """
    former = {new: old for old, new in renamed.items()}
    out = {former.get(key, key): value for key, value in options.items()}
    budget = out.get("lens_budget")
    if isinstance(budget, Mapping) and (budget.get("method") == "reference" or "tokens_per_step" in budget):
        out["lens_budget"] = {("steps" if key == "max_steps" else key): value for key, value in budget.items()}
    return out
