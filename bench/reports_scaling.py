"""Time of `--report_dir` (`baechi_tf.reports.write_reports`) as the devices grow: a seeded
layered graph (`bench/layered.py`) placed on 4 to 1,024 devices of 1 GiB (m-TOPO by default:
it spreads the ops over most devices, so that every row of the Gantt chart holds ops, and it
places 1,024 devices in about a second).

Prints, per device count, the seconds of each part of the reports: the memory timeline and the
critical path they draw from (`prep`), ``gantt.png`` and its size in pixels, every
``memory_<i>.png``, ``trace.json``, the placed graph for TensorBoard (``graph.pbtxt`` and the
events file, of a GraphDef of NoOps that mirrors the graph) and ``summary.json``; then
`write_reports` as a whole, into a fresh folder. Placing is not counted.

    .venv/bin/python bench/reports_scaling.py [--devices 4,16,64,256,1024] [--ops 2000] [--method m_topo]
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import tempfile
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import flags  # noqa: E402


def graph_def_of(graph, result):
    """A GraphDef of NoOps with the graph's names, edges and placed devices."""
    from tensorflow.core.framework import graph_pb2

    graph_def = graph_pb2.GraphDef()
    inputs: list[list[str]] = [[] for _ in range(graph.num_ops)]
    for src, dst in zip(graph.edge_src.tolist(), graph.edge_dst.tolist()):
        inputs[dst].append("^" + graph.names[src])
    names = result.cluster.names
    for op, device in enumerate(result.placement.device_of.tolist()):
        graph_def.node.add(name=graph.names[op], op="NoOp", input=inputs[op], device=names[device])
    return graph_def


def png_size(png: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk."""
    return struct.unpack(">II", png[16:24])


def one(num_ops: int, devices: int, method: str) -> dict:
    from google.protobuf import text_format

    from baechi_tf import reports
    from baechi_tf.cluster import Cluster
    from baechi_tf.placer.memory_timeline import memory_timeline
    from baechi_tf.placer.pipeline import PlacementOptions, place
    from layered import layered_graph

    graph = layered_graph(num_ops, seed=0)
    cluster = Cluster.homogeneous(devices, 1 << 30)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # more devices than a placement can use: said, not news here
        result = place(graph, cluster, PlacementOptions(placement_method=method))
    graph_def = graph_def_of(graph, result)
    times: dict[str, float] = {}

    def timed(part, fn, *args, **kwargs):
        t = time.perf_counter()
        value = fn(*args, **kwargs)
        times[part] = time.perf_counter() - t
        return value

    memory, critical = timed(
        "prep", lambda: (memory_timeline(graph, cluster, result.schedule),
                         result.schedule.critical_chain(graph, cluster)))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from font")
        gantt = timed("gantt", reports._gantt_png, result, *critical)
        pngs = timed("memory", reports._memory_pngs, result, memory)
    assert len(pngs) == devices
    timed("trace", lambda: reports._trace_json(
        reports.chrome_trace(result, memory=memory, critical=critical)))
    timed("graph", lambda: (text_format.MessageToString(graph_def), reports._graph_events(graph_def)))
    timed("summary", lambda: json.dumps(reports.summary(result, critical[0]), indent=1, sort_keys=True))
    with tempfile.TemporaryDirectory() as tmp:
        timed("total", reports.write_reports, result, os.path.join(tmp, "reports"), graph_def=graph_def)
    width, height = png_size(gantt)
    used = len(set(result.placement.device_of.tolist()))
    return {"devices": devices, "used": used, "transfers": len(result.schedule.transfers),
            "width": width, "height": height, **times}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", default="4,16,64,256,1024",
                        help="comma-separated device counts (default: %(default)s)")
    parser.add_argument("--ops", type=int, default=2000, help="ops of the graph (default: %(default)s)")
    parser.add_argument("--method", default="m_topo", help="placement method (default: %(default)s)")
    args = parser.parse_args()
    try:
        counts = [int(n) for n in args.devices.split(",") if n.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        parser.error(f"--devices {args.devices!r}: give device counts of at least 1, separated by commas")
    (method,) = flags.methods(parser, args.method, "--method")
    if args.ops < 1:
        parser.error(f"--ops={args.ops}: give at least one op")
    import tensorflow  # noqa: F401  (loaded once, before any timing: the graph part needs it)

    header = (f"{'devices':>7} {'used':>5} {'copies':>6} {'prep s':>7} {'gantt s':>8} {'gantt px':>11} "
              f"{'memory s':>9} {'trace s':>8} {'graph s':>8} {'summary s':>10} {'total s':>8}")
    print(header)
    print("-" * len(header))
    for devices in counts:
        r = one(args.ops, devices, method)
        print(
            f"{r['devices']:>7} {r['used']:>5} {r['transfers']:>6} {r['prep']:>7.2f} {r['gantt']:>8.2f} "
            f"{r['width']:>5}x{r['height']:<5} {r['memory']:>9.2f} {r['trace']:>8.2f} {r['graph']:>8.2f} "
            f"{r['summary']:>10.3f} {r['total']:>8.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
