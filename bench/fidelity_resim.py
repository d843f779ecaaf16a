"""Step time offline: the placements of a saved `bench/fidelity_time.py --save DIR` run,
simulated again under the current model, against the steps that run measured.

For each ``<graph>.json`` in DIR, its GraphDef (``.pb``) and profile (``.profile``) are placed
again with each saved placement as a fixed layout (``expert``, every op where it ran) on the two
CPU:0 devices of the run's worker tasks, with the run's link, and each device's
`Device.sends_on_compute` as ``--sends_on_compute`` says and the link's
`CommCost.copies_in_flight` as ``--copies_in_flight`` does (default: the run's own, 1 for runs
saved before the link had it). `fidelity_time.print_graph` and `print_summary` then print the
table and the figures, with the simulated step of this model and the measured steps as saved.
``--sends_on_compute=off --copies_in_flight=1`` gives the model of the saved run's simulated
steps of runs saved before those were modelled (a check: they come out the same). No TensorFlow
session runs: seconds.
``--plot FILE.svg`` draws simulated against measured step, one point per placement, a colour per
graph (`plot`), for docs/fidelity.md.

Only what the saved placements measured can be judged: a model that would make `auto` choose
another placement needs a measured run (`fidelity_time.py`) to be judged on that.

    .venv/bin/python bench/fidelity_resim.py DIR [--sends_on_compute on|off]
        [--copies_in_flight K|unlimited] [--dispatch_us X]
        [--plot FILE.svg] [--title TEXT]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import textwrap
from typing import Optional, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import flags  # noqa: E402  (bench/flags.py: no TensorFlow)

__all__ = ["main", "plot", "resimulate"]

_TASKS = ("/job:worker/replica:0/task:0/device:CPU:0", "/job:worker/replica:0/task:1/device:CPU:0")


def resimulate(path: str, sends_on_compute: bool, dispatch_us: float = 0.0,
               copies_in_flight: Optional[float] = None) -> list:
    """The `fidelity_time.Measured` rows of the saved graph ``path`` (its ``.json``), each
    simulated again under the current model (`dispatch_us` added to every profiled op's time,
    the link's `CommCost.copies_in_flight` as given; None: as saved, 1 if not saved)."""
    import dataclasses

    from fidelity_time import MEMORY_BYTES, Measured

    from baechi_tf.cluster import Cluster, CommCost, Device
    from baechi_tf.cost_model.profile import load_profile
    from baechi_tf.placer.pipeline import PlacementOptions
    from baechi_tf.rewriter.graph_pass import place_graph_def
    import tensorflow as tf

    base = path[: -len(".json")]
    with open(path) as f:
        doc = json.load(f)
    graph_def = tf.compat.v1.GraphDef.FromString(open(base + ".pb", "rb").read())
    profile = load_profile(base + ".profile")
    if dispatch_us:
        profile = dataclasses.replace(profile, ops={
            name: dataclasses.replace(op, compute_us=op.compute_us + dispatch_us)
            for name, op in profile.ops.items()})
    names = sorted({d for p in doc["placements"] for d in p["op_to_device"].values()})
    if len(names) > 2:
        raise SystemExit(f"{path}: the placements use {len(names)} devices; fidelity_time runs on 2")
    devices = tuple(Device(n, MEMORY_BYTES, "CPU", sends_on_compute=sends_on_compute)
                    for n in (names if len(names) == 2 else _TASKS))
    slope, intercept, *saved = doc["comm"]  # [slope, intercept, copies in flight] since it is fitted
    if copies_in_flight is None:
        copies_in_flight = saved[0] if saved else 1.0
    cluster = Cluster(devices, CommCost(slope, intercept, copies_in_flight))
    rows = []
    for p in doc["placements"]:
        options = PlacementOptions(placement_method="expert", expert=p["op_to_device"])
        _, report = place_graph_def(graph_def, profile, cluster, options)
        row = Measured(doc["graph"], p["method"], p["chosen"], report.makespan_us / 1e3, report,
                       list(p["times_s"]))
        row.same_as = next((r.method for r in rows
                            if (r.report.result.placement.device_of
                                == report.result.placement.device_of).all()), "")
        rows.append(row)
    return rows


def plot(rows: Sequence, path: str, title: str = "") -> None:
    """Writes an SVG (or any format matplotlib knows from `path`'s suffix) of `rows`: measured
    against simulated step per placement, log axes, the line where they are equal."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 5.2))
    graphs = sorted({r.graph for r in rows})
    for g in graphs:
        own = [r for r in rows if r.graph == g]
        ax.scatter([r.sim_ms for r in own], [r.measured_ms for r in own], label=g, s=22)
    values = [v for r in rows for v in (r.sim_ms, r.measured_ms)]
    lo, hi = min(values) / 1.3, max(values) * 1.3
    ax.plot([lo, hi], [lo, hi], color="grey", linewidth=0.8, label="measured = simulated")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("simulated step (ms)")
    ax.set_ylabel("measured step, median (ms)")
    ax.set_title(textwrap.fill(title, 80), fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, metadata={"Date": None} if path.endswith(".svg") else None)
    plt.close(fig)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dir", help="a folder written by bench/fidelity_time.py --save")
    parser.add_argument("--sends_on_compute", choices=("on", "off"), default="on",
                        help="whether the worker tasks' devices send on their compute thread "
                        "(default: %(default)s, as fidelity_time.py's devices)")
    parser.add_argument("--copies_in_flight", type=flags.copies_in_flight, default=None,
                        metavar="K|unlimited",
                        help="how many copies' fixed costs the link overlaps, a number >= 1 "
                        "(default: the saved run's, 1 when it has none)")
    parser.add_argument("--dispatch_us", type=float, default=0.0,
                        help="microseconds added to every op's profiled time (default: 0)")
    parser.add_argument("--plot", default=None, metavar="FILE.svg", type=flags.output_file,
                        help="also draw simulated against measured step per placement into FILE")
    parser.add_argument("--title", default="", help="the plot's title")
    args = parser.parse_args(argv)
    paths = sorted(glob.glob(os.path.join(args.dir, "*.json")))
    if not paths:
        parser.error(f"{args.dir} holds no <graph>.json: give a folder of fidelity_time.py --save")

    from baechi_tf._startup import import_tensorflow_quietly

    import_tensorflow_quietly()
    from fidelity_time import print_graph, print_summary

    all_rows, per_graph = [], {}
    for path in paths:
        rows = resimulate(path, args.sends_on_compute == "on", args.dispatch_us,
                          args.copies_in_flight)
        per_graph[rows[0].graph] = print_graph(rows)
        all_rows += rows
        print()
    print_summary(all_rows, per_graph)
    if args.plot:
        plot(all_rows, args.plot, args.title)
        print(f"plot written to {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
