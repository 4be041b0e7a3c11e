"""The PGA ranking engine (private): exact and sampled Spearman statistics of many subspaces' distances.

:func:`geolens.metrics._ranking.select.select_backend` picks a backend once per call (the compiled
CPU kernels or the torch kernels); ``subspace_pga(..., backend=...)`` passes the choice in. The
module map, top down, is in :mod:`geolens.metrics._ranking.select`. See docs/methods.md §A.4.
"""
