"""User-facing analyses: ``f(model, tokens, ...) -> Result``, composing capture and metrics."""

from geolens.analyses.pga import pga, pga_of_states

__all__ = ["pga", "pga_of_states"]
