"""The documentation site: `mkdocs build --strict` passes, and the CLI page covers every flag.

A broken link, a page left out of the nav, a bad mkdocstrings reference or any other MkDocs
warning fails `test_site_builds_strictly`. The README's links into docs/ must name pages that
exist.
"""

import argparse
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "docs", "hooks"))

import cli_reference  # noqa: E402  (docs/hooks/cli_reference.py)


@pytest.mark.slow
def test_site_builds_strictly(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        # Not --quiet: it raises the log level past the warnings that --strict counts, and the
        # build then passes whatever they say (a broken anchor, a page left out of the nav).
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "WARNING" not in output and "ERROR" not in output, output
    cli_page = (tmp_path / "site" / "cli" / "index.html").read_text()
    assert cli_reference.MARKER not in cli_page
    assert "baechi place-json" in cli_page


def _parsers():
    from baechi_tf.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return [("baechi", parser), *((f"baechi {name}", p) for name, p in sub.choices.items())]


def test_cli_reference_lists_every_flag_of_every_command():
    text = cli_reference.cli_reference()
    for title, parser in _parsers():
        section = text.split(f"## `{title}`\n", 1)[1].split("\n## ", 1)[0]
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction) or not action.option_strings:
                continue
            for flag in action.option_strings:
                assert f"`{flag}`" in section, (title, flag)


def test_cli_reference_does_not_depend_on_the_terminal(monkeypatch):
    monkeypatch.setenv("COLUMNS", "40")
    narrow = cli_reference.cli_reference()
    monkeypatch.setenv("COLUMNS", "300")
    assert cli_reference.cli_reference() == narrow


def test_readme_links_into_docs_name_existing_pages():
    with open(os.path.join(ROOT, "README.md")) as f:
        readme = f.read()
    links = re.findall(r"\]\((docs/[^)#\s]+)", readme)
    assert links, "the README links into docs/"
    for link in links:
        assert os.path.isfile(os.path.join(ROOT, link)), link
