"""The simulator checked against TensorFlow's own measurements (issue 38): both halves, one command.

1. Memory (`bench/fidelity_memory.py`): the graphs of `bench/fidelity_graphs.py` (GNMT v2,
   Inception-v3, Transformer, tf_keras ResNet50 and MobileNetV2, an unrolled LSTM) placed by
   several methods, loose and under a tight limit, run on 4 CPU stand-ins in one process; each
   device's simulated peak against the peak rebuilt from the step's allocation records
   (`baechi_tf.cost_model.measured_memory`). Target: every device in [1.0, 1.25] times measured.
2. Step time (`bench/fidelity_time.py`): the model graphs and an unrolled RNN placed on two
   single-core worker tasks (`tf.distribute.Server` on loopback, each pinned to its own core), the
   link fitted from a transfer benchmark between them, each placement run in seeded rounds;
   simulated against measured median step. Targets: median absolute error at most 15%, Spearman
   rank correlation at least 0.9 per graph, auto's choice the fastest or within 5%.

Each half runs in a process of its own (they configure TensorFlow's devices differently) and
prints its own table and summary; this script prints both, one after the other, and the exit
status is the first non-zero one. The step times need a quiet machine: the time half prints how
much of the cores other processes took while it measured.

    .venv/bin/python bench/fidelity.py            # about 20 minutes here
    .venv/bin/python bench/fidelity.py --quick    # a smoke run of each half
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from typing import Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))


def _half(script: str, args: Sequence[str]) -> int:
    print(f"\n=== {script} {' '.join(args)}".rstrip(), flush=True)
    return subprocess.run([sys.executable, os.path.join(HERE, script), *args]).returncode


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run of each half (fewer graphs and steps)")
    parser.add_argument("--only", choices=("memory", "time"),
                        help="run one half only (default: both, memory first)")
    parser.add_argument("--out_dir", default=os.path.join(HERE, "out", "fidelity"),
                        help="where the memory rows (memory.json) and the time half's saved runs go "
                             "(default: %(default)s)")
    args = parser.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    quick = ["--quick"] if args.quick else []
    status = 0
    if args.only in (None, "memory"):
        status = _half("fidelity_memory.py", [*quick, "--json", os.path.join(args.out_dir, "memory.json")])
    if args.only in (None, "time"):
        done = _half("fidelity_time.py", [*quick, "--save", os.path.join(args.out_dir, "time")])
        status = status or done
    return status


if __name__ == "__main__":
    sys.exit(main())
