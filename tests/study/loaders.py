"""Model loaders for the study tests: each load is counted in a file (one line per load), and a load can be held."""

from __future__ import annotations

import os
import time
from pathlib import Path

HOLD = "GEOLENS_TEST_HOLD"  # a model folder named here blocks its load (for the kill test)
CRASH_ONCE = "GEOLENS_TEST_CRASH_ONCE"  # a marker file: the first load that finds it missing kills its process


def counting_loader(path: str, counter: str):
    """Boot ``path`` as a bridge, appending its name to ``counter`` first."""
    from geolens.model import boot_bridge

    with open(counter, "a", encoding="utf-8") as handle:
        handle.write(Path(path).name + "\n")
    if os.environ.get(HOLD) == Path(path).name:
        time.sleep(600)  # killed here by the test
    return boot_bridge(path)


def crash_once_loader(path: str, marker: str):
    """The first call (no ``marker`` yet) writes the marker and kills its worker process; later calls load."""
    from geolens.model import boot_bridge

    if not os.path.exists(marker):
        Path(marker).write_text("crashed once")
        os._exit(1)
    return boot_bridge(path)


def loads(counter: Path) -> list[str]:
    return counter.read_text(encoding="utf-8").split() if counter.exists() else []


def path_by_checkpoint(paths: dict, checkpoint):
    """Boot the folder standing for ``checkpoint`` (a local stand-in for a hub model's training revisions)."""
    from geolens.model import boot_bridge

    return boot_bridge(paths[checkpoint])


def kill_spec(paths: dict[str, str], counter: str):
    """The study of the kill test: one model per folder, each load counted."""
    import functools

    from geolens.study import ModelSpec, Study
    from tests.study.conftest import BUDGET, PGA, SPECTRUM, TEXTS

    models = {label: ModelSpec(loader=functools.partial(counting_loader, path, counter)) for label, path in paths.items()}
    return Study(models=models, texts=TEXTS, analyses={"pga": PGA, "spectrum": SPECTRUM}, **BUDGET)


def main() -> None:
    """``python -c 'from tests.study.loaders import main; main()' OUT COUNTER label=path ...``.

    (Not ``python -m``: a loader defined in ``__main__`` has another identity, hence another cell hash.)
    """
    import sys

    from geolens.study import run_study

    out, counter, *pairs = sys.argv[1:]
    run_study(kill_spec(dict(pair.split("=", 1) for pair in pairs), counter), out, progress=False)
