"""A TensorFlow 2 custom training loop whose step is placed by Baechi: ``baechi_tf.function``.

    .venv/bin/python examples/tf2_function.py
    .venv/bin/python examples/tf2_function.py --towers=4 --hidden=1024 --batch_size=512 --steps=20

The model is a classifier of ``--towers`` independent MLP towers over the same input, whose
logits are summed: work that several devices can share. The training step is a plain Python
function with a ``tf.GradientTape`` and an SGD update, decorated with
``baechi_tf.function(num_devices=...)``. Its first call profiles the step on copies of the
weights, places every op on the devices (GPUs, or CPU devices standing in for them) and traces
the step again with each op on its device; later calls run the placed step. The same step under
``tf.function``, from the same initial weights, runs beside it: the example prints both losses,
the placement summary, and the step times of the placed and the unplaced program.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number")
    return value


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--towers", type=_positive, default=4, help="independent MLP towers (default: %(default)s)")
    parser.add_argument("--layers", type=_positive, default=3, help="hidden layers per tower (default: %(default)s)")
    parser.add_argument("--hidden", type=_positive, default=512, help="units per layer (default: %(default)s)")
    parser.add_argument("--features", type=_positive, default=256, help="input features (default: %(default)s)")
    parser.add_argument("--classes", type=_positive, default=10, help="(default: %(default)s)")
    parser.add_argument("--batch_size", type=_positive, default=256, help="(default: %(default)s)")
    parser.add_argument("--steps", type=_positive, default=10, help="timed steps after the first (default: %(default)s)")
    parser.add_argument("--num_devices", type=_positive, default=4, help="(default: %(default)s)")
    parser.add_argument("--placement_method", default="auto", help="(default: %(default)s)")
    return parser.parse_args(argv)


def build(args, tf):
    """The towers' weights (the same every time: stateless seeds) and the training step."""
    weights = []
    for t in range(args.towers):
        sizes = [args.features] + [args.hidden] * args.layers + [args.classes]
        weights += [
            tf.Variable(tf.random.stateless_normal([a, b], seed=[t, i]) * (2.0 / a) ** 0.5, name=f"tower{t}/w{i}")
            for i, (a, b) in enumerate(zip(sizes, sizes[1:]))
        ]
    per_tower = args.layers + 1

    def step(x, y):
        with tf.GradientTape() as tape:
            logits = 0.0
            for t in range(args.towers):
                h = x
                for i, w in enumerate(weights[t * per_tower:(t + 1) * per_tower]):
                    h = tf.matmul(h, w)
                    if i + 1 < per_tower:
                        h = tf.nn.relu(h)
                logits += h
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
        for w, g in zip(weights, tape.gradient(loss, weights)):
            w.assign_sub(0.01 * g)
        return loss

    return step


def timed(f, x, y, steps):
    """(loss of the first call, its seconds, losses of `steps` more, their mean milliseconds)."""
    t0 = time.perf_counter()
    first = float(f(x, y))
    first_s = time.perf_counter() - t0
    losses = []
    t0 = time.perf_counter()
    for _ in range(steps):
        losses.append(f(x, y))
    losses = [float(v) for v in losses]  # waits for the last step
    return first, first_s, losses, (time.perf_counter() - t0) / steps * 1e3


def main(argv=None) -> int:
    args = parse_args(argv)
    import baechi_tf
    import baechi_tf.tf2

    try:
        baechi_tf.tf2.standin_devices(args.num_devices)  # before TF runs anything
        import tensorflow as tf

        options = baechi_tf.PlacementOptions(placement_method=args.placement_method)
        placed = baechi_tf.function(build(args, tf), num_devices=args.num_devices, options=options)
        plain = tf.function(build(args, tf))
        x = tf.random.stateless_normal([args.batch_size, args.features], seed=[9, 9])
        y = tf.random.stateless_uniform([args.batch_size], seed=[9, 8], maxval=args.classes, dtype=tf.int32)
        p_first, p_first_s, p_losses, p_ms = timed(placed, x, y, args.steps)
    except baechi_tf.BaechiError as e:
        print(f"tf2_function: {e}", file=sys.stderr)
        return 2
    u_first, u_first_s, u_losses, u_ms = timed(plain, x, y, args.steps)
    print(placed.summary())
    print()
    print(f"first step: placed {p_first_s:.2f} s (trace, profile, place, trace again, run); "
          f"unplaced {u_first_s:.2f} s (trace, run)")
    for i, (a, b) in enumerate(zip([p_first] + p_losses, [u_first] + u_losses)):
        print(f"step {i}: loss placed {a:.6f}, unplaced {b:.6f}")
    apart = max(abs(a - b) / max(abs(b), 1e-12) for a, b in zip(p_losses, u_losses))
    print(f"largest relative difference of the losses: {apart:.1e}")
    report = placed.placement
    print(f"step time: placed {p_ms:.2f} ms, unplaced {u_ms:.2f} ms (mean of {args.steps} steps); "
          f"simulated {report.makespan_us / 1e3:.2f} ms placed, "
          f"{(report.single_device_makespan_us or float('nan')) / 1e3:.2f} ms on one device")
    return 0


if __name__ == "__main__":
    sys.exit(main())
