"""The memory fallback ladder (`placer.ladder`): its steps as data, in order, and a method alone
climbing them."""

import os

import pytest

import graphs
from baechi_tf.errors import InfeasiblePlacementError
from baechi_tf.graph_builder import OpGraphBuilder
from baechi_tf.placer import ladder
from baechi_tf.placer.check import check_placement
from baechi_tf.placer.grouping import Groups, make_groups
from baechi_tf.placer.pipeline import PlacementOptions

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MiB = 2**20


def test_the_steps_are_in_order_and_the_docs_table_is_theirs():
    assert [s.name for s in ladder.LADDER] == [
        "refusal", "headroom", "packing", "fit search", "other placers", "error", "TF groups", "host ops",
    ]
    # A method alone runs these here, in this order (`fall_back`); the others run where their
    # inputs are.
    assert [s.name for s in ladder.LADDER if s.run is not None] == ["packing", "fit search", "other placers", "error"]
    for step in ladder.LADDER:
        assert step.tries and step.when and step.method and step.code, step.name
    rows = ladder.ladder_table().splitlines()[2:]
    assert [r.split("|")[2].strip() for r in rows] == [s.name for s in ladder.LADDER]
    assert [r.split("|")[1].strip() for r in rows] == [str(i) for i in range(len(ladder.LADDER))]
    with open(os.path.join(ROOT, "docs", "methods.md")) as f:
        assert "<!-- fallback-ladder -->" in f.read()  # replaced by docs/hooks/tables.py


def _climb(method, start="packing", options=None):
    graph, cluster = graphs.chain(), graphs.cluster(2)
    groups = Groups.singletons(graph)
    error = InfeasiblePlacementError(f"{method} ran out")
    placement = ladder.fall_back(graph, cluster, groups, method, error, 0, options, start=start)
    check_placement(graph, cluster, groups, placement)  # every step's placement fits
    return placement.method


def test_a_method_alone_takes_the_first_step_that_fits(caplog):
    with caplog.at_level("WARNING", logger="baechi_tf.placer.ladder"):
        assert _climb("m_etf") == "m_etf+packed"
    assert "m_etf ran out of memory (m_etf ran out); using a memory-first packing instead" in caplog.text
    assert _climb("packed") == "packed+fit"  # the packing is not its own fallback
    assert _climb("m_etf", start="fit search") == "m_etf+fit"
    other = _climb("m_etf", start="other placers", options=PlacementOptions("m_etf"))
    assert other.removeprefix("m_etf+") in {"m_topo", "m_sct", "heft", "m_topo_nonuniform"}


def test_one_device_has_nothing_to_fall_back_to():
    error = InfeasiblePlacementError("no room on one device")
    graph = graphs.chain()
    with pytest.raises(InfeasiblePlacementError) as raised:
        ladder.fall_back(graph, graphs.cluster(2), Groups.singletons(graph), "single", error)
    assert raised.value is error


def test_a_group_that_fits_nowhere_is_refused_with_the_reason():
    b = OpGraphBuilder()
    b.add_op("huge", 10.0, [4 * MiB])
    graph, cluster = b.build(), graphs.cluster(2, memory_bytes=MiB)
    groups = Groups.singletons(graph)
    with pytest.raises(InfeasiblePlacementError, match="op 'huge' cannot run on any device"):
        ladder.refuse(graph, cluster, groups)
    # The fit search's reason replaces the method's error (the search tried nothing).
    with pytest.raises(InfeasiblePlacementError, match="op 'huge' cannot run on any device"):
        ladder.fall_back(graph, cluster, groups, "m_etf", InfeasiblePlacementError("m_etf ran out"))


def test_only_coplace_groups_are_placed_again_with_tf_groups(caplog):
    graph = graphs.chain()
    tried = []

    def place_and_check(groups, suffix):
        tried.append((groups.num_groups, suffix))
        if len(tried) == 1:
            raise InfeasiblePlacementError("no room with these groups")
        return "placed"

    coplace = make_groups(graph, "coplace")
    with caplog.at_level("WARNING", logger="baechi_tf.placer.ladder"):
        groups, placed = ladder.regrouped(graph, "coplace", coplace, place_and_check)
    assert placed == "placed" and tried == [(coplace.num_groups, ""), (graph.num_ops, " (tf groups)")]
    assert groups.num_groups == graph.num_ops
    assert "nothing fits with the coplace groups (no room with these groups)" in caplog.text
    tried.clear()
    with pytest.raises(InfeasiblePlacementError, match="no room"):
        ladder.regrouped(graph, "tf", make_groups(graph, "tf"), place_and_check)
    assert len(tried) == 1
