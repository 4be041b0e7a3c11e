"""geolens: the geometry of a language model's internal representations, layer by layer.

Example (on a tiny 2-layer model; ``load_default_model`` gives the real one):
    >>> import geolens
    >>> model = geolens.load_default_model()   # a one-time conversion, 540 MB  # doctest: +SKIP
    >>> res = geolens.pga(model, texts, k=8, n_null=10, ccr=[0, 1], n_tokens=24, progress=False)
    >>> res.to_pandas().query("ccr == 0")[["layer", "site", "z"]].round(2).values.tolist()
    [[0, 'resid_post', -0.36], [1, 'resid_post', 1.41], [2, 'resid_post', 0.49], [2, 'final', -0.49]]
    >>> fig = res.plot()
"""

from geolens import lens, metrics
from geolens.analyses.ablation import AblationEffectResult, ablation_effect
from geolens.analyses.checkpoints import OverCheckpointsResult, over_checkpoints, pythia_checkpoint_loader
from geolens.analyses.compare import CompareResult, compare
from geolens.analyses.convergence import ConvergenceResult, convergence
from geolens.analyses.patching import PatchResult, kl, logit_diff, patch, prob
from geolens.analyses.pga import PGAResult, pga
from geolens.analyses.phases import PhasesResult, phases
from geolens.analyses.probes import ProbesResult, probes
from geolens.analyses.registry import available_analyses, register_analysis, unregister_analysis
from geolens.analyses.spectrum import SpectrumResult, WeightGeometryResult, spectrum, weight_geometry
from geolens.analyses.updates import UpdatesResult, updates
from geolens._validation import DegenerateError
from geolens.capture import States, capture
from geolens.sites import SITES
from geolens.interventions import ablate, ablate_pcs, ablation_hooks
from geolens.model import ModelAdapter, as_adapter
from geolens.results import RENAMED_RESULTS, Result
from geolens.data import available_models, default_texts, load_default_model, load_model
from geolens.lens.evaluate import EvaluateResult
from geolens._renames import renamed_attributes
from geolens import zoo  # imported so it registers ``zoo = "folder"`` with the study engine (geolens.study.factories)

from geolens._version import __version__

__all__ = [
    "AblationEffectResult",
    "CompareResult",
    "ConvergenceResult",
    "DegenerateError",
    "EvaluateResult",
    "ModelAdapter",
    "OverCheckpointsResult",
    "PatchResult",
    "PGAResult",
    "PhasesResult",
    "ProbesResult",
    "Result",
    "SITES",
    "SpectrumResult",
    "States",
    "UpdatesResult",
    "WeightGeometryResult",
    "ablate",
    "ablate_pcs",
    "ablation_effect",
    "ablation_hooks",
    "as_adapter",
    "available_analyses",
    "available_models",
    "capture",
    "compare",
    "convergence",
    "default_texts",
    "kl",
    "lens",
    "logit_diff",
    "load_default_model",
    "load_model",
    "metrics",
    "over_checkpoints",
    "patch",
    "pga",
    "phases",
    "prob",
    "probes",
    "pythia_checkpoint_loader",
    "register_analysis",
    "spectrum",
    "unregister_analysis",
    "updates",
    "weight_geometry",
]

# 0.3.0 names of result classes: an error naming the new one (geolens._renames)
__getattr__ = renamed_attributes(__name__, RENAMED_RESULTS)
