"""geolens._io's atomic folders: a folder at the target is the old one, the new one, or none; no staging is
left behind; a concurrent writer's whole folder is kept. (Atomic files: tests/test_bad_input.py.)"""

from __future__ import annotations

import os

import pytest
import torch

from geolens import _io
from geolens.data import models


def test_publish_replaces_debris_and_keeps_a_finished_folder(tmp_path):
    target = tmp_path / "model"
    target.mkdir()
    (target / "half.bin").write_bytes(b"x")  # no marker: debris
    staging = tmp_path / "staging"
    staging.mkdir()
    (staging / models._MARKER).write_text("{}")
    _io.publish_folder(staging, target, keep=models._model_is_complete)
    assert models._model_is_complete(target) and not (target / "half.bin").exists()

    late = tmp_path / "late"
    late.mkdir()
    (late / models._MARKER).write_text("{}")
    (late / "other.bin").write_bytes(b"y")
    _io.publish_folder(late, target, keep=models._model_is_complete)  # a concurrent winner is kept, no error
    assert not (target / "other.bin").exists()


def test_stale_staging_folders_are_removed(tmp_path):
    target = tmp_path / "model"
    old, fresh = tmp_path / ".model-tmp-old", tmp_path / ".model-tmp-new"
    other = tmp_path / ".other-tmp-old"  # another target's: not this one's to remove
    for folder in (old, fresh, other):
        folder.mkdir()
    os.utime(old, (0, 0))
    os.utime(other, (0, 0))
    _io.remove_stale_staging(target)
    assert not old.exists() and fresh.exists() and other.exists()


def test_atomic_folder_replaces_the_old_folder_and_leaves_no_staging(tmp_path):
    target = tmp_path / "out" / "step10"
    with _io.atomic_folder(target) as staging:
        assert not staging.exists() and staging.name == "step10" and staging.parent.parent == target.parent
        staging.mkdir()
        (staging / "a.txt").write_text("first")
        (staging.parent / "scratch.bin").write_bytes(b"s")  # the staging folder is scratch space
    assert (target / "a.txt").read_text() == "first"
    with _io.atomic_folder(target) as staging:
        staging.mkdir()
        (staging / "b.txt").write_text("second")
    assert sorted(p.name for p in target.iterdir()) == ["b.txt"]
    assert sorted(p.name for p in target.parent.iterdir()) == ["step10"]


def test_atomic_folder_keeps_the_old_folder_when_the_writer_fails(tmp_path):
    target = tmp_path / "model"
    with _io.atomic_folder(target) as staging:
        staging.mkdir()
        (staging / "config.json").write_text("{}")
    with pytest.raises(RuntimeError, match="killed"):
        with _io.atomic_folder(target) as staging:
            staging.mkdir()
            (staging / "config.json").write_text("half")
            raise RuntimeError("killed")
    assert (target / "config.json").read_text() == "{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
    with pytest.raises(FileNotFoundError):  # the writer made nothing: nothing to publish
        with _io.atomic_folder(target):
            pass
    assert (target / "config.json").read_text() == "{}" and sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_atomic_folder_keeps_a_concurrent_writers_whole_folder(tmp_path):
    target = tmp_path / "model"

    def whole(path):
        return (path / "done").is_file()

    with _io.atomic_folder(target, keep=whole) as staging:
        staging.mkdir()
        (staging / "mine").write_text("1")
        target.mkdir()  # another process publishes first
        (target / "done").write_text("")
    assert sorted(p.name for p in target.iterdir()) == ["done"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_atomic_folder_refuses_a_file_in_the_way(tmp_path):
    (tmp_path / "model").write_text("a file")
    with pytest.raises(ValueError, match="is a file"):
        with _io.atomic_folder(tmp_path / "model"):
            pass
    assert (tmp_path / "model").read_text() == "a file"


def test_atomic_file_takes_a_torch_save(tmp_path):
    path = tmp_path / "resume.pt"
    with _io.atomic_file(path) as tmp:
        torch.save({"step": 3}, tmp)
    assert torch.load(path)["step"] == 3 and sorted(p.name for p in tmp_path.iterdir()) == ["resume.pt"]
