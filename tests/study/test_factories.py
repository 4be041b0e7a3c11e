"""Short names of model factories in study files: registered by the package that builds the models, never imported
by the study engine."""

from __future__ import annotations

import subprocess
import sys

import pytest

from geolens.study import ModelSpec, Study
from geolens.study import factories


def _member(mine: str, n: int = 1, steps=None) -> ModelSpec:
    return ModelSpec(path=mine, checkpoints=tuple(steps) if steps else (None,), metadata={"n": n})


@pytest.fixture
def registry(monkeypatch):
    monkeypatch.setattr(factories, "_FACTORIES", dict(factories._FACTORIES))
    factories.register_model_factory("mine", _member)
    return factories


def test_a_registered_key_names_a_folder_relative_to_the_study_file(registry, tmp_path):
    (tmp_path / "s.toml").write_text('texts = ["a b c"]\n[models.a]\nmine = "sub/m"\nn = 3\nsteps = ["s1", "s2"]\n'
                                     '[models.b]\nmine = "/abs/m"\n')
    study = Study.from_toml(tmp_path / "s.toml")
    cells = study.cells()
    assert [(c.model, c.checkpoint, c.path) for c in cells] == [
        ("a", "s1", str(tmp_path / "sub" / "m")), ("a", "s2", str(tmp_path / "sub" / "m")), ("b", "main", "/abs/m")]
    assert cells[0].metadata == {"n": 3} and cells[2].metadata == {"n": 1}
    assert set(registry.model_factories()) == {"zoo", "mine"}


def test_keys_are_checked(registry, tmp_path):
    registry.register_model_factory("mine", _member)  # the same factory again: nothing changes
    reloaded = lambda mine: _member(mine)  # noqa: E731 -- the same module and name, a new object (a reload)
    reloaded.__qualname__ = _member.__qualname__
    registry.register_model_factory("mine", reloaded)
    assert registry.model_factories()["mine"] is reloaded
    with pytest.raises(ValueError, match="key 'mine' is taken by tests.study.test_factories._member"):
        registry.register_model_factory("mine", print)
    with pytest.raises(ValueError, match="key 'path' is a key of every model table"):
        registry.register_model_factory("path", _member)
    with pytest.raises(ValueError, match="lower-case name"):
        registry.register_model_factory("My Zoo", _member)
    with pytest.raises(TypeError, match="factory must be callable"):
        registry.register_model_factory("other", "module:function")
    (tmp_path / "s.toml").write_text('texts = ["a b c"]\n[models.a]\nmine = "m"\nzoo = "z"\n')
    with pytest.raises(ValueError, match=r"give exactly one of path=, hub=, loader=, factory=, zoo=, mine=; "
                                         r"got \['zoo', 'mine'\]"):
        Study.from_toml(tmp_path / "s.toml").cells()
    (tmp_path / "s.toml").write_text('texts = ["a b c"]\n[models.a]\nmine = "m"\nwidth = 3\n')
    with pytest.raises(ValueError, match="model 'a': .*unexpected keyword argument 'width'"):
        Study.from_toml(tmp_path / "s.toml").cells()


def test_importing_any_geolens_module_registers_the_zoo():
    # geolens/__init__ imports the zoo, which registers its key with the study engine below it
    code = ("from geolens.study.factories import model_factories\n"
            "registered = model_factories()\n"
            "from geolens.zoo.members import zoo_member\n"
            "print(registered == {'zoo': zoo_member})\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["True"]


def test_loader_and_factory_strings_use_the_one_importer(tmp_path):
    """``loader =`` and ``factory =`` resolve like analyses' ``function =`` (one importer), naming model and key."""
    from tests.study.loaders import counting_loader

    (tmp_path / "s.toml").write_text('texts = ["a b c"]\n[models.a]\nloader = "tests.study.loaders:counting_loader"\n'
                                     'kwargs = { path = "p", counter = "c" }\n'
                                     '[models.b]\nfactory = "tests.study.test_factories:_member"\n'
                                     'args = { mine = "m", n = 2 }\n')
    a, b = Study.from_toml(tmp_path / "s.toml").cells()
    assert a.loader.func is counting_loader and a.loader.keywords == {"path": "p", "counter": "c"}
    assert b.path == "m" and b.metadata == {"n": 2}
    for key, text, match in (("loader", "no_colon", "model 'a': loader = 'no_colon' must be 'module:function'"),
                             ("factory", "nowhere:thing", "model 'a': cannot import 'nowhere:thing'"),
                             ("loader", "tests.study.loaders:HOLD", "model 'a': 'tests.study.loaders:HOLD' is a str")):
        (tmp_path / "bad.toml").write_text(f'texts = ["a"]\n[models.a]\n{key} = "{text}"\n')
        with pytest.raises((ValueError, TypeError), match=match):
            Study.from_toml(tmp_path / "bad.toml").cells()
