"""Measures the time of tensor transfers between two devices and fits ``a * bytes + b`` (us).

The original workflow (Baechi, SoCC 2020)::

    bazel build //utils:communication_benchmark
    ./bazel-bin/utils/communication_benchmark
    ...
    Communication cost function: 0.0001754 x + 134

and the printed line gives ``--comm_cost_coeffs=a,b`` to train.py.

For each size n in 2^0 .. 2^(exponent-1) float32 elements a fresh graph computes ``from_op =
matmul(variable[n, 1], variable[1, 1])`` on the source device and ``to_op = matmul(from_op,
variable[1, 1])`` on the destination device. After `--num_warmup` untimed runs, each of
`--num_runs` runs is traced with FULL_TRACE; the transfer time is the gap between the end of
``from_op`` and the start of ``to_op`` in the step stats (it includes Send/Recv and scheduling
overhead, as in the original). The line is fitted by least squares on the *relative* error
(`baechi_tf.cost_model.comm_fit`), which identifies the intercept; the original's plain OLS is
ruled by the largest sizes.

Devices: ``--device_type=GPU`` times GPU ``from_gpu_id`` -> GPU ``to_gpu_id``. ``CPU`` (what
``auto`` picks on a machine without GPUs) creates ``max(from, to) + 1`` virtual CPU devices with
``ConfigProto(device_count={"CPU": N})``, the stand-ins that train.py's ``--num_gpus`` uses; their
transfers stay in one process's memory, so the line is that of TF's local Send/Recv, not of a bus.

``--exponent`` defaults to 24 (up to 2^23 elements, 32 MiB), about 10 s on the CPU stand-ins of a
2-core machine; the original's default was 30 (up to 2 GiB): pass ``--exponent=30`` on GPUs.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from absl import app, flags  # noqa: E402

from baechi_tf.cost_model.comm_fit import fit_comm_cost  # noqa: E402

tf1 = tf.compat.v1

flags.DEFINE_integer("from_gpu_id", 0, "Index of the device the tensor is sent from.")
flags.DEFINE_integer("to_gpu_id", 1, "Index of the device the tensor is sent to.")
flags.DEFINE_integer(
    "exponent",
    24,
    "Sizes 2^0 .. 2^(exponent-1) float32 elements are timed (the original's default was 30, "
    "up to 2 GiB; 24 finishes in about 10 s on CPU stand-ins).",
    lower_bound=2,
    upper_bound=31,
)
flags.DEFINE_enum(
    "device_type",
    "auto",
    ["auto", "GPU", "CPU"],
    "GPU: real GPUs. CPU: virtual CPU devices standing in for GPUs. auto: GPU if the machine "
    "has GPUs, else CPU.",
)
flags.DEFINE_integer("num_warmup", 5, "Untimed runs per size.", lower_bound=0)
flags.DEFINE_integer("num_runs", 20, "Traced runs per size.", lower_bound=1)

FLAGS = flags.FLAGS

_BAR_WIDTH = 30


def _config(device_type: str, num_devices: int) -> tf1.ConfigProto:
    config = tf1.ConfigProto(allow_soft_placement=False)
    if device_type == "CPU":
        config.device_count["CPU"] = num_devices
    # Keep the two MatMuls as they are: Grappler would otherwise rewrite them.
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    return config


def _event_times_ns(step_stats, name: str) -> list[tuple[int, int]]:
    """(start, end) in ns of every step-stats record of the op `name`."""
    out = []
    for dev in step_stats.dev_stats:
        for ns in dev.node_stats:
            if ns.node_name != name:
                continue
            if ns.all_start_nanos:
                out.append((ns.all_start_nanos, ns.all_start_nanos + ns.all_end_rel_nanos))
            else:
                start = ns.all_start_micros * 1000
                out.append((start, start + ns.all_end_rel_micros * 1000))
    return out


def transfer_gap_us(step_stats) -> float:
    """Earliest start of ``to_op`` minus latest end of ``from_op``, in microseconds."""
    ends = [end for _, end in _event_times_ns(step_stats, "from_op")]
    starts = [start for start, _ in _event_times_ns(step_stats, "to_op")]
    if not ends or not starts:
        raise RuntimeError("the trace has no record of from_op or to_op")
    return (min(starts) - max(ends)) / 1000.0


def measure_transfer_us(
    num_elements: int,
    src: str,
    dst: str,
    config: tf1.ConfigProto,
    *,
    num_warmup: int,
    num_runs: int,
) -> list[float]:
    """Transfer times in us of a float32 [num_elements, 1] tensor from `src` to `dst`."""
    graph = tf.Graph()
    with graph.as_default():
        ones = tf1.ones_initializer()
        with tf.device(src):
            big = tf1.get_variable("from_var", [num_elements, 1], initializer=ones,
                                   use_resource=True)
            w_from = tf1.get_variable("from_w", [1, 1], initializer=ones, use_resource=True)
            from_op = tf.matmul(big, w_from, name="from_op")
        with tf.device(dst):
            w_to = tf1.get_variable("to_w", [1, 1], initializer=ones, use_resource=True)
            to_op = tf.matmul(from_op, w_to, name="to_op").op
        init = tf1.global_variables_initializer()
    options = tf1.RunOptions(trace_level=tf1.RunOptions.FULL_TRACE)
    times = []
    with tf1.Session(graph=graph, config=config) as sess:
        sess.run(init)
        for _ in range(num_warmup):
            sess.run(to_op)
        for _ in range(num_runs):
            metadata = tf1.RunMetadata()
            sess.run(to_op, options=options, run_metadata=metadata)
            times.append(transfer_gap_us(metadata.step_stats))
    return times


def _progress(done: int, total: int, text: str) -> None:
    """One progress-bar line on stderr, redrawn in place on a terminal."""
    filled = _BAR_WIDTH * done // total
    line = f"[{'#' * filled}{'-' * (_BAR_WIDTH - filled)}] {done}/{total} {text}"
    if sys.stderr.isatty():
        sys.stderr.write("\r" + line + "\x1b[K" + ("\n" if done == total else ""))
    else:
        sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _device_type(requested: str) -> str:
    if requested != "auto":
        return requested
    return "GPU" if tf.config.list_physical_devices("GPU") else "CPU"


def main(argv: Sequence[str]) -> int:
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    src_id, dst_id = FLAGS.from_gpu_id, FLAGS.to_gpu_id
    if src_id < 0 or dst_id < 0 or src_id == dst_id:
        raise app.UsageError(
            f"--from_gpu_id={src_id} --to_gpu_id={dst_id}: give two different device indices >= 0"
        )
    device_type = _device_type(FLAGS.device_type)
    num_devices = max(src_id, dst_id) + 1
    if device_type == "GPU":
        num_gpus = len(tf.config.list_physical_devices("GPU"))
        if num_gpus < num_devices:
            raise app.UsageError(
                f"GPU {max(src_id, dst_id)} is wanted but this machine has {num_gpus} GPU(s): "
                "use --device_type=CPU for virtual CPU devices"
            )
    src, dst = f"/device:{device_type}:{src_id}", f"/device:{device_type}:{dst_id}"
    config = _config(device_type, num_devices)
    print(f"Timing transfers {src} -> {dst} of 2^0 .. 2^{FLAGS.exponent - 1} float32 elements, "
          f"{FLAGS.num_runs} traced runs each", flush=True)

    nbytes: list[float] = []
    times_us: list[float] = []
    dropped = 0
    started = time.perf_counter()
    for e in range(FLAGS.exponent):
        n = 1 << e
        measured = measure_transfer_us(
            n, src, dst, config, num_warmup=FLAGS.num_warmup, num_runs=FLAGS.num_runs
        )
        kept = [t for t in measured if t > 0]
        dropped += len(measured) - len(kept)
        nbytes += [4.0 * n] * len(kept)
        times_us += kept
        median = f"{np.median(kept):.1f} us" if kept else "no positive gap"
        _progress(e + 1, FLAGS.exponent, f"2^{e} elements: median {median}")

    if dropped:
        print(f"Dropped {dropped} run(s) whose to_op started before from_op ended", flush=True)
    fit = fit_comm_cost(nbytes, times_us)
    a, b = fit.comm.slope_us_per_byte, fit.comm.intercept_us
    print(f"{fit.num_points} transfers of {fit.num_sizes} sizes in "
          f"{time.perf_counter() - started:.1f} s; rms relative error of the fit "
          f"{100 * fit.rms_relative_error:.1f}%")
    print(f"Use it with: --comm_cost_coeffs={a:.6g},{b:.6g}")
    print(f"Communication cost function: {a:.6g} x + {b:.6g}")
    return 0


if __name__ == "__main__":
    app.run(main)
