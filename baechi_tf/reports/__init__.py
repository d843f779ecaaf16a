"""Reports of a placement for people: a Gantt chart, memory over time, a Chrome trace, a summary.

`write_reports(result, report_dir)` writes, from a `PlacementResult` (``placer.pipeline.place``):

* ``gantt.png``: one row per device with its ops as bars and, under it, a thin lane for its
  communication channel, the critical path marked in red (`gantt`);
* ``memory_<i>.png``: memory in use on device i over the step with its capacity as a line, the
  peak and the persistent part (`memory`);
* ``trace.json``: the simulated schedule in Chrome's trace format (Perfetto, chrome://tracing),
  with `tf_step_stats` TensorFlow's own timeline of the real step beside it (`trace`);
* ``graph.pbtxt`` and ``events.out.tfevents.baechi``: with `graph_def`, the placed graph as text
  and as an events file for TensorBoard's graph view (``tensorboard --logdir report_dir``,
  colour by device; `trace`);
* ``summary.json``: the figures of the placement (`summary`), ``files``, the names of the
  report's files, and ``profile``, the coverage of the profile it was placed by
  (`baechi_tf.cost_model.Coverage.figures`: the traced time no op accounts for, by node type,
  among them), when given.

Written before the placed graph runs (so that a run that fails, out of memory, or is stopped
still leaves them), the trace gets TF's timeline afterwards (`add_tf_timeline`).

The reports are written all at once or not at all (`write_reports`). Figures use matplotlib's Agg
canvas directly (no pyplot, no global state; `drawing`) and come out the same, byte for byte, for
the same input. TensorFlow is imported only when `graph_def` or a serialized `tf_step_stats` is
given.

Time O((V + E) log(V + E) + D * T) for V ops, E edges, D devices and T transfers, plus drawing:
about 3 s for 10k ops on 4 devices, most of it matplotlib; a memory PNG takes about 15 ms, so
1,024 devices take about 20 s (`bench/reports_scaling.py`); the trace takes about 0.7 KB per op.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import warnings
from typing import Any, Optional

from baechi_tf._files import REPORT_FILE, atomic_write, keep_mode, output_error, report_files
from baechi_tf.placer.memory_timeline import memory_timeline
from baechi_tf.placer.schedule import Transfer
from baechi_tf.reports.gantt import _gantt_png
from baechi_tf.reports.memory import _memory_pngs
from baechi_tf.reports.summary_json import summary
from baechi_tf.reports.trace import _graph_events, _trace_json, chrome_trace

__all__ = ["add_tf_timeline", "chrome_trace", "summary", "write_reports"]


def write_reports(
    result: Any,
    report_dir: str,
    *,
    graph_def: Any = None,
    tf_step_stats: Any = None,
    profile: Optional[dict[str, Any]] = None,
) -> dict[str, str]:
    """Writes the reports of `result` (a `PlacementResult`) into `report_dir`, creating it.

    `graph_def`: the placed GraphDef, for TensorBoard. `tf_step_stats`: a TF ``StepStats``
    message (or its serialized bytes) of a real run of the same step, shown next to the
    simulated one in the trace. `profile`: the figures of the profile's coverage, written into
    ``summary.json`` as ``profile``. Returns what was written: key -> path.

    All or nothing: the files are made in a temporary folder (in `report_dir` when it exists,
    else beside it) and moved in when every one is done, so an error or Ctrl-C while they are made
    leaves `report_dir` as it was. Files of an earlier report there that this one does not have
    (``memory_3.png`` of a placement on more devices), as its ``summary.json`` lists them, are
    removed once the new ones are in; those it replaces keep their permission bits.
    """
    graph, cluster, schedule = result.graph, result.cluster, result.schedule
    memory = memory_timeline(graph, cluster, schedule)
    critical = schedule.critical_chain(graph, cluster)
    given = report_dir
    try:
        return _write_reports(result, os.path.abspath(report_dir), memory, critical, graph_def, tf_step_stats,
                              profile)
    except OSError as e:  # a full disk: one line naming the folder, not a traceback
        raise output_error(e, given) from e


def add_tf_timeline(result: Any, report_dir: str, tf_step_stats: Any) -> str:
    """Rewrites ``trace.json`` of the reports of `result` in `report_dir` with TF's timeline of a
    real run of the step (`tf_step_stats`, as in `write_reports`) beside the simulated schedule;
    returns its path. For reports written before the run, so that a run that fails (out of
    memory) or is stopped still leaves them; the file is replaced whole or not at all."""
    path = os.path.join(report_dir, "trace.json")
    atomic_write(path, _trace_json(chrome_trace(result, tf_step_stats=tf_step_stats)))
    return path


def _write_reports(result, report_dir, memory, critical, graph_def, tf_step_stats, profile) -> dict[str, str]:
    if os.path.isdir(report_dir):  # needs only report_dir writable (its parent may not be)
        staging = tempfile.mkdtemp(prefix=".tmp-reports-", dir=report_dir)
    else:
        parent = os.path.dirname(report_dir)
        os.makedirs(parent, exist_ok=True)
        staging = tempfile.mkdtemp(prefix=".tmp-", suffix="-" + os.path.basename(report_dir), dir=parent)
    try:
        paths = _write_into(staging, result, memory, critical, graph_def, tf_step_stats, profile)
        earlier = report_files(report_dir)
        os.makedirs(report_dir, exist_ok=True)
        for key, name in paths.items():
            keep_mode(os.path.join(report_dir, name), os.path.join(staging, name))
            os.replace(os.path.join(staging, name), os.path.join(report_dir, name))
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    for name in sorted(earlier - set(paths.values())):
        try:
            os.remove(os.path.join(report_dir, name))
        except FileNotFoundError:
            pass
    return {key: os.path.join(report_dir, name) for key, name in paths.items()}


def _write_into(
    folder: str, result: Any, memory: Any, critical: tuple[list[int], list[Transfer]], graph_def: Any,
    tf_step_stats: Any, profile: Optional[dict[str, Any]] = None,
) -> dict[str, str]:
    """Writes the reports into `folder`; key -> file name. `critical`: `Schedule.critical_chain`."""
    paths: dict[str, str] = {}

    def put(key: str, name: str, data: bytes | str) -> None:
        assert REPORT_FILE.match(name), name  # what a report folder is checked against
        with open(os.path.join(folder, name), "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
        paths[key] = name

    with warnings.catch_warnings():
        # Op names in scripts the font lacks are drawn as boxes; a warning per glyph says nothing more.
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from font")
        put("gantt", "gantt.png", _gantt_png(result, *critical))
        for d, png in enumerate(_memory_pngs(result, memory)):
            put(f"memory_{d}", f"memory_{d}.png", png)
    trace = chrome_trace(result, tf_step_stats=tf_step_stats, memory=memory, critical=critical)
    put("trace", "trace.json", _trace_json(trace))
    if graph_def is not None:
        from google.protobuf import text_format

        put("graph_pbtxt", "graph.pbtxt", text_format.MessageToString(graph_def))
        put("graph_events", "events.out.tfevents.baechi", _graph_events(graph_def))
    figures = summary(result, critical[0])
    if profile is not None:
        figures["profile"] = profile
    figures["files"] = sorted([*paths.values(), "summary.json"])
    put("summary", "summary.json", json.dumps(figures, indent=1, sort_keys=True) + "\n")
    return paths
