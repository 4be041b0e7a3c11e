"""The examples run end to end (--small, on the real default model: slow) and import cleanly (fast)."""

import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import load_script

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = {
    "first_tour": ("PGA z by layer", "first_tour_pga.html"),
    "custom_hook": ("blocks.12.ln2.hook_out: PGAScore", "effective rank"),
    "custom_analysis": ("report section mlp_share:", "mlp_share.mlp_share", "pga.z"),
    "patching_default_model": ("resid_pre: fraction of the clean logit diff restored", "readout V_k"),
    "pc1_ablation": ("cross-entropy", "z_ablated"),
    "zoo_width_study": ("PGA z by relative depth", "zoo.html", "eval_loss"),
}


def _load(name):
    return load_script(f"examples/{name}.py", f"example_{name}")  # the __main__ block does not run


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_imports_and_has_main_small(name):
    module = _load(name)
    assert list(inspect.signature(module.main).parameters) == ["small"]
    assert module.__doc__ and "--small" in module.__doc__


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_runs_small(name):
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / f"{name}.py"), "--small"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for expected in EXAMPLES[name]:
        assert expected in proc.stdout, proc.stdout[-3000:]
