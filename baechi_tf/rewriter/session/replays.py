"""The replays of a `BaechiSession`: the initialisations that each new session runs again.

Iterators, summary writers and (in a finalized graph) lookup tables live in a session and do not
carry over as values: the runs that set them up are recorded, each with a copy of its feeds,
and run again, in the order they last ran, in each new placed session and profiling copy.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Optional

import numpy as np

from baechi_tf.cost_model.profile import READ_TABLES_SCOPE
from baechi_tf.errors import first_line
from baechi_tf.rewriter.session.fetches import WRITER_INIT_TYPES, FetchKind, FetchPlan, fetch_key

__all__ = ["Replays", "summary_redirect"]

log = logging.getLogger(__name__)


class Replays:
    """The recorded initialisations: fetch key -> (fetch, feeds), in the order of their latest runs."""

    def __init__(self) -> None:
        self.records: dict[tuple, tuple[Any, dict[str, Any]]] = {}

    def record(self, kind: FetchKind, named: Any, feeds: dict[str, Any]) -> None:
        """Records what a run of `named` fed `feeds`, which ended well, set up (`kind`): the run
        itself when it only initialises iterators, else each iterator initializer and summary
        writer initializer it ran, alone, with the feeds it read."""
        if kind.initializes:  # the latest run of each initializer, in the order of those runs
            key = fetch_key(named, feeds)
            self.records.pop(key, None)
            self.records[key] = (named, _copied(feeds))
        if kind.iterator_inits:  # each iterator it set up, alone, as a run of its initializer
            for name, fed in kind.iterator_inits:
                own = _copied({t: feeds[t] for t in fed})
                self.records.pop(fetch_key([name], own), None)
                self.records[fetch_key([name], own)] = ([name], own)
        if kind.writer_inits:  # each writer the run made, alone, with the feeds it read
            for name, fed in kind.writer_inits:
                own = _copied({t: feeds[t] for t in fed})
                self.records[fetch_key([name], own)] = ([name], own)

    def add_user_writers(self, session: Any, plan: FetchPlan) -> None:
        """The summary writers the wrapped session made (``writer.init()``) do not carry over:
        their initializers are run again in each new session. A flush (an op added beside the
        table readers) tells which exist there; one whose initializer needs a feed cannot be
        made again, and a warning says to run it through the BaechiSession."""
        import tensorflow as tf

        graph = session.graph
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
                session.run(probe)
            except tf.errors.OpError:
                continue  # not made there: a run that writes with it fails, as on a Session
            for init in graph.get_operations():
                if init.type not in WRITER_INIT_TYPES or init.inputs[0].op is not writer:
                    continue
                if any(
                    graph.get_operation_by_name(n).type in ("Placeholder", "PlaceholderV2")
                    for n in plan.closure((init.name,), {})
                ):
                    log.warning(
                        "the summary writer %s made in the wrapped session is not made in the placed "
                        "sessions: its initializer %s needs a feed; run it through the BaechiSession",
                        writer.name, init.name,
                    )
                else:
                    self.records[fetch_key([init.name], {})] = ([init.name], {})

    def add_table_initializers(self, graph: Any, tables: list[str]) -> None:
        """The lookup tables of a finalized graph cannot be read: their initializers (the graph's
        TABLE_INITIALIZERS) are run again in each new session instead, which gives a static
        table its contents; what a run put into a mutable table is lost."""
        import tensorflow as tf

        inits = sorted(
            op.name
            for op in graph.get_collection(tf.compat.v1.GraphKeys.TABLE_INITIALIZERS)
            if isinstance(op, tf.Operation)
        )
        for name in inits:  # one by one: one that fails again (a fed input) leaves the others
            self.records[fetch_key([name], {})] = ([name], {})
        log.warning(
            "cannot read the lookup tables of a finalized graph (%s); %s",
            ", ".join(tables[:3]) + (", ..." if len(tables) > 3 else ""),
            "their initializers are run again in each new session: what the wrapped session's "
            "runs put into a mutable table does not carry over" if inits else
            "none has an initializer in the graph's TABLE_INITIALIZERS, so they start empty: "
            "run their initializers through the BaechiSession",
        )

    def run_in(self, session: Any, redirect: Optional[dict[str, str]] = None) -> None:
        """Runs the recorded initialisations (of iterators, summary writers, a finalized graph's
        tables) in `session`, a new one: its iterators are then as right after them (where the
        placed session's were, when no run read them since; otherwise back at their start, as
        the warning of a new placement with state in use says), and its writers write a new
        events file in their folder. With `redirect` (a profiling copy: `summary_redirect`), the
        writers write into a folder of their own: the profiling runs' summaries would repeat the
        real runs' steps.
        One that fails now (a file it read is gone) is dropped with a warning, not the placement:
        its iterator is then uninitialised there, and TF's error says so if a run reads it."""
        import tensorflow as tf

        for key, (named, feeds) in list(self.records.items()):
            try:
                session.run(named, feed_dict={**feeds, **redirect} if redirect else feeds)
            except tf.errors.OpError as e:
                self.records.pop(key, None)
                first = first_line(e)
                log.warning(
                    "could not run the initializer %s again in a new session (%s: %s); its "
                    "iterator or table is not initialised there: run its initializer again",
                    ", ".join(key[0]), type(e).__name__, first,
                )


def summary_redirect(graph: Any, folder: str) -> dict[str, str]:
    """Feeds that make the summary writers of `graph` write into `folder` (a database writer
    into a file there) instead of where the graph says."""
    redirect = {}
    for op in graph.get_operations():
        if op.type == "CreateSummaryFileWriter":
            redirect[op.inputs[1].name] = folder
        elif op.type == "CreateSummaryDbWriter":
            redirect[op.inputs[1].name] = os.path.join(folder, "summaries.sqlite")
    return redirect


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
