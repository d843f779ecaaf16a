"""Keras 3 ``model.fit`` with its train step placed by Baechi: ``baechi_tf.tf2.keras.place``.

    .venv/bin/python examples/keras_fit.py                       # ResNet50, 32x32 images
    .venv/bin/python examples/keras_fit.py --model=mlp --steps=20

The model is ``keras.applications.ResNet50(weights=None)`` at a small image size (or a small MLP,
``--model=mlp``), compiled with SGD. ``place(model, sample_batch, num_devices=...)`` profiles the
train step on copies of the weights and places it on the devices (GPUs, or CPU devices standing
in for them) before ``fit``; ``fit`` then runs the placed step. The same model from the same
initial weights is fitted unplaced beside it. The example prints the placement summary, both
losses, and the step times of the placed and the unplaced ``fit``. The losses are equal: the
placement keeps together the ops TF fuses or regroups on one device (docs/tf2.md, "Values").
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number")
    return value


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=("resnet50", "mlp"), default="resnet50", help="(default: %(default)s)")
    parser.add_argument("--image_size", type=_positive, default=32, help="ResNet50's input, 32 or more (default: %(default)s)")
    parser.add_argument("--batch_size", type=_positive, default=16, help="(default: %(default)s)")
    parser.add_argument("--steps", type=_positive, default=5, help="timed steps of fit after the first (default: %(default)s)")
    parser.add_argument("--num_devices", type=_positive, default=4, help="(default: %(default)s)")
    parser.add_argument("--placement_method", default="auto", help="(default: %(default)s)")
    args = parser.parse_args(argv)
    if args.model == "resnet50" and args.image_size < 32:
        parser.error(f"argument --image_size: ResNet50 takes images of 32 pixels or more, not {args.image_size}")
    return args


def build(args, keras):
    """The model, compiled, with the same initial weights every time."""
    keras.utils.set_random_seed(0)
    if args.model == "resnet50":
        model = keras.applications.ResNet50(weights=None, input_shape=(args.image_size, args.image_size, 3), classes=10)
    else:
        model = keras.Sequential([keras.Input((256,))] + [keras.layers.Dense(512, activation="relu") for _ in range(4)]
                                 + [keras.layers.Dense(10)])
    model.compile(optimizer=keras.optimizers.SGD(0.01),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=args.model == "mlp"))
    return model


def timed_fit(model, x, y, args):
    """(losses of the first step and of `steps` more, seconds of the first, ms per later step)."""
    t0 = time.perf_counter()
    first = model.fit(x[: args.batch_size], y[: args.batch_size], batch_size=args.batch_size, verbose=0, shuffle=False)
    first_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    later = model.fit(x, y, batch_size=args.batch_size, epochs=args.steps, verbose=0, shuffle=False)
    ms = (time.perf_counter() - t0) / args.steps * 1e3
    return first.history["loss"] + later.history["loss"], first_s, ms


def main(argv=None) -> int:
    args = parse_args(argv)
    import numpy as np

    import baechi_tf
    import baechi_tf.tf2
    import baechi_tf.tf2.keras

    try:
        baechi_tf.tf2.standin_devices(args.num_devices)  # before TF runs anything
        import keras

        shape = (args.image_size, args.image_size, 3) if args.model == "resnet50" else (256,)
        rng = np.random.RandomState(0)
        x = rng.rand(args.batch_size, *shape).astype("float32")  # one batch: each epoch is a step
        y = rng.randint(0, 10, args.batch_size)
        placed_model, plain_model = build(args, keras), build(args, keras)
        t0 = time.perf_counter()
        placed = baechi_tf.tf2.keras.place(
            placed_model, (x, y), num_devices=args.num_devices,
            options=baechi_tf.PlacementOptions(placement_method=args.placement_method),
        )
        place_s = time.perf_counter() - t0
        p_losses, p_first_s, p_ms = timed_fit(placed_model, x, y, args)
    except baechi_tf.BaechiError as e:
        print(f"keras_fit: {e}", file=sys.stderr)
        return 2
    u_losses, u_first_s, u_ms = timed_fit(plain_model, x, y, args)
    print(placed.summary())
    print()
    print(f"place (trace, profile, place, trace again): {place_s:.1f} s; first fit step: placed "
          f"{p_first_s:.2f} s, unplaced {u_first_s:.2f} s")
    for i, (a, b) in enumerate(zip(p_losses, u_losses)):
        print(f"step {i}: loss placed {a:.6f}, unplaced {b:.6f}")
    report = placed.placement
    print(f"step time: placed {p_ms:.1f} ms, unplaced {u_ms:.1f} ms (mean of {args.steps} fit epochs of one "
          f"step); simulated {report.makespan_us / 1e3:.1f} ms placed, "
          f"{(report.single_device_makespan_us or float('nan')) / 1e3:.1f} ms on one device")
    return 0


if __name__ == "__main__":
    sys.exit(main())
