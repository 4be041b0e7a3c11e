"""Studies: many models x checkpoints x analyses as one resumable run, with one long table at the end.

A :class:`Study` is data (Python dataclasses or a TOML file, :meth:`Study.from_toml`);
:func:`run_study` computes each ``(model, checkpoint)`` cell — in this process or as Ray
tasks — and writes its rows atomically to a Parquet dataset partitioned by model and
checkpoint; :func:`load_results` reads it back as one long table; :class:`StudyResult`
draws the papers' cross-model views and :func:`study_report` puts them on one HTML page.

Example:
    >>> from geolens.study import Study, run_study, load_results
    >>> import tempfile
    >>> spec = Study(models={"small": model_path, "big": (model_path, None)},   # label -> path or (path, revision)
    ...              texts=texts,
    ...              analyses={"pga": {"k": 8, "n_null": 20, "ccr": [1, 5]},
    ...                        "spectrum": {"alpha_fit_range": (1, 10)}},   # {} on a real model; 13 distinct states here
    ...              metadata={"small": {"width": 32}, "big": {"width": 64}}, n_tokens=16)
    >>> with tempfile.TemporaryDirectory() as out:
    ...     _ = run_study(spec, out, executor="local", progress=False)    # or executor="ray"
    ...     df = load_results(out)
    >>> df.groupby("model", sort=False)["width"].first().to_dict()
    {'small': 32, 'big': 64}
"""

from geolens._renames import renamed_attributes
from geolens.study.cells import cell_provenance
from geolens.study.views import study_report
from geolens.study.results import StudyResult, load_errors, load_provenance, load_results
from geolens.study.run import EXECUTORS, run_study
from geolens.study.plan import Cell
from geolens.study.spec import ModelSpec, Study

__all__ = [
    "EXECUTORS",
    "Cell",
    "ModelSpec",
    "Study",
    "StudyResult",
    "cell_provenance",
    "load_errors",
    "load_provenance",
    "load_results",
    "run_study",
    "study_report",
]

# Removed in 0.4.0: the records say which metrics a study correlates.
__getattr__ = renamed_attributes(__name__, {"GEOMETRY_METRICS": "geolens.analyses.registry.metrics('correlated')"})
