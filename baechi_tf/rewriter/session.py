"""`BaechiSession`: a ``tf.compat.v1.Session`` look-alike that places the graph before it runs.

Either form works::

    sess = BaechiSession(tf.compat.v1.Session(graph=g, config=cfg), placement_method="m_etf",
                         num_devices=4)
    sess = BaechiSession(graph=g, config=cfg, placement_method="m_etf", num_devices=4)

The first `run` of a fetch whose ops were never profiled:

1. reads the values of the variables that are initialised (from the wrapped session, or from
   the placed session of an earlier fetch);
2. profiles the fetch on a scratch copy of the graph holding those values (`warmup_steps`
   untraced runs, then `profile_steps` traced ones), so the real variables do not move;
3. places the whole graph (`place_graph_def`; ops that no profiled step ran cost nothing, since
   no step of the fetches placed so far runs them, and other unprofiled ops get estimates);
4. imports the placed GraphDef into a fresh graph and session, writes the variable values in,
   and runs the fetch there.

Later runs of fetches whose ops were all profiled go straight to the placed session. A training
loop through a `BaechiSession` therefore computes what a plain session computes, step for step
(seeded random ops once a new fetch is placed again aside: `_reseed`).
Runs from several threads go side by side, as on a Session, but one profiles and places at a
time; a new placement waits for the runs in flight on the placed session it replaces (but those
that use a queue, which may wait for runs that cannot start meanwhile; and for at most
`_DRAIN_TIMEOUT_S`) and copies the variables after them, then closes that session.
`sess.placement` is the `PlacementReport` of the last placement (``op_to_device``,
``makespan_us``, ``lower_bound_us``, ``coverage``).

Devices come from `baechi_tf.rewriter.devices.session_devices`: the GPUs when there are
`num_devices` of them, else virtual CPU devices standing in for GPUs (`memory_bytes_per_device`
each). Against a cluster of TF servers (``target="grpc://host:port"``, or ``cluster_spec=`` whose
master is then the target) they come from the cluster instead
(`baechi_tf.rewriter.distributed.discover_devices`, within `connect_timeout_s`): the devices of
every task, `num_devices` being then a number per task (None: all); transfers between tasks cost
`inter_host_comm` (default: `comm`); ``comm="auto"`` fits `comm` to copies timed between two of
the devices when the session is made (`devices.with_fitted_link`; the fit is `link_fit`).
Profiling and the placed graph run on the cluster, in
sessions whose state is isolated from each other's. The placed graph runs with TensorFlow's
optimizations (Grappler, the classic graph optimizer), but for those of Grappler's optimizers that
would move ops off their devices (`baechi_tf.rewriter.devices.placed_graph_config`), and the
profile is taken with the same settings, so that it measures the fused and rewritten nodes that
will run; ops a fused node replaces are placed with it. A placement that still splits such ops
(pins) runs without the remapper's fusions. ``grappler=False`` turns Grappler and the classic
optimizer off in every session this class makes: the graph runs as written, its ops under their
own names. Ops the graph pins (``tf.device``) stay there; a pin to a device that
is not among them is an error unless ``ignore_user_devices=True``, which places those ops like the
others (code written for more GPUs than the machine has), or the config allows soft placement
(``allow_soft_placement=True``: a Session of it runs those ops elsewhere too).

Variables and the contents of hash tables carry over from one session to the next (from the
wrapped session too), and so do the iterators (``Iterator``, ``OneShotIterator``) that runs read,
from one placed session to the next and into the profiling copies, but not from the wrapped session:
each is copied where it is in its dataset (``SerializeIterator``, buffers and random state too),
after its initializer. A run that only initialises iterators (an iterator's initializer) is run
again in each new session, the profiling copies' too, with a copy of its feeds kept for that (a
dataset fed from a large array holds that much more memory); of a run that also initialises
variables (``[init, iterator.initializer]``), the iterators' initializers alone. A string handle
that a run fetched (``iterator.string_handle()``) names an iterator of the session that made it: fed
again, it is swapped for the handle of the same iterator in the session the run goes to, so a
training step fed one (``Iterator.from_string_handle``) is profiled and placed like any other, also
after a batch was read. The state of queues, readers, accumulators, staging areas and random number
generators starts afresh in each placed session, and so does an iterator whose state cannot be
written down (its dataset calls a ``py_func``). So once a run has used one of them in the placed
session, a new fetch whose ops the placed graph already holds runs there as placed (those of its
ops no run had profiled were placed without measured costs) rather than being profiled and placed
again, which would restart that state, with a warning that names it. Only a fetch of ops added to
the graph since forces a new placement then, with a warning. A fetch that takes from a queue (a
dequeue, a reader, an accumulator) or puts into one (an enqueue, as a QueueRunner's thread runs) is
placed without profiling: nothing fills or drains the scratch copy's queues.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import contextlib
import functools
import logging
import numbers
import os
import re
import threading
import tempfile
import time
from typing import Any, Callable, Iterator, Optional, Union

import numpy as np

from baechi_tf.cluster import DEFAULT_COMM, CommCost
from baechi_tf.cost_model.profile import (
    READ_TABLES_SCOPE,
    CostProfile,
    graph_fingerprint,
    graph_nodes,
    merge_profiles,
    not_a_profile_to_replace,
    save_profile,
)
from baechi_tf.errors import ConfigError, InfeasiblePlacementError, first_line
from baechi_tf.placer.pipeline import PlacementOptions
from baechi_tf.rewriter.devices import (
    DEFAULT_MEMORY_BYTES_PER_DEVICE,
    DeviceSetup,
    session_config,
    session_devices,
    with_fitted_link,
)
from baechi_tf.rewriter.distributed import (
    DEFAULT_TIMEOUT_S,
    discover_devices,
    is_remote_target,
    parse_cluster_spec,
    remote_session_config,
)
from baechi_tf.rewriter.graph_pass import PlacementReport, place_graph_def
from baechi_tf.rewriter.importer import VARIABLE_OP_TYPES, resolve_user_devices

__all__ = ["BaechiSession"]

log = logging.getLogger(__name__)

_DRAIN_TIMEOUT_S = 120.0
"""How long a new placement waits for the runs in flight on the one it replaces."""


# Lookup tables whose contents carry into a new session (export, then import): static hash
# tables (``tf.lookup.StaticHashTable``, ``index_table_from_*``) and mutable ones.
_TABLE_OP_TYPES = frozenset({"HashTableV2", "MutableHashTableV2", "MutableHashTableOfTensorsV2"})


@dataclasses.dataclass(frozen=True)
class _TableContents:
    """The keys and values of a lookup table, as `_VariableIO.read` returns them."""

    keys: Any
    values: Any


class _TableIO:
    """Export and import ops of the lookup tables of a graph (added to it, beside each table)."""

    def __init__(self, graph: Any, name_scope: str) -> None:
        import tensorflow as tf

        self.entries: list[tuple[str, Any, Any, Any, Any, Any, Any]] = []
        tables = [op for op in graph.get_operations() if op.type in _TABLE_OP_TYPES]
        self.unread = [op.name for op in tables] if graph.finalized else []
        if self.unread:  # no op can be added to read them
            return
        # At the root, whatever scope the first run is made in: `graph_nodes` knows them by it.
        with graph.as_default(), graph.name_scope(name_scope + "/"):
            for op in tables:
                with graph.colocate_with(op):
                    handle = op.outputs[0]
                    key_dtype, value_dtype = op.get_attr("key_dtype"), op.get_attr("value_dtype")
                    size = tf.raw_ops.LookupTableSizeV2(table_handle=handle)
                    keys, values = tf.raw_ops.LookupTableExportV2(
                        table_handle=handle, Tkeys=key_dtype, Tvalues=value_dtype
                    )
                    new_keys = tf.compat.v1.placeholder(key_dtype)
                    new_values = tf.compat.v1.placeholder(value_dtype)
                    put = tf.raw_ops.LookupTableImportV2(table_handle=handle, keys=new_keys, values=new_values)
                self.entries.append((op.name, size, keys, values, new_keys, new_values, put))

    def read(self, session: Any) -> dict[str, _TableContents]:
        """The contents of the tables that hold something (an uninitialized table holds
        nothing: importing nothing would mark it initialized), by table op name."""
        if not self.entries:
            return {}
        sizes = session.run([e[1] for e in self.entries])
        full = [e for e, n in zip(self.entries, sizes) if n > 0]
        got = session.run([(e[2], e[3]) for e in full]) if full else []
        return {e[0]: _TableContents(k, v) for e, (k, v) in zip(full, got)}

    def load(self, session: Any, contents: dict[str, Any]) -> None:
        todo = [e for e in self.entries if isinstance(contents.get(e[0]), _TableContents)]
        if todo:
            feeds = {}
            for e in todo:
                feeds[e[4]], feeds[e[5]] = contents[e[0]].keys, contents[e[0]].values
            session.run([e[6] for e in todo], feed_dict=feeds)


@dataclasses.dataclass(frozen=True)
class _IteratorState:
    """Where an iterator is in its dataset (its buffers and random state too), as
    ``SerializeIterator`` writes it, in a ``serialize_tensor`` string."""

    serialized: bytes


class _CannotCarry(Exception):
    """An iterator that runs have read cannot be copied into a new session (says which, and why)."""


class _IteratorIO:
    """Reads and writes where the iterators of a graph this module owns are (``SerializeIterator``
    and ``DeserializeIterator``, added beside each iterator)."""

    def __init__(self, graph: Any, name_scope: str) -> None:
        import tensorflow as tf

        self.entries: dict[str, tuple[Any, Any, Any]] = {}
        with graph.as_default(), tf.name_scope(name_scope):
            for op in graph.get_operations():
                if op.type not in _ITERATOR_TYPES:
                    continue
                with graph.colocate_with(op):  # a resource is looked up on its own device
                    handle = op.outputs[0]
                    state = tf.raw_ops.SerializeIterator(
                        resource_handle=handle, external_state_policy=_FAIL_ON_EXTERNAL_STATE
                    )
                    new = tf.compat.v1.placeholder(tf.string, [])
                    restore = tf.raw_ops.DeserializeIterator(
                        resource_handle=handle, serialized=tf.io.parse_tensor(new, tf.variant)
                    )
                self.entries[op.name] = (tf.io.serialize_tensor(state), new, restore)

    def read(self, session: Any, names: set[str], strict: bool = True) -> dict[str, _IteratorState]:
        """Where the initialised iterators among `names` are, by op name. One that cannot be
        written down (its dataset calls a ``py_func`` or another op with state outside the
        dataset) is `_CannotCarry` when `strict`, else left out (it starts afresh)."""
        import tensorflow as tf

        out: dict[str, _IteratorState] = {}
        for name in sorted(names & self.entries.keys()):
            try:
                out[name] = _IteratorState(session.run(self.entries[name][0]))
            except tf.errors.OpError as e:
                if "has not been initialized" in e.message or not strict:
                    continue  # not initialised: nor is it in a new session (but by its initializer)
                raise _CannotCarry(
                    f"the iterator {name!r} (read again from its start: its state cannot be copied "
                    f"into a new session, {first_line(e)})"
                ) from None
        return out

    def load(self, session: Any, states: dict[str, Any]) -> None:
        """Puts the iterators of `states` where they were; run after the initializers (`_replay`),
        since an iterator is restored within the dataset it was initialised with."""
        import tensorflow as tf

        for name, (_, new, restore) in self.entries.items():
            state = states.get(name)
            if not isinstance(state, _IteratorState):
                continue
            try:
                session.run(restore, feed_dict={new: state.serialized})
            except tf.errors.OpError as e:  # its initializer could not be run again (`_replay`)
                log.warning(
                    "could not put the iterator %s where it was in the new session (%s: %s); it "
                    "reads from where its initializer left it there",
                    name, type(e).__name__, first_line(e),
                )


class _VariableIO:
    """Reads and writes the variables, lookup tables and iterators of a graph this module owns
    (helper ops added to it)."""

    def __init__(self, graph: Any) -> None:
        import tensorflow as tf

        self.tables = _TableIO(graph, "baechi_tf_io")
        self.iterators = _IteratorIO(graph, "baechi_tf_io")
        self.entries: list[tuple[str, Any, Any, Any, Any]] = []
        variables = [op for op in graph.get_operations() if op.type in VARIABLE_OP_TYPES]
        with graph.as_default(), tf.name_scope("baechi_tf_io"):
            for op in variables:
                with graph.device(op.device):
                    dtype = tf.as_dtype(op.get_attr("dtype"))
                    handle = op.outputs[0]
                    value = tf.compat.v1.placeholder(dtype)
                    if op.type == "VarHandleOp":
                        is_init = tf.raw_ops.VarIsInitializedOp(resource=handle)
                        read = tf.raw_ops.ReadVariableOp(resource=handle, dtype=dtype)
                        assign = tf.raw_ops.AssignVariableOp(resource=handle, value=value)
                    else:
                        is_init = tf.raw_ops.IsVariableInitialized(ref=handle)
                        read = handle
                        assign = tf.raw_ops.Assign(ref=handle, value=value, validate_shape=False)
                self.entries.append((op.name, is_init, read, value, assign))

    def read(self, session: Any, iterators: set[str] = frozenset(), strict: bool = True) -> dict[str, Any]:
        """Values of the initialised variables, contents of the filled tables and where the
        `iterators` are (`_IteratorIO.read`), by op name."""
        out: dict[str, Any] = self.tables.read(session)
        out.update(self.iterators.read(session, iterators, strict))
        if not self.entries:
            return out
        flags = session.run([e[1] for e in self.entries])
        live = [e for e, ok in zip(self.entries, flags) if ok]
        values = session.run([e[2] for e in live]) if live else []
        out.update((e[0], v) for e, v in zip(live, values))
        return out

    def load(self, session: Any, values: dict[str, Any]) -> None:
        """Writes `values` into the variables and tables of the same names (not the iterators:
        `self.iterators.load`, after their initializers)."""
        todo = [e for e in self.entries if e[0] in values]
        if todo:
            session.run([e[4] for e in todo], feed_dict={e[3]: values[e[0]] for e in todo})
        self.tables.load(session, values)


def _read_user_state(session: Any, tables: "_TableIO") -> dict[str, Any]:
    """Values of the initialised variables and contents of the filled lookup tables of a session
    whose graph belongs to the user (`tables`: export ops added to it once)."""
    out: dict[str, Any] = tables.read(session)
    out.update(_read_user_variables(session))
    return out


def _read_user_variables(session: Any) -> dict[str, Any]:
    """Values of the initialised variables of a session whose graph belongs to the user.

    Asks which are initialised first, and reads only those: a read of one that is not fails, and
    TF logs every such failure that crossed devices ("Could not find variable", "Attempting to
    use uninitialized value"), on the usual first run, of the initializer, once per variable.
    Reads and asks through the graph's existing ops (a reference variable's own output, a
    resource variable's ``ReadVariableOp`` and ``VarIsInitializedOp``); adds an op only where the
    graph has none.
    """
    import tensorflow as tf

    graph = session.graph
    readers: list[tuple[str, Any, Any]] = []  # name, read, is-initialised (None: not known)
    for op in graph.get_operations():
        if op.type not in VARIABLE_OP_TYPES:
            continue
        if op.type == "VarHandleOp":
            dtype = tf.as_dtype(op.get_attr("dtype"))
            reader = _user_op(graph, op, "ReadVariableOp", lambda h: tf.raw_ops.ReadVariableOp(resource=h, dtype=dtype))
            check = _user_op(graph, op, "VarIsInitializedOp", lambda h: tf.raw_ops.VarIsInitializedOp(resource=h))
        else:
            reader = op.outputs[0]
            check = _user_op(graph, op, "IsVariableInitialized", lambda h: tf.raw_ops.IsVariableInitialized(ref=h))
        if reader is None:
            log.warning("cannot read variable %r of a finalized graph; it starts afresh", op.name)
            continue
        readers.append((op.name, reader, check))
    checked = [r for r in readers if r[2] is not None]
    flags = session.run([r[2] for r in checked]) if checked else []
    uninitialised = {r[0] for r, ok in zip(checked, flags) if not ok}
    readers = [r for r in readers if r[0] not in uninitialised]
    if not readers:
        return {}
    try:
        values = session.run([r[1] for r in readers])
        return {r[0]: v for r, v in zip(readers, values)}
    except tf.errors.FailedPreconditionError:
        pass  # some not asked (a finalized graph) are not initialised: read one by one
    out = {}
    for name, reader, _ in readers:
        try:
            out[name] = session.run(reader)
        except tf.errors.FailedPreconditionError:
            continue
    return out


def _user_op(graph: Any, variable: Any, op_type: str, make: Callable[[Any], Any]) -> Any:
    """The output of an op of `op_type` that takes `variable`'s handle alone (none may wait for
    other ops), else of one `make` adds to the graph unless it is finalized (else None)."""
    handle = variable.outputs[0]
    found = next((c.outputs[0] for c in handle.consumers() if c.type == op_type and not c.control_inputs), None)
    if found is None and not graph.finalized:
        # Beside the table readers, so that a profile's fingerprint leaves it out too.
        with graph.as_default(), graph.name_scope(READ_TABLES_SCOPE + "/"), graph.device(variable.device):
            found = make(handle)
    return found


def _session_class_for(user_graph: Any) -> type:
    """A Session class whose errors are about the ops of `user_graph`, as a Session of it would
    raise them: ``e.op`` an op of that graph and the message with where the op was made. The
    sessions here run copies of it (imported GraphDefs, which keep no stack traces), so TF's own
    errors named the copy's op and an empty "Original stack trace". An error about an op the user's
    graph does not have (this module's helper ops) is TF's, about the copy's op."""
    import tensorflow as tf
    from tensorflow.python.framework import error_interpolation

    node_name = tf.compat.v1.Session._NODEDEF_NAME_RE  # where TF's own _do_call finds the op

    class ReportingSession(tf.compat.v1.Session):
        def _do_call(self, fn: Any, *args: Any) -> Any:
            try:
                return fn(*args)
            except tf.errors.OpError as e:
                found = node_name.search(e.message)
                try:
                    op = user_graph.get_operation_by_name(found.group(3)) if found else None
                except KeyError:
                    op = None
                if op is None:
                    return super()._do_call(functools.partial(_reraise, e))
                message = error_interpolation.interpolate_graph(e.message, user_graph)
                if "only supports NHWC tensor format" in message:
                    message += (
                        "\nGrappler's layout rewrite may cause this: try BaechiSession(..., "
                        "grappler=False), which runs the graph as written"
                    )
                raise type(e)(op.node_def, op, message)

    return ReportingSession


# What TF says of a variable read before it was initialised: a reference variable's, a resource
# variable's (its resource does not exist in the session).
_UNINITIALIZED_VARIABLE = re.compile(r"uninitialized value|Could not find variable|variable was uninitialized")


def _reraise(error: BaseException) -> Any:
    raise error


class _Placed:
    """A placed GraphDef imported into a graph of its own, with its session."""

    def __init__(self, graph_def: Any, config: Any, target: str, session_class: type) -> None:
        import tensorflow as tf

        self.graph_def = graph_def
        self.graph = tf.Graph()
        with self.graph.as_default():
            tf.graph_util.import_graph_def(graph_def, name="")
        self.names = {n.name for n in graph_def.node}
        self.io = _VariableIO(self.graph)
        self.session = session_class(target, graph=self.graph, config=config)
        self.handles: dict[str, bytes] = {}  # the string handles of its iterators, by tensor name
        self.runs = 0  # runs in flight on `session`
        self.queue_runs = 0  # those of them that take from or put into a queue (not waited for)
        self.ended = 0  # runs ended on `session`
        self.retired = False  # replaced by a new placement: closed once no run is in flight


class BaechiSession:
    """Runs a ``tf.compat.v1`` graph placed by Baechi; see the module docstring."""

    def __new__(cls, *args: Any, **kwargs: Any) -> "BaechiSession":
        # TF's Saver.save (and others) require isinstance(sess, SessionInterface): the instance's
        # class also derives from it, made here, where TF is imported anyway (importing
        # baechi_tf does not import it).
        return super().__new__(_session_class(cls))

    def __init__(
        self,
        sess: Any = None,
        *,
        graph: Any = None,
        config: Any = None,
        target: str = "",
        placement_method: Optional[str] = None,
        num_devices: Optional[int] = None,
        memory_bytes_per_device: int = DEFAULT_MEMORY_BYTES_PER_DEVICE,
        memory_fraction: float = 1.0,
        options: Optional[PlacementOptions] = None,
        comm: Union[CommCost, str] = DEFAULT_COMM,
        inter_host_comm: Optional[CommCost] = None,
        cluster_spec: Any = None,
        connect_timeout_s: float = DEFAULT_TIMEOUT_S,
        warmup_steps: int = 2,
        profile_steps: int = 5,
        cost_path: Optional[str] = None,
        grappler: bool = True,
        report_dir: Optional[str] = None,
        ignore_user_devices: bool = False,
    ) -> None:
        import tensorflow as tf

        if isinstance(sess, tf.Graph):
            raise ConfigError(
                "BaechiSession's first argument is a session to wrap; give a graph as "
                "BaechiSession(graph=...)"
            )
        if sess is not None and not isinstance(getattr(sess, "graph", None), tf.Graph):
            raise ConfigError(
                f"BaechiSession's first argument is a {type(sess).__name__}, not a session; give a "
                "tf.compat.v1.Session to wrap, or graph=..."
            )
        if sess is not None:
            if graph is not None and graph is not sess.graph:
                raise ConfigError("graph= differs from the graph of the session given; give one")
            if config is not None:
                raise ConfigError(
                    "config= is for BaechiSession(graph=..., config=...); the session given "
                    "already has its config"
                )
            graph = sess.graph
            config = getattr(sess, "_config", None)
            wrapped_target = getattr(sess, "sess_str", "") or ""  # bytes in TF's Session
            if isinstance(wrapped_target, bytes):
                wrapped_target = wrapped_target.decode()
            target = target or wrapped_target
        elif graph is None:
            graph = tf.compat.v1.get_default_graph()
        # NumPy's integers (a sweep over np.arange) count as the ints they are.
        num_devices, memory_bytes_per_device, warmup_steps, profile_steps = (
            _whole(v) for v in (num_devices, memory_bytes_per_device, warmup_steps, profile_steps)
        )
        _check_arguments(options, comm, inter_host_comm, warmup_steps, profile_steps,
                         memory_bytes_per_device, memory_fraction)
        if options is None:
            options = (
                PlacementOptions()
                if placement_method is None
                else PlacementOptions(placement_method=placement_method)
            )
        elif placement_method is not None and placement_method != options.placement_method:
            raise ConfigError(
                f"placement_method={placement_method!r} contradicts the options' "
                f"{options.placement_method!r}; give one of them"
            )
        options.validate()
        if options.placement_method == "expert" and not options.expert:
            # Nothing gives it a layout later (train.py gives its model's): said now, not once the
            # first run has profiled.
            raise ConfigError(
                "placement method 'expert' needs a hand layout and none was given: give "
                "PlacementOptions(expert={op name: device name}), or choose another method"
            )
        if profile_steps < 1 or warmup_steps < 0:
            raise ConfigError(
                f"profile_steps={profile_steps}, warmup_steps={warmup_steps}: trace at least one "
                "step and warm up zero or more"
            )
        spec = parse_cluster_spec(cluster_spec) if cluster_spec is not None else None
        if spec is not None and not target:
            target = spec.target
        self._graph = graph
        self._session_class = _session_class_for(graph)  # its errors name the ops of `graph`
        self._user_session = sess
        self._user_tables: Optional[_TableIO] = None  # export ops added to the user's graph
        self._options = options
        auto_comm = isinstance(comm, str)  # 'auto', as _check_arguments let through
        if auto_comm:
            comm = DEFAULT_COMM
        remote = is_remote_target(target)
        if remote:
            target = target.rstrip("/")  # 'grpc://host:port/' is no host-port pair to TF
            self._setup: DeviceSetup = discover_devices(
                target,
                spec=spec,
                num_devices_per_task=num_devices,
                memory_bytes_per_device=memory_bytes_per_device,
                memory_fraction=memory_fraction,
                comm=comm,
                inter_host_comm=inter_host_comm,
                timeout_s=connect_timeout_s,
                config=config,
            ).devices
        else:
            if spec is not None:
                raise ConfigError(
                    f"cluster_spec= was given with target={target!r}; target the cluster "
                    "('grpc://host:port' of one of its tasks) or leave target empty"
                )
            if inter_host_comm is not None:  # it was dropped without a word
                log.warning(
                    "inter_host_comm= is not used: every device is on this host (give "
                    "cluster_spec= or a 'grpc://host:port' target to place across hosts)"
                )
            if num_devices is None:
                num_devices = max(1, len(tf.config.list_physical_devices("GPU")))
            self._setup = session_devices(
                num_devices,
                memory_bytes_per_device=memory_bytes_per_device,
                memory_fraction=memory_fraction,
                comm=comm,
                config=config,
            )
        # comm='auto': the link fitted to copies between two of the devices, before anything runs.
        self.link_fit = None
        if auto_comm:
            bench_config = session_config(self._setup, config, grappler=False)
            self._setup, self.link_fit = with_fitted_link(
                self._setup, remote_session_config(bench_config) if remote else bench_config,
                target if remote else "", flag="comm='auto'")
            if self.link_fit is not None:
                log.info("%s", self.link_fit.describe())
        # The profile is taken with the optimizations the placed graph runs with.
        self._run_config = session_config(self._setup, config, grappler=grappler)
        profile_config = session_config(self._setup, config, grappler=grappler)
        profile_config.allow_soft_placement = True
        # For a placement that splits ops the remapper fused while profiling (`_split_fusion`).
        self._unfused_config = session_config(self._setup, config, grappler=grappler, remapping=False)
        if remote:  # profiling and placed sessions must not share variables on the servers
            self._run_config = remote_session_config(self._run_config)
            profile_config = remote_session_config(profile_config)
            self._unfused_config = remote_session_config(self._unfused_config)
        self._profile_config = profile_config
        self._target = target
        self._warmup_steps = warmup_steps
        self._profile_steps = profile_steps
        from baechi_tf._files import check_apart, check_report_folder, check_writable

        if cost_path:
            check_writable(cost_path, "cost_path")
            why = not_a_profile_to_replace(cost_path)
            if why:  # a typo naming a source file was written over without a word
                raise ConfigError(
                    f"cost_path {cost_path!r} is a file that is not a cost profile ({why}), and "
                    "the profile would be written over it; give another path, or remove the file first"
                )
        if report_dir:
            if cost_path:
                check_apart(report_dir, "report_dir", cost_path, "cost_path")
            check_report_folder(report_dir, "report_dir", keep=(cost_path or "",))
        self._cost_path = cost_path
        self._report_dir = report_dir  # reports of each placement (baechi_tf.reports)
        # Place ops pinned to devices that do not exist, too: as asked, or as TF's soft placement
        # does (a Session of that config runs them elsewhere).
        self._ignore_user_devices = ignore_user_devices or bool(config is not None and config.allow_soft_placement)
        self._placed: Optional[_Placed] = None
        self._profile: Optional[CostProfile] = None
        self._covered: set[str] = set()
        self._ready: dict[tuple, _FetchKind] = {}  # fetch keys placed for -> what their ops do
        self._ran: set[str] = set()  # ops that runs in placed sessions may have executed
        self._sessions = 0  # placed sessions made
        # Runs that initialise iterators and use no other state (fetch key -> (fetch, feeds)): run
        # again in each new session, the profiling copies' too (`_replay`).
        self._replays: dict[tuple, tuple[Any, dict[str, Any]]] = {}
        # What a new placement would restart, which a run used in the placed session (a queue; an
        # iterator whose state cannot be copied), or None.
        self._state_in_use: Optional[str] = None
        self._iterators_read = False  # the placed session's iterators are not where replays leave them
        # The string handles runs fetched (``iterator.string_handle()``) -> the tensor that made
        # them: a feed of one gets that tensor's value in the session it goes to (`_own_handles`).
        self._handles: dict[bytes, str] = {}
        self._closed = False
        self._lock = threading.RLock()  # held while a run profiles and places
        # A new placement waits (`_drain`) for the runs in flight on the one it replaces, so that
        # their updates reach the variables it copies; meanwhile no run starts.
        self._drained = threading.Condition(self._lock)
        self._draining = False
        self._defaults: Optional[contextlib.ExitStack] = None  # what `with` made the defaults
        self.placement: Optional[PlacementReport] = None

    # ------------------------------------------------------------------ Session look-alike

    @property
    def graph(self) -> Any:
        """The user's graph (fetches and feeds name its tensors and ops)."""
        return self._graph

    @property
    def graph_def(self) -> Any:
        return self._graph.as_graph_def()

    @property
    def devices(self) -> DeviceSetup:
        """The placement targets, the host CPU and how sessions are configured for them."""
        return self._setup

    @property
    def profile(self) -> Optional[CostProfile]:
        """The profile of every fetch run so far (None before the first run)."""
        return self._profile

    @property
    def placed_graph_def(self) -> Any:
        """The GraphDef the placed session runs (None before the first run)."""
        return self._placed.graph_def if self._placed is not None else None

    def list_devices(self) -> list:
        """The devices of the sessions this object runs graphs in."""
        import tensorflow as tf

        self._check_open()
        if self._placed is not None:
            return self._placed.session.list_devices()
        with tf.compat.v1.Session(self._target, graph=tf.Graph(), config=self._run_config) as s:
            return s.list_devices()

    def run(
        self,
        fetches: Any,
        feed_dict: Optional[dict] = None,
        options: Any = None,
        run_metadata: Any = None,
    ) -> Any:
        """Like ``Session.run``; the first run of a new fetch profiles and places first."""
        import tensorflow as tf

        self._check_open()
        named = _map_fetches(self._fetch_of, fetches)
        feeds = self._feeds_of(feed_dict)
        with self._lock:  # one thread profiles and places at a time; runs go side by side
            while self._draining:
                self._drained.wait()
            before = self.placement
            # The caller's time limit holds for each profiling run as for the run itself.
            with self._hints(feeds):
                placed, kind = self._prepared(named, feeds, getattr(options, "timeout_in_ms", 0))
                own = _fed_in(self._own_handles(feeds, placed.session, placed.handles), placed.names, self._graph)
            queues = kind.queues
            placed.runs += 1
            placed.queue_runs += queues
            report = self.placement if self._report_dir and self.placement is not before else None
        ran = False
        try:  # from here on, the run is counted in placed.runs: the finally ends it in any case
            if report is not None:
                # The run right after a placement is traced: the reports, written after it, show
                # TF's timeline of that step beside the simulated one in trace.json.
                traced = tf.compat.v1.RunOptions()
                if options is not None:
                    traced.CopyFrom(options)
                traced.trace_level = tf.compat.v1.RunOptions.FULL_TRACE
                options = traced
                if run_metadata is None:
                    run_metadata = tf.compat.v1.RunMetadata()
            with self._hints(feeds):
                values = placed.session.run(named, feed_dict=own, options=options, run_metadata=run_metadata)
            ran = True
            if kind.handles:
                with self._lock:
                    for name, value in _fetched(named, values):
                        if name in kind.handles:
                            self._handles[value] = name
                            placed.handles.setdefault(name, value)
            if kind.initializes:  # the latest run of each initializer, in the order of those runs
                with self._lock:
                    key = _fetch_key(named, feeds)
                    self._replays.pop(key, None)
                    self._replays[key] = (named, _copied(feeds))
            if kind.iterator_inits:  # each iterator it set up, alone, as a run of its initializer
                with self._lock:
                    for name, fed in kind.iterator_inits:
                        own = _copied({t: feeds[t] for t in fed})
                        self._replays.pop(_fetch_key([name], own), None)
                        self._replays[_fetch_key([name], own)] = ([name], own)
            if kind.writer_inits:  # each writer the run made, alone, with the feeds it read
                with self._lock:
                    for name, fed in kind.writer_inits:
                        own = _copied({t: feeds[t] for t in fed})
                        self._replays[_fetch_key([name], own)] = ([name], own)
            return values
        except tf.errors.ResourceExhaustedError as e:
            from baechi_tf.rewriter.oom import out_of_memory_error

            result = self.placement.result if self.placement is not None else None
            raise out_of_memory_error(e, result) from e
        finally:
            with self._lock:  # first, so that an error writing the reports cannot leave it counted
                placed.runs -= 1
                placed.queue_runs -= queues
                placed.ended += 1
                if placed.retired and not placed.runs:
                    placed.session.close()
                self._drained.notify_all()
            if report is not None:  # also when the run failed (out of memory): without TF's step
                from baechi_tf.reports import write_reports

                write_reports(
                    report.result, self._report_dir, graph_def=placed.graph_def,
                    tf_step_stats=run_metadata.step_stats if ran and run_metadata is not None else None,
                    profile=report.coverage.figures(len(report.default_compute_ops)),
                )

    def make_callable(self, fetches: Any, feed_list: Any = None, accept_options: bool = False) -> Any:
        """Like ``Session.make_callable``: a function of the values of `feed_list`, in that
        order, that runs `fetches` (with ``options=`` and ``run_metadata=`` keywords when
        `accept_options`). Each call is a `run`: the first profiles and places."""
        self._check_open()
        _map_fetches(self._fetch_of, fetches)  # a bad fetch or feed fails here, as on a Session
        feed_list = list(feed_list or ())
        for key in feed_list:
            for part in _parts(key):
                self._feed_name(part)

        def call(*feed_args: Any, **kwargs: Any) -> Any:
            if len(feed_args) != len(feed_list):
                raise ValueError(f"expected {len(feed_list)} feed values, got {len(feed_args)}")
            options = run_metadata = None
            if accept_options:
                options = kwargs.pop("options", None)
                run_metadata = kwargs.pop("run_metadata", None)
            if kwargs:
                raise TypeError(f"unexpected keyword arguments: {sorted(kwargs)}")
            return self.run(fetches, dict(zip(feed_list, feed_args)), options, run_metadata)

        return call

    @property
    def sess_str(self) -> str:
        """The target of the sessions this object runs graphs in ('' in this process)."""
        return self._target

    def partial_run_setup(self, fetches: Any, feeds: Any = None) -> Any:
        raise NotImplementedError(
            "BaechiSession does not make partial runs: it profiles whole steps before it places. "
            "Run the fetches with run(), or make partial runs in a tf.compat.v1.Session of the "
            "graph placed so far (its placed_graph_def)"
        )

    def partial_run(self, handle: Any, fetches: Any, feed_dict: Optional[dict] = None) -> Any:
        return self.partial_run_setup(fetches)

    def close(self) -> None:
        """Closes the placed session and the session this object was given (after a placement
        that another thread is making; runs in flight end with TF's error, as on a Session)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._placed is not None:
                self._placed.session.close()
                self._placed = None
            if self._user_session is not None:
                self._user_session.close()

    def as_default(self) -> Any:
        """A context manager that makes this object the thread's default session, as
        `Session.as_default` does: ``tensor.eval()`` and ``op.run()`` inside it run placed."""
        from tensorflow.python.framework import stack  # what Session.as_default returns

        return stack.default_session(self)

    def __enter__(self) -> "BaechiSession":
        # As with a Session, the graph and this object are the defaults inside the block.
        if self._defaults is not None:
            raise RuntimeError(
                "BaechiSession context managers are not re-entrant; use as_default() to make it "
                "the default session again"
            )
        with contextlib.ExitStack() as defaults:
            defaults.enter_context(self._graph.as_default())
            defaults.enter_context(self.as_default())
            self._defaults = defaults.pop_all()
        return self

    def __exit__(self, *exc: Any) -> None:
        defaults, self._defaults = self._defaults, None
        try:
            if defaults is not None:
                defaults.__exit__(*exc)
        finally:
            self.close()

    # ------------------------------------------------------------------ internals

    @contextlib.contextmanager
    def _hints(self, feeds: dict[str, Any]) -> Iterator[None]:
        """TF's errors of profiling or running (a run fed `feeds`), with what this class changes
        about them said: an iterator initialised in the wrapped session is not initialised in the
        sessions here, nor is a variable initialised (or restored) there after the first placement
        read the values, and a string handle that no run here fetched names no iterator here."""
        import tensorflow as tf

        try:
            yield
        except tf.errors.OpError as e:
            hint = self._hint(e, feeds)
            if hint is None:
                raise
            raise type(e)(e.node_def, e.op, f"{e.message} (BaechiSession: {hint})") from e

    def _hint(self, error: Any, feeds: dict[str, Any]) -> Optional[str]:
        """What `_hints` adds to `error`, or None."""
        import tensorflow as tf

        op = error.op
        if op is not None and op.type in _FROM_HANDLE_TYPES and op.graph is self._graph:
            fed = feeds.get(op.inputs[0].name)
            if fed is not None and _handle_of(fed) not in self._handles:
                where = "the session it wraps" if self._user_session is not None else "another session"
                return (
                    f"the string handle fed to {op.inputs[0].name} was not fetched through the "
                    f"BaechiSession: it names an iterator of {where}, whose iterators do not carry "
                    "over; fetch iterator.string_handle() through the BaechiSession and feed that"
                )
        if self._user_session is None or not isinstance(error, tf.errors.FailedPreconditionError):
            return None
        if "iterator has not been initialized" in error.message:
            return (
                "iterators do not carry over from the session it wraps; if you initialized this "
                "one there, run its initializer through the BaechiSession"
            )
        if _UNINITIALIZED_VARIABLE.search(error.message):
            return (
                "the variables of the session it wraps carry over as they are at its first run; "
                "initialize or restore them there before that run, or through the BaechiSession"
            )
        return None

    def _own_handles(self, feeds: dict[str, Any], session: Any, handles: dict[str, bytes]) -> dict[str, Any]:
        """`feeds` with each string handle that a run fetched (`_handles`) replaced by the handle
        of the same iterator in `session` (by tensor name in `handles`, its cache): a handle names
        an iterator of the session that made it, and no other session has it. Running the handle's
        op there makes the iterator (a one-shot one) where `session` does not have it yet."""
        out = feeds
        for name, value in feeds.items():
            made_by = self._handles.get(_handle_of(value)) if self._handles else None
            if made_by is None:
                continue
            if made_by not in handles:
                handles[made_by] = session.run(made_by)
            if out is feeds:
                out = dict(feeds)
            out[name] = handles[made_by]
        return out

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("Attempted to use a closed BaechiSession.")

    def _fetch_of(self, x: Any) -> Any:
        """The name of a fetch; a SparseTensor's is a SparseTensorValue of its three tensors'
        names, which ``Session.run`` returns as a SparseTensorValue of their values (and so for
        an IndexedSlices)."""
        import tensorflow as tf

        def part(t: Any) -> str:
            return self._fetchable(self._name_of(t))

        if isinstance(x, tf.sparse.SparseTensor):
            return tf.compat.v1.SparseTensorValue(*map(part, _parts(x)))
        if isinstance(x, tf.IndexedSlices):  # a gather's gradient: an IndexedSlicesValue
            if x.dense_shape is None:
                return tuple.__new__(_SlicesWithoutShape, (part(x.values), part(x.indices)))
            from tensorflow.python.framework.indexed_slices import IndexedSlicesValue  # not public

            return IndexedSlicesValue(part(x.values), part(x.indices), part(x.dense_shape))
        name = self._name_of(x)
        if isinstance(x, (str, bytes)):  # a tensor or op given as such is in the graph already
            try:
                self._graph.as_graph_element(name)
            except (KeyError, ValueError) as e:  # what Session.run raises for them
                raise ValueError(f"cannot fetch {name!r}: {e.args[0] if e.args else e}") from None
        return self._fetchable(name)

    def _fetchable(self, name: str) -> str:
        """`name`, unless TF marked its op as not fetchable (one inside a v1 cond branch or while
        loop), which ``Session.run`` refuses: the copies run here are imported GraphDefs, which
        keep no such marks, so such a fetch returned a branch's value or failed with TF's
        InternalError 'Retval[0] has already been set'."""
        import tensorflow as tf
        from tensorflow.python.framework.errors_impl import InaccessibleTensorError  # not public

        element = self._graph.as_graph_element(name)
        op = element if isinstance(element, tf.Operation) else element.op
        if not self._graph.is_fetchable(op):
            raise InaccessibleTensorError(  # what Session.run raises
                f"Operation {op.name} has been marked as not fetchable. Typically this happens "
                "when it is defined in another function or code block. Use return values, "
                "explicit Python locals or TensorFlow collections to access it."
            )
        return name

    def _feedable(self, name: str, value: Any) -> Any:
        """`value` as ``Session.run`` feeds it to the tensor `name` (an array of its dtype when
        its shape is known), or the error a Session raises: TF marked the tensor as not feedable
        (one inside a v1 while loop), or the value's shape does not fit the one the user's graph
        gives it (``set_shape`` too). The copies run here keep neither: they are imported
        GraphDefs, without the marks and with shapes inferred again, so such a feed failed with
        TF's 'has inputs from different frames' or ran."""
        from tensorflow.python.ops.session_ops import TensorHandle  # not public

        try:
            tensor = self._graph.get_tensor_by_name(name)
        except (KeyError, ValueError):
            return value  # not a tensor's name: the run fails as a Session's does
        if not self._graph.is_feedable(tensor):
            raise ValueError(f"Tensor {name} may not be fed.")  # what Session.run raises
        if tensor.shape.rank is None or isinstance(value, TensorHandle):
            return value
        try:  # converted once: the sessions here take the array as it is
            array = np.asarray(value, dtype=tensor.dtype.as_numpy_dtype)
        except Exception:
            return value  # not convertible (a tf.Tensor, a ragged list): TF's own error says so
        if not tensor.shape.is_compatible_with(array.shape):  # what Session.run raises
            raise ValueError(
                f"Cannot feed value of shape {array.shape} for Tensor {name}, which has shape "
                f"{tensor.shape}"
            )
        return array

    def _feeds_of(self, feed_dict: Optional[dict]) -> dict[str, Any]:
        """Feeds by tensor name; a sparse placeholder's value goes to its three tensors."""
        import tensorflow as tf

        from tensorflow.python.util import nest  # what Session.run reads feed_dict with

        feeds: dict[str, Any] = {}
        # A key may be a nested tuple of tensors, its value a tuple of the same structure.
        for k, v in nest.flatten_dict_items(feed_dict or {}).items():
            if isinstance(k, tf.sparse.SparseTensor):
                try:
                    indices, values, dense_shape = v
                except (TypeError, ValueError):
                    raise TypeError(
                        f"feed {k!r} a SparseTensorValue or (indices, values, dense_shape), not {v!r}"
                    ) from None
                for part, value in zip(_parts(k), (indices, values, dense_shape)):
                    name = self._feed_name(part)
                    feeds[name] = self._feedable(name, value)
            else:
                name = self._feed_name(k)
                feeds[name] = self._feedable(name, v)
        return feeds

    def _feed_name(self, key: Any) -> str:
        """The name of a feed key; one of another graph is a TypeError, as ``Session.run``
        raises for a key it cannot interpret (it was the ValueError a fetch of it is)."""
        try:
            return self._name_of(key)
        except ValueError as e:
            raise TypeError(f"Cannot interpret feed_dict key as Tensor: {e}") from None

    def _prepared(self, named: Any, feeds: dict[str, Any], timeout_ms: int = 0) -> tuple["_Placed", "_FetchKind"]:
        """The placed session to run `named` in, placed (again) first when it is a new fetch
        that needs it (see the module docstring), and what the fetch's ops do. Called with
        `_lock` held."""
        self._check_open()  # another thread may have closed it while this one waited
        key = _fetch_key(named, feeds)
        leaves = key[0]
        if key not in self._ready:
            closure = self._closure(leaves, feeds)
            placed = self._placed is not None and closure <= self._placed.names
            if placed and self._state_in_use and not closure <= self._covered:
                self._warn_as_placed(closure)
            elif not placed or not closure <= self._covered:
                readers = sorted(n for n in closure if self._graph.get_operation_by_name(n).type == "GetSessionTensor")
                if readers:
                    raise NotImplementedError(
                        f"BaechiSession cannot run {readers[0]!r}, a get_session_tensor: the "
                        "tensors that get_session_handle kept are in the placed session, and a "
                        "fetch of ops made after the first run is placed again, in a new session; "
                        "fetch the tensor's value and feed it back instead"
                    )
                try:  # the iterators that runs read are copied into the new sessions
                    self._place_again(named, feeds, closure, timeout_ms, strict=True)
                except _CannotCarry as e:  # one of them cannot be: left where it is, if it can be
                    self._state_in_use = f"{self._state_in_use} and {e}" if self._state_in_use else str(e)
                    if placed:
                        self._warn_as_placed(closure)
                    else:
                        self._place_again(named, feeds, closure, timeout_ms, strict=False)
            ops = [self._graph.get_operation_by_name(n) for n in closure]
            handles = tuple(
                n for n in leaves if ":" in n and self._graph.get_tensor_by_name(n).op.type == _TO_HANDLE_TYPE
            )
            self._ready[key] = _FetchKind.of(
                {op.type for op in ops}, self._writer_inits(ops, feeds), self._iterator_inits(ops, feeds), handles
            )
            self._ran |= closure
        kind = self._ready[key]
        if kind.uses_state and not self._state_in_use:
            self._state_in_use = _OTHER_STATE
        self._iterators_read = self._iterators_read or kind.reads_iterators
        assert self._placed is not None
        return self._placed, kind

    def _warn_as_placed(self, closure: set[str]) -> None:
        unprofiled = len(closure - self._covered)
        log.warning(
            "running a new fetch on the placement as it is, where %d of its ops %s placed by "
            "estimated costs: placing it again would restart %s",
            unprofiled, "was" if unprofiled == 1 else "were", self._state_in_use,
        )

    def _place_again(
        self, named: Any, feeds: dict[str, Any], closure: set[str], timeout_ms: int, *, strict: bool
    ) -> None:
        """`_profile_and_place`, with a warning first when that restarts what runs used; `strict`:
        `_CannotCarry` if an iterator that runs read cannot be copied into the new sessions (else
        it starts afresh there)."""
        if self._state_in_use:
            log.warning(
                "the fetch runs ops added to the graph since it was placed: placing it again "
                "restarts %s; create every op before the first run to keep them",
                self._state_in_use,
            )
        try:
            self._profile_and_place(named, feeds, closure, timeout_ms, strict=strict)
        except InfeasiblePlacementError as e:
            outside = len(self._graph.get_operations()) - len(closure)
            if not outside:
                raise
            raise InfeasiblePlacementError(
                f"{e} (BaechiSession places the whole graph: also the {outside} ops that "
                "this fetch does not run)"
            ) from None

    def _writer_inits(self, ops: list[Any], feeds: dict[str, Any]) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """The summary writer initializers among `ops` (a fetch's), each with the fed tensors it
        reads: a run of the fetch records them to be run again, alone, in each new session (the
        rest of the run may change state)."""
        out = []
        for op in ops:
            if op.type in _WRITER_INIT_TYPES:
                out.append(self._alone(op.name, self._closure((op.name,), feeds), feeds))
        return tuple(sorted(out))

    def _iterator_inits(self, ops: list[Any], feeds: dict[str, Any]) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """The iterator initializers (``MakeIterator``) among `ops` (a fetch's), each with the fed
        tensors it reads, when every op that a run of each alone executes may be run again
        (`_replayable`); else none. A run of a fetch that also initialises variables
        (``sess.run([global_variables_initializer(), iterator.initializer])``) records them to be
        run again, alone, in each new session, as a run of the initializers alone is recorded."""
        out = []
        for op in ops:
            if op.type == "MakeIterator":
                closure = self._closure((op.name,), feeds)
                if not all(_replayable(self._graph.get_operation_by_name(n).type) for n in closure):
                    return ()
                out.append(self._alone(op.name, closure, feeds))
        return tuple(sorted(out))

    def _alone(self, name: str, closure: set[str], feeds: dict[str, Any]) -> tuple[str, tuple[str, ...]]:
        """`name` with the fed tensors that the ops of `closure` (what a run of it executes) read."""
        fed = {
            t.name for n in closure for t in self._graph.get_operation_by_name(n).inputs if t.name in feeds
        }
        return name, tuple(sorted(fed))

    def _replay_user_writers(self) -> None:
        """The summary writers the wrapped session made (``writer.init()``) do not carry over:
        their initializers are run again in each new session. A flush (an op added beside the
        table readers) tells which exist there; one whose initializer needs a feed cannot be
        made again, and a warning says to run it through the BaechiSession."""
        import tensorflow as tf

        graph = self._user_session.graph
        writers = [op for op in graph.get_operations() if op.type == "SummaryWriter"]
        if not writers:
            return
        if graph.finalized:
            log.warning(
                "cannot tell which summary writers of a finalized graph the wrapped session made; "
                "none is made in the placed sessions: run their writer.init() through the BaechiSession"
            )
            return
        with graph.as_default(), graph.name_scope(READ_TABLES_SCOPE + "/"):
            probes = [tf.raw_ops.FlushSummaryWriter(writer=op.outputs[0]) for op in writers]
        for writer, probe in zip(writers, probes):
            try:
                self._user_session.run(probe)
            except tf.errors.OpError:
                continue  # not made there: a run that writes with it fails, as on a Session
            for init in graph.get_operations():
                if init.type not in _WRITER_INIT_TYPES or init.inputs[0].op is not writer:
                    continue
                if any(
                    graph.get_operation_by_name(n).type in ("Placeholder", "PlaceholderV2")
                    for n in self._closure((init.name,), {})
                ):
                    log.warning(
                        "the summary writer %s made in the wrapped session is not made in the placed "
                        "sessions: its initializer %s needs a feed; run it through the BaechiSession",
                        writer.name, init.name,
                    )
                else:
                    self._replays[_fetch_key([init.name], {})] = ([init.name], {})

    def _replay_table_initializers(self, tables: list[str]) -> None:
        """The lookup tables of a finalized graph cannot be read: their initializers (the graph's
        TABLE_INITIALIZERS) are run again in each new session instead, which gives a static
        table its contents; what a run put into a mutable table is lost."""
        import tensorflow as tf

        inits = sorted(
            op.name
            for op in self._graph.get_collection(tf.compat.v1.GraphKeys.TABLE_INITIALIZERS)
            if isinstance(op, tf.Operation)
        )
        for name in inits:  # one by one: one that fails again (a fed input) leaves the others
            self._replays[_fetch_key([name], {})] = ([name], {})
        log.warning(
            "cannot read the lookup tables of a finalized graph (%s); %s",
            ", ".join(tables[:3]) + (", ..." if len(tables) > 3 else ""),
            "their initializers are run again in each new session: what the wrapped session's "
            "runs put into a mutable table does not carry over" if inits else
            "none has an initializer in the graph's TABLE_INITIALIZERS, so they start empty: "
            "run their initializers through the BaechiSession",
        )

    def _replay(self, session: Any, redirect: Optional[dict[str, str]] = None) -> None:
        """Runs the recorded initialisations (of iterators, summary writers, a finalized graph's
        tables) in `session`, a new one: its iterators are then as right after them (where the
        placed session's were, when no run read them since; otherwise back at their start, as
        the warning of a new placement with state in use says), and its writers write a new
        events file in their folder. With `redirect` (a profiling copy: `_summary_redirect`), the
        writers write into a folder of their own: the profiling runs' summaries would repeat the
        real runs' steps.
        One that fails now (a file it read is gone) is dropped with a warning, not the placement:
        its iterator is then uninitialised there, and TF's error says so if a run reads it."""
        import tensorflow as tf

        for key, (named, feeds) in list(self._replays.items()):
            try:
                session.run(named, feed_dict={**feeds, **redirect} if redirect else feeds)
            except tf.errors.OpError as e:
                self._replays.pop(key, None)
                first = first_line(e)
                log.warning(
                    "could not run the initializer %s again in a new session (%s: %s); its "
                    "iterator or table is not initialised there: run its initializer again",
                    ", ".join(key[0]), type(e).__name__, first,
                )

    def _drain(self, old: "_Placed") -> None:
        """Waits (up to `_DRAIN_TIMEOUT_S`) for the runs in flight on `old` but those that use
        a queue (which may wait for runs that cannot start meanwhile), so that the values a new
        placement copies hold their updates; no run starts while it waits. Called with `_lock`
        held."""
        if old.runs == old.queue_runs:
            return
        log.info("waiting for %d run(s) in flight on the placement being replaced", old.runs - old.queue_runs)
        deadline = time.monotonic() + _DRAIN_TIMEOUT_S
        self._draining = True
        try:
            while old.runs > old.queue_runs and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    log.warning(
                        "%d run(s) still in flight on the placement being replaced after %.0f s; "
                        "placing without them: what they change in variables is lost",
                        old.runs - old.queue_runs, _DRAIN_TIMEOUT_S,
                    )
                    break
                self._drained.wait(left)
        finally:
            self._draining = False
            self._drained.notify_all()

    def _name_of(self, x: Any) -> str:
        import tensorflow as tf

        if isinstance(x, bytes):  # a name in bytes, which Session.run takes too
            x = x.decode()
        if isinstance(x, str):
            return x
        if isinstance(x, tf.RaggedTensor):  # its graph element is its flat values alone
            raise TypeError(
                f"cannot fetch or feed the RaggedTensor {x!r} whole: fetch (or feed) its "
                "flat_values and nested_row_splits"
            )
        x = _registered_fetch(x)
        element = getattr(x, "_as_graph_element", None)
        if callable(element):  # a variable stands for its value
            found = element()
            if found is not None:  # not `element() or x`: a graph tensor has no truth value
                x = found
        if isinstance(x, (tf.Tensor, tf.Operation)):
            if x.graph is not self._graph:
                raise ValueError(f"{x.name!r} is not an element of this session's graph")
            return x.name
        raise TypeError(
            f"cannot fetch or feed {x!r}: give tensors, sparse tensors, operations, variables or "
            "their names"
        )

    def _closure(self, fetch_names: tuple[str, ...], feeds: dict[str, Any]) -> set[str]:
        """Names of the ops a run of the fetches executes (fed tensors cut the graph)."""
        from baechi_tf.cost_model.profiler import fetch_closure

        return fetch_closure(self._graph, list(fetch_names), feeds)

    def _read_values(self, strict: bool = True) -> dict[str, Any]:
        """The variables and tables to write into a new session, and where the iterators that
        runs read are (`_IteratorIO.read`, `strict`): those of the placed session, else of the
        wrapped one (its iterators do not carry over)."""
        if self._placed is not None:
            iterators = self._ran if self._iterators_read else set()
            return self._placed.io.read(self._placed.session, iterators, strict)
        if self._user_session is not None:
            if self._user_tables is None:  # made once: each first run that fails reads again
                self._user_tables = _TableIO(self._user_session.graph, READ_TABLES_SCOPE)
                if self._user_tables.unread:
                    self._replay_table_initializers(self._user_tables.unread)
                self._replay_user_writers()
            return _read_user_state(self._user_session, self._user_tables)
        return {}

    def _profile_and_place(
        self, fetches: Any, feeds: dict[str, Any], closure: set[str], timeout_ms: int = 0, *, strict: bool = True
    ) -> None:
        import tensorflow as tf

        from baechi_tf.cost_model.profiler import ProfilingCutShort, profile_fetch

        graph_def = self._graph.as_graph_def()
        values = self._read_values(strict)
        old = self._placed
        read_after = (old.ended, old.runs) if old is not None else None  # runs the values may lack
        blocking = sorted(n for n in closure if _blocks_on_state(self._graph.get_operation_by_name(n).type))
        if blocking:
            # Nothing fills or drains the scratch copy's queues: a dequeue there would wait for
            # ever, as would an enqueue run warmup_steps + profile_steps times into a bounded one.
            log.warning(
                "placing without profiling a fetch that takes from or puts into a queue (%s): its "
                "ops that no run profiled are placed by estimated costs",
                blocking[0],
            )
            profile = None
        else:
            # The copy runs where the placement will keep the ops the graph pins (a stand-in for
            # a GPU, the host); pins to a job or task only, or ignored, are left out: TF cannot
            # run a copy pinned to a job this session does not have.
            scratch_def = resolve_user_devices(
                graph_def,
                self._setup.cluster,
                host_device=self._setup.host,
                device_aliases=self._setup.aliases,
                ignore_user_devices=self._ignore_user_devices,
            )

            def profile_on_scratch(warmup_steps: int, traced_steps: int) -> CostProfile:
                scratch = tf.Graph()
                with scratch.as_default():
                    tf.graph_util.import_graph_def(scratch_def, name="")
                io = _VariableIO(scratch)
                with self._session_class(self._target, graph=scratch, config=self._profile_config) as s, \
                        tempfile.TemporaryDirectory(prefix="baechi_tf_summaries_") as summaries:
                    io.load(s, values)
                    redirect = _summary_redirect(scratch, summaries)
                    self._replay(s, redirect)
                    io.iterators.load(s, values)
                    # The fetch's own writers too: made now, redirected, its runs find them made.
                    inits = [n for n in sorted(closure) if scratch.get_operation_by_name(n).type in _WRITER_INIT_TYPES]
                    if inits:
                        s.run(inits, feed_dict={**feeds, **redirect})
                    return profile_fetch(
                        s,
                        fetches,
                        self._own_handles(feeds, s, {}),
                        warmup_steps=warmup_steps,
                        traced_steps=traced_steps,
                        graph_def=graph_def,
                        timeout_ms=timeout_ms,
                        stop_on_error=True,
                    )

            # The scratch copy runs the fetch from the state the real run starts in, again and
            # again. A run after the first that fails (a dataset shorter than the profiling runs,
            # a step valid only so many times) ends the profiling: profile_fetch keeps the steps
            # traced before; when warm-up left none, one step is traced on a new copy. A dataset
            # with nothing to read is placed by estimates (its run then ends as a Session's does,
            # with OutOfRangeError); any other error of the first run is the real run's error.
            attempts = [(self._warmup_steps, self._profile_steps)] + [(0, 1)] * bool(self._warmup_steps)
            profile = None
            for warmup_steps, traced_steps in attempts:
                try:
                    profile = profile_on_scratch(warmup_steps, traced_steps)
                    break
                except tf.errors.OutOfRangeError:
                    continue
                except ProfilingCutShort as e:
                    if not isinstance(e.error, tf.errors.OutOfRangeError):
                        log.warning(
                            "profiling run %d of %d failed before any step was traced (%s: %s); "
                            "tracing the first run on a new copy instead", e.runs + 1,
                            warmup_steps + traced_steps, type(e.error).__name__, first_line(e.error),
                        )
                    continue
            else:
                log.warning(
                    "placing without profiling a fetch whose input has nothing to read: its ops "
                    "are placed by estimated costs"
                )
        if profile is None:  # the costs known so far, and estimates
            profile = CostProfile({}, graph_fingerprint(graph_def), graph_nodes(graph_def))
        self._profile = profile if self._profile is None else merge_profiles(self._profile, profile)
        if self._cost_path:
            save_profile(self._profile, self._cost_path)
        placed_def, report = place_graph_def(
            graph_def,
            self._profile,
            self._setup.cluster,
            self._options,
            host_device=self._setup.host,
            device_aliases=self._setup.aliases,
            ignore_user_devices=self._ignore_user_devices,
            # ignore_user_devices keeps pins to devices that exist: only the graph's code drops them
            unpin_hint="build the graph without its tf.device() pins",
        )
        self._sessions += 1
        if old is not None:
            reseeded = _reseed(placed_def, self._ran, self._sessions)
            if reseeded:
                log.info(
                    "%d seeded random ops that earlier runs used draw new numbers in the new placed "
                    "session (their seed2 changed): they do not start their sequences again",
                    reseeded,
                )
        split = _split_fusion(self._profile, report.op_to_device)
        if split is not None:
            log.warning(
                "the placement puts %r apart from %r, which the remapper fused it into while "
                "profiling: the placed graph runs without the remapper's fusions, which would run "
                "them on one device", *split,
            )
        run_config = self._run_config if split is None else self._unfused_config
        placed = _Placed(placed_def, run_config, self._target, self._session_class)
        try:
            if old is not None:
                self._drain(old)
                self._check_open()  # closed while it waited
                if (old.ended, old.runs) != read_after or old.runs:
                    values = self._read_values(strict)  # with the updates of the runs since
            placed.io.load(placed.session, values)
            self._replay(placed.session)
            placed.io.iterators.load(placed.session, values)
        except BaseException:
            placed.session.close()
            raise
        if old is not None:  # closed now, or by the last run still in flight on it
            old.retired = True
            if not old.runs:
                old.session.close()
        self._placed = placed
        self._state_in_use = None  # a fresh session: its queues, ... are new
        self._iterators_read = any(isinstance(v, _IteratorState) for v in values.values())
        self._covered |= closure
        self.placement = report  # `run` writes its reports after the run that follows
        log.info(
            "placed %d ops on %d devices (%s)",
            len(placed.names),
            len(report.devices_used),
            report.coverage.describe(),
        )


def _split_fusion(profile: CostProfile, op_to_device: dict[str, str]) -> Optional[tuple[str, str]]:
    """(op, the op it was fused into) of an op of `profile` that a fused node replaced and that
    the placement `op_to_device` puts on another device than that op, or None (the first by name)."""
    for name in sorted(profile.ops):
        into = profile.ops[name].fused_into
        if into and name in op_to_device and into in op_to_device and op_to_device[name] != op_to_device[into]:
            return name, into
    return None


def _check_arguments(
    options: Any, comm: Any, inter_host_comm: Any, warmup_steps: Any, profile_steps: Any,
    memory_bytes_per_device: Any, memory_fraction: Any,
) -> None:
    """`ConfigError` for arguments of the wrong type, which would otherwise fail only at the first
    run, with an error that does not name them."""
    if options is not None and not isinstance(options, PlacementOptions):
        raise ConfigError(
            f"options={options!r} is a {type(options).__name__}; give a PlacementOptions "
            "(PlacementOptions(placement_method='m_etf', ...))"
        )
    for name, value in (("comm", comm), ("inter_host_comm", inter_host_comm)):
        if name == "comm" and isinstance(value, str) and value.strip().lower() == "auto":
            continue
        if value is not None and not isinstance(value, CommCost):
            raise ConfigError(
                f"{name}={value!r} is a {type(value).__name__}; give a CommCost "
                "(CommCost(slope_us_per_byte=..., intercept_us=...))"
                + (", or comm='auto' to fit it to copies between the devices" if name == "comm" else "")
            )
    for name, value in (("warmup_steps", warmup_steps), ("profile_steps", profile_steps)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{name}={value!r} is not a whole number of steps")
    # A string ('8GiB') or None failed with a TypeError that did not name them.
    memory = memory_bytes_per_device
    if isinstance(memory, bool) or not isinstance(memory, (int, float)) or (
        isinstance(memory, float) and not memory.is_integer()
    ):
        raise ConfigError(
            f"memory_bytes_per_device={memory!r} is not a whole number of bytes; give bytes, "
            "e.g. 8 << 30 for 8 GiB"
        )
    if isinstance(memory_fraction, bool) or not isinstance(memory_fraction, numbers.Real):
        raise ConfigError(f"memory_fraction={memory_fraction!r} is not a number; give one in (0, 1]")


def _whole(value: Any) -> Any:
    """`value` as an int when it is an integer of another type (NumPy's), else as it is."""
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, int)):
        return int(value)
    return value


def _reseed(graph_def: Any, ran: set[str], generation: int) -> int:
    """Changes, in place, the ``seed2`` of the seeded stateful random ops of `graph_def` named in
    `ran`, and of those in the functions they call (control flow v2, ``tf.function``), to one
    that depends on `generation`; returns how many it changed.

    A random op's sequence is the kernel's state: a new session starts it again, and with fixed
    seeds (``tf.compat.v1.set_random_seed``) it would draw the numbers it drew before (the same
    dropout masks again after each new placement). Ops no run has used keep their seeds, so they
    draw what they would in a plain session.
    """
    from tensorflow.python.framework import op_def_registry

    def reseeded(node: Any) -> bool:
        if "seed" not in node.attr or "seed2" not in node.attr:
            return False
        op_def = op_def_registry.get(node.op)
        seed, seed2 = node.attr["seed"].i, node.attr["seed2"].i
        if op_def is None or not op_def.is_stateful or (seed == 0 and seed2 == 0):
            return False  # unseeded: each session draws other numbers already
        node.attr["seed2"].i = (seed2 + generation * 0x9E3779B1) % 0x7FFFFFFF or 1
        return True

    def called(node: Any) -> list[str]:
        names = []
        for value in node.attr.values():
            names += [value.func.name] if value.HasField("func") else [f.name for f in value.list.func]
        return names

    functions = {f.signature.name: f for f in graph_def.library.function}
    used = [node for node in graph_def.node if node.name in ran]
    changed = sum(map(reseeded, used))
    pending = [name for node in used for name in called(node)]
    reached: set[str] = set()
    while pending:
        name = pending.pop()
        if name in reached or name not in functions:
            continue
        reached.add(name)
        for node in functions[name].node_def:
            changed += reseeded(node)
            pending += called(node)
    return changed


def _copied(value: Any) -> Any:
    """`value` (a feed_dict's values) with its arrays and lists copied: an initializer run again
    in a new session reads the values fed to it then, as TF's iterator holds them, not what the
    caller has written into the same buffer since."""
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, dict):
        return {k: _copied(v) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a namedtuple
        return type(value)(*map(_copied, value))
    if isinstance(value, (list, tuple)):
        return type(value)(map(_copied, value))
    return value


def _handle_of(value: Any) -> Any:
    """A fed value as the string handle (bytes) it may be: `_feedable` makes a 0-d object array
    of it; anything unhashable is no handle."""
    if isinstance(value, np.ndarray) and value.shape == () and value.dtype == object:
        value = value.item()
    return value if isinstance(value, bytes) else None


def _fetched(named: Any, values: Any) -> Iterator[tuple[str, Any]]:
    """(name, value) of each fetch of a run: `named` as `_map_fetches` made it, `values` what
    ``Session.run`` returned for it (nested alike)."""
    if isinstance(named, str):
        yield named, values
    elif isinstance(named, collections.abc.Mapping):
        for key, item in named.items():
            yield from _fetched(item, values[key])
    elif getattr(type(named), "__attrs_attrs__", None) is not None:
        for a in type(named).__attrs_attrs__:
            yield from _fetched(getattr(named, a.name), getattr(values, a.name))
    elif isinstance(named, (list, tuple)):
        for item, value in zip(named, values):
            yield from _fetched(item, value)


def _fed_in(feeds: dict[str, Any], placed: set[str], graph: Any) -> dict[str, Any]:
    """`feeds` without those of tensors of `graph` whose ops the placed graph (its op names
    `placed`) lacks: ops made after its placement that the fetch does not read (one that reads
    them is placed again). A Session feeds such a tensor and nothing reads it; the placed session
    does not know its name, and refused the run with 'Cannot interpret feed_dict key as Tensor'.
    A name of no op of `graph` is kept: the placed session refuses it, as a Session does."""

    def made_later(name: str) -> bool:
        op = name.rpartition(":")[0]
        if op in placed:
            return False
        try:
            graph.get_operation_by_name(op)
        except (KeyError, ValueError):
            return False
        return True

    kept = {name: value for name, value in feeds.items() if not made_later(name)}
    return kept if len(kept) < len(feeds) else feeds


def _fetch_key(named: Any, feeds: dict[str, Any]) -> tuple:
    """What a placement is made for: the fetched names and the fed ones."""
    return tuple(sorted(set(_fetch_names(named)))), tuple(sorted(feeds))


# Iterator ops that a run of an iterator's initializer executes: it makes the iterator and sets it
# to the start of its dataset, reading nothing from it (`_FetchKind.initializes`).
_ITERATOR_SETUP_TYPES = frozenset({"Iterator", "IteratorV2", "MakeIterator"})

# Ops that make an iterator resource, whose state `_IteratorIO` copies into a new session.
_ITERATOR_TYPES = frozenset({"Iterator", "IteratorV2", "OneShotIterator"})

# Ops that read the next element of an iterator (`_FetchKind.reads_iterators`).
_ITERATOR_READ_TYPES = frozenset({"IteratorGetNext", "IteratorGetNextSync", "IteratorGetNextAsOptional"})

# The iterator ops whose state a new placement carries over (`_IteratorIO`): a fetch of them alone
# uses no state that a new session would restart (`_FetchKind.uses_state`).
_CARRIED_ITERATOR_TYPES = _ITERATOR_TYPES | _ITERATOR_READ_TYPES | {
    "MakeIterator", "IteratorToStringHandle", "IteratorFromStringHandle", "IteratorFromStringHandleV2",
}

# An iterator's string handle (``iterator.string_handle()``) and the ops that take one.
_TO_HANDLE_TYPE = "IteratorToStringHandle"
_FROM_HANDLE_TYPES = frozenset({"IteratorFromStringHandle", "IteratorFromStringHandleV2"})

# ``SerializeIterator``'s external_state_policy FAIL: a dataset whose ops keep state outside it (a
# py_func) cannot be written down, rather than being written without it.
_FAIL_ON_EXTERNAL_STATE = 2

# What `BaechiSession._state_in_use` says a new placement would restart, but iterators.
_OTHER_STATE = "the queues, readers, accumulators or staging areas that earlier runs used"


@dataclasses.dataclass(frozen=True)
class _FetchKind:
    """What the ops of a fetch do to state that does not carry into a new session."""

    uses_state: bool  # reads or changes it (`_holds_state`), more than `initializes`, but iterators
    reads_iterators: bool  # reads iterators (their state is copied into a new session: `_IteratorIO`)
    initializes: bool  # initialises iterators and nothing more: can be run again in a new session
    queues: bool  # takes from or puts into a queue (`_blocks_on_state`)
    # the ops that make summary writers it runs, each with the fed tensors it reads
    writer_inits: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # the iterator initializers it runs beside work that carries over (a variable's initializer),
    # each with the fed tensors it reads: run again alone in each new session, as `initializes` is
    iterator_inits: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # the iterators' string handles it fetches (tensor names): `BaechiSession._handles`
    handles: tuple[str, ...] = ()

    @classmethod
    def of(
        cls,
        op_types: set[str],
        writer_inits: tuple[tuple[str, tuple[str, ...]], ...] = (),
        iterator_inits: tuple[tuple[str, tuple[str, ...]], ...] = (),
        handles: tuple[str, ...] = (),
    ) -> "_FetchKind":
        stateful = {t for t in op_types if _holds_state(t)}
        # Run again in a new session, a fetch that also assigns a variable (an initializer run
        # with the iterator's) would undo what the runs since did: only iterator set-up, dataset
        # construction and stateless ops may be in it.
        initializes = "MakeIterator" in stateful and all(map(_replayable, op_types))
        # Such a fetch (sess.run([global_variables_initializer(), iterator.initializer])) sets up
        # iterators and changes what carries over: its iterators' initializers alone are run again.
        sets_up = not initializes and bool(iterator_inits) and stateful <= _ITERATOR_SETUP_TYPES
        return cls(
            uses_state=bool(stateful - _CARRIED_ITERATOR_TYPES) and not initializes and not sets_up,
            reads_iterators=bool(stateful & _ITERATOR_READ_TYPES),
            initializes=initializes,
            queues=any(map(_blocks_on_state, op_types)),
            writer_inits=writer_inits,
            iterator_inits=iterator_inits if sets_up else (),
            handles=handles,
        )


# Ops that create a summary writer (``tf.summary.create_file_writer(...).init()``): its resource
# lives in the session, so each new session needs them run again.
_WRITER_INIT_TYPES = frozenset({"CreateSummaryFileWriter", "CreateSummaryDbWriter"})


def _summary_redirect(graph: Any, folder: str) -> dict[str, str]:
    """Feeds that make the summary writers of `graph` write into `folder` (a database writer
    into a file there) instead of where the graph says."""
    redirect = {}
    for op in graph.get_operations():
        if op.type == "CreateSummaryFileWriter":
            redirect[op.inputs[1].name] = folder
        elif op.type == "CreateSummaryDbWriter":
            redirect[op.inputs[1].name] = os.path.join(folder, "summaries.sqlite")
    return redirect


def _replayable(op_type: str) -> bool:
    """Whether running an op of `op_type` again in a new session changes nothing but what an
    iterator's initializer sets up: iterator set-up, dataset construction (and the seed generators
    and caches datasets make), or an op TF registers as stateless."""
    from tensorflow.python.framework import op_def_registry

    if op_type in _ITERATOR_SETUP_TYPES or any(w in op_type for w in ("Dataset", "SeedGenerator", "MemoryCache")):
        return True
    op_def = op_def_registry.get(op_type)
    return op_def is not None and not op_def.is_stateful


def _holds_state(op_type: str) -> bool:
    """Whether ops of `op_type` keep state from run to run that a new placed session does not
    start from as it is: iterators (those of `_CARRIED_ITERATOR_TYPES` are copied into it),
    queues, lookup tables other than hash tables (`_TABLE_OP_TYPES`), readers, accumulators,
    barriers, staging areas and tensors kept by ``get_session_handle``."""
    return (
        "Iterator" in op_type
        or ("HashTable" in op_type and op_type not in _TABLE_OP_TYPES)
        or op_type.endswith(("Queue", "QueueV2", "Reader", "ReaderV2", "Barrier"))
        or "Accumulator" in op_type
        or op_type in ("Stage", "MapStage", "OrderedMapStage", "GetSessionHandle", "GetSessionHandleV2")
    )


def _blocks_on_state(op_type: str) -> bool:
    """Whether ops of `op_type` wait for what other runs do to a queue (a dequeue waits for an
    enqueue, an enqueue into a full queue for a dequeue): run over and over in a copy of the
    graph that no other run feeds or drains, they may never return."""
    return (
        "QueueDequeue" in op_type
        or "QueueEnqueue" in op_type
        or op_type.startswith("ReaderRead")
        or op_type in ("Stage", "MapStage", "OrderedMapStage", "StagePeek", "MapPeek", "OrderedMapPeek")
        or op_type.endswith(("TakeGradient", "BarrierTakeMany", "Unstage", "UnstageNoKey"))
    )


def _parts(x: Any) -> tuple:
    """A sparse tensor's three tensors (indices, values, dense_shape), as Session feeds and
    fetches them; anything else alone."""
    import tensorflow as tf

    if isinstance(x, tf.sparse.SparseTensor):
        return (x.indices, x.values, x.dense_shape)
    return (x,)


class _SlicesWithoutShape(tuple):
    """The fetch of an IndexedSlices without a dense_shape: the names of its values and indices.
    ``Session.run`` fetches a tuple subclass as a namedtuple and rebuilds the result with
    ``type(fetch)(*values)``, which makes the ``IndexedSlicesValue(values, indices, None)`` that a
    Session returns for it."""

    _fields = ("values", "indices")

    def __new__(cls, values: Any, indices: Any) -> Any:
        from tensorflow.python.framework.indexed_slices import IndexedSlicesValue  # not public

        return IndexedSlicesValue(values, indices, None)


def _map_fetches(fn: Any, fetch: Any) -> Any:
    """`fetch` with `fn` applied to each of its elements, nested as ``Session.run`` nests them:
    in lists, tuples, namedtuples, mappings (of any keys, kept in their order) and attrs classes,
    each rebuilt as its own type, so that ``Session.run`` returns the values in the same one."""
    if fetch is None:
        raise TypeError("cannot fetch None: give tensors, operations, variables or their names")
    if isinstance(fetch, (list, tuple)):
        items = [_map_fetches(fn, f) for f in fetch]
        if isinstance(fetch, list):
            return items
        return tuple(items) if type(fetch) is tuple else type(fetch)(*items)  # a namedtuple
    if isinstance(fetch, collections.abc.Mapping):
        if isinstance(fetch, collections.defaultdict):
            mapped = collections.defaultdict(fetch.default_factory)
        else:
            mapped = type(fetch)()
        for key, value in fetch.items():
            mapped[key] = _map_fetches(fn, value)
        return mapped
    fields = getattr(type(fetch), "__attrs_attrs__", None)
    if fields is not None:
        return type(fetch)(*(_map_fetches(fn, getattr(fetch, a.name)) for a in fields))
    return fn(fetch)


def _registered_fetch(x: Any) -> Any:
    """The tensor that ``Session.run`` fetches for `x` when x's type is registered with it
    (``register_session_run_conversion_functions``) as standing for one tensor, as TF registers
    the loss of a variable's regularizer (in ``REGULARIZATION_LOSSES``); else `x`."""
    from tensorflow.python.client import session as tf_session  # the registry is not public

    for kind, fetch_function, _, _ in getattr(tf_session, "_REGISTERED_EXPANSIONS", ()):
        if isinstance(x, kind):  # the first match is the one Session.run takes
            if kind is object:
                return x
            parts, contract = fetch_function(x)
            marker = object()
            return parts[0] if len(parts) == 1 and contract([marker]) is marker else x
    return x


def _fetch_names(named: Any) -> list[str]:
    """The names in a structure that `_map_fetches` made of names."""
    if isinstance(named, str):
        return [named]
    if isinstance(named, collections.abc.Mapping):
        named = list(named.values())
    elif getattr(type(named), "__attrs_attrs__", None) is not None:
        named = [getattr(named, a.name) for a in type(named).__attrs_attrs__]
    return [name for item in named for name in _fetch_names(item)]


@functools.lru_cache(maxsize=None)
def _session_class(cls: type) -> type:
    """`cls` (BaechiSession or a subclass) also deriving from TF's ``SessionInterface``."""
    from tensorflow.python.client.session import SessionInterface

    if issubclass(cls, SessionInterface):
        return cls
    return type(cls.__name__, (cls, SessionInterface), {"__module__": cls.__module__, "__qualname__": cls.__qualname__})
