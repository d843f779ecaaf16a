"""The worker: ``python -m baechi_tf.rewriter.distributed --cluster_spec=... --task_index=i
--num_devices=N`` runs task i's ``tf.distribute.Server`` (gRPC) until stopped.

With fewer GPUs than N, the server offers N + 1 virtual CPU devices, CPU:0 its host and CPU:1..N
stand-ins for GPUs. ``--cpu_cores`` holds every thread of the process to some cores,
``--inter_op_threads`` and ``--intra_op_threads`` size TF's thread pools, and
``--exit_on_stdin_eof`` ties the worker to its parent (`start_local_workers`). Only `main`
imports TensorFlow.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Optional, Sequence

from baechi_tf import interrupts
from baechi_tf.errors import ConfigError, first_line
from baechi_tf.rewriter.distributed.spec import (
    _READY,
    _WORKER_MODULE,
    _tf_config_task,
    resolve_cluster_spec,
)

__all__ = ["main"]

_WAKE_S = 0.25  # a serving worker's longest wait before it sees a Ctrl-C


def _server_config(num_devices: int, inter_op_threads: int = 0, intra_op_threads: int = 0) -> Any:
    import tensorflow as tf

    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=inter_op_threads,
                                      intra_op_parallelism_threads=intra_op_threads)
    if num_devices and len(tf.config.list_physical_devices("GPU")) < num_devices:
        config.device_count["CPU"] = num_devices + 1  # CPU:1..N stand in for GPUs
    return config


def _pin_threads(cores: set[int]) -> None:
    """Holds every thread of this process to `cores`: the ones running now (numpy's BLAS may
    have started some at import) and, through the calling thread, every one made later."""
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = []
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cores)
        except ProcessLookupError:  # ended meanwhile
            pass
    os.sched_setaffinity(0, cores)


def _parse_cores(text: str) -> set[int]:
    """The cores of ``--cpu_cores`` ('0', '0,2' or '0-3'); `ConfigError` when not so."""
    cores: set[int] = set()
    try:
        for part in text.split(","):
            low, _, high = part.strip().partition("-")
            cores.update(range(int(low), int(high or low) + 1))
    except ValueError:
        cores = set()
    if not cores or min(cores) < 0:
        raise ConfigError(f"--cpu_cores={text!r}: give core numbers such as '0', '0,2' or '0-3'")
    return cores


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m baechi_tf.rewriter.distributed``: runs one task's TF server until stopped."""
    parser = argparse.ArgumentParser(
        prog=f"python -m {_WORKER_MODULE}",
        description="Runs one task of a TensorFlow cluster (tf.distribute.Server) for baechi_tf.",
    )
    parser.add_argument(
        "--cluster_spec",
        default=None,
        help="JSON cluster ({\"worker\": [\"host:port\", ...]}) or a file holding it "
        "(default: TF_CONFIG's)",
    )
    parser.add_argument("--job", default=None, help="this task's job (default: TF_CONFIG's, else worker)")
    parser.add_argument("--task_index", type=int, default=None, help="this task's index (default: TF_CONFIG's, else 0)")
    parser.add_argument(
        "--num_devices",
        type=int,
        default=0,
        help="devices to offer: with fewer GPUs than this, N + 1 virtual CPU devices whose "
        "CPU:1..N stand in for GPUs; 0: TensorFlow's own devices (default: %(default)s)",
    )
    parser.add_argument(
        "--cpu_cores",
        default=None,
        help="run every thread of this task on these cores only ('0', '0,2', '0-3'; "
        "default: wherever the OS schedules them)",
    )
    parser.add_argument("--inter_op_threads", type=int, default=0,
                        help="threads that run ops side by side (0: TensorFlow chooses)")
    parser.add_argument("--intra_op_threads", type=int, default=0,
                        help="threads within one op (0: TensorFlow chooses)")
    parser.add_argument(
        "--exit_on_stdin_eof",
        action="store_true",
        help="exit when stdin closes (how start_local_workers ties a worker to its parent)",
    )
    args = parser.parse_args(argv)
    prog = f"python -m {_WORKER_MODULE}"
    # TF's C++ start-up lines would come before an error line (start_local_workers' do the same).
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        with interrupts.recording():
            return _serve(args)  # returns only on an error: a server runs until stopped
    except BaseException as e:
        status = interrupts.exit_status(e, interrupted=f"{prog}: interrupted; server stopped",
                                        failed=f"{prog}: error: ")
        sys.stderr.flush()
        os._exit(status)  # the server's threads never end by themselves


def _serve(args: argparse.Namespace) -> int:
    """Starts this task's server and waits, until stdin closes (`--exit_on_stdin_eof`) or for
    ever; `ConfigError` for a task the spec lacks or an address the server cannot take."""
    if args.num_devices < 0:
        raise ConfigError(f"--num_devices={args.num_devices}: give 0 (TensorFlow's own devices) or more")
    if args.inter_op_threads < 0 or args.intra_op_threads < 0:
        raise ConfigError("--inter_op_threads and --intra_op_threads: give 0 (TensorFlow chooses) or more")
    if args.cpu_cores is not None:
        cores = _parse_cores(args.cpu_cores)
        try:  # before TensorFlow starts a thread: each thread it makes inherits the cores
            _pin_threads(cores)
        except OSError as e:
            raise ConfigError(
                f"--cpu_cores={args.cpu_cores!r}: cannot run on those cores ({e.strerror}); this "
                f"machine lets it run on {sorted(os.sched_getaffinity(0))}"
            ) from None
    spec = resolve_cluster_spec(args.cluster_spec)
    if spec is None:
        raise ConfigError("give --cluster_spec or set TF_CONFIG")
    env_job, env_index = _tf_config_task(os.environ)
    job = args.job or env_job or "worker"
    index = args.task_index if args.task_index is not None else (env_index or 0)
    addresses = dict(spec.jobs).get(job, ())
    if not (0 <= index < len(addresses)):
        raise ConfigError(
            f"task {job}:{index} is not in the cluster spec {spec.to_json()}; give a --job "
            "and --task_index it lists"
        )
    from baechi_tf._startup import import_tensorflow_quietly, native_stderr_quiet

    import_tensorflow_quietly()
    import tensorflow as tf

    try:
        with native_stderr_quiet():  # gRPC's own error lines: the ConfigError says it in one
            server = tf.distribute.Server(  # held until the process ends
                tf.train.ClusterSpec(spec.as_dict()),
                job_name=job,
                task_index=index,
                config=_server_config(args.num_devices, args.inter_op_threads, args.intra_op_threads),
                start=True,
            )
    except tf.errors.OpError as e:
        first = first_line(e)
        raise ConfigError(
            f"cannot start the server of /job:{job}/task:{index} at {addresses[index]} ({first}): "
            "is the port in use, or the host not this machine's? give another address"
        ) from None
    print(f"{_READY} /job:{job}/replica:0/task:{index} at {addresses[index]}", flush=True)
    if args.exit_on_stdin_eof:
        while sys.stdin.buffer.read(65536):
            pass
        sys.stdout.flush()
        os._exit(0)  # the server's threads never end by themselves
    # Not server.join(), which waits in C++, where Ctrl-C never reaches Python; nor one long
    # wait, which a Ctrl-C that comes just before it would leave waiting.
    while True:  # `server` stays referenced meanwhile
        time.sleep(_WAKE_S)
