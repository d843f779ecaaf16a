"""The fetch plan of a `BaechiSession` run: what its fetches and feeds name in the user's graph,
which ops a run of them executes, and what those ops do to state that a new session restarts.

`FetchPlan` resolves fetches and feeds as ``Session.run`` does (nested structures, sparse
tensors, variables, names) and refuses what a Session refuses: the copies run here are imported
GraphDefs, which keep neither TF's fetchable and feedable marks nor the user's static shapes.
`FetchKind` classifies a fetch by its ops' types. A closure is one backward traversal of the
graph, O(ops + edges) of what the fetch runs.
"""

from __future__ import annotations

import collections.abc
import dataclasses
from typing import Any, Iterator, Optional

import numpy as np

from baechi_tf.rewriter.session.state import ITERATOR_TYPES, TABLE_OP_TYPES

__all__ = [
    "FROM_HANDLE_TYPES", "OTHER_STATE", "WRITER_INIT_TYPES", "FetchKind", "FetchPlan", "blocks_on_state",
    "fed_in", "fetch_key", "fetched", "handle_of", "map_fetches", "parts",
]

# Iterator ops that a run of an iterator's initializer executes: it makes the iterator and sets it
# to the start of its dataset, reading nothing from it (`FetchKind.initializes`).
_ITERATOR_SETUP_TYPES = frozenset({"Iterator", "IteratorV2", "MakeIterator"})

# Ops that read the next element of an iterator (`FetchKind.reads_iterators`).
_ITERATOR_READ_TYPES = frozenset({"IteratorGetNext", "IteratorGetNextSync", "IteratorGetNextAsOptional"})

# The iterator ops whose state a new placement carries over (`IteratorIO`): a fetch of them alone
# uses no state that a new session would restart (`FetchKind.uses_state`).
_CARRIED_ITERATOR_TYPES = ITERATOR_TYPES | _ITERATOR_READ_TYPES | {
    "MakeIterator", "IteratorToStringHandle", "IteratorFromStringHandle", "IteratorFromStringHandleV2",
}

# An iterator's string handle (``iterator.string_handle()``) and the ops that take one.
TO_HANDLE_TYPE = "IteratorToStringHandle"
FROM_HANDLE_TYPES = frozenset({"IteratorFromStringHandle", "IteratorFromStringHandleV2"})

# What `BaechiSession._state_in_use` says a new placement would restart, but iterators.
OTHER_STATE = "the queues, readers, accumulators or staging areas that earlier runs used"

# Ops that create a summary writer (``tf.summary.create_file_writer(...).init()``): its resource
# lives in the session, so each new session needs them run again.
WRITER_INIT_TYPES = frozenset({"CreateSummaryFileWriter", "CreateSummaryDbWriter"})


class FetchPlan:
    """Fetches and feeds of runs in terms of the ops of `graph`, the user's graph."""

    def __init__(self, graph: Any) -> None:
        self.graph = graph

    def fetch_of(self, x: Any) -> Any:
        """The name of a fetch; a SparseTensor's is a SparseTensorValue of its three tensors'
        names, which ``Session.run`` returns as a SparseTensorValue of their values (and so for
        an IndexedSlices)."""
        import tensorflow as tf

        def part(t: Any) -> str:
            return self._fetchable(self.name_of(t))

        if isinstance(x, tf.sparse.SparseTensor):
            return tf.compat.v1.SparseTensorValue(*map(part, parts(x)))
        if isinstance(x, tf.IndexedSlices):  # a gather's gradient: an IndexedSlicesValue
            if x.dense_shape is None:
                return tuple.__new__(_SlicesWithoutShape, (part(x.values), part(x.indices)))
            from tensorflow.python.framework.indexed_slices import IndexedSlicesValue  # not public

            return IndexedSlicesValue(part(x.values), part(x.indices), part(x.dense_shape))
        name = self.name_of(x)
        if isinstance(x, (str, bytes)):  # a tensor or op given as such is in the graph already
            try:
                self.graph.as_graph_element(name)
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

        element = self.graph.as_graph_element(name)
        op = element if isinstance(element, tf.Operation) else element.op
        if not self.graph.is_fetchable(op):
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
            tensor = self.graph.get_tensor_by_name(name)
        except (KeyError, ValueError):
            return value  # not a tensor's name: the run fails as a Session's does
        if not self.graph.is_feedable(tensor):
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

    def feeds_of(self, feed_dict: Optional[dict]) -> dict[str, Any]:
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
                for part, value in zip(parts(k), (indices, values, dense_shape)):
                    name = self.feed_name(part)
                    feeds[name] = self._feedable(name, value)
            else:
                name = self.feed_name(k)
                feeds[name] = self._feedable(name, v)
        return feeds

    def feed_name(self, key: Any) -> str:
        """The name of a feed key; one of another graph is a TypeError, as ``Session.run``
        raises for a key it cannot interpret (it was the ValueError a fetch of it is)."""
        try:
            return self.name_of(key)
        except ValueError as e:
            raise TypeError(f"Cannot interpret feed_dict key as Tensor: {e}") from None


    def name_of(self, x: Any) -> str:
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
            if x.graph is not self.graph:
                raise ValueError(f"{x.name!r} is not an element of this session's graph")
            return x.name
        raise TypeError(
            f"cannot fetch or feed {x!r}: give tensors, sparse tensors, operations, variables or "
            "their names"
        )

    def closure(self, fetch_names: tuple[str, ...], feeds: dict[str, Any]) -> set[str]:
        """Names of the ops a run of the fetches executes (fed tensors cut the graph)."""
        from baechi_tf.cost_model.profiler import fetch_closure

        return fetch_closure(self.graph, list(fetch_names), feeds)


    def _writer_inits(self, ops: list[Any], feeds: dict[str, Any]) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """The summary writer initializers among `ops` (a fetch's), each with the fed tensors it
        reads: a run of the fetch records them to be run again, alone, in each new session (the
        rest of the run may change state)."""
        out = []
        for op in ops:
            if op.type in WRITER_INIT_TYPES:
                out.append(self._alone(op.name, self.closure((op.name,), feeds), feeds))
        return tuple(sorted(out))

    def _iterator_inits(self, ops: list[Any], feeds: dict[str, Any]) -> tuple[tuple[str, tuple[str, ...]], ...]:
        """The iterator initializers (``MakeIterator``) among `ops` (a fetch's), each with the fed
        tensors it reads, when every op that a run of each alone executes may be run again
        (`replayable`); else none. A run of a fetch that also initialises variables
        (``sess.run([global_variables_initializer(), iterator.initializer])``) records them to be
        run again, alone, in each new session, as a run of the initializers alone is recorded."""
        out = []
        for op in ops:
            if op.type == "MakeIterator":
                closure = self.closure((op.name,), feeds)
                if not all(replayable(self.graph.get_operation_by_name(n).type) for n in closure):
                    return ()
                out.append(self._alone(op.name, closure, feeds))
        return tuple(sorted(out))

    def _alone(self, name: str, closure: set[str], feeds: dict[str, Any]) -> tuple[str, tuple[str, ...]]:
        """`name` with the fed tensors that the ops of `closure` (what a run of it executes) read."""
        fed = {
            t.name for n in closure for t in self.graph.get_operation_by_name(n).inputs if t.name in feeds
        }
        return name, tuple(sorted(fed))

    def kind(self, leaves: tuple[str, ...], closure: set[str], feeds: dict[str, Any]) -> "FetchKind":
        """What a run of the fetches `leaves` fed `feeds` does, its ops being `closure`."""
        ops = [self.graph.get_operation_by_name(n) for n in closure]
        handles = tuple(
            n for n in leaves if ":" in n and self.graph.get_tensor_by_name(n).op.type == TO_HANDLE_TYPE
        )
        return FetchKind.of(
            {op.type for op in ops}, self._writer_inits(ops, feeds), self._iterator_inits(ops, feeds), handles
        )


@dataclasses.dataclass(frozen=True)
class FetchKind:
    """What the ops of a fetch do to state that does not carry into a new session."""

    uses_state: bool  # reads or changes it (`_holds_state`), more than `initializes`, but iterators
    reads_iterators: bool  # reads iterators (their state is copied into a new session: `IteratorIO`)
    initializes: bool  # initialises iterators and nothing more: can be run again in a new session
    queues: bool  # takes from or puts into a queue (`blocks_on_state`)
    # the ops that make summary writers it runs, each with the fed tensors it reads
    writer_inits: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # the iterator initializers it runs beside work that carries over (a variable's initializer),
    # each with the fed tensors it reads: run again alone in each new session, as `initializes` is
    iterator_inits: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # the iterators' string handles it fetches (tensor names): ``BaechiSession`'s handles`
    handles: tuple[str, ...] = ()

    @classmethod
    def of(
        cls,
        op_types: set[str],
        writer_inits: tuple[tuple[str, tuple[str, ...]], ...] = (),
        iterator_inits: tuple[tuple[str, tuple[str, ...]], ...] = (),
        handles: tuple[str, ...] = (),
    ) -> "FetchKind":
        stateful = {t for t in op_types if _holds_state(t)}
        # Run again in a new session, a fetch that also assigns a variable (an initializer run
        # with the iterator's) would undo what the runs since did: only iterator set-up, dataset
        # construction and stateless ops may be in it.
        initializes = "MakeIterator" in stateful and all(map(replayable, op_types))
        # Such a fetch (sess.run([global_variables_initializer(), iterator.initializer])) sets up
        # iterators and changes what carries over: its iterators' initializers alone are run again.
        sets_up = not initializes and bool(iterator_inits) and stateful <= _ITERATOR_SETUP_TYPES
        return cls(
            uses_state=bool(stateful - _CARRIED_ITERATOR_TYPES) and not initializes and not sets_up,
            reads_iterators=bool(stateful & _ITERATOR_READ_TYPES),
            initializes=initializes,
            queues=any(map(blocks_on_state, op_types)),
            writer_inits=writer_inits,
            iterator_inits=iterator_inits if sets_up else (),
            handles=handles,
        )


def replayable(op_type: str) -> bool:
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
    queues, lookup tables other than hash tables (`TABLE_OP_TYPES`), readers, accumulators,
    barriers, staging areas and tensors kept by ``get_session_handle``."""
    return (
        "Iterator" in op_type
        or ("HashTable" in op_type and op_type not in TABLE_OP_TYPES)
        or op_type.endswith(("Queue", "QueueV2", "Reader", "ReaderV2", "Barrier"))
        or "Accumulator" in op_type
        or op_type in ("Stage", "MapStage", "OrderedMapStage", "GetSessionHandle", "GetSessionHandleV2")
    )


def blocks_on_state(op_type: str) -> bool:
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


def handle_of(value: Any) -> Any:
    """A fed value as the string handle (bytes) it may be: `_feedable` makes a 0-d object array
    of it; anything unhashable is no handle."""
    if isinstance(value, np.ndarray) and value.shape == () and value.dtype == object:
        value = value.item()
    return value if isinstance(value, bytes) else None


def fetched(named: Any, values: Any) -> Iterator[tuple[str, Any]]:
    """(name, value) of each fetch of a run: `named` as `map_fetches` made it, `values` what
    ``Session.run`` returned for it (nested alike)."""
    if isinstance(named, str):
        yield named, values
    elif isinstance(named, collections.abc.Mapping):
        for key, item in named.items():
            yield from fetched(item, values[key])
    elif getattr(type(named), "__attrs_attrs__", None) is not None:
        for a in type(named).__attrs_attrs__:
            yield from fetched(getattr(named, a.name), getattr(values, a.name))
    elif isinstance(named, (list, tuple)):
        for item, value in zip(named, values):
            yield from fetched(item, value)


def fed_in(feeds: dict[str, Any], placed: set[str], graph: Any) -> dict[str, Any]:
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


def fetch_key(named: Any, feeds: dict[str, Any]) -> tuple:
    """What a placement is made for: the fetched names and the fed ones."""
    return tuple(sorted(set(_fetch_names(named)))), tuple(sorted(feeds))


def parts(x: Any) -> tuple:
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


def map_fetches(fn: Any, fetch: Any) -> Any:
    """`fetch` with `fn` applied to each of its elements, nested as ``Session.run`` nests them:
    in lists, tuples, namedtuples, mappings (of any keys, kept in their order) and attrs classes,
    each rebuilt as its own type, so that ``Session.run`` returns the values in the same one."""
    if fetch is None:
        raise TypeError("cannot fetch None: give tensors, operations, variables or their names")
    if isinstance(fetch, (list, tuple)):
        items = [map_fetches(fn, f) for f in fetch]
        if isinstance(fetch, list):
            return items
        return tuple(items) if type(fetch) is tuple else type(fetch)(*items)  # a namedtuple
    if isinstance(fetch, collections.abc.Mapping):
        if isinstance(fetch, collections.defaultdict):
            mapped = collections.defaultdict(fetch.default_factory)
        else:
            mapped = type(fetch)()
        for key, value in fetch.items():
            mapped[key] = map_fetches(fn, value)
        return mapped
    fields = getattr(type(fetch), "__attrs_attrs__", None)
    if fields is not None:
        return type(fetch)(*(map_fetches(fn, getattr(fetch, a.name)) for a in fields))
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
            expanded, contract = fetch_function(x)
            marker = object()
            return expanded[0] if len(expanded) == 1 and contract([marker]) is marker else x
    return x


def _fetch_names(named: Any) -> list[str]:
    """The names in a structure that `map_fetches` made of names."""
    if isinstance(named, str):
        return [named]
    if isinstance(named, collections.abc.Mapping):
        named = list(named.values())
    elif getattr(type(named), "__attrs_attrs__", None) is not None:
        named = [getattr(named, a.name) for a in type(named).__attrs_attrs__]
    return [name for item in named for name in _fetch_names(item)]
