"""The state that carries over into each new session of a `BaechiSession`: variables, the contents
of lookup tables and where iterators are.

`VariableIO` reads and writes them in a graph this package owns (a placed graph, a profiling
copy) through helper ops added beside each; `UserState` reads them from the session the
`BaechiSession` wraps, through the user's graph's own ops where it has them. Each read is one
``Session.run`` per kind of state, O(variables + tables + iterators) ops.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Optional

from baechi_tf.cost_model.profile import READ_TABLES_SCOPE
from baechi_tf.errors import first_line
from baechi_tf.graph import VARIABLE_OP_TYPES

__all__ = ["CannotCarry", "IteratorState", "TableIO", "UserState", "VariableIO", "ITERATOR_TYPES", "TABLE_OP_TYPES"]

log = logging.getLogger(__name__)

# Ops that make an iterator resource, whose state `IteratorIO` copies into a new session.
ITERATOR_TYPES = frozenset({"Iterator", "IteratorV2", "OneShotIterator"})

# ``SerializeIterator``'s external_state_policy FAIL: a dataset whose ops keep state outside it (a
# py_func) cannot be written down, rather than being written without it.
_FAIL_ON_EXTERNAL_STATE = 2

# Lookup tables whose contents carry into a new session (export, then import): static hash
# tables (``tf.lookup.StaticHashTable``, ``index_table_from_*``) and mutable ones.
TABLE_OP_TYPES = frozenset({"HashTableV2", "MutableHashTableV2", "MutableHashTableOfTensorsV2"})


@dataclasses.dataclass(frozen=True)
class _TableContents:
    """The keys and values of a lookup table, as `VariableIO.read` returns them."""

    keys: Any
    values: Any


class TableIO:
    """Export and import ops of the lookup tables of a graph (added to it, beside each table)."""

    def __init__(self, graph: Any, name_scope: str) -> None:
        import tensorflow as tf

        self.entries: list[tuple[str, Any, Any, Any, Any, Any, Any]] = []
        tables = [op for op in graph.get_operations() if op.type in TABLE_OP_TYPES]
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
class IteratorState:
    """Where an iterator is in its dataset (its buffers and random state too), as
    ``SerializeIterator`` writes it, in a ``serialize_tensor`` string."""

    serialized: bytes


class CannotCarry(Exception):
    """An iterator that runs have read cannot be copied into a new session (says which, and why)."""


class IteratorIO:
    """Reads and writes where the iterators of a graph this module owns are (``SerializeIterator``
    and ``DeserializeIterator``, added beside each iterator)."""

    def __init__(self, graph: Any, name_scope: str) -> None:
        import tensorflow as tf

        self.entries: dict[str, tuple[Any, Any, Any]] = {}
        with graph.as_default(), tf.name_scope(name_scope):
            for op in graph.get_operations():
                if op.type not in ITERATOR_TYPES:
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

    def read(self, session: Any, names: set[str], strict: bool = True) -> dict[str, IteratorState]:
        """Where the initialised iterators among `names` are, by op name. One that cannot be
        written down (its dataset calls a ``py_func`` or another op with state outside the
        dataset) is `CannotCarry` when `strict`, else left out (it starts afresh)."""
        import tensorflow as tf

        out: dict[str, IteratorState] = {}
        for name in sorted(names & self.entries.keys()):
            try:
                out[name] = IteratorState(session.run(self.entries[name][0]))
            except tf.errors.OpError as e:
                if "has not been initialized" in e.message or not strict:
                    continue  # not initialised: nor is it in a new session (but by its initializer)
                raise CannotCarry(
                    f"the iterator {name!r} (read again from its start: its state cannot be copied "
                    f"into a new session, {first_line(e)})"
                ) from None
        return out

    def load(self, session: Any, states: dict[str, Any]) -> None:
        """Puts the iterators of `states` where they were; run after the initializers (`Replays.run_in`),
        since an iterator is restored within the dataset it was initialised with."""
        import tensorflow as tf

        for name, (_, new, restore) in self.entries.items():
            state = states.get(name)
            if not isinstance(state, IteratorState):
                continue
            try:
                session.run(restore, feed_dict={new: state.serialized})
            except tf.errors.OpError as e:  # its initializer could not be run again (`Replays.run_in`)
                log.warning(
                    "could not put the iterator %s where it was in the new session (%s: %s); it "
                    "reads from where its initializer left it there",
                    name, type(e).__name__, first_line(e),
                )


class VariableIO:
    """Reads and writes the variables, lookup tables and iterators of a graph this module owns
    (helper ops added to it)."""

    def __init__(self, graph: Any) -> None:
        import tensorflow as tf

        self.tables = TableIO(graph, "baechi_tf_io")
        self.iterators = IteratorIO(graph, "baechi_tf_io")
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
        `iterators` are (`IteratorIO.read`), by op name."""
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


def _read_user_state(session: Any, tables: "TableIO") -> dict[str, Any]:
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


class UserState:
    """Reads the state of the session a `BaechiSession` wraps, whose graph belongs to the user.

    The lookup tables' export ops are added to the user's graph at the first read (beside the
    table readers, `READ_TABLES_SCOPE`); a finalized graph's tables cannot be read, and
    `on_first_read` is then given their names (the caller replays their initializers)."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self._tables: Optional[TableIO] = None

    def read(self, on_first_read: Callable[[list[str]], None]) -> dict[str, Any]:
        """Values of the initialised variables and contents of the filled lookup tables, by op
        name. `on_first_read(unread tables)` runs once, at the first read (a first run that
        fails reads again)."""
        if self._tables is None:
            self._tables = TableIO(self.session.graph, READ_TABLES_SCOPE)
            on_first_read(self._tables.unread)
        return _read_user_state(self.session, self._tables)
