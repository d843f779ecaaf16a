"""The profile of a new fetch of a `BaechiSession`, taken on scratch copies of the user's graph.

A scratch copy holds the state the real run starts from (the carried values, the replays, the
iterators where they are), so the real variables do not move; it runs the fetch `warmup_steps`
times untraced, then `profile_steps` times traced (`baechi_tf.cost_model.profiler.profile_fetch`).
"""

from __future__ import annotations

import logging
import tempfile
from typing import Any, Callable, Optional

from baechi_tf.cost_model.profile import CostProfile
from baechi_tf.errors import first_line
from baechi_tf.rewriter.pins import resolve_user_devices
from baechi_tf.rewriter.session.arguments import Settings
from baechi_tf.rewriter.session.fetches import WRITER_INIT_TYPES, blocks_on_state
from baechi_tf.rewriter.session.replays import Replays, summary_redirect
from baechi_tf.rewriter.session.state import VariableIO

__all__ = ["profile_on_copies"]

log = logging.getLogger(__name__)


def profile_on_copies(
    settings: Settings,
    session_class: type,
    graph_def: Any,
    fetches: Any,
    feeds: dict[str, Any],
    closure: set[str],
    values: dict[str, Any],
    replays: Replays,
    own_handles: Callable[[dict[str, Any], Any], dict[str, Any]],
    timeout_ms: int = 0,
) -> Optional[CostProfile]:
    """The profile of a run of `fetches` fed `feeds` (its ops `closure`), taken on copies of
    `graph_def` that start from `values` and the `replays`; None when it cannot be profiled (a
    fetch that takes from or puts into a queue; an input with nothing to read), with a warning.
    `own_handles(feeds, session)` swaps the string handles fed for those of `session`. Another
    error of the first run is the real run's error, raised."""
    import tensorflow as tf

    from baechi_tf.cost_model.profiler import ProfilingCutShort, profile_fetch

    graph = settings.graph
    blocking = sorted(n for n in closure if blocks_on_state(graph.get_operation_by_name(n).type))
    if blocking:
        # Nothing fills or drains the scratch copy's queues: a dequeue there would wait for
        # ever, as would an enqueue run warmup_steps + profile_steps times into a bounded one.
        log.warning(
            "placing without profiling a fetch that takes from or puts into a queue (%s): its "
            "ops that no run profiled are placed by estimated costs",
            blocking[0],
        )
        return None
    setup = settings.setup
    # The copy runs where the placement will keep the ops the graph pins (a stand-in for a GPU,
    # the host); pins to a job or task only, or ignored, are left out: TF cannot run a copy
    # pinned to a job this session does not have.
    scratch_def = resolve_user_devices(
        graph_def,
        setup.cluster,
        host_device=setup.host,
        device_aliases=setup.aliases,
        ignore_user_devices=settings.ignore_user_devices,
    )

    def profile_on_scratch(warmup_steps: int, traced_steps: int) -> CostProfile:
        scratch = tf.Graph()
        with scratch.as_default():
            tf.graph_util.import_graph_def(scratch_def, name="")
        io = VariableIO(scratch)
        with session_class(settings.target, graph=scratch, config=settings.profile_config) as s, \
                tempfile.TemporaryDirectory(prefix="baechi_tf_summaries_") as summaries:
            io.load(s, values)
            redirect = summary_redirect(scratch, summaries)
            replays.run_in(s, redirect)
            io.iterators.load(s, values)
            # The fetch's own writers too: made now, redirected, its runs find them made.
            inits = [n for n in sorted(closure) if scratch.get_operation_by_name(n).type in WRITER_INIT_TYPES]
            if inits:
                s.run(inits, feed_dict={**feeds, **redirect})
            return profile_fetch(
                s,
                fetches,
                own_handles(feeds, s),
                warmup_steps=warmup_steps,
                traced_steps=traced_steps,
                graph_def=graph_def,
                timeout_ms=timeout_ms,
                stop_on_error=True,
            )

    # The scratch copy runs the fetch from the state the real run starts in, again and again. A
    # run after the first that fails (a dataset shorter than the profiling runs, a step valid
    # only so many times) ends the profiling: profile_fetch keeps the steps traced before; when
    # warm-up left none, one step is traced on a new copy. A dataset with nothing to read is
    # placed by estimates (its run then ends as a Session's does, with OutOfRangeError); any
    # other error of the first run is the real run's error.
    attempts = [(settings.warmup_steps, settings.profile_steps)] + [(0, 1)] * bool(settings.warmup_steps)
    for warmup_steps, traced_steps in attempts:
        try:
            return profile_on_scratch(warmup_steps, traced_steps)
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
    log.warning(
        "placing without profiling a fetch whose input has nothing to read: its ops are placed "
        "by estimated costs"
    )
    return None
