"""Linear CKA and mutual k-NN: against direct numpy formulas, invariances, planted answers, bad input."""

import itertools
import math

import numpy as np
import pytest
import torch

import geolens.metrics.similarity as similarity
from geolens.metrics import linear_cka, mutual_knn

DTYPES = (torch.float32, torch.float64)


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _cloud(n, d, seed, dtype=torch.float64, shift=0.0):
    return (torch.randn(n, d, generator=_gen(seed), dtype=torch.float64) + shift).to(dtype)


def _rotation(d, seed):
    return torch.linalg.qr(torch.randn(d, d, generator=_gen(seed), dtype=torch.float64))[0]


def _related_pair(n=120, d1=10, d2=7, seed=0, dtype=torch.float64):
    """y depends on x linearly plus noise, with an offset: CKA well inside (0, 1)."""
    x = _cloud(n, d1, seed, shift=2.0)
    y = x[:, :d2] @ torch.randn(d2, d2, generator=_gen(seed + 1), dtype=torch.float64) + 0.7 * _cloud(n, d2, seed + 2) - 3.0
    return x.to(dtype), y.to(dtype)


# ----------------------------------------------------------------------------- numpy references
def _np_cka(x, y):
    """Kornblith et al. 2019: HSIC(K, L) = tr(K H L H) / (n - 1)^2 on linear Grams, H = I - 11'/n."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    n = x.shape[0]
    h = np.eye(n) - np.ones((n, n)) / n
    k, l = x @ x.T, y @ y.T

    def hsic(a, b):
        return np.trace(a @ h @ b @ h) / (n - 1) ** 2

    return hsic(k, l) / math.sqrt(hsic(k, k) * hsic(l, l))


def _np_hsic_unbiased(k, l):
    """Song et al. 2012, eq. (5), written out on the Grams with zeroed diagonals."""
    n = k.shape[0]
    kt, lt = k - np.diag(np.diag(k)), l - np.diag(np.diag(l))
    one = np.ones(n)
    return (np.trace(kt @ lt) + kt.sum() * lt.sum() / ((n - 1) * (n - 2)) - 2.0 / (n - 2) * one @ kt @ lt @ one) / (
        n * (n - 3)
    )


def _np_hsic_u_centred(k, l):
    """The same estimator as an inner product of U-centred matrices (Szekely & Rizzo 2014)."""
    n = k.shape[0]

    def u_centre(a):
        a = a - np.diag(np.diag(a))
        out = a - a.sum(1, keepdims=True) / (n - 2) - a.sum(0, keepdims=True) / (n - 2) + a.sum() / ((n - 1) * (n - 2))
        np.fill_diagonal(out, 0.0)
        return out

    return (u_centre(k) * u_centre(l)).sum() / (n * (n - 3))


def _np_hsic_u_statistic(k, l):
    """Brute force: mean over ordered distinct (i, j, q, r) of k_ij l_ij + k_ij l_qr - 2 k_ij l_iq."""
    n = k.shape[0]
    total, count = 0.0, 0
    for i, j, q, r in itertools.permutations(range(n), 4):
        total += k[i, j] * l[i, j] + k[i, j] * l[q, r] - 2.0 * k[i, j] * l[i, q]
        count += 1
    return total / count


def _np_debiased_cka(x, y, hsic=_np_hsic_unbiased):
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    k, l = x @ x.T, y @ y.T
    return hsic(k, l) / math.sqrt(hsic(k, k) * hsic(l, l))


def _np_mutual_knn(x, y, k, metric="cosine"):
    """Loop over rows: argsort of each row's similarities, self removed, set intersection."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if metric == "cosine":
        x = x / np.linalg.norm(x, axis=1, keepdims=True)
        y = y / np.linalg.norm(y, axis=1, keepdims=True)
    n = x.shape[0]
    scores = []
    for i in range(n):
        sets = []
        for z in (x, y):
            sim = z @ z[i]
            order = [j for j in np.argsort(-sim, kind="stable") if j != i]
            sets.append(set(order[:k]))
        scores.append(len(sets[0] & sets[1]) / k)
    return float(np.mean(scores))


# ----------------------------------------------------------------------------- CKA against numpy
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n, d1, d2", [(120, 10, 7), (6, 20, 15)])  # feature-space and Gram routes
def test_cka_equals_numpy_formulas(dtype, n, d1, d2):
    x, y = _related_pair(n, d1, d2, seed=n, dtype=dtype)
    xn, yn = x.double().numpy(), y.double().numpy()
    assert linear_cka(x, y) == pytest.approx(_np_cka(xn, yn), abs=1e-9)
    assert linear_cka(x, y, debiased=True) == pytest.approx(_np_debiased_cka(xn, yn), abs=1e-9)
    assert linear_cka(x, y, debiased=True) == pytest.approx(_np_debiased_cka(xn, yn, _np_hsic_u_centred), abs=1e-9)


def test_unbiased_hsic_equals_the_u_statistic():
    x, y = _related_pair(n=7, d1=4, d2=3, seed=3)
    xn, yn = x.numpy(), y.numpy()
    for a, b in ((xn, yn), (xn, xn)):
        k, l = a @ a.T, b @ b.T
        assert _np_hsic_unbiased(k, l) == pytest.approx(_np_hsic_u_statistic(k, l), rel=1e-10)
    assert linear_cka(x, y, debiased=True) == pytest.approx(_np_debiased_cka(xn, yn, _np_hsic_u_statistic), abs=1e-9)


@pytest.mark.parametrize("debiased", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_cka_invariances(dtype, debiased):
    x, y = _related_pair(dtype=dtype)
    base = linear_cka(x, y, debiased=debiased)
    assert 0.2 < base < 0.95
    qx, qy = _rotation(x.shape[1], 10).to(dtype), _rotation(y.shape[1], 11).to(dtype)
    tol = 1e-9 if dtype == torch.float64 else 1e-5
    for xt, yt in ((x @ qx, y), (x, y @ qy), (3.5 * x, y), (x, 0.02 * y), (x + 4.0, y - 1.5), (-x @ qx + 1.0, 7.0 * y @ qy)):
        assert linear_cka(xt, yt, debiased=debiased) == pytest.approx(base, abs=tol)
    assert linear_cka(y, x, debiased=debiased) == pytest.approx(base, abs=1e-12)  # symmetric


# ----------------------------------------------------------------------------- CKA planted cases
@pytest.mark.parametrize("dtype", DTYPES)
def test_cka_of_a_cloud_with_itself_or_a_rotated_copy_is_one(dtype):
    x = _cloud(80, 12, 0, dtype, shift=1.0)
    tol = 1e-12 if dtype == torch.float64 else 1e-6
    for debiased in (False, True):
        assert linear_cka(x, x, debiased=debiased) == pytest.approx(1.0, abs=1e-12)
        assert linear_cka(x, 2.0 * x @ _rotation(12, 1).to(dtype) - 3.0, debiased=debiased) == pytest.approx(1.0, abs=tol)


def test_cka_of_independent_clouds_is_small_and_debiased_near_zero():
    n, d1, d2 = 300, 8, 12
    expected = math.sqrt(d1 * d2 / ((n + d1) * (n + d2)))  # E||X'Y||^2 / sqrt(E||X'X||^2 E||Y'Y||^2), Gaussian
    biased, unbiased = [], []
    for seed in range(5):
        x, y = _cloud(n, d1, 2 * seed), _cloud(n, d2, 2 * seed + 1)
        biased.append(linear_cka(x, y))
        unbiased.append(linear_cka(x, y, debiased=True))
    assert np.mean(biased) == pytest.approx(expected, abs=0.008)  # seed-to-seed sd ~0.005 / sqrt(5)
    assert abs(np.mean(unbiased)) < 0.008
    assert all(abs(u) < 0.02 for u in unbiased)


def test_cka_half_the_columns_replaced_by_noise_is_one_half():
    x = _cloud(4000, 16, 0)
    y = torch.cat([x[:, :8], _cloud(4000, 8, 1)], dim=1)  # 8 of 16 equal-variance directions shared
    assert linear_cka(x, y, debiased=True) == pytest.approx(0.5, abs=0.02)
    assert linear_cka(x, y) == pytest.approx(0.5, abs=0.03)
    quarter = torch.cat([x[:, :12], _cloud(4000, 4, 2)], dim=1)
    assert linear_cka(x, x) > linear_cka(x, quarter) > linear_cka(x, y) > linear_cka(x, _cloud(4000, 16, 3))


# ----------------------------------------------------------------------------- mutual k-NN
@pytest.mark.parametrize("metric", ["cosine", "ip"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [1, 5, 20])
def test_mutual_knn_equals_numpy_loops(dtype, metric, k):
    x, y = _related_pair(n=70, d1=9, d2=6, seed=k, dtype=dtype)
    got = mutual_knn(x, y, k=k, metric=metric)
    assert got == pytest.approx(_np_mutual_knn(x.double().numpy(), y.double().numpy(), k, metric), abs=1e-12)
    assert 0.0 < got < 1.0


def test_mutual_knn_in_row_blocks_equals_one_block(monkeypatch):
    x, y = _related_pair(n=50, seed=4)
    whole = mutual_knn(x, y, k=6)
    monkeypatch.setattr(similarity, "_BLOCK_ROWS", 7)
    assert mutual_knn(x, y, k=6) == whole == pytest.approx(_np_mutual_knn(x.numpy(), y.numpy(), 6), abs=1e-12)


@pytest.mark.parametrize("dtype", DTYPES)
def test_mutual_knn_invariances(dtype):
    x, y = _related_pair(n=90, seed=5, dtype=dtype)
    base = mutual_knn(x, y, k=8)
    qx, qy = _rotation(x.shape[1], 1).to(dtype), _rotation(y.shape[1], 2).to(dtype)
    row_scales = torch.rand(x.shape[0], 1, generator=_gen(6), dtype=torch.float64).to(dtype) + 0.5
    for xt, yt in ((x @ qx, y), (x, y @ qy), (4.0 * x, 0.1 * y), (row_scales * x, y)):
        assert mutual_knn(xt, yt, k=8) == base
    assert mutual_knn(y, x, k=8) == base
    base_ip = mutual_knn(x, y, k=8, metric="ip")
    assert mutual_knn(3.0 * x @ qx, 0.5 * y @ qy, k=8, metric="ip") == base_ip


@pytest.mark.parametrize("dtype", DTYPES)
def test_mutual_knn_planted_cases(dtype):
    n, k = 300, 10
    x = _cloud(n, 12, 0, dtype)
    assert mutual_knn(x, x, k=k) == 1.0
    assert mutual_knn(x, 2.0 * x @ _rotation(12, 3).to(dtype), k=k) == 1.0
    chance = [mutual_knn(_cloud(n, 12, 2 * s, dtype), _cloud(n, 12, 2 * s + 1, dtype), k=k) for s in range(3)]
    assert np.mean(chance) == pytest.approx(k / (n - 1), abs=0.008)  # single-seed sd ~0.004
    assert mutual_knn(x, _cloud(n, 5, 9, dtype), k=n - 1) == 1.0  # every other row is a neighbour
    half = torch.cat([x[:, :6], _cloud(n, 6, 4, dtype)], dim=1)
    quarter = torch.cat([x[:, :9], _cloud(n, 3, 5, dtype)], dim=1)
    assert 1.0 > mutual_knn(x, quarter, k=k) > mutual_knn(x, half, k=k) > 2 * k / (n - 1)


def test_mutual_knn_excludes_self_by_index():
    x = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [-1.0, 0.1]], dtype=torch.float64)
    y = torch.tensor([[1.0, 0.1], [1.0, 0.0], [-1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    # row 0's duplicate (row 1) is its nearest neighbour, not row 0 itself (and vice versa), as in y;
    # row 2's neighbour is row 3 in both; row 3's is row 2 in x but row 0 in y
    assert mutual_knn(x, y, k=1) == 0.75 == _np_mutual_knn(x.numpy(), y.numpy(), 1)


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("fn", [linear_cka, mutual_knn])
def test_bad_input_names_the_argument(fn):
    x, y = _related_pair(n=20)
    with pytest.raises(ValueError, match="same rows"):
        fn(x, y[:19])
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        fn(x.numpy(), y)
    with pytest.raises(TypeError, match="y must be a torch.Tensor"):
        fn(x, [[1.0]])
    with pytest.raises(ValueError, match="y must be 2-D"):
        fn(x, y[:, 0])
    with pytest.raises(TypeError, match="x must be a floating-point"):
        fn(x.long(), y)
    bad = x.clone()
    bad[3, 1] = float("nan")
    with pytest.raises(ValueError, match="x contains 1 NaN"):
        fn(bad, y)
    bad = y.clone()
    bad[0, 0] = float("inf")
    with pytest.raises(ValueError, match="y contains 0 NaN and 1 infinite"):
        fn(x, bad)


def test_cka_bad_input():
    x, y = _related_pair(n=20)
    with pytest.raises(ValueError, match="x needs at least 4 rows"):
        linear_cka(x[:3], y[:3], debiased=True)
    assert 0.0 <= linear_cka(x[:3], y[:3]) <= 1.0
    with pytest.raises(ValueError, match="y has no variance"):
        linear_cka(x, torch.ones_like(y))
    with pytest.raises(TypeError, match="debiased must be a bool"):
        linear_cka(x, y, debiased=1)


def test_mutual_knn_bad_input():
    x, y = _related_pair(n=20)
    with pytest.raises(ValueError, match="k must be <= 19"):
        mutual_knn(x, y, k=20)
    with pytest.raises(ValueError, match="k must be >= 1"):
        mutual_knn(x, y, k=0)
    with pytest.raises(TypeError, match="k must be an int"):
        mutual_knn(x, y, k=2.0)
    with pytest.raises(ValueError, match="metric must be one of"):
        mutual_knn(x, y, metric="euclidean")
    with pytest.raises(TypeError, match="metric must be a str"):
        mutual_knn(x, y, metric=None)
    zero_row = y.clone()
    zero_row[5] = 0.0
    with pytest.raises(ValueError, match="y has 1 rows of zero norm"):
        mutual_knn(x, zero_row)
    assert 0.0 <= mutual_knn(x, zero_row, metric="ip") <= 1.0


# ----------------------------------------------------------------------------- CKA of many clouds at once
@pytest.mark.parametrize("debiased", [False, True])
@pytest.mark.parametrize("n, width", [(120, 6), (8, 20)])  # feature-space and Gram routes
def test_cka_matrix_is_linear_cka_of_every_pair(n, width, debiased):
    from geolens.metrics import cka_matrix

    xs = [_related_pair(n, width, width - 1, seed=s)[i] for s in (1, 2) for i in (0, 1)]
    ys = [_cloud(n, width + 2, 9), xs[1] @ _rotation(width - 1, 4) + 1.0]
    table = cka_matrix(xs, ys, debiased=debiased)
    assert table.shape == (4, 2) and table.dtype == torch.float64
    for i, j in itertools.product(range(4), range(2)):
        assert float(table[i, j]) == pytest.approx(linear_cka(xs[i], ys[j], debiased=debiased), abs=1e-12)
        assert float(table[i, j]) == pytest.approx(_np_cka(xs[i].numpy(), ys[j].numpy()) if not debiased
                                                   else _np_debiased_cka(xs[i].numpy(), ys[j].numpy()), abs=1e-9)
    assert float(table[1, 1]) == pytest.approx(1.0, abs=1e-12)
    square = cka_matrix(xs, debiased=debiased)
    assert torch.allclose(square, square.T, atol=1e-12, rtol=0)
    assert torch.allclose(square.diagonal(), torch.ones(4, dtype=torch.float64), atol=1e-12, rtol=0)
    assert torch.allclose(square, cka_matrix(xs, list(xs), debiased=debiased), atol=1e-12, rtol=0)


def test_cka_matrix_bad_input():
    from geolens.metrics import cka_matrix

    x, y = _related_pair(n=20)
    with pytest.raises(TypeError, match="xs must be a non-empty sequence"):
        cka_matrix(x)
    with pytest.raises(TypeError, match="ys must be a non-empty sequence"):
        cka_matrix([x], [])
    with pytest.raises(ValueError, match="same rows"):
        cka_matrix([x, y[:10]])
    with pytest.raises(ValueError, match=r"ys\[1\] has no variance"):
        cka_matrix([x], [y, torch.ones_like(y)])
    with pytest.raises(ValueError, match=r"xs\[0\] needs at least 4 rows"):
        cka_matrix([x[:3]], debiased=True)
    with pytest.raises(TypeError, match="debiased must be a bool"):
        cka_matrix([x], debiased=None)


@pytest.mark.parametrize("metric", ["cosine", "ip"])
def test_mutual_knn_matrix_is_mutual_knn_of_every_pair(metric):
    from geolens.metrics import mutual_knn_matrix

    xs = [_cloud(60, 5, s) for s in (1, 2, 3)]
    ys = [xs[0] @ _rotation(5, 7), _cloud(60, 8, 4)]
    table = mutual_knn_matrix(xs, ys, k=4, metric=metric)
    assert table.shape == (3, 2) and table.dtype == torch.float64
    for i, j in itertools.product(range(3), range(2)):
        assert float(table[i, j]) == mutual_knn(xs[i], ys[j], k=4, metric=metric)
        assert float(table[i, j]) == pytest.approx(_np_mutual_knn(xs[i], ys[j], 4, metric), abs=1e-12)
    assert float(table[0, 0]) == 1.0
    assert torch.equal(mutual_knn_matrix(xs, k=4, metric=metric), mutual_knn_matrix(xs, list(xs), k=4, metric=metric))
    with pytest.raises(ValueError, match="k must be <= 59"):
        mutual_knn_matrix(xs, k=60)
    with pytest.raises(ValueError, match=r"xs\[1\] has 1 rows of zero norm"):
        mutual_knn_matrix([xs[0], torch.cat([torch.zeros(1, 5, dtype=torch.float64), xs[1][1:]])], k=3)
    with pytest.raises(ValueError, match="metric must be one of"):
        mutual_knn_matrix(xs, metric="l2")
