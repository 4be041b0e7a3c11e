"""The one seeded subset (geolens._sampling) that capture, convergence and the lens evaluation draw."""

from __future__ import annotations

import pytest
import torch

from geolens._sampling import seeded_subset


@pytest.mark.parametrize("available, n, seed", [(10, 4, 0), (1000, 37, 5), (50, 50, 1), (7, 20, 3)])
def test_the_first_n_of_a_seeded_permutation_sorted(available, n, seed):
    """Reference: torch's own seeded permutation, written out (the draw every stored sample was made with)."""
    reference = torch.randperm(available, generator=torch.Generator().manual_seed(seed))[:n].sort().values
    chosen = seeded_subset(available, n, seed)
    assert torch.equal(chosen, reference) and chosen.dtype == torch.long
    assert len(set(chosen.tolist())) == min(n, available) and chosen.tolist() == sorted(chosen.tolist())


def test_same_seed_same_rows_and_nested_sizes():
    assert torch.equal(seeded_subset(100, 10, 3), seeded_subset(100, 10, 3))
    assert not torch.equal(seeded_subset(100, 10, 3), seeded_subset(100, 10, 4))
    assert set(seeded_subset(100, 10, 3).tolist()) <= set(seeded_subset(100, 30, 3).tolist())
    assert torch.equal(seeded_subset(100, 10, None), seeded_subset(100, 10, 0))


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="seed must be >= 0"):
        seeded_subset(10, 3, -1)
    with pytest.raises(TypeError, match="n must be an int"):
        seeded_subset(10, 2.5, 0)


def test_capture_draws_its_positions_with_it(native_bridge, texts):
    from geolens.capture import capture, prepare_tokens, sample_positions
    from geolens.model import as_adapter

    model = native_bridge
    batch = prepare_tokens(as_adapter(model), texts, None, None)
    every_b, every_p = sample_positions(batch.attention_mask, None)
    b, p = sample_positions(batch.attention_mask, 8, seed=2)
    pick = seeded_subset(every_b.numel(), 8, 2)
    assert torch.equal(b, every_b[pick]) and torch.equal(p, every_p[pick])
    states = capture(model, texts, n_tokens=8, seed=2, progress=False)
    assert torch.equal(states.batch_index.cpu(), b) and torch.equal(states.position.cpu(), p)


def test_bounded_subset_a_default_is_an_upper_bound_an_explicit_size_is_exact():
    from geolens._sampling import bounded_subset
    from geolens._validation import UpperBound

    messages = dict(name="n", too_many="asked {n}, have {available}", over_default="default {n} > {available}")
    assert torch.equal(bounded_subset(50, 10, 3, **messages), seeded_subset(50, 10, 3))
    assert torch.equal(bounded_subset(50, UpperBound(10), 3, **messages), seeded_subset(50, 10, 3))
    assert bounded_subset(50, None, 3, **messages) is None
    assert len(bounded_subset(50, 50, 3, **messages)) == 50  # exactly what there is: a subset of all rows
    with pytest.warns(UserWarning, match=r"^default 60 > 50$") as caught:
        assert bounded_subset(50, UpperBound(60), 3, stacklevel=1, **messages) is None
    assert caught[0].filename == __file__  # stacklevel 1, as if this line warned: it points here
    with pytest.raises(ValueError, match=r"^asked 60, have 50$"):
        bounded_subset(50, 60, 3, **messages)
    with pytest.raises(ValueError, match="n must be >= 3"):
        bounded_subset(50, 2, 3, **messages)
    with pytest.raises(TypeError, match="n must be an int"):
        bounded_subset(50, 2.5, 3, **messages)


def test_capture_warns_at_the_callers_line_when_its_default_is_too_large(native_bridge):
    from geolens.capture import capture
    from geolens._validation import UpperBound

    tokens = torch.randint(3, 20, (2, 8), generator=torch.Generator().manual_seed(0))
    with pytest.warns(UserWarning, match="n_tokens: the default of 100 positions exceeds the 14 eligible ones") as caught:
        states = capture(native_bridge, tokens, n_tokens=UpperBound(100), progress=False)
    assert states.n_tokens == 14 and caught[0].filename == __file__
    with pytest.raises(ValueError, match="n_tokens = 100 but only 14 eligible token positions are available"):
        capture(native_bridge, tokens, n_tokens=100, progress=False)
