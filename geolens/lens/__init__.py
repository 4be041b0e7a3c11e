"""Logit lens and tuned lens on HookedTransformer and TransformerBridge; Hit@k.

See docs/methods.md §C.2–C.5.

* :class:`LogitLens` — ``ln_final(h_l) @ W_U + b_U`` (through the model's own readout head and
  output transform) at every layer ``0..L``.
* :class:`TunedLens` — an affine translator per layer first (``nn.Module``,
  ``save`` / ``load``), trained by :func:`train_tuned_lens` (KL distillation).
* :func:`evaluate` — KL, cross-entropy, Hit@k per layer for both lenses.
* :func:`cached_tuned_lens` — a small-budget tuned lens trained once per
  (model, texts, budget) and cached.

Example:
    >>> from geolens.lens import TunedLens, evaluate, train_tuned_lens
    >>> lens = train_tuned_lens(model, texts * 4, max_steps=2, tokens_per_step=16, seq_len=8, progress=False)
    >>> res = evaluate(model, texts, lens=lens, n_tokens=16, progress=False)
    >>> res.to_pandas().shape   # (tuned, logit) x layers 0..2
    (6, 7)
    >>> res.to_pandas().query("layer == 2")[["kl", "hit@1"]].values.tolist()   # the last layer is the output
    [[0.0, 1.0], [0.0, 1.0]]
"""

from geolens._renames import renamed_attributes
from geolens.lens.cache import SMALL_BUDGET, cached_tuned_lens, longer_budget
from geolens.lens.evaluate import EvaluateResult, evaluate, hit_at_k
from geolens.lens.fit import FAST_BUDGET, fit_tuned_lens
from geolens.lens.logit_lens import LogitLens, layer_logits, residual_stream, unembed
from geolens.lens.train import DEFAULT_SEQ_LEN, DEFAULT_STEPS, DEFAULT_TOKENS_PER_STEP, fast_matmul_dtype, kl_rows, train_tuned_lens
from geolens.lens.tuned_lens import LensHistory, TunedLens

__all__ = [
    "DEFAULT_SEQ_LEN",
    "DEFAULT_STEPS",
    "DEFAULT_TOKENS_PER_STEP",
    "FAST_BUDGET",
    "LensHistory",
    "EvaluateResult",
    "LogitLens",
    "SMALL_BUDGET",
    "TunedLens",
    "cached_tuned_lens",
    "evaluate",
    "fast_matmul_dtype",
    "fit_tuned_lens",
    "hit_at_k",
    "kl_rows",
    "layer_logits",
    "longer_budget",
    "residual_stream",
    "train_tuned_lens",
    "unembed",
]

__getattr__ = renamed_attributes(__name__, {"LensResult": "EvaluateResult"})  # 0.3.0 names answer with the new
