"""The emulation of TF's executor under other constants, scored on measured peaks: for each
combination of emulated steps, `JITTER` and window, how many devices of saved
`bench/fidelity_memory.py --save DIR` runs the emulated peak puts in the target [1.0, 1.25] of
their measured peak, under it, and over it.

`executor_order.expected_peaks` stands behind the highest peak of `EMULATED_STEPS` jittered
emulated steps (and one of the schedule's own durations), each op up to `EMULATED_WINDOW` places
out of its emulated order, on each CPU stand-in of a shared pool of threads. Those constants were
chosen on measured peaks; this prints the table they were chosen from (docs/fidelity.md, "TF's
executor, emulated"), for any set of saved runs: each saved placement is placed again as a fixed
layout (as bench/fidelity_memory_resim.py does), each step emulated once per `JITTER`, and held
at every window (`executor_order.emulated_step_peaks`); fewer steps are the first steps of more.
The combination of the constants as they are is marked: its figures are those of
bench/fidelity_memory_resim.py on the same runs. Only stand-in runs of shared memory count
(``--shared_memory``); devices with a pool of their own are not emulated.

Each cell reads ``in target (under / over)``; a line per run follows for the constants as they
are and for the best other combination (most in the target, then fewest under). No TensorFlow
session runs; each step costs a pass over the schedule's memory per window: about 2 minutes per
run here at the defaults.

    .venv/bin/python bench/emulation_grid.py DIR [DIR ...] [--steps 16,32] [--jitters 0.6,1.0]
        [--windows 0,2,4]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from typing import Optional, Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(BENCH))
sys.path.insert(0, BENCH)

__all__ = ["main", "run_peaks", "score"]


def _numbers(kind: type, minimum: float, example: str):
    """An argparse ``type``: comma-separated numbers of `kind`, each at least `minimum`, in
    ascending order without repeats."""

    def parse(text: str) -> list:
        try:
            values = [kind(x) for x in text.split(",")]
        except ValueError:
            values = []
        if not values or min(values) < minimum:
            raise argparse.ArgumentTypeError(f"{text!r}: give numbers of at least {minimum:g}, separated by commas, "
                                             f"such as {example}")
        return sorted(set(values))

    return parse


def run_peaks(path: str, steps: int, jitters: Sequence[float], windows: Sequence[int]) -> list[tuple]:
    """Per row (device of a placement) of the saved graph ``path`` (its ``.json``) on a stand-in
    of a shared pool: (the saved `fidelity_memory.Row`, {jitter: int64 [len(windows), steps + 1],
    the device's emulated peak per window and step}). Rows of devices with a pool of their own
    are left out."""
    from fidelity_memory import Row
    from fidelity_memory_resim import placed_again, row_device

    from baechi_tf.placer.executor_order import emulated_step_peaks
    from baechi_tf.placer.memory_timeline import in_shared_pool, thread_pools

    with open(path) as f:
        doc = json.load(f)
    key = row_device(doc)
    by_placement = {}
    for p, result, _ in placed_again(path):
        graph, cluster, schedule = result.graph, result.cluster, result.schedule
        shared = in_shared_pool(thread_pools(cluster))
        per = {j: emulated_step_peaks(graph, cluster, schedule, steps, j, windows=windows) for j in jitters}
        by_placement[(p["method"], p["limit"])] = {
            key(d.name): {j: per[j][:, :, i] for j in jitters} for i, d in enumerate(cluster.devices) if shared[i]}
    out = []
    for saved in doc["rows"]:
        row = Row(**saved)
        peaks = by_placement[(row.method, row.limit)].get(row.device)
        if peaks is not None:
            out.append((row, peaks))
    return out


def score(rows: Sequence[tuple], jitter: float, window_index: int, steps: int) -> tuple[int, int, int]:
    """(in [1.0, 1.25] of the measured peak, under it, over 1.25 times it) of `rows` (`run_peaks`)
    with the highest peak of the first `steps` + 1 steps at ``windows[window_index]``."""
    inside = under = over = 0
    for row, peaks in rows:
        simulated = int(peaks[jitter][window_index, :steps + 1].max())
        measured = row.measured_bytes
        under += simulated < measured
        over += simulated > 1.25 * measured
        inside += measured <= simulated <= 1.25 * measured
    return inside, under, over


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="+", metavar="DIR", help="folders written by bench/fidelity_memory.py --save")
    parser.add_argument("--steps", type=_numbers(int, 0, "16,32"), default=[16, 32],
                        help="jittered emulated steps to try, comma-separated (default 16,32); fewer are the first "
                        "steps of more, so the largest sets the cost")
    parser.add_argument("--jitters", type=_numbers(float, 0, "0.6,1.0"), default=[0.6, 1.0],
                        help="spreads of the durations' random factor to try (default 0.6,1.0); each emulates "
                        "every step anew")
    parser.add_argument("--windows", type=_numbers(int, 0, "0,2,4"), default=[0, 2, 4],
                        help="places out of the emulated order each op may run, to try (default 0,2,4)")
    args = parser.parse_args(argv)
    runs = []
    for d in args.dirs:
        paths = sorted(glob.glob(os.path.join(d, "*.json")))
        if not paths:
            parser.error(f"{d}: no <graph>.json here; write one with bench/fidelity_memory.py --save DIR")
        runs.append((d, paths))

    from baechi_tf._startup import import_tensorflow_quietly

    import_tensorflow_quietly()
    import logging

    logging.getLogger("baechi_tf").setLevel(logging.ERROR)
    from baechi_tf.placer.executor_order import EMULATED_STEPS, EMULATED_WINDOW, JITTER

    # The constants as they are, always among the combinations.
    steps = sorted(set(args.steps) | {EMULATED_STEPS})
    jitters = sorted(set(args.jitters) | {JITTER})
    windows = sorted(set(args.windows) | {EMULATED_WINDOW})
    kept = (EMULATED_STEPS, JITTER, windows.index(EMULATED_WINDOW))
    per_run = []
    for d, paths in runs:
        rows = []
        for path in paths:
            rows += run_peaks(path, max(steps), jitters, windows)
            print(f"emulated {path}", file=sys.stderr, flush=True)
        per_run.append((os.path.basename(os.path.normpath(d)), rows))
    every = [r for _, rows in per_run for r in rows]
    if not every:
        parser.error("no device of a shared pool in these runs: save one with bench/fidelity_memory.py "
                     "--shared_memory --save DIR")
    print(f"{len(every)} devices of {len(per_run)} run(s); in [1.0, 1.25] of the measured peak (under / over); "
          f"* the constants as they are")
    print("| emulated steps, jitter | " + " | ".join(f"window {w}" for w in windows) + " |")
    print("| --- |" + " --- |" * len(windows))
    combos = []
    for s in steps:
        for j in jitters:
            cells = []
            for i, w in enumerate(windows):
                figures = score(every, j, i, s)
                combos.append((figures, (s, j, i)))
                mark = "*" if (s, j, i) == kept else ""
                cells.append(f"{figures[0]} ({figures[1]} / {figures[2]}){mark}")
            print(f"| {s}, {float(j)!r} | " + " | ".join(cells) + " |")
    best = max((c for c in combos if c[1] != kept), key=lambda c: (c[0][0], -c[0][1]), default=None)
    shown = [("as they are", kept)] + ([("best other", best[1])] if best else [])
    for title, (s, j, i) in shown:
        print(f"\n{title}: {s} steps, jitter {float(j)!r}, window {windows[i]}")
        for name, rows in per_run:
            figures = score(rows, j, i, s)
            print(f"  {name}: {figures[0]} of {len(rows)} in the target, {figures[1]} under, {figures[2]} over")
    return 0


if __name__ == "__main__":
    sys.exit(main())
