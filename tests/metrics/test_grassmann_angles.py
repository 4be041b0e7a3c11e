"""Principal angles against scipy.linalg.subspace_angles; RSS of a planted rotating trajectory."""

import math

import numpy as np
import pytest
import scipy.linalg
import torch

from geolens.metrics.subspaces import (
    grassmann_distance,
    principal_angles,
    principal_cosines,
    readout_subspace_similarity,
    top_right_singular_subspace,
)


@pytest.mark.parametrize("k1, k2", [(3, 3), (2, 5), (6, 4)])
def test_principal_angles_equal_scipy(k1, k2):
    g = torch.Generator().manual_seed(k1 * 10 + k2)
    a, b = torch.randn(12, k1, generator=g, dtype=torch.float64), torch.randn(12, k2, generator=g, dtype=torch.float64)
    ref = np.sort(scipy.linalg.subspace_angles(a.numpy(), b.numpy()))
    np.testing.assert_allclose(principal_angles(a, b).numpy(), ref, atol=1e-6)
    np.testing.assert_allclose(principal_cosines(a, b).numpy(), np.sort(np.cos(ref))[::-1], atol=1e-6)


def test_tiny_angles_are_accurate():
    a = torch.eye(5, dtype=torch.float64)[:, :2]
    b = a.clone()
    b[2, 0] = 1e-9  # rotate by 1e-9 rad out of the plane
    b = torch.linalg.qr(b)[0]
    angles = principal_angles(a, b)
    assert float(angles.max()) == pytest.approx(1e-9, rel=1e-6)


def _rotating_trajectory(d=10, k=3, angles=(0.1, 0.3, 0.0, 0.6)):
    """Subspaces where step l rotates every basis vector by angles[l] towards a fresh orthogonal direction."""
    eye = torch.eye(d, dtype=torch.float64)
    bases = [eye[:, :k]]
    current = eye[:, :k]
    spare = list(range(k, d))
    for step, theta in enumerate(angles):
        # rotate column 0 within the plane (e_0-ish, e_spare): one principal angle theta, the others 0
        target = eye[:, spare[step]]
        rotated = current.clone()
        rotated[:, 0] = math.cos(theta) * current[:, 0] + math.sin(theta) * target
        bases.append(rotated)
        current = rotated
    return torch.stack(bases), angles, k


def test_rss_of_planted_rotations():
    bases, angles, k = _rotating_trajectory()
    rss = readout_subspace_similarity(bases)
    # One principal angle theta per step and k - 1 zero angles: mean cosine (cos(theta) + k - 1) / k.
    expected = torch.tensor([(math.cos(t) + k - 1) / k for t in angles], dtype=torch.float64)
    torch.testing.assert_close(rss, expected, atol=1e-12, rtol=0)
    assert grassmann_distance(bases[1], bases[2]) == pytest.approx(0.3, abs=1e-9)


def test_top_right_singular_subspace_and_energy():
    u = torch.linalg.qr(torch.randn(6, 6, dtype=torch.float64))[0]
    v = torch.linalg.qr(torch.randn(6, 6, dtype=torch.float64))[0]
    s = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.5, 0.1], dtype=torch.float64)
    m = u @ torch.diag(s) @ v.T
    basis, energy = top_right_singular_subspace(m, 2)
    assert energy == pytest.approx(float((s[:2] ** 2).sum() / (s**2).sum()))
    assert float(principal_angles(basis, v[:, :2]).max()) < 1e-8  # the input directions, not the output ones
    with pytest.raises(ValueError, match="k must be <="):
        top_right_singular_subspace(m, 7)
    with pytest.raises(ValueError, match="zero"):
        top_right_singular_subspace(torch.zeros(3, 3), 1)


def test_errors():
    with pytest.raises(ValueError, match="different spaces"):
        principal_angles(torch.randn(5, 2), torch.randn(6, 2))
    with pytest.raises(ValueError, match="equal dimensions"):
        grassmann_distance(torch.randn(5, 2), torch.randn(5, 3))
    with pytest.raises(ValueError, match=r"\[L >= 2"):
        readout_subspace_similarity(torch.randn(1, 5, 2))


def test_resolution_sweep_against_per_map_svd():
    from geolens.metrics.subspaces import choose_resolution, resolution_sweep

    g = torch.Generator().manual_seed(0)
    maps = torch.eye(8, dtype=torch.float64) + 0.3 * torch.randn(5, 8, 8, generator=g, dtype=torch.float64)
    sweep = resolution_sweep(maps, [0.125, 0.25, 0.5])
    for row in sweep:
        bases, energies = zip(*(top_right_singular_subspace(m, row["k"]) for m in maps))
        torch.testing.assert_close(row["rss"], readout_subspace_similarity(torch.stack(bases)))
        assert row["energy"] == pytest.approx(float(np.mean(energies)))
        assert row["visibility"] == pytest.approx(1.0 - float(row["rss"].mean()))
    assert [row["k"] for row in sweep] == [1, 2, 4]
    energies = [row["energy"] for row in sweep]
    assert energies == sorted(energies)  # more of the spectrum kept as k grows
    chosen = choose_resolution(sweep)
    top = max(row["visibility"] for row in sweep)
    assert chosen["visibility"] >= 0.95 * top
    assert all(row["k"] >= chosen["k"] for row in sweep if row["visibility"] >= 0.95 * top)
    with pytest.raises(ValueError, match=r"\(0, 1\)"):
        resolution_sweep(maps, [1.5])


def test_resolution_sweep_checks_each_fraction_before_the_svd():
    """check_float names the offending entry: its position, the interval and the bound it broke."""
    from geolens.metrics.subspaces import resolution_sweep

    maps = torch.eye(6, dtype=torch.float64).expand(3, 6, 6).clone()
    with pytest.raises(ValueError, match=r"fractions\[1\] \(each in \(0, 1\)\) must be > 0, got 0.0"):
        resolution_sweep(maps, [0.5, 0])
    with pytest.raises(ValueError, match=r"fractions\[0\].*finite"):
        resolution_sweep(maps, [float("nan")])
    with pytest.raises(TypeError, match=r"fractions\[0\].*must be a number, got str"):
        resolution_sweep(maps, ["half"])
