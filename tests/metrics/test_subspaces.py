"""Haar subspaces, orthonormal bases and the readout basis."""

import numpy as np
import pytest
import torch

from geolens.metrics import orthonormal_basis, random_subspaces, readout_basis


def test_random_subspaces_are_orthonormal_and_seeded():
    q = random_subspaces(20, 5, n=8, seed=4)
    eye = torch.eye(5, dtype=torch.float64).expand(8, 5, 5)
    torch.testing.assert_close(q.transpose(1, 2) @ q, eye)
    assert torch.equal(q, random_subspaces(20, 5, n=8, seed=4))
    assert not torch.equal(q, random_subspaces(20, 5, n=8, seed=5))


def test_random_subspaces_are_haar_on_average():
    # E[Q Q^T] = (k/d) I for the uniform distribution on Gr(k, d).
    d, k = 6, 2
    q = random_subspaces(d, k, n=20000, seed=0)
    mean_projector = (q @ q.transpose(1, 2)).mean(0)
    torch.testing.assert_close(mean_projector, torch.eye(d, dtype=torch.float64) * k / d, atol=0.02, rtol=0)
    # The sign fix makes each column's first entry symmetric around zero.
    assert abs(float(q[:, 0, 0].mean())) < 0.02


def test_readout_basis_equals_numpy_svd_subspace():
    w_u = torch.randn(16, 200, dtype=torch.float64)
    q = readout_basis(w_u, 5)
    u = np.linalg.svd(w_u.numpy(), full_matrices=False)[0][:, :5]
    np.testing.assert_allclose(q.numpy() @ q.numpy().T, u @ u.T, atol=1e-10)


def test_readout_basis_errors():
    with pytest.raises(ValueError, match="k must be < d_model = 16"):
        readout_basis(torch.randn(16, 100), 16)
    with pytest.raises(ValueError, match="d_vocab >= d_model"):
        readout_basis(torch.randn(100, 16), 4)
    with pytest.raises(TypeError, match="k must be an int"):
        readout_basis(torch.randn(16, 100), 2.5)


def test_orthonormal_basis_keeps_span():
    b = torch.randn(10, 3, dtype=torch.float64)
    q = orthonormal_basis(b)
    torch.testing.assert_close(q @ q.T @ b, b)
