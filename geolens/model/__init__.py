"""The model adapter: the only package that knows TransformerLens (TL).

* :mod:`geolens.model.adapter` — :class:`ModelAdapter`, one read-only view of a ``HookedTransformer``
  or a ``TransformerBridge``: shape facts, hook names of each site, ``run_with_hooks``, tokens;
* :mod:`geolens.model.readout` — what the unembedding reads (``W_U`` raw or folded, ``ln_final``) and
  the model's own output transform (soft-caps, logit scales, prediction heads), as the adapter's methods;
* :mod:`geolens.model.boot` — :func:`boot_bridge`, and which model kinds the installed TL has.

Example:
    >>> adapter = as_adapter(model)
    >>> adapter.kind, adapter.block_hook_name("resid_post", 1), adapter.unembed_matrix("folded").shape
    ('bridge', 'blocks.1.hook_resid_post', torch.Size([64, 200]))
"""

from geolens.model.adapter import Model, ModelAdapter, as_adapter
from geolens.model.boot import boot_bridge, supported_kinds
from geolens.model.readout import READOUTS

__all__ = ["READOUTS", "Model", "ModelAdapter", "as_adapter", "boot_bridge", "supported_kinds"]
