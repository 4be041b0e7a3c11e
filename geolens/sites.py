"""Sites and layers: the names geolens reads states at, its layer convention, and their hook names.

The residual stream has ``L + 1`` layers: ``0`` = embeddings
(``blocks.0.hook_resid_pre``) and ``l >= 1`` = ``blocks.{l-1}.hook_resid_post``.
Sites inside a block are indexed by the layer that block *produces*:
``resid_pre``, ``resid_mid``, ``attn_out`` and ``mlp_out`` at layer ``l``
(``1..L``) belong to ``blocks.{l-1}``, so layer ``l``'s update is
``resid_post[l] - resid_pre[l]``. ``final`` is the state the unembedding reads
(after ``ln_final``), a single layer numbered ``L``. Negative layers count from
the end, as in Python (``-1`` = ``L``). See docs/methods.md §F.

This module is the one place that maps ``(site, layer)`` to a TransformerLens
hook name (through :meth:`geolens.model.ModelAdapter.block_hook_name`) and checks layers.

Example:
    >>> site_layers("resid_post", 2), site_layers("attn_out", 2), site_layers("final", 2)
    ((0, 1, 2), (1, 2), (2,))
    >>> check_layers("resid_post", [0, -1], n_layers=2)
    [0, 2]
    >>> hook_name(model, "attn_out", 1)
    'blocks.0.hook_attn_out'
"""

from __future__ import annotations

from typing import Sequence

from geolens._validation import check_int
from geolens.model import Model, as_adapter

__all__ = ["BLOCK_SITES", "FINAL_SITE", "RESIDUAL_SITE", "SITES", "check_layer", "check_layers", "check_site",
           "hook_name", "site_layers"]

RESIDUAL_SITE = "resid_post"
BLOCK_SITES = ("resid_pre", "resid_mid", "attn_out", "mlp_out")
FINAL_SITE = "final"
SITES = (RESIDUAL_SITE, *BLOCK_SITES, FINAL_SITE)
"""Every site name: ``resid_post`` (layers ``0..L``), the block sites ``resid_pre``, ``resid_mid``,
``attn_out``, ``mlp_out`` (layers ``1..L``), and ``final`` (the post-``ln_final`` state, layer ``L``)."""


def check_site(site: object, *, allowed: Sequence[str] = SITES, name: str = "site") -> str:
    """``site`` if it is one of ``allowed``, else a ``ValueError`` naming the argument and the choices."""
    if not isinstance(site, str) or site not in allowed:
        raise ValueError(f"unknown {name} {site!r}; choose from {tuple(allowed)}")
    return site


def site_layers(site: str, n_layers: int) -> tuple[int, ...]:
    """Valid layer indices of ``site`` for a model with ``n_layers`` blocks."""
    site = check_site(site)
    if site == RESIDUAL_SITE:
        return tuple(range(n_layers + 1))
    if site == FINAL_SITE:
        return (n_layers,)
    return tuple(range(1, n_layers + 1))


def check_layer(site: str, layer: object, *, n_layers: int, name: str = "layer") -> int:
    """One layer of ``site`` as a non-negative int (negative counts from the end), or a ``ValueError``.

    Example:
        >>> check_layer("attn_out", 0, n_layers=2)
        Traceback (most recent call last):
        ...
        ValueError: layer 0 is not valid for site 'attn_out' (valid layers: 1..2)
    """
    return check_layers(site, [layer], n_layers=n_layers, name=name)[0]


def check_layers(site: str, layers: Sequence[object] | None, *, n_layers: int, name: str = "layers") -> list[int]:
    """Layers of ``site`` (``None`` = all valid ones) as distinct non-negative ints in the order given.

    ``final`` has one layer whatever is asked, so several sites can share one ``layers`` list.
    """
    valid = site_layers(site, n_layers)
    if layers is None or site == FINAL_SITE:
        return list(valid)
    if isinstance(layers, (str, bytes)) or not isinstance(layers, Sequence):
        raise TypeError(f"{name} must be a sequence of ints or None, got {type(layers).__name__}")
    wanted = []
    for given in (check_int(l, name.rstrip("s")) for l in layers):
        layer = given + n_layers + 1 if given < 0 else given  # -1 = the last layer, as in Python
        if layer not in valid:
            bound = "" if -(n_layers + 1) <= given <= n_layers else \
                f": a layer must be <= {n_layers} and >= {-(n_layers + 1)} for {n_layers} blocks"
            raise ValueError(f"{name.rstrip('s')} {given} is not valid for site {site!r}{bound} "
                             f"(valid layers: {valid[0]}..{valid[-1]})")
        wanted.append(layer)
    return list(dict.fromkeys(wanted))


def hook_name(model: Model, site: str, layer: int) -> str:
    """TransformerLens hook name of ``(site, layer)`` in geolens's layer convention (layer checked)."""
    adapter = as_adapter(model)
    layer = check_layer(site, layer, n_layers=adapter.n_layers)
    if site == FINAL_SITE:
        return adapter.final_hook_name
    if site == RESIDUAL_SITE:
        if layer == 0:
            return adapter.block_hook_name("resid_pre", 0)
        return adapter.block_hook_name("resid_post", layer - 1)
    return adapter.block_hook_name(site, layer - 1)
