"""Memory and time of one study cell at the shapes of the Pythia suite (random bf16 weights, CPU).

Each size runs in its own subprocess: a GPT-NeoX of that shape is built on the meta
device, given bf16 storage and initialised in place (no float32 weights, no hub, no
disk), booted as a TransformerBridge with :func:`geolens.model.boot_bridge`, and
measured by :func:`geolens.study.cells.compute_cell` on the cell the Pythia preset
(``examples/studies/pythia_suite.toml``) defines — N = 1,024 positions of its texts,
PGA with k = 100 and R = 100 (here at CCR 1 and 5), spectra of every layer — with the
model replaced by the random one. Per stage (build/boot, capture, metrics) it records
the wall time and the peak resident memory: the kernel's high-water mark (``VmHWM``),
reset between stages through ``/proc/self/clear_refs``; where that reset is not allowed,
the largest RSS seen by a sampling thread.

The bound checked per row: peak RSS <= 1.2 x the weights' bytes + 2 GiB.

Run:  python bench/scale.py                       # 160m, 410m, 1b, 2.8b, 6.9b
      python bench/scale.py --sizes 160m,410m,1b  # a subset
      python bench/scale.py --sizes 6.9b          # needs its bound free: 1.2 x 12.8 + 2 = 17.3 GiB
Writes bench/results/scale.csv and bench/results/scale_table.md (``--out`` to change).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

GIB = 1024**3
BOUND_FACTOR, BOUND_EXTRA = 1.2, 2 * GIB
PRESET = ROOT / "examples" / "studies" / "pythia_suite.toml"


@dataclass(frozen=True)
class Shape:
    """A GPT-NeoX shape (Pythia's published configuration numbers)."""

    name: str
    hidden: int
    layers: int
    heads: int
    intermediate: int
    vocab: int = 50304
    rotary_pct: float = 0.25
    max_positions: int = 2048

    def n_params(self) -> int:
        """Parameters of a GPT-NeoX of this shape (untied embedding and unembedding, biases, two LayerNorms a block)."""
        d, f, v = self.hidden, self.intermediate, self.vocab
        per_block = 4 * d * d + 2 * d * f + 9 * d + f  # qkv+dense, the MLP, their biases, LN1 and LN2
        return self.layers * per_block + 2 * d + 2 * v * d


SHAPES: dict[str, Shape] = {s.name: s for s in (
    Shape("70m", 512, 6, 8, 2048),
    Shape("160m", 768, 12, 12, 3072),
    Shape("410m", 1024, 24, 16, 4096),
    Shape("1b", 2048, 16, 8, 8192),
    Shape("1.4b", 2048, 24, 16, 8192),
    Shape("2.8b", 2560, 32, 32, 10240),
    Shape("6.9b", 4096, 32, 32, 16384, vocab=50432),   # its published config pads the vocabulary to 50432
)}
DEFAULT_SIZES = ("160m", "410m", "1b", "2.8b", "6.9b")


def neox_config(shape: Shape):
    from transformers import GPTNeoXConfig

    return GPTNeoXConfig(vocab_size=shape.vocab, hidden_size=shape.hidden, num_hidden_layers=shape.layers,
                         num_attention_heads=shape.heads, intermediate_size=shape.intermediate,
                         rotary_pct=shape.rotary_pct, max_position_embeddings=shape.max_positions,
                         use_parallel_residual=True, tie_word_embeddings=False, bos_token_id=0, eos_token_id=0,
                         pad_token_id=2)


def build_neox(shape: Shape | str, *, dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cpu",
               seed: int = 0, std: float = 0.02):
    """A ``GPTNeoXForCausalLM`` of ``shape`` with random weights, allocated once in ``dtype``.

    Built on the meta device (no storage), given ``dtype`` storage on ``device``
    (``to_empty``), then initialised in place: linear and embedding weights
    ``N(0, std)``, biases 0, LayerNorms 1 and 0, the rotary tables recomputed. So no
    float32 copy of the weights is ever made. ``device="meta"`` returns the
    storage-less model (for counting parameters).
    """
    from transformers import GPTNeoXForCausalLM

    shape = SHAPES[shape] if isinstance(shape, str) else shape
    config = neox_config(shape)
    with torch.device("meta"):
        model = GPTNeoXForCausalLM(config)
    model = model.to(dtype)
    if torch.device(device).type == "meta":
        return model
    model = model.to_empty(device=device)
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.fill_(1.0)
                module.bias.zero_()
            elif isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
                module.weight.normal_(0.0, std, generator=generator)
                if getattr(module, "bias", None) is not None:
                    module.bias.zero_()
        _reset_rotary(model, config, device)
    return model.eval()


def _reset_rotary(model, config, device) -> None:
    """Recompute the rotary buffers ``to_empty`` left uninitialised (they are derived, not learned)."""
    for name, module in list(model.named_modules()):
        if "rotary" in type(module).__name__.lower() and any(True for _ in module.buffers(recurse=False)):
            with torch.device(device):
                fresh = type(module)(config)
            for key, buffer in fresh.named_buffers(recurse=False):
                setattr(module, key, buffer)


def weight_bytes(model) -> int:
    """Bytes of the model's parameters (each tensor once)."""
    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    return total


def bound_bytes(weights: int) -> float:
    return BOUND_FACTOR * weights + BOUND_EXTRA


def make_tokenizer(texts, folder: Path):
    """A word-level tokenizer over ``texts`` saved in ``folder`` (offline; its ids fit any NeoX vocabulary)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(list(texts), trainers.WordLevelTrainer(special_tokens=["<|endoftext|>", "<unk>", "<pad>"]))
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>",
                            unk_token="<unk>", pad_token="<pad>").save_pretrained(str(folder))
    return AutoTokenizer.from_pretrained(str(folder))


# ---------------------------------------------------------------- peak memory per stage
def _status_kib(key: str) -> int | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def current_rss() -> int:
    kib = _status_kib("VmRSS")
    if kib is not None:
        return kib * 1024
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class PeakRSS:
    """Peak resident memory per stage: ``VmHWM`` reset by ``/proc/self/clear_refs``, else a sampling thread."""

    def __init__(self, interval: float = 0.02) -> None:
        self.interval = interval
        self._sampled = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        self.resettable = self._reset_hwm()
        self.method = "VmHWM (clear_refs)" if self.resettable else "sampled VmRSS"

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self._sampled = max(self._sampled, current_rss())

    @staticmethod
    def _reset_hwm() -> bool:
        try:
            with open("/proc/self/clear_refs", "w") as fh:
                fh.write("5")
            return _status_kib("VmHWM") is not None
        except OSError:
            return False

    def start(self) -> None:
        self._sampled = current_rss()
        if self.resettable:
            self._reset_hwm()

    def peak(self) -> int:
        sampled = max(self._sampled, current_rss())
        if self.resettable:
            return max(_status_kib("VmHWM") * 1024, sampled)
        return sampled

    def close(self) -> None:
        self._stop.set()


# ---------------------------------------------------------------- one size (child process)
def scale_study(loader, *, label: str = "model", ccr=(1, 5), n_tokens: int = 1024, k: int = 100, n_null: int = 100,
                n_texts: int | None = None, max_length: int | None = None):
    """The Pythia preset's study with one model (``loader``) and PGA at ``ccr`` (``None``: the preset's CCRs)."""
    from geolens.study import Study

    preset = Study.from_toml(PRESET)
    pga = {**preset.analyses["pga"], "k": k, "n_null": n_null}
    if ccr is not None:  # None: the preset's own CCRs
        pga["ccr"] = list(ccr)
    analyses = {"pga": pga,
                "spectrum": dict(preset.analyses.get("spectrum", {}))}
    texts = {"default": n_texts} if n_texts is not None else preset.texts
    return Study.from_toml(PRESET, models={label: loader}, metadata={}, analyses=analyses, texts=texts,
                           n_tokens=n_tokens, max_length=max_length or preset.max_length, resources={"num_cpus": 1})


def run_size(shape: Shape, *, ccr=(1, 5), n_tokens: int = 1024, k: int = 100, n_null: int = 100,
             n_texts: int | None = None, max_length: int | None = None, device: str = "cpu",
             dtype: torch.dtype = torch.bfloat16, share_qkv: bool = True) -> dict:
    """Build, boot and measure one size in this process: times, peak RSS per stage, the cell's rows checked."""
    import geolens.study.cells as cells
    from geolens.model import boot_bridge

    meter = PeakRSS()
    cuda = torch.device(device).type == "cuda"
    stages: dict[str, dict] = {}
    record: dict = {}
    tmp = tempfile.TemporaryDirectory(prefix="geolens-scale-")

    def begin() -> None:
        if cuda:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
        meter.start()
        record["start"] = time.perf_counter()

    def end(stage: str) -> None:
        if cuda:
            torch.cuda.synchronize(device)
        stages[stage] = {"seconds": time.perf_counter() - record["start"], "peak": meter.peak()}
        if cuda:
            stages[stage]["gpu_peak"] = torch.cuda.max_memory_allocated(device)

    def loader():
        begin()
        hf_model = build_neox(shape, dtype=dtype, device=device)
        record["weights"] = weight_bytes(hf_model)
        record["params"] = sum(p.numel() for p in hf_model.parameters())
        tokenizer = make_tokenizer(cell.texts, Path(tmp.name))
        bridge = boot_bridge(hf_model, tokenizer=tokenizer, share_qkv=share_qkv).eval()
        end("build")
        return bridge

    plain_capture = cells.capture

    def timed_capture(*args, **kwargs):
        begin()
        out = plain_capture(*args, **kwargs)
        end("capture")
        begin()
        return out

    study = scale_study(loader, label=f"pythia-{shape.name}-shape", ccr=ccr, n_tokens=n_tokens, k=k, n_null=n_null,
                        n_texts=n_texts, max_length=max_length)
    (cell,) = study.cells()
    ccr = list(cell.analyses["pga"]["ccr"])
    baseline = current_rss()
    cells.capture = timed_capture
    try:
        info = cells.compute_cell(cell)
    finally:
        cells.capture = plain_capture
    end("metrics")
    meter.close()
    tmp.cleanup()
    n_layers = info["n_layers"]
    failed = {name: o["error"] for name, o in info["analyses"].items() if not o["ok"]}
    if failed:
        raise RuntimeError(f"the scale cell's analyses failed: {failed}")
    rows = [row for outcome in info["analyses"].values() for row in outcome["rows"]]
    check = check_rows(rows, n_layers, ccr)
    peak = max(s["peak"] for s in stages.values())
    return {"size": shape.name, "hidden": shape.hidden, "layers": n_layers, "params": record["params"],
            "weights_bytes": record["weights"], "baseline_bytes": baseline, "peak_bytes": peak,
            "bound_bytes": bound_bytes(record["weights"]), "within_bound": peak <= bound_bytes(record["weights"]),
            "stages": stages, "rows": len(rows), "rows_ok": check, "n_tokens": n_tokens,
            "positions": info["analyses"]["pga"]["params"].get("n_tokens"), "k": k, "n_null": n_null,
            "ccr": list(ccr), "share_qkv": share_qkv, "memory_method": meter.method, "device": device, "dtype": str(dtype).replace("torch.", "")}


def check_rows(rows, n_layers: int, ccr) -> str:
    """``"ok"`` when every value is finite and PGA (each CCR) and spectra cover layers 0..n_layers; else why not."""
    bad = [r for r in rows if r["value"] is None or not math.isfinite(r["value"])]
    pga_z = [r for r in rows if r["metric"] == "pga.z"]
    problems = []
    if bad:
        problems.append(f"{len(bad)} non-finite values ({sorted({r['metric'] for r in bad})[:4]})")
    for c in ccr:
        layers = {r["layer"] for r in pga_z if r["ccr"] == c and r["site"] == "resid_post"}
        if layers != set(range(n_layers + 1)):
            problems.append(f"pga z at ccr {c} has layers {sorted(layers)[:3]}... ({len(layers)})")
    spec = {r["layer"] for r in rows if r["metric"] == "spectrum.effective_rank"}
    if spec != set(range(n_layers + 1)):
        problems.append(f"spectrum has {len(spec)} layers, expected {n_layers + 1}")
    return "ok" if not problems else "; ".join(problems)


# ---------------------------------------------------------------- driver
def run_in_subprocess(size: str, args, timeout: float | None = None) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as fh:
        out = fh.name
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", size, "--json", out,
           "--n-tokens", str(args.n_tokens), "--k", str(args.k), "--n-null", str(args.n_null),
           "--ccr", ",".join(str(c) for c in args.ccr)]
    if args.n_texts is not None:
        cmd += ["--n-texts", str(args.n_texts)]
    if args.no_share_qkv:
        cmd.append("--no-share-qkv")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    done = subprocess.run(cmd, env=env, timeout=timeout, capture_output=True, text=True)
    try:
        if done.returncode != 0:
            return {"size": size, "error": (done.stderr or done.stdout).strip().splitlines()[-1:] or ["?"]}
        return json.loads(Path(out).read_text())
    finally:
        Path(out).unlink(missing_ok=True)


COLUMNS = ("size", "params", "weights_gib", "build_s", "build_peak_gib", "capture_s", "capture_peak_gib", "metrics_s",
           "metrics_peak_gib", "peak_gib", "bound_gib", "peak_over_weights", "bound", "rows")


def flat_row(result: dict) -> dict:
    if "error" in result:
        return {"size": result["size"], "bound": "error", "rows": " ".join(result["error"])}
    g = lambda b: round(b / GIB, 2)  # noqa: E731
    st = result["stages"]
    return {"size": result["size"], "params": result["params"], "weights_gib": g(result["weights_bytes"]),
            "build_s": round(st["build"]["seconds"], 1), "build_peak_gib": g(st["build"]["peak"]),
            "capture_s": round(st["capture"]["seconds"], 1), "capture_peak_gib": g(st["capture"]["peak"]),
            "metrics_s": round(st["metrics"]["seconds"], 1), "metrics_peak_gib": g(st["metrics"]["peak"]),
            "peak_gib": g(result["peak_bytes"]), "bound_gib": g(result["bound_bytes"]),
            "peak_over_weights": round(result["peak_bytes"] / result["weights_bytes"], 2),
            "bound": "pass" if result["within_bound"] else "FAIL", "rows": result["rows_ok"]}


def markdown_table(rows: list[dict]) -> str:
    head = "| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS) + "\n"
    return head + "".join("| " + " | ".join(str(r.get(c, "")) for c in COLUMNS) + " |\n" for r in rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(DEFAULT_SIZES),
                        help=f"comma-separated, from {', '.join(SHAPES)} (default {','.join(DEFAULT_SIZES)})")
    parser.add_argument("--n-tokens", type=int, default=1024)
    parser.add_argument("--k", type=int, default=100)
    parser.add_argument("--n-null", type=int, default=100)
    parser.add_argument("--ccr", default="1,5", help="comma-separated CCRs (default 1,5)")
    parser.add_argument("--n-texts", type=int, default=None, help="texts read (default: the preset's)")
    parser.add_argument("--no-share-qkv", action="store_true",
                        help="boot with TransformerLens's separate q, k, v copies (boot_bridge(share_qkv=False))")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results"), help="folder of scale.csv and scale_table.md")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--json", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.ccr = [int(c) for c in str(args.ccr).split(",") if c.strip()]
    torch.set_num_threads(max(1, torch.get_num_threads()))
    if args.child:
        result = run_size(SHAPES[args.child], ccr=args.ccr, n_tokens=args.n_tokens, k=args.k, n_null=args.n_null,
                          n_texts=args.n_texts, share_qkv=not args.no_share_qkv)
        Path(args.json).write_text(json.dumps(result, default=float))
        return 0
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    unknown = [s for s in sizes if s not in SHAPES]
    if unknown:
        parser.error(f"--sizes: unknown {unknown}; choose from {list(SHAPES)}")
    print(f"geolens scale bench: torch {torch.__version__}, {os.cpu_count()} CPUs, bf16 GPT-NeoX at Pythia shapes; "
          f"N = {args.n_tokens}, k = {args.k}, R = {args.n_null}, CCR {args.ccr}; bound: peak RSS <= "
          f"{BOUND_FACTOR} x weights + {BOUND_EXTRA / GIB:.0f} GiB", flush=True)
    rows, results = [], []
    for size in sizes:
        result = run_in_subprocess(size, args)
        results.append(result)
        row = flat_row(result)
        rows.append(row)
        if "error" in result:
            print(f"  {size}: ERROR {row['rows']}", flush=True)
            continue
        print(f"  {size}: {row['params'] / 1e9:.2f} B params, weights {row['weights_gib']} GiB | build "
              f"{row['build_s']} s ({row['build_peak_gib']} GiB) | capture {row['capture_s']} s "
              f"({row['capture_peak_gib']} GiB) | metrics {row['metrics_s']} s ({row['metrics_peak_gib']} GiB) | "
              f"peak {row['peak_gib']} GiB <= bound {row['bound_gib']} GiB: {row['bound']} | rows {row['rows']} "
              f"[{result['memory_method']}]", flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "scale.csv", "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    (out / "scale_table.md").write_text(markdown_table(rows))
    print(markdown_table(rows))
    print(f"wrote {out / 'scale.csv'} and {out / 'scale_table.md'}")
    failed = [r["size"] for r in rows if r.get("bound") != "pass" or r.get("rows") != "ok"]
    print(f"SCALE: {'pass' if not failed else 'FAIL ' + ', '.join(failed)}")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
