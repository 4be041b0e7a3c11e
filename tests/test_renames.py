"""Retired names answer with their replacement (geolens._renames)."""

from __future__ import annotations

import inspect

import pytest

from geolens._renames import renamed_attributes, renamed_keywords


def _sample(tokens, *, n_tokens=8, seed=0):
    return tokens, n_tokens, seed


def test_an_old_keyword_raises_a_type_error_naming_the_new_one():
    sample = renamed_keywords(n_positions="n_tokens")(_sample)
    assert sample("a", n_tokens=3) == ("a", 3, 0)
    with pytest.raises(TypeError, match=r"_sample\(\) got the keyword 'n_positions', renamed to 'n_tokens'"):
        sample("a", n_positions=3)
    assert inspect.signature(sample) == inspect.signature(_sample)
    assert sample.__renamed_keywords__ == {"n_positions": "n_tokens"}


def test_a_rename_to_a_missing_parameter_or_from_a_kept_one_is_refused():
    with pytest.raises(ValueError, match="no parameter 'n_rows'"):
        renamed_keywords(n_positions="n_rows")(_sample)
    with pytest.raises(ValueError, match="still has the old parameter 'seed'"):
        renamed_keywords(seed="n_tokens")(_sample)


def test_an_old_attribute_names_the_new_one_and_others_stay_missing():
    getattr_ = renamed_attributes("geolens.x", {"ProbeResult": "ProbesResult"})
    with pytest.raises(AttributeError, match="geolens.x.ProbeResult was renamed to ProbesResult"):
        getattr_("ProbeResult")
    with pytest.raises(AttributeError, match="has no attribute 'Nothing'"):
        getattr_("Nothing")
