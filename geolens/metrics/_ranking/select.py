"""Which backend ranks a call's rows, chosen once per call: :func:`select_backend`.

The engine's modules, top down (each imports only the ones below it; checked by import-linter,
pyproject.toml):

- ``select``: :func:`select_backend`;
- ``cpu`` | ``torch_kernel``: the two backends, with the same methods (``exact_chunks``,
  ``sampled_ranks``, ``pair_values``);
- ``products``: the negated cosines they rank (BLAS ``syrk`` triangles, sampled pairs: a compiled
  loop on the host, a CSR product elsewhere);
- ``ranks`` | ``pairs``: the full space's ranks (:class:`~geolens.metrics._ranking.ranks.FullRanks`),
  the pair samples in tile order;
- ``pool``: the worker threads and their buffers;
- ``compiled``: the numba loops.
"""

from __future__ import annotations

import torch

from geolens.metrics._ranking.cpu import CpuBackend
from geolens.metrics._ranking.products import on_host
from geolens.metrics._ranking.torch_kernel import TorchBackend

__all__ = ["BACKENDS", "Backend", "CpuBackend", "TorchBackend", "select_backend"]

BACKENDS = ("auto", "cpu", "torch")
Backend = CpuBackend | TorchBackend


def select_backend(
    backend: str | Backend = "auto",
    *,
    device: torch.device | str,
    dtype: torch.dtype,
    n_values: int,
    n_blocks: int | None = None,
) -> Backend:
    """The backend that ranks rows of ``n_values`` values of ``dtype`` on ``device`` (sampled pairs:
    split into ``n_blocks`` jackknife blocks; ``None``: all pairs).

    ``backend``: ``"auto"`` (the CPU backend, the compiled kernels, wherever it can rank the rows:
    float32 on the CPU; else the torch backend), ``"cpu"`` (raises ``ValueError`` where it cannot),
    ``"torch"`` (any device and dtype), or a backend object, returned as given (a ``"cpu"`` one checked).

    Example:
        >>> select_backend(device="cpu", dtype=torch.float32, n_values=1000).name
        'cpu'
        >>> select_backend(device="cpu", dtype=torch.float64, n_values=1000)
        TorchBackend(host=True, dense_ties=False)
        >>> select_backend("torch", device="cuda", dtype=torch.float32, n_values=1000)
        TorchBackend(host=False, dense_ties=True)
    """
    device = torch.device(device)
    if isinstance(backend, TorchBackend):
        return backend
    if not isinstance(backend, (str, CpuBackend)):
        raise TypeError(f"backend must be one of {', '.join(map(repr, BACKENDS))} (or a backend object), "
                        f"got {type(backend).__name__}")
    if isinstance(backend, str) and backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, got {backend!r}")
    if backend != "torch":
        unfit = CpuBackend.unfit(device, dtype, n_values, n_blocks)
        if unfit is None:
            return CpuBackend()
        if backend != "auto":
            raise ValueError(f"backend='cpu' cannot rank {unfit}; use backend='auto' or 'torch'")
    return TorchBackend(host=on_host(device, dtype), dense_ties=device.type != "cpu")
