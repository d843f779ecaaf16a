"""The errors baechi_tf raises.

Every error is a :class:`BaechiError`; its message names the op, device or file at fault and says
how to fix it. The command line turns a ``BaechiError`` into one line on stderr and exit status 2.
"""

__all__ = [
    "BaechiError",
    "ConfigError",
    "InfeasiblePlacementError",
    "InvalidGraphError",
    "ProfileError",
    "SolverError",
]


class BaechiError(Exception):
    """Base class of every error baechi_tf raises on purpose."""


class InvalidGraphError(BaechiError):
    """The op graph is malformed: a cycle, a dangling edge, a negative or non-finite cost."""


class ConfigError(BaechiError):
    """Devices, options or flags are malformed or contradict each other."""


class ProfileError(BaechiError):
    """A cost profile is unreadable, of another graph, or inconsistent with the graph."""


class InfeasiblePlacementError(BaechiError):
    """No device can hold an op (or its colocation group) within its memory limit."""


class SolverError(BaechiError):
    """An LP solver failed, was infeasible, or is not available."""
