"""Writes the ``baechi`` command's reference from its argparse parsers, so that it cannot drift.

`cli_reference()` renders `baechi_tf.cli.build_parser()` and each subcommand's parser as
Markdown: usage, then one table row per flag with its choices and help (defaults filled in as
``--help`` shows them). As an MkDocs hook (`on_page_markdown`) it replaces the line
``<!-- cli-reference -->`` of a page with that text; run alone it prints it.

    .venv/bin/python docs/hooks/cli_reference.py
"""

from __future__ import annotations

import argparse
import os
import sys

__all__ = ["MARKER", "cli_reference", "on_page_markdown"]

MARKER = "<!-- cli-reference -->"

_WIDTH = 100
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _parser() -> argparse.ArgumentParser:
    if _ROOT not in sys.path:
        sys.path.insert(0, _ROOT)
    from baechi_tf.cli import build_parser

    return build_parser()


def _cell(text: str) -> str:
    """`text` on one line, safe in a Markdown table cell (no HTML tags, emphasis or cell breaks)."""
    text = " ".join(text.split())
    for raw, safe in (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ("|", "\\|"), ("*", "\\*")):
        text = text.replace(raw, safe)
    return text


def _flag_rows(parser: argparse.ArgumentParser) -> list[str]:
    formatter = argparse.HelpFormatter(prog=parser.prog, width=_WIDTH)
    rows = ["| flag | values | meaning |", "|---|---|---|"]
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        names = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.metavar or action.dest}`"
        if action.choices is not None:
            values = " ".join(f"`{c}`" for c in action.choices)
        elif action.nargs == 0:
            values = ""
        else:
            metavar = action.metavar or action.dest.upper()
            values = f"`{metavar} ...`" if action.nargs in ("+", "*") else f"`{metavar}`"
        help_text = formatter._expand_help(action) if action.help else ""
        if action.required and action.option_strings:
            help_text = "required; " + help_text
        rows.append(f"| {names} | {values} | {_cell(help_text)} |")
    for group in parser._mutually_exclusive_groups:
        members = " and ".join(f"`{a.option_strings[0]}`" for a in group._group_actions)
        need = "exactly one" if group.required else "at most one"
        rows.append("")
        rows.append(f"Of {members}, give {need}.")
    return rows


def _usage(parser: argparse.ArgumentParser) -> list[str]:
    # A fixed width, not the terminal's: the page is the same wherever it is built.
    formatter = argparse.HelpFormatter(prog=parser.prog, width=_WIDTH)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups, prefix="")
    usage = formatter.format_help().strip()
    return ["```", usage, "```"]


def cli_reference() -> str:
    """The Markdown reference of ``baechi`` and its subcommands."""
    parser = _parser()
    lines = ["## `baechi`", "", _cell(parser.description or ""), ""]
    lines += _usage(parser) + [""] + _flag_rows(parser) + [""]
    if parser.epilog:
        lines += [_cell(parser.epilog), ""]
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, sub in subparsers.choices.items():
        lines += [f"## `baechi {name}`", "", _cell(sub.description or ""), ""]
        lines += _usage(sub) + [""] + _flag_rows(sub) + [""]
    return "\n".join(lines)


def on_page_markdown(markdown: str, page, config, files) -> str:  # MkDocs hook
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, cli_reference())


if __name__ == "__main__":
    print(cli_reference())
