"""The width study: PGA (CCR sweep), spectra and phases on every member and checkpoint of a zoo family.

The report is a study (:mod:`geolens.study`, :func:`zoo_study`): each ``(width, step)``
checkpoint is a cell, booted as a ``TransformerBridge`` in turn (one model in memory at a
time; with ``out_dir`` the cells are kept in ``out_dir/study`` and a rerun resumes) and
analysed on the same held-out texts (the
zoo's held-out split, never trained on): the residual stream and the
post-``ln_final`` state are captured once and scored by subspace PGA with the
CCR sweep and by the spectral metrics; the three-phase analysis gets a
small-budget tuned lens per checkpoint, trained on other held-out texts and
cached in the member's folder. The training log adds the held-out loss.

Widths differ, so depth is compared as *relative depth* ``layer / n_layers``
and the readout dimension is a fixed fraction of the width
(``k = round(k * d)``, ``k`` a fraction, default 0.2: ``k = 102`` at ``d = 512``, close
to the paper's ``k = 100``).

Example:
    >>> zoo = geolens.zoo.train_zoo()   # the default family: trains for minutes  # doctest: +SKIP

    Below, ``zoo`` is a tiny trained family (one width, one layer, four steps; as in
    :func:`~geolens.zoo.train.train_zoo`'s example):

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     res = zoo_report(zoo, out_dir=tmp, analyses=("pga", "spectrum"), n_texts=4, n_tokens=32, n_null=5,
    ...                      ccr=(0, 1), progress=False)
    ...     sorted(res.params["paths"])
    ['zoo.csv', 'zoo.html', 'zoo.json', 'zoo_meta.json']
    >>> fig = res.plot(ccr=1)                  # z by relative depth, one line per width
    >>> fig = res.plot_training(kind="pga.z")  # mean z over layers vs training step
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, ClassVar, Sequence

import pandas as pd

from geolens._io import atomic_write_text
from geolens._validation import UpperBound, check_float, check_int
from geolens.analyses import registry
from geolens.report import QUICK
from geolens.report.pages import Section, versions, write_html
from geolens.results import Result, json_text
from geolens.study import Study, load_errors, run_study
from geolens.study.results import HEADLINE, load_provenance, metric_summary
from geolens.zoo.corpus import zoo_split
from geolens.zoo.members import zoo_member
from geolens._renames import refuse_renamed, renamed_fields, renamed_keywords

__all__ = ["ZooReportSettings", "ZooResult", "zoo_analyses", "zoo_report", "zoo_study"]

LOSS = "loss.eval"  # the held-out loss each checkpoint's training log adds (the zoo's own metric)


def zoo_analyses() -> list[str]:
    """The analyses the zoo report runs, from the registry of analyses (:mod:`geolens.analyses.registry`).

    Example:
        >>> zoo_analyses()
        ['pga', 'spectrum', 'phases']
    """
    return registry.names("zoo")


# Settings that kept 0.3.0's words until 0.4.0 -> their names in the vocabulary (docs/concepts/conventions.md).
RENAMED_ZOO_SETTINGS: dict[str, str] = {"k_fraction": "k", "lens_steps": "lens_max_steps", "lens_texts": "lens_n_texts"}


@renamed_fields(**RENAMED_ZOO_SETTINGS)
@dataclass
class ZooReportSettings:
    """Budgets of the width study.

    ``k`` is the readout dimension as a fraction of each member's width (widths differ; :meth:`k_for` gives
    the dimension at one width), ``lens_max_steps`` the exact step count of each checkpoint's tuned lens and
    ``lens_n_texts`` the number of held-out texts it is trained on.

    With the defaults, the first run over the default family (7 checkpoints each) also trains a tuned
    lens per checkpoint for the phases; later runs load them from the cache (run times of both:
    docs/benchmarks.md).
    """

    n_texts: int = 32
    max_length: int = 128
    n_tokens: int = 512
    k: float = 0.2
    n_null: int = 100
    ccr: Sequence[int] = (1, 5, 10)
    lens_max_steps: int = 40
    lens_tokens_per_step: int = 512
    lens_n_texts: int = 150
    seed: int = 0
    progress: bool = True

    @classmethod
    def quick(cls, **overrides: Any) -> "ZooReportSettings":
        """Small budgets (seconds per checkpoint): the report's (:data:`geolens.report.QUICK`) for every
        setting the zoo shares with it (texts, length, positions, nulls, CCR), and a 10-step lens;
        ``overrides`` win.

        Example:
            >>> ZooReportSettings.quick().n_tokens == QUICK["n_tokens"]
            True
        """
        refuse_renamed("ZooReportSettings.quick", overrides, RENAMED_ZOO_SETTINGS)
        own = {f.name for f in fields(cls)}
        # The zoo's sample sizes are exact numbers (its study cells are keyed by that): a preset's upper
        # bound is taken as its number.
        shared = {name: int(value) if isinstance(value, UpperBound) else value
                  for name, value in QUICK.items() if name in own}
        preset = dict(shared, lens_max_steps=10, lens_tokens_per_step=256, lens_n_texts=40)
        return cls(**{**preset, **overrides})

    def k_for(self, width: int) -> int:
        """The readout dimension at ``width``: the fraction ``k`` of it, rounded, between 1 and ``width - 1``.

        Example:
            >>> ZooReportSettings().k_for(512), ZooReportSettings(k=0.001).k_for(64)
            (102, 1)
        """
        return min(width - 1, max(1, round(self.k * width)))


@dataclass(repr=False)
class ZooResult(Result):
    """One row per number: ``width, step, tokens, analysis, site, layer, relative_depth, ccr, metric, value``.

    ``metric`` is ``"<analysis>.<column>"`` (``"pga.z"``, ``"spectrum.effective_rank"``,
    ``"phases.rss"``, ``"loss.eval"``); ``ccr`` is set on PGA rows; loss rows have no layer.
    """

    title: ClassVar[str] = "ZooResult"

    def _summary(self) -> str:
        return f"widths={self.params.get('widths')}, steps={self.params.get('steps')}"

    def select(self, metric: str, *, ccr: int | None = None, step: int | None = None,
               site: str = "resid_post") -> pd.DataFrame:
        """Rows of one metric (at one CCR for a metric with a CCR sweep, such as PGA's; at ``step``, default each
        width's last)."""
        table = self.to_pandas()
        if metric not in set(table["metric"]):
            raise ValueError(f"unknown metric {metric!r}; available: {sorted(set(table['metric']))}")
        part = table[table["metric"] == metric]
        if part["ccr"].notna().any():
            ccrs = sorted(int(c) for c in part["ccr"].dropna().unique())
            ccr = ccrs[0] if ccr is None else ccr
            if ccr not in ccrs:
                raise ValueError(f"ccr={ccr} was not computed; the sweep has {ccrs}")
            part = part[part["ccr"] == ccr]
        if part["layer"].notna().any():
            part = part[part["site"] == site]
        if step is None:
            last = part.groupby("width")["step"].transform("max")
            return part[part["step"] == last]
        if step not in set(part["step"]):
            raise ValueError(f"step {step} was not analysed; steps are {sorted(set(part['step']))}")
        return part[part["step"] == step]

    @renamed_keywords(metric="kind")
    def plot(self, *, kind: str = HEADLINE, ccr: int | None = None, step: int | None = None):
        """Metric ``kind`` by relative depth (``layer / n_layers``), one line per width (default: final step, lowest
        CCR)."""
        from geolens.zoo.figures import zoo_depth_figure  # plotly, imported when a figure is made

        return zoo_depth_figure(self, kind=kind, ccr=ccr, step=step)

    @renamed_keywords(metric="kind")
    def plot_training(self, *, kind: str = HEADLINE, ccr: int | None = None, site: str = "resid_post"):
        """Metric ``kind`` against training step, one line per width (averaged over layers 1..L-1 for per-layer
        metrics)."""
        from geolens.zoo.figures import zoo_training_figure  # plotly, imported when a figure is made

        return zoo_training_figure(self, kind=kind, ccr=ccr, site=site)

    def summary(self) -> pd.DataFrame:
        """One row per width at its last step: held-out loss, each summary metric of the records
        (:func:`~geolens.study.results.metric_summary`: PGA z's mean, minimum and final state per CCR; the mean
        effective rank), then the columns of the analyses the zoo summarises (the phases)."""
        table = self.to_pandas()
        rows = []
        for width, part in table.groupby("width", sort=True):
            last = part[part["step"] == part["step"].max()]
            row: dict[str, Any] = {"width": width, "step": int(last["step"].iloc[0])}
            loss = last[last["metric"] == LOSS]["value"]
            row["eval_loss"] = float(loss.iloc[0]) if len(loss) else float("nan")
            for metric in registry.metrics("summary"):
                row.update(metric_summary(last, metric, lowest=True))
            for record in _summarised():
                row.update(record.zoo_columns(self.params.get(record.name, {}).get(str(width), {})))
            rows.append(row)
        return pd.DataFrame(rows)


def zoo_study(zoo, plan: dict[int, list[int]], texts: Sequence[str], lens_texts: Sequence[str],
              settings: ZooReportSettings, analyses: Sequence[str]) -> Study:
    """The width study as a :class:`~geolens.study.Study`: one model per width (its checkpoints ``plan[width]``),
    the held-out texts, each analysis with its record's options on that member (``zoo_options``: e.g.
    ``k = round(k * d)`` for PGA, a cached tuned lens of ``lens_texts`` for the phases)."""
    records = [registry.get(name) for name in analyses]
    models = {f"d{width}": zoo_member(zoo, width, steps, params={
        record.name: dict(record.zoo_options(settings, width=width, lens_texts=lens_texts))
        for record in records if record.zoo_options is not None}) for width, steps in plan.items()}
    return Study(models=models, texts=list(texts), analyses={record.name: {} for record in records},
                 n_tokens=settings.n_tokens, seed=settings.seed, max_length=settings.max_length, name="zoo")


def _zoo_rows(table: pd.DataFrame) -> list[dict[str, Any]]:
    """The study's long table in the zoo's row format (plain Python values), with the logged losses as rows."""
    rows: list[dict[str, Any]] = []

    def plain(value: Any) -> Any:
        return None if value is None or value is pd.NA or (isinstance(value, float) and value != value) else value

    for (_, _), cell in table.groupby(["model", "checkpoint"], sort=False):
        first = cell.iloc[0]
        head = {"width": int(first["width"]), "step": int(first["step"]), "tokens": int(first["tokens"]),
                "n_layers": int(first["n_layers"])}
        for record in cell[["analysis", "site", "layer", "ccr", "metric", "value", "relative_depth"]].itertuples(
                index=False):
            layer, ccr = plain(record.layer), plain(record.ccr)
            rows.append({**head, "analysis": record.analysis, "site": plain(record.site),
                         "layer": None if layer is None else int(layer), "ccr": None if ccr is None else int(ccr),
                         "metric": record.metric, "value": float(record.value),
                         "relative_depth": None if layer is None else float(record.relative_depth)})
        for kind in ("eval", "train"):
            loss = plain(first[f"{kind}_loss"])
            if loss is not None:
                rows.append({**head, "analysis": "loss", "site": None, "layer": None, "ccr": None,
                             "metric": f"loss.{kind}", "value": float(loss), "relative_depth": None})
    return rows


def _steps_to_run(zoo, width: int, checkpoints: str | Sequence[int]) -> list[int]:
    saved = zoo.steps(width)
    if not zoo.is_trained(width):
        raise FileNotFoundError(f"width {width} of {zoo.root} is not trained to step {zoo.config.steps} "
                                f"(saved: {saved}); run `geolens zoo train` with the same settings first")
    if checkpoints == "all":
        return saved
    if checkpoints == "final":
        return [zoo.config.steps]
    if isinstance(checkpoints, str):
        raise ValueError(f"checkpoints must be 'all', 'final' or a list of steps, got {checkpoints!r}")
    missing = [s for s in checkpoints if s not in saved]
    if missing:
        raise ValueError(f"steps {missing} are not saved checkpoints; saved steps: {saved}")
    return sorted(set(int(s) for s in checkpoints))


def zoo_report(
    zoo,
    out_dir: str | Path | None = "out/zoo",
    *,
    checkpoints: str | Sequence[int] = "all",
    analyses: Sequence[str] | None = None,
    settings: ZooReportSettings | None = None,
    **overrides: Any,
) -> ZooResult:
    """Analyse every member (and checkpoint) of a trained zoo; write ``zoo.html``, ``zoo.csv``, ``zoo.json``.

    Args:
        zoo: a :class:`~geolens.zoo.train.Zoo` (from :func:`~geolens.zoo.train.train_zoo` or ``Zoo.open``).
        out_dir: where the page and the numbers go; ``None`` writes nothing.
        checkpoints: ``"all"`` saved steps, ``"final"``, or a list of steps.
        analyses: among ``"pga"`` (with the CCR sweep), ``"spectrum"``, ``"phases"`` (:func:`zoo_analyses`;
            ``None``: all of them).
        settings: budgets (:class:`ZooReportSettings`; ``ZooReportSettings.quick()`` for small ones);
            ``overrides`` set its fields (``n_tokens=256``, ``ccr=(0, 1)``).

    Returns:
        :class:`ZooResult`: ``.plot()`` (z by relative depth per width), ``.plot_training()``,
        ``.summary()``; ``params["paths"]`` lists the files written.

    Example:
        >>> from geolens.zoo import Zoo
        >>> res = zoo_report(Zoo.open(zoo.root), None, checkpoints="final", analyses=("pga",), n_texts=4,
        ...                  n_tokens=32, n_null=5, ccr=(0,), progress=False)
        >>> res.summary()[["width", "step", "eval_loss"]].round(2).values.tolist()
        [[16.0, 4.0, 5.54]]
    """
    started = time.perf_counter()
    settings, analyses = _zoo_request(settings, overrides, analyses)
    plan = {width: _steps_to_run(zoo, width, checkpoints) for width in zoo.config.widths}
    texts, lens_texts = _zoo_texts(settings)
    study = zoo_study(zoo, plan, texts, lens_texts, settings, [a for a in zoo_analyses() if a in analyses])
    rows, provenance, study_dir = _run_zoo_study(study, out_dir, settings.progress)
    kept = {record.name: _last_step_summaries(plan, provenance, record) if record.name in analyses else {}
            for record in _summarised()}
    params = {
        "zoo": str(zoo.root), "family": zoo.config.family(), "widths": list(zoo.config.widths),
        "steps": sorted({s for steps in plan.values() for s in steps}), "analyses": list(analyses),
        **kept, "texts": f"{len(texts)} held-out BBC News texts",
        **{key: (list(value) if isinstance(value, tuple) else value)
           for key, value in vars(settings).items() if key != "progress"},
        # As an analysis's params do (the phases'): k the readout dimension each width used, k_fraction the
        # fraction it was taken as (the setting k).
        "k": {str(w): settings.k_for(w) for w in zoo.config.widths}, "k_fraction": settings.k,
    }
    if out_dir is not None:
        params["study_dir"] = str(study_dir)
    result = ZooResult(rows=rows, params=params)
    result.params["run_time_s"] = round(time.perf_counter() - started, 1)
    if out_dir is not None:
        result.params["paths"] = {name: str(path) for name, path in write_zoo_report(result, Path(out_dir)).items()}
    return result


def _zoo_request(settings: ZooReportSettings | None, overrides: dict[str, Any],
                 analyses: Sequence[str] | None) -> tuple[ZooReportSettings, Sequence[str]]:
    """The settings (``overrides`` on top) and analyses (default: every zoo analysis), checked before any work."""
    refuse_renamed("zoo_report", overrides, RENAMED_ZOO_SETTINGS)
    settings = replace(settings or ZooReportSettings(), **overrides) if overrides else (settings or ZooReportSettings())
    known = zoo_analyses()
    analyses = known if analyses is None else analyses
    unknown = [a for a in analyses if a not in known]
    if unknown or not analyses:
        raise ValueError(f"unknown analyses {unknown or list(analyses)}; choose from {known}")
    for name in ("n_texts", "max_length", "n_tokens", "n_null", "lens_max_steps", "lens_tokens_per_step", "lens_n_texts"):
        check_int(getattr(settings, name), name, low=1)
    check_float(settings.k, "k", low=0, high=1, low_open=True, high_open=True)
    return settings, analyses


def _zoo_texts(settings: ZooReportSettings) -> tuple[list[str], list[str]]:
    """``(the measured texts, the tuned lens's texts)``: the first held-out texts, then the next ones."""
    _, held_out = zoo_split()
    if settings.n_texts + settings.lens_n_texts > len(held_out):
        raise ValueError(f"n_texts + lens_n_texts = {settings.n_texts + settings.lens_n_texts} exceeds the "
                         f"{len(held_out)} held-out texts")
    return held_out[: settings.n_texts], held_out[settings.n_texts:][: settings.lens_n_texts]


def _run_zoo_study(study: Study, out_dir: str | Path | None, progress: bool) -> tuple[pd.DataFrame, dict, Path]:
    """Run ``study`` in ``out_dir/study`` (a temporary folder without ``out_dir``): ``(rows, provenance, folder)``.

    A failed checkpoint raises (``ValueError`` for bad input, else ``RuntimeError``) naming the first failure.
    """
    with contextlib.ExitStack() as stack:
        study_dir = Path(out_dir) / "study" if out_dir is not None else Path(stack.enter_context(
            tempfile.TemporaryDirectory(prefix="geolens-zoo-")))
        ran = run_study(study, study_dir, progress=progress)
        errors = load_errors(study_dir)
        if len(errors):
            first = errors.iloc[0]
            kind = ValueError if first["error_type"] in ("ValueError", "DegenerateError", "TypeError") else RuntimeError
            raise kind(f"zoo {first['model'].replace('d', 'd=', 1)} step {first['checkpoint']}: {first['error']} "
                       f"({len(errors)} of {len(study.cells())} checkpoints failed; the others are kept in "
                       f"{study_dir if out_dir is not None else 'a temporary folder'})")
        return _zoo_rows(ran.to_pandas()), load_provenance(study_dir), study_dir


def _summarised() -> list[registry.Analysis]:
    """The zoo's analyses whose reported params its result keeps per width (their records' ``zoo_summary``)."""
    return [record for record in map(registry.get, zoo_analyses()) if record.zoo_summary is not None]


def _last_step_summaries(plan: dict[int, list[int]], provenance: dict[str, Any],
                         record: registry.Analysis) -> dict[str, dict[str, Any]]:
    """What ``record`` keeps of its reported params (its ``zoo_summary``) at each width's last step.

    Example:
        >>> reported = {"d16/4": {"params": {"phases": {"k": 3, "b1": 1, "b2": 2, "found": True}}}}
        >>> _last_step_summaries({16: [0, 4]}, reported, registry.get("phases"))
        {'16': {'k': 3, 'b1': 1, 'b2': 2, 'found': True, 'reason': None}}
    """
    return {str(width): dict(record.zoo_summary(provenance.get(f"d{width}/{steps[-1]}", {}).get("params", {})
                                                .get(record.name, {})))
            for width, steps in plan.items()}


def _figures(result: ZooResult) -> list[Any]:
    """The page's figures: the headline metric by relative depth (one per CCR) and over training, the held-out
    loss over training, then the records' other metrics by depth, then their others over training."""
    table = result.to_pandas()
    present = set(table["metric"])
    depth = [metric for metric in registry.metrics("depth") if metric in present]
    training = [metric for metric in registry.metrics("training") if metric in present]

    def by_depth(metric: str) -> list[Any]:
        ccrs = sorted(int(c) for c in table.loc[table["metric"] == metric, "ccr"].dropna().unique())
        return [result.plot(kind=metric, ccr=ccr) for ccr in ccrs or [None]]

    figures = [*(by_depth(HEADLINE) if HEADLINE in depth else []),
               *([result.plot_training(kind=HEADLINE)] if HEADLINE in training else []),
               *([result.plot_training(kind=LOSS)] if LOSS in present else [])]
    figures += [figure for metric in depth if metric != HEADLINE for figure in by_depth(metric)]
    return figures + [result.plot_training(kind=metric) for metric in training if metric != HEADLINE]


def write_zoo_report(result: ZooResult, out_dir: Path) -> dict[str, Path]:
    """``zoo.html`` (figures, the per-width summary, parameters, versions), ``zoo.csv`` and ``zoo.json``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"zoo.csv": out_dir / "zoo.csv", "zoo.json": out_dir / "zoo.json", "zoo.html": out_dir / "zoo.html"}
    atomic_write_text(paths["zoo.csv"], result.to_pandas().to_csv(index=False))
    result.save(paths["zoo.json"])
    figures = _figures(result)
    summary = Result(rows=result.summary().to_dict("records"),
                     params={k: v for k, v in result.params.items()
                             if k != "paths" and k not in {r.name for r in _summarised()}})
    meta = {"zoo": result.params["zoo"], "widths": result.params["widths"], "steps": result.params["steps"],
            "run_time_s": result.params.get("run_time_s"), "versions": versions()}
    lines = [f"{row['d_model'] if 'd_model' in row else row.get('width')}: "
             + ", ".join(f"{k} {v:.2f}" for k, v in row.items() if isinstance(v, float))
             for row in summary.rows[:8]] if summary.rows else []
    write_html(paths["zoo.html"], title="geolens zoo — geometry across widths",
               subtitle="Models that differ only in width, on the same held-out texts.",
               sections=[Section("width-study", "Width study: PGA, spectra and phases by relative depth and over training",
                                 "Each line is one width; x is relative depth (layer / number of layers) or the "
                                 "training step. The summary table below averages the inner layers.", summary,
                                 figures, findings=lines)], meta=meta)
    atomic_write_text(out_dir / "zoo_meta.json", json_text(meta))
    paths["zoo_meta.json"] = out_dir / "zoo_meta.json"
    return paths
