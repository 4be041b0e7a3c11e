"""Benchmark: ``geolens.spectrum`` on every layer of the default model, against one plain forward pass.

Setting: the default model (SmolLM2-135M bridge, 30 blocks -> 31 residual
layers, d = 576), the default BBC texts truncated to ``--max-length`` tokens,
``n_tokens = 1024``. Prints, all measured in the same run on the same tokens:
  - the capture-free forward ``model(tokens, attention_mask=mask)`` (best of ``--repeat``);
  - ``geolens.spectrum`` end to end (capture + one SVD per layer + metrics);
  - its two parts: ``geolens.capture`` alone and the metrics on the captured states;
  - the floor of the metrics: one reduced SVD of each layer's centred states;
  - the ratios to the forward pass;
  - ``geolens.weight_geometry`` (W_U raw / folded, W_E: three [49152, 576] matrices).

Run:  python bench/spectrum.py [--n-texts 16] [--max-length 128] [--repeat 2] [--device cpu] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import geolens  # noqa: E402
from geolens.analyses.spectrum import spectrum, weight_geometry  # noqa: E402
from geolens.capture import capture, prepare_tokens  # noqa: E402
from geolens.model import as_adapter  # noqa: E402


def _sync(device) -> None:
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def best_of(fn, repeat: int, device) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        _sync(device)
        t = time.perf_counter()
        out = fn()
        _sync(device)
        best = min(best, time.perf_counter() - t)
    return best, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-texts", type=int, default=16)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--n-tokens", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--device", default=None)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    model = geolens.load_default_model()
    if args.device:
        model = model.to(args.device)
    adapter = as_adapter(model)
    device = adapter.device
    batch = prepare_tokens(adapter, geolens.default_texts(n=args.n_texts), max_length=args.max_length)
    ids, mask = batch.tokens.to(device), batch.attention_mask.to(device)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, device {device}")
    print(f"{adapter.name}: {adapter.n_layers} blocks, d = {adapter.d_model}; tokens {tuple(ids.shape)}, "
          f"{int(mask.sum())} real, n_tokens = {args.n_tokens}")

    with torch.no_grad():
        model(ids[:1, :8])  # warm-up (bridges wire hooks lazily)
    kw = dict(attention_mask=mask, n_tokens=args.n_tokens, progress=False)

    def forward():
        with torch.no_grad():
            return model(ids, attention_mask=mask)

    t_fwd, _ = best_of(forward, args.repeat, device)
    t_spec, res = best_of(lambda: spectrum(model, ids, **kw), args.repeat, device)
    t_cap, states = best_of(lambda: capture(model, ids, **kw), args.repeat, device)
    t_met, _ = best_of(lambda: spectrum(model, states, site="resid_post", progress=False), args.repeat, device)
    layer_states = [states.layer("resid_post", l) for l in states.layers["resid_post"]]
    t_svd, _ = best_of(lambda: [torch.linalg.svd(h - h.mean(0), full_matrices=False) for h in layer_states],
                       args.repeat, device)
    t_w, weights = best_of(lambda: weight_geometry(model, progress=False), 1, device)

    n_layers = len(res.rows)
    print(f"  forward model(tokens)      {t_fwd:8.2f} s   (1.00x)")
    print(f"  geolens.spectrum           {t_spec:8.2f} s   ({t_spec / t_fwd:.2f}x the forward)  {n_layers} layers")
    print(f"    capture only             {t_cap:8.2f} s   ({t_cap / t_fwd:.2f}x)")
    per_layer = 1000 * t_met / n_layers
    shape = (weights.rows[0]["rows"], weights.rows[0]["cols"])
    print(f"    metrics on states        {t_met:8.2f} s   ({t_met / t_fwd:.2f}x, {per_layer:.0f} ms/layer)")
    print(f"    floor: one SVD per layer {t_svd:8.2f} s   ({t_svd / t_fwd:.2f}x; metrics = {t_met / t_svd:.2f}x the SVDs)")
    print(f"  geolens.weight_geometry    {t_w:8.2f} s   ({t_w / t_fwd:.2f}x the forward)  3 x {shape}")
    table = res.to_pandas()
    cols = ["layer", "effective_rank", "rankme", "alpha_req", "alpha_req_r2", "log_isotropy", "mean_cosine",
            "condition_number"]
    print(table[cols].iloc[[0, 1, n_layers // 2, n_layers - 2, n_layers - 1]].to_string(index=False))
    print(weights.to_pandas()[["matrix", "effective_rank", "rankme", "alpha_req", "log_isotropy", "mean_cosine",
                               "condition_number"]].to_string(index=False))


if __name__ == "__main__":
    main()
