"""The ``baechi`` command (also ``python -m baechi_tf``).

Subcommands:
  place-json  place an op graph given as JSON (no TensorFlow needed)
  place       place a TensorFlow GraphDef or MetaGraphDef with a cost profile or traced runs

Errors in the input end the command with one line on stderr and exit status 2; nothing is
written to ``--out`` then.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import signal
import sys
from typing import Optional, Sequence

from baechi_tf import interrupts
from baechi_tf._startup import collector_paused, exit_now

__all__ = ["main", "add_placement_arguments", "options_from_args"]

# name -> (module, one-line help). Each module has add_arguments(parser) and run(args) -> int,
# and imports TensorFlow only inside run(), so that `baechi --help` stays fast.
_SUBCOMMANDS = {
    "place-json": ("baechi_tf.cli", "place an op graph given as JSON (no TensorFlow needed)"),
    "place": ("baechi_tf.rewriter.cli_place", "place a TensorFlow GraphDef with a cost profile or traced runs"),
}


def add_placement_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags every placing command shares: those of `baechi_tf.options.FLAGS`, and
    ``--report_dir``. ``--placement_method`` has no 'expert' here: no layout can be given."""
    from baechi_tf.options import add_arguments

    add_arguments(parser, types={"placement_method": _placement_method}, without={"placement_method": ("expert",)})
    parser.add_argument(
        "--report_dir",
        metavar="DIR",
        help="write reports here: gantt.png, memory_<i>.png, trace.json (Perfetto), summary.json "
        "and, for a GraphDef, the placed graph for TensorBoard",
    )


def _placement_method(name: str) -> str:
    """--placement_method's value; 'expert', which needs a layout these commands cannot be given,
    is refused with where it works."""
    if name == "expert":
        raise argparse.ArgumentTypeError(
            "'expert' places by a model's own hand layout, which this command cannot be given: it "
            "works in train.py and with PlacementOptions(expert={op name: device}) in Python; here "
            "choose another method, such as auto (ops the graph pins stay where pinned with any)"
        )
    return name


def options_from_args(args: argparse.Namespace):
    """The `PlacementOptions` of the flags of `add_placement_arguments`, validated
    (`baechi_tf.options.options_from`)."""
    from baechi_tf.options import FLAGS, options_from

    return options_from({flag.flag: getattr(args, flag.flag) for flag in FLAGS})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``place-json``."""
    parser.add_argument("graph", metavar="GRAPH.json", help="op graph, devices and costs (schema in docs/json.md)")
    add_placement_arguments(parser)
    parser.add_argument(
        "--out", metavar="P.json", help="write the placement and its figures here as JSON"
    )


def run(args: argparse.Namespace) -> int:
    """``place-json``: read, place, write ``--out`` and the reports, print the summary."""
    from baechi_tf._files import atomic_write
    from baechi_tf.json_io import load_graph_json, result_to_json
    from baechi_tf.placer.pipeline import place
    from baechi_tf.report import summary_table

    options = options_from_args(args)
    check_outputs(args, inputs=(args.graph,))
    graph, cluster = load_graph_json(args.graph)
    result = place(graph, cluster, options)
    if args.out:
        atomic_write(args.out, json.dumps(result_to_json(result), indent=1, sort_keys=True) + "\n")
        args.written.append(args.out)
    if args.report_dir:
        from baechi_tf.reports import write_reports

        write_reports(result, args.report_dir)
        args.written.append(args.report_dir)
    print(summary_table(result))
    if args.out:
        print(f"placement written to {args.out}")
    if args.report_dir:
        print(f"reports written to {args.report_dir}")
    return 0


def check_outputs(args: argparse.Namespace, inputs: tuple[str, ...]) -> None:
    """Refuses, before any work, an ``--out`` that cannot be written or is one of `inputs`, and
    a ``--report_dir`` that cannot be made or is ``--out`` or inside it."""
    from baechi_tf._files import check_apart, check_report_folder, check_writable
    from baechi_tf.errors import ConfigError

    for flag, value in (("--out", args.out), ("--report_dir", args.report_dir)):
        if value is not None and not value.strip():
            raise ConfigError(f"{flag} is empty; give a path, or leave the flag out")
    if args.out:
        check_writable(args.out, "--out", inputs)
    if args.report_dir:
        if args.out:
            check_apart(args.report_dir, "--report_dir", args.out, "--out")
        check_report_folder(args.report_dir, "--report_dir", keep=(*inputs, args.out or ""))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="baechi",
        description="Places the ops of a dataflow graph on several devices under each device's "
        "memory limit, with the algorithms of Baechi (SoCC 2020).",
        epilog="Long work (auto's placers, refinement, m-SCT's LP, list scheduling and "
        "simulation of large graphs) shows a progress bar on a "
        "terminal's stderr; BAECHI_TF_PROGRESS=0 turns bars off, BAECHI_TF_PROGRESS=1 shows them "
        "on any stderr.",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress and timings")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_text) in _SUBCOMMANDS.items():
        sp = sub.add_parser(name, help=help_text, description=help_text)
        # Also after the command (baechi place-json g.json -v); SUPPRESS keeps the one given first.
        sp.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="log progress and timings")
        importlib.import_module(module).add_arguments(sp)
        sp.set_defaults(_module=module)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    args.written = []  # outputs each command has written, whole, so far
    prog = f"baechi {args.command}"
    try:
        with interrupts.recording(), collector_paused():
            return importlib.import_module(args._module).run(args)
    except BrokenPipeError:  # stdout's reader went away (`| head`); the outputs are written
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit's flush
        return 128 + signal.SIGPIPE
    except BaseException as e:
        written = f" after writing {' and '.join(args.written)}" if args.written else "; nothing was written"
        return interrupts.exit_status(e, interrupted=f"{prog}: interrupted{written}", failed=f"{prog}: error: ")


def console_main() -> None:
    """The ``baechi`` program: `main`, whose outputs are written and closed when it returns, then
    `exit_now` (no second of TensorFlow's teardown after the work is done)."""
    exit_now(main())


if __name__ == "__main__":
    console_main()
