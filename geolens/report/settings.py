"""The report's settings: one frozen :class:`ReportSettings`, the one preset :data:`QUICK` (the zoo takes it too)
and the budget of the report's tuned lens.

What a run computes or loads (the shared capture, the tuned lens, the second model) is not a setting: it lives
in :class:`geolens.report.run.ReportRun`.

Example:
    >>> settings = ReportSettings.quick_preset(n_tokens=400)
    >>> settings.quick, settings.n_tokens, settings.n_texts
    (True, 400, 8)
    >>> settings.update(ccr=1).ccr, settings.ccr   # a new object: settings never change under a run
    (1, (0, 1))
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, fields, replace
from typing import Any, Sequence

from geolens._renames import refuse_renamed, renamed_fields
from geolens._validation import DEFAULT_N_TOKENS, UpperBound
from geolens.model import as_adapter

__all__ = ["CROSS_FAMILY_MODEL", "QUICK", "RENAMED_SETTINGS", "REPORT_LENS_BUDGET", "ReportSettings",
           "check_lens_check"]

# The convergence section of the default model's report compares it with this offline model of another family.
CROSS_FAMILY_MODEL = "gemma-3-270m"

# The tuned lens of the lens and phases sections: the fast method (closed form on 8192 captured
# positions, a short KL refinement), with its two halves (the phases' stability) from the same
# capture, on 200 default texts the report does not score. The refinement is cut short (20 steps of
# the default 200) to keep the report's run time short; lens.training_info says where it stopped.
# bench/report_lens.py compares it with the same lens refined 4x longer (docs/benchmarks.md).
REPORT_LENS_BUDGET: dict[str, Any] = {"method": "fast", "n_tokens": 8192, "max_steps": 20, "max_seconds": 30.0,
                                      "n_train_texts": 200}

# Small budgets for every section: a whole report of the default model (30 layers, d = 576) in a
# fraction of the full run time, to see that everything runs and roughly what it shows.
QUICK: dict[str, Any] = {
    "n_texts": 8,
    "max_length": 64,
    "n_tokens": UpperBound(256),  # sample sizes of presets are upper bounds, as the defaults are
    "n_null": 20,
    "ccr": (0, 1),
    "probe_n_texts": 50,
    "probe_folds": 3,
    "convergence_n_tokens": UpperBound(128),
    "convergence_n_null": 10,
    "pga_n_resamples": 16,
    # A tuned lens fitted on 512 positions, no refinement: seconds; it has its own cache entry, so
    # it never stands in for a lens of the full budget.
    "lens_budget": {"method": "fast", "n_tokens": 512, "max_steps": 0, "seq_len": 64, "n_train_texts": 40},
}


# Settings that kept 0.3.0's words until 0.4.0 -> their names in the vocabulary (docs/concepts/conventions.md).
RENAMED_SETTINGS: dict[str, str] = {
    "convergence_positions": "convergence_n_tokens", "lens_positions": "lens_n_tokens",
    "pga_resamples": "pga_n_resamples", "probe_texts": "probe_n_texts", "convergence_null": "convergence_n_null",
}


def check_lens_check(value: Any) -> int:
    """``value`` as ``lens_check`` takes it (0: off, else an integer of at least 2), else ``ValueError``.

    Example:
        >>> check_lens_check(4)
        4
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or value == 1:
        raise ValueError(f"lens_check must be 0 (off) or an integer >= 2 (times the report lens's training), "
                         f"got {value!r}")
    return value


@renamed_fields(**RENAMED_SETTINGS)
@dataclass(frozen=True)
class ReportSettings:
    """Budgets of every section (their run times on the default model: docs/benchmarks.md).

    ``lens_budget`` is laid over :data:`REPORT_LENS_BUDGET` (``None``: that budget as it is) for the
    lens and phases sections: ``n_train_texts`` default texts to train on, the rest goes to
    :func:`geolens.lens.cached_tuned_lens` (``method`` and its budget: ``n_tokens``, ``max_steps``,
    ``max_seconds`` for ``"fast"``, ``steps``, ``tokens_per_step`` for ``"reference"``; ``seq_len``).

    Example:
        >>> ReportSettings.quick_preset(n_tokens=400).n_tokens, ReportSettings.quick_preset().n_texts
        (400, 8)
    """

    n_texts: int = 32
    max_length: int = 128
    # Sample sizes left at their defaults are upper bounds (short texts: what there is, with a warning; each
    # section's params record the number used); a number set by hand is exact.
    n_tokens: int = DEFAULT_N_TOKENS
    k: int | None = None
    n_null: int = 100
    ccr: int | Sequence[int] = (1, 5, 10)
    # The PGA section's bootstrap over texts (z_low, z_high; its findings say only what holds across them):
    # resamples, each ranked on a sample of its pairs with their noise taken out as in the point estimate;
    # the interval is z +- t(B - 1) sqrt(T / (T - 1)) sd (T texts), so 16 resamples suffice: t(15) widens it by
    # 9 % over the normal quantile, and either end's Monte Carlo error is under a fifth of the half-width
    # (docs/methods.md §A.10). 0 turns it off. The pairs are part of the interval's calibration (its width holds their
    # noise): its coverage is measured at this number (docs/benchmarks.md).
    pga_n_resamples: int = 16
    pga_bootstrap_pairs: int | None = 10_000
    seed: int = 0
    probe_n_texts: int = 150
    probe_max_length: int = 64
    probe_folds: int = 5
    convergence_n_tokens: int = UpperBound(512)
    # Positions the lens section scores, a seeded sample of the report's captured ones: each costs 2 (L + 1)
    # full-vocabulary products (the logit and the tuned lens at every layer), PGA's only d-sized ones.
    lens_n_tokens: int = UpperBound(512)
    # Second model of the convergence section: an offline model name, a model, or None (the model with itself
    # only). "auto": CROSS_FAMILY_MODEL when the report runs the default model, else None.
    convergence_model: Any = "auto"
    # Null subspace pairs per relative-depth pair of the cross-family comparison: fewer than n_null, since each
    # Spearman null draw sorts N(N-1)/2 distances twice (with 30, the sorts are about a quarter of that part's time).
    convergence_n_null: int = 30
    alpha_fit_range: tuple[int, int] | None = None  # default (5, 100), cut to each spectrum's numerical rank
    lens_budget: dict[str, int] | None = None
    # A second tuned lens, trained lens_check times as many steps as the report's lens took, on the same texts:
    # the phases section then shows k by k whether it finds the same phases, and the KL it reaches
    # (docs/methods.md §C.9b). 0: off. It costs about lens_check times the lens's fit.
    lens_check: int = 0
    quick: bool = False  # made from the QUICK preset (recorded, so a quick report is never mistaken for a full one)
    progress: bool = True

    def __post_init__(self) -> None:
        check_lens_check(self.lens_check)
        if self.lens_check and not self.full_lens_budget().get("max_steps", 1):
            raise ValueError("lens_check compares the report's lens with one trained longer, but lens_budget "
                             "trains it in closed form only (max_steps 0): give it steps, or set lens_check=0")

    @classmethod
    def quick_preset(cls, **overrides: Any) -> "ReportSettings":
        """The small budgets of :data:`QUICK`, with ``overrides`` on top (they win).

        Example:
            >>> s = ReportSettings.quick_preset(ccr=1)
            >>> s.quick, s.n_tokens, s.ccr
            (True, 256, 1)
        """
        refuse_renamed("ReportSettings.quick_preset", overrides, RENAMED_SETTINGS)
        return cls(**copy.deepcopy(QUICK), quick=True).update(**overrides)

    def update(self, **overrides: Any) -> "ReportSettings":
        """These settings with fields set by name (``TypeError`` for a name that is not a setting).

        Example:
            >>> ReportSettings().update(n_tokens=512).n_tokens
            512
        """
        refuse_renamed("ReportSettings.update", overrides, RENAMED_SETTINGS)
        names = {f.name for f in fields(self)}
        unknown = sorted(set(overrides) - names)
        if unknown:
            raise TypeError(f"unknown report setting {unknown[0]!r}; choose from {sorted(names)}")
        return replace(self, **overrides)

    def as_dict(self) -> dict[str, Any]:
        """The effective settings, for meta.json and the page (``lens_budget`` filled in from the default).

        Example:
            >>> ReportSettings().as_dict()["lens_budget"]["method"]
            'fast'
        """
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        if not (out["convergence_model"] is None or isinstance(out["convergence_model"], str)):
            out["convergence_model"] = as_adapter(out["convergence_model"]).name  # a model: recorded by its name
        out["lens_budget"] = self.full_lens_budget()
        return out

    def full_lens_budget(self) -> dict[str, Any]:
        """:data:`REPORT_LENS_BUDGET` with ``lens_budget`` laid over it.

        Example:
            >>> ReportSettings(lens_budget={"max_steps": 0}).full_lens_budget()["max_steps"]
            0
        """
        return {**REPORT_LENS_BUDGET, **(self.lens_budget or {})}
