"""Profiling: run a fetch with full tracing and turn ``RunMetadata.step_stats`` into a profile.

`profile_fetch` runs a fetch some untimed warm-up steps, then some steps with
``RunOptions(trace_level=FULL_TRACE)``, and `profile_from_step_stats` combines the traces as the
original Baechi does (spec section 2.1, after TF's ``BuildCostModel``):

* Device stats are read per device. ``.../stream:all`` entries are a GPU's hardware trace: the
  kernel times of an op (named ``op:kernel``) are added up and replace the op's host-side time.
  Entries whose last part is ``device:TYPE:N`` are the executors' stats. Other entries (single
  streams, memcpy) are ignored.
* Nodes TF adds at run time are skipped: ``_SOURCE``, names ending in ``/_<digits>`` (send/recv and
  partition copies) and any other node that is not in the graph (``_arg_*``, ``_retval_*``). Their
  time still counts in the step's traced time, so that the coverage can say what share of the
  traced time the graph's ops account for.
* Per op and step: the op's time (summed when it runs several times, as inside a loop), each
  output's bytes (the larger of the allocated bytes and the bytes its shape and type describe; a
  tensor that aliases a variable allocates nothing but still costs its size to send), temporary and
  persistent memory. Over steps: the median time, the max of every memory figure.

The session runs the graph as given: profile with `profiling_config` (Grappler off, classic graph
optimizer at L0) so that the traced node names are the graph's own. Profiling runs the fetch, so
it changes variables when the fetch trains: use a session you can spare.

Time: O(traced nodes) per step; memory O(ops).
"""

from __future__ import annotations

import dataclasses

import logging
import re
from typing import Any, Optional, Sequence

from baechi_tf import interrupts
from baechi_tf.progress import Progress
from baechi_tf.cost_model.profile import (
    CostProfile,
    OpCost,
    graph_fingerprint,
    graph_nodes,
    median,
)
from baechi_tf.errors import ConfigError, ProfileError, first_line

__all__ = [
    "ProfilingCutShort",
    "fit_outputs_to_graph",
    "profile_fetch",
    "profile_from_step_stats",
    "profiling_config",
]

log = logging.getLogger(__name__)

_RUNTIME_NODE = re.compile(r".+/_\d+$")
_EXECUTOR = re.compile(r"^device:[A-Za-z_]+:\d+$")


def profiling_config(config: Any = None) -> Any:
    """A copy of `config` (a ``ConfigProto``) in which TF runs the graph as written.

    Grappler's meta-optimizer is turned off and the classic graph optimizer set to L0 (no
    constant folding, no common subexpression elimination), so ops keep their names and run as
    the graph says; everything else in `config` is kept.
    """
    import tensorflow as tf

    out = tf.compat.v1.ConfigProto()
    if config is not None:
        out.CopyFrom(config)
    out.graph_options.rewrite_options.disable_meta_optimizer = True
    out.graph_options.optimizer_options.opt_level = tf.compat.v1.OptimizerOptions.L0
    return out


def _element_bytes(dtype_enum: int) -> int:
    import tensorflow as tf

    try:
        size = tf.as_dtype(dtype_enum).base_dtype.size
    except (TypeError, ValueError):
        return 0
    return size or 8  # string, resource and variant elements: count a pointer


def _described_bytes(description) -> int:
    dims = [d.size for d in description.shape.dim]
    if description.shape.unknown_rank or any(d < 0 for d in dims):
        return 0
    count = 1
    for d in dims:
        count *= d
    return count * _element_bytes(description.dtype)


class _Acc:
    """One op's figures over the traced steps."""

    __slots__ = ("times", "outputs", "temp", "persistent", "device")

    def __init__(self, device: str) -> None:
        self.times: list[float] = []
        self.outputs: dict[int, int] = {}
        self.temp = 0
        self.persistent = 0
        self.device = device


def profile_from_step_stats(
    step_stats_list: Sequence[Any], graph_def: Any, *, tf_version: str = ""
) -> CostProfile:
    """Combines the ``StepStats`` of several traced steps of `graph_def` into a profile."""
    if not step_stats_list:
        raise ProfileError("no traced step to build a profile from; trace at least one step")
    names = {n.name: n.op for n in graph_def.node}
    # The ops of a function's body run in an executor of their own and are traced under their
    # names in the body: a body's 'MatMul' added its time and sizes to the graph's 'MatMul'.
    # A traced op of such a name that ran within a call op of the same device is the body's.
    calls = {n.name for n in graph_def.node if _calls_function(n)}
    shadowed = _function_body_names(graph_def) & names.keys() if calls else set()
    acc: dict[str, _Acc] = {}
    step_totals: list[float] = []
    for step_stats in step_stats_list:
        kernel_us: dict[str, float] = {}
        executors = []
        for dev in sorted(step_stats.dev_stats, key=lambda d: d.device.split("/")[-1]):
            last = dev.device.split("/")[-1]
            if last == "stream:all":
                for ns in dev.node_stats:
                    op = ns.node_name.split(":")[0]
                    kernel_us[op] = kernel_us.get(op, 0.0) + _op_us(ns)
            elif _EXECUTOR.match(last):
                executors.append(dev)
        step_time: dict[str, float] = {}
        total = 0.0
        for dev in executors:
            call_spans = [_span_us(ns) for ns in dev.node_stats if ns.node_name in calls] if shadowed else []
            for ns in dev.node_stats:
                name = ns.node_name
                us = kernel_us.get(name, _op_us(ns))
                total += us
                if name == "_SOURCE" or _RUNTIME_NODE.match(name) or name not in names:
                    continue
                if name in shadowed and _within(_span_us(ns), call_spans):
                    continue
                a = acc.get(name)
                if a is None:
                    a = acc[name] = _Acc(dev.device)
                step_time[name] = step_time.get(name, 0.0) + us
                for out in ns.output:
                    desc = out.tensor_description
                    nbytes = max(
                        int(desc.allocation_description.allocated_bytes),
                        int(desc.allocation_description.requested_bytes),
                        _described_bytes(desc),
                    )
                    if nbytes > a.outputs.get(out.slot, -1):
                        a.outputs[out.slot] = nbytes
                a.temp = max(a.temp, int(ns.memory_stats.temp_memory_size))
                a.persistent = max(a.persistent, int(ns.memory_stats.persistent_memory_size))
        for name, us in step_time.items():
            acc[name].times.append(us)
        step_totals.append(total)
    ops = {}
    for name, a in acc.items():
        width = max(a.outputs) + 1 if a.outputs else 0
        ops[name] = OpCost(
            name=name,
            op_type=names[name],
            compute_us=median(a.times),
            output_bytes=tuple(max(a.outputs.get(s, 0), 0) for s in range(width)),
            temp_bytes=a.temp,
            persistent_bytes=a.persistent,
            device=a.device,
            num_steps=len(a.times),
        )
    return CostProfile(
        ops=ops,
        graph_fingerprint=graph_fingerprint(graph_def),
        graph_nodes=graph_nodes(graph_def),
        tf_version=tf_version,
        num_traced_steps=len(step_stats_list),
        traced_compute_us=median(step_totals),
    )


def _calls_function(node: Any) -> bool:
    """Whether `node` runs a function of the graph's library (PartitionedCall, While, If, ...)."""
    return any(v.func.name or len(v.list.func) for v in node.attr.values())


def _function_body_names(graph_def: Any) -> set[str]:
    """The names the library's functions give their ops and arguments in a trace."""
    out: set[str] = set()
    for function in graph_def.library.function:
        out.update(n.name for n in function.node_def)
        out.update(a.name for a in function.signature.input_arg)
    return out


def _span_us(ns: Any) -> tuple[float, float]:
    """(start, end) of a traced op, in microseconds of the trace's clock."""
    start = ns.all_start_nanos / 1e3 if ns.all_start_nanos else float(ns.all_start_micros)
    length = ns.all_end_rel_nanos / 1e3 if ns.all_end_rel_nanos else float(ns.all_end_rel_micros)
    return start, start + length


def _within(span: tuple[float, float], outer: Sequence[tuple[float, float]]) -> bool:
    return any(a <= span[0] and span[1] <= b for a, b in outer)


def _op_us(ns) -> float:
    """An op's own time in microseconds: nanoseconds when TF recorded them."""
    if ns.op_end_rel_nanos > 0:
        return ns.op_end_rel_nanos / 1000.0
    return float(max(ns.op_end_rel_micros, 0))


class ProfilingCutShort(Exception):
    """`profile_fetch(stop_on_error=True)`: a run after the first failed before any step was
    traced (`runs` runs had succeeded; `error` is TF's)."""

    def __init__(self, runs: int, error: Exception) -> None:
        super().__init__(f"profiling run {runs + 1} failed before any step was traced: {first_line(error)}")
        self.runs = runs
        self.error = error


def profile_fetch(
    session: Any,
    fetches: Any,
    feed_dict: Optional[dict] = None,
    *,
    warmup_steps: int = 2,
    traced_steps: int = 5,
    graph_def: Any = None,
    timeout_ms: int = 0,
    stop_on_error: bool = False,
) -> CostProfile:
    """Runs `fetches` in `session` and profiles it.

    `warmup_steps` untraced steps, then `traced_steps` with full tracing. The profile describes
    `graph_def` (default: the session's graph now). Every run executes the fetch, with all its
    side effects (a training fetch trains). `timeout_ms` > 0 limits each run, as
    ``RunOptions.timeout_in_ms`` does (TF's DeadlineExceededError past it). When the fetch's
    input runs out (TF's OutOfRangeError: a dataset shorter than the steps) after at least one
    traced step, the profile is made of the steps traced so far; before that, the error is raised.

    With `stop_on_error`, any TF error of a run after the first ends the profiling so (a step
    valid only so many times, such as one asserting on the step count, fails when run again and
    again); when no step was traced yet, `ProfilingCutShort` is raised instead of the error. The
    first run's error is raised as it is: the fetch fails from the state it started in.
    """
    import tensorflow as tf

    if traced_steps < 1 or warmup_steps < 0:
        raise ConfigError(
            f"traced_steps={traced_steps}, warmup_steps={warmup_steps}: trace at least one step "
            "and warm up zero or more"
        )
    if graph_def is None:
        graph_def = session.graph.as_graph_def()
    warmup = tf.compat.v1.RunOptions(timeout_in_ms=timeout_ms)
    options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE, timeout_in_ms=timeout_ms)
    traces = []
    with Progress("profiling", warmup_steps + traced_steps, unit="steps", tick=True) as bar:
        for step in range(warmup_steps + traced_steps):
            traced = step >= warmup_steps
            metadata = tf.compat.v1.RunMetadata() if traced else None
            try:
                session.run(fetches, feed_dict=feed_dict, options=options if traced else warmup,
                            run_metadata=metadata)
            except tf.errors.OpError as e:
                ran_out = isinstance(e, tf.errors.OutOfRangeError)
                if not step or not (stop_on_error or (ran_out and traces)):
                    raise  # the first run's error, or one profile_fetch does not stop at
                if not traces:
                    raise ProfilingCutShort(step, e) from e
                if ran_out:
                    log.info("the input ran out after %d of %d traced steps; profiling those",
                             len(traces), traced_steps)
                else:
                    log.warning(
                        "profiling run %d of %d failed (%s: %s); placing by the %d step(s) traced "
                        "before it", step + 1, warmup_steps + traced_steps, type(e).__name__,
                        first_line(e), len(traces),
                    )
                break
            interrupts.check()
            if traced:
                traces.append(metadata.step_stats)
            bar.update(advance=1, note="traced" if traced else "warm-up")
    profile = fit_outputs_to_graph(
        profile_from_step_stats(traces, graph_def, tf_version=tf.__version__), session.graph
    )
    log.info(
        "profiled %d ops over %d traced steps (%.0f us traced per step)",
        len(profile.ops),
        len(traces),
        profile.traced_compute_us,
    )
    return profile


def fit_outputs_to_graph(profile: Any, graph: Any) -> Any:
    """`profile` without the output slots that the ops of `graph` (a ``tf.Graph``, or a
    ``GraphDef``: outputs counted from the ops' definitions) do not have; their bytes are
    counted as the op's temporary memory.

    oneDNN's CPU kernels give some ops more outputs at run time than the graph declares (a
    training MaxPool keeps a workspace for its gradient), and the step stats report them under
    the op's name; the importer would take them for a profile of another graph.
    """
    if hasattr(graph, "get_operations"):
        counts = {op.name: len(op.outputs) for op in graph.get_operations()}
    else:
        counts = _declared_outputs(graph)
    ops = {}
    for name, cost in profile.ops.items():
        n = counts.get(name, len(cost.output_bytes))
        if len(cost.output_bytes) > n:
            cost = dataclasses.replace(cost, output_bytes=cost.output_bytes[:n],
                                       temp_bytes=cost.temp_bytes + sum(cost.output_bytes[n:]))
        ops[name] = cost
    return dataclasses.replace(profile, ops=ops)


def _declared_outputs(graph_def: Any) -> dict[str, int]:
    """Output count of each node of `graph_def` whose op TF or the graph's library defines."""
    from tensorflow.python.framework import op_def_registry

    signatures = {f.signature.name: f.signature for f in graph_def.library.function}
    out = {}
    for node in graph_def.node:
        op_def = signatures.get(node.op) or op_def_registry.get(node.op)
        if op_def is None:
            continue  # the import says what is wrong with it
        defaults = {a.name: a.default_value for a in getattr(op_def, "attr", ())}

        def attr(name: str) -> Any:
            return node.attr[name] if name in node.attr else defaults.get(name)

        count = 0
        for arg in op_def.output_arg:
            if arg.number_attr:
                value = attr(arg.number_attr)
                count += value.i if value is not None else 0
            elif arg.type_list_attr:
                value = attr(arg.type_list_attr)
                count += len(value.list.type) if value is not None else 0
            else:
                count += 1
        out[node.name] = count
    return out
