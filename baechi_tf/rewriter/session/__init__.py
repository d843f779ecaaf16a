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
(seeded random ops once a new fetch is placed again aside: `placed.reseed`).
Runs from several threads go side by side, as on a Session, but one profiles and places at a
time; a new placement waits for the runs in flight on the placed session it replaces (but those
that use a queue, which may wait for runs that cannot start meanwhile; and for at most
`placed.DRAIN_TIMEOUT_S`) and copies the variables after them, then closes that session.
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
Profiling and the placed graph run on the cluster, in sessions whose state is isolated from each
other's. The placed graph runs with TensorFlow's optimizations (Grappler, the classic graph optimizer), but for those of Grappler's optimizers that
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

import contextlib
import functools
import logging
from typing import Any, Optional, Union

from baechi_tf.cluster import DEFAULT_COMM, CommCost
from baechi_tf.cost_model.profile import CostProfile, graph_fingerprint, graph_nodes, merge_profiles, save_profile
from baechi_tf.errors import InfeasiblePlacementError
from baechi_tf.placer.pipeline import PlacementOptions
from baechi_tf.rewriter.devices import DEFAULT_MEMORY_BYTES_PER_DEVICE, DeviceSetup
from baechi_tf.rewriter.distributed.discovery import DEFAULT_TIMEOUT_S
from baechi_tf.rewriter.graph_pass import PlacementReport, place_graph_def
from baechi_tf.rewriter.session.arguments import configure
from baechi_tf.rewriter.session.fetches import (
    OTHER_STATE,
    FetchKind,
    FetchPlan,
    fed_in,
    fetch_key,
    fetched,
    handle_of,
    map_fetches,
    parts,
)
from baechi_tf.rewriter.session.hints import hints, session_class_for
from baechi_tf.rewriter.session.placed import PlacedSession, PlacedSessions, reseed, split_fusion
from baechi_tf.rewriter.session.profiling import profile_on_copies
from baechi_tf.rewriter.session.replays import Replays
from baechi_tf.rewriter.session.state import CannotCarry, IteratorState, UserState

__all__ = ["BaechiSession"]

log = logging.getLogger(__name__)


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
        arguments = dict(locals())
        del arguments["self"], arguments["sess"]
        self._settings = configure(sess, arguments)
        self._graph = self._settings.graph
        self._session_class = session_class_for(self._graph)  # its errors name the ops of `graph`
        self._plan = FetchPlan(self._graph)
        self._user_session = sess
        self._user_state = UserState(sess) if sess is not None else None
        self._sessions = PlacedSessions()
        self._lock = self._sessions.lock  # held while a run profiles and places
        # Runs that initialise iterators, summary writers, a finalized graph's tables: run again in
        # each new session, the profiling copies' too.
        self._replays = Replays()
        self._profile: Optional[CostProfile] = None
        self._covered: set[str] = set()
        self._ready: dict[tuple, FetchKind] = {}  # fetch keys placed for -> what their ops do
        self._ran: set[str] = set()  # ops that runs in placed sessions may have executed
        # What a new placement would restart, which a run used in the placed session (a queue; an
        # iterator whose state cannot be copied), or None.
        self._state_in_use: Optional[str] = None
        self._iterators_read = False  # the placed session's iterators are not where replays leave them
        # The string handles runs fetched (``iterator.string_handle()``) -> the tensor that made
        # them: a feed of one gets that tensor's value in the session it goes to (`_own_handles`).
        self._handles: dict[bytes, str] = {}
        self._defaults: Optional[contextlib.ExitStack] = None  # what `with` made the defaults
        self.placement: Optional[PlacementReport] = None

    @property
    def _placed(self) -> Optional[PlacedSession]:
        """The current placed session (None before the first run and after `close`)."""
        return self._sessions.current

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
        return self._settings.setup

    @property
    def link_fit(self) -> Any:
        """With ``comm="auto"``, the fit of the link to copies timed between two of the devices
        (`baechi_tf.cost_model.comm_fit`); else None."""
        return self._settings.link_fit

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

        self._sessions.check_open()
        if self._placed is not None:
            return self._placed.session.list_devices()
        with tf.compat.v1.Session(self._settings.target, graph=tf.Graph(), config=self._settings.run_config) as s:
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

        self._sessions.check_open()
        named = map_fetches(self._plan.fetch_of, fetches)
        feeds = self._plan.feeds_of(feed_dict)
        with self._lock:  # one thread profiles and places at a time; runs go side by side
            self._sessions.wait_for_drain()
            before = self.placement
            # The caller's time limit holds for each profiling run as for the run itself.
            with self._hints(feeds):
                placed, kind = self._prepared(named, feeds, getattr(options, "timeout_in_ms", 0))
                own = fed_in(self._own_handles(feeds, placed.session, placed.handles), placed.names, self._graph)
            queues = kind.queues
            self._sessions.begin_run(placed, queues)
            report = self.placement if self._settings.report_dir and self.placement is not before else None
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
                    for name, value in fetched(named, values):
                        if name in kind.handles:
                            self._handles[value] = name
                            placed.handles.setdefault(name, value)
            if kind.initializes or kind.iterator_inits or kind.writer_inits:
                with self._lock:
                    self._replays.record(kind, named, feeds)
            return values
        except tf.errors.ResourceExhaustedError as e:
            from baechi_tf.rewriter.oom import out_of_memory_error

            result = self.placement.result if self.placement is not None else None
            raise out_of_memory_error(e, result) from e
        finally:
            self._sessions.end_run(placed, queues)  # first: an error writing the reports leaves it counted out
            if report is not None:  # also when the run failed (out of memory): without TF's step
                from baechi_tf.reports import write_reports

                write_reports(
                    report.result, self._settings.report_dir, graph_def=placed.graph_def,
                    tf_step_stats=run_metadata.step_stats if ran and run_metadata is not None else None,
                    profile=report.coverage.figures(len(report.default_compute_ops)),
                )

    def make_callable(self, fetches: Any, feed_list: Any = None, accept_options: bool = False) -> Any:
        """Like ``Session.make_callable``: a function of the values of `feed_list`, in that
        order, that runs `fetches` (with ``options=`` and ``run_metadata=`` keywords when
        `accept_options`). Each call is a `run`: the first profiles and places."""
        self._sessions.check_open()
        map_fetches(self._plan.fetch_of, fetches)  # a bad fetch or feed fails here, as on a Session
        feed_list = list(feed_list or ())
        for key in feed_list:
            for part in parts(key):
                self._plan.feed_name(part)

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
        return self._settings.target

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
            if self._sessions.closed:
                return
            self._sessions.close()
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

    def _hints(self, feeds: dict[str, Any]) -> Any:
        """TF's errors of a run fed `feeds` with what this class changes about them (`hints`)."""
        return hints(feeds, self._graph, self._handles, self._user_session)

    def _own_handles(self, feeds: dict[str, Any], session: Any, handles: dict[str, bytes]) -> dict[str, Any]:
        """`feeds` with each string handle that a run fetched (`_handles`) replaced by the handle
        of the same iterator in `session` (by tensor name in `handles`, its cache): a handle names
        an iterator of the session that made it, and no other session has it. Running the handle's
        op there makes the iterator (a one-shot one) where `session` does not have it yet."""
        out = feeds
        for name, value in feeds.items():
            made_by = self._handles.get(handle_of(value)) if self._handles else None
            if made_by is None:
                continue
            if made_by not in handles:
                handles[made_by] = session.run(made_by)
            if out is feeds:
                out = dict(feeds)
            out[name] = handles[made_by]
        return out

    def _prepared(self, named: Any, feeds: dict[str, Any], timeout_ms: int = 0) -> tuple[PlacedSession, FetchKind]:
        """The placed session to run `named` in, placed (again) first when it is a new fetch
        that needs it (see the module docstring), and what the fetch's ops do. Called with
        `_lock` held."""
        self._sessions.check_open()  # another thread may have closed it while this one waited
        key = fetch_key(named, feeds)
        leaves = key[0]
        if key not in self._ready:
            closure = self._plan.closure(leaves, feeds)
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
                except CannotCarry as e:  # one of them cannot be: left where it is, if it can be
                    self._state_in_use = f"{self._state_in_use} and {e}" if self._state_in_use else str(e)
                    if placed:
                        self._warn_as_placed(closure)
                    else:
                        self._place_again(named, feeds, closure, timeout_ms, strict=False)
            self._ready[key] = self._plan.kind(leaves, closure, feeds)
            self._ran |= closure
        kind = self._ready[key]
        if kind.uses_state and not self._state_in_use:
            self._state_in_use = OTHER_STATE
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
        `CannotCarry` if an iterator that runs read cannot be copied into the new sessions (else
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

    def _read_values(self, strict: bool = True) -> dict[str, Any]:
        """The variables and tables to write into a new session, and where the iterators that
        runs read are (`IteratorIO.read`, `strict`): those of the placed session, else of the
        wrapped one (its iterators do not carry over)."""
        placed = self._placed
        if placed is not None:
            iterators = self._ran if self._iterators_read else set()
            return placed.io.read(placed.session, iterators, strict)
        if self._user_state is not None:
            return self._user_state.read(self._replay_user_setup)
        return {}

    def _replay_user_setup(self, unread_tables: list[str]) -> None:
        """At the first read of the wrapped session: what carries over from it by replays (the
        initializers of a finalized graph's tables, which cannot be read; its summary writers)."""
        if unread_tables:
            self._replays.add_table_initializers(self._graph, unread_tables)
        self._replays.add_user_writers(self._user_session, self._plan)

    def _profile_and_place(
        self, fetches: Any, feeds: dict[str, Any], closure: set[str], timeout_ms: int = 0, *, strict: bool = True
    ) -> None:
        """Profiles a run of `fetches` fed `feeds` (its ops `closure`) on scratch copies, places
        the whole graph with every profile so far, and starts a placed session of it holding the
        state the runs so far left (`_read_values`, `strict`)."""
        graph_def = self._graph.as_graph_def()
        values = self._read_values(strict)
        old = self._placed
        read_after = (old.ended, old.runs) if old is not None else None  # runs the values may lack
        profile = profile_on_copies(
            self._settings, self._session_class, graph_def, fetches, feeds, closure, values, self._replays,
            lambda fed, session: self._own_handles(fed, session, {}), timeout_ms,
        )
        if profile is None:  # the costs known so far, and estimates
            profile = CostProfile({}, graph_fingerprint(graph_def), graph_nodes(graph_def))
        self._profile = profile if self._profile is None else merge_profiles(self._profile, profile)
        if self._settings.cost_path:
            save_profile(self._profile, self._settings.cost_path)
        setup = self._settings.setup
        placed_def, report = place_graph_def(
            graph_def,
            self._profile,
            setup.cluster,
            self._settings.options,
            host_device=setup.host,
            device_aliases=setup.aliases,
            ignore_user_devices=self._settings.ignore_user_devices,
            # ignore_user_devices keeps pins to devices that exist: only the graph's code drops them
            unpin_hint="build the graph without its tf.device() pins",
        )
        self._sessions.made += 1
        if old is not None:
            reseeded = reseed(placed_def, self._ran, self._sessions.made)
            if reseeded:
                log.info(
                    "%d seeded random ops that earlier runs used draw new numbers in the new placed "
                    "session (their seed2 changed): they do not start their sequences again",
                    reseeded,
                )
        split = split_fusion(self._profile, report.op_to_device)
        if split is not None:
            log.warning(
                "the placement puts %r apart from %r, which the remapper fused it into while "
                "profiling: the placed graph runs without the remapper's fusions, which would run "
                "them on one device", *split,
            )
        run_config = self._settings.run_config if split is None else self._settings.unfused_config
        placed = PlacedSession(placed_def, run_config, self._settings.target, self._session_class)
        values = self._sessions.start(placed, values, read_after, lambda: self._read_values(strict), self._replays)
        self._state_in_use = None  # a fresh session: its queues, ... are new
        self._iterators_read = any(isinstance(v, IteratorState) for v in values.values())
        self._covered |= closure
        self.placement = report  # `run` writes its reports after the run that follows
        log.info(
            "placed %d ops on %d devices (%s)",
            len(placed.names),
            len(report.devices_used),
            report.coverage.describe(),
        )


@functools.lru_cache(maxsize=None)
def _session_class(cls: type) -> type:
    """`cls` (BaechiSession or a subclass) also deriving from TF's ``SessionInterface``."""
    from tensorflow.python.client.session import SessionInterface

    if issubclass(cls, SessionInterface):
        return cls
    return type(cls.__name__, (cls, SessionInterface), {"__module__": cls.__module__, "__qualname__": cls.__qualname__})
