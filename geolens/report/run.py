"""What one report run computes or loads once and shares between its sections: the captured states, the tuned
lens, the second model, the results of the sections done so far.

A section's runner (its record's ``runner`` in :mod:`geolens.analyses.registry`) reads the run: ``run.adapter``,
``run.texts``, ``run.settings`` (:class:`~geolens.report.settings.ReportSettings`) and the shared parts below,
each made on first use.

Example:
    >>> run = ReportRun(geolens.as_adapter(model), texts, ReportSettings(n_tokens=16, progress=False),
    ...                 sections=("pga", "spectrum"))
    >>> run.states() is run.states(), sorted(run.states().layers)
    (True, ['final', 'resid_post'])
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from typing import Any, Sequence

from geolens._rng import rng
from geolens.analyses import registry
from geolens.capture import States, capture
from geolens.data import default_texts, load_model
from geolens.data.models import MODELS, convert_in_background, is_available
from geolens.lens import TunedLens, cached_tuned_lens
from geolens.model import ModelAdapter, as_adapter
from geolens.report.settings import CROSS_FAMILY_MODEL, ReportSettings
from geolens.results import Result
from geolens.sites import FINAL_SITE, RESIDUAL_SITE

__all__ = ["ReportRun", "lens_texts", "start_second_model_conversion"]


@dataclass
class ReportRun:
    """One report run: its model, texts and settings, and what its sections share (made once, on first use)."""

    adapter: ModelAdapter
    texts: list[str]
    settings: ReportSettings
    results: dict[str, Result] = field(default_factory=dict)  # sections done so far
    # The sections this run serves (None: every registered one): its shared capture holds what they read.
    sections: tuple[str, ...] | None = None
    _states: States | None = field(default=None, repr=False)
    _lens: TunedLens | None = field(default=None, repr=False)
    _second_model: tuple[ModelAdapter | None, str] | None = field(default=None, repr=False)
    # The second model's one-time conversion, started in the background (start_second_model_conversion).
    second_model_conversion: BaseProcess | None = field(default=None, repr=False)

    def states(self) -> States:
        """The report's sampled positions, captured once in one forward pass for every section that scores
        shared states (:meth:`shared_sites`)."""
        s = self.settings
        if self._states is None:
            self._states = capture(self.adapter, self.texts, sites=self.shared_sites(), n_tokens=s.n_tokens,
                                   seed=s.seed, max_length=s.max_length, progress=s.progress)
        return self._states

    def shared_sites(self) -> tuple[str, ...]:
        """The residual stream and the final state, and the sites (their records' ``capture_sites``) of the
        run's sections that score shared states.

        Example:
            >>> ReportRun(geolens.as_adapter(model), texts, ReportSettings(), sections=("updates",)).shared_sites()
            ('resid_post', 'final', 'attn_out', 'mlp_out')
        """
        sites = [RESIDUAL_SITE, FINAL_SITE]  # the lens section also scores these positions
        for name in registry.names() if self.sections is None else self.sections:
            record = registry.get(name)
            if record.shares_capture and record.capture_sites is not None:
                sites += [site for site in record.capture_sites({}) if site not in sites]
        return tuple(sites)

    @property
    def captured(self) -> States | None:
        """The shared capture if a section made it, else ``None`` (read without capturing)."""
        return self._states

    def lens_texts(self) -> list[str]:
        """The tuned lens's training texts: default texts the report does not score."""
        return lens_texts(self.texts, self.settings.seed, self.settings.full_lens_budget()["n_train_texts"])

    def lens_budget(self) -> dict[str, Any]:
        """The tuned lens's fitting budget (:meth:`ReportSettings.full_lens_budget` less its number of texts)."""
        budget = self.settings.full_lens_budget()
        budget.pop("n_train_texts")
        return budget

    def lens(self) -> TunedLens:
        """The run's tuned lens, fitted once (with its halves, for the phases' stability) or loaded from the cache."""
        if self._lens is None:
            budget = self.lens_budget()
            halves = budget.get("method", "fast") == "fast"
            self._lens = cached_tuned_lens(self.adapter, self.lens_texts(), seed=self.settings.seed,
                                           progress=self.settings.progress, halves=halves, **budget)
        return self._lens

    def labelled_texts(self, n: int) -> tuple[list[str], list[int]]:
        """``n`` default texts (seeded) and their topic labels."""
        return default_texts(n=n, seed=self.settings.seed, with_labels=True)

    def second_model(self) -> tuple[ModelAdapter | None, str]:
        """The second model (``settings.convergence_model``), loaded once, or ``None`` and the reason it is absent."""
        if self._second_model is None:
            if self.second_model_conversion is not None:  # loaded once its conversion is done
                self.second_model_conversion.join()
                self.second_model_conversion = None
            self._second_model = _load_second_model(self.adapter, self.settings)
        return self._second_model


def start_second_model_conversion(settings: ReportSettings, sections: Sequence[str]) -> BaseProcess | None:
    """The background conversion (:func:`geolens.data.models.convert_in_background`) of the convergence section's
    second model, started where the run has a section that reads it (its record's ``report_settings`` name
    ``convergence_model``) and the model is an offline one not converted yet; else ``None``. Started before the
    report's own model loads, the conversion (mostly Python on one core) runs beside that model's conversion and
    the first sections instead of inside the convergence section.

    Example:
        >>> start_second_model_conversion(ReportSettings(convergence_model=None), ["convergence"]) is None
        True
    """
    choice = settings.convergence_model
    # The sections that compare with the second model are those whose records read its setting.
    compares = any("convergence_model" in registry.get(name).report_settings for name in sections)
    if not compares or not isinstance(choice, str) or choice not in MODELS or not is_available(choice):
        return None
    process = convert_in_background(choice)
    if process is not None and settings.progress:
        print(f"geolens: converting {choice} in the background (one-time), for the convergence section",
              file=sys.stderr)
    return process


def lens_texts(texts: list[str], seed: int, n: int) -> list[str]:
    """Default-corpus texts not among ``texts``, shuffled by the seed: the report's tuned lens's training text."""
    held_out = set(texts)
    pool = [t for t in default_texts(n=None) if t not in held_out]
    rng(seed, "report texts").shuffle(pool)
    return pool[:n]


def _load_second_model(adapter: ModelAdapter, s: ReportSettings) -> tuple[ModelAdapter | None, str]:
    choice = s.convergence_model
    if choice is None or (isinstance(choice, str) and choice == "auto"):
        return None, ("not asked (convergence_model=None); the default model's report compares it with "
                      f"{CROSS_FAMILY_MODEL}")
    if not isinstance(choice, str):
        return as_adapter(choice), ""
    spec = MODELS.get(choice)
    if spec is not None and spec.display_name == adapter.name:
        return None, f"the report's model is {choice} itself"
    if spec is not None and not is_available(choice):
        return None, f"the wheels of {choice} are not installed; install them with: {spec.install_command()}"
    try:
        return as_adapter(load_model(choice, device=adapter.device, progress=s.progress)), ""
    except (RuntimeError, ValueError, OSError) as error:
        return None, f"{choice} could not be loaded: {type(error).__name__}: {error}"
