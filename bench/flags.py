"""Flag values the bench scripts share, checked before any work: a bad one ends the script with
argparse's one line and exit status 2, not a traceback or a table of failed rows."""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import Sequence

from baechi_tf.errors import ConfigError
from baechi_tf.placer.pipeline import PLACEMENT_METHODS, PlacementOptions

__all__ = ["add_saved_model_flags", "at_least", "chosen", "copies_in_flight", "methods", "output_file", "refine_seconds", "saved_models", "sizes"]


def at_least(minimum: int):
    """An argparse ``type``: a whole number of at least `minimum`, else argparse's one-line error."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r}: give a whole number of at least {minimum}")
        return value

    return parse


def copies_in_flight(text: str) -> float:
    """An argparse ``type``: a link's `CommCost.copies_in_flight`, a number >= 1 or 'unlimited'
    (math.inf), else argparse's one-line error."""
    try:
        value = math.inf if text == "unlimited" else float(text)
    except ValueError:
        value = math.nan
    if not value >= 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number >= 1 or 'unlimited'")
    return value


def output_file(text: str) -> str:
    """An argparse ``type``: a file to write at the end of a run, in a folder that is there now
    (else argparse's one-line error before any work, not a traceback after it)."""
    folder = os.path.dirname(os.path.abspath(text))
    if not os.path.isdir(folder):
        raise argparse.ArgumentTypeError(f"{text!r}: give a file name in a folder that exists ({folder} does not)")
    if not text or os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r}: give a file name in a folder that exists, not a folder")
    return text


def chosen(
    parser: argparse.ArgumentParser, text: str, flag: str, choices: Sequence[str], kind: str
) -> list[str]:
    """The names of a comma-separated value, in its order, each one of `choices` (`kind` names
    them in the error: 'method', 'model')."""
    names = [n for n in text.split(",") if n]
    unknown = [n for n in names if n not in choices]
    if unknown or not names:
        parser.error(f"{flag} {text!r}: unknown {kind}(s) {', '.join(unknown) or 'none given'}; "
                     f"choose from {', '.join(choices)}")
    return names


def methods(parser: argparse.ArgumentParser, text: str, flag: str = "--methods") -> list[str]:
    """The placement methods of a comma-separated value, in its order."""
    return chosen(parser, text, flag, sorted(PLACEMENT_METHODS), "method")


def sizes(parser: argparse.ArgumentParser, text: str, flag: str = "--sizes") -> list[int]:
    """The op counts of a comma-separated value, each a whole number of at least 1."""
    try:
        values = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        parser.error(f"{flag} {text!r}: give op counts of at least 1, separated by commas, such as 1000,10000")
    return values


def refine_seconds(parser: argparse.ArgumentParser, value: float) -> float:
    """`--refine_seconds` as `PlacementOptions` takes it (a finite number >= 0)."""
    try:
        PlacementOptions(refine_seconds=value).validate()
    except ConfigError as e:
        parser.error(f"--refine_seconds: {e}")
    return value


def add_saved_model_flags(parser: argparse.ArgumentParser, models: Sequence[str], keras_dir: str) -> None:
    """--models (of `models`, all by default) and --keras_dir (`keras_dir` by default): the graphs
    bench/keras_graphs.py wrote, for `saved_models`."""
    parser.add_argument("--models", default=",".join(models),
                        help="saved graphs, of those in --keras_dir (default: %(default)s)")
    parser.add_argument("--keras_dir", default=keras_dir, help="where bench/keras_graphs.py wrote them")


def saved_models(models: list[str], keras_dir: str) -> list[str]:
    """Those of `models` whose GraphDef bench/keras_graphs.py wrote to `keras_dir`; the others
    are named on stderr with the command that writes them."""
    missing = [m for m in models if not os.path.exists(os.path.join(keras_dir, f"{m}.pb"))]
    if missing:
        print(f"# not in {keras_dir} (write them with bench/keras_graphs.py --models "
              f"{','.join(missing)}): {', '.join(missing)}", file=sys.stderr)
    return [m for m in models if m not in missing]
