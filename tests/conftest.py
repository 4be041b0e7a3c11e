"""Tiny, offline TransformerLens models shared by the test suite.

Three model kinds, all seeded and small enough for a 2-core CPU:

* ``hooked_model`` — ``HookedTransformer`` from a ``HookedTransformerConfig``
  (skipped on TransformerLens 4.x, which removed it);
* ``native_bridge`` — ``TransformerBridge.boot_native`` on a ``TransformerBridgeConfig``;
* ``neox_bridge`` — a GPT-NeoX (Pythia architecture, parallel attention/MLP)
  Hugging Face model saved to a temp dir and booted with ``boot_transformers``.

All three share one word-level tokenizer built locally (no hub access). The
final LayerNorm weights are jittered away from 1 so that the "folded" readout
differs from the raw one. Each model has run one forward pass already (bridges
wire internal hooks lazily on the first one). Fixtures are session-scoped: tests
must not edit the models (the adapter never does; tests check that).

``gemma3_bridge`` (a tiny Gemma-3 with the same tokenizer, whose RMSNorms store
``w - 1`` and multiply by ``1 + w``) is built only for the tests of offset norms
that ask for it.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

torch.manual_seed(0)

SEED = 0
D_MODEL = 32
N_HEADS = 4
N_LAYERS = 2
N_CTX = 64
D_VOCAB = 101  # HookedTransformer / native bridge
NEOX_VOCAB = 200

CORPUS = (
    "the cat sat on the mat",
    "a dog ran in the park",
    "the bird sang a song",
    "a fish swam under the bridge",
    "my friend reads a book every night",
)
MODEL_FIXTURES = ("hooked_model", "native_bridge", "neox_bridge")


def _import_hooked() -> tuple[Any, Any]:
    """``(HookedTransformer, HookedTransformerConfig)`` or skip (TransformerLens 4.x)."""
    try:
        from transformer_lens import HookedTransformer, HookedTransformerConfig
    except ImportError as err:
        pytest.skip(f"HookedTransformer is not available in this TransformerLens ({type(err).__name__})")
    return HookedTransformer, HookedTransformerConfig


@torch.no_grad()
def jitter_norms(module: torch.nn.Module, seed: int = SEED, scale: float = 0.3) -> None:
    """Move every norm's weight/bias off (1, 0), seeded, so folding is not a no-op."""
    gen = torch.Generator().manual_seed(seed)
    for sub in module.modules():
        for attr, base in (("weight", 1.0), ("w", 1.0), ("bias", 0.0), ("b", 0.0)):
            param = sub._parameters.get(attr) if "Norm" in type(sub).__name__ else None
            if param is not None and param.ndim == 1:
                param.copy_(base + scale * torch.randn(param.shape, generator=gen))


def build_tokenizer(path: Path) -> Any:
    """Train a word-level tokenizer on ``CORPUS``, save it to ``path`` and load it back.

    TransformerLens reloads tokenizers from ``name_or_path`` (to switch BOS on),
    so an in-memory tokenizer is not enough: it must live on disk.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=["<|endoftext|>", "<unk>", "<pad>"])
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        unk_token="<unk>",
        pad_token="<pad>",
    )
    fast.save_pretrained(str(path))
    return AutoTokenizer.from_pretrained(str(path))


@pytest.fixture(scope="session")
def texts() -> list[str]:
    """Sentences of different lengths (so batches need padding)."""
    return ["the cat sat", "a dog ran in the park", "my friend reads"]


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tokenizer")
    build_tokenizer(path)
    return path


@pytest.fixture(scope="session")
def tiny_tokenizer(tokenizer_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tokenizer_dir))


@torch.no_grad()
def warm_up(model: Any) -> Any:
    """Run one tiny forward pass and return the model.

    A bridge wires permanent capture hooks (pre-hooks on ln1/ln2) lazily, on its
    first forward; warming up here keeps hook counts taken inside tests stable.
    """
    model(torch.tensor([[0, 3, 4]]))
    return model


def make_hooked_model(tokenizer: Any = None, **overrides: Any) -> Any:
    """A fresh 2-layer LayerNorm HookedTransformer with jittered norms and a non-zero b_U."""
    HookedTransformer, HookedTransformerConfig = _import_hooked()
    fields = dict(
        d_model=D_MODEL, d_head=D_MODEL // N_HEADS, n_heads=N_HEADS, n_layers=N_LAYERS,
        n_ctx=N_CTX, d_vocab=D_VOCAB, act_fn="gelu", normalization_type="LN", seed=SEED,
        device="cpu",
    )
    fields.update(overrides)
    cfg = HookedTransformerConfig(**fields)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # TL 3.x deprecates HookedTransformer
        model = HookedTransformer(cfg, tokenizer=tokenizer)
    jitter_norms(model)
    with torch.no_grad():
        model.unembed.b_U.copy_(0.1 * torch.randn(D_VOCAB, generator=torch.Generator().manual_seed(SEED)))
    return warm_up(model.eval())


def make_native_bridge(tokenizer: Any = None, **overrides: Any) -> Any:
    """A fresh 2-layer TL-native bridge with jittered norms."""
    from transformer_lens.config import TransformerBridgeConfig
    from transformer_lens.model_bridge import TransformerBridge

    fields = dict(
        d_model=D_MODEL, d_head=D_MODEL // N_HEADS, n_heads=N_HEADS, n_layers=N_LAYERS,
        n_ctx=N_CTX, d_vocab=D_VOCAB, act_fn="gelu", normalization_type="LN", seed=SEED,
        device="cpu",
    )
    fields.update(overrides)
    bridge = TransformerBridge.boot_native(TransformerBridgeConfig(**fields), tokenizer=tokenizer)
    jitter_norms(bridge.original_model)
    return warm_up(bridge.eval())


def save_neox(path: Path, tokenizer_dir: Path | None = None, *, d_model: int = D_MODEL, n_layers: int = N_LAYERS,
              n_heads: int = N_HEADS, seed: int = SEED) -> Path:
    """Save a seeded tiny GPT-NeoX (parallel residual) and the test tokenizer into ``path``.

    The one builder of the suite's GPT-NeoX models (fixtures, doctests, studies); the tokenizer is
    rebuilt beside the weights, so ``tokenizer_dir`` is not read.
    """
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    cfg = GPTNeoXConfig(
        vocab_size=NEOX_VOCAB, hidden_size=d_model, num_hidden_layers=n_layers,
        num_attention_heads=n_heads, intermediate_size=4 * d_model, max_position_embeddings=N_CTX,
        use_parallel_residual=True, rotary_pct=0.25, bos_token_id=0, eos_token_id=0, pad_token_id=2,
    )
    torch.manual_seed(seed)
    model = GPTNeoXForCausalLM(cfg)
    jitter_norms(model, seed=seed)
    model.save_pretrained(str(path))
    build_tokenizer(path)  # same vocabulary as tokenizer_dir, saved beside the weights
    return path


def save_gemma3(path: Path, *, d_model: int = D_MODEL, n_layers: int = N_LAYERS, n_heads: int = N_HEADS,
                seed: int = SEED) -> Path:
    """Save a seeded tiny Gemma-3 (offset RMSNorm: weights stored as ``w - 1``) and the test tokenizer into ``path``.

    Skips where ``transformers`` has no Gemma-3. The norms are jittered like the
    other fixtures' (stored weights near 1, so the effective ``1 + w`` is near 2):
    a readout that forgets the offset is off by far more than any tolerance.
    """
    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "Gemma3TextConfig"):
        pytest.skip("this transformers has no Gemma-3")
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    cfg = Gemma3TextConfig(
        vocab_size=NEOX_VOCAB, hidden_size=d_model, intermediate_size=2 * d_model, num_hidden_layers=n_layers,
        num_attention_heads=n_heads, num_key_value_heads=1, head_dim=d_model // n_heads,
        max_position_embeddings=N_CTX, sliding_window=16, layer_types=["sliding_attention", "full_attention"] * (n_layers // 2)
        + ["full_attention"] * (n_layers % 2), final_logit_softcapping=None,
        bos_token_id=0, eos_token_id=0, pad_token_id=2,
    )
    torch.manual_seed(seed)
    model = Gemma3ForCausalLM(cfg)
    jitter_norms(model, seed=seed)
    model.save_pretrained(str(path))
    build_tokenizer(path)
    return path


@pytest.fixture(scope="session")
def hooked_model(tiny_tokenizer: Any) -> Any:
    return make_hooked_model(tiny_tokenizer)


@pytest.fixture(scope="session")
def native_bridge(tiny_tokenizer: Any) -> Any:
    return make_native_bridge(tiny_tokenizer)


@pytest.fixture(scope="session")
def neox_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer_dir: Path) -> Path:
    return save_neox(tmp_path_factory.mktemp("neox"), tokenizer_dir)


@pytest.fixture(scope="session")
def neox_bridge(neox_dir: Path) -> Any:
    from transformer_lens.model_bridge import TransformerBridge

    return warm_up(TransformerBridge.boot_transformers(str(neox_dir), device="cpu").eval())


@pytest.fixture(scope="session")
def gemma3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Gemma-3 saved by :func:`save_gemma3` (built only by the tests that ask for it)."""
    return save_gemma3(tmp_path_factory.mktemp("gemma3"))


@pytest.fixture(scope="session")
def gemma3_bridge(gemma3_dir: Path) -> Any:
    """The tiny Gemma-3 as a raw (unprocessed) bridge: an offset RMSNorm ``ln_final``."""
    from geolens.model import boot_bridge

    return warm_up(boot_bridge(gemma3_dir, device="cpu").eval())


@pytest.fixture(params=MODEL_FIXTURES)
def any_model(request: pytest.FixtureRequest) -> Any:
    """Each model kind in turn (``hooked_model`` skips itself on TransformerLens 4.x)."""
    return request.getfixturevalue(request.param)


@pytest.fixture(scope="session")
def executed_notebooks():
    """``executed_notebooks(path)``: the notebook at ``path`` executed at its small sizes in a fresh kernel
    (``docs/execute_notebooks.py``'s ``run_small``), once per test run: the browser test, the site and the
    notebook tests share that run. Callers that change it work on a copy."""
    done: dict[str, Any] = {}

    def executed(path: Path):
        if path.stem not in done:
            from tests.helpers import load_script

            done[path.stem] = load_script("docs/execute_notebooks.py", "execute_notebooks").run_small(path)
        return done[path.stem]

    return executed
