"""Hooks that *edit* activations: subspace / principal-component ablation and activation patching.

See docs/methods.md §D.1–D.5.

Two pure edits of a batch of states ``h`` (``[..., d]``) against an orthonormal
basis ``Q`` (``[d, m]``, projector ``P = Q Q^T``), computed in float32 at least and
returned in ``h``'s dtype, so hooks on a bf16/fp16 model hand back bf16/fp16:

* :func:`remove_subspace` — ``h - P h`` (the component in ``span(Q)`` is removed);
* :func:`replace_subspace` — ``h - P h + P mu`` (that component is replaced by the
  one of a reference mean ``mu``: "mean ablation").

and the hook machinery that applies them during a forward pass:

* :func:`ablation_hooks` — a list of ``(hook_name, fn)`` pairs, to combine with
  your own ``fwd_hooks``;
* :func:`ablate` — a context manager that adds them for a ``with`` block (through
  the model's own ``hooks`` context manager, so they are removed on exit, also
  when the block raises);
* :func:`ablate_pcs` — the same for the top-``n_components`` principal directions of the
  layer's centred states on reference tokens;
* :func:`patch_subspace`, :func:`patching_hook`, :func:`record_activations` —
  the edits behind :func:`geolens.patch` (a clean activation copied into a
  corrupted run, whole or inside a subspace).

Sites and layers follow :mod:`geolens.sites`; every site but ``final`` (the
unembedding's input, after ``ln_final``) can be edited: :data:`EDIT_SITES`.

By default the first position of every sequence (BOS / attention sink) is left
unedited (``skip_first=True``): principal directions are estimated without it
(capture never samples it), and its huge-norm state would otherwise dominate the
effect of an ablation.

Example:
    >>> with ablate_pcs(model, texts, layer=1, n_components=1, progress=False):
    ...     logits = model(tokens)
    >>> logits.shape
    torch.Size([1, 6, 200])
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable

import torch
from jaxtyping import Float

from geolens._renames import renamed_keywords
from geolens._validation import check_finite, check_float_matrix, check_int
from geolens.capture import capture
from geolens.metrics.grassmann import orthonormal_basis
from geolens.metrics.preprocess import centre, principal_directions
from geolens.model import Model, ModelAdapter, as_adapter
from geolens.sites import BLOCK_SITES, RESIDUAL_SITE, check_layer, check_site, hook_name

__all__ = [
    "ABLATION_MODES",
    "ablate",
    "ablate_pcs",
    "ablation_hooks",
    "EDIT_SITES",
    "edit_hook_name",
    "patch_subspace",
    "patching_hook",
    "record_activations",
    "reference_pcs",
    "remove_subspace",
    "replace_subspace",
    "subspace_basis",
]

ABLATION_MODES: tuple[str, ...] = ("project", "mean")
# Every site but "final": the unembedding's input is read, not edited (edit resid_post layer L instead).
EDIT_SITES: tuple[str, ...] = (RESIDUAL_SITE, *BLOCK_SITES)
HookFn = Callable[..., Any]


# ---------------------------------------------------------------- pure edits
def _edit_dtype(h: torch.Tensor) -> torch.dtype:
    """Edits of half-precision activations are computed in float32 and cast back (float64 stays float64)."""
    return torch.promote_types(h.dtype, torch.float32)


def remove_subspace(h: Float[torch.Tensor, "... d"], basis: Float[torch.Tensor, "d m"]) -> Float[torch.Tensor, "... d"]:
    """``h - Q Q^T h``: remove the component of every row in the span of the orthonormal ``basis``.

    Example:
        >>> q = torch.tensor([[1.0], [0.0]])
        >>> remove_subspace(torch.tensor([[3.0, 4.0]]), q).tolist()
        [[0.0, 4.0]]
    """
    work = _edit_dtype(h)
    x, basis = h.to(work), basis.to(device=h.device, dtype=work)
    return (x - (x @ basis) @ basis.T).to(h.dtype)


def replace_subspace(
    h: Float[torch.Tensor, "... d"], basis: Float[torch.Tensor, "d m"], mean: Float[torch.Tensor, "d"]
) -> Float[torch.Tensor, "... d"]:
    """``h - Q Q^T (h - mean)``: set the coordinates of every row in ``span(Q)`` to those of ``mean``.

    Example:
        >>> q = torch.tensor([[1.0], [0.0]])
        >>> replace_subspace(torch.tensor([[3.0, 4.0]]), q, torch.tensor([1.0, 9.0])).tolist()
        [[1.0, 4.0]]
    """
    work = _edit_dtype(h)
    x, basis, mean = h.to(work), basis.to(device=h.device, dtype=work), mean.to(device=h.device, dtype=work)
    return (x - ((x - mean) @ basis) @ basis.T).to(h.dtype)


def subspace_basis(basis: torch.Tensor, d_model: int, name: str = "basis") -> Float[torch.Tensor, "d m"]:
    """Validate a ``[d_model, m]`` basis (``m`` may be 0) and orthonormalise it (QR if needed)."""
    if not isinstance(basis, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor [d_model, m], got {type(basis).__name__}")
    if basis.ndim == 1:
        basis = basis.unsqueeze(-1)  # one direction
    if basis.ndim != 2 or basis.shape[0] != d_model:
        raise ValueError(f"{name} must be [d_model={d_model}, m], got shape {tuple(basis.shape)}")
    if basis.shape[1] == 0:
        return basis.to(torch.float32 if not basis.is_floating_point() else basis.dtype)
    check_float_matrix(basis, name)
    return orthonormal_basis(basis, name=name)


# ---------------------------------------------------------------- hooks
def edit_hook_name(adapter: ModelAdapter, site: str, layer: int) -> str:
    """Hook name of an editable ``(site, layer)`` (:data:`EDIT_SITES`; site and layer checked)."""
    if site == "final":
        raise ValueError("site 'final' (after ln_final) cannot be edited here; use resid_post layer L instead")
    return hook_name(adapter, check_site(site, allowed=EDIT_SITES), layer)


def _reference_mean(
    adapter: ModelAdapter, site: str, layer: int, reference_tokens: Any, n_tokens: int | None, seed: int | None,
    progress: bool,
) -> torch.Tensor:
    """Mean state ``[d]`` of a reference sample: ``[N, d]`` states, or tokens captured at (site, layer)."""
    if isinstance(reference_tokens, torch.Tensor) and reference_tokens.is_floating_point():
        states = check_float_matrix(reference_tokens, "reference_tokens", min_rows=1)
        if states.shape[1] != adapter.d_model:
            raise ValueError(f"reference_tokens as states must be [N, d_model={adapter.d_model}], "
                             f"got {tuple(states.shape)}")
        return states.mean(dim=0)
    states = capture(adapter, reference_tokens, sites=(site,), layers=[layer], n_tokens=n_tokens, seed=seed,
                     progress=progress).layer(site, layer)
    return states.mean(dim=0)


def _check_layer_arg(layer: object) -> None:
    """``TypeError`` unless ``layer`` is an int: a call in the 0.3.0 order passes a tensor or tokens there."""
    if isinstance(layer, bool) or not isinstance(layer, int):
        raise TypeError(f"layer must be an int (keyword-only since geolens 0.4.0: ablate(model, basis, layer=...), "
                        f"ablate_pcs(model, tokens, layer=..., n_components=...)), got {type(layer).__name__}")


@renamed_keywords(reference="reference_tokens")
def ablation_hooks(
    model: Model,
    basis: Float[torch.Tensor, "d m"],
    *,
    layer: int,
    site: str = RESIDUAL_SITE,
    mode: str = "project",
    reference_tokens: Any = None,
    skip_first: bool = True,
    n_tokens: int | None = None,
    seed: int | None = 0,
    progress: bool = True,
) -> list[tuple[str, HookFn]]:
    """Forward hooks ``[(hook_name, fn)]`` that ablate ``span(basis)`` at ``(site, layer)``.

    Args:
        model: ``HookedTransformer``, ``TransformerBridge`` or :class:`~geolens.model.ModelAdapter`.
        basis: ``[d_model, m]`` directions (orthonormalised here; a ``[d]`` vector is one direction).
        layer: layer index in geolens's convention (module docstring).
        site: ``resid_post`` (default), ``resid_pre``, ``resid_mid``, ``attn_out`` or ``mlp_out``.
        mode: ``"project"`` removes the component (``h - P h``); ``"mean"`` replaces it
            with the reference mean's (``h - P (h - mu)``).
        reference_tokens: for ``mode="mean"``: tokens (text, list of texts, ``[B, T]`` ids) whose
            states at ``(site, layer)`` give ``mu``, or those ``[N, d]`` float states themselves.
        skip_first: leave position 0 (BOS / attention sink) unedited.
        n_tokens: reference positions sampled (``mode="mean"``).
        seed: seed of that sample.
        progress: show a progress bar while the reference tokens are read.

    Returns:
        A list to pass as ``fwd_hooks`` (e.g. together with your own hooks to
        ``model.run_with_hooks``), or to :func:`ablate`.

    Example:
        >>> direction = torch.zeros(64); direction[0] = 1.0      # the first residual coordinate
        >>> seen = {}
        >>> def record(activation, hook):                        # one of your own hooks, after the ablation
        ...     seen["x0"] = activation[0, :, 0].clone()
        >>> hooks = ablation_hooks(model, direction[:, None], layer=1) + [("blocks.0.hook_resid_post", record)]
        >>> hooks[0][0]                                          # resid_post layer 1 = block 0's output
        'blocks.0.hook_resid_post'
        >>> logits = model.run_with_hooks(tokens, fwd_hooks=hooks)
        >>> seen["x0"][1:].abs().max().item(), seen["x0"][0].item() != 0   # position 0 is skipped
        (0.0, True)
    """
    adapter = as_adapter(model)
    _check_layer_arg(layer)
    if mode not in ABLATION_MODES:
        raise ValueError(f"mode must be one of {ABLATION_MODES}, got {mode!r}")
    name = edit_hook_name(adapter, site, layer)
    q = subspace_basis(basis, adapter.d_model)
    if mode == "mean":
        if reference_tokens is None:
            raise ValueError("mode='mean' needs reference_tokens= (reference tokens or [N, d] states)")
        mean = _reference_mean(adapter, site, layer, reference_tokens, n_tokens, seed, progress)
        check_finite(mean, "reference mean")
    elif reference_tokens is not None:
        raise ValueError("reference_tokens= is only used with mode='mean'")
    else:
        mean = None
    start = 1 if skip_first else 0

    def hook(activation: torch.Tensor, hook: Any = None) -> torch.Tensor:
        if q.shape[1] == 0:
            return activation
        edited = activation.clone()
        part = activation[:, start:]
        edited[:, start:] = remove_subspace(part, q) if mean is None else replace_subspace(part, q, mean)
        return edited

    return [(name, hook)]


@renamed_keywords(reference="reference_tokens")
@contextmanager
def ablate(
    model: Model,
    basis: Float[torch.Tensor, "d m"],
    *,
    layer: int,
    site: str = RESIDUAL_SITE,
    mode: str = "project",
    reference_tokens: Any = None,
    skip_first: bool = True,
    n_tokens: int | None = None,
    seed: int | None = 0,
    progress: bool = True,
) -> Iterator[list[tuple[str, HookFn]]]:
    """Ablate ``span(basis)`` at ``(site, layer)`` for every forward pass inside a ``with`` block.

    Arguments as in :func:`ablation_hooks`. The hooks are added with the model's
    own ``hooks`` context manager: they compose with hooks added inside the block
    (``model.run_with_hooks(..., fwd_hooks=...)``, :func:`geolens.capture`) and are
    removed on exit, also when the block raises. Yields the hook list.

    Example:
        >>> q = torch.linalg.qr(torch.randn(64, 2, generator=torch.Generator().manual_seed(0)))[0]   # [d, 2]
        >>> with geolens.ablate(model, q, layer=1, mode="project"):
        ...     states = geolens.capture(model, texts, layers=[1], n_tokens=8, progress=False)
        >>> (states.layer("resid_post", 1) @ q).abs().max().item() < 1e-5   # no component left in span(q)
        True
    """
    adapter = as_adapter(model)
    hooks = ablation_hooks(adapter, basis, layer=layer, site=site, mode=mode, reference_tokens=reference_tokens,
                           skip_first=skip_first, n_tokens=n_tokens, seed=seed, progress=progress)
    with adapter.hooks(hooks):
        yield hooks


def reference_pcs(
    model: Model,
    tokens: Any,
    *,
    layer: int,
    n_components: int,
    site: str = RESIDUAL_SITE,
    n_tokens: int | None = None,
    seed: int | None = 0,
    attention_mask: torch.Tensor | None = None,
    progress: bool = True,
) -> tuple[Float[torch.Tensor, "d m"], Float[torch.Tensor, "N d"]]:
    """Top-``n_components`` principal directions of the centred states at ``(site, layer)`` on ``tokens``.

    Returns ``(basis [d, n_components], states [N, d])`` (the captured reference states, BOS and
    padding excluded).

    Example:
        >>> pcs, states = reference_pcs(model, texts, layer=1, n_components=2, n_tokens=16, progress=False)
        >>> pcs.shape, states.shape
        (torch.Size([64, 2]), torch.Size([16, 64]))
        >>> torch.allclose(pcs.T @ pcs, torch.eye(2), atol=1e-5)
        True
    """
    adapter = as_adapter(model)
    _check_layer_arg(layer)
    edit_hook_name(adapter, site, layer)  # validates site and layer
    layer = check_layer(site, layer, n_layers=adapter.n_layers)  # -1 = the last layer
    n_components = check_int(n_components, "n_components", low=0, high=adapter.d_model)
    states = capture(adapter, tokens, sites=(site,), layers=[layer], n_tokens=n_tokens, seed=seed,
                     progress=progress, attention_mask=attention_mask).layer(site, layer)
    n = states.shape[0]
    if n_components >= n:
        raise ValueError(f"n_components = {n_components} principal directions need more than {n_components} "
                         f"reference states, got {n}")
    check_finite(states, "reference states")
    return principal_directions(centre(states.double()), n_components).to(states.dtype), states


@renamed_keywords(m="n_components", reference_tokens="tokens")
@contextmanager
def ablate_pcs(
    model: Model,
    tokens: Any,
    *,
    layer: int,
    n_components: int,
    site: str = RESIDUAL_SITE,
    mode: str = "project",
    skip_first: bool = True,
    n_tokens: int | None = None,
    seed: int | None = 0,
    progress: bool = True,
) -> Iterator[Float[torch.Tensor, "d m"]]:
    """Ablate the top-``n_components`` principal directions of ``(site, layer)`` (estimated on ``tokens``)
    in a ``with`` block.

    The directions are the top right singular vectors of the centred states of ``tokens``
    (:func:`reference_pcs`). ``mode="project"`` removes the component along them; ``mode="mean"``
    replaces it by those states' mean component. Yields the ``[d, n_components]`` basis.

    Example:
        >>> with geolens.ablate_pcs(model, texts, layer=1, n_components=1, progress=False) as pcs:
        ...     logits = model(tokens)
        >>> pcs.shape, logits.shape
        (torch.Size([64, 1]), torch.Size([1, 6, 200]))
        >>> bool((logits - model(tokens)).abs().max() > 0)   # the hooks are gone after the block
        True
    """
    basis, states = reference_pcs(model, tokens, layer=layer, n_components=n_components, site=site,
                                  n_tokens=n_tokens, seed=seed, progress=progress)
    reference = states if mode == "mean" else None
    with ablate(model, basis, layer=layer, site=site, mode=mode, reference_tokens=reference, skip_first=skip_first):
        yield basis


# ---------------------------------------------------------------- patching edits
def patch_subspace(
    corrupted: Float[torch.Tensor, "... d"],
    clean: Float[torch.Tensor, "... d"],
    basis: Float[torch.Tensor, "d m"] | None = None,
    complement: bool = False,
) -> Float[torch.Tensor, "... d"]:
    """The patched activation: ``clean`` (no basis), ``corr + P (clean - corr)``, or with
    ``complement`` ``corr + (I - P)(clean - corr)``; ``basis`` must be orthonormal.

    Example:
        >>> q = torch.tensor([[1.0], [0.0]])
        >>> patch_subspace(torch.zeros(1, 2), torch.tensor([[3.0, 4.0]]), q).tolist()
        [[3.0, 0.0]]
    """
    if basis is None:
        return (clean if not complement else corrupted).to(corrupted.dtype)  # complement of the whole space is {0}
    work = _edit_dtype(corrupted)
    corr, basis = corrupted.to(work), basis.to(device=corrupted.device, dtype=work)
    diff = clean.to(device=corrupted.device, dtype=work) - corr
    inside = (diff @ basis) @ basis.T
    return (corr + (diff - inside if complement else inside)).to(corrupted.dtype)


def record_activations(adapter: ModelAdapter, tokens: torch.Tensor, names: set[str]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """One forward pass of ``tokens``: ``({hook name: activation}, logits)`` (the clean run of patching)."""
    cache: dict[str, torch.Tensor] = {}

    def saver(name: str):
        def hook(activation: torch.Tensor, hook: Any = None) -> None:
            cache[name] = activation.detach().clone()
        return hook

    logits = adapter.run_with_hooks(tokens, fwd_hooks=[(n, saver(n)) for n in sorted(names)])
    return cache, logits


def patching_hook(rows: torch.Tensor, pos: torch.Tensor, pairs: torch.Tensor, clean: torch.Tensor,
                  basis: torch.Tensor | None, complement: bool) -> HookFn:
    """A hook that replaces ``act[rows[i], pos[i]]`` by the patch from ``clean[pairs[i], pos[i]]``."""

    def hook(activation: torch.Tensor, hook: Any = None) -> torch.Tensor:
        edited = activation.clone()  # the model's dtype and device (the edit is computed in float32 at least)
        where = activation.device
        target = clean[pairs.to(clean.device), pos.to(clean.device)].to(where)
        at_rows, at_pos = rows.to(where), pos.to(where)
        edited[at_rows, at_pos] = patch_subspace(activation[at_rows, at_pos], target, basis, complement)
        return edited

    return hook
