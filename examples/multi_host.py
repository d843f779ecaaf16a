"""GNMT v2 (small) placed across two hosts, here two local TensorFlow workers, and trained.

    python examples/multi_host.py [--steps 5] [--placement_method m_etf]

Starts two ``tf.distribute.Server`` processes on free loopback ports, each with two virtual CPU
devices standing in for GPUs (CPU:1 and CPU:2; CPU:0 is the worker's host), so four placement
targets in all: ``/job:worker/replica:0/task:{0,1}/device:CPU:{1,2}``. A `BaechiSession` whose
target is the first worker profiles the training step on the cluster, places it on the four
devices (transfers inside a worker cost ``--comm_cost_coeffs``, between workers
``--inter_host_comm_cost_coeffs``; ``utils/communication_benchmark.py --cluster_spec=...``
measures both) and trains. It prints the placement per host and the step time.

The workers are stopped when the example ends, on an error, on Ctrl-C and on SIGTERM; each runs
in its own process group and also exits by itself if this process dies. On real hosts, start
``python -m baechi_tf.rewriter.distributed --cluster_spec=... --task_index=i --num_devices=N``
on each and pass ``target="grpc://<first host>:<port>"`` (or ``cluster_spec=``) to
`BaechiSession`.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# TensorFlow loads in _train, once the flags are checked: a bad flag or --help is answered at once.
from baechi_tf import CommCost, interrupts  # noqa: E402
from baechi_tf._startup import import_tensorflow_quietly  # noqa: E402
from baechi_tf.errors import BaechiError  # noqa: E402
from baechi_tf.models import GNMTHParams, build_model  # noqa: E402
from baechi_tf.placer.pipeline import PLACEMENT_METHODS  # noqa: E402
from baechi_tf.report import counted  # noqa: E402
from baechi_tf.rewriter.distributed import placement_by_host, start_local_workers  # noqa: E402


def _parse(argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="training steps (default: %(default)s)")
    methods = sorted(m for m in PLACEMENT_METHODS if m != "expert")  # no hand layout given here
    parser.add_argument("--placement_method", default="m_etf", choices=methods,
                        help="placer (default: %(default)s)")
    parser.add_argument("--comm_cost_coeffs", default="0.0001,30",
                        help="'slope,intercept' inside a worker, us/byte and us (default: %(default)s)")
    parser.add_argument("--inter_host_comm_cost_coeffs", default="0.0005,600",
                        help="'slope,intercept' between workers (default: %(default)s)")
    parser.add_argument("--max_seq_length", type=int, default=8, help="GNMT steps (default: %(default)s)")
    parser.add_argument("--num_layers", type=int, default=4, help="GNMT layers (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be at least 2: the first step profiles and places")
    if args.max_seq_length < 1 or args.num_layers < 2:
        parser.error("give --max_seq_length of 1 or more and --num_layers of 2 or more")
    for flag in ("comm_cost_coeffs", "inter_host_comm_cost_coeffs"):  # before the workers start
        try:
            setattr(args, flag, CommCost.parse(getattr(args, flag)))
        except BaechiError as e:
            parser.error(f"--{flag}: {e}")
    return args


def _train(args: argparse.Namespace, target: str) -> None:
    import_tensorflow_quietly()  # without TF's C++ start-up lines (oneDNN, absl::InitializeLog)
    import tensorflow as tf

    from baechi_tf import BaechiSession

    tf.get_logger().setLevel("ERROR")  # no deprecation warnings of the model's v1 calls

    hparams = GNMTHParams(batch_size=16, vocab_size=256, max_seq_length=args.max_seq_length,
                          rnn_units=64, num_layers=args.num_layers, num_gpus=4)
    model = build_model("gnmt_v2", hparams)
    with model.graph.as_default():
        train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
            model.loss, colocate_gradients_with_ops=True)
        init = tf.compat.v1.global_variables_initializer()
    with BaechiSession(graph=model.graph, target=target, placement_method=args.placement_method,
                       comm=args.comm_cost_coeffs, inter_host_comm=args.inter_host_comm_cost_coeffs,
                       warmup_steps=1, profile_steps=2) as sess:
        sess.run(init)
        seconds = []
        for step in range(args.steps):
            started = time.perf_counter()
            loss, _ = sess.run([model.loss, train_op], feed_dict=model.feeds)
            interrupts.check()  # a Ctrl-C that TensorFlow printed and dropped still stops the loop
            seconds.append(time.perf_counter() - started)
            print(f"step {step}: loss {loss:.4f}, {1000 * seconds[-1]:.1f} ms"
                  + (" (profiled and placed first)" if step == 0 else ""), flush=True)
        report = sess.placement
    print(f"\nplacement per host ({args.placement_method}, {len(report.op_to_device)} ops):")
    print(placement_by_host(report.op_to_device))
    print(f"simulated step {report.makespan_us / 1000:.1f} ms, lower bound "
          f"{report.lower_bound_us / 1000:.1f} ms")
    print(f"step time: {1000 * statistics.median(seconds[1:]):.1f} ms "
          f"(median of {counted(len(seconds) - 1, 'step')} after the first)", flush=True)


def _stop_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)  # unwinds through `with start_local_workers(...)`


def main(argv=None) -> int:
    args = _parse(argv)
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        # TensorFlow can turn a Ctrl-C into another exception; `interrupts` still knows it was one.
        with interrupts.recording(), start_local_workers(
                num_workers=2, num_devices_per_worker=2) as workers:
            tasks = ", ".join(f"{t.name} at {t.address} (pid {pid})"
                              for t, pid in zip(workers.spec.tasks, workers.pids))
            print(f"workers started: {tasks}", flush=True)
            _train(args, workers.target)
        print("workers stopped", flush=True)
        return 0
    except BaseException as e:
        return interrupts.exit_status(e, interrupted="multi_host: interrupted; workers stopped",
                                      failed="multi_host: error: ")


if __name__ == "__main__":
    sys.exit(main())
