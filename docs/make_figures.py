"""The figures of the documentation's concept pages, computed on the offline default model.

Runs the report's own sections (:func:`geolens.report.run_section`) on SmolLM2-135M at modest budgets
(16 BBC News texts, 512 positions, 50 null subspaces, CCR 1, 5 and 10; the report's own tuned lens,
``REPORT_LENS_BUDGET`` without its time limit, so that the concept page's lens history and phases are
those of the report's lens at its whole step budget),
plus :func:`geolens.ablation_effect` for the causal page and a small width study for the studies page (a
zoo of three widths trained offline, then PGA of each member, :func:`study_figures`), and writes each
plotly figure as an HTML fragment (``docs/figures/<name>.html``, without plotly.js: the page loads it
once) and the settings, versions and run times as ``docs/figures/figures.json`` (the study's as
``study.json``). The fragments are committed; rerun this script after a change that moves the numbers:

    HF_HUB_OFFLINE=1 .venv/bin/python docs/make_figures.py          # a few minutes on 2 CPU cores
    HF_HUB_OFFLINE=1 .venv/bin/python docs/make_figures.py --study  # the studies page's figure only
    HF_HUB_OFFLINE=1 .venv/bin/python docs/make_figures.py --sections lens,phases  # some sections, merged

With ``--sections`` naming some of the sections, only their fragments are redrawn (no ablation, no study)
and figures.json keeps the other sections' entries, with each redrawn section's date.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from datetime import datetime
from pathlib import Path

OUT = Path(__file__).resolve().parent / "figures"

# Sections in dependency order: spectrum reuses pga; phases reuse lens and updates.
SECTIONS = ("pga", "spectrum", "updates", "lens", "phases", "convergence", "probes")
# The studies page's width zoo: three widths, four blocks, 60 steps (minutes on 2 CPU cores, then cached; the
# family of examples/zoo_width_study.py with a third width).
# The report lens's time limit on the docs' machine: lifted (its step budget binds).
LENS_SECONDS = 1e9
STUDY_ZOO = dict(widths=(32, 64, 128), n_layers=4, d_head=16, vocab_size=1024, steps=60, checkpoints=(0, 30))
# k: the readout dimension as a fraction of each width, as the zoo report takes it.
STUDY_SETTINGS = dict(n_texts=16, k=0.2, n_null=50, ccr=[1, 5], n_tokens=512, max_length=128)


def _write(figure, name: str, out: Path) -> Path:
    # The figure as the report draws it (its own height and margins, room for its panels' titles), with no
    # fixed width: it fills the page's text column and follows the window (plotly's responsive config).
    from geolens.plotting import CONFIG

    path = out / f"{name}.html"
    path.write_text(figure.to_html(full_html=False, include_plotlyjs=False, div_id=f"fig-{name}", config=CONFIG,
                                   default_width="100%"), encoding="utf-8")
    return path


def main(out: Path = OUT, sections: tuple[str, ...] = SECTIONS) -> dict:
    import geolens
    from geolens.model import as_adapter
    from geolens.report.pages import versions
    from geolens.report import ReportRun, ReportSettings, run_section

    out.mkdir(parents=True, exist_ok=True)
    # The report's tuned lens (REPORT_LENS_BUDGET), not the quick preset's closed form on 512 positions, so the
    # lens history and the phases on the concept page are the report's; its time limit lifted, so the figures
    # show its whole step budget whatever else the machine is doing (bench/report_lens.py does the same).
    settings = ReportSettings.quick_preset(n_texts=16, n_tokens=512, n_null=50, ccr=(1, 5, 10), max_length=128,
                                           convergence_model=None, lens_budget={"max_seconds": LENS_SECONDS},
                                           progress=False)
    started = time.perf_counter()
    model = geolens.load_default_model(progress=False)
    adapter = as_adapter(model)
    texts = geolens.default_texts(n=settings.n_texts, seed=settings.seed)
    run = ReportRun(adapter, texts, settings)
    timings, written = {}, {}
    for name in sections:
        start = time.perf_counter()
        result, figures = run_section(name, run)
        timings[name] = round(time.perf_counter() - start, 1)
        for i, figure in enumerate(figures):
            written[f"{name}_{i}"] = _write(figure, f"{name}_{i}", out).name
        print(f"{name}: {timings[name]} s, {len(figures)} figure(s)", flush=True)

    if set(sections) != set(SECTIONS):  # some sections redrawn: merged into the figures.json of the last full run
        return _merge(out, settings, timings, written)

    start = time.perf_counter()
    ablation = geolens.ablation_effect(model, texts, layer=5, n_components=1, n_null=settings.n_null, n_tokens=256,
                                       max_length=settings.max_length, progress=False)
    timings["ablation"] = round(time.perf_counter() - start, 1)
    written["ablation_0"] = _write(ablation.plot(), "ablation_0", out).name
    print(f"ablation: {timings['ablation']} s", flush=True)

    meta = {"model": adapter.name, "n_layers": adapter.n_layers, "d_model": adapter.d_model,
            "texts": len(texts), "settings": settings.as_dict(), "ablation": {"layer": 5, "n_components": 1, "n_tokens": 256},
            "date": datetime.now().astimezone().isoformat(timespec="seconds"),
            "run_time_s": round(time.perf_counter() - started, 1), "section_time_s": timings,
            "figures": written, "versions": versions()}
    (out / "figures.json").write_text(json.dumps(meta, indent=1, default=str) + "\n", encoding="utf-8")
    study_figures(out)
    return meta


def _merge(out: Path, settings, timings: dict, written: dict) -> dict:
    """figures.json with the redrawn sections' figures, times, settings and dates laid over the last full run's."""
    path = out / "figures.json"
    meta = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    date = datetime.now().astimezone().isoformat(timespec="seconds")
    meta.setdefault("figures", {}).update(written)
    meta.setdefault("section_time_s", {}).update(timings)
    meta["settings"] = settings.as_dict()
    meta.setdefault("section_date", {}).update({name: date for name in timings})
    path.write_text(json.dumps(meta, indent=1, default=str) + "\n", encoding="utf-8")
    return meta


def study_figures(out: Path = OUT) -> dict:
    """The studies page's figure: PGA z by relative depth of a width zoo (``study_0``); its settings in study.json."""
    from geolens.study import Study, StudyResult, run_study
    from geolens.zoo import ZooConfig, train_zoo, zoo_member, zoo_split

    started = time.perf_counter()
    config = ZooConfig(**STUDY_ZOO)
    family = train_zoo(config, progress=False)  # geolens's cache: trained once, then loaded
    trained_s = round(time.perf_counter() - started, 1)
    opts = STUDY_SETTINGS
    texts = zoo_split()[1][:opts["n_texts"]]  # articles no member trained on
    models = {f"d{w}": zoo_member(family, w, params={"pga": {"k": round(opts["k"] * w)}})
              for w in config.widths}
    spec = Study(models=models, texts=texts, analyses={"pga": {"ccr": opts["ccr"], "n_null": opts["n_null"]}},
                 n_tokens=opts["n_tokens"], max_length=opts["max_length"], name="width zoo")
    with tempfile.TemporaryDirectory() as folder:
        run_study(spec, Path(folder) / "study", executor="local", progress=False)
        study = StudyResult.from_dir(Path(folder) / "study")
        written = {"study_0": _write(study.plot(kind="pga.z", ccr=1), "study_0", out).name}
    meta = {"zoo": {k: list(v) if isinstance(v, tuple) else v for k, v in STUDY_ZOO.items()}, "settings": opts,
            "date": datetime.now().astimezone().isoformat(timespec="seconds"), "zoo_train_s": trained_s,
            "run_time_s": round(time.perf_counter() - started, 1), "figures": written}
    (out / "study.json").write_text(json.dumps(meta, indent=1, default=str) + "\n", encoding="utf-8")
    print(f"study: {meta['run_time_s']} s", flush=True)
    return meta


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help="folder of the fragments (default: docs/figures)")
    parser.add_argument("--sections", default=",".join(SECTIONS), help="report sections to draw")
    parser.add_argument("--study", action="store_true", help="draw only the studies page's figure")
    args = parser.parse_args()
    if args.study:
        study_figures(args.out)
    else:
        main(args.out, tuple(s for s in args.sections.split(",") if s))
