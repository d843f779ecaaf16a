"""What running a graph through BaechiSession costs against a plain Session, and what its profile
sees (issue 39). Prints one table per measure, a row per model.

Models: tf_keras ResNet50, DenseNet121 and NASNetMobile (``weights=None``, one Momentum step of
sparse softmax cross-entropy, the batch-norm updates run with it) and GNMT v2 of baechi_tf.models
(an Adam step), as bench/keras_graphs.py builds them. For each model, in one process, four
sessions of the same graph, each wrapping a plain Session that ran the initializer (the same
weights: the initializers are seeded), run the training step in turn:

* ``plain``: a ``tf.compat.v1.Session`` with TensorFlow's default optimizations;
* ``single``: ``BaechiSession(placement_method="single")`` on 4 CPU stand-ins, Grappler on (the
  default), and ``single, grappler off`` (``grappler=False``) beside it;
* ``m_etf``: ``BaechiSession(placement_method="m_etf")`` on the 4 stand-ins.

Step time: every round runs each session ``--steps`` times in turn, so that the sessions share
whatever else the machine runs; the figure is the median of all rounds' steps, and ``spread``
the interquartile range over that median. First placed step: seconds from making the
BaechiSession to the end of its first run (profiling, placing, importing the placed graph and the
step). Coverage: the share of the traced compute time that the graph's ops account for, with the
unmatched time by node type, from the profile the placement used. Then, of the ops that ran in a
traced step of the m_etf placement (Grappler's and fused nodes mapped to their ops): those whose
cost was estimated from shapes, no op of their type having been measured, and those of a type
that Grappler removed from the whole profiled step (``Identity`` on one device), profiled as
taking no time (`baechi_tf.cost_model.profiler.with_types_not_run`).
Losses: each session's losses against the plain session's, step by step: equal to the bit, or
the largest relative difference; ``plain again``, a second plain session run in turn with the
others, says how far two runs of the same graph differ here (GNMT v2's do, at times).

    .venv/bin/pip install --no-deps tf-keras==2.21.0     # once
    .venv/bin/python bench/run_overhead.py
    .venv/bin/python bench/run_overhead.py --models resnet50 --rounds 3

Nothing here is a test: the figures depend on the machine (and on what else runs on it).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# tf_keras 2.x is used only when this is set before TensorFlow is imported.
os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import flags  # noqa: E402  (bench/flags.py, beside this script; no TensorFlow)
import keras_graphs  # noqa: E402  (the models' training steps)

KERAS_MODELS = ["resnet50", "densenet121", "nasnetmobile"]  # of keras_graphs.APPLICATIONS
MODELS = [*KERAS_MODELS, "gnmt_v2"]
NUM_DEVICES = 4
VARIANTS = ("plain", "single", "single, grappler off", "m_etf")
# A second plain session: how far two runs of the same graph differ on this machine (its steps
# are not timed).
REFERENCE = "plain again"


def build(model: str, args: argparse.Namespace) -> tuple:
    """(graph, loss, train_op, init, feeds) of `model`'s training step (bench/keras_graphs.py)."""
    if model == "gnmt_v2":
        from baechi_tf.models import GNMTHParams

        return keras_graphs.build_gnmt(GNMTHParams(
            batch_size=args.gnmt_batch_size, vocab_size=args.gnmt_vocab_size, max_seq_length=args.gnmt_length,
            rnn_units=args.gnmt_units, num_layers=4, num_gpus=NUM_DEVICES))
    import tf_keras

    tf_keras.utils.set_random_seed(1)  # Keras draws its initializers' seeds in Python: the same weights
    return keras_graphs.build(model, args.batch_size, args.image_size, args.num_classes)


def measure(model: str, args: argparse.Namespace) -> dict[str, Any]:
    """The figures of one model (see the module docstring)."""
    import tensorflow as tf

    from baechi_tf import BaechiSession
    from baechi_tf.cost_model.executed import where_ops_ran

    tf1 = tf.compat.v1
    graph, loss, train_op, init, feeds = build(model, args)
    fetch = [loss, train_op]

    def plain_session() -> Any:
        sess = tf1.Session(graph=graph)
        sess.run(init)
        return sess

    sessions: dict[str, Any] = {"plain": plain_session(), REFERENCE: plain_session()}
    first_step_s: dict[str, float] = {}
    losses: dict[str, list[float]] = {v: [] for v in (*VARIANTS, REFERENCE)}
    for variant in ("plain", REFERENCE):  # their first steps, untimed
        losses[variant].append(float(sessions[variant].run(fetch, feeds)[0]))
    for variant, method, grappler in (("single", "single", True), ("single, grappler off", "single", False),
                                      ("m_etf", "m_etf", True)):
        user = plain_session()
        t0 = time.perf_counter()
        sess = BaechiSession(user, placement_method=method, num_devices=NUM_DEVICES, grappler=grappler)
        losses[variant].append(float(sess.run(fetch, feeds)[0]))
        first_step_s[variant] = time.perf_counter() - t0
        sessions[variant] = sess
    times: dict[str, list[float]] = {v: [] for v in (*VARIANTS, REFERENCE)}
    for _ in range(args.rounds):
        for variant in (*VARIANTS, REFERENCE):
            for _ in range(args.steps):
                t0 = time.perf_counter()
                value = sessions[variant].run(fetch, feeds)[0]
                times[variant].append(time.perf_counter() - t0)
                losses[variant].append(float(value))
    # A traced step of the m_etf placement: the ops that ran with a cost estimated from shapes.
    placed = sessions["m_etf"]
    metadata = tf1.RunMetadata()
    placed.run(fetch, feeds, run_metadata=metadata, options=tf1.RunOptions(
        trace_level=tf1.RunOptions.FULL_TRACE, output_partition_graphs=True))
    ran = where_ops_ran(metadata.step_stats, placed.placed_graph_def, metadata.partition_graphs)
    shape_estimated_ran = sorted(set(ran) & set(placed.placement.default_compute_ops))
    not_run_ran = sorted(n for n in ran if n in placed.profile.ops and placed.profile.ops[n].num_steps == 0)
    out = {
        "ops": len(graph.as_graph_def().node),
        "times": times,
        "first_step_s": first_step_s,
        "losses": losses,
        "coverage": {v: sessions[v].placement.coverage for v in VARIANTS[1:]},
        "shape_estimated": {v: len(sessions[v].placement.default_compute_ops) for v in VARIANTS[1:]},
        "shape_estimated_ran": shape_estimated_ran,
        "not_run_ran": not_run_ran,
        "ran": len(ran),
    }
    for sess in sessions.values():
        sess.close()
    return out


def _median_ms(values: list[float]) -> float:
    return 1e3 * statistics.median(values)


def _spread(values: list[float]) -> float:
    if len(values) < 4:
        return float("nan")
    q = statistics.quantiles(values, n=4)
    return (q[2] - q[0]) / statistics.median(values)


def _loss_check(got: list[float], expected: list[float]) -> str:
    n = min(len(got), len(expected))
    if got[:n] == expected[:n]:
        return f"equal ({n} steps)"
    worst = max(abs(g - e) / max(abs(e), 1e-30) for g, e in zip(got[:n], expected[:n]))
    return f"max rel. diff {worst:.1e} ({n} steps)"


def report(results: dict[str, dict[str, Any]]) -> None:
    print("\nStep time (median of all rounds' steps; spread = IQR / median)")
    print(f"{'model':<13} {'ops':>6} {'plain ms':>9} {'single ms':>10} {'vs plain':>9} {'grappler off ms':>16} "
          f"{'vs plain':>9} {'m_etf ms':>9}   spread plain / single / off / m_etf")
    for model, r in results.items():
        t = {v: _median_ms(r["times"][v]) for v in VARIANTS}
        spreads = " / ".join(f"{100 * _spread(r['times'][v]):.1f}%" for v in VARIANTS)
        print(f"{model:<13} {r['ops']:>6} {t['plain']:>9.1f} {t['single']:>10.1f} {t['single'] / t['plain']:>8.3f}x "
              f"{t['single, grappler off']:>16.1f} {t['single, grappler off'] / t['plain']:>8.3f}x "
              f"{t['m_etf']:>9.1f}   {spreads}")
    print("\nTime to the first placed step (s: profile, place, import, the step)")
    print(f"{'model':<13} {'single':>8} {'grappler off':>13} {'m_etf':>8}")
    for model, r in results.items():
        f = r["first_step_s"]
        print(f"{model:<13} {f['single']:>8.1f} {f['single, grappler off']:>13.1f} {f['m_etf']:>8.1f}")
    print("\nProfile coverage (share of the traced compute time matched to graph ops; ops of unmeasured "
          "types, estimated from shapes)")
    for model, r in results.items():
        for variant in VARIANTS[1:]:
            c = r["coverage"][variant]
            unmatched = c.unmatched_by_type(limit=3) or "unknown"
            print(f"{model:<13} {variant:<21} {100 * c.compute_share:6.2f}%  shape-estimated "
                  f"{r['shape_estimated'][variant]:>5}  unmatched {unmatched}")
        ran, zero = r["shape_estimated_ran"], r["not_run_ran"]
        print(f"{model:<13} m_etf traced step: {r['ran']} ops ran, {len(ran)} of them shape-estimated"
              + (f" (first: {ran[0]})" if ran else "")
              + f", {len(zero)} of a type the profile saw removed (0 us)" + (f" (first: {zero[0]})" if zero else ""))
    print("\nLosses against the plain session, step by step")
    for model, r in results.items():
        expected = r["losses"]["plain"]
        checks = ", ".join(f"{v}: {_loss_check(r['losses'][v], expected)}" for v in (*VARIANTS[1:], REFERENCE))
        print(f"{model:<13} {checks}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS),
                        help=f"comma-separated models, of {', '.join(MODELS)} (default: %(default)s)")
    parser.add_argument("--rounds", type=flags.at_least(1), default=5,
                        help="rounds, each running every session --steps times (default: %(default)s)")
    parser.add_argument("--steps", type=flags.at_least(1), default=2, help="steps of each session per round (default: %(default)s)")
    parser.add_argument("--batch_size", type=flags.at_least(1), default=16, help="Keras models: images per step (default: %(default)s)")
    parser.add_argument("--image_size", type=flags.at_least(32), default=96,
                        help="Keras models: height and width of the images, 32 or more (default: %(default)s)")
    parser.add_argument("--num_classes", type=flags.at_least(2), default=1000, help="Keras models: classes (default: %(default)s)")
    parser.add_argument("--gnmt_batch_size", type=flags.at_least(1), default=64, help="GNMT v2: sentences per step (default: %(default)s)")
    parser.add_argument("--gnmt_vocab_size", type=flags.at_least(1), default=8000, help="GNMT v2: vocabulary (default: %(default)s)")
    parser.add_argument("--gnmt_length", type=flags.at_least(1), default=20, help="GNMT v2: tokens per sentence (default: %(default)s)")
    parser.add_argument("--gnmt_units", type=flags.at_least(1), default=256, help="GNMT v2: LSTM units (default: %(default)s)")
    args = parser.parse_args()
    names = flags.chosen(parser, args.models, "--models", MODELS, "model")
    if not keras_graphs.start_tensorflow("run_overhead.py", names):
        return 1
    results = {}
    for name in names:
        t0 = time.perf_counter()
        try:
            results[name] = measure(name, args)
        except Exception as e:  # a model that does not build here (NASNetMobile) is reported, not fatal
            print(f"{name}: not measured: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}", flush=True)
            continue
        print(f"{name}: measured in {time.perf_counter() - t0:.0f} s", flush=True)
    report(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
