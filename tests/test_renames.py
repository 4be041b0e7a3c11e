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


def test_a_renamed_study_option_hashes_as_before_the_rename():
    import geolens
    from geolens._renames import hashed_options
    from geolens.study import Study

    old = {"lens_texts": ["a b c"], "lens_budget": {"method": "reference", "steps": 2, "tokens_per_step": 8}}
    new = {"lens_tokens": ["a b c"], "lens_budget": {"method": "reference", "max_steps": 2, "tokens_per_step": 8}}
    renamed = geolens.phases.__renamed_keywords__
    assert hashed_options(new, renamed) == old
    assert hashed_options({"lens_budget": {"max_steps": 2}}, renamed) == {"lens_budget": {"max_steps": 2}}  # fast
    cell = Study(models={"m": "some/folder"}, texts=["a b", "c d"], analyses={"phases": new}).cells()[0]
    assert cell.analyses["phases"]["lens_tokens"] == ["a b c"]  # the call gets the new names
    # ... and the cell keeps the hashes geolens 0.3.0 gave it (lens_texts, steps): its files are found
    assert (cell.spec_hash, dict(cell.analysis_hashes)) == ("349057d6e26854e2", {"phases": "43dec2526f861444"})


def test_a_study_option_spelt_as_before_a_rename_names_the_new_one():
    from geolens.analyses.grid import UnknownOptionError
    from geolens.study import Study

    with pytest.raises(UnknownOptionError, match="option 'lens_texts' was renamed to 'lens_tokens'"):
        Study(models={"m": "some/folder"}, texts=["a b", "c d"], analyses={"phases": {"lens_texts": ["a"]}}).cells()


def test_a_renamed_settings_field_names_the_new_one_and_a_bad_rename_is_refused():
    import dataclasses

    from geolens._renames import refuse_renamed, renamed_fields

    @renamed_fields(lens_steps="lens_max_steps")
    @dataclasses.dataclass(frozen=True)
    class Budget:
        lens_max_steps: int = 40

    assert dataclasses.replace(Budget(), lens_max_steps=2) == Budget(2) and Budget.__renamed_fields__ == {
        "lens_steps": "lens_max_steps"}
    with pytest.raises(TypeError, match=r"Budget\(\) got the keyword 'lens_steps', renamed to 'lens_max_steps'"):
        dataclasses.replace(Budget(), lens_steps=2)
    with pytest.raises(ValueError, match="no field 'steps'"):
        renamed_fields(n="steps")(Budget)
    with pytest.raises(ValueError, match="still has the old field 'lens_max_steps'"):
        renamed_fields(lens_max_steps="lens_max_steps")(Budget)
    refuse_renamed("report", {"n_tokens": 3}, {"n_positions": "n_tokens"})  # new names pass
