"""``geolens.updates``: the geometry of every block's update to the residual stream.

See docs/methods.md §C.1.

``Delta_l = h_l - h_{l-1}`` with ``h`` the residual stream (capture site
``resid_post``, layers ``0..L``; ``h_0`` = embeddings). Sequential blocks add
``attn_out`` then ``mlp_out`` (the MLP reads ``h_{l-1} + attn_out``); parallel
blocks (GPT-NeoX / Pythia) add both, computed from ``h_{l-1}``. In either case
``Delta_l = attn_out_l + mlp_out_l`` when the block adds nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

import torch

from geolens._validation import DEFAULT_N_TOKENS
from geolens.capture import States, capture
from geolens.metrics.updates import update_summary
from geolens.model import Model, as_adapter
from geolens import plotting
from geolens.results import Result

__all__ = ["UpdatesResult", "capture_sites", "report_section", "updates"]

# What the update geometry reads: the stream before and after each block, and the two parts the block adds.
SITES = ("resid_post", "attn_out", "mlp_out")

@dataclass(repr=False)
class UpdatesResult(Result):
    """Update geometry per layer ``l = 1..L``: ``layer, orthogonality, update_norm,
    relative_update_norm, ffn_mha_ratio, erank_states, erank_updates`` (token means;
    effective ranks of the uncentred ``[N, d]`` matrices, Roy & Vetterli)."""

    title: ClassVar[str] = "UpdatesResult"

    def plot(self):
        """Plotly figure: one panel per metric, by layer."""
        return plotting.updates_figure(self.to_pandas(), title=self._summary())


def updates(
    model: Model,
    tokens,
    *,
    n_tokens: int | None = DEFAULT_N_TOKENS,
    seed: int = 0,
    batch_size: int = 8,
    max_length: int | None = None,
    attention_mask: torch.Tensor | None = None,
    progress: bool = True,
) -> UpdatesResult:
    """Update orthogonality, norms, FFN/MHA ratio and effective ranks of every layer.

    Captures ``resid_post`` (layers ``0..L``), ``attn_out`` and ``mlp_out``
    (layers ``1..L``) at the same ``n_tokens`` sampled positions (BOS and padding
    excluded), then per layer ``l``: mean ``|cos(Delta_l, h_{l-1})|``, mean
    ``||Delta_l||`` and ``||Delta_l|| / ||h_{l-1}||``, mean
    ``||mlp_out_l|| / ||attn_out_l||``, and the effective ranks of ``H_l`` ``[N, d]``
    and of the updates ``[N, d]``.

    Args:
        model: ``HookedTransformer`` or ``TransformerBridge``.
        tokens: text, list of texts, ``[B, T]`` token ids, or :class:`~geolens.capture.States` captured before
            from this model with every layer of ``resid_post``, ``attn_out`` and ``mlp_out`` (scored as they
            are; the sampling options are then not used).
        n_tokens: positions sampled (seeded); ``None`` = all.
        seed: seed of the position sample.
        progress: show a progress bar.

    Returns:
        :class:`UpdatesResult`, one row per layer ``1..L``.

    Example:
        >>> res = geolens.updates(model, texts, n_tokens=16, progress=False)
        >>> res.to_pandas()[["layer", "orthogonality", "ffn_mha_ratio"]].round(2).values.tolist()
        [[1.0, 0.1, 1.73], [2.0, 0.08, 1.62]]
        >>> res.params["parallel_attn_mlp"]   # GPT-NeoX: attention and MLP both read h_{l-1}
        True
    """
    adapter = as_adapter(model)
    if isinstance(tokens, States):
        states = _checked_states(tokens, adapter.n_layers, adapter.d_model)
    else:
        states = capture(adapter, tokens, sites=SITES, n_tokens=n_tokens, seed=seed, batch_size=batch_size,
                         progress=progress, attention_mask=attention_mask, max_length=max_length)
    rows = update_summary(states["resid_post"], states["attn_out"], states["mlp_out"])
    params = {
        "model": adapter.name, "n_tokens": states.n_tokens, "seed": states.meta.get("seed", seed),
        "n_layers": adapter.n_layers,
        "d_model": adapter.d_model, "parallel_attn_mlp": adapter.parallel_attn_mlp,
        "erank": "Roy & Vetterli, uncentred, p_i = s_i / sum(s)",
    }
    return UpdatesResult(rows=rows, params=params)


def _checked_states(states: States, n_layers: int, d_model: int) -> States:
    """``states`` if they hold every layer of :data:`SITES` of a model with ``n_layers`` blocks and width
    ``d_model``, else ``ValueError`` naming what is missing."""
    states.check_width(d_model)
    for site in SITES:
        wanted = tuple(range(0 if site == "resid_post" else 1, n_layers + 1))
        if site not in states.sites:
            raise ValueError(f"updates needs the states of {list(SITES)}; these hold {list(states.sites)}, "
                             f"not {site!r}")
        if tuple(states.layers[site]) != wanted:
            raise ValueError(f"updates needs every layer of {site!r} ({wanted[0]}..{wanted[-1]}); these states "
                             f"hold {list(states.layers[site])}")
    return states


# ---------------------------------------------------------------- how the report and studies run updates (its
# record in geolens.analyses.registry points here)


def capture_sites(options: Mapping[str, Any]) -> tuple[str, ...]:
    """The sites :func:`updates` reads (what a report or a study's cell captures once for it).

    Example:
        >>> capture_sites({})
        ('resid_post', 'attn_out', 'mlp_out')
    """
    return SITES


def report_section(run: Any, needed: Mapping[str, Result]) -> tuple[UpdatesResult, list[Any]]:
    """The report's update geometry on the run's shared capture (the same positions as PGA and the spectra)."""
    result = updates(run.adapter, run.states(), progress=run.settings.progress)
    return result, [result.plot()]
