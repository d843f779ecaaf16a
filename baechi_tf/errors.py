"""The errors baechi_tf raises.

Every error is a :class:`BaechiError`; its message names the op, device or file at fault and says
how to fix it. The command line turns a ``BaechiError`` into one line on stderr and exit status 2.
"""

import re

__all__ = [
    "BaechiError",
    "ConfigError",
    "InfeasiblePlacementError",
    "InvalidGraphError",
    "OutputError",
    "ProfileError",
    "SolverError",
    "TensorFlowMissingError",
    "first_line",
]


class BaechiError(Exception):
    """Base class of every error baechi_tf raises on purpose."""


class InvalidGraphError(BaechiError):
    """The op graph is malformed: a cycle, a dangling edge, a negative or non-finite cost."""


class ConfigError(BaechiError):
    """Devices, options or flags are malformed or contradict each other."""


class ProfileError(BaechiError):
    """A cost profile is unreadable, of another graph, or inconsistent with the graph."""


class OutputError(BaechiError, OSError):
    """An output could not be written (a full disk, a device that takes no more): an `OSError`
    too, for callers that catch those."""


class InfeasiblePlacementError(BaechiError):
    """No device can hold an op (or its colocation group) within its memory limit."""


class SolverError(BaechiError):
    """An LP solver failed, was infeasible, or is not available."""


class TensorFlowMissingError(ConfigError, ModuleNotFoundError):
    """A TensorFlow end was asked for where TensorFlow is not installed: a `ModuleNotFoundError`
    too, for callers that catch those. Its message names the two extras that install it."""


def first_line(error: BaseException) -> str:
    """The first line of an error's message that says what went wrong, or its type's name.

    TensorFlow 2.21's session errors start with the line "Graph execution error:", which says
    nothing, may then say where the op was made ("Detected at node 'x' defined at ..." up to
    "Node: 'x'"), and with several causes say "2 root error(s) found." before "(0) ...": those
    are skipped, and the first cause is given without its "(0) "."""
    text = str(getattr(error, "message", None) or error)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    where = False  # within a "Detected at node" block
    for line in lines:
        if line.startswith("Detected at node"):
            where = True
        elif where:
            where = not line.startswith("Node: ")
        elif line != "Graph execution error:" and not re.fullmatch(r"\d+ root error\(s\) found\.", line):
            return re.sub(r"^\(\d+\) ", "", line)
    rest = [line for line in lines if line != "Graph execution error:"]
    return (rest or lines or [type(error).__name__])[0]
