"""The lifecycle of a `BaechiSession`'s placed sessions: creation, the runs in flight on each,
the wait of a new placement for them, and closing.

A placed session is a placed GraphDef imported into a graph of its own, with a session of it.
Each new placement makes one, writes the carried state into it and replays the recorded
initialisations there (`start`); the session it replaces closes once no run is in flight on it.
One lock guards all of it: runs count themselves in (`begin_run`, `end_run`) under it, and a new
placement waits (`drain`) for the runs in flight on the session it replaces, during which no run
starts.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Optional

from baechi_tf.cost_model.profile import CostProfile
from baechi_tf.rewriter.session.replays import Replays
from baechi_tf.rewriter.session.state import VariableIO

__all__ = ["PlacedSession", "PlacedSessions", "reseed", "split_fusion"]

log = logging.getLogger(__name__)

DRAIN_TIMEOUT_S = 120.0
"""How long a new placement waits for the runs in flight on the one it replaces."""


class PlacedSession:
    """A placed GraphDef imported into a graph of its own, with its session."""

    def __init__(self, graph_def: Any, config: Any, target: str, session_class: type) -> None:
        import tensorflow as tf

        self.graph_def = graph_def
        self.graph = tf.Graph()
        with self.graph.as_default():
            tf.graph_util.import_graph_def(graph_def, name="")
        self.names = {n.name for n in graph_def.node}
        self.io = VariableIO(self.graph)
        self.session = session_class(target, graph=self.graph, config=config)
        self.handles: dict[str, bytes] = {}  # the string handles of its iterators, by tensor name
        self.runs = 0  # runs in flight on `session`
        self.queue_runs = 0  # those of them that take from or put into a queue (not waited for)
        self.ended = 0  # runs ended on `session`
        self.retired = False  # replaced by a new placement: closed once no run is in flight


class PlacedSessions:
    """The current placed session of a `BaechiSession` and those it replaced that runs still use."""

    def __init__(self) -> None:
        self.lock = threading.RLock()  # held while a run profiles and places
        # A new placement waits (`drain`) for the runs in flight on the one it replaces, so that
        # their updates reach the variables it copies; meanwhile no run starts.
        self._drained = threading.Condition(self.lock)
        self._draining = False
        self.current: Optional[PlacedSession] = None
        self.made = 0  # placed sessions made
        self.closed = False

    def check_open(self) -> None:
        if self.closed:
            raise RuntimeError("Attempted to use a closed BaechiSession.")

    def wait_for_drain(self) -> None:
        """Returns once no new placement waits for runs in flight. Called with `lock` held."""
        while self._draining:
            self._drained.wait()

    def begin_run(self, placed: PlacedSession, queues: bool) -> None:
        """Counts a run in on `placed` (`queues`: it takes from or puts into a queue). Called with
        `lock` held; `end_run` counts it out in any case."""
        placed.runs += 1
        placed.queue_runs += queues

    def end_run(self, placed: PlacedSession, queues: bool) -> None:
        """Counts a run out of `placed`, and closes `placed` when it was replaced and this was the
        last run in flight on it."""
        with self.lock:
            placed.runs -= 1
            placed.queue_runs -= queues
            placed.ended += 1
            if placed.retired and not placed.runs:
                placed.session.close()
            self._drained.notify_all()

    def start(
        self,
        placed: PlacedSession,
        values: dict[str, Any],
        read_after: Optional[tuple[int, int]],
        read_values: Callable[[], dict[str, Any]],
        replays: Replays,
    ) -> dict[str, Any]:
        """Makes `placed` the current placed session: writes the state `values` into it (read
        again with `read_values` after the wait for the runs in flight on the session it replaces,
        when runs ended there since `read_after`, its (ended, runs) when `values` was read), runs
        the `replays`, puts the iterators where they were, and retires the session it replaces.
        Returns the values it wrote. Called with `lock` held; on any error `placed` is closed and
        the current session stays."""
        old = self.current
        try:
            if old is not None:
                self.drain(old)
                self.check_open()  # closed while it waited
                if (old.ended, old.runs) != read_after or old.runs:
                    values = read_values()  # with the updates of the runs since
            placed.io.load(placed.session, values)
            replays.run_in(placed.session)
            placed.io.iterators.load(placed.session, values)
        except BaseException:
            placed.session.close()
            raise
        if old is not None:  # closed now, or by the last run still in flight on it
            old.retired = True
            if not old.runs:
                old.session.close()
        self.current = placed
        return values

    def close(self) -> None:
        """Closes the current placed session; those it replaced close after their last run."""
        self.closed = True
        if self.current is not None:
            self.current.session.close()
            self.current = None

    def drain(self, old: PlacedSession) -> None:
        """Waits (up to `DRAIN_TIMEOUT_S`) for the runs in flight on `old` but those that use
        a queue (which may wait for runs that cannot start meanwhile), so that the values a new
        placement copies hold their updates; no run starts while it waits. Called with `lock`
        held."""
        if old.runs == old.queue_runs:
            return
        log.info("waiting for %d run(s) in flight on the placement being replaced", old.runs - old.queue_runs)
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        self._draining = True
        try:
            while old.runs > old.queue_runs and not self.closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    log.warning(
                        "%d run(s) still in flight on the placement being replaced after %.0f s; "
                        "placing without them: what they change in variables is lost",
                        old.runs - old.queue_runs, DRAIN_TIMEOUT_S,
                    )
                    break
                self._drained.wait(left)
        finally:
            self._draining = False
            self._drained.notify_all()


def split_fusion(profile: CostProfile, op_to_device: dict[str, str]) -> Optional[tuple[str, str]]:
    """(op, the op it was fused into) of an op of `profile` that a fused node replaced and that
    the placement `op_to_device` puts on another device than that op, or None (the first by name)."""
    for name in sorted(profile.ops):
        into = profile.ops[name].fused_into
        if into and name in op_to_device and into in op_to_device and op_to_device[name] != op_to_device[into]:
            return name, into
    return None


def reseed(graph_def: Any, ran: set[str], generation: int) -> int:
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
