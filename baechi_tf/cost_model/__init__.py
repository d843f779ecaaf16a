"""Cost model: profiles measured from traced steps, their file, and their coverage of a graph.

`profile_fetch` (TensorFlow) measures; `save_profile` / `load_profile` write and read the
protobuf file; `profile_coverage`, `compare_to_graph` and `unrun_ops` relate a profile to a
graph; `measured_memory` (TensorFlow, imported from its module) rebuilds the memory each device
held in a traced step. `baechi_tf.cost_model.executed` names the graph ops that a traced step's
nodes come from (Grappler's, fused and runtime nodes), `baechi_tf.cost_model.estimate` times ops
of unmeasured types from their shapes. Importing this package does not import TensorFlow.
"""

from baechi_tf.cost_model.profile import (
    CostProfile,
    Coverage,
    GraphNode,
    OpCost,
    ProfileMismatch,
    compare_to_graph,
    graph_fingerprint,
    graph_nodes,
    load_profile,
    merge_profiles,
    profile_coverage,
    profile_from_bytes,
    profile_to_bytes,
    save_profile,
    unrun_ops,
)
from baechi_tf.cost_model.profiler import profile_fetch, profile_from_step_stats, profiling_config

__all__ = [
    "CostProfile",
    "Coverage",
    "GraphNode",
    "OpCost",
    "ProfileMismatch",
    "compare_to_graph",
    "graph_fingerprint",
    "graph_nodes",
    "load_profile",
    "merge_profiles",
    "profile_coverage",
    "profile_fetch",
    "profile_from_bytes",
    "profile_from_step_stats",
    "profile_to_bytes",
    "profiling_config",
    "save_profile",
    "unrun_ops",
]
