"""Peak memory offline: the placements of a saved `bench/fidelity_memory.py --save DIR` run (or
`bench/fidelity_memory_tasks.py --save DIR`), simulated again under the current model, against
the peaks that run measured.

For each ``<graph>.json`` in DIR, its GraphDef (``.pb``) and profile (``.profile``) are placed
again with each saved placement as a fixed layout (``expert``, every op where it ran) on the run's
4 stand-ins (of shared memory when the run's were, and of the capacity the placement was made
for), or on its worker tasks, and each device's simulated peak is set
against the peak measured then. It prints one line per device whose figure moved (saved and new
simulated MiB, measured MiB, the new ratio), then `fidelity_memory.summary` of the saved and of
the new figures side by side, and how many devices came out as saved (with the model unchanged:
all of them, the check that the replay is faithful). No TensorFlow session runs: seconds to a
minute.

The measured peaks depend on TF's order of the step, not on the model, so a model's change can
be judged here on the very measurements the saved run took, without the noise of another run's
placements. Only the saved placements can be judged: a model under which a method would place
otherwise needs a measured run (`fidelity_memory.py`).

``--plot FILE.svg`` draws the new figures, one point per device (`fidelity_memory.plot`).

    .venv/bin/python bench/fidelity_memory_resim.py DIR [--graphs rnn,transformer] [--plot FILE.svg]
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import sys
from typing import Any, Callable, Collection, Mapping, Optional, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(BENCH))
sys.path.insert(0, BENCH)

import flags  # noqa: E402

__all__ = ["main", "placed_again", "resimulate", "row_device"]


def placed_again(path: str, only: Optional[Collection[tuple[str, str]]] = None):
    """Yields, per saved placement of the graph ``path`` (its ``.json``) in the saved order, (the
    saved placement's dict: method, limit, fingerprint, op -> device; the `PlacementResult` of
    that layout placed again under the current model on the run's stand-ins; the placed
    GraphDef). With `only`, just the placements whose (method, limit) it holds."""
    import tensorflow as tf

    from fidelity_memory import NUM_DEVICES

    from baechi_tf.cost_model.profile import load_profile
    from baechi_tf.placer.pipeline import PlacementOptions
    from baechi_tf.rewriter.devices import LOCAL_TASK, standin_cluster
    from baechi_tf.rewriter.graph_pass import place_graph_def

    base = path[: -len(".json")]
    with open(path) as f:
        doc = json.load(f)
    graph_def = tf.compat.v1.GraphDef.FromString(open(base + ".pb", "rb").read())
    profile = load_profile(base + ".profile")
    for p in doc["placements"]:
        if only is not None and (p["method"], p["limit"]) not in only:
            continue
        # The stand-ins' capacity as when placed: the simulator holds an op back until its memory
        # is free, so under a tight limit the schedule depends on it.
        capacity = max(r["capacity_bytes"] for r in doc["rows"] if (r["method"], r["limit"]) == (p["method"], p["limit"]))
        options = PlacementOptions(placement_method="expert", expert=p["op_to_device"])
        if doc.get("tasks"):  # bench/fidelity_memory_tasks.py: a device per worker task
            from fidelity_memory_tasks import TASK_DEVICE, task_cluster

            names = tuple(TASK_DEVICE.format(i) for i in range(doc["tasks"]))
            placed, report = place_graph_def(graph_def, profile, task_cluster(names, capacity), options)
        else:
            setup = standin_cluster(NUM_DEVICES, capacity, prefix=LOCAL_TASK, shared_memory=doc["shared_memory"])
            placed, report = place_graph_def(graph_def, profile, setup.cluster, options, host_device=setup.host,
                                             device_aliases=setup.aliases)
        yield p, report.result, placed


def row_device(doc: Mapping[str, Any]) -> Callable[[str], str]:
    """How the rows of a saved run's ``<graph>.json`` name a device: by its task ('task:1') on
    worker tasks (bench/fidelity_memory_tasks.py), by its local name ('device:CPU:1') on
    stand-ins."""
    if doc.get("tasks"):
        from fidelity_memory_tasks import short_name

        return short_name
    from fidelity_memory import _local

    return _local


def resimulate(path: str) -> list[tuple]:
    """Per row of the saved graph ``path`` (its ``.json``): (the saved `fidelity_memory.Row`,
    the same row with the peak simulated again under the current model)."""
    from fidelity_memory import Row

    with open(path) as f:
        doc = json.load(f)
    key = row_device(doc)
    peaks: dict[tuple[str, str], dict[str, int]] = {}  # (method, limit) -> device -> bytes
    for p, result, _ in placed_again(path):
        peaks[(p["method"], p["limit"])] = {
            key(d.name): (int(result.reordered_peak_bytes[i]), int(result.schedule.peak_memory_bytes[i]))
            for i, d in enumerate(result.cluster.devices)}
    out = []
    for saved in doc["rows"]:
        row = Row(**saved)
        new = peaks[(row.method, row.limit)].get(row.device)
        if new is None:
            raise SystemExit(f"{path}: the placement {row.method} {row.limit} has no device {row.device}")
        out.append((row, dataclasses.replace(row, simulated_bytes=new[0], sim_schedule_bytes=new[1])))
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dir", help="a folder written by bench/fidelity_memory.py --save")
    parser.add_argument("--graphs", default="",
                        help="comma-separated names of the saved graphs to take (default: all)")
    parser.add_argument("--plot", metavar="FILE.svg", type=flags.output_file,
                        help="also draw the new simulated peaks against the measured ones, one point "
                        "per device of a placement, into FILE")
    parser.add_argument("--title", default="", help="the plot's title")
    args = parser.parse_args(argv)
    paths = sorted(glob.glob(os.path.join(args.dir, "*.json")))
    if args.graphs:
        wanted = args.graphs.split(",")
        missing = [g for g in wanted if os.path.join(args.dir, g + ".json") not in paths]
        if missing:
            parser.error(f"--graphs: no saved {', '.join(missing)} in {args.dir}")
        paths = [os.path.join(args.dir, g + ".json") for g in wanted]
    if not paths:
        parser.error(f"{args.dir}: no <graph>.json here; write one with bench/fidelity_memory.py --save DIR")

    from baechi_tf._startup import import_tensorflow_quietly

    import_tensorflow_quietly()
    import logging

    logging.getLogger("baechi_tf").setLevel(logging.ERROR)
    from fidelity_memory import MiB, plot, summary

    pairs = []
    for path in paths:
        pairs += resimulate(path)
    same = sum(old.simulated_bytes == new.simulated_bytes for old, new in pairs)
    print(f"{'model':<12} {'method':<7} {'limit':<5} {'device':<12} {'saved MiB':>9} {'now MiB':>9} "
          f"{'meas MiB':>9} {'sim/meas':>8}")
    for old, new in pairs:
        if old.simulated_bytes != new.simulated_bytes:
            print(f"{new.model:<12} {new.method:<7} {new.limit:<5} {new.device:<12} "
                  f"{old.simulated_bytes / MiB:>9.2f} {new.simulated_bytes / MiB:>9.2f} "
                  f"{new.measured_bytes / MiB:>9.2f} {new.ratio:>8.3f}")
    print(f"\n{same} of {len(pairs)} devices simulated as saved")
    for title, rows in (("as saved", [old for old, _ in pairs]), ("now", [new for _, new in pairs])):
        print(f"\n{title}:")
        for line in summary(rows):
            print(f"  {line}")
    if args.plot:
        plot([new for _, new in pairs], args.plot, args.title)
        print(f"\nplot written to {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
