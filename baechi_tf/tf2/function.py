"""`baechi_tf.function`: a ``tf.function`` whose ops Baechi places on several devices.

::

    @baechi_tf.function(num_devices=4)
    def train_step(x, y):
        ...

The first call for an input signature (what makes ``tf.function`` trace anew):

1. traces the Python function as ``tf.function`` does (``get_concrete_function``), which makes
   the variables a first call makes and is the trace later calls are dispatched on; then traces
   it once more in a fresh ``tf.function``: code that builds Python state in its first call
   (Keras's compiled loss and metrics) traces other ops the first time, and the second trace is
   what the later ones build;
2. profiles the second trace (`baechi_tf.tf2.graph.profile_function`): `warmup_steps` untraced and
   `profile_steps` traced runs in a ``tf.compat.v1.Session``, on copies of the variables, so that
   the real ones do not move;
3. places it with the pipeline of `place_graph_def` (import, place, check, simulate, apply);
4. traces the Python function again, in a new ``tf.function``, under a device function keyed by
   op name (``get_default_graph().device(fn)``), which gives every op of the trace the device the
   placement chose. The ops of this trace and of the placed one must be the same, name for name,
   type, inputs and attributes (`graph.trace_signature`): a Python function that traces something
   else each time (a counter, a random number drawn in Python) is refused.

Later calls of that signature run the placed trace; a new signature is placed on its own
(`placements`, one `PlacementReport` each). A failure at any step raises (a `BaechiError` for
what cannot be placed) and keeps nothing: the variables are as the call found them, and the next
call of that signature tries again. Tracing three times runs the Python function's side effects
three times (``tf.function`` runs them at each trace too).

Variables are pinned where they live. A variable made before the first call lives where it was
made (the host CPU for a ``tf.Variable`` made in eager code, unless made under ``tf.device``); one
that the first call makes (``if self.w is None: self.w = tf.Variable(...)``) lives where
``tf.function`` makes it, the same. The placement takes each as an op pinned to its device holding
its bytes; TF runs every op that reads or updates it there, and the placement keeps them there
too. Each report's summary lists them.

Devices: `num_devices` GPUs when there are so many, else CPU stand-ins, as `BaechiSession` has
(`baechi_tf.rewriter.devices`): TF's eager context must then have ``num_devices + 1`` logical CPU
devices, which `standin_devices` makes, and which the first placement makes itself when TF has
not set up its devices yet.

Not placed, with a `ConfigError` when decorated: ``jit_compile=True`` (XLA compiles the whole
function into one cluster on one device, whatever devices its ops name: seen here, ops pinned to
CPU:1 and CPU:2 ran as one XLA cluster on CPU:0).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import threading
import types
import weakref
from typing import Any, Callable, Optional, Union

from baechi_tf.cluster import DEFAULT_COMM, CommCost
from baechi_tf.cost_model.profile import save_profile
from baechi_tf.errors import ConfigError, InvalidGraphError
from baechi_tf.placer.pipeline import PlacementOptions
from baechi_tf.rewriter.devices import DEFAULT_MEMORY_BYTES_PER_DEVICE, DeviceSetup
from baechi_tf.rewriter.graph_pass import PlacementReport, place_graph_def
from baechi_tf.rewriter.session.arguments import Settings, configure
from baechi_tf.tf2.graph import FunctionGraph, function_graph, profile_function, trace_signature

__all__ = ["JIT_COMPILE_REFUSED", "PlacedFunction", "function", "standin_devices"]

log = logging.getLogger(__name__)


def standin_devices(num_devices: int) -> None:
    """Gives TF's eager context ``num_devices + 1`` logical CPU devices: CPU:1..CPU:N stand in
    for N GPUs, CPU:0 is the host. Call it before TF runs anything (before the first variable is
    made); later, a `ConfigError` when TF has fewer CPU devices. Does nothing when it has enough."""
    from baechi_tf.cluster import check_device_count

    check_device_count(num_devices)
    _ensure_cpus(num_devices + 1)


def _ensure_cpus(count: int) -> None:
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    configured = tf.config.get_logical_device_configuration(cpu)
    if configured is not None and len(configured) >= count:
        return
    try:
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * count)
        return
    except RuntimeError:  # TF has set up its devices already
        have = len(tf.config.list_logical_devices("CPU"))
    if have < count:
        raise ConfigError(
            f"placing on {count - 1} CPU stand-ins needs {count} CPU devices in TF's eager context, "
            f"which has {have} and cannot change them once it runs: call "
            f"baechi_tf.tf2.standin_devices({count - 1}) before TensorFlow runs anything (before "
            "the first tf.Variable or tensor is made)"
        )


JIT_COMPILE_REFUSED = (
    "jit_compile=True: XLA compiles the whole function into one cluster that runs on one device, "
    "whatever devices its ops name, so there is nothing to place; "
)


@dataclasses.dataclass(frozen=True)
class _Placed:
    """One signature's placed trace."""

    plain: Any  # the ConcreteFunction of the unplaced tf.function (kept: its id is the key)
    placed: Any  # the ConcreteFunction of the placed trace
    report: PlacementReport


class PlacedFunction:
    """A ``tf.function`` placed per input signature; see the module docstring."""

    def __init__(self, python_function: Callable, settings: Settings, tf_options: dict[str, Any]) -> None:
        import tensorflow as tf

        self._python_function = python_function
        self._settings = settings
        self._tf_options = dict(tf_options)
        self._plain = tf.function(python_function, **self._tf_options)
        self._by_trace: dict[int, _Placed] = {}
        self._lock = threading.RLock()
        self._bound: "weakref.WeakKeyDictionary[Any, PlacedFunction]" = weakref.WeakKeyDictionary()
        self.placements: list[PlacementReport] = []
        functools.update_wrapper(self, python_function)

    @property
    def python_function(self) -> Callable:
        return self._python_function

    @property
    def unplaced(self) -> Any:
        """The ``tf.function`` of the same Python function, unplaced: calls are dispatched on
        its traces, one per signature, each mapped to its placed trace."""
        return self._plain

    @property
    def devices(self) -> DeviceSetup:
        """The placement targets and the host CPU."""
        return self._settings.setup

    @property
    def placement(self) -> Optional[PlacementReport]:
        """The report of the last placement (None before the first call)."""
        return self.placements[-1] if self.placements else None

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        """A method decorated: the function bound to `instance`, placed for that instance (its
        variables are its own)."""
        if instance is None:
            return self
        with self._lock:
            bound = self._bound.get(instance)
            if bound is None:
                bound = PlacedFunction(types.MethodType(self._python_function, instance), self._settings, self._tf_options)
                self._bound[instance] = bound
        return bound

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._entry(args, kwargs).placed(*args, **kwargs)

    def place(self, *args: Any, **kwargs: Any) -> PlacementReport:
        """Places the signature of a call with `args` and `kwargs` without running it (the
        profiling runs copies), and returns its report; a call of it later runs placed."""
        return self._entry(args, kwargs).report

    def summary(self) -> str:
        """Every signature's placement summary, in the order they were placed."""
        parts = []
        for k, p in enumerate(self._by_trace.values()):
            parts.append(f"signature {k}: {p.plain.structured_input_signature}\n{p.report.summary()}")
        return "\n\n".join(parts) if parts else "not placed yet: call the function"

    # ------------------------------------------------------------------ internals

    def _entry(self, args: tuple, kwargs: dict) -> _Placed:
        trace = self._plain.get_concrete_function(*args, **kwargs)
        placed = self._by_trace.get(id(trace))
        if placed is None:
            with self._lock:
                placed = self._by_trace.get(id(trace))
                if placed is None:
                    placed = self._place(trace, args, kwargs)
        return placed

    def _place(self, trace: Any, args: tuple, kwargs: dict) -> _Placed:
        settings = self._settings
        if settings.setup.virtual:
            _ensure_cpus(settings.setup.num_cpus)
        import tensorflow as tf

        index = len(self._by_trace)
        # Traced again: code that builds Python state on its first call (Keras's compiled loss and
        # metrics) builds something else in its first trace; this one is what later traces build.
        settled = tf.function(self._python_function, **self._tf_options).get_concrete_function(*args, **kwargs)
        traced = function_graph(settled, args, kwargs)
        profile = profile_function(
            traced, settings.profile_config, warmup_steps=settings.warmup_steps, traced_steps=settings.profile_steps
        )
        if settings.cost_path:
            save_profile(profile, _numbered(settings.cost_path, index))
        setup = settings.setup
        placed_def, report = place_graph_def(
            traced.graph_def,
            profile,
            setup.cluster,
            settings.options,
            host_device=setup.host,
            device_aliases=setup.aliases,
            ignore_user_devices=settings.ignore_user_devices,
            unpin_hint="trace the function without its tf.device() pins",
        )
        table = {
            name: device
            for name, device in report.op_to_device.items()
            if name not in traced.variables and name not in traced.pinned_inputs
        }
        placed = self._retrace(table, args, kwargs)
        settled_def, retraced_def = settled.graph.as_graph_def(), placed.graph.as_graph_def()
        if trace_signature(retraced_def) != trace_signature(settled_def):
            raise InvalidGraphError(_changed_trace(settled_def, retraced_def))
        report = dataclasses.replace(report, notes=report.notes + _variable_notes(traced, setup))
        if settings.report_dir:
            from baechi_tf.reports import write_reports

            write_reports(
                report.result, _numbered(settings.report_dir, index), graph_def=placed_def,
                profile=report.coverage.figures(len(report.default_compute_ops)),
            )
        entry = _Placed(trace, placed, report)
        self._by_trace[id(trace)] = entry
        self.placements.append(report)
        log.info(
            "placed %s for %s: %d ops on %d devices, makespan %.0f us (simulated)",
            getattr(self._python_function, "__name__", "the function"), trace.structured_input_signature,
            report.result.graph.num_ops, len(report.devices_used), report.makespan_us,
        )
        return entry

    def _retrace(self, table: dict[str, str], args: tuple, kwargs: dict) -> Any:
        """The ConcreteFunction of a new trace of the Python function for `args` and `kwargs`, each
        op of the trace's own graph (not of the functions it calls: a branch of a ``tf.cond``
        runs on the device of its op) on the device `table` names."""
        import tensorflow as tf

        python_function = self._python_function
        scopes: list[Any] = []

        @functools.wraps(python_function)  # the same signature: its placeholders' names
        def placed(*a: Any, **k: Any) -> Any:
            top = tf.compat.v1.get_default_graph()

            def device_of(op: Any) -> str:
                if op.graph is top and op.name in table:
                    return table[op.name]
                return op.device

            # Left open until the trace ends: tf.function makes the outputs' Identity ops and the
            # NoOp of the control outputs after this returns, and they are placed ops too.
            scope = top.device(device_of)
            scope.__enter__()
            scopes.append(scope)
            return python_function(*a, **k)

        try:
            return tf.function(placed, **self._tf_options).get_concrete_function(*args, **kwargs)
        finally:
            for scope in reversed(scopes):
                scope.__exit__(None, None, None)


def _numbered(path: str, index: int) -> str:
    """`path` for the first signature; ``name.K.ext`` (``dir.K`` for a folder) for the K-th after
    it."""
    if index == 0:
        return path
    root, ext = os.path.splitext(path)
    return f"{root}.{index}{ext}"


# A summary names at most this many variables per device (a ResNet50 has 324); the placement's
# op_to_device has every one.
_NAMES_SHOWN = 30


def _variable_notes(traced: FunctionGraph, setup: DeviceSetup) -> tuple[str, ...]:
    if not traced.variables:
        return ("variables: none read",)
    by_device: dict[str, list[str]] = {}
    for variable in traced.variables.values():
        by_device.setdefault(variable.device, []).append(variable.name)
    parts = []
    for device, names in sorted(by_device.items()):
        where = f"{device} (the host)" if setup.host.name == device else device
        shown = sorted(names)[:_NAMES_SHOWN]
        more = f" and {len(names) - len(shown)} more" if len(names) > len(shown) else ""
        parts.append(f"{', '.join(shown)}{more} on {where}")
    return (
        f"variables: {len(traced.variables)} pinned where they live, their readers and updaters "
        f"with them: {'; '.join(parts)}",
    )


def _changed_trace(first: Any, second: Any) -> str:
    a = {n.name: n.op for n in first.node}
    b = {n.name: n.op for n in second.node}
    only_first, only_second = sorted(set(a) - set(b)), sorted(set(b) - set(a))
    if only_first or only_second:
        what = f"ops only in the first: {only_first[:3]}; only in the second: {only_second[:3]}"
    else:
        changed = [n for n in a if trace_signature(_only(first, n)) != trace_signature(_only(second, n))]
        what = f"ops whose inputs or attributes changed: {changed[:3]}"
    return (
        "the function traced differently from one trace to the next, so its placement cannot be "
        f"applied by op name ({what}): its Python code changes what it builds each time (a Python "
        "counter or list, a random number drawn in Python, a value read from a file); make that a "
        "tf.Variable or an argument, or run it with tf.function unplaced"
    )


def _only(graph_def: Any, name: str) -> Any:
    out = type(graph_def)()
    out.node.extend(n for n in graph_def.node if n.name == name)
    return out


def function(
    func: Optional[Callable] = None,
    *,
    num_devices: Optional[int] = None,
    options: Optional[PlacementOptions] = None,
    placement_method: Optional[str] = None,
    cost_path: Optional[str] = None,
    report_dir: Optional[str] = None,
    memory_bytes_per_device: int = DEFAULT_MEMORY_BYTES_PER_DEVICE,
    memory_fraction: float = 1.0,
    comm: Union[CommCost, str] = DEFAULT_COMM,
    warmup_steps: int = 2,
    profile_steps: int = 5,
    ignore_user_devices: bool = False,
    **tf_function_options: Any,
) -> Any:
    """Decorates `func` as ``tf.function`` does, and places each of its traces on `num_devices`
    devices (default: the GPUs, at least one); see `baechi_tf.tf2.function`'s module docstring.

    The placement arguments are `BaechiSession`'s: `options` (or `placement_method`),
    `memory_bytes_per_device` and `memory_fraction` (of each stand-in or GPU), `comm`,
    `warmup_steps` and `profile_steps` (the profiling runs), `cost_path` (the profile of the first
    signature, ``name.K.ext`` of the K-th after it), `report_dir` (its reports; ``dir.K`` for the
    K-th), `ignore_user_devices`. Any other keyword is ``tf.function``'s (``input_signature``,
    ``reduce_retracing``, ``autograph``, ...); ``jit_compile=True`` is a `ConfigError`.
    Used bare (``@baechi_tf.function``) or with arguments (``@baechi_tf.function(num_devices=4)``).
    """
    if tf_function_options.get("jit_compile"):
        raise ConfigError(JIT_COMPILE_REFUSED + "drop jit_compile, or use tf.function(jit_compile=True) unplaced")
    arguments = dict(
        graph=None, config=None, target="", placement_method=placement_method, num_devices=num_devices,
        memory_bytes_per_device=memory_bytes_per_device, memory_fraction=memory_fraction,
        options=options, comm=comm, inter_host_comm=None, cluster_spec=None, connect_timeout_s=0.0,
        warmup_steps=warmup_steps, profile_steps=profile_steps, cost_path=cost_path, grappler=True,
        report_dir=report_dir, ignore_user_devices=ignore_user_devices,
    )

    def decorate(python_function: Callable) -> PlacedFunction:
        if not callable(python_function):
            raise ConfigError(
                f"baechi_tf.function decorates a Python function, not a {type(python_function).__name__}"
            )
        if isinstance(python_function, PlacedFunction):
            raise ConfigError("the function is a baechi_tf.function already; decorate it once")
        if hasattr(python_function, "get_concrete_function"):  # a tf.function
            raise ConfigError(
                "the function is a tf.function already; decorate the Python function with "
                "baechi_tf.function instead of tf.function (it takes tf.function's arguments)"
            )
        settings = configure(None, arguments)
        if settings.setup.virtual:  # now, before a variable made later sets TF's devices up
            _ensure_cpus(settings.setup.num_cpus)
        return PlacedFunction(python_function, settings, tf_function_options)

    if func is not None:
        return decorate(func)
    return decorate

