"""Seeded property tests: every placer on random DAGs with random groups, pins and memory limits,
and fuzzing of the JSON and profile readers."""

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from baechi_tf.cluster import Cluster, CommCost, Device
from baechi_tf.errors import BaechiError, ConfigError, InfeasiblePlacementError
from baechi_tf.graph_builder import OpGraphBuilder
from baechi_tf.json_io import parse_graph_json
from baechi_tf.placer import colocation_groups
from baechi_tf.placer.layers import find_layers
from baechi_tf.placer.pipeline import PLACEMENT_METHODS, PlacementOptions, place
from invariants import assert_valid_schedule

METHODS = sorted(set(PLACEMENT_METHODS) - {"expert"})
SETTINGS = dict(
    max_examples=200, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck)
)


@st.composite
def graphs_with_memory(draw):
    """(graph, num_devices, regime) with `regime` one of 'packable', 'group_too_big', 'random'."""
    n = draw(st.integers(1, 10))
    num_devices = draw(st.integers(1, 4))
    b = OpGraphBuilder()
    group_names = [f"g{k}" for k in range(draw(st.integers(1, 4)))]
    pins = {g: draw(st.none() | st.integers(0, num_devices - 1)) for g in group_names}
    for i in range(n):
        grouped = draw(st.booleans())
        group = draw(st.sampled_from(group_names)) if grouped else None
        pin = pins[group] if group is not None else draw(st.none() | st.integers(0, num_devices - 1))
        b.add_op(
            f"l{i % 3}/op{i}",  # numbered scopes, so that the layers placer runs too
            draw(st.floats(0, 2000, allow_nan=False)),
            draw(st.lists(st.integers(0, 8 << 20), min_size=1, max_size=2)),
            temp_bytes=draw(st.integers(0, 2 << 20)),
            persistent_bytes=draw(st.sampled_from([0, 0, 1 << 20, 16 << 20])),
            device=None if pin is None else f"/device:GPU:{pin}",
            colocation=(group,) if group else (),
        )
    for j in range(n):
        for i in range(j):
            if draw(st.integers(0, 3)) == 0:
                if draw(st.integers(0, 5)) == 0:
                    b.add_control_edge(f"l{i % 3}/op{i}", f"l{j % 3}/op{j}")
                else:
                    b.add_edge(f"l{i % 3}/op{i}", f"l{j % 3}/op{j}")
    graph = b.build()
    regime = draw(st.sampled_from(["packable", "group_too_big", "random"]))
    return graph, num_devices, regime, draw(st.floats(0.05, 3.0))


def static_needs(graph, groups):
    """Per group: its ops' persistent, output and temp bytes, plus each input from another group."""
    need = [0] * groups.num_groups
    for op in range(graph.num_ops):
        need[groups.group_of[op]] += int(
            graph.persistent_bytes[op] + graph.output_total_bytes[op] + graph.temp_bytes[op]
        )
    seen = set()
    for e in range(graph.num_edges):
        t, d = int(graph.edge_tensor[e]), int(graph.edge_dst[e])
        gs, gd = groups.group_of[graph.tensor_src[t]], groups.group_of[d]
        if gs != gd and (t, gd) not in seen:
            seen.add((t, gd))
            need[gd] += int(graph.tensor_bytes[t])
    return need


@pytest.mark.slow
def test_every_placer_places_validly_or_proves_infeasible():
    outcomes: dict[tuple[str, str], int] = {}
    _check_placers(outcomes)
    # Not vacuous: each regime was drawn, and placements and refusals both happened.
    ok = sum(v for (r, o), v in outcomes.items() if o == "placed")
    refused = sum(v for (r, o), v in outcomes.items() if o == "infeasible")
    assert outcomes.get(("packable", "placed"), 0) > 100
    assert outcomes.get(("group_too_big", "infeasible"), 0) > 100
    assert outcomes.get(("random", "placed"), 0) > 20 and outcomes.get(("random", "infeasible"), 0) > 20
    print(f"property outcomes ({ok} placed, {refused} refused):", dict(sorted(outcomes.items())))


def _check_placers(outcomes):
    @given(graphs_with_memory())
    @settings(**SETTINGS)
    def check(case):
        _check_case(case, outcomes)

    check()


def _check_case(case, outcomes):
    graph, nd, regime, scale = case
    groups = colocation_groups(graph)
    need = static_needs(graph, groups)
    persistent = np.bincount(groups.group_of, weights=graph.persistent_bytes, minlength=groups.num_groups)
    pinned = any(d is not None for d in graph.pinned_device)
    if regime == "packable":
        # Room for the total spread evenly plus the largest group, on every device: a greedy
        # least-loaded packing always fits (pins could overload a device, so they count whole).
        capacity = sum(need) // nd + max(need) + 1 + (sum(need) if pinned else 0)
    elif regime == "group_too_big":
        # Some group needs its persistent bytes and its largest op's outputs and scratch at
        # once; one byte less than that on every device, and it fits nowhere.
        alloc = graph.output_total_bytes + graph.temp_bytes
        largest = np.zeros(groups.num_groups, dtype=np.int64)
        np.maximum.at(largest, groups.group_of, alloc)
        floor = int((persistent + largest).max())
        if floor <= 1:
            regime, capacity = "random", 1  # nothing to exceed: every op is empty
        else:
            capacity = floor - 1
    else:
        capacity = max(1, int(scale * sum(need) / nd))
    cluster = Cluster(
        tuple(Device(f"/device:GPU:{i}", capacity) for i in range(nd)), CommCost(0.0001754, 134)
    )
    made: dict[str, float] = {}  # method -> makespan, of those that placed
    for method in METHODS:
        options = PlacementOptions(placement_method=method, refine_seconds=0.05)
        if method == "layers" and not find_layers(graph, nd):  # one op, or one scope number
            # A group that fits no device is said before any placer runs (and so before layers
            # looks for scopes); group_too_big has one, a random capacity may.
            with pytest.raises((ConfigError, InfeasiblePlacementError)) as e:
                place(graph, cluster, options)
            if e.type is ConfigError:
                assert regime != "group_too_big" and "needs numbered layer scopes" in str(e.value)
            else:
                assert "whatever else goes there" in str(e.value), e.value
            continue
        try:
            result = place(graph, cluster, options)
        except InfeasiblePlacementError:
            # A greedy packing fits; one device, or layers held on their devices, may not.
            assert regime != "packable" or method in ("single", "layers"), method
            outcomes[(regime, "infeasible")] = outcomes.get((regime, "infeasible"), 0) + 1
            continue
        assert regime != "group_too_big", method
        outcomes[(regime, "placed")] = outcomes.get((regime, "placed"), 0) + 1
        assert_valid_schedule(graph, cluster, result.groups, result.schedule)
        assert result.makespan_us >= result.lower_bound_us - 1e-6
        made[method] = result.makespan_us
    # auto places wherever a method does, and never slower than one (fuzzing found both broken).
    others = [v for m, v in made.items() if m != "auto"]
    if others:
        assert "auto" in made, sorted(made)
        assert made["auto"] <= min(others) * (1 + 1e-9) + 1e-6, made


def valid_doc():
    return {
        "devices": [{"name": "/device:GPU:0", "memory_bytes": 1 << 30}, {"name": "/device:GPU:1", "memory_bytes": 1 << 30}],
        "ops": [
            {"name": "a", "compute_us": 10, "output_bytes": [100]},
            {"name": "b", "compute_us": 20, "output_bytes": [4], "colocation_group": "a"},
        ],
        "edges": [{"src": "a", "dst": "b"}],
    }


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


@pytest.mark.slow
@given(json_values)
@settings(**SETTINGS)
def test_json_reader_raises_only_baechi_errors_on_random_documents(doc):
    try:
        parse_graph_json(doc)
    except BaechiError:
        pass


@pytest.mark.slow
@given(st.data())
@settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_json_reader_raises_only_baechi_errors_on_mutated_documents(data):
    doc = valid_doc()
    # Replace one value somewhere in the document with a random one.
    paths = []

    def walk(node, path):
        if isinstance(node, dict):
            for k, v in node.items():
                paths.append(path + [k])
                walk(v, path + [k])
        elif isinstance(node, list):
            for i, v in enumerate(node):
                paths.append(path + [i])
                walk(v, path + [i])

    walk(doc, [])
    path = data.draw(st.sampled_from(paths))
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    if data.draw(st.booleans()):
        parent[path[-1]] = data.draw(json_values)
    elif isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent.pop(path[-1])
    try:
        parse_graph_json(json.loads(json.dumps(doc, allow_nan=True)))
    except BaechiError:
        pass


@given(st.binary(max_size=512))
@settings(**SETTINGS)
def test_profile_reader_raises_only_profile_errors(data):
    from baechi_tf.cost_model.profile import profile_from_bytes
    from baechi_tf.errors import ProfileError

    try:
        profile_from_bytes(data)
    except ProfileError:
        pass


@pytest.mark.parametrize("cut", [1, 7, 30, -1])
def test_profile_reader_on_truncated_real_profile(cut):
    from baechi_tf.cost_model.profile import (
        CostProfile, GraphNode, OpCost, profile_from_bytes, profile_to_bytes,
    )
    from baechi_tf.errors import ProfileError

    profile = CostProfile(
        ops={"a": OpCost("a", "MatMul", 1.5, (4, 8), 16, 32, "/device:CPU:0", 3)},
        graph_fingerprint="0123456789abcdef",
        graph_nodes=(GraphNode("a", "MatMul", 42),),
        tf_version="2.21.0",
        num_traced_steps=3,
        traced_compute_us=2.0,
    )
    data = profile_to_bytes(profile)
    again = profile_from_bytes(data)
    assert again.ops == profile.ops and again.graph_nodes == profile.graph_nodes
    with pytest.raises(ProfileError):
        profile_from_bytes(data[:cut])
