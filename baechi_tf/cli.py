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
    """The flags every placing command shares."""
    from baechi_tf.placer.pipeline import ENGINES, LP_SOLVERS, PLACEMENT_METHODS, PlacementOptions

    defaults = PlacementOptions()
    parser.add_argument(
        "--placement_method",
        default=defaults.placement_method,
        type=_placement_method,
        choices=sorted(set(PLACEMENT_METHODS) - {"expert"}),  # no layout to give here
        help="placement algorithm; 'auto' runs every placer, keeps the best simulated placement "
        "and refines it (default: %(default)s)",
    )
    parser.add_argument(
        "--grouper",
        default=defaults.grouper,
        choices=("tf", "coplace"),
        help="'tf': keep TF colocation groups together; 'coplace': also put an op with a single "
        "consumer next to it (default: %(default)s)",
    )
    parser.add_argument(
        "--placer_type",
        default=defaults.placer_type,
        choices=("default", "fusion"),
        help="'fusion' places a graph in which connected ops of one group are fused first "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--sct_threshold",
        type=float,
        default=defaults.sct_threshold,
        help="m-SCT: an LP edge value at or below this makes a favourite child (default: %(default)s)",
    )
    parser.add_argument(
        "--lp_solver",
        default=defaults.lp_solver,
        choices=LP_SOLVERS,
        help="m-SCT's LP solver; 'auto' takes MOSEK when licensed, else HiGHS, else cvxopt "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--lp_time_limit",
        type=float,
        default=defaults.lp_time_limit,
        help="m-SCT: seconds each LP solve may take (HiGHS, MOSEK); with --lp_solver=auto a solver "
        "that fails or runs out of time hands the LP to the next one (default: no limit)",
    )
    parser.add_argument(
        "--refine_seconds",
        type=float,
        default=defaults.refine_seconds,
        help="auto: time for the refinement that moves groups while the simulated step time "
        "drops; 0 turns it off (default: %(default)s)",
    )
    parser.add_argument(
        "--seed", type=int, default=defaults.seed, help="auto: seed of the refinement (default: %(default)s)"
    )
    parser.add_argument(
        "--placement_jobs",
        type=int,
        default=defaults.placement_jobs,
        metavar="N",
        help="auto: worker processes that place its candidates side by side; 0 chooses one per "
        "core on graphs of 4,000 ops or more, 1 places them all in this process; the placement is "
        "the same either way (default: %(default)s)",
    )
    parser.add_argument(
        "--placement_timeout_s",
        type=float,
        default=defaults.placement_timeout_s,
        metavar="SECONDS",
        help="auto: wall-clock seconds after which no further placer starts and refinement stops; "
        "the best placement found by then is kept, with a warning naming what did not run "
        "(default: no limit, so that the same inputs give the same placement on any machine)",
    )
    parser.add_argument(
        "--auto_work",
        type=int,
        default=defaults.auto_work,
        metavar="UNITS",
        help="auto: units of scheduling work (a scheduling step or a dry run of an op on a device; "
        "a copy 1.5) for all of auto: half shared equally by its placers, each stopped when its "
        "runs would pass its share, the rest for refinement (at most what --refine_seconds buys). "
        "The same units give the same placement on any machine (default: each placer 40 units "
        "per op and edge plus 400,000, refinement --refine_seconds' own)",
    )
    parser.add_argument(
        "--engine",
        default=defaults.engine,
        choices=ENGINES,
        help="what runs the list scheduler that m-ETF, m-SCT, the simulator and auto's refinement share: "
        "'native', the compiled core, or 'python', the reference it is tested against; the "
        "placement is the same either way (default: %(default)s; 'python', with a warning, when "
        "the core was not built)",
    )
    parser.add_argument(
        "--report_dir",
        metavar="DIR",
        help="write reports here: gantt.png, memory_<i>.png, trace.json (Perfetto), summary.json "
        "and, for a GraphDef, the placed graph for TensorBoard",
    )
    parser.add_argument(
        "--placer_memory_fraction",
        type=float,
        default=defaults.memory_fraction,
        help="share of each device's memory the placer may fill, in (0, 1] (default: %(default)s)",
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
    from baechi_tf.errors import ConfigError
    from baechi_tf.placer.pipeline import PlacementOptions

    # PlacementOptions calls it 'memory fraction', a name no flag here has (and BaechiSession's
    # memory_fraction= is train.py's --memory_fraction): name the flag the user gave.
    fraction = args.placer_memory_fraction
    if not 0 < fraction <= 1:
        raise ConfigError(
            f"--placer_memory_fraction={fraction:g} must be in (0, 1]: the share of each device's "
            "memory the placer may fill (1 fills it all)"
        )
    options = PlacementOptions(
        placement_method=args.placement_method,
        grouper=args.grouper,
        placer_type=args.placer_type,
        sct_threshold=args.sct_threshold,
        lp_solver=args.lp_solver,
        lp_time_limit=args.lp_time_limit,
        memory_fraction=args.placer_memory_fraction,
        refine_seconds=args.refine_seconds,
        seed=args.seed,
        placement_jobs=args.placement_jobs,
        engine=args.engine,
        placement_timeout_s=args.placement_timeout_s,
        auto_work=args.auto_work,
    )
    options.validate()
    return options


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
