"""The errors of a `BaechiSession`'s runs, worded as a Session of the user's graph words them.

The sessions here run imported copies of the user's graph: `session_class_for` makes TF's errors
name the user's ops again, and `hints` adds what this package changes about a failure (state
that does not carry over, a string handle of another session).
"""

from __future__ import annotations

import contextlib
import functools
import re
from typing import Any, Iterator, Optional

from baechi_tf.rewriter.session.fetches import FROM_HANDLE_TYPES, handle_of

__all__ = ["hints", "session_class_for"]


def session_class_for(user_graph: Any) -> type:
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


@contextlib.contextmanager
def hints(feeds: dict[str, Any], graph: Any, handles: dict[bytes, str], wrapped: Any) -> Iterator[None]:
    """TF's errors of profiling or running (a run fed `feeds`), with what a BaechiSession changes
    about them said: an iterator initialised in the wrapped session is not initialised in the
    sessions here, nor is a variable initialised (or restored) there after the first placement
    read the values, and a string handle that no run here fetched names no iterator here.
    `graph` is the user's, `handles` maps the string handles runs fetched to their tensors,
    `wrapped` is the session the BaechiSession wraps (or None)."""
    import tensorflow as tf

    try:
        yield
    except tf.errors.OpError as e:
        hint = _hint(e, feeds, graph, handles, wrapped)
        if hint is None:
            raise
        raise type(e)(e.node_def, e.op, f"{e.message} (BaechiSession: {hint})") from e


def _hint(error: Any, feeds: dict[str, Any], graph: Any, handles: dict[bytes, str], wrapped: Any) -> Optional[str]:
    """What `hints` adds to `error`, or None."""
    import tensorflow as tf

    op = error.op
    if op is not None and op.type in FROM_HANDLE_TYPES and op.graph is graph:
        fed = feeds.get(op.inputs[0].name)
        if fed is not None and handle_of(fed) not in handles:
            where = "the session it wraps" if wrapped is not None else "another session"
            return (
                f"the string handle fed to {op.inputs[0].name} was not fetched through the "
                f"BaechiSession: it names an iterator of {where}, whose iterators do not carry "
                "over; fetch iterator.string_handle() through the BaechiSession and feed that"
            )
    if wrapped is None or not isinstance(error, tf.errors.FailedPreconditionError):
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
