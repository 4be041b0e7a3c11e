"""The named steps of tuned-lens training: the text stream, one step's gradients, the optimiser."""

import pytest
import torch

from geolens.lens import TunedLens
from geolens.lens.train import _optimiser, _step_gradients, _TrainingText, _unembedding
from geolens.model import as_adapter


def test_training_text_restarts_a_list_but_not_an_iterator(neox_bridge, train_texts):
    adapter = as_adapter(neox_bridge)
    listed = _TrainingText(adapter, train_texts[:2], 16, 1, None)
    first = [listed.next_batch() for _ in range(2)]
    again = listed.next_batch()  # the list ran out: read from the start
    assert listed.restarts == 1 and torch.equal(again[0], first[0][0])
    once = _TrainingText(adapter, iter(train_texts[:2]), 16, 1, None)
    assert once.next_batch() is not None and once.next_batch() is not None
    assert once.next_batch() is None and once.restarts == 0


def test_training_text_with_nothing_to_train_on_ends_after_one_restart(neox_bridge, train_texts):
    text = _TrainingText(as_adapter(neox_bridge), train_texts[:1], 16, 1, None)
    assert text.next_batch() is not None  # n_seen stays 0: the caller found no eligible token
    assert text.next_batch() is not None and text.restarts == 1
    assert text.next_batch() is None


def test_step_gradients_of_a_short_text_are_the_mean_over_what_it_held(neox_bridge, train_texts):
    """An iterator that runs dry mid-step gives the gradient of a step sized to its tokens (planted: the same text)."""
    adapter = as_adapter(neox_bridge)
    torch.manual_seed(0)
    lens = TunedLens(adapter)
    with torch.no_grad():
        for p in lens.translators.parameters():
            p.add_(0.05 * torch.randn_like(p))
    w_u, b_u, dtype = _unembedding(adapter, None)
    short = _TrainingText(adapter, iter(train_texts[:3]), 16, 2, None)
    taken, kl = _step_gradients(lens, short, 10_000, w_u, b_u, dtype)
    assert 0 < taken < 10_000 and short.n_seen == taken
    grads = [p.grad.clone() for p in lens.translators.parameters()]
    exact = _TrainingText(adapter, list(train_texts[:3]), 16, 2, None)
    taken_exact, kl_exact = _step_gradients(lens, exact, taken, w_u, b_u, dtype)
    assert taken_exact == taken
    torch.testing.assert_close(kl, kl_exact, rtol=1e-5, atol=1e-7)
    for g, p in zip(grads, lens.translators.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-7)
    assert float(kl.mean()) > 0


def test_optimiser_decays_the_lr_linearly_to_zero():
    w = torch.nn.Parameter(torch.zeros(3))
    opt, schedule = _optimiser([w], lr=2.0, momentum=0.5, weight_decay=0.0, steps=4)
    seen = []
    for _ in range(4):
        seen.append(opt.param_groups[0]["lr"])
        w.grad = torch.ones(3)
        opt.step()
        schedule.step()
    assert seen == pytest.approx([1.0, 0.75, 0.5, 0.25])
    assert opt.param_groups[0]["lr"] == pytest.approx(0.0)
    assert _optimiser([w], lr=1.0, momentum=0.0, weight_decay=0.0, steps=2)[0].param_groups[0]["nesterov"] is False
