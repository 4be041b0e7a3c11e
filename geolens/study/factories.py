"""Short names of model factories for study files: ``zoo = "folder"`` and the like.

A model table of a study TOML may name its source by a registered key instead of
``factory = "module:function"``: ``key = "folder"`` (a folder, relative to the study file)
with the table's other keys as keyword arguments. The factory is called as
``factory(key=folder, **other_keys)`` and returns a :class:`~geolens.study.ModelSpec`.

A package that builds study models registers its key when it is imported:
:mod:`geolens.zoo` registers ``zoo`` (:func:`geolens.zoo.zoo_member`), and ``import geolens``
imports the zoo. The study engine sits below those packages and never imports them.

Example:
    >>> sorted(model_factories())
    ['zoo']
    >>> model_factories()["zoo"].__name__
    'zoo_member'
"""

from __future__ import annotations

import re
from typing import Any, Callable

__all__ = ["RESERVED_SOURCES", "model_factories", "register_model_factory"]

# The keys a model table already uses for its source and its other settings: no factory is registered under one.
RESERVED_SOURCES = ("path", "hub", "loader", "factory", "kwargs", "args", "revision", "revisions", "checkpoints",
                    "steps", "metadata", "params", "resources")
_KEY = re.compile(r"^[a-z][a-z0-9_]*$")
_FACTORIES: dict[str, Callable[..., Any]] = {}


def register_model_factory(key: str, factory: Callable[..., Any]) -> None:
    """Make ``key = "folder"`` in a study file's model table call ``factory(key=folder, **other_keys)``.

    Registering the same factory again under its key (a module imported again) replaces it;
    another factory under a taken key raises ``ValueError``.

    Example:
        >>> register_model_factory("zoo", model_factories()["zoo"])   # already registered: nothing changes
        >>> register_model_factory("path", print)
        Traceback (most recent call last):
        ...
        ValueError: model factory key 'path' is a key of every model table (reserved: path, hub, ...)
    """
    if not isinstance(key, str) or not _KEY.match(key):
        raise ValueError(f"model factory key must be a lower-case name such as 'zoo', got {key!r}")
    if key in RESERVED_SOURCES:
        raise ValueError(f"model factory key {key!r} is a key of every model table (reserved: "
                         f"{', '.join(RESERVED_SOURCES)})")
    if not callable(factory):
        raise TypeError(f"factory must be callable (returning a ModelSpec), got {type(factory).__name__}")
    known = _FACTORIES.get(key)
    if known is not None and _name(known) != _name(factory):  # the same function (a module reloaded) replaces
        raise ValueError(f"model factory key {key!r} is taken by {_name(known)}")
    _FACTORIES[key] = factory


def _name(factory: Callable[..., Any]) -> str:
    return f"{getattr(factory, '__module__', '?')}.{getattr(factory, '__qualname__', type(factory).__name__)}"


def model_factories() -> dict[str, Callable[..., Any]]:
    """The registered keys and their factories (a copy)."""
    return dict(_FACTORIES)
