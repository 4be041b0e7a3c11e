"""A study process killed (SIGKILL) after its first finished cell: the rerun recomputes nothing finished."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from geolens.study import load_results, run_study
from tests.study.loaders import HOLD, kill_spec, loads

ROOT = Path(__file__).resolve().parents[2]


def test_killed_run_loses_no_finished_cell_and_recomputes_none(family, tmp_path):
    out, counter = tmp_path / "out", tmp_path / "loads.txt"
    paths = {label: str(family[label]) for label in ("w16", "w24", "w32")}
    env = {**os.environ, HOLD: "w24", "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen([sys.executable, "-c", "from tests.study.loaders import main; main()", str(out), str(counter),
                                *(f"{label}={path}" for label, path in paths.items())],
                               cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    first = out / "cells" / "model=w16" / "checkpoint=main"
    deadline = time.monotonic() + 300
    try:
        while not list(first.glob("part-*.parquet")) or loads(counter) != ["w16", "w24"]:
            assert process.poll() is None, process.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the first cell did not finish in time"
            time.sleep(0.2)
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
    assert process.returncode == -signal.SIGKILL
    finished = list(first.glob("part-*.parquet"))
    stamp = finished[0].stat().st_mtime_ns
    assert not list((out / "cells").glob("model=w24/*/part-*.parquet"))  # held when killed
    assert set(load_results(out).model) == {"w16"}  # readable as it is

    rerun = run_study(kill_spec(paths, str(counter)), out, progress=False)
    assert rerun.params["skipped"] == ["w16/main"] and rerun.params["computed"] == ["w24/main", "w32/main"]
    assert loads(counter) == ["w16", "w24", "w24", "w32"]  # w16 was loaded once, before the kill
    assert finished[0].stat().st_mtime_ns == stamp
    assert list(dict.fromkeys(load_results(out).model)) == ["w16", "w24", "w32"]
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]
