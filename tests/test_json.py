"""The one canonical JSON form (geolens._json): saved results and study cell hashes."""

from __future__ import annotations

import functools
import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from geolens._json import NON_FINITE, callable_id, jsonable, restore_non_finite
from geolens._validation import UpperBound
from geolens.results import Result, json_text


def _loader(checkpoint=None, scale=1.0):
    return checkpoint, scale


def test_saved_form_is_strict_json_and_round_trips_non_finite_floats():
    value = {"z": (1.5, float("nan")), "hi": float("inf"), "lo": float("-inf"), "t": torch.tensor([0.5, float("nan")]),
             "a": np.array([[1, 2]]), "s": np.float64(2.5), "p": Path("/tmp/x"), "n": UpperBound(7), "none": None}
    out = jsonable(value)
    assert out == {"z": [1.5, "NaN"], "hi": "Infinity", "lo": "-Infinity", "t": [0.5, "NaN"], "a": [[1, 2]],
                   "s": 2.5, "p": "/tmp/x", "n": 7, "none": None}
    assert list(out) == list(value)  # a saved file keeps the order it was given
    text = json.dumps(out, allow_nan=False)  # raises on a NaN token
    back = restore_non_finite(json.loads(text))
    assert math.isnan(back["z"][1]) and back["hi"] == math.inf and back["lo"] == -math.inf
    assert set(NON_FINITE) == {"NaN", "Infinity", "-Infinity"}
    assert json_text(value, indent=None) == text


def test_a_result_saves_and_loads_its_nans(tmp_path):
    result = Result(rows=[{"layer": 0, "z": float("nan")}, {"layer": 1, "z": 2.0}], params={"k": (4, 8)})
    loaded = Result.load(result.save(tmp_path / "r.json"))
    assert math.isnan(loaded.rows[0]["z"]) and loaded.rows[1]["z"] == 2.0 and loaded.params["k"] == [4, 8]


def test_hash_form_tells_defaults_from_explicit_sizes_and_sorts_keys():
    value = {"n": UpperBound(1024), "b": [float("nan"), float("inf"), float("-inf")], "a": {"y": 1, "x": 2}}
    out = jsonable(value, for_hash=True)
    assert out == {"a": {"x": 2, "y": 1}, "b": ["nan", "inf", "-inf"], "n": {"at_most": 1024}}
    assert list(out) == ["a", "b", "n"] and list(out["a"]) == ["x", "y"]
    assert jsonable(1024, for_hash=True) != jsonable(UpperBound(1024), for_hash=True)
    assert jsonable(UpperBound(1024)) == jsonable(1024) == 1024  # a saved file records the number that ran


def test_hash_of_a_study_option_is_the_one_stored_cells_were_keyed_by():
    """The hash form is the one cells were stored under: the same sha256 as the JSON written out by hand."""
    from geolens.study.plan import _sha

    value = {"k": 8, "n_tokens": UpperBound(512), "ccr": (0, 1), "rho": float("nan"), "path": Path("/m")}
    by_hand = '{"ccr": [0, 1], "k": 8, "n_tokens": {"at_most": 512}, "path": "/m", "rho": "nan"}'
    assert _sha(value) == hashlib.sha256(by_hand.encode()).hexdigest()[:16]


def test_functions_are_their_module_and_name_in_both_forms():
    name = f"{__name__}._loader"
    assert callable_id(_loader) == name and jsonable({"f": _loader}) == {"f": name}
    part = functools.partial(_loader, scale=UpperBound(2))
    assert callable_id(part) == {"partial": name, "args": [], "kwargs": {"scale": {"at_most": 2}}}
    assert jsonable(part) == {"partial": name, "args": [], "kwargs": {"scale": 2}}


@pytest.mark.parametrize("for_hash, expected", [(False, "cpu"), (True, "device(type='cpu')")])
def test_other_objects_are_text(for_hash, expected):
    assert jsonable(torch.device("cpu"), for_hash=for_hash) == expected


def test_text_that_spells_a_non_finite_float_comes_back_as_text(tmp_path):
    rows = [{"layer": 0, "note": "NaN", "z": float("nan")}, {"layer": 1, "note": "Infinity", "z": float("inf")},
            {"layer": 2, "note": "'NaN", "z": float("-inf")}, {"layer": 3, "note": "-Infinity", "z": 1.0}]
    loaded = Result.load(Result(rows=rows, params={"label": "NaN"}).save(tmp_path / "r.json"))
    assert [row["note"] for row in loaded.rows] == ["NaN", "Infinity", "'NaN", "-Infinity"]
    assert math.isnan(loaded.rows[0]["z"]) and loaded.rows[1]["z"] == math.inf and loaded.rows[2]["z"] == -math.inf
    assert loaded.params == {"label": "NaN"}
    assert jsonable("NaN", for_hash=True) == "NaN"  # the hash form, and so every stored cell's hash, is unchanged


@pytest.mark.parametrize("text, message", [("[" * 100_000 + "]" * 100_000, "nested deeper than Python's parser"),
                                           ('{"rows": [' + "7" * 5000 + "]}", "Exceeds the limit")])
def test_a_result_file_too_deep_or_with_a_huge_integer_names_the_file(tmp_path, text, message):
    path = tmp_path / "r.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=f"{path} is not readable JSON: {message}"):
        Result.load(path)
