"""Graphs nobody here wrote: tf_keras applications placed by BaechiSession with each method.

For each tf_keras application of ``--models`` (``weights=None``, ``--batch_size`` random images of
``--image_size`` pixels, ``--num_classes`` classes, one Momentum step of sparse softmax cross-entropy
with its batch-norm updates, as bench/keras_graphs.py builds them), in one process: a plain
``tf.compat.v1.Session`` on 5 CPU devices (the host and four stand-ins) runs the initializer and
``--steps`` training steps, fetching the loss; then, per method of ``--methods``, a new plain
session runs the same initializer (seeded: the same weights) and a ``BaechiSession`` on 4
stand-ins over it runs the same steps. The first of them profiles, places and imports the graph.

It prints a line per application and method: the graph's ops, the method the placement used,
the placement's seconds (`PlacementResult.placement_seconds`) and simulated step, the seconds to
the end of the first placed step (profile, place, import, the step), the share of the
machine's CPUs other work kept busy while the profile was taken (`CostProfile.machine_load`;
``-`` where not measured: a profile taken then is suspect), the median of the other
steps against the plain session's, and whether the losses equal the plain session's (``equal``,
or the largest relative difference), or the error that stopped the method. A line ``plain
again`` says how far a second plain session's losses are from the first's: TF's CPU kernels
need not add in the same order twice. The plain session runs
with all of TF's optimizations; a placed one without those shown to break a placement
(`baechi_tf.rewriter.devices.placed_graph_config`), so the last bits of a loss may differ and grow
over the steps.

    .venv/bin/pip install --no-deps tf-keras==2.21.0     # once
    .venv/bin/python bench/keras_sweep.py [--models xception,regnetx002] [--methods auto,m_sct]

The default set takes some 20 minutes here; m_sct on NASNetMobile alone takes more than ten
(its LP, CHANGELOG), so ``--methods auto,m_topo,m_etf`` leaves it out.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

import flags  # noqa: E402
import keras_graphs  # noqa: E402  (sets TF_USE_LEGACY_KERAS before TensorFlow loads)

# model -> tf_keras.applications constructor: none of them is in the other benches' sets
MODELS = {
    "xception": "Xception", "efficientnetb0": "EfficientNetB0", "nasnetmobile": "NASNetMobile",
    "mobilenetv3small": "MobileNetV3Small", "inceptionresnetv2": "InceptionResNetV2",
    "convnexttiny": "ConvNeXtTiny", "regnetx002": "RegNetX002", "efficientnetv2b0": "EfficientNetV2B0",
}
METHODS = ("auto", "m_topo", "m_etf", "m_sct")
NUM_DEVICES = 4


def _steps(sess, train_op, loss, feeds, steps: int) -> tuple[list[float], list[float]]:
    """(losses, seconds) of `steps` training steps; the loss is fetched with each step."""
    losses, seconds = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        _, value = sess.run([train_op, loss], feed_dict=feeds)
        seconds.append(time.perf_counter() - t0)
        losses.append(float(value))
    return losses, seconds


def _agreement(losses: list[float], plain: list[float]) -> str:
    worst = max(abs(a - b) / max(abs(b), 1e-30) for a, b in zip(losses, plain))
    return "equal" if worst == 0 else f"{worst:.1e}"


def sweep_model(model: str, methods, args, out=sys.stdout) -> None:
    import tensorflow as tf

    from baechi_tf import BaechiSession

    graph, loss, train_op, init, feeds = keras_graphs.build(
        MODELS[model], args.batch_size, args.image_size, args.num_classes
    )  # the constructor's name: keras_graphs.APPLICATIONS holds the others' sets
    ops = len(graph.as_graph_def().node)
    config = tf.compat.v1.ConfigProto(device_count={"CPU": NUM_DEVICES + 1})
    with tf.compat.v1.Session(graph=graph, config=config) as sess:
        sess.run(init)
        plain, plain_s = _steps(sess, train_op, loss, feeds, args.steps)
    with tf.compat.v1.Session(graph=graph, config=config) as sess:  # how far two plain runs differ
        sess.run(init)
        again, _ = _steps(sess, train_op, loss, feeds, args.steps)
    print(f"{model:<17} {ops:>6} {'plain again':<26} {'':>7} {'':>9} {'':>7} {'':>5}  {'':>19}  "
          f"{_agreement(again, plain)}", file=out, flush=True)
    for method in methods:
        sess = tf.compat.v1.Session(graph=graph, config=config)
        try:
            sess.run(init)
            t0 = time.perf_counter()
            placed = BaechiSession(sess, placement_method=method, num_devices=NUM_DEVICES)
            losses, seconds = _steps(placed, train_op, loss, feeds, 1)
            first_s = time.perf_counter() - t0
            more, seconds = _steps(placed, train_op, loss, feeds, args.steps - 1)
            result = placed.placement.result
            step = (f"{statistics.median(seconds) * 1e3:8.1f} / {statistics.median(plain_s[1:]) * 1e3:8.1f}"
                    if seconds else f"{'-':>8} / {'-':>8}")
            load = placed.placement.coverage.machine_load
            busy = f"{100 * load.share:.0f}%" if load is not None else "-"
            print(f"{model:<17} {ops:>6} {method:<7} {result.placement.method:<18} "
                  f"{result.placement_seconds:>7.2f} {result.makespan_us / 1e3:>9.1f} {first_s:>7.1f} {busy:>5}  "
                  f"{step}  {_agreement(losses + more, plain)}", file=out, flush=True)
            placed.close()
        except Exception as e:  # a failure is a row of its own, said as such
            print(f"{model:<17} {ops:>6} {method:<7} failed: {type(e).__name__}: {e}", file=out, flush=True)
        finally:
            sess.close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS),
                        help="comma-separated tf_keras applications (default: %(default)s)")
    parser.add_argument("--methods", default=",".join(METHODS), help="placers (default: %(default)s)")
    keras_graphs.add_step_flags(parser, image_size=96, num_classes=10)
    parser.add_argument("--steps", type=flags.at_least(2), default=3,
                        help="training steps per session, the first placed one included (default: %(default)s)")
    args = parser.parse_args(argv)
    models = flags.chosen(parser, args.models, "--models", list(MODELS), "model")
    methods = flags.chosen(parser, args.methods, "--methods", METHODS, "method")
    if not keras_graphs.start_tensorflow("keras_sweep.py", ["nasnetmobile"]):  # any application: tf_keras
        return 1

    print(f"{'model':<17} {'ops':>6} {'method':<7} {'placed by':<18} {'place s':>7} {'sim ms':>9} {'first s':>7} {'busy':>5}  "
          f"step ms (placed / plain)  losses against plain")
    for model in models:
        sweep_model(model, methods, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
