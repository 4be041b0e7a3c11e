"""The command line's own texts: ``geolens --version`` and every ``--help`` (plain text, real defaults)."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

import geolens
from geolens.cli import build_parser, main
from geolens.report import DEFAULT_SECTIONS, QUICK, ReportSettings


def _help_texts() -> dict[str, str]:
    """Every parser's --help, keyed by its command line ("geolens", "geolens report", "geolens zoo train", ...)."""
    texts: dict[str, str] = {}

    def walk(parser: argparse.ArgumentParser, name: str) -> None:
        texts[name] = parser.format_help()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    walk(sub, f"{name} {sub_name}")

    walk(build_parser(), "geolens")
    return texts


def test_version_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out.strip() == f"geolens {geolens.__version__}"


def test_version_from_the_command_line():
    run = subprocess.run([sys.executable, "-m", "geolens", "--version"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == f"geolens {geolens.__version__}"


def test_every_command_has_help():
    texts = _help_texts()
    assert {"geolens", "geolens report", "geolens zoo", "geolens zoo train", "geolens zoo report",
            "geolens study", "geolens study run", "geolens study report"} <= set(texts)


@pytest.mark.parametrize("name", sorted(_help_texts()))
def test_help_has_no_rest_markup(name):
    text = _help_texts()[name]
    assert "``" not in text, f"{name} --help shows reST double backticks"
    assert ":func:" not in text and ":class:" not in text and ":mod:" not in text


def test_report_help_states_the_real_defaults():
    text = " ".join(_help_texts()["geolens report"].split())  # argparse wraps lines
    # Every section runs by default; the help must say so, and name each section.
    assert "(default: all of them)" in text
    for name in DEFAULT_SECTIONS:
        assert name in text
    assert "all but" not in text
    defaults = ReportSettings()
    assert f"--n-tokens N_TOKENS token positions sampled (default: {defaults.n_tokens}; --quick: {QUICK['n_tokens']})" in text
    assert f"(default: {defaults.lens_n_tokens})" in text and "--lens-n-tokens" in text
    assert "--ccr CCR" in text and "default: 1,5,10" in text


def test_zoo_report_help_states_its_defaults():
    from geolens.zoo.width_study import ZooReportSettings
    from geolens.zoo.train import ZooConfig

    text = " ".join(_help_texts()["geolens zoo report"].split())
    settings, quick, config = ZooReportSettings(), ZooReportSettings.quick(), ZooConfig()
    assert f"(default: {settings.n_tokens}; --quick: {quick.n_tokens})" in text
    assert f"(default: {settings.lens_max_steps}; --quick: {quick.lens_max_steps})" in text
    assert f"(default: {','.join(map(str, config.widths))})" in text
    assert f"blocks per model (default: {config.n_layers})" in text
    assert "(default: out/zoo)" in text and "(default: all)" in text
    # Every option of `zoo report` but the switches says its default.
    parser = build_parser()._subparsers._group_actions[0].choices["zoo"]._subparsers._group_actions[0].choices["report"]
    for action in parser._actions:
        if action.option_strings and action.nargs != 0 and action.dest != "help":
            assert "default" in (action.help or ""), f"{action.option_strings} --help gives no default"
