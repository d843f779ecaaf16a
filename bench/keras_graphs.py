"""Real Keras graphs for the placement benches: builds tf_keras applications as a training step in
a ``tf.compat.v1`` graph, profiles it as baechi_tf does and saves, per model, the GraphDef and
the cost profile that ``baechi place`` reads. ``--models gnmt_v2`` does the same for GNMT v2 of
baechi_tf.models at the seed's size (batch 128, vocabulary 30000, 40 steps, 4 layers of 512
LSTM units; some 32k ops), an Adam step as examples/gnmt_v2.py builds it: not Keras, but the
same benches need it (about a minute here, and 4.6 GB of memory).

Each model is built with ``weights=None`` (no download), random images of ``--image_size`` at
``--batch_size`` and one Momentum step of sparse softmax cross-entropy, its gradients colocated
with their ops and its batch-norm updates run with the step. The graph is profiled as
BaechiSession profiles: on the session of 4 CPU stand-ins (Grappler off, so that the traced ops
keep the graph's names), ``--warmup_steps`` untraced steps and then ``--traced_steps`` traced
ones (`baechi_tf.cost_model.profile_fetch`). Written to ``--out_dir``:

    <model>.pb        the GraphDef (binary)
    <model>.profile   its CostProfile (baechi_tf's protobuf file)

The files are large: the default folder, bench/out/keras/, is git-ignored. Place one with

    baechi place --graph bench/out/keras/densenet121.pb \\
        --cost_path bench/out/keras/densenet121.profile --num_devices 4 --device_type CPU \\
        --placement_method m_etf --out /tmp/densenet121_placed.pb

bench/placement_speed.py times exactly that on the files. Needs tf_keras 2.21 next to
TensorFlow 2.21 (``pip install --no-deps tf-keras==2.21.0``); TF_USE_LEGACY_KERAS=1 is set here
before TensorFlow loads. DenseNet121 (some 16k ops) takes some 15 s here, ResNet50 (some 8k
ops) less.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from typing import Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# tf_keras 2.x is used only when this is set before TensorFlow is imported (else tf.keras is
# Keras 3, which builds no tf.compat.v1 graph).
os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import flags  # noqa: E402  (bench/flags.py, beside this script; no TensorFlow)

DEFAULT_OUT_DIR = os.path.join(ROOT, "bench", "out", "keras")
NUM_DEVICES = 4
# model -> the tf_keras.applications constructor's name
KERAS_MODELS = {"densenet121": "DenseNet121", "resnet50": "ResNet50", "mobilenetv2": "MobileNetV2"}
# the models `build` makes: those, and others that benches use (bench/run_overhead.py)
APPLICATIONS = {**KERAS_MODELS, "nasnetmobile": "NASNetMobile"}
# and GNMT v2 of baechi_tf.models (plain tf.compat.v1 ops, not Keras), for the same benches
MODELS = [*APPLICATIONS, "gnmt_v2"]
DEFAULT_MODELS = "densenet121,resnet50,gnmt_v2"  # what bench/placement_speed.py reads
INSTALL_HINT = "pip install --no-deps tf-keras==2.21.0"


def graph_path(out_dir: str, model: str) -> str:
    """Where the GraphDef of `model` is written."""
    return os.path.join(out_dir, f"{model}.pb")


def profile_path(out_dir: str, model: str) -> str:
    """Where the cost profile of `model` is written."""
    return os.path.join(out_dir, f"{model}.profile")


def start_tensorflow(script: str, names: Sequence[str]) -> bool:
    """Imports TensorFlow quietly (its logger at ERROR) and says True; False, after one line on
    stderr naming `script`, when `names` hold a Keras model and tf_keras is not installed."""
    if importlib.util.find_spec("tf_keras") is None and set(names) & set(APPLICATIONS):
        print(f"{script}: error: tf_keras is not installed; install it next to TensorFlow with "
              f"'{INSTALL_HINT}' (--no-deps: it would otherwise pull another TensorFlow)", file=sys.stderr)
        return False
    from baechi_tf._startup import import_tensorflow_quietly

    import_tensorflow_quietly()
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")
    return True


def build_gnmt(hparams=None):
    """(graph, loss, train_op, init_op, feeds) of one Adam step of GNMT v2 (`hparams`, default:
    the seed's size), its gradients colocated with their ops, as examples/gnmt_v2.py builds it."""
    import tensorflow as tf

    from baechi_tf.models import GNMTHParams, build_model

    tf1 = tf.compat.v1
    spec = build_model("gnmt_v2", hparams or GNMTHParams(num_gpus=NUM_DEVICES))
    with spec.graph.as_default():
        train_op = tf1.train.AdamOptimizer(0.001).minimize(spec.loss, colocate_gradients_with_ops=True)
        init = tf1.global_variables_initializer()
    return spec.graph, spec.loss, train_op, init, spec.feeds


def build(model: str, batch_size: int, image_size: int, num_classes: int):
    """(graph, loss, train_op, init_op, feeds) of one Momentum training step of Keras model
    `model`: a key of `APPLICATIONS`, or the name of a ``tf_keras.applications`` constructor."""
    import numpy as np
    import tensorflow as tf
    import tf_keras

    tf1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        tf1.set_random_seed(1)
        images = tf1.placeholder(tf.float32, (batch_size, image_size, image_size, 3), name="images")
        labels = tf1.placeholder(tf.int32, (batch_size,), name="labels")
        net = getattr(tf_keras.applications, APPLICATIONS.get(model, model))(
            weights=None, input_shape=(image_size, image_size, 3), classes=num_classes
        )
        probabilities = net(images, training=True)  # the applications end in a softmax
        loss = tf.reduce_mean(tf_keras.losses.sparse_categorical_crossentropy(labels, probabilities))
        optimizer = tf1.train.MomentumOptimizer(learning_rate=0.01, momentum=0.9)
        with tf.control_dependencies(net.get_updates_for(images) + net.get_updates_for(None)):
            train_op = optimizer.minimize(loss, colocate_gradients_with_ops=True)
        init = tf1.global_variables_initializer()
    rng = np.random.default_rng(0)
    feeds = {
        images: rng.standard_normal(images.shape.as_list()).astype(np.float32),
        labels: rng.integers(0, num_classes, batch_size).astype(np.int32),
    }
    return graph, loss, train_op, init, feeds


def add_step_flags(parser: argparse.ArgumentParser, *, image_size: int = 64, num_classes: int = 1000) -> None:
    """--batch_size, --image_size and --num_classes: the arguments of `build` for a Keras model."""
    parser.add_argument("--batch_size", type=flags.at_least(1), default=8, help="images per step (default: %(default)s)")
    parser.add_argument("--image_size", type=flags.at_least(32), default=image_size,
                        help="height and width of the images, 32 or more (default: %(default)s)")
    parser.add_argument("--num_classes", type=flags.at_least(2), default=num_classes,
                        help="classes of the last layer (default: %(default)s)")


def build_and_profile(model: str, args: argparse.Namespace) -> dict:
    """Builds, profiles and writes `model`; its op count and the seconds of each stage."""
    import tensorflow as tf

    from baechi_tf.cost_model import profile_fetch, save_profile
    from baechi_tf._files import atomic_write
    from baechi_tf.rewriter.devices import LOCAL_TASK, session_config, standin_cluster

    t0 = time.perf_counter()
    if model == "gnmt_v2":
        graph, _, train_op, init, feeds = build_gnmt()
    else:
        graph, _, train_op, init, feeds = build(model, args.batch_size, args.image_size, args.num_classes)
    graph_def = graph.as_graph_def()
    t1 = time.perf_counter()
    setup = standin_cluster(NUM_DEVICES, prefix=LOCAL_TASK)
    with tf.compat.v1.Session(graph=graph, config=session_config(setup, grappler=False)) as sess:
        sess.run(init)
        profile = profile_fetch(sess, train_op, feeds, warmup_steps=args.warmup_steps,
                                traced_steps=args.traced_steps, graph_def=graph_def)
    t2 = time.perf_counter()
    atomic_write(graph_path(args.out_dir, model), graph_def.SerializeToString(deterministic=True))
    save_profile(profile, profile_path(args.out_dir, model))
    return {"ops": len(graph_def.node), "profiled": len(profile.ops), "build_s": t1 - t0,
            "profile_s": t2 - t1, "save_s": time.perf_counter() - t2}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=DEFAULT_MODELS,
                        help=f"comma-separated models, of {', '.join(MODELS)} (default: %(default)s)")
    parser.add_argument("--out_dir", default=DEFAULT_OUT_DIR,
                        help="folder of the <model>.pb and <model>.profile files, made when missing "
                        "(default: bench/out/keras, git-ignored)")
    add_step_flags(parser)
    parser.add_argument("--warmup_steps", type=flags.at_least(0), default=1,
                        help="untraced steps before the traced ones (default: %(default)s)")
    parser.add_argument("--traced_steps", type=flags.at_least(1), default=3,
                        help="traced steps; the profile takes their median (default: %(default)s)")
    args = parser.parse_args()
    names = flags.chosen(parser, args.models, "--models", list(MODELS), "model")
    if not start_tensorflow("keras_graphs.py", names):
        return 1
    os.makedirs(args.out_dir, exist_ok=True)
    print(f"{'model':<12} {'ops':>7} {'profiled':>8} {'build s':>8} {'profile s':>9}", flush=True)
    for name in names:
        r = build_and_profile(name, args)
        print(f"{name:<12} {r['ops']:>7} {r['profiled']:>8} {r['build_s']:>8.1f} {r['profile_s']:>9.1f}",
              flush=True)
    rel = os.path.relpath(args.out_dir)
    print(f"\nwritten to {rel}/: <model>.pb (GraphDef) and <model>.profile (CostProfile). Place one with\n"
          f"  baechi place --graph {rel}/{names[0]}.pb --cost_path {rel}/{names[0]}.profile "
          f"--num_devices {NUM_DEVICES} --device_type CPU --placement_method m_etf --out placed.pb")
    return 0


if __name__ == "__main__":
    sys.exit(main())
