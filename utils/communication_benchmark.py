"""Measures the time of tensor transfers between two devices and fits ``a * bytes + b`` (us).

The original workflow (Baechi, SoCC 2020)::

    bazel build //utils:communication_benchmark
    ./bazel-bin/utils/communication_benchmark
    ...
    Communication cost function: 0.0001754 x + 134

and the printed line gives ``--comm_cost_coeffs=a,b`` to train.py.

For each size n in 2^0 .. 2^(exponent-1) float32 elements (`baechi_tf.cost_model.comm_bench`,
which ``--comm_cost_coeffs=auto`` runs too) a fresh graph computes ``from_op =
matmul(variable[n, 1], variable[1, 1])`` on the source device and ``to_op = matmul(from_op,
variable[1, 1])`` on the destination device. After `--num_warmup` untimed runs, each of
`--num_runs` runs is traced with FULL_TRACE; the transfer time is the gap between the end of
``from_op`` and the start of ``to_op`` in the step stats (it includes Send/Recv and scheduling
overhead, as in the original). The line is fitted by least squares on the *relative* error
(`baechi_tf.cost_model.comm_fit`), which identifies the intercept; the original's plain OLS is
ruled by the largest sizes.

Devices: ``--device_type=GPU`` times GPU ``from_gpu_id`` -> GPU ``to_gpu_id``. ``CPU`` (what
``auto`` picks on a machine without GPUs) times the virtual CPU devices that train.py's
``--num_gpus`` makes to stand in for those GPUs: GPU i is ``CPU:i+1`` (``CPU:0`` stays the host),
made with ``ConfigProto(device_count={"CPU": N})``; their transfers stay in one process's memory,
so the line is that of TF's local Send/Recv, not of a bus.

Across hosts: given ``--cluster_spec`` (a JSON cluster like TF_CONFIG's ``"cluster"``, or a
file holding it) the benchmark asks the running cluster for its devices (those `baechi place`
would place on: each task's GPUs, or its virtual CPU devices CPU:1..N) and measures two lines:
inside the master's task (its devices ``from_gpu_id`` -> ``to_gpu_id``) and between the first
two tasks. Clocks of two hosts differ, so the inter-host time is half a round trip timed on the
first task's clock: ``from_op`` there, ``mid_op`` on the other task, ``to_op`` back on the first;
``(start(to_op) - end(from_op) - duration(mid_op)) / 2``. It prints both lines and the flags
``--comm_cost_coeffs=... --inter_host_comm_cost_coeffs=...``.

``--exponent`` defaults to 24 (up to 2^23 elements, 32 MiB), about 10 s on the CPU stand-ins of a
2-core machine; the original's default was 30 (up to 2 GiB): pass ``--exponent=30`` on GPUs.

Bad flags (device indices that are equal, negative, beyond the machine's GPUs or, for virtual CPU
devices, 63 or more; a cluster that does not answer) end the program with one line on stderr and
exit status 2; Ctrl-C with one line and exit status 130.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any, Sequence

_INTERRUPTED = "communication_benchmark: interrupted; no line was fitted"


def _interrupted_while_loading(signum: int, frame: object) -> None:
    """Ctrl-C while the modules below load and absl parses the flags, before main: the line
    main prints for a Ctrl-C, not a traceback."""
    print(_INTERRUPTED, file=sys.stderr, flush=True)
    os._exit(130)


# As a program (not imported), and unless SIGINT is ignored (nohup) or handled by someone else.
if __name__ == "__main__" and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, _interrupted_while_loading)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
from absl import app, flags  # noqa: E402

from baechi_tf._startup import flag_parser, import_tensorflow_quietly, run_main  # noqa: E402
from baechi_tf.cost_model.comm_bench import (  # noqa: E402,F401  (the benchmark's parts, here too)
    measure_transfer_us,
    round_trip_transfer_us,
    transfer_gap_us,
)
from baechi_tf.cost_model.comm_fit import fit_comm_cost  # noqa: E402
from baechi_tf.errors import ConfigError  # noqa: E402

# Virtual CPU devices are made by the thousand if asked (--to_gpu_id=100000 made 100,001); the
# line between two of them does not depend on their indices, so the indices stay below this.
_MAX_VIRTUAL_DEVICES = 64


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
flags.DEFINE_string(
    "cluster_spec",
    None,
    "A running TF cluster (JSON like TF_CONFIG's \"cluster\", or a file holding it): measure "
    "the line inside a task and the line between two tasks.",
)
flags.DEFINE_float("cluster_timeout", 30.0, "Seconds to wait for the cluster's tasks.")

FLAGS = flags.FLAGS

_BAR_WIDTH = 30


def _config(device_type: str, num_devices: int) -> Any:
    import tensorflow as tf

    config = tf.compat.v1.ConfigProto(allow_soft_placement=False)
    if device_type == "CPU":
        config.device_count["CPU"] = num_devices
    # Keep the two MatMuls as they are: Grappler would otherwise rewrite them.
    config.graph_options.rewrite_options.disable_meta_optimizer = True
    return config


def _progress(done: int, total: int, text: str) -> None:
    """One progress-bar line on stderr, redrawn in place on a terminal."""
    filled = _BAR_WIDTH * done // total
    line = f"[{'#' * filled}{'-' * (_BAR_WIDTH - filled)}] {done}/{total} {text}"
    if sys.stderr.isatty():
        sys.stderr.write("\r" + line + "\x1b[K" + ("\n" if done == total else ""))
    else:
        sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _num_gpus() -> int:
    import tensorflow as tf

    return len(tf.config.list_physical_devices("GPU"))


def _device_type(requested: str) -> str:
    if requested != "auto":
        return requested
    return "GPU" if _num_gpus() else "CPU"


def _measure_line(src: str, dst: str, config: Any, *, target: str = "",
                  round_trip: bool = False):
    """Times every size from `src` to `dst` (progress on stderr) and fits the line."""
    print(f"Timing transfers {src} -> {dst} of 2^0 .. 2^{FLAGS.exponent - 1} float32 elements, "
          f"{FLAGS.num_runs} traced runs each" + (" (half round trips)" if round_trip else ""),
          flush=True)
    nbytes: list[float] = []
    times_us: list[float] = []
    dropped = 0
    started = time.perf_counter()
    for e in range(FLAGS.exponent):
        n = 1 << e
        measured = measure_transfer_us(
            n, src, dst, config, num_warmup=FLAGS.num_warmup, num_runs=FLAGS.num_runs,
            target=target, round_trip=round_trip,
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
    print(f"{fit.num_points} transfers of {fit.num_sizes} sizes in "
          f"{time.perf_counter() - started:.1f} s; rms relative error of the fit "
          f"{100 * fit.rms_relative_error:.1f}%")
    return fit.comm


def _cluster_pairs(spec: Any, src_id: int, dst_id: int):
    """(target, intra-task pair, inter-task pair) of the cluster `spec` (--cluster_spec)."""
    from baechi_tf.rewriter.distributed import discover_devices

    setup = discover_devices(spec=spec, timeout_s=FLAGS.cluster_timeout)
    tasks: dict[str, list[str]] = {}
    for device in setup.devices.cluster.devices:
        tasks.setdefault(device.task, []).append(device.name)
    if len(tasks) < 2:
        raise ConfigError(
            f"the cluster has one task ({next(iter(tasks))}); give one of two or more tasks to "
            "measure the line between hosts"
        )
    first, second = list(tasks.values())[:2]
    if max(src_id, dst_id) >= len(first) or dst_id >= len(second):
        raise ConfigError(
            f"--from_gpu_id={src_id} --to_gpu_id={dst_id}: the tasks have {len(first)} and "
            f"{len(second)} devices; give indices below those"
        )
    return setup.target, (first[src_id], first[dst_id]), (first[src_id], second[dst_id])


def main(argv: Sequence[str]) -> int:
    # All of it under `recording`, TensorFlow's import included: a Ctrl-C at any point is one
    # line and exit status 130; a bad flag is one line and exit status 2.
    return run_main(_main, argv, prog="communication_benchmark", interrupted=_INTERRUPTED,
                    loading_handler=_interrupted_while_loading)


def _main() -> int:
    src_id, dst_id = FLAGS.from_gpu_id, FLAGS.to_gpu_id
    if src_id < 0 or dst_id < 0 or src_id == dst_id:
        raise ConfigError(
            f"--from_gpu_id={src_id} --to_gpu_id={dst_id}: give two different device indices >= 0"
        )
    if FLAGS.cluster_spec:
        from baechi_tf.rewriter.distributed import parse_cluster_spec, remote_session_config

        spec = parse_cluster_spec(FLAGS.cluster_spec)  # a bad spec is refused before TF loads
        import_tensorflow_quietly()
        target, intra, inter = _cluster_pairs(spec, src_id, dst_id)
        config = remote_session_config(_config("GPU", 0))
        a = _measure_line(*intra, config, target=target)
        c = _measure_line(*inter, config, target=target, round_trip=True)
        print(f"Use it with: --comm_cost_coeffs={a.slope_us_per_byte:.6g},{a.intercept_us:.6g} "
              f"--inter_host_comm_cost_coeffs={c.slope_us_per_byte:.6g},{c.intercept_us:.6g}")
        print(f"Communication cost function: {a.slope_us_per_byte:.6g} x + {a.intercept_us:.6g}")
        print(f"Inter-host communication cost function: {c.slope_us_per_byte:.6g} x + "
              f"{c.intercept_us:.6g}")
        return 0
    import_tensorflow_quietly()
    device_type = _device_type(FLAGS.device_type)
    num_devices = max(src_id, dst_id) + 1
    first = 0  # the device index of GPU 0: a stand-in's is 1, after the host's CPU:0 (train.py)
    if device_type == "GPU":
        num_gpus = _num_gpus()
        if num_gpus < num_devices:
            raise ConfigError(
                f"GPU {max(src_id, dst_id)} is wanted but this machine has {num_gpus} GPU(s): "
                "use --device_type=CPU for virtual CPU devices"
            )
    elif num_devices >= _MAX_VIRTUAL_DEVICES:
        raise ConfigError(
            f"--from_gpu_id={src_id} --to_gpu_id={dst_id}: virtual CPU devices take indices below "
            f"{_MAX_VIRTUAL_DEVICES - 1} (the line between two of them does not depend on their "
            "indices); give e.g. --from_gpu_id=0 --to_gpu_id=1"
        )
    else:
        first = 1
    src, dst = f"/device:{device_type}:{src_id + first}", f"/device:{device_type}:{dst_id + first}"
    if first:
        print(f"GPU {src_id} and GPU {dst_id} are the virtual CPU devices {src} and {dst}, as in "
              "train.py --num_gpus", flush=True)
    comm = _measure_line(src, dst, _config(device_type, num_devices + first))
    a, b = comm.slope_us_per_byte, comm.intercept_us
    print(f"Use it with: --comm_cost_coeffs={a:.6g},{b:.6g}")
    print(f"Communication cost function: {a:.6g} x + {b:.6g}")
    return 0


if __name__ == "__main__":
    app.run(main, flags_parser=flag_parser("communication_benchmark"))
