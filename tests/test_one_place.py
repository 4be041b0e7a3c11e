"""One place per decision: seeded random streams (geolens._rng), linear CKA and mutual k-NN
(geolens.metrics.similarity) and atomic writes (geolens._io) are each made in one module. The package's code (its docstrings and
comments left out) is searched for a second one."""

from __future__ import annotations

import io
import re
import tokenize
from collections import Counter
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "geolens"

# rule -> (the one module allowed to do it, the pattern of doing it, what to use instead)
RULES = {
    "seeded generator": (
        "_rng.py",
        r"default_rng|manual_seed|RandomState|\bRandom\s*\(|np\s*\.\s*random\s*\.\s*seed|torch\s*\.\s*Generator\s*\("
        r"|^\s*import\s+random\b|random_state\s*=(?!\s*derived_seed)",
        "geolens._rng.rng(seed, stream) (or seeded_torch / derived_seed), with the stream in _rng.STREAMS",
    ),
    "seed arithmetic": (
        "_rng.py",
        r"\b\w*seed\s*[-+*]\s*\w|\w\s*[-+*]\s*\w*seed\b",
        "a stream of its own in geolens._rng.STREAMS (a salt), or rng(..., part=i) for sub-streams",
    ),
    "similarity measure": (
        "metrics/similarity.py",
        r"(?i)\bdef\s+(\w*_)?(cka|hsic|knn)(_\w*)?\s*\(",  # a function named for CKA, HSIC or k-NN
        "geolens.metrics: linear_cka / cka_matrix, mutual_knn / mutual_knn_matrix",
    ),
    "atomic write": (
        "_io.py",
        r"os\s*\.\s*(replace|rename)\s*\(|shutil\s*\.\s*move\s*\(|mkstemp|NamedTemporaryFile|mkdtemp"
        r"|tempfile\s*\.\s*(?!TemporaryDirectory\b)\w+",
        "geolens._io: atomic_write_text, atomic_file (torch.save, Parquet), atomic_folder (a whole folder)",
    ),
}

# Sites not moved yet (their files are being rewritten elsewhere): (file, rule) -> how many lines at most.
# Remove an entry once its site draws through geolens._rng.
PENDING = {
}


def _code_lines(path: Path) -> dict[int, str]:
    """The file's code by line, strings and comments left out (docstrings and doctests are text, not code)."""
    skipped = {tokenize.STRING, tokenize.COMMENT, *(getattr(tokenize, n) for n in ("FSTRING_MIDDLE",)
                                                    if hasattr(tokenize, n))}
    lines: dict[int, list[str]] = {}
    for token in tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline):
        if token.type not in skipped and token.string.strip():
            lines.setdefault(token.start[0], []).append(token.string)
    return {number: " ".join(parts) for number, parts in lines.items()}


def _sites(rule: str) -> tuple[Counter, list[str]]:
    """``(lines per file, "file:line: code" of each)`` where code outside the rule's module does what it owns."""
    allowed, pattern, _ = RULES[rule]
    regex = re.compile(pattern)
    counts: Counter = Counter()
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        if name == allowed:
            continue
        for number, line in _code_lines(path).items():
            if regex.search(line):
                counts[name] += 1
                found.append(f"geolens/{name}:{number}: {line}")
    return counts, found


def test_the_scanner_reads_code_not_text():
    lines = _code_lines(PACKAGE / "_sampling.py")
    assert not any("seeded_subset(10, 4, seed=0)" in line for line in lines.values())  # its docstring's example
    assert any(line.startswith("def seeded_subset") for line in lines.values())
    assert re.search(RULES["seed arithmetic"][1], "x = base_seed + 1") and re.search(RULES["seed arithmetic"][1],
                                                                                   "g(seed * 100_003 + epoch)")
    assert not re.search(RULES["seed arithmetic"][1], "f(seed = seed , part = 1)")
    similarity = RULES["similarity measure"][1]
    assert re.search(similarity, "def _cka_grid ( clouds_a )") and re.search(similarity, "def _knn_sets ( x , k )")
    assert not re.search(similarity, "def _no_package_installs ( )")
    assert re.search(RULES["atomic write"][1], "tempfile . mkdtemp ( )")
    assert not re.search(RULES["atomic write"][1], "tempfile . TemporaryDirectory ( prefix = )")


@pytest.mark.parametrize("rule", sorted(RULES))
def test_one_module_owns_each_decision(rule):
    counts, found = _sites(rule)
    over = {name: n for name, n in counts.items() if n > PENDING.get((name, rule), 0)}
    assert not over, (f"{rule} outside geolens/{RULES[rule][0]}; use {RULES[rule][2]}:\n"
                      + "\n".join(line for line in found if line.split(":")[0].removeprefix("geolens/") in over))


def test_every_registered_stream_is_drawn_somewhere():
    """A stream in the registry that no code names is stale (the pending sites name theirs in PENDING)."""
    from geolens._rng import STREAMS

    code = "\n".join(line for path in PACKAGE.rglob("*.py") if path.name != "_rng.py"
                     for line in path.read_text(encoding="utf-8").splitlines())
    pending_text = Path(__file__).read_text(encoding="utf-8")
    unused = [name for name in STREAMS if f'"{name}"' not in code and f'"{name}"' not in pending_text]
    assert not unused, f"streams no code draws from: {unused}"
