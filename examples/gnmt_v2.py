"""Train GNMT v2 with its ops placed by Baechi: a ``tf.compat.v1.Session`` wrapped in BaechiSession.

    .venv/bin/python examples/gnmt_v2.py                      # the seed's size (slow on a CPU)
    .venv/bin/python examples/gnmt_v2.py --batch_size=128 --vocab_size=16000 \\
        --max_seq_length=32 --rnn_units=256 --num_layers=4 --steps=30   # what `make demo` runs

The model is GNMT v2 (baechi_tf.models), built from plain ``tf.compat.v1`` ops; the defaults are
the original README's setting (batch 128, 40 steps, vocabulary 30000, 4 LSTM layers of 512 units,
residual, Adam). The variables are initialised in an ordinary session, which is then wrapped:
the first ``run`` of the training step profiles it on a scratch copy of the graph, places every
op on ``--num_devices`` devices (GPUs, or virtual CPU devices standing in for them) and runs it
placed; the later runs go straight to the placed graph.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# TensorFlow loads in main, once the flags are checked: a bad flag or --help is answered at once.
from baechi_tf import PlacementOptions, interrupts  # noqa: E402
from baechi_tf._startup import import_tensorflow_quietly  # noqa: E402
from baechi_tf.cost_model.machine_load import LoadMeter, busy_warning  # noqa: E402
from baechi_tf.errors import BaechiError  # noqa: E402
from baechi_tf.models import GNMTHParams, build_model  # noqa: E402
from baechi_tf.placer.pipeline import PLACEMENT_METHODS  # noqa: E402
from baechi_tf.report import counted  # noqa: E402


def _positive(kind):
    """An argparse type: a number of `kind` above 0 (and finite)."""
    def parse(text):
        value = kind(text)
        if not 0 < value < float("inf"):
            raise argparse.ArgumentTypeError(f"{text!r} is not a positive number")
        return value
    return parse


def parse_args(argv=None) -> argparse.Namespace:
    seed = GNMTHParams()
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    model = parser.add_argument_group("model (defaults: the seed's size)")
    model.add_argument("--batch_size", type=_positive(int), default=seed.batch_size,
                       help="sentences per step (default: %(default)s)")
    model.add_argument("--vocab_size", type=_positive(int), default=seed.vocab_size,
                       help="words in each vocabulary (default: %(default)s)")
    model.add_argument("--max_seq_length", type=_positive(int), default=seed.max_seq_length,
                       help="words per sentence (default: %(default)s)")
    model.add_argument("--rnn_units", type=_positive(int), default=seed.rnn_units,
                       help="units of each recurrent layer (default: %(default)s)")
    model.add_argument("--num_layers", type=_positive(int), default=seed.num_layers,
                       help="recurrent layers of the encoder and of the decoder, 2 or more "
                       "(default: %(default)s)")
    model.add_argument("--rnn_unit_type", choices=("lstm", "gru"), default=seed.rnn_unit_type,
                       help="(default: %(default)s)")
    placing = parser.add_argument_group("placement and training")
    placing.add_argument("--num_devices", type=_positive(int), default=4,
                         help="devices to place on (default: %(default)s)")
    methods = sorted(m for m in PLACEMENT_METHODS if m != "expert")  # no hand layout given here
    placing.add_argument("--placement_method", choices=methods, default="auto",
                         metavar="METHOD", help="one of %(choices)s (default: %(default)s)")
    placing.add_argument("--refine_seconds", type=float, default=3.0,
                         help="auto: time for refining the placement, 0 for none (default: %(default)s)")
    placing.add_argument("--profile_steps", type=_positive(int), default=3,
                         help="traced steps of the profile, after one warm-up step (default: %(default)s)")
    placing.add_argument("--learning_rate", type=_positive(float), default=0.001,
                         help="Adam's learning rate (default: %(default)s)")
    placing.add_argument("--steps", type=_positive(int), default=10,
                         help="training steps after the first, placed one (default: %(default)s)")
    args = parser.parse_args(argv)
    try:  # before the model is built: its errors come at once
        PlacementOptions(placement_method=args.placement_method, refine_seconds=args.refine_seconds).validate()
    except BaechiError as e:
        parser.error(str(e))
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    import_tensorflow_quietly()  # without TF's C++ start-up lines (oneDNN, absl::InitializeLog)
    import tensorflow as tf

    from baechi_tf import BaechiSession

    tf1 = tf.compat.v1
    tf.get_logger().setLevel("ERROR")
    hparams = GNMTHParams(
        batch_size=args.batch_size, vocab_size=args.vocab_size,
        max_seq_length=args.max_seq_length, rnn_units=args.rnn_units,
        num_layers=args.num_layers, rnn_unit_type=args.rnn_unit_type,
        num_gpus=args.num_devices)
    spec = build_model("gnmt_v2", hparams)
    with spec.graph.as_default():
        optimizer = tf1.train.AdamOptimizer(args.learning_rate)
        train_op = optimizer.minimize(spec.loss, colocate_gradients_with_ops=True)
        init = tf1.global_variables_initializer()
    print(f"GNMT v2: {len(spec.graph.get_operations())} ops (batch {args.batch_size}, "
          f"{args.max_seq_length} steps, vocabulary {args.vocab_size}, {args.num_layers} layers "
          f"of {args.rnn_units} {args.rnn_unit_type.upper()} units)", flush=True)

    session = tf1.Session(graph=spec.graph)
    session.run(init)
    options = PlacementOptions(placement_method=args.placement_method,
                               refine_seconds=args.refine_seconds)
    with BaechiSession(session, options=options, num_devices=args.num_devices,
                       warmup_steps=1, profile_steps=args.profile_steps) as sess:
        t0 = time.perf_counter()
        loss, _ = sess.run([spec.loss, train_op], feed_dict=spec.feeds)
        first = time.perf_counter() - t0
        report = sess.placement
        print(report.summary())
        print(f"first step (profile {counted(args.profile_steps, 'step')}, place, run): {first:.1f} s; "
              f"placement {report.result.placement_seconds:.2f} s; loss {loss:.3f}", flush=True)
        times = []
        with LoadMeter() as meter:
            for step in range(1, args.steps + 1):
                t0 = time.perf_counter()
                loss, _ = sess.run([spec.loss, train_op], feed_dict=spec.feeds)
                times.append(time.perf_counter() - t0)
                interrupts.check()  # a Ctrl-C that TensorFlow printed and dropped still stops here
                print(f"step {step}: loss {loss:.3f}, {1e3 * times[-1]:.1f} ms", flush=True)
    if times:
        print(f"average step time {1e3 * sum(times) / len(times):.1f} ms over "
              f"{counted(len(times), 'step')}; simulated {report.makespan_us / 1e3:.1f} ms")
        busy = busy_warning(meter.load, "the steps", "they ran slower than on an idle machine")
        if busy:
            print(f"note: {busy}")
    return 0


def _main() -> int:
    try:
        # TensorFlow can turn a Ctrl-C into another exception; `interrupts` still knows it was one.
        with interrupts.recording():
            return main()
    except BaseException as e:
        return interrupts.exit_status(e, interrupted="gnmt_v2: interrupted", failed="gnmt_v2: error: ")


if __name__ == "__main__":
    sys.exit(_main())
