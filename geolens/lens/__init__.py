"""Logit lens and tuned lens on HookedTransformer and TransformerBridge; Hit@k.

* :class:`LogitLens` — ``ln_final(h_l) @ W_U + b_U`` at every layer ``0..L``.
* :class:`TunedLens` — an affine translator per layer first (``nn.Module``,
  ``save`` / ``load``), trained by :func:`train_tuned_lens` (KL distillation).
* :func:`evaluate` — KL, cross-entropy, Hit@k per layer for both lenses.
* :func:`lens_report_sections` — the update-geometry and lens results for a
  report, with a cached small-budget tuned lens.

Example:
    >>> from geolens.lens import TunedLens, train_tuned_lens, evaluate      # doctest: +SKIP
    >>> lens = train_tuned_lens(model, geolens.default_texts(n=400))         # doctest: +SKIP
    >>> evaluate(lens, model, geolens.default_texts(n=16, seed=1)).plot()   # doctest: +SKIP
"""

from geolens.lens.evaluate import REPORT_BUDGET, LensResult, cached_tuned_lens, evaluate, hit_at_k, lens_figure, lens_report_sections
from geolens.lens.logit_lens import LogitLens, layer_logits, residual_stream, unembed
from geolens.lens.train import DEFAULT_SEQ_LEN, DEFAULT_STEPS, DEFAULT_TOKENS_PER_STEP, fast_matmul_dtype, kl_rows, train_tuned_lens
from geolens.lens.tuned_lens import TunedLens

__all__ = [
    "DEFAULT_SEQ_LEN",
    "DEFAULT_STEPS",
    "DEFAULT_TOKENS_PER_STEP",
    "LensResult",
    "LogitLens",
    "REPORT_BUDGET",
    "TunedLens",
    "cached_tuned_lens",
    "evaluate",
    "fast_matmul_dtype",
    "hit_at_k",
    "kl_rows",
    "layer_logits",
    "lens_figure",
    "lens_report_sections",
    "residual_stream",
    "train_tuned_lens",
    "unembed",
]
