"""Shared inputs for the lens tests."""

import pytest

from tests.conftest import CORPUS


@pytest.fixture(scope="session")
def train_texts():
    """The tiny tokenizer's corpus, repeated: enough windows for a few training steps."""
    return list(CORPUS) * 4


@pytest.fixture(scope="session", params=["Gemma2ForCausalLM", "CohereForCausalLM", "GraniteForCausalLM",
                                         "ModernBertDecoderForCausalLM"])
def transformed_output(request, tmp_path_factory):
    """``(bridge, hf_model)``: a tiny model that changes its logits after (or before) the unembedding.

    A final logit soft-cap (Gemma 2), a logit scale (Cohere), a logit divisor (Granite), a
    prediction head between the final norm and the unembedding (ModernBERT-decoder); the
    Hugging Face model is the independent reference.
    """
    from geolens.model import boot_bridge, supported_kinds
    from tests.tiny_architectures import save_tiny

    if "hooked_transformer" in supported_kinds():
        pytest.skip("these architectures are booted as bridges under TransformerLens 4.x")
    path, hf = save_tiny(request.param, tmp_path_factory.mktemp(request.param))
    return boot_bridge(path, device="cpu").eval(), hf
