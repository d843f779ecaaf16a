"""Profiles of real models for bench/quality.py: bench/profiles/<model>.json.

For small GNMT v2, Inception-v3 and Transformer training graphs (Adam, SGD for Inception-v3;
gradients colocated with their ops, as train.py builds them without --only_forward), on 4 virtual CPU devices standing in
for GPUs: lays the graph out with the model's expert layout (as train.py --costgen does),
profiles it (`profile_fetch`: 2 warm-up steps, 5 traced ones), imports it to an `OpGraph` with
the cluster (4 devices of 8 GiB, the default communication line) and writes the place-json
document (`json_io.graph_to_json`). Each model takes well under a minute here.

    .venv/bin/python bench/make_profiles.py [--models gnmt_v2,inception_v3,transformer]
    .venv/bin/python bench/quality.py --refine_seconds 3
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import tensorflow as tf  # noqa: E402

from baechi_tf._files import atomic_write  # noqa: E402
from baechi_tf.cost_model.profiler import profile_fetch  # noqa: E402  (fits oneDNN's extra outputs)
from baechi_tf.json_io import graph_to_json  # noqa: E402
from baechi_tf.models import GNMTHParams, InceptionV3HParams, TransformerHParams  # noqa: E402
from baechi_tf.rewriter.apply import apply_placement  # noqa: E402
from baechi_tf.rewriter.devices import session_config, standin_cluster  # noqa: E402
from baechi_tf.rewriter.importer import import_graph_def  # noqa: E402
from train import TrainConfig, build_graph, import_placed  # noqa: E402

NUM_DEVICES = 4
# model -> (hyper-parameters, optimizer). Inception-v3 trains with plain SGD here: Adam's slots
# would add some 2,000 ops and take its JSON past 3 MB.
MODELS = {
    "gnmt_v2": (GNMTHParams(batch_size=32, vocab_size=2000, max_seq_length=8, rnn_units=128,
                            num_layers=4, num_gpus=NUM_DEVICES), "adam"),
    "inception_v3": (InceptionV3HParams(batch_size=8, image_size=107, num_classes=100,
                                        depth_multiplier=0.25), "sgd"),
    "transformer": (TransformerHParams(batch_size=16, vocab_size=2000, max_seq_length=16,
                                       num_layers=2, num_heads=4, d_model=128, d_ff=512,
                                       num_gpus=NUM_DEVICES), "adam"),
}


def make_profile(name: str, hparams, optimizer: str) -> dict:
    """The place-json document of model `name`'s training graph, profiled here."""
    setup = standin_cluster(NUM_DEVICES, prefix="/job:localhost/replica:0/task:0")
    built = build_graph(TrainConfig(name, hparams, optimizer=optimizer, colocate_grads_with_ops=True))
    layout = built.spec.expert_placement(setup.cluster.names, built.graph_def)
    run = import_placed(built, apply_placement(built.graph_def, layout))
    with tf.compat.v1.Session(graph=run.graph, config=session_config(setup, grappler=False)) as sess:
        sess.run(run.init)
        profile = profile_fetch(sess, run.target, run.feeds, warmup_steps=2, traced_steps=5,
                                graph_def=built.graph_def)
    imported = import_graph_def(built.graph_def, profile, setup.cluster, host_device=setup.host,
                                device_aliases=setup.aliases)
    return graph_to_json(imported.graph, setup.cluster)


def model_names(parser: argparse.ArgumentParser, text: str) -> list[str]:
    """The models of a --models value, in its order; a parser error for one not in MODELS."""
    names = [n for n in text.split(",") if n]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    return names


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS),
                        help="comma-separated subset of %(default)s")
    parser.add_argument("--out_dir", default=os.path.join(ROOT, "bench", "profiles"),
                        help="folder of the <model>.json files, made when missing (default: bench/profiles)")
    args = parser.parse_args()
    tf.get_logger().setLevel("ERROR")
    names = model_names(parser, args.models)
    os.makedirs(args.out_dir, exist_ok=True)
    for name in names:
        t0 = time.perf_counter()
        doc = make_profile(name, *MODELS[name])
        path = os.path.join(args.out_dir, f"{name}.json")
        text = json.dumps(doc, separators=(",", ":"), sort_keys=True) + "\n"
        atomic_write(path, text)
        print(f"{name}: {len(doc['ops'])} ops, {len(doc['edges'])} edges, "
              f"{len(text) / 2**20:.2f} MiB -> {os.path.relpath(path, ROOT)} "
              f"({time.perf_counter() - t0:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
