"""STUB, only to prove that `bazel build :train` and `bazel-bin/train --help` work.

The real train.py (profiling with --costgen, placement, step times; issue 5) replaces this file.
"""

import sys

from absl import app, flags

flags.DEFINE_string("model_name", "inception_v3", "Model to build (stub: not used yet).")

FLAGS = flags.FLAGS


def main(argv: list[str]) -> int:
    del argv
    print(FLAGS.main_module_help())
    print("train.py is a stub: the training and placement workflow is not written yet", file=sys.stderr)
    return 1


if __name__ == "__main__":
    app.run(main)
