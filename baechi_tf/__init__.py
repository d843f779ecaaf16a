"""baechi_tf: fast, memory-aware device placement for TensorFlow graphs (Baechi, SoCC 2020).

The public API is small: `place_graph_def` places a GraphDef with a cost profile, `BaechiSession`
places and runs a ``tf.compat.v1`` graph, `function` places the traces of a TensorFlow 2
``tf.function``, `PlacementOptions`, `Cluster` and `Device` describe what to place and where, and
every error is a `BaechiError`. Importing ``baechi_tf`` does not import TensorFlow;
`BaechiSession`, `function` and `place_graph_def` load the TensorFlow ends on first use.
"""

from baechi_tf._lazy import lazy_attributes
from baechi_tf.cluster import Cluster, CommCost, Device
from baechi_tf.errors import (
    BaechiError,
    ConfigError,
    InfeasiblePlacementError,
    InvalidGraphError,
    ProfileError,
    SolverError,
)
from baechi_tf.placer.pipeline import PlacementOptions

__all__ = [
    "BaechiError",
    "BaechiSession",
    "Cluster",
    "CommCost",
    "ConfigError",
    "Device",
    "InfeasiblePlacementError",
    "InvalidGraphError",
    "PlacementOptions",
    "ProfileError",
    "SolverError",
    "function",
    "place_graph_def",
]

_LAZY = {
    "BaechiSession": "baechi_tf.rewriter.session",
    "place_graph_def": "baechi_tf.rewriter.graph_pass",
    "function": "baechi_tf.tf2",
}
__getattr__ = lazy_attributes(__name__, _LAZY, globals())


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
