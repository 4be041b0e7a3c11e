"""Human names of what figures show: metric columns (with their units and hover notes) and hook sites.

One mapping for every figure, so a metric has the same name on every axis, panel title and legend.

Example:
    >>> label("spectrum.effective_rank"), unit("effective_rank"), site_label("attn_out")
    ('effective rank (Roy & Vetterli)', 'dimensions', 'attention output')
"""

from __future__ import annotations

import pandas as pd

__all__ = ["CONVERGENCE_MEASURES", "CONVERGENCE_PARTS", "METRICS", "SITES", "UNITS", "axis_title", "hover_note",
           "is_z_score", "label", "metric_key", "site_label", "unit"]

# Column name -> (human label, axis title with its unit, note shown on hover). One mapping for every figure.
METRICS: dict[str, tuple[str, str, str]] = {
    "z": ("PGA z-score", "PGA z-score (sd of the null)", "readout subspace against random subspaces"),
    "pga_z": ("PGA z-score", "PGA z-score (sd of the null)", "readout subspace against random subspaces"),
    "rho_readout": ("Spearman ρ, readout subspace", "Spearman ρ", "distances in the readout subspace vs the full space"),
    "effective_rank": ("effective rank (Roy & Vetterli)", "effective rank (dimensions)",
                       "exp of the entropy of the normalised singular values"),
    "rankme": ("RankMe (Garrido et al.)", "RankMe (dimensions)", "effective rank of the uncentred singular values"),
    "alpha_req": ("α-ReQ (eigenvalue decay)", "α-ReQ exponent α (power law)",
                  "slope of log eigenvalue against log rank; larger = faster decay"),
    "alpha_req_r2": ("α-ReQ fit R²", "α-ReQ fit R²", "quality of the power-law fit"),
    "isotropy": ("isotropy (Mu & Viswanath)", "isotropy I (1 = isotropic)", "min Z(c) / max Z(c)"),
    "log_isotropy": ("log isotropy (Mu & Viswanath)", "log isotropy ln I (0 = isotropic)",
                     "ln of min Z(c) / max Z(c); 0 is isotropic. Large negative values (about −1000) mean one "
                     "direction dominates so strongly that I itself underflows to 0: a highly anisotropic cloud"),
    "mean_cosine": ("mean pairwise cosine", "mean cosine", "average cosine between two vectors; 0 = no common direction"),
    "cosine_std": ("s.d. of pairwise cosines", "s.d. of cosines", "spread of the pairwise cosines"),
    "condition_number": ("condition number", "condition number σ<sub>max</sub> / σ<sub>min</sub>", "within the numerical rank; large = ill-conditioned"),
    "numerical_rank": ("numerical rank", "numerical rank (dimensions)", "singular values above the tolerance"),
    "orthogonality": ("update orthogonality |cos(Δ<sub>l</sub>, h<sub>l−1</sub>)|", "|cos| (0 = orthogonal)", ""),
    "update_norm": ("update norm ||Δ<sub>l</sub>||", "||Δ<sub>l</sub>|| (residual units)", ""),
    "relative_update_norm": ("relative update norm ||Δ<sub>l</sub>|| / ||h<sub>l−1</sub>||", "||Δ<sub>l</sub>|| / ||h<sub>l−1</sub>|| (ratio)", ""),
    "ffn_mha_ratio": ("MLP / attention norm ratio", "norm ratio", "||MLP out|| / ||attention out||"),
    "erank_states": ("effective rank of the states H<sub>l</sub>", "effective rank (dimensions)", ""),
    "erank_updates": ("effective rank of the updates Δ<sub>l</sub>", "effective rank (dimensions)", ""),
    "kl": ("KL to the final distribution", "KL (nats)", "KL(p<sub>final</sub> ‖ p<sub>l</sub>)"),
    "ce": ("cross-entropy", "cross-entropy (nats)", ""),
    "accuracy_mean": ("probe accuracy", "held-out accuracy", ""),
    "p_value": ("p-value", "p-value", ""),
    "pc1_readout_energy": ("PC1 energy in the readout subspace", "fraction of PC1 energy", ""),
}

# The unit alone: the y axis of a panel whose title already names the metric.
UNITS: dict[str, str] = {
    "effective_rank": "dimensions", "rankme": "dimensions", "numerical_rank": "dimensions", "alpha_req": "exponent α",
    "alpha_req_r2": "R²", "isotropy": "I (1 = isotropic)", "log_isotropy": "ln I (0 = isotropic)",
    "mean_cosine": "cosine", "cosine_std": "cosine s.d.", "condition_number": "σ<sub>max</sub> / σ<sub>min</sub>",
    "orthogonality": "|cos| (0 = orthogonal)", "update_norm": "norm", "relative_update_norm": "ratio",
    "ffn_mha_ratio": "ratio", "erank_states": "dimensions", "erank_updates": "dimensions",
}

# Sites of the residual stream and block outputs.
SITES: dict[str, str] = {"resid_pre": "residual stream (block input)", "resid_post": "residual stream",
                         "resid_mid": "residual stream (after attention)", "attn_out": "attention output",
                         "mlp_out": "MLP output", "final": "final state (after ln_final)", "embed": "embeddings"}

# Convergence columns are named "<measure>_<part>" (e.g. "cka_readout").
CONVERGENCE_MEASURES = {"spearman": ("Spearman ρ of distances", "ρ"), "cka": ("linear CKA", "CKA"),
                        "mknn": ("mutual k-NN overlap", "mutual k-NN")}
CONVERGENCE_PARTS = {"full": "full space", "readout": "readout subspaces", "random_mean": "random subspaces"}


def label(name: str) -> str:
    """The human name of a metric column (``"spectrum.log_isotropy"`` and ``"log_isotropy"`` alike).

    Example:
        >>> label("log_isotropy"), label("pga.z"), label("n_params")
        ('log isotropy (Mu & Viswanath)', 'PGA z-score', 'n params')
    """
    key = _key(name)
    if key in METRICS:
        return METRICS[key][0]
    if key.startswith("rss@k="):
        return f"RSS, k = {key.split('=')[1]}"
    if key.startswith("hit@") and "/" not in key:
        return f"Hit@{key[4:]}"
    for prefix, (measure, _) in CONVERGENCE_MEASURES.items():
        if key.startswith(prefix + "_") and key[len(prefix) + 1:] in CONVERGENCE_PARTS:
            return f"{measure}, {CONVERGENCE_PARTS[key[len(prefix) + 1:]]}"
    return key.replace("_", " ")


def axis_title(name: str) -> str:
    """The axis title (quantity and unit) of a metric column.

    Example:
        >>> axis_title("condition_number")
        'condition number σ<sub>max</sub> / σ<sub>min</sub>'
    """
    key = _key(name)
    return METRICS[key][1] if key in METRICS else label(name)


def unit(name: str) -> str:
    """The unit of a metric column (its axis title where a panel title names the metric)."""
    return UNITS.get(_key(name), axis_title(name))


def hover_note(name: str) -> str:
    """What a metric means, shown on hover ("" where it needs no note)."""
    return METRICS.get(_key(name), ("", "", ""))[2]


def site_label(site: object) -> str:
    """The human name of a hook site (``"resid_post"`` -> ``"residual stream"``)."""
    return SITES.get(str(site), str(site).replace("_", " "))


def metric_key(row: pd.Series) -> str:
    """A long table row's metric with its CCR where it has one: ``"pga.z (ccr=1)"``, ``"spectrum.rankme"``.

    Example:
        >>> metric_key(pd.Series({"metric": "pga.z", "ccr": 1.0}))
        'pga.z (ccr=1)'
    """
    return row["metric"] if pd.isna(row["ccr"]) else f"{row['metric']} (ccr={int(row['ccr'])})"


def is_z_score(name: str) -> bool:
    """Whether a metric is a z-score against a null (its column is ``z``, of whichever analysis): figures shade
    the null's band |z| < 1.96 behind it.

    Example:
        >>> is_z_score("pga.z"), is_z_score("z"), is_z_score("spectrum.effective_rank")
        (True, True, False)
    """
    return _key(name) == "z"


def _key(name: object) -> str:
    """A column name without its analysis prefix (``"spectrum.log_isotropy"`` -> ``"log_isotropy"``)."""
    text = str(name)
    head, dot, tail = text.partition(".")
    return tail if dot and head.isidentifier() and tail else text
