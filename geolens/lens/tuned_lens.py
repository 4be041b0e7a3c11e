"""Tuned lens (Belrose et al. 2023): one affine translator per layer before the logit lens.

See docs/methods.md §C.3.

``T_l(h) = h + A_l h + b_l`` for layers ``l = 0..L-1`` (``0`` = embeddings);
the last layer ``L``'s translator is the identity (the model's own logits) and
has no parameters. ``A_l`` and ``b_l`` start at zero, so an untrained lens *is*
the logit lens; the residual parametrisation makes weight decay pull towards
the identity. Logits: the logit lens of ``T_l(h)``. Train with
:func:`geolens.lens.train_tuned_lens`.

Saved as a directory: ``config.json`` (model shape, name, training budget) and
``translators.safetensors``. :meth:`TunedLens.load` refuses a lens made for a
model of another shape. Lenses of the ``tuned-lens`` package (``config.json`` +
``params.pt``, same translator convention) are read by
:meth:`TunedLens.from_tuned_lens` and written by :meth:`TunedLens.save_tuned_lens`
(see :mod:`geolens.lens.tuned_lens_format`).

Example:
    >>> import tempfile
    >>> lens = TunedLens(model)
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     _ = lens.save(tmp)
    ...     loaded = TunedLens.load(tmp, model)
    >>> loaded.n_layers, len(loaded.translators), loaded.translators[0]
    (2, 2, Linear(in_features=64, out_features=64, bias=True))
"""

from __future__ import annotations

import json
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from jaxtyping import Float
from torch import Tensor, nn

from geolens._io import atomic_file, atomic_write_text, check_folder_target
from geolens._json import parse_json
from geolens._validation import DamagedFileError
from geolens.lens import tuned_lens_format as tl_format
from geolens.lens.logit_lens import LogitLens
from geolens.model import Model, as_adapter
from geolens.results import Result
from geolens.sites import RESIDUAL_SITE, check_layer

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["TunedLens", "LensHistory", "CONFIG_FILE", "WEIGHTS_FILE"]

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "translators.safetensors"
_FORMAT = "geolens.tuned_lens"
_FORMAT_VERSION = 1
_SHAPE_KEYS = ("n_layers", "d_model", "d_vocab")


def _shape(lens_or_model: Any) -> dict[str, Any]:
    return {key: getattr(lens_or_model, key) for key in _SHAPE_KEYS}


def check_lens_fits(lens: "TunedLens", adapter: Any) -> None:
    """Raise ``ValueError`` if ``lens`` was made for a model of another shape than ``adapter``'s (naming each size)."""
    tl_format.check_lens_shape(_shape(lens), _shape(as_adapter(adapter)), "the lens", lens.model_name)


class TunedLens(LogitLens):
    """Affine translators ``h -> h + A_l h + b_l`` for layers ``0..L-1``, then the logit lens.

    Attributes:
        translators: ``nn.ModuleList`` of ``L`` ``nn.Linear(d_model, d_model)``
            (float32, zero-initialised); ``translators[l]`` maps layer ``l``.
        training_info: budget and loss curve of the last training run (saved with the lens).
        halves: ``None``, or two lenses fitted on disjoint halves of the same text
            (``fit_tuned_lens(..., halves=True)``; saved with the lens, in ``half-0`` and ``half-1``).

    Example:
        >>> lens = TunedLens(model)
        >>> h = states.layer("resid_post", 1)                     # [N, d_model]
        >>> lens(h, layer=1).shape                                # [N, d_vocab]
        torch.Size([16, 200])
        >>> torch.equal(lens(h, layer=1), LogitLens(model)(h, layer=1))   # untrained: the logit lens
        True
    """

    kind = "tuned"

    def __init__(self, model: Model, *, bias: bool = True) -> None:
        super().__init__(model)
        self.bias = bool(bias)
        layers = []
        for _ in range(self.n_layers):
            translator = nn.Linear(self.d_model, self.d_model, bias=self.bias, dtype=torch.float32)
            nn.init.zeros_(translator.weight)
            if translator.bias is not None:
                nn.init.zeros_(translator.bias)
            layers.append(translator)
        self.translators = nn.ModuleList(layers).to(self.adapter.device)
        self.training_info: dict[str, Any] = {}
        self.halves: tuple[TunedLens, TunedLens] | None = None

    def transform(self, h: Float[Tensor, "... d"], layer: int) -> Float[Tensor, "... d"]:
        """``T_l(h) = h + A_l h + b_l`` (float32); the identity at the last layer ``L``."""
        layer = check_layer(RESIDUAL_SITE, layer, n_layers=self.n_layers)
        if layer == self.n_layers:
            return h
        h = h.to(torch.float32)
        return h + self.translators[layer](h)

    @property
    def history(self) -> "pd.DataFrame":
        """Train and held-out KL per layer over training (``step, seconds, split, layer, kl``); empty if not recorded.

        Recorded by :func:`geolens.lens.fit_tuned_lens`: ``held_out`` at step 0 (the closed form) and at every
        evaluation; ``train`` every step, the KL of the step's minibatch before its update, at the number of
        updates made before it (so step 0 is the closed form's). Lenses fitted by geolens 0.3.0 and earlier recorded
        ``train`` only at evaluations, as the mean over the steps since the last one (:class:`LensHistory`
        says which: ``params["train_per_step"]``).
        """
        import pandas as pd

        return pd.DataFrame(self.training_info.get("history", []), columns=["step", "seconds", "split", "layer", "kl"])

    def training_history(self) -> "LensHistory":
        """The training history of this lens and of its :attr:`halves` as one table (``part``: ``"lens"``,
        ``"half 0"``, ``"half 1"``), with ``.to_pandas()`` and ``.plot()``."""
        parts = [("lens", self)] + [(f"half {i}", half) for i, half in enumerate(self.halves or ())]
        rows = [{"part": part, **row} for part, member in parts for row in member.history.to_dict("records")]
        per_step = [_train_per_step(member.history) for _, member in parts]
        return LensHistory(rows=rows, params={
            "model": self.model_name, "parts": [part for part, _ in parts],
            "steps": {part: member.training_info.get("steps") for part, member in parts},
            "stopped": {part: member.training_info.get("stopped") for part, member in parts},
            "train_per_step": None if all(p is None for p in per_step) else all(p is not False for p in per_step)})

    def plot_history(self):
        """KL by refinement step of this lens and of each of its :attr:`halves` (the two fits behind the phases'
        stability): the training KL of every step and the held-out KL at each evaluation (plotly); see
        :meth:`training_history`."""
        return self.training_history().plot()

    def linear_map(self, layer: int) -> Float[Tensor, "d d"]:
        """The full linear part ``I + A_l`` of the translator of ``layer`` (detached; ``I`` at layer ``L``).

        Acts on column vectors: ``T_l(h) = (I + A_l) h + b_l``.
        """
        layer = check_layer(RESIDUAL_SITE, layer, n_layers=self.n_layers)
        eye = torch.eye(self.d_model, device=self.translators[0].weight.device)
        if layer == self.n_layers:
            return eye
        return eye + self.translators[layer].weight.detach()

    # ------------------------------------------------------------------ persistence
    def config(self) -> dict[str, Any]:
        return {
            "format": _FORMAT, "format_version": _FORMAT_VERSION, "model_name": self.model_name,
            "n_layers": self.n_layers, "d_model": self.d_model, "d_vocab": self.d_vocab, "bias": self.bias,
            "training": self.training_info,
        }

    def save(self, directory: str | Path) -> Path:
        """Write ``config.json`` and ``translators.safetensors`` into ``directory`` (created if needed),
        and the :attr:`halves`, if any, into its ``half-0`` and ``half-1`` folders.

        Only the lens's own files are written, each atomically (a temporary file renamed into
        place); anything else in ``directory`` is left alone. ``config.json`` is renamed last and
        records the weights' save id, so a save killed between the two renames is reported by
        :meth:`load` instead of loading a mix. Raises ``ValueError`` if ``directory`` is a file.
        """
        directory = check_folder_target(directory, "a tuned lens")
        self._write(directory)
        return directory

    def _write(self, folder: Path) -> str:
        from safetensors.torch import save_file

        check_folder_target(folder, "a tuned lens")
        folder.mkdir(parents=True, exist_ok=True)
        halves = [half._write(folder / f"half-{part}") for part, half in enumerate(self.halves or ())]
        save_id = uuid.uuid4().hex
        tensors = {name: value.detach().cpu().contiguous() for name, value in self.translators.state_dict().items()}
        with atomic_file(folder / WEIGHTS_FILE) as tmp:
            save_file(tensors, str(tmp), metadata={"save_id": save_id})
        config = {**self.config(), "save_id": save_id, "halves": halves}
        atomic_write_text(folder / CONFIG_FILE, json.dumps(config, indent=1))  # last: it commits the save
        return save_id

    @classmethod
    def load(cls, directory: str | Path, model: Model) -> "TunedLens":
        """Load a lens saved by :meth:`save` for ``model``.

        Raises ``ValueError`` if the lens was made for another model shape
        (``n_layers``, ``d_model`` or ``d_vocab``) or the files are not a geolens
        tuned lens, :class:`~geolens._validation.DamagedFileError` (a ``ValueError``)
        naming the file if a file is unreadable, a config field has the wrong type,
        a weight is NaN or infinite, or the two files come from different saves;
        warns if only the model name differs.
        """
        return cls._load(Path(directory), model, None)

    @classmethod
    def _load(cls, directory: Path, model: Model, save_id: str | None) -> "TunedLens":
        """:meth:`load`; ``save_id``: the id the parent lens recorded for this half (``None``: not checked)."""
        config_path, weights_path = directory / CONFIG_FILE, directory / WEIGHTS_FILE
        if not config_path.is_file() or not weights_path.is_file():
            raise FileNotFoundError(f"{directory} holds no tuned lens (need {CONFIG_FILE} and {WEIGHTS_FILE})")
        remedy = f"save the lens again, or delete {directory} (a cached lens is then trained again)"
        try:
            config = parse_json(config_path.read_text(), config_path)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise DamagedFileError(f"{config_path} is not valid JSON ({err}); the lens folder is damaged: "
                                   f"{remedy}") from None
        if not isinstance(config, dict) or config.get("format") != _FORMAT:
            found = config.get("format") if isinstance(config, dict) else type(config).__name__
            raise ValueError(f"{config_path} is not a geolens tuned lens (format {found!r})")
        _check_config(config, config_path, remedy)
        lens = cls(model, bias=config.get("bias", True))
        tl_format.check_lens_shape(config, _shape(lens), f"the tuned lens in {directory}", config.get("model_name"))
        if save_id is not None and config.get("save_id") != save_id:
            raise DamagedFileError(f"{config_path} is not the save its parent lens recorded (an interrupted save); "
                                   f"{remedy}")
        if config.get("model_name") != lens.model_name:
            warnings.warn(
                f"tuned lens trained for {config.get('model_name')!r}, loaded into {lens.model_name!r} "
                "(same shape, so it loads; the numbers may not mean much)", stacklevel=3,
            )
        state, metadata = _read_weights(weights_path, str(lens.adapter.device), remedy)
        expected = {name: tuple(value.shape) for name, value in lens.translators.state_dict().items()}
        found = {name: tuple(value.shape) for name, value in state.items()}
        if found != expected:
            wrong = sorted(set(found) ^ set(expected)) or [n for n in expected if found[n] != expected[n]]
            raise ValueError(f"{weights_path} does not fit {lens.model_name!r}: tensors {wrong[:4]} differ "
                             f"(the lens expects {len(expected)} tensors of shape {next(iter(expected.values()))})")
        # Both files name their save; weights written by other means carry no id and are taken as they are.
        if "save_id" in metadata and config.get("save_id") not in (None, metadata["save_id"]):
            raise DamagedFileError(f"{weights_path} and {config_path} come from different saves (a save was "
                                   f"interrupted between them); {remedy}")
        bad = sorted(name for name, value in state.items() if not bool(torch.isfinite(value).all()))
        if bad:
            raise DamagedFileError(f"{weights_path}: {bad[:4]} hold NaN or infinite values; {remedy}")
        lens.translators.load_state_dict(state)
        lens.training_info = dict(config.get("training") or {})
        halves = config.get("halves")
        if halves is None and (directory / "half-0").is_dir():  # saved before configs listed their halves
            halves = [None, None]
        if halves:
            lens.halves = tuple(cls._load(directory / f"half-{part}", model, half_id)
                                for part, half_id in enumerate(halves))
        return lens

    def check_finite(self, what: str = "the tuned lens") -> None:
        """Raise ``ValueError`` naming the layers whose translator holds NaN or infinite parameters.

        Example:
            >>> lens = TunedLens(model)
            >>> with torch.no_grad():
            ...     _ = lens.translators[1].bias.fill_(float("nan"))
            >>> lens.check_finite()
            Traceback (most recent call last):
            ...
            ValueError: the tuned lens has NaN or infinite parameters in the translator of layer(s) [1]; retrain it or load another lens
        """
        bad = [layer for layer, translator in enumerate(self.translators)
               if not all(bool(torch.isfinite(p).all()) for p in translator.parameters())]
        if bad:
            raise ValueError(f"{what} has NaN or infinite parameters in the translator of layer(s) {bad}; "
                             "retrain it or load another lens")

    # ------------------------------------------------------------------ tuned-lens package format
    @classmethod
    def from_tuned_lens(cls, directory: str | Path, model: Model) -> "TunedLens":
        """Load a lens saved by the ``tuned-lens`` package (``config.json`` + ``params.pt``) for ``model``.

        ``layer_translators[i]`` becomes ``translators[i]`` unchanged (both packages
        map ``h -> h + W h + b`` at layer ``i``, ``0`` = embeddings, no translator at
        the last layer); weights are cast to float32. Raises ``ValueError`` naming
        the file if its ``d_model`` or ``num_hidden_layers`` differ from the model's
        or ``params.pt`` does not match its config; warns if the config's
        ``unembed_hash`` is not the hash of this model's raw ``W_U`` (the lens was
        tuned against another unembedding).

        Example:
            >>> import tempfile
            >>> with tempfile.TemporaryDirectory() as tmp:
            ...     _ = TunedLens(model).save_tuned_lens(tmp)   # config.json + params.pt
            ...     lens = TunedLens.from_tuned_lens(tmp, model)
            >>> lens.training_info["source"], lens.n_layers
            ('tuned-lens', 2)
        """
        adapter = as_adapter(model)
        config, state = tl_format.read_tuned_lens_dir(directory, n_layers=adapter.n_layers, d_model=adapter.d_model)
        lens = cls(adapter, bias=config.get("bias", True))
        lens.translators.load_state_dict(state)
        expected_hash = config.get("unembed_hash")
        if expected_hash and expected_hash != tl_format.unembed_hash(lens.adapter.unembed_matrix("raw")):
            warnings.warn(
                f"the tuned lens in {directory} was tuned against another unembedding (unembed_hash differs "
                f"from {lens.model_name!r}'s W_U); it loads, but the numbers may not mean much", stacklevel=2,
            )
        lens.training_info = {
            "source": "tuned-lens", "path": str(directory),
            "base_model_name_or_path": config.get("base_model_name_or_path"),
            "base_model_revision": config.get("base_model_revision"),
        }
        return lens

    def save_tuned_lens(self, directory: str | Path) -> Path:
        """Write this lens in the ``tuned-lens`` package's format (``config.json`` + ``params.pt``, float32).

        ``tuned_lens.TunedLens.from_model_and_pretrained(hf_model, directory)`` reads
        it. ``unembed_hash`` is that of the model's raw ``W_U``, so tuned-lens's own
        check passes for the Hugging Face model behind it. A lens without bias is
        written with zero biases and ``"bias": true`` (the same map; tuned-lens 0.2.0
        cannot build bias-free translators). ``training_info`` is not written.
        """
        d = self.d_model
        weights = [t.weight for t in self.translators]
        biases = [t.bias if t.bias is not None else torch.zeros(d) for t in self.translators]
        return tl_format.write_tuned_lens_dir(
            directory, weights, biases, d_model=d, base_model_name_or_path=self.model_name,
            unembed_hash_value=tl_format.unembed_hash(self.adapter.unembed_matrix("raw")),
        )

    def extra_repr(self) -> str:
        trained = self.training_info.get("steps", 0)
        return (f"model={self.model_name!r}, n_layers={self.n_layers}, d_model={self.d_model}, "
                f"d_vocab={self.d_vocab}, trained_steps={trained}")


def _check_config(config: dict, path: Path, remedy: str) -> None:
    """Each field of a geolens lens ``config.json`` has its type, else ``DamagedFileError`` naming the field."""
    def bad(key: str, expected: str) -> DamagedFileError:
        got = repr(config[key]) if key in config else "nothing"
        return DamagedFileError(f"{path}: {key} must be {expected}, got {got}; the lens folder is damaged: {remedy}")

    for key in _SHAPE_KEYS:
        value = config.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise bad(key, "a positive int")
    checks = {"bias": (bool, "true or false"), "model_name": (str, "a str"), "training": (dict, "a JSON object"),
              "save_id": (str, "a str"), "halves": (list, "a list of 2 save ids")}
    for key, (kind, expected) in checks.items():
        if key in config and config[key] is not None and not isinstance(config[key], kind):
            raise bad(key, expected)
    halves = config.get("halves")
    if halves and (len(halves) != 2 or not all(isinstance(h, str) for h in halves)):
        raise bad("halves", "a list of 2 save ids")


def _read_weights(path: Path, device: str, remedy: str) -> tuple[dict[str, Tensor], dict[str, str]]:
    """The tensors and the metadata of a safetensors file, or ``DamagedFileError`` naming it."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt", device=device) as handle:
            metadata = handle.metadata() or {}
            return {name: handle.get_tensor(name) for name in handle.keys()}, metadata
    except Exception as err:  # safetensors raises its own error types for damaged files
        raise DamagedFileError(f"{path} is not a readable safetensors file ({err}); {remedy}") from None


def _train_per_step(history: "pd.DataFrame") -> bool | None:
    """Whether ``history`` records the training KL of every step (from step 0), not the mean since each
    evaluation (lenses fitted before per-step histories); ``None`` where it records no training KL.

    Example:
        >>> import pandas as pd
        >>> rows = lambda steps: pd.DataFrame({"split": ["train"] * len(steps), "step": steps})
        >>> _train_per_step(rows([0, 1, 2])), _train_per_step(rows([20, 40])), _train_per_step(rows([]))
        (True, False, None)
    """
    train = history[history["split"] == "train"]
    if train.empty:
        return None
    return bool(train["step"].min() == 0)


@dataclass(repr=False)
class LensHistory(Result):
    """The training history of a tuned lens and of the lenses fitted on each half of its text.

    One row per measurement: ``part`` (``"lens"``, ``"half 0"``, ``"half 1"``), ``step``, ``seconds``,
    ``split`` (``train``: the KL of each step's minibatch before its update, at the number of updates made
    before it, so step 0 is the closed form's; ``held_out``: at step 0 and every evaluation), ``layer``,
    ``kl`` (nats). ``params``: ``parts``, each part's ``steps`` and ``stopped``, ``train_per_step``.

    Example:
        >>> rows = [{"part": part, "step": step, "seconds": 0.0, "split": "train", "layer": layer, "kl": 1 / (1 + step)}
        ...         for part in ("lens", "half 0") for step in range(3) for layer in range(2)]
        >>> history = LensHistory(rows=rows, params={"model": "m", "train_per_step": True})
        >>> history.means().query("part == 'lens'").kl.round(2).tolist()
        [1.0, 0.5, 0.33]
        >>> sorted({trace.name for trace in history.plot().data if trace.showlegend is not False})
        ['half 0: training KL (every step)', 'lens: training KL (every step)']
    """

    title: ClassVar[str] = "LensHistory"

    def to_pandas(self) -> "pd.DataFrame":
        import pandas as pd

        return pd.DataFrame(self.rows, columns=["part", "step", "seconds", "split", "layer", "kl"])

    def means(self) -> "pd.DataFrame":
        """Mean KL over layers per ``part``, ``split`` and ``step`` (the lines of :meth:`plot`)."""
        table = self.to_pandas()
        return table.groupby(["part", "split", "step"], as_index=False, sort=True)["kl"].mean()

    def plot(self):
        """Mean KL over layers by step for the lens and each half: training KL every step (dotted), held-out KL at
        each evaluation (solid, markers); the lens's held-out KL of each layer thin."""
        from geolens import plotting

        return plotting.lens_history_figure(self.to_pandas(), title=self.params.get("model") or "",
                                            train_per_step=self.params.get("train_per_step"))
