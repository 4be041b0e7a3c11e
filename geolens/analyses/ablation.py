"""``geolens.ablation_effect``: what removing a layer's top principal directions does downstream.

See docs/methods.md §D.3.

The PGA paper reads the collapse of PGA z in small models' late layers as
*masking* by a dominant direction. This analysis tests it causally: ablate the
top ``n_components`` principal directions of layer ``l`` during the forward pass (see
:mod:`geolens.interventions`) and report

* the change in next-token cross-entropy and ``KL(clean || ablated)`` of the
  next-token distributions (mean over real positions that predict a real token);
* the PGA z of layers ``l..L`` (and the post-``ln_final`` state) with and without
  the ablation, on the same sampled positions and the same null subspaces.

Example:
    >>> res = geolens.ablation_effect(model, texts, layer=1, n_components=1, k=8, n_null=5, n_tokens=16,
    ...                               progress=False)
    >>> res.to_pandas()[["layer", "site", "z_clean", "z_ablated"]].round(1).values.tolist()
    [[1, 'resid_post', 4.6, 0.3], [2, 'resid_post', -1.4, -1.5], [2, 'final', -0.7, -2.5]]
    >>> fig = res.plot()
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from tqdm.auto import tqdm

from geolens._renames import renamed_attributes, renamed_keywords
from geolens._validation import UpperBound, check_int, resolve_k
from geolens.analyses.pga import _score_states, default_k
from geolens.capture import TokenBatch, capture, prepare_tokens
from geolens.sites import FINAL_SITE, RESIDUAL_SITE, check_layer
from geolens.interventions import ABLATION_MODES, ablation_hooks, edit_hook_name, reference_pcs
from geolens.metrics.readout import readout_basis
from geolens.model import Model, ModelAdapter, as_adapter
from geolens.results import Result
from geolens import plotting

__all__ = ["AblationEffectResult", "ablation_effect", "next_token_effect"]


@dataclass(repr=False)
class AblationEffectResult(Result):
    """PGA by downstream layer with and without an ablation: ``layer, site, z_clean, z_ablated,
    delta_z, rho_clean, rho_ablated``. ``params`` holds the loss effect: ``ce_clean``,
    ``ce_ablated``, ``delta_ce``, ``kl`` (nats per predicted token) and ``pc_readout_energy``
    (``||V_k^T q||^2`` of each ablated direction; random expectation ``k / d``).
    """

    title: ClassVar[str] = "AblationEffectResult"

    def _summary(self) -> str:
        keys = ("model", "layer", "m", "mode", "delta_ce", "kl", "k", "ccr", "n_tokens")
        shown = {k: self.params[k] for k in keys if k in self.params}
        return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in shown.items())

    def plot(self):
        """PGA z by layer, clean vs ablated; the final (ln_final) state as stars."""
        return plotting.ablation_figure(self)


def next_token_effect(
    adapter: ModelAdapter, batch: TokenBatch, hooks: list, *, batch_size: int = 8, progress: bool = False,
) -> dict[str, float]:
    """Cross-entropy of the next real token, clean and with ``hooks``, and ``KL(clean || hooked)``.

    Averaged over positions ``t`` where tokens ``t`` and ``t + 1`` are both real (mask 1); nats.
    """
    sums = torch.zeros(3, dtype=torch.float64)
    count = 0
    n = batch.tokens.shape[0]
    for start in tqdm(range(0, n, batch_size), desc="loss", disable=not progress, leave=False):
        ids = batch.tokens[start:start + batch_size].to(adapter.device)
        mask = batch.attention_mask[start:start + batch_size].to(adapter.device)
        valid = (mask[:, :-1] != 0) & (mask[:, 1:] != 0)
        if not bool(valid.any()):
            continue
        target = ids[:, 1:][valid]
        logp_clean = adapter.run_with_hooks(ids, mask)[:, :-1][valid].double().log_softmax(-1)
        logp_hooked = adapter.run_with_hooks(ids, mask, fwd_hooks=hooks)[:, :-1][valid].double().log_softmax(-1)
        rows = torch.arange(target.numel(), device=target.device)
        sums[0] += float(-logp_clean[rows, target].sum())
        sums[1] += float(-logp_hooked[rows, target].sum())
        sums[2] += float((logp_clean.exp() * (logp_clean - logp_hooked)).sum())
        count += int(target.numel())
    if count == 0:
        raise ValueError("no position predicts a real next token: pass sequences of at least 2 tokens")
    ce_clean, ce_hooked, kl = (sums / count).tolist()
    return {"ce_clean": ce_clean, "ce_ablated": ce_hooked, "delta_ce": ce_hooked - ce_clean, "kl": kl,
            "n_predicted": count}


@renamed_keywords(m="n_components")
def ablation_effect(
    model: Model,
    tokens: Any,
    *,
    layer: int,
    n_components: int = 1,
    reference_tokens: Any = None,
    mode: str = "project",
    site: str = RESIDUAL_SITE,
    k: int | float | None = None,
    n_null: int = 100,
    ccr: int = 0,
    readout: str = "raw",
    skip_first: bool = True,
    n_tokens: int | None = UpperBound(256),
    seed: int = 0,
    batch_size: int = 8,
    max_length: int | None = None,
    attention_mask: torch.Tensor | None = None,
    progress: bool = True,
) -> AblationEffectResult:
    """Effect of ablating the top ``n_components`` principal directions of ``(site, layer)`` on loss, KL and
    downstream PGA.

    Args:
        model: ``HookedTransformer`` or ``TransformerBridge``.
        tokens: evaluation text(s) or ``[B, T]`` ids.
        layer: the ablated layer (geolens convention: ``resid_post`` 0..L, block sites 1..L; negative
            counts from the end, ``-1`` = ``L``).
        n_components: number of principal directions (of the centred reference states) to ablate.
        reference_tokens: where the directions (and, for ``mode="mean"``, the mean) come from;
            default ``tokens`` themselves.
        k: readout dimension of PGA (an int, or a float in (0, 1): that fraction of ``d_model``;
            default ``min(100, d - 1)``).
        n_null: random subspaces of the PGA null.
        n_tokens: positions sampled for the PCs and for PGA (same seed: same positions clean and ablated).
        seed: seed for positions and nulls.
        progress: progress bars.
        mode: ``"project"`` (remove the component) or ``"mean"`` (replace it by the reference mean's).
        site: the ablated site.
        ccr: components removed before PGA; default 0 (centring only), so the measurement itself
            removes nothing and the ablation is the only intervention.
        readout: ``"raw"`` or ``"folded"`` readout subspace.
        skip_first: leave position 0 (BOS) unedited.
        batch_size: texts per forward pass.
        max_length: truncation of each text, in tokens (``None``: whole texts).
        attention_mask: mask of a token-id tensor.

    Returns:
        :class:`AblationEffectResult`: one row per downstream layer (``layer..L`` of ``resid_post``,
        plus ``final``) with ``z_clean``, ``z_ablated``, ``delta_z``; loss effect in ``params``.

    Example:
        >>> res = ablation_effect(model, texts, layer=1, n_components=1, k=8, n_null=5, n_tokens=16, progress=False)
        >>> round(res.params["delta_ce"], 4), round(res.params["kl"], 4)
        (0.0143, 0.0011)
        >>> res.params["n_predicted"]   # positions whose next token is real
        25
    """
    adapter = as_adapter(model)
    if mode not in ABLATION_MODES:
        raise ValueError(f"mode must be one of {ABLATION_MODES}, got {mode!r}")
    edit_hook_name(adapter, site, layer)  # validates site and layer
    layer = check_layer(site, layer, n_layers=adapter.n_layers)  # -1 = the last layer, as everywhere in geolens
    n_components = check_int(n_components, "n_components", low=1)
    k = resolve_k(k, adapter.d_model)
    k = default_k(adapter.d_model) if k is None else k
    n_null = check_int(n_null, "n_null", low=2)
    ccr = check_int(ccr, "ccr", low=0)
    batch = prepare_tokens(adapter, tokens, attention_mask, max_length)
    if reference_tokens is None:
        reference_tokens, reference_mask = batch.tokens, batch.attention_mask
    else:
        reference_mask = None
    bar = tqdm(total=4, desc="ablation_effect", disable=not progress, leave=False)
    basis, ref_states = reference_pcs(adapter, reference_tokens, layer=layer, n_components=n_components, site=site,
                                      n_tokens=n_tokens, seed=seed, attention_mask=reference_mask, progress=False)
    bar.update()
    hooks = ablation_hooks(adapter, basis, layer=layer, site=site, mode=mode, skip_first=skip_first, progress=False,
                           reference_tokens=ref_states if mode == "mean" else None)
    loss = next_token_effect(adapter, batch, hooks, batch_size=batch_size, progress=progress)
    bar.update()

    clean_states, ablated_states = _downstream_states(adapter, batch, hooks, layer, n_tokens=n_tokens, seed=seed,
                                                      batch_size=batch_size)
    bar.update()
    readout_q = readout_basis(adapter.unembed_matrix(readout), k)
    clean_pga = _score_states(clean_states, readout_q, n_null=n_null, ccr=ccr, seed=seed, progress=False)
    ablated_pga = _score_states(ablated_states, readout_q, n_null=n_null, ccr=ccr, seed=seed, progress=False)
    bar.update()
    bar.close()
    rows = _effect_rows(clean_pga.rows, ablated_pga.rows)
    q = readout_q.to(basis.dtype)
    energy = ((q.T @ basis) ** 2).sum(dim=0).tolist()
    params = {
        "model": adapter.name, "layer": layer, "site": site, "m": n_components, "mode": mode, "k": k, "n_null": n_null,
        "ccr": ccr, "readout": readout, "n_tokens": clean_states.n_tokens, "seed": seed, "skip_first": skip_first,
        **loss, "pc_readout_energy": energy, "random_energy": k / adapter.d_model,
    }
    return AblationEffectResult(rows=rows, params=params)


def _downstream_states(adapter, batch, hooks, layer: int, *, n_tokens, seed: int, batch_size: int):
    """The residual stream from ``layer`` on and the final state, clean and with ``hooks`` on, at the same
    sampled positions. A block site of layer ``l`` (block ``l - 1``) changes ``resid_post`` ``l`` onwards."""
    capture_kw = dict(sites=(RESIDUAL_SITE, FINAL_SITE), layers=list(range(layer, adapter.n_layers + 1)),
                      n_tokens=n_tokens, seed=seed, batch_size=batch_size, progress=False,
                      attention_mask=batch.attention_mask)
    clean_states = capture(adapter, batch.tokens, **capture_kw)
    with adapter.hooks(hooks):  # capture's own hooks nest inside; all removed on exit
        ablated_states = capture(adapter, batch.tokens, **capture_kw)
    return clean_states, ablated_states


def _effect_rows(clean: list[dict], ablated: list[dict]) -> list[dict]:
    """PGA z and rho of each (site, layer) before and after the ablation, and the change of z.

    Example:
        >>> _effect_rows([{"layer": 2, "site": "resid_post", "z": 3.0, "rho_readout": 0.5}],
        ...              [{"layer": 2, "site": "resid_post", "z": 1.0, "rho_readout": 0.25}])
        [{'layer': 2, 'site': 'resid_post', 'z_clean': 3.0, 'z_ablated': 1.0, 'delta_z': -2.0, 'rho_clean': 0.5,
          'rho_ablated': 0.25}]
    """
    rows = []
    for before, after in zip(clean, ablated):
        if (before["site"], before["layer"]) != (after["site"], after["layer"]):
            raise ValueError(f"clean and ablated rows differ: {before['site']} layer {before['layer']} vs "
                             f"{after['site']} layer {after['layer']}")
        rows.append({
            "layer": before["layer"], "site": before["site"],
            "z_clean": before["z"], "z_ablated": after["z"], "delta_z": after["z"] - before["z"],
            "rho_clean": before["rho_readout"], "rho_ablated": after["rho_readout"],
        })
    return rows


# the 0.3.0 name answers with the new one
__getattr__ = renamed_attributes(__name__, {"AblationResult": "AblationEffectResult"})
