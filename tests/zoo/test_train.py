"""The width zoo: tokenizer and windows, determinism for a seed, resuming to the same weights, validation."""

from __future__ import annotations

import json
import math

import pytest
import torch

from geolens.zoo.corpus import EOS, token_windows, train_tokenizer, zoo_split
from geolens.zoo.train import Zoo, ZooConfig, default_checkpoints, train_zoo

from tests.zoo.conftest import TINY


def _weights(zoo: Zoo, width: int, step: int) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(zoo.checkpoint_dir(width, step) / "model.safetensors"))


def _assert_same_weights(a: Zoo, b: Zoo, width: int, step: int) -> None:
    wa, wb = _weights(a, width, step), _weights(b, width, step)
    assert wa.keys() == wb.keys()
    for name in wa:
        assert torch.equal(wa[name], wb[name]), f"d={width} step {step}: {name} differs"


def test_split_is_disjoint_fixed_and_covers_the_corpus():
    from geolens.data import default_texts

    train, held_out = zoo_split()
    distinct = set(default_texts())  # the corpus repeats some articles verbatim
    assert len(held_out) == round(0.1 * len(distinct)) and len(set(train)) == len(train)
    assert not set(train) & set(held_out) and set(train) | set(held_out) == distinct
    assert zoo_split()[1] == held_out


def test_tokenizer_round_trips_and_windows_overlap_by_one(tmp_path):
    texts = ["The cat sat on the mat.", "Prices rose 5% in £ terms; 2004's budget—unchanged."] * 20
    tok = train_tokenizer(texts, 300, tmp_path / "tok")
    assert len(tok) == 300 and tok.convert_tokens_to_ids(EOS) == tok.bos_token_id == tok.eos_token_id
    for text in texts[:2]:
        assert tok.decode(tok(text, add_special_tokens=False).input_ids) == text
    again = train_tokenizer(texts, 300, tmp_path / "tok2")
    assert again.get_vocab() == tok.get_vocab()
    windows = token_windows(tok, texts, seq_len=8)
    assert windows.shape[1] == 9 and torch.equal(windows[1:, 0], windows[:-1, -1])
    stream = [t for row in tok(texts, add_special_tokens=False).input_ids for t in (tok.eos_token_id, *row)]
    assert windows[:, :-1].flatten().tolist() == stream[: windows.shape[0] * 8]
    with pytest.raises(ValueError, match="too few"):
        token_windows(tok, ["a"], seq_len=64)


def test_default_family_config_and_checkpoint_schedule():
    config = ZooConfig()
    assert config.widths == (64, 128, 256, 512) and config.n_layers == 6
    assert default_checkpoints(400) == (0, 16, 32, 64, 128, 256, 400)
    assert default_checkpoints(10) == (0, 10)
    assert ZooConfig(checkpoints=(5, 0)).checkpoints == (0, 5, 400)  # the last step is always kept
    assert ZooConfig(widths=(512, 64)).family_key() == config.family_key()  # widths are members, not the family
    assert ZooConfig(seed=1).family_key() != config.family_key()
    # Warm-up reaches the peak, cosine decays to 10 % of it.
    assert config.lr_at(1) < config.lr_at(20) == pytest.approx(config.lr)
    assert config.lr_at(config.steps) == pytest.approx(0.1 * config.lr)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(widths=()), "widths is empty"),
        (dict(widths=(64, 64)), "widths repeat"),
        (dict(widths=(4,)), "each width must be >= 8"),
        (dict(widths=(48,)), "multiple of d_head"),
        (dict(steps=0), "steps must be >= 1"),
        (dict(checkpoints=(0, 500)), r"checkpoints must lie in \[0, steps=400\]"),
        (dict(warmup=1.0), "warmup must be a fraction"),
        (dict(lr=float("nan")), "lr must be a finite"),
        (dict(vocab_size=100), "vocab_size must be >= 260"),
    ],
)
def test_bad_configs_are_refused_with_a_clear_message(overrides, message):
    with pytest.raises(ValueError, match=message):
        ZooConfig(**overrides)


def test_members_differ_only_in_width_and_load_as_bridges(reference_zoo):
    configs = {w: json.loads((reference_zoo.checkpoint_dir(w, 6) / "config.json").read_text()) for w in (16, 32)}
    width_keys = {"hidden_size", "intermediate_size", "num_attention_heads", "head_dim", "dtype", "torch_dtype"}
    differ = {k for k in configs[16] if configs[16].get(k) != configs[32].get(k)}
    assert differ <= width_keys and "hidden_size" in differ
    assert configs[16]["model_type"] == "gpt_neox" and configs[16]["use_parallel_residual"] is True
    table = reference_zoo.to_pandas()
    assert table.groupby("width").step.apply(list).to_dict() == {16: [0, 2, 4, 6], 32: [0, 2, 4, 6]}
    assert table.eval_loss.notna().all() and all(math.isfinite(x) for x in table.eval_loss)
    log = reference_zoo.log(32)
    assert len(log["losses"]) == 6 and log["losses"][-1] < log["losses"][0]  # it learns
    model = reference_zoo.load(32, step=4)
    assert model.cfg.d_model == 32 and model.cfg.n_layers == 2 and "d=32 step 4" in model.cfg.model_name
    # The bridge computes the saved HF model's logits.
    from transformers import GPTNeoXForCausalLM

    hf = GPTNeoXForCausalLM.from_pretrained(str(reference_zoo.checkpoint_dir(32, 4))).eval()
    tokens = torch.tensor([[0, 40, 41, 42, 43, 44]])
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), hf(tokens).logits, rtol=1e-4, atol=1e-4)
    reopened = Zoo.open(reference_zoo.root)
    assert reopened.config == reference_zoo.config and reopened.steps(16) == [0, 2, 4, 6]
    with pytest.raises(FileNotFoundError, match="no checkpoint at step 3"):
        reference_zoo.load(16, step=3)
    with pytest.raises(ValueError, match="width 64 is not in this zoo"):
        reference_zoo.load(64)


def test_training_is_deterministic_for_a_seed(reference_zoo, tmp_path):
    again = train_zoo(ZooConfig(**TINY), tmp_path / "again", progress=False)
    for width in (16, 32):
        for step in (0, 2, 6):
            _assert_same_weights(reference_zoo, again, width, step)
        assert again.log(width)["losses"] == reference_zoo.log(width)["losses"]
    other = train_zoo(ZooConfig(**{**TINY, "seed": 1, "widths": (16,)}), tmp_path / "seed1", progress=False)
    assert not torch.equal(_weights(other, 16, 6)["gpt_neox.embed_in.weight"],
                           _weights(reference_zoo, 16, 6)["gpt_neox.embed_in.weight"])


def test_stop_and_resume_reach_the_uninterrupted_weights(reference_zoo, tmp_path):
    root = tmp_path / "resumed"
    partial = train_zoo(ZooConfig(**TINY), root, stop_at=3, progress=False)
    assert partial.steps(16) == [0, 2] and (root / "w16" / "step3").is_dir() and not partial.is_trained(16)
    resumed = train_zoo(ZooConfig(**TINY), root, progress=False)
    assert not (root / "w16" / "step3").exists()  # the off-schedule stop checkpoint is superseded
    for width in (16, 32):
        _assert_same_weights(reference_zoo, resumed, width, 6)
        assert resumed.log(width)["losses"] == pytest.approx(reference_zoo.log(width)["losses"], abs=0)


def test_a_crash_mid_run_resumes_from_the_last_checkpoint(reference_zoo, tmp_path):
    root = tmp_path / "crashed"

    def crash(width, step, loss):
        if width == 32 and step == 5:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_zoo(ZooConfig(**TINY), root, progress=False, on_step=crash)
    seen = []
    resumed = train_zoo(ZooConfig(**TINY), root, progress=False, on_step=lambda w, s, x: seen.append((w, s)))
    assert seen == [(32, 5), (32, 6)]  # d=16 was done; d=32 restarts after its step-4 checkpoint
    _assert_same_weights(reference_zoo, resumed, 32, 6)
    assert resumed.log(32)["losses"] == reference_zoo.log(32)["losses"]


def test_another_family_in_the_same_folder_is_refused(reference_zoo):
    with pytest.raises(ValueError, match="holds another family"):
        train_zoo(ZooConfig(**{**TINY, "steps": 8}), reference_zoo.root, progress=False)
    with pytest.raises(FileNotFoundError, match="not a zoo family folder"):
        Zoo.open(reference_zoo.root / "w16")


def test_one_training_step_returns_the_loss_before_it_at_the_scheduled_rate(reference_zoo):
    """_train_step: the loss it returns is the batch's next-token cross-entropy before the update (a direct
    formula), the learning rate is the schedule's, only the matrices get weight decay, and the weights move."""
    from transformers import AutoTokenizer

    from geolens.zoo.train import _member_model, _optimizer, _resume_point, _train_step

    config = reference_zoo.config
    width = config.widths[0]
    start, state = _resume_point(reference_zoo, width)
    assert start == config.steps and state is not None  # a finished member resumes from its last step
    tokenizer = AutoTokenizer.from_pretrained(str(reference_zoo.checkpoint_dir(width, start)))
    model = _member_model(reference_zoo, width, tokenizer, start)
    optimizer = _optimizer(model, config, None)
    decayed = {id(p) for p in optimizer.param_groups[0]["params"]}
    assert all((p.ndim >= 2) == (id(p) in decayed) for p in model.parameters())
    batch = torch.randint(0, len(tokenizer), (3, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = model(batch[:, :-1]).logits
        expected = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
    before = [p.detach().clone() for p in model.parameters()]
    loss = _train_step(model, optimizer, batch, config, step=3)
    assert loss == pytest.approx(float(expected), rel=1e-5)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(config.lr_at(3))
    assert any(not torch.equal(a, p) for a, p in zip(before, model.parameters()))


def test_a_resume_file_without_its_checkpoint_starts_from_scratch(reference_zoo, tmp_path):
    from geolens.zoo.train import _RESUME_FILE, _resume_point

    zoo = Zoo(reference_zoo.config, tmp_path / "fresh")
    width = zoo.config.widths[0]
    zoo.member_dir(width).mkdir(parents=True)
    assert _resume_point(zoo, width) == (0, None)
    torch.save({"step": 4, "optimizer": {}}, zoo.member_dir(width) / _RESUME_FILE)  # step 4 is not on disk
    assert _resume_point(zoo, width) == (0, None)
    (zoo.checkpoint_dir(width, 4)).mkdir()
    (zoo.checkpoint_dir(width, 4) / "config.json").write_text("{}")  # now it is: resume from step 4
    start, state = _resume_point(zoo, width)
    assert start == 4 and state["step"] == 4
