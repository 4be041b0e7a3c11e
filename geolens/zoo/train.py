"""A family of small Pythia-architecture (GPT-NeoX) models that differ only in width, trained offline.

The papers' central claim is about width; the zoo makes it testable without the
hub. Every member of a family shares the depth, head size, tokenizer, data,
data order, optimiser and schedule; only ``d_model`` (and with it the number of
heads and the MLP width ``4 d``) changes. Each member is trained on the zoo's
training split of BBC News (:mod:`geolens.zoo.corpus`) and saved at several
steps as ordinary Hugging Face folders, which :func:`geolens.model.boot_bridge`
(or ``TransformerBridge.boot_transformers``) boots.

On disk (``root`` defaults to ``<geolens cache>/zoo/<family key>``)::

    family.json                 the config (without widths) that keys the family
    tokenizer/                  byte-level BPE trained on the training split
    w64/step0/ ... w64/step400/ checkpoints: config.json, model.safetensors, tokenizer
    w64/resume.pt               optimiser state at the newest checkpoint (to resume)
    w64/log.json                training loss per step, held-out loss per checkpoint

Training is deterministic for a seed (same machine, same thread count), and
resumable: an interrupted member restarts from its newest checkpoint and ends
with the weights an uninterrupted run would have. The batch of step ``s`` is a
pure function of ``(seed, s)``, so no data-loader state needs saving.

Example:
    >>> zoo = train_zoo(ZooConfig(widths=(64, 128), steps=200))   # minutes on a CPU  # doctest: +SKIP

    Below, ``zoo`` is a tiny trained family (one width, one layer, four steps; as in
    :func:`~geolens.zoo.train.train_zoo`'s example):

    >>> zoo.to_pandas()[["width", "step", "tokens"]].values.tolist()
    [[16, 0, 0], [16, 4, 64]]
    >>> model = zoo.load(16)            # final step, as a TransformerBridge
    >>> model.cfg.model_name, model.cfg.d_model, model.cfg.n_layers
    ('zoo d=16 step 4', 16, 1)
"""

from __future__ import annotations

import hashlib
import json
import math
import pickle
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import pandas as pd
import torch
from tqdm.auto import tqdm

from geolens._cache import cache_root
from geolens._io import atomic_file, atomic_folder, atomic_write_text
from geolens._rng import rng, seeded_torch
from geolens._validation import DamagedFileError, check_float, check_int
from geolens.data.models import refused_weights_named, transformers_progress
from geolens.model import boot_bridge
from geolens.zoo.corpus import EOS, PAD, token_windows, train_tokenizer, zoo_split

__all__ = ["FAMILY_FILE", "Zoo", "ZooConfig", "default_checkpoints", "train_zoo", "zoo_root"]

_TOKENIZER_DIR = "tokenizer"
_RESUME_FILE = "resume.pt"
_LOG_FILE = "log.json"
FAMILY_FILE = "family.json"
_EVAL_WINDOWS = 64  # held-out windows scored at each checkpoint


def default_checkpoints(steps: int) -> tuple[int, ...]:
    """Step 0, the powers of two from 16 below ``steps``, and ``steps`` (a log-spaced schedule, as Pythia's).

    Example:
        >>> default_checkpoints(300)
        (0, 16, 32, 64, 128, 256, 300)
    """
    powers = [2**i for i in range(4, max(4, int(math.log2(max(steps, 1)))) + 1) if 2**i < steps]
    return tuple(sorted({0, *powers, steps}))


@dataclass(frozen=True)
class ZooConfig:
    """Everything that defines a zoo family (and its members' widths).

    Attributes:
        widths: ``d_model`` of each member.
        n_layers: transformer blocks (same for every member).
        d_head: head size; a member has ``max(1, width // d_head)`` heads.
        vocab_size: BPE vocabulary trained on the corpus.
        seq_len: tokens per training window.
        batch_size: windows per step (``batch_size * seq_len`` tokens a step).
        steps: optimiser steps (AdamW, betas 0.9/0.95).
        lr: peak learning rate, reached after ``warmup`` of the steps, then
            cosine decay to 10 % of it.
        warmup: fraction of the steps spent warming up linearly.
        weight_decay: AdamW decoupled weight decay.
        clip_grad: gradient-norm clip.
        checkpoints: steps saved; default :func:`default_checkpoints`.
        seed: initialisation and data order.
    """

    widths: tuple[int, ...] = (64, 128, 256, 512)
    n_layers: int = 6
    d_head: int = 32
    vocab_size: int = 4096
    seq_len: int = 128
    batch_size: int = 8
    steps: int = 400
    lr: float = 1e-3
    warmup: float = 0.05
    weight_decay: float = 0.01
    clip_grad: float = 1.0
    checkpoints: tuple[int, ...] | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        widths = tuple(self.widths) if not isinstance(self.widths, int) else (self.widths,)
        if not widths:
            raise ValueError("widths is empty: give at least one d_model")
        for width in widths:
            check_int(width, "each width", low=8)
        if len(set(widths)) != len(widths):
            raise ValueError(f"widths repeat: {list(widths)}")
        object.__setattr__(self, "widths", tuple(sorted(int(w) for w in widths)))
        for name, low in (("n_layers", 1), ("d_head", 2), ("vocab_size", 260), ("seq_len", 4), ("batch_size", 1),
                          ("steps", 1), ("seed", 0)):
            check_int(getattr(self, name), name, low=low)
        for width in self.widths:
            # Rotary embeddings cover a quarter of each head (Pythia's rotary_pct): at least 2 dims.
            if (width >= self.d_head and width % self.d_head) or width // self.n_heads(width) < 8:
                raise ValueError(f"width {width} with d_head {self.d_head} gives heads of size {width / self.n_heads(width):g}; "
                                 "a width must be a multiple of d_head (or below it) with heads of at least 8")
        for name in ("lr", "weight_decay", "clip_grad"):
            check_float(getattr(self, name), name, low=0, low_open=name == "lr")
        if not 0 <= self.warmup < 1:
            raise ValueError(f"warmup must be a fraction in [0, 1), got {self.warmup!r}")
        schedule = default_checkpoints(self.steps) if self.checkpoints is None else tuple(sorted(set(self.checkpoints)))
        if not schedule or schedule[0] < 0 or schedule[-1] > self.steps:
            raise ValueError(f"checkpoints must lie in [0, steps={self.steps}], got {list(schedule)}")
        if schedule[-1] != self.steps:
            schedule = (*schedule, self.steps)  # the trained model is always kept
        object.__setattr__(self, "checkpoints", schedule)

    def n_heads(self, width: int) -> int:
        return max(1, width // self.d_head)

    def family(self) -> dict[str, Any]:
        """The config without ``widths``: members with the same family share everything else."""
        out = asdict(self)
        out.pop("widths")
        out["checkpoints"] = list(self.checkpoints)
        return out

    def family_key(self) -> str:
        """A folder name for the family: readable sizes plus a hash of every setting."""
        digest = hashlib.sha256(json.dumps(self.family(), sort_keys=True).encode()).hexdigest()[:8]
        return f"neox-L{self.n_layers}-V{self.vocab_size}-T{self.steps}-s{self.seed}-{digest}"

    def lr_at(self, step: int) -> float:
        """Learning rate of optimiser step ``step`` (1-based): linear warm-up, then cosine to 10 %."""
        warm = max(1, round(self.warmup * self.steps)) if self.warmup > 0 else 0
        if step <= warm:
            return self.lr * step / warm
        progress = (step - warm) / max(1, self.steps - warm)
        return self.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def _model_config(config: ZooConfig, width: int, tokenizer: Any):
    from transformers import GPTNeoXConfig

    eos, pad = tokenizer.convert_tokens_to_ids(EOS), tokenizer.convert_tokens_to_ids(PAD)
    return GPTNeoXConfig(
        vocab_size=len(tokenizer), hidden_size=width, num_hidden_layers=config.n_layers,
        num_attention_heads=config.n_heads(width), intermediate_size=4 * width,
        max_position_embeddings=max(2048, config.seq_len), rotary_pct=0.25, rotary_emb_base=10000,
        use_parallel_residual=True, tie_word_embeddings=False, hidden_dropout=0.0, attention_dropout=0.0,
        bos_token_id=eos, eos_token_id=eos, pad_token_id=pad,
    )


def _new_model(config: ZooConfig, width: int, tokenizer: Any):
    from transformers import GPTNeoXForCausalLM

    with seeded_torch(config.seed, "zoo initialisation"):
        model = GPTNeoXForCausalLM(_model_config(config, width, tokenizer))
    return model.float()


def _batch_indices(step: int, batch_size: int, n_windows: int, seed: int, cache: dict[int, torch.Tensor]):
    """Window indices of 1-based ``step``: epochs of seeded permutations, so a pure function of (seed, step)."""
    start = (step - 1) * batch_size
    out = []
    for g in range(start, start + batch_size):
        epoch, position = divmod(g, n_windows)
        if epoch not in cache:
            cache.clear()  # only the current epoch (and the next, across a boundary) is needed
            cache[epoch] = torch.randperm(n_windows, generator=rng(seed, "zoo batches", part=epoch))
        out.append(cache[epoch][position])
    return torch.stack(out)


@torch.no_grad()
def _eval_loss(model, windows: torch.Tensor, batch_size: int) -> float:
    model.eval()
    total, count = 0.0, 0
    for chunk in windows.split(batch_size):
        logits = model(chunk[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), chunk[:, 1:].flatten(), reduction="sum")
        total, count = total + float(loss), count + chunk[:, 1:].numel()
    model.train()
    return total / count


def _write_json(path: Path, payload: Any) -> None:
    atomic_write_text(path, json.dumps(payload, indent=1))


def _save_checkpoint(model, tokenizer, folder: Path) -> None:
    """Write an HF folder atomically (:func:`geolens._io.atomic_folder`): a folder that exists is whole."""
    with atomic_folder(folder) as staging:
        model.save_pretrained(str(staging))
        tokenizer.save_pretrained(str(staging))


@dataclass
class Zoo:
    """A trained (or partly trained) family on disk: its config, folder and members' checkpoints.

    Example:
        >>> family = Zoo.open(zoo.root)   # e.g. "~/.cache/geolens/zoo/neox-L6-V4096-T400-s0-1a2b3c4d"
        >>> family.config == zoo.config, family.steps(16)
        (True, [0, 4])
        >>> family.load(16, step=0).cfg.model_name
        'zoo d=16 step 0'
    """

    config: ZooConfig
    root: Path
    train_time_s: dict[int, float] = field(default_factory=dict)

    @classmethod
    def open(cls, root: str | Path, widths: Sequence[int] | None = None) -> "Zoo":
        """The family at ``root`` (its ``family.json``), with ``widths`` (default: every member on disk)."""
        root = Path(root).expanduser()
        if not (root / FAMILY_FILE).is_file():
            raise FileNotFoundError(f"{root} is not a zoo family folder (no {FAMILY_FILE}); "
                                    "train one with `geolens zoo train`")
        family = json.loads((root / FAMILY_FILE).read_text())
        found = sorted(int(p.name[1:]) for p in root.glob("w*") if p.name[1:].isdigit())
        widths = found if widths is None else widths
        if not widths:
            raise FileNotFoundError(f"{root} has no trained members yet")
        family["checkpoints"] = tuple(family["checkpoints"])
        return cls(ZooConfig(widths=tuple(widths), **family), root)

    def member_dir(self, width: int) -> Path:
        return self.root / f"w{width}"

    def checkpoint_dir(self, width: int, step: int) -> Path:
        return self.member_dir(width) / f"step{step}"

    def steps(self, width: int) -> list[int]:
        """Checkpoint steps of ``width`` saved so far."""
        return [s for s in self.config.checkpoints if (self.checkpoint_dir(width, s) / "config.json").is_file()]

    def log(self, width: int) -> dict[str, Any]:
        path = self.member_dir(width) / _LOG_FILE
        return json.loads(path.read_text()) if path.is_file() else {"losses": [], "checkpoints": []}

    def is_trained(self, width: int) -> bool:
        return self.config.steps in self.steps(width)

    def load(self, width: int, step: int | None = None, *, device: str | torch.device | None = None,
             progress: bool = False):
        """Member ``width`` at checkpoint ``step`` (default: the last) as a ``TransformerBridge``."""
        if width not in self.config.widths:
            raise ValueError(f"width {width} is not in this zoo; widths are {list(self.config.widths)}")
        step = self.config.steps if step is None else step
        if step not in self.steps(width):
            raise FileNotFoundError(f"no checkpoint at step {step} for width {width} in {self.root} "
                                    f"(saved: {self.steps(width)}); train it with `geolens zoo train`")
        with transformers_progress(progress), refused_weights_named(self.checkpoint_dir(width, step)):
            model = boot_bridge(str(self.checkpoint_dir(width, step)), device=device)
        model.cfg.model_name = f"zoo d={width} step {step}"
        return model.eval()

    def to_pandas(self) -> pd.DataFrame:
        """One row per saved checkpoint: ``width, step, tokens, eval_loss, train_loss, path``."""
        rows = []
        for width in self.config.widths:
            logged = {c["step"]: c for c in self.log(width)["checkpoints"]}
            for step in self.steps(width):
                entry = logged.get(step, {})
                rows.append({"width": width, "step": step,
                             "tokens": step * self.config.batch_size * self.config.seq_len,
                             "eval_loss": entry.get("eval_loss"), "train_loss": entry.get("train_loss"),
                             "path": str(self.checkpoint_dir(width, step))})
        return pd.DataFrame(rows)

    def __repr__(self) -> str:
        done = {w: (self.steps(w)[-1] if self.steps(w) else None) for w in self.config.widths}
        return f"Zoo({self.root}, widths={list(self.config.widths)}, steps={self.config.steps}, trained up to {done})"


def zoo_root(config: ZooConfig, root: str | Path | None = None) -> Path:
    """``root``, else ``<geolens cache>/zoo/<family key>``."""

    return Path(root).expanduser() if root is not None else cache_root() / "zoo" / config.family_key()


def _family_tokenizer(config: ZooConfig, root: Path, train_texts: list[str]):
    from transformers import AutoTokenizer

    folder = root / _TOKENIZER_DIR
    if not (folder / "tokenizer.json").is_file():
        with atomic_folder(folder) as staging:
            train_tokenizer(train_texts, config.vocab_size, staging)
    return AutoTokenizer.from_pretrained(str(folder))


def train_zoo(
    config: ZooConfig | None = None,
    root: str | Path | None = None,
    *,
    stop_at: int | None = None,
    progress: bool = True,
    on_step: Callable[[int, int, float], None] | None = None,
) -> Zoo:
    """Train (or resume, or just open) every member of the family ``config`` describes.

    Members already trained are skipped; a partly trained member resumes from
    its newest checkpoint. The default family (widths 64-512, 6 layers, 400
    steps of 8 x 128 tokens: 0.4 M tokens, a third of an epoch of the training
    split) spends most of its training time on the d = 512 member (run times: docs/benchmarks.md).

    Args:
        config: the family; default :class:`ZooConfig`.
        root: folder of the family; default ``<geolens cache>/zoo/<family key>``.
        stop_at: train every member only up to this step (saved as a checkpoint;
            a later call resumes from it).
        progress: a tqdm bar per member with the running loss.
        on_step: called as ``on_step(width, step, loss)`` after each step (for
            logging; an exception it raises stops training, as an interruption would).

    Returns:
        :class:`Zoo` (``.to_pandas()`` lists the checkpoints, ``.load(width, step)`` boots one).

    Example:
        >>> import tempfile
        >>> config = ZooConfig(widths=(16,), n_layers=1, d_head=8, vocab_size=260, seq_len=8, batch_size=2, steps=4)
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     zoo = train_zoo(config, tmp, progress=False)
        ...     table = zoo.to_pandas()
        >>> table[["width", "step", "tokens"]].values.tolist()   # checkpoints at step 0 and the last step
        [[16, 0, 0], [16, 4, 64]]
        >>> table.eval_loss.round(2).tolist()                     # held-out loss (nats)
        [5.56, 5.54]
    """
    config = config or ZooConfig()
    if stop_at is not None:
        stop_at = check_int(stop_at, "stop_at", low=0, high=config.steps)
    root = zoo_root(config, root)
    root.mkdir(parents=True, exist_ok=True)
    family_file = root / FAMILY_FILE
    if family_file.is_file():
        on_disk = json.loads(family_file.read_text())
        if on_disk != json.loads(json.dumps(config.family())):
            raise ValueError(f"{root} holds another family ({on_disk}); choose another root")
    else:
        _write_json(family_file, config.family())

    train_texts, held_out = zoo_split()
    tokenizer = _family_tokenizer(config, root, train_texts)
    windows = token_windows(tokenizer, train_texts, config.seq_len)
    eval_windows = token_windows(tokenizer, held_out, config.seq_len)[:_EVAL_WINDOWS]
    zoo = Zoo(config, root)

    for width in config.widths:
        started = time.perf_counter()
        with transformers_progress(False):  # no bar per saved shard
            _train_member(zoo, width, tokenizer, windows, eval_windows, stop_at, progress, on_step)
        zoo.train_time_s[width] = round(time.perf_counter() - started, 1)
    return zoo


def _train_member(zoo: Zoo, width: int, tokenizer, windows, eval_windows, stop_at, progress, on_step) -> None:
    config = zoo.config
    target = config.steps if stop_at is None else stop_at
    zoo.member_dir(width).mkdir(exist_ok=True)
    log = zoo.log(width)
    start, state = _resume_point(zoo, width)
    if start >= target:
        return
    model = _member_model(zoo, width, tokenizer, start)
    # Steps after the resumed one are recomputed, so their logged losses are dropped.
    log["losses"] = log["losses"][:start]
    log["checkpoints"] = [c for c in log["checkpoints"] if c["step"] <= start]
    model.train()
    optimizer = _optimizer(model, config, state if start > 0 else None)
    if start == 0 and 0 in config.checkpoints:
        _checkpoint(zoo, width, 0, model, tokenizer, optimizer, eval_windows, log)

    perms: dict[int, torch.Tensor] = {}
    bar = tqdm(range(start + 1, target + 1), desc=f"zoo d={width}", disable=not progress, leave=False)
    for step in bar:
        batch = windows[_batch_indices(step, config.batch_size, len(windows), config.seed, perms)]
        value = _train_step(model, optimizer, batch, config, step)
        if not math.isfinite(value):
            raise FloatingPointError(f"zoo d={width}: loss is {value} at step {step}; lower lr (now {config.lr})")
        log["losses"].append(value)
        bar.set_postfix(loss=f"{value:.3f}")
        if on_step is not None:
            on_step(width, step, value)
        if step in config.checkpoints or step == target:
            _checkpoint(zoo, width, step, model, tokenizer, optimizer, eval_windows, log)
    bar.close()


def _resume_point(zoo: Zoo, width: int) -> tuple[int, dict | None]:
    """The step a member resumes from (0: from scratch) and its saved optimiser state: a resume file counts
    only when the checkpoint it names is whole on disk."""
    resume_path = zoo.member_dir(width) / _RESUME_FILE
    state = _read_resume_file(resume_path) if resume_path.is_file() else None
    resumable = state is not None and (zoo.checkpoint_dir(width, state["step"]) / "config.json").is_file()
    return (state["step"], state) if resumable else (0, None)


def _read_resume_file(path: Path) -> dict[str, Any]:
    """A member's ``resume.pt`` (loaded with ``weights_only=True``: no code in it runs); one that does not
    load, or holds no ``step``, raises :class:`~geolens._validation.DamagedFileError` naming it."""
    remedy = "delete it to train this member again from step 0"
    try:
        state = torch.load(path, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as err:  # torch's errors name no file
        first_line = (str(err).strip().splitlines() or [""])[0]
        raise DamagedFileError(f"{path} is not a resume file torch can load safely ({type(err).__name__}: "
                               f"{first_line}); {remedy}") from None
    if not isinstance(state, dict) or not isinstance(state.get("step"), int) or isinstance(state["step"], bool):
        raise DamagedFileError(f"{path} holds no whole-number 'step': not a geolens resume file; {remedy}")
    return state


def _member_model(zoo: Zoo, width: int, tokenizer, start: int):
    """The member's model at step ``start``: its saved checkpoint, or a new one at step 0."""
    if start == 0:
        return _new_model(zoo.config, width, tokenizer)
    from transformers import GPTNeoXForCausalLM

    with refused_weights_named(zoo.checkpoint_dir(width, start)):
        return GPTNeoXForCausalLM.from_pretrained(str(zoo.checkpoint_dir(width, start)), dtype=torch.float32)


def _optimizer(model, config: ZooConfig, state: dict | None) -> torch.optim.AdamW:
    """AdamW with weight decay on the matrices only (not on biases and norm weights); ``state`` resumes it."""
    decay = [p for _, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for _, p in model.named_parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": config.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=config.lr, betas=(0.9, 0.95))
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
    return optimizer


def _train_step(model, optimizer: torch.optim.Optimizer, batch: torch.Tensor, config: ZooConfig, step: int) -> float:
    """One step of next-token cross-entropy on ``batch`` (``[B, T + 1]`` token ids) at the schedule's learning
    rate, with the gradient clipped to ``config.clip_grad`` (0: not clipped); the loss before the step."""
    for group in optimizer.param_groups:
        group["lr"] = config.lr_at(step)
    logits = model(batch[:, :-1]).logits
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if config.clip_grad > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), config.clip_grad)
    optimizer.step()
    return float(loss.detach())


def _checkpoint(zoo: Zoo, width: int, step: int, model, tokenizer, optimizer, eval_windows, log) -> None:
    """Save weights, then the optimiser state that resumes from them, then the log (in that order)."""
    member = zoo.member_dir(width)
    _save_checkpoint(model, tokenizer, zoo.checkpoint_dir(width, step))
    for stale in member.glob("step*"):  # a stop_at checkpoint off the schedule, now superseded
        earlier = stale.name[4:].isdigit() and int(stale.name[4:]) < step
        if earlier and int(stale.name[4:]) not in zoo.config.checkpoints:
            shutil.rmtree(stale, ignore_errors=True)
    with atomic_file(member / _RESUME_FILE) as tmp:
        torch.save({"step": step, "optimizer": optimizer.state_dict()}, tmp)
    recent = log["losses"][-10:]
    log["checkpoints"] = [c for c in log["checkpoints"] if c["step"] != step] + [{
        "step": step, "eval_loss": _eval_loss(model, eval_windows, zoo.config.batch_size),
        "train_loss": sum(recent) / len(recent) if recent else None,
    }]
    _write_json(member / _LOG_FILE, log)
