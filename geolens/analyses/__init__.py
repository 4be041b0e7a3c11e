"""User-facing analyses: ``f(model, tokens, ...) -> Result``, composing capture and metrics."""

from geolens.analyses.ablation import ablation_effect
from geolens.analyses.checkpoints import over_checkpoints, pythia_checkpoint_loader
from geolens.analyses.compare import compare
from geolens.analyses.convergence import convergence
from geolens.analyses.patching import patch
from geolens.analyses.pga import pga
from geolens.analyses.probes import probes
from geolens.analyses.spectrum import spectrum, weight_geometry
from geolens.analyses.updates import updates

__all__ = ["ablation_effect", "compare", "convergence", "over_checkpoints", "patch", "pga", "probes",
           "pythia_checkpoint_loader", "spectrum", "updates", "weight_geometry"]
