"""``baechi place``: place a TensorFlow GraphDef or MetaGraphDef with a cost profile.

    baechi place --graph G.pb --cost_path P --num_devices 4 --placement_method m_etf \\
        --out placed.pb

Reads a GraphDef or a MetaGraphDef, binary or text (told apart by parsing), and a cost profile
(a ``baechi_tf.CostProfile`` file; anything else is refused and never unpickled) or, with
``--run_metadata``, the RunMetadata of traced steps of the graph (made into a profile, the
median of the steps, as `profile_fetch` does), places the ops
on ``--num_devices`` devices, prints the summary and writes the same kind of message with only
the nodes' ``device`` fields changed to ``--out`` (text when its name ends in ``.pbtxt``,
``.pbtext`` or ``.txt``, in any case), atomically. A profile of another graph is refused unless ``--allow_profile_mismatch``,
which then reports what did not match. A node's ``device`` pins it: when every op is pinned (a
graph placed before), a warning says the method placed nothing, and ``--replace_devices`` drops the
devices to place them anew. On any error nothing is written and the inputs are left as they were.

Across several hosts: with ``--cluster_spec`` (JSON like TF_CONFIG's ``"cluster"``, or a file
holding it; default: ``TF_CONFIG``'s cluster when that is set) the devices are asked from the
running cluster (`baechi_tf.rewriter.distributed.discover_devices`, within
``--cluster_timeout`` seconds): every task's GPUs, or its virtual CPU devices CPU:1..N, under
their full names, ``--num_devices`` per task (default: all). Transfers between tasks cost
``--inter_host_comm_cost_coeffs`` (default: ``--comm_cost_coeffs``).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
from typing import Any

from baechi_tf.errors import ConfigError, InvalidGraphError

log = logging.getLogger(__name__)

__all__ = ["add_arguments", "profile_from_run_metadata", "read_graph_bytes", "read_graph_file", "run"]

_TEXT_SUFFIXES = (".pbtxt", ".pbtext", ".txt")  # of an --out written as text, in any case
_FEW_TRACED = 0.2  # traces holding fewer than this share of the graph's ops are warned of
_DEFAULT_NUM_DEVICES = 4


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from baechi_tf.cli import add_placement_arguments

    parser.add_argument(
        "--graph", required=True, metavar="G.pb", help="GraphDef or MetaGraphDef, binary or text"
    )
    costs = parser.add_mutually_exclusive_group(required=True)
    costs.add_argument(
        "--cost_path",
        metavar="P",
        help="cost profile of the graph (a baechi_tf CostProfile file)",
    )
    costs.add_argument(
        "--run_metadata",
        nargs="+",
        metavar="RM.pb",
        help="instead of a profile: RunMetadata of traced runs of the graph (Session.run with "
        "RunOptions(trace_level=FULL_TRACE) and run_metadata=..., written with "
        "SerializeToString() or in text format, as train.py --logdir writes them), one file "
        "per step; the costs are their median",
    )
    parser.add_argument(
        "--out",
        required=True,
        metavar="placed.pb",
        help=f"where to write the placed graph (text when the name ends in {', '.join(_TEXT_SUFFIXES[:-1])} "
        f"or {_TEXT_SUFFIXES[-1]}, in any case; else binary)",
    )
    parser.add_argument(
        "--num_devices",
        type=int,
        default=None,
        help=f"devices to place on (default: {_DEFAULT_NUM_DEVICES}); with --cluster_spec, "
        "devices per task (default: all of each task's)",
    )
    parser.add_argument(
        "--cluster_spec",
        default=None,
        metavar="JSON|FILE",
        help="place across the tasks of a running TF cluster: a JSON cluster such as "
        "'{\"worker\": [\"host0:2222\", \"host1:2222\"]}' (TF_CONFIG's \"cluster\") or a "
        "file holding it; its devices are asked from the cluster (default: TF_CONFIG's cluster "
        "when set, else this machine's devices)",
    )
    parser.add_argument(
        "--cluster_timeout",
        type=float,
        default=30.0,
        metavar="SECONDS",
        help="with a cluster: how long to wait for its tasks to answer (default: %(default)s)",
    )
    parser.add_argument(
        "--device_type",
        default="GPU",
        choices=("GPU", "CPU"),
        help="GPU: /device:GPU:0..N-1; CPU: virtual CPU devices /device:CPU:1..N standing in "
        "for GPUs (run with ConfigProto(device_count={'CPU': N + 1})); with --cluster_spec the "
        "cluster's own devices are used (default: %(default)s)",
    )
    parser.add_argument(
        "--memory_per_device",
        default="8GiB",
        help="memory of each device: bytes, or a number with a unit KiB, MiB, GiB, TiB (of 1024) or "
        "KB, MB, GB, TB (of 1000), e.g. 8GiB or 512MiB (default: %(default)s)",
    )
    parser.add_argument(
        "--comm_cost_coeffs",
        default="0.0001754,134",
        help="transfer time 'slope,intercept' in us per byte and us between devices of one "
        "host, or 'auto': fit it to copies timed between two of the devices before placing "
        "(about a second; CPU stand-ins on this machine, or the cluster of --cluster_spec) "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--inter_host_comm_cost_coeffs",
        default=None,
        help="transfer time 'slope,intercept' between devices of different hosts (TF tasks) "
        "(default: --comm_cost_coeffs)",
    )
    parser.add_argument(
        "--allow_profile_mismatch",
        action="store_true",
        help="use a profile of another graph for the ops that match, and report the rest",
    )
    parser.add_argument(
        "--ignore_user_devices",
        action="store_true",
        help="let the placer move ops pinned to devices that are not among the devices",
    )
    parser.add_argument(
        "--replace_devices",
        action="store_true",
        help="place every op anew, whatever device the graph gives it (to place a placed graph "
        "again): the nodes' device fields are dropped first, pins to the host CPU too",
    )
    add_placement_arguments(parser)


def _well_formed(graph_def: Any) -> bool:
    return len(graph_def.node) > 0 and all(n.name and n.op for n in graph_def.node)


def read_graph_file(path: str, data: bytes) -> tuple[Any, bool, bool]:
    """(message, is_meta_graph, is_text) of the GraphDef or MetaGraphDef file `path`, whose bytes
    `read_graph_bytes` read (`data`)."""
    import tensorflow as tf
    from google.protobuf import message, text_format

    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    if text is not None:
        for kind, is_meta in ((tf.compat.v1.GraphDef, False), (tf.compat.v1.MetaGraphDef, True)):
            msg = kind()
            try:
                text_format.Parse(text, msg)
            except (text_format.ParseError, UnicodeError):
                continue
            graph_def = msg.graph_def if is_meta else msg
            if _well_formed(graph_def):
                return msg, is_meta, True
    for kind, is_meta in ((tf.compat.v1.MetaGraphDef, True), (tf.compat.v1.GraphDef, False)):
        try:
            msg = kind.FromString(data)
        except (message.DecodeError, RuntimeError, ValueError):
            continue
        graph_def = msg.graph_def if is_meta else msg
        if _well_formed(graph_def):
            return msg, is_meta, False
    if _is_saved_model(data):
        raise InvalidGraphError(
            f"graph {path!r} is a SavedModel, which holds one or more MetaGraphDefs: write the "
            "one to place to a file of its own (saved_model_pb2.SavedModel.FromString(data)"
            ".meta_graphs[i].SerializeToString()) and give that"
        )
    raise InvalidGraphError(
        f"graph {path!r} is neither a GraphDef nor a MetaGraphDef (binary or text); write it "
        "with tf.io.write_graph or tf.compat.v1.train.export_meta_graph"
    )


def _is_saved_model(data: bytes) -> bool:
    from google.protobuf import message
    from tensorflow.core.protobuf import saved_model_pb2

    try:
        saved = saved_model_pb2.SavedModel.FromString(data)
    except (message.DecodeError, RuntimeError, ValueError):
        return False
    return any(_well_formed(m.graph_def) for m in saved.meta_graphs)


def read_graph_bytes(path: str) -> bytes:
    """The bytes of a graph file; an error (before TensorFlow loads, which takes seconds) when it
    cannot be read or is empty."""
    from baechi_tf.cost_model.profile import read_bytes

    data = read_bytes(path, "graph", ConfigError)
    if not data.strip():
        raise InvalidGraphError(f"graph {path!r} is empty; give a GraphDef or MetaGraphDef")
    return data


def profile_from_run_metadata(paths: list[str], contents: list[bytes], graph_def: Any) -> Any:
    """The cost profile of `graph_def` from the RunMetadata files `paths` (their `contents`)."""
    import tensorflow as tf
    from google.protobuf import message

    from baechi_tf.cost_model.profiler import fit_outputs_to_graph, profile_from_step_stats
    from baechi_tf.errors import ProfileError

    from google.protobuf import text_format

    def traced(metadata: Any) -> bool:
        return any(d.node_stats for d in metadata.step_stats.dev_stats)

    steps = []
    partitions: list[Any] = []  # those of the first file that has them: the ops fused nodes replaced
    for path, data in zip(paths, contents):
        try:
            metadata = tf.compat.v1.RunMetadata.FromString(data)
        except (message.DecodeError, RuntimeError, ValueError):
            metadata = None
        if metadata is None or not traced(metadata):
            try:  # text format, as train.py --logdir writes it (run_metadata-*.pbtxt)
                metadata = text_format.Parse(data.decode("utf-8"), tf.compat.v1.RunMetadata())
            except (text_format.ParseError, UnicodeDecodeError):
                metadata = None
        if metadata is None or not traced(metadata):
            raise ProfileError(
                f"run metadata {path!r} is not a RunMetadata with step statistics; trace a step "
                "with RunOptions(trace_level=FULL_TRACE) and write its run_metadata with "
                "SerializeToString() or in text format"
            )
        steps.append(metadata.step_stats)
        partitions = partitions or list(metadata.partition_graphs)
    # As profile_fetch does: oneDNN's training MaxPool traces a workspace output it does not
    # declare, which the import took for a profile of another graph ('profile this graph again').
    profile = fit_outputs_to_graph(
        profile_from_step_stats(steps, graph_def, tf_version=tf.__version__, partition_graphs=partitions),
        graph_def,
    )
    if not profile.ops:
        raise ProfileError(
            f"none of the ops traced in {', '.join(map(repr, paths))} is in the graph; trace runs "
            "of this graph (the same op names)"
        )
    if len(profile.ops) < _FEW_TRACED * len(graph_def.node):
        # A step runs some ops only (not the initializers, ...), and TF's kernels may carry other
        # type names (oneDNN's _Mkl ops): names are all that can be matched, so only a warning.
        # Traces that may be of another graph do not say which ops a step leaves out: the ops
        # they lack are estimated, not taken for ops no step runs (`unrun_ops`).
        log.warning(
            "the traces hold %d of the graph's %d ops: are they traces of this graph? The ops they "
            "lack are placed by estimated costs",
            len(profile.ops), len(graph_def.node),
        )
        profile = dataclasses.replace(profile, num_traced_steps=0)
    return profile


def run(args: argparse.Namespace) -> int:
    from google.protobuf import text_format

    from baechi_tf._files import atomic_write
    from baechi_tf._startup import import_tensorflow_quietly
    from baechi_tf.cli import check_outputs, options_from_args
    from baechi_tf.cluster import CommCost
    from baechi_tf.cost_model.profile import load_profile, read_bytes
    from baechi_tf.rewriter.devices import (
        gpu_cluster,
        parse_comm,
        resolve_memory,
        session_config,
        standin_cluster,
        with_fitted_link,
    )
    from baechi_tf.rewriter.distributed.discovery import cluster_from_flags, placement_by_host, remote_session_config
    from baechi_tf.rewriter.graph_pass import place_graph_def

    options = options_from_args(args)
    memory = resolve_memory(args.memory_per_device)
    comm = parse_comm(args.comm_cost_coeffs)  # None: 'auto', fitted once the devices are known
    inter = (
        CommCost.parse(args.inter_host_comm_cost_coeffs)
        if args.inter_host_comm_cost_coeffs
        else None
    )
    # The inputs are read before TensorFlow loads, which takes seconds.
    graph_bytes = read_graph_bytes(args.graph)
    traces = args.run_metadata or []
    if args.cost_path:
        profile = load_profile(args.cost_path)
    else:
        trace_bytes = [read_bytes(path, "run metadata") for path in traces]
    check_outputs(args, inputs=(args.graph, args.cost_path or "", *traces))
    # TF's C++ start-up lines would come before any error line (train.py does the same).
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import_tensorflow_quietly()
    remote = cluster_from_flags(
        args.cluster_spec,
        num_devices=args.num_devices,
        memory_per_device=memory,
        comm_cost_coeffs=comm or CommCost(),
        inter_host_comm_cost_coeffs=inter,
        timeout_s=args.cluster_timeout,
    )
    if remote is not None:
        setup = remote.devices
        print(f"cluster at {remote.target}: {setup.cluster.num_devices} devices on "
              f"{len({d.task for d in setup.cluster.devices})} tasks")
    else:
        if inter is not None:  # it was dropped without a word
            log.warning(
                "--inter_host_comm_cost_coeffs is not used: every device is on this host (give "
                "--cluster_spec, or TF_CONFIG, to place across hosts)"
            )
        make = standin_cluster if args.device_type == "CPU" else gpu_cluster
        num_devices = _DEFAULT_NUM_DEVICES if args.num_devices is None else args.num_devices
        setup = make(num_devices, memory, comm=comm or CommCost())
    if comm is None:
        config = session_config(setup, grappler=False)
        setup, fitted = with_fitted_link(
            setup, remote_session_config(config) if remote else config, remote.target if remote else "")
        if fitted is not None:
            print(fitted.describe())
    msg, is_meta, _ = read_graph_file(args.graph, graph_bytes)
    graph_def = msg.graph_def if is_meta else msg
    if args.replace_devices:
        graph_def = type(graph_def).FromString(graph_def.SerializeToString())  # a copy to clear
        for node in graph_def.node:
            node.device = ""
    if traces:
        profile = profile_from_run_metadata(traces, trace_bytes, graph_def)
    placed, report = place_graph_def(
        graph_def,
        profile,
        setup.cluster,
        options,
        allow_profile_mismatch=args.allow_profile_mismatch,
        host_device=setup.host,
        device_aliases=setup.aliases,
        ignore_user_devices=args.ignore_user_devices,
    )
    if is_meta:
        out_msg = type(msg)()
        out_msg.CopyFrom(msg)
        out_msg.graph_def.CopyFrom(placed)
    else:
        out_msg = placed
    if args.out.lower().endswith(_TEXT_SUFFIXES):
        atomic_write(args.out, text_format.MessageToString(out_msg))
    else:
        atomic_write(args.out, out_msg.SerializeToString(deterministic=True))
    args.written.append(args.out)
    if args.report_dir:
        from baechi_tf.reports import write_reports

        write_reports(report.result, args.report_dir, graph_def=placed,
                      profile=report.coverage.figures(len(report.default_compute_ops)))
        args.written.append(args.report_dir)
    print(report.summary())
    if remote is not None:
        print("\nplacement per host:\n" + placement_by_host(report.op_to_device))
    print(f"placed {'MetaGraphDef' if is_meta else 'GraphDef'} written to {args.out}")
    if args.report_dir:
        print(f"reports written to {args.report_dir}")
    return 0
