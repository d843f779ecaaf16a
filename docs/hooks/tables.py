"""Writes the tables of the placement methods and of the memory fallback ladder from the code.

As an MkDocs hook (`on_page_markdown`) it replaces the line ``<!-- methods-table -->`` of a page
with `baechi_tf.placer.methods.methods_table()` (the registry of methods) and the line
``<!-- fallback-ladder -->`` with `baechi_tf.placer.ladder.ladder_table()` (the ladder's steps),
so that neither can drift from what runs; run alone it prints both.

    .venv/bin/python docs/hooks/tables.py
"""

from __future__ import annotations

import os
import sys

__all__ = ["LADDER_MARKER", "METHODS_MARKER", "on_page_markdown", "tables"]

METHODS_MARKER = "<!-- methods-table -->"
LADDER_MARKER = "<!-- fallback-ladder -->"

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tables() -> dict[str, str]:
    """Marker -> the Markdown table that replaces it."""
    if _ROOT not in sys.path:
        sys.path.insert(0, _ROOT)
    from baechi_tf.placer.ladder import ladder_table
    from baechi_tf.placer.methods import methods_table

    return {METHODS_MARKER: methods_table(), LADDER_MARKER: ladder_table()}


def on_page_markdown(markdown: str, page, config, files) -> str:  # MkDocs hook
    if METHODS_MARKER not in markdown and LADDER_MARKER not in markdown:
        return markdown
    for marker, table in tables().items():
        markdown = markdown.replace(marker, table)
    return markdown


if __name__ == "__main__":
    print("\n\n".join(tables().values()))
