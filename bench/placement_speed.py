"""The placement-speed targets of issue 35, measured here: prints a table of measure, target,
measured figure and whether the target is met.

Every figure is the median of --repeats runs (--slow_repeats for the rows that run a process
each), on 4 devices of 16 GiB (no memory limit in effect) with the default communication cost.
What each row times:

* m-TOPO, m-ETF, m-SCT: the placer alone (`PLACEMENT_METHODS[m](graph, cluster, groups,
  options)`, m-SCT's LP included) on a seeded layered graph (bench/layered.py, as
  bench/placement_scaling.py builds them); grouping is done once before. The target is judged
  on that figure; the whole pipeline with the method (`placer.pipeline.place`: group, place,
  check, one-device baseline) is given beside it.
* auto: the whole pipeline (`placer.pipeline.place`: group, auto's portfolio and refinement,
  check, baseline) with the default options. At 100k ops it runs in a child process, whose peak
  RSS is the figure (its workers, which it waits for, are reported apart).
* native vs python: m-ETF and `simulate` of m-ETF's placement at 10k ops, under each engine of
  baechi_tf/placer/engine.py, side by side; the ratio of the medians.
* DenseNet121, ResNet50, GNMT v2: the whole `baechi place` command (a process: TensorFlow's
  import, reading the files, import, placement, writing the placed graph), on the GraphDef and
  profile that bench/keras_graphs.py writes to bench/out/keras/, on 4 CPU stand-ins.

    .venv/bin/python bench/keras_graphs.py                       # once: writes bench/out/keras/
    .venv/bin/python bench/placement_speed.py
    .venv/bin/python bench/placement_speed.py --quick            # no 100k rows, no TensorFlow
    .venv/bin/python bench/placement_speed.py --engine python    # the reference engine

Nothing here is a test: the figures depend on the machine (and on what else runs on it).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import time
from typing import Callable, Optional, Union

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

NUM_DEVICES = 4
MEMORY_BYTES = 16 << 30
KERAS_DIR = os.path.join(ROOT, "bench", "out", "keras")
ENGINE_MODULE = "baechi_tf.placer.engine"
GIB = 1 << 30

Figure = Union[float, str]  # seconds, or why there is none


@dataclasses.dataclass(frozen=True)
class Row:
    measure: str
    target: str
    measured: str
    met: str  # 'yes', 'no' or '-' (nothing measured, or not at the target's size)


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    """The median wall time of `repeats` calls of `fn`."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _engine_module():
    """baechi_tf.placer.engine, or None when this checkout has none."""
    if importlib.util.find_spec(ENGINE_MODULE) is None:
        return None
    return importlib.import_module(ENGINE_MODULE)


class Layered:
    """The seeded layered graphs, their groups and the cluster, each made once."""

    def __init__(self) -> None:
        from baechi_tf.cluster import Cluster

        self.cluster = Cluster.homogeneous(NUM_DEVICES, MEMORY_BYTES)
        self._made: dict[int, tuple] = {}

    def get(self, num_ops: int):
        from baechi_tf.placer.grouping import make_groups
        from layered import layered_graph

        if num_ops not in self._made:
            graph = layered_graph(num_ops, seed=num_ops)  # as placement_scaling --shape layered
            graph.validate()
            self._made[num_ops] = (graph, make_groups(graph, "tf"))
        return self._made[num_ops]

    def placer_seconds(self, method: str, num_ops: int, repeats: int) -> float:
        from baechi_tf.placer.pipeline import PLACEMENT_METHODS, PlacementOptions

        graph, groups = self.get(num_ops)
        options = PlacementOptions(placement_method=method)
        return median_seconds(lambda: PLACEMENT_METHODS[method](graph, self.cluster, groups, options), repeats)

    def pipeline_seconds(self, method: str, num_ops: int, repeats: int) -> float:
        """The whole pipeline (`place`: group, place, check, one-device baseline) with `method`."""
        from baechi_tf.placer.pipeline import PlacementOptions, place

        graph, _ = self.get(num_ops)
        options = PlacementOptions(placement_method=method)
        return median_seconds(lambda: place(graph, self.cluster, options), repeats)

    def auto_seconds(self, num_ops: int, repeats: int) -> float:
        return self.pipeline_seconds("auto", num_ops, repeats)


def _child_auto(num_ops: int, repeats: int, engine_name: Optional[str]) -> dict:
    """Run in the child process of the large `auto` row: its seconds and peak RSS."""
    import contextlib

    selected = contextlib.nullcontext() if engine_name is None else _engine_module().selected(engine_name)
    with selected:
        seconds = Layered().auto_seconds(num_ops, repeats)
    return {
        "seconds": seconds,
        "rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "workers_rss_bytes": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024,
    }


def auto_in_child(num_ops: int, repeats: int, engine_name: Optional[str]) -> tuple[Figure, str]:
    """(seconds or why not, the RSS part of the figure) of `auto` in a process of its own."""
    cmd = [sys.executable, os.path.abspath(__file__), "--child_auto", str(num_ops), "--repeats", str(repeats)]
    if engine_name:
        cmd += ["--engine", engine_name]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        return f"failed: {_last_line(done.stderr)}", ""
    r = json.loads(done.stdout.strip().splitlines()[-1])
    return r["seconds"], r


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def _place_help_has_engine() -> bool:
    done = subprocess.run([sys.executable, "-m", "baechi_tf", "place", "--help"], capture_output=True, text=True)
    return "--engine" in done.stdout


def place_command_seconds(model: str, method: str, repeats: int, engine_name: Optional[str],
                          out_dir: str) -> tuple[Figure, str]:
    """(median seconds of the whole `baechi place` command on the saved files of `model`, or why
    not; the placement seconds its summary gives, if it does)."""
    graph = os.path.join(out_dir, f"{model}.pb")
    profile = os.path.join(out_dir, f"{model}.profile")
    if not (os.path.isfile(graph) and os.path.isfile(profile)):
        return "not built: run bench/keras_graphs.py", ""
    placed = os.path.join(out_dir, f"{model}.placed_{method}.pb")
    cmd = [sys.executable, "-m", "baechi_tf", "place", "--graph", graph, "--cost_path", profile,
           "--num_devices", str(NUM_DEVICES), "--device_type", "CPU", "--placement_method", method,
           "--out", placed]
    if engine_name and _place_help_has_engine():
        cmd += ["--engine", engine_name]
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    times, notes = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
        times.append(time.perf_counter() - t0)
        if done.returncode:
            return f"failed: {_last_line(done.stderr)}", ""
        found = re.search(r"^placement time\s+([\d.]+) s", done.stdout, re.MULTILINE)
        if found:
            notes.append(float(found.group(1)))
    if os.path.exists(placed):
        os.remove(placed)
    note = f"placement {statistics.median(notes):.1f} s of it" if notes else ""
    return statistics.median(times), note


def engines_ratio(layered: Layered, num_ops: int, repeats: int) -> tuple[str, Optional[bool]]:
    """(the figure, whether met) of the native engine against the Python one at `num_ops`."""
    engine = _engine_module()
    if engine is None:
        return "no engine module (baechi_tf/placer/engine.py)", None
    if not engine.native_available():
        return "native core not built", None
    from baechi_tf.placer.pipeline import PLACEMENT_METHODS, PlacementOptions
    from baechi_tf.placer.simulator import simulate

    graph, groups = layered.get(num_ops)
    options = PlacementOptions(placement_method="m_etf")
    seconds = {}
    for name in ("python", "native"):
        with engine.selected(name):
            placement = PLACEMENT_METHODS["m_etf"](graph, layered.cluster, groups, options)
            seconds[name, "m_etf"] = median_seconds(
                lambda: PLACEMENT_METHODS["m_etf"](graph, layered.cluster, groups, options), repeats)
            seconds[name, "simulate"] = median_seconds(
                lambda: simulate(graph, layered.cluster, placement), repeats)
    parts, met = [], True
    for what in ("m_etf", "simulate"):
        py, nat = seconds["python", what], seconds["native", what]
        ratio = py / nat if nat > 0 else float("inf")
        met = met and ratio >= 20
        parts.append(f"{what} {ratio:.1f}x (python {_seconds(py)}, native {_seconds(nat)})")
    return "; ".join(parts), met


def _seconds(value: Figure) -> str:
    if isinstance(value, str):
        return value
    return f"{value * 1e3:.2f} ms" if value < 0.01 else f"{value:.3f} s" if value < 10 else f"{value:.1f} s"


def _met(value: Figure, limit_s: float, exact_size: bool) -> str:
    if isinstance(value, str) or not exact_size:
        return "-"
    return "yes" if value <= limit_s else "no"


def run(args: argparse.Namespace) -> tuple[str, list[Row]]:
    """(which engine ran, the table's rows)."""
    import contextlib

    scale = args.scale
    exact = scale == 1.0
    layered = Layered()
    rows: list[Row] = []

    def ops(n: int) -> int:
        return max(2, round(n * scale))

    def name(n: int) -> str:
        size = ops(n)
        return f"{size // 1000}k" if size % 1000 == 0 else f"{size:,}"

    def timed(measure: str, target: str, limit_s: float, figure: Figure, note: str = "") -> None:
        measured = _seconds(figure) + (f" ({note})" if note else "")
        rows.append(Row(measure, target, measured, _met(figure, limit_s, exact)))
        print(f"  {measure}: {measured}", file=sys.stderr, flush=True)

    engine = _engine_module()
    if engine is None:
        engine_note = "engine: no engine module (the Python list scheduler)"
    else:
        core = "built" if engine.native_available() else "not built"
        engine_note = f"engine: {args.engine or 'default'} (native core {core})"
    selected = contextlib.nullcontext() if args.engine is None else engine.selected(args.engine)
    skipped = "skipped (--quick)"

    figure, met = engines_ratio(layered, ops(10_000), args.repeats)
    rows.append(Row(f"native engine vs `--engine=python`, m-ETF and `simulate` at {name(10_000)} ops",
                    "at least 20x faster", figure, "-" if met is None or not exact else ("yes" if met else "no")))
    print(f"  engines: {figure}", file=sys.stderr, flush=True)

    def placer(measure: str, target: str, limit_s: float, method: str, size: int) -> None:
        if args.quick and size >= 100_000:
            timed(measure, target, limit_s, skipped)
            return
        alone = layered.placer_seconds(method, ops(size), args.repeats)
        whole = layered.pipeline_seconds(method, ops(size), args.repeats)
        timed(measure, target, limit_s, alone, f"whole pipeline {_seconds(whole)}")

    with selected:
        placer(f"m-ETF, {name(10_000)} layered ops", "at most 0.1 s", 0.1, "m_etf", 10_000)
        placer(f"m-ETF, {name(100_000)} layered ops", "at most 1.5 s", 1.5, "m_etf", 100_000)
        placer(f"m-SCT, {name(8_000)} layered ops (LP included)", "at most 1.5 s", 1.5, "m_sct", 8_000)
        placer(f"m-TOPO, {name(10_000)} layered ops", "at most 0.05 s", 0.05, "m_topo", 10_000)
        timed(f"`auto` at {name(10_000)} ops", "at most 2 s", 2.0, layered.auto_seconds(ops(10_000), args.repeats))
    measure, target = f"`auto` at {name(100_000)} ops", "at most 20 s, peak RSS at most 1 GiB"
    if args.quick:
        rows.append(Row(measure, target, skipped, "-"))
    else:
        seconds, child = auto_in_child(ops(100_000), args.slow_repeats, args.engine)
        if isinstance(seconds, str):
            rows.append(Row(measure, target, seconds, "-"))
        else:
            rss = child["rss_bytes"]
            measured = (f"{_seconds(seconds)}, peak RSS {rss / 2**20:,.0f} MiB "
                        f"(largest worker {child['workers_rss_bytes'] / 2**20:,.0f} MiB)")
            met = "-" if not exact else "yes" if seconds <= 20 and rss <= GIB else "no"
            rows.append(Row(measure, target, measured, met))
        print(f"  {measure}: {rows[-1].measured}", file=sys.stderr, flush=True)
    commands = (
        ("DenseNet121: `baechi place` from its saved GraphDef and profile, the whole command, m_etf",
         "at most 5 s", 5.0, "densenet121", "m_etf"),
        ("DenseNet121, `auto`", "at most 15 s", 15.0, "densenet121", "auto"),
        ("ResNet50, `auto`", "at most 8 s", 8.0, "resnet50", "auto"),
        ("GNMT v2 at the seed's size with gradients (32k ops), `auto`", "at most 10 s", 10.0, "gnmt_v2", "auto"),
    )
    for measure, target, limit_s, model, method in commands:
        if args.quick:
            rows.append(Row(measure, target, skipped, "-"))
            continue
        figure, note = place_command_seconds(model, method, args.slow_repeats, args.engine, args.keras_dir)
        rows.append(Row(measure, target, _seconds(figure) + (f" ({note})" if note else ""),
                        _met(figure, limit_s, True)))
        print(f"  {measure}: {rows[-1].measured}", file=sys.stderr, flush=True)
    return engine_note, rows


def table(rows: list[Row]) -> str:
    """`rows` as a Markdown table (the issue's form)."""
    head = ("measure", "target", "measured", "met")
    cells = [head] + [(r.measure, r.target, r.measured, r.met) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(4)]

    def line(c) -> str:
        return "| " + " | ".join(v.ljust(w) for v, w in zip(c, widths)) + " |"

    return "\n".join([line(head), "| " + " | ".join("-" * w for w in widths) + " |"] + [line(c) for c in cells[1:]])


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number of at least 1")
    return value


def _scale(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number in (0, 1]")
    return value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="skip the 100k-op rows and the TensorFlow rows (DenseNet121, ResNet50, GNMT)")
    parser.add_argument("--repeats", type=_positive_int, default=3,
                        help="runs per figure in this process; the figure is their median (default: %(default)s)")
    parser.add_argument("--slow_repeats", type=_positive_int, default=3,
                        help="runs per figure of the rows that take a process each (auto at 100k ops, "
                        "the baechi place commands) (default: %(default)s)")
    parser.add_argument("--engine", choices=("python", "native"), default=None,
                        help="the scheduling engine of every row but the native-vs-python one, which "
                        "runs both (baechi_tf/placer/engine.py; default: the package's own choice)")
    parser.add_argument("--keras_dir", default=KERAS_DIR,
                        help="folder of the files bench/keras_graphs.py writes (default: bench/out/keras)")
    parser.add_argument("--scale", type=_scale, default=1.0,
                        help="multiply the layered graphs' op counts by this, in (0, 1], for a quick "
                        "look; 'met' then says '-' (default: %(default)s)")
    parser.add_argument("--child_auto", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.engine is not None and _engine_module() is None:
        parser.error(f"--engine {args.engine}: this checkout has no baechi_tf/placer/engine.py")
    if args.child_auto is not None:
        print(json.dumps(_child_auto(args.child_auto, args.repeats, args.engine)))
        return 0
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    print(f"placement_speed.py at {commit.stdout.strip() or 'unknown commit'}: {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, {NUM_DEVICES} devices of {MEMORY_BYTES >> 30} GiB, "
          f"medians of {args.repeats} runs ({args.slow_repeats} for a process each)", flush=True)
    print("measuring (each figure to stderr as it comes)...", file=sys.stderr, flush=True)
    engine_note, rows = run(args)
    print(engine_note)
    print()
    print(table(rows), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
