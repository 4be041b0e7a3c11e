"""Hook-based capture of hidden states at sampled token positions.

See docs/methods.md §F.1–F.2.

Sites and layers follow :mod:`geolens.sites` (``0`` = embeddings, ``final`` =
the state the unembedding reads).

Only the sampled rows are copied out of each hook, so memory is
``O(n_tokens x layers x d)`` plus one forward batch, never a full cache.

Example:
    >>> states = capture(model, ["The cat sat on the mat."], n_tokens=4, progress=False)
    >>> states["resid_post"].shape
    torch.Size([3, 4, 64])
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterable, Sequence

import torch
from jaxtyping import Float, Int
from tqdm.auto import tqdm

from geolens._sampling import bounded_subset
from geolens._validation import check_int
from geolens.model import Model, ModelAdapter, as_adapter
from geolens.sites import check_layers, check_site, hook_name

__all__ = ["States", "TokenBatch", "capture", "prepare_tokens", "sample_positions"]


@dataclass(frozen=True)
class TokenBatch:
    """Token ids ``[B, T]`` and the attention mask ``[B, T]`` (1 = real token, 0 = padding)."""

    tokens: Int[torch.Tensor, "B T"]
    attention_mask: Int[torch.Tensor, "B T"]

    @property
    def n_valid(self) -> int:
        return int(self.attention_mask.sum())


@dataclass
class States:
    """Hidden states of sampled token positions, per site, stacked over layers.

    Attributes:
        tensors: site -> ``[n_layers(site), N, d]`` tensor.
        layers: site -> the layer index of each slice along the first axis.
        hook_names: site -> the TransformerLens hook name of each slice.
        token_ids: ``[N]`` token id at each sampled position.
        batch_index: ``[N]`` sequence each row came from.
        position: ``[N]`` position within that sequence.

    Example:
        >>> states = capture(model, texts, n_tokens=16, progress=False)   # a 2-layer model, d_model 64
        >>> states["resid_post"].shape, states.layer("resid_post", 0).shape
        (torch.Size([3, 16, 64]), torch.Size([16, 64]))
        >>> states.hook_names["resid_post"][1], bool((states.position > 0).all())   # BOS / first token skipped
        ('blocks.0.hook_resid_post', True)
    """

    tensors: dict[str, torch.Tensor]
    layers: dict[str, tuple[int, ...]]
    hook_names: dict[str, tuple[str, ...]]
    token_ids: torch.Tensor
    batch_index: torch.Tensor
    position: torch.Tensor
    n_layers: int = 0
    meta: dict = field(default_factory=dict)

    def __getitem__(self, site: str) -> Float[torch.Tensor, "layers N d"]:
        if site not in self.tensors:
            raise KeyError(f"site {site!r} was not captured; captured: {sorted(self.tensors)}")
        return self.tensors[site]

    def __contains__(self, site: str) -> bool:
        return site in self.tensors

    @property
    def sites(self) -> tuple[str, ...]:
        return tuple(self.tensors)

    @property
    def n_tokens(self) -> int:
        return int(self.token_ids.numel())

    @property
    def d_model(self) -> int:
        return int(next(iter(self.tensors.values())).shape[-1])

    def check_width(self, d_model: int) -> "States":
        """These states if their rows are ``d_model`` wide (a model's), else ``ValueError`` saying both widths.

        Example:
            >>> capture(model, texts, n_tokens=8, progress=False).check_width(32)
            Traceback (most recent call last):
            ...
            ValueError: the states have d = 64 but the model has d_model = 32
        """
        if self.d_model != d_model:
            raise ValueError(f"the states have d = {self.d_model} but the model has d_model = {d_model}")
        return self

    def layer(self, site: str, layer: int) -> Float[torch.Tensor, "N d"]:
        """The ``[N, d]`` states of one site at one layer index."""
        layers = self.layers[site] if site in self.layers else ()
        if layer not in layers:
            raise KeyError(f"layer {layer} of site {site!r} was not captured; captured layers: {list(layers)}")
        return self[site][layers.index(layer)]

    def to(self, device: torch.device | str) -> "States":
        """A copy with every tensor on ``device``."""
        return replace(
            self,
            tensors={s: t.to(device) for s, t in self.tensors.items()},
            token_ids=self.token_ids.to(device),
            batch_index=self.batch_index.to(device),
            position=self.position.to(device),
        )

    def select(self, sites: Sequence[str]) -> "States":
        """The same rows, restricted to ``sites`` (tensors shared, not copied)."""
        missing = [s for s in sites if s not in self.tensors]
        if missing:
            raise KeyError(f"sites {missing} were not captured; captured: {sorted(self.tensors)}")
        return replace(
            self,
            tensors={s: self.tensors[s] for s in sites},
            layers={s: self.layers[s] for s in sites},
            hook_names={s: self.hook_names[s] for s in sites},
        )

    def __repr__(self) -> str:
        parts = ", ".join(f"{s}: {tuple(t.shape)}" for s, t in self.tensors.items())
        return f"States(N={self.n_tokens}, d={self.d_model}, {parts})"


def prepare_tokens(
    adapter: ModelAdapter,
    tokens: str | Sequence[str] | torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    max_length: int | None = None,
) -> TokenBatch:
    """Turn a string, a list of strings or a ``[B, T]`` id tensor into a :class:`TokenBatch`.

    Strings are tokenised with the model's tokenizer (BOS as the model adds it,
    right padding, mask). A tensor without a mask is taken as unpadded.
    """
    if isinstance(tokens, str):
        tokens = [tokens]
    if isinstance(tokens, torch.Tensor):
        if tokens.ndim == 1:
            tokens = tokens.unsqueeze(0)
        if tokens.ndim != 2:
            raise ValueError(f"tokens must be [batch, pos], got shape {tuple(tokens.shape)}")
        if tokens.numel() == 0:
            raise ValueError(f"tokens is empty (shape {tuple(tokens.shape)}): pass at least one sequence of "
                             "at least one token id")
        if tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
            raise TypeError(f"token ids must be an integer tensor, got dtype {tokens.dtype}")
        if attention_mask is None:
            attention_mask = torch.ones_like(tokens)
        if tuple(attention_mask.shape) != tuple(tokens.shape):
            raise ValueError(
                f"attention_mask shape {tuple(attention_mask.shape)} does not match tokens {tuple(tokens.shape)}"
            )
        if int(tokens.min()) < 0 or int(tokens.max()) >= adapter.d_vocab:
            raise ValueError(f"token ids must lie in [0, {adapter.d_vocab}), got [{int(tokens.min())}, {int(tokens.max())}]")
        if max_length is not None:
            tokens, attention_mask = tokens[:, :max_length], attention_mask[:, :max_length]
        limit = adapter.max_positions
        if limit is not None and tokens.shape[1] > limit:
            raise ValueError(f"tokens have {tokens.shape[1]} positions but {adapter.name!r} takes at most {limit} "
                             f"(its positional table); pass max_length={limit} or shorter sequences")
        return TokenBatch(tokens.long(), (attention_mask != 0).long())
    if isinstance(tokens, Iterable):
        texts = list(tokens)
        if not texts:
            raise ValueError("the list of texts is empty")
        bad = [type(t).__name__ for t in texts if not isinstance(t, str)]
        if bad:
            raise TypeError(f"texts must all be str, found {sorted(set(bad))}")
        if attention_mask is not None:
            raise ValueError("attention_mask is only accepted with a token-id tensor")
        ids, mask = adapter.tokenize(texts, max_length=max_length)
        return TokenBatch(ids.long(), mask.long())
    raise TypeError(f"tokens must be a str, a list of str or a [batch, pos] tensor, got {type(tokens).__name__}")


def sample_positions(
    attention_mask: Int[torch.Tensor, "B T"],
    n_tokens: int | None,
    *,
    seed: int | None = 0,
    skip_first: bool = True,
    min_tokens: int = 3,
) -> tuple[Int[torch.Tensor, "N"], Int[torch.Tensor, "N"]]:
    """Sample ``n_tokens`` (batch, position) pairs among the real tokens, uniformly, without replacement.

    Padding (mask 0) is never sampled; with ``skip_first`` the first real token
    of each sequence (BOS / attention sink) is excluded too. ``n_tokens=None``
    takes every eligible position. Fewer than ``min_tokens`` eligible positions
    raise (3 is the least any distance geometry needs). Returned sorted by (batch, position).

    Example:
        >>> mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
        >>> b, p = sample_positions(mask, None)
        >>> list(zip(b.tolist(), p.tolist()))
        [(0, 1), (0, 2), (1, 1), (1, 2), (1, 3)]
    """
    mask = attention_mask.to("cpu") != 0
    if skip_first:
        first = mask.int().argmax(dim=1)
        has_any = mask.any(dim=1)
        rows = torch.arange(mask.shape[0])[has_any]
        mask = mask.clone()
        mask[rows, first[has_any]] = False
    batch_idx, pos_idx = mask.nonzero(as_tuple=True)
    available = batch_idx.numel()
    if available < min_tokens:
        raise ValueError(
            f"only {available} eligible token positions (after removing padding"
            f"{' and the first token of each sequence' if skip_first else ''}); need at least {min_tokens}"
        )
    chosen = bounded_subset(
        available, n_tokens, seed, name="n_tokens", stacklevel=3,
        over_default="n_tokens: the default of {n} positions exceeds the {available} eligible ones; "
                     "using all {available} (pass n_tokens to choose)",
        too_many="n_tokens = {n} but only {available} eligible token positions are available; "
                 "pass more text or a smaller n_tokens")
    if chosen is None:
        return batch_idx, pos_idx
    return batch_idx[chosen], pos_idx[chosen]


def capture(
    model: Model,
    tokens: str | Sequence[str] | torch.Tensor,
    *,
    sites: str | Sequence[str] = ("resid_post",),
    layers: Sequence[int] | None = None,
    skip_first: bool = True,
    dtype: torch.dtype = torch.float32,
    positions: tuple[torch.Tensor, torch.Tensor] | None = None,
    min_tokens: int = 3,
    n_tokens: int | None = None,
    seed: int = 0,
    batch_size: int = 8,
    max_length: int | None = None,
    attention_mask: torch.Tensor | None = None,
    progress: bool = True,
) -> States:
    """Capture hidden states of ``model`` at sampled token positions.

    Args:
        model: a ``HookedTransformer`` or ``TransformerBridge`` (or a :class:`ModelAdapter`).
        tokens: a string, a list of strings, or a ``[B, T]`` token-id tensor.
        sites: any of ``resid_post`` (the residual stream, layers ``0..L``),
            ``resid_pre``, ``resid_mid``, ``attn_out``, ``mlp_out`` (layers ``1..L``,
            the block producing that layer) and ``final`` (after ``ln_final``).
        layers: layer indices to keep (default: all valid for each site).
        n_tokens: number of positions to sample (default: all eligible).
        seed: seed of the position sample; the same positions for every site and layer.
        batch_size: sequences per forward pass.
        skip_first: exclude the first real token of every sequence (BOS / sink).
        progress: show a tqdm bar over batches.
        attention_mask: ``[B, T]`` mask for a token tensor (1 = real token).
        max_length: truncate sequences to this many tokens.
        dtype: dtype of the stored states (float32: a bf16/fp16 model's sampled rows are
            upcast as they are copied out; the model runs in its own dtype).
        positions: explicit ``(batch_index [N], position [N])`` rows to capture
            instead of a sample (e.g. positions aligned across two tokenizers);
            they must be real (unpadded) tokens. ``n_tokens``/``seed``/``skip_first``
            are then ignored.
        min_tokens: fewest positions accepted (3 by default: geometry needs them).

    Returns:
        :class:`States` with ``[n_layers, N, d]`` per site, on the model's device (that
        of its first parameter; a model split over devices has its states gathered there).

    Raises:
        RuntimeError: a hook did not fire in a batch's forward pass (naming the hook and
            the model): every returned row was written by its hook.
        ValueError: a hook's activation is not ``[batch, pos, d_model]`` (e.g. several
            parallel residual streams), or holds NaN or infinite values.

    Example:
        >>> states = capture(model, texts, sites=("resid_post", "final"), n_tokens=8, progress=False)
        >>> states
        States(N=8, d=64, resid_post: (3, 8, 64), final: (1, 8, 64))
    """
    adapter = as_adapter(model)
    sites = _checked_sites(sites, adapter)
    batch_size = check_int(batch_size, "batch_size", low=1)
    plan = {site: check_layers(site, layers, n_layers=adapter.n_layers) for site in sites}
    batch = prepare_tokens(adapter, tokens, attention_mask, max_length)
    if positions is None:
        rows_batch, rows_pos = sample_positions(batch.attention_mask, n_tokens, seed=seed, skip_first=skip_first,
                                                min_tokens=min_tokens)
    else:
        rows_batch, rows_pos = _check_positions(positions, batch.attention_mask)
    n = rows_batch.numel()
    device = adapter.device
    # NaN until a hook writes a row: a row no hook filled can never pass for a state (checked below too).
    out = {site: torch.full((len(ls), n, adapter.d_model), float("nan"), dtype=dtype, device=device)
           for site, ls in plan.items()}
    names = {site: tuple(hook_name(adapter, site, l) for l in ls) for site, ls in plan.items()}
    targets = _hook_targets(names)
    n_seqs = batch.tokens.shape[0]
    for start in tqdm(_batch_starts(rows_batch, n_seqs, batch_size), desc="capture", disable=not progress, leave=False):
        _capture_batch(adapter, batch, slice(start, start + batch_size), rows_batch, rows_pos, out, targets, plan)
    _check_filled(adapter, out, names)
    return States(
        tensors=out,
        layers={site: tuple(ls) for site, ls in plan.items()},
        hook_names=names,
        token_ids=batch.tokens[rows_batch, rows_pos],
        batch_index=rows_batch,
        position=rows_pos,
        n_layers=adapter.n_layers,
        meta={"seed": seed, "skip_first": skip_first, "n_sequences": n_seqs},
    )


def _checked_sites(sites: str | Sequence[str], adapter: ModelAdapter) -> tuple[str, ...]:
    """``sites`` as a tuple without repeats (a string is one site), each known and present in the model."""
    if isinstance(sites, str):
        sites = (sites,)
    sites = tuple(dict.fromkeys(sites))
    if not sites:
        raise ValueError("no sites given")
    for site in sites:
        check_site(site, name="sites entry")
    if "resid_mid" in sites and not adapter.has_resid_mid:
        raise ValueError("this model has no resid_mid (parallel attention and MLP); drop that site")
    return sites


def _hook_targets(names: dict[str, tuple[str, ...]]) -> dict[str, list[tuple[str, int]]]:
    """Hook name -> the ``(site, slot)`` entries it fills (one hook can serve two sites), from each site's hook names.

    Example:
        >>> _hook_targets({"resid_post": ("h0", "h1"), "resid_pre": ("h1",)})
        {'h0': [('resid_post', 0)], 'h1': [('resid_post', 1), ('resid_pre', 0)]}
    """
    targets: dict[str, list[tuple[str, int]]] = {}
    for site, hook_names in names.items():
        for slot, name in enumerate(hook_names):
            targets.setdefault(name, []).append((site, slot))
    return targets


def _batch_starts(rows_batch: torch.Tensor, n_seqs: int, batch_size: int) -> list[int]:
    """The first sequence of each batch of ``batch_size`` sequences that holds a captured row (the rest are not run).

    Example:
        >>> _batch_starts(torch.tensor([0, 0, 5, 6]), 8, 2)
        [0, 4, 6]
    """
    return [s for s in range(0, n_seqs, batch_size) if bool(((rows_batch >= s) & (rows_batch < s + batch_size)).any())]


def _capture_batch(adapter: ModelAdapter, batch: TokenBatch, seqs: slice, rows_batch: torch.Tensor,
                   rows_pos: torch.Tensor, out: dict[str, torch.Tensor], targets: dict[str, list[tuple[str, int]]],
                   plan: dict[str, Sequence[int]]) -> None:
    """One forward pass over the sequences ``seqs``, its hooks writing their captured rows into ``out``.

    Trailing all-padding columns are trimmed first; the forward stops once every wanted activation is stored.
    """
    device = adapter.device
    in_batch = (rows_batch >= seqs.start) & (rows_batch < seqs.stop)
    row_ids = in_batch.nonzero(as_tuple=True)[0].to(device)
    local_b = rows_batch[in_batch] - seqs.start  # moved to each activation's device by its hook
    local_p = rows_pos[in_batch]
    seq_mask = batch.attention_mask[seqs]
    length = int(seq_mask.any(dim=0).nonzero().max()) + 1
    ids = batch.tokens[seqs, :length].to(device)
    mask = seq_mask[:, :length].to(device)
    fired: set[str] = set()
    ctx = _HookContext(out, plan, fired, len(targets), adapter.name, adapter.d_model, tuple(ids.shape))
    hooks = [(name, _writer(ctx, slots, row_ids, local_b, local_p, name)) for name, slots in targets.items()]
    try:
        adapter.run_with_hooks(ids, attention_mask=mask, fwd_hooks=hooks)
    except _AllCaptured:
        pass  # every wanted activation is stored: the rest of the forward (and the unembedding) is skipped
    check_hooks_fired(adapter, list(targets), fired, f"sequences {seqs.start}..{seqs.start + ids.shape[0] - 1}")


def check_hooks_fired(adapter: ModelAdapter, names: Sequence[str], fired: Iterable[str], what: str) -> None:
    """Raise ``RuntimeError`` naming the hooks of ``names`` not in ``fired`` and the model, if any.

    Example:
        >>> check_hooks_fired(adapter, ["blocks.0.hook_resid_post"], [], "sequences 0..1")
        Traceback (most recent call last):
        ...
        RuntimeError: hook 'blocks.0.hook_resid_post' of ... did not fire during the forward pass of sequences 0..1: ...
    """
    fired = set(fired)
    missing = [name for name in names if name not in fired]
    if missing:
        listed = ", ".join(repr(name) for name in missing)
        plural, pronoun = ("s", "them") if len(missing) > 1 else ("", "it")
        raise RuntimeError(
            f"hook{plural} {listed} of {adapter.name!r} did not fire during the forward pass of {what}: "
            f"TransformerLens registers {pronoun} for this model but the model does not run through {pronoun}, "
            "so geolens cannot read its states there")


def _check_filled(adapter: ModelAdapter, out: dict[str, torch.Tensor], names: dict[str, tuple[str, ...]]) -> None:
    """Raise ``RuntimeError`` if a captured row was never written (still NaN): no unfilled row reaches a metric."""
    for site, tensor in out.items():
        for slot, layer_rows in enumerate(tensor):
            if bool(torch.isnan(layer_rows).any()):
                raise RuntimeError(f"capture: rows of {site} ({names[site][slot]}) of {adapter.name!r} were not "
                                   "written by its hook; no states are returned")


def _check_positions(positions, attention_mask) -> tuple[torch.Tensor, torch.Tensor]:
    """Explicit (batch, position) rows: same length, in range, on real tokens, at least 3."""
    rows_batch, rows_pos = (torch.as_tensor(p, dtype=torch.long).cpu().reshape(-1) for p in positions)
    if rows_batch.shape != rows_pos.shape:
        raise ValueError(f"positions: batch index and position differ in length ({rows_batch.numel()} vs {rows_pos.numel()})")
    if rows_batch.numel() < 3:
        raise ValueError(f"need at least 3 positions, got {rows_batch.numel()}")
    b, t = attention_mask.shape
    if int(rows_batch.min()) < 0 or int(rows_batch.max()) >= b or int(rows_pos.min()) < 0 or int(rows_pos.max()) >= t:
        raise ValueError(f"positions out of range for tokens of shape [{b}, {t}]")
    if not bool((attention_mask.cpu()[rows_batch, rows_pos] != 0).all()):
        raise ValueError("positions include padding")
    return rows_batch, rows_pos


class _AllCaptured(Exception):
    """Raised by the last capture hook of a forward pass to stop it early."""


@dataclass(frozen=True)
class _HookContext:
    """What every capture hook of one forward pass shares: the outputs, the plan, the hooks fired so far,
    the number of hooks, the model's name and width, and the ``[B, T]`` shape of the batch."""

    out: dict[str, torch.Tensor]
    plan: dict[str, Sequence[int]]
    fired: set[str]
    n_hooks: int
    model_name: str
    d_model: int
    batch_shape: tuple[int, int]


def _check_activation_shape(ctx: _HookContext, name: str, activation: torch.Tensor) -> None:
    """Raise ``ValueError`` unless ``activation`` is a residual-stream-like ``[B, T, d_model]`` tensor of this batch."""
    expected = (*ctx.batch_shape, ctx.d_model)
    if tuple(activation.shape) != expected:
        raise ValueError(
            f"hook {name!r} of {ctx.model_name!r} gives activations of shape {tuple(activation.shape)}, but geolens "
            f"supports one residual stream per position, [batch, pos, d_model] = {list(expected)}; this "
            "architecture's states have another shape (e.g. several parallel residual streams), which geolens "
            "does not measure")


def _writer(ctx: _HookContext, slots, row_ids, local_b, local_p, name):
    """A hook that copies the sampled rows of its activation into the output slots.

    The rows are picked where the activation is (a model split over devices runs
    its blocks on several) and only they are moved, to the output's device and
    dtype (float32 by default: a bf16/fp16 model's rows are upcast here).
    An activation that is not ``[B, T, d_model]`` raises (naming the hook, the model and
    the shape geolens supports), and so do non-finite values (naming the site and
    layer): no NaN reaches a metric.
    When it is the last of the ``ctx.n_hooks`` capture hooks to fire, it stops the
    forward pass: nothing after it is needed.
    """
    indices: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def hook(activation, hook=None):
        _check_activation_shape(ctx, name, activation)
        where = activation.device
        if where not in indices:
            indices[where] = (local_b.to(where), local_p.to(where))
        picked = activation[indices[where]]
        if not bool(torch.isfinite(picked).all()):
            sites = ", ".join(f"{site} layer {ctx.plan[site][slot]}" for site, slot in slots)
            raise ValueError(f"the model's activations hold NaN or infinite values at {sites} ({name}); "
                             "no geometry can be measured from them (check the weights and the dtype)")
        for site, slot in slots:
            target = ctx.out[site]
            target[slot, row_ids] = picked.to(device=target.device, dtype=target.dtype)
        ctx.fired.add(name)
        if len(ctx.fired) == ctx.n_hooks:
            raise _AllCaptured
        return None

    return hook
