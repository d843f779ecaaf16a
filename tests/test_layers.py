"""The layers placer: numbered scopes found, whole layers on one device, the rest beside them."""

import numpy as np
import pytest

import graphs
from baechi_tf.cluster import Cluster, GiB
from baechi_tf.errors import ConfigError, InfeasiblePlacementError
from baechi_tf.graph_builder import OpGraphBuilder
from baechi_tf.placer import check_placement, colocation_groups
from baechi_tf.placer.layers import find_layers, place_layers
from baechi_tf.placer.pipeline import PlacementOptions, place
from invariants import assert_valid_schedule

MiB = 1 << 20


def rnn(layers=4, steps=6, weight_bytes=4 * MiB, pin=None):
    """An unrolled RNN: cell (l, t) reads (l-1, t) (or input x_t) and (l, t-1); weights per layer.

        x0      x1      x2        l0/w  l1/w ...  (each weight feeds every cell of its layer)
        |       |       |
      l0/t0 -> l0/t1 -> l0/t2 ...
        |       |       |
      l1/t0 -> l1/t1 -> l1/t2 ...
        ...                  -> loss (reads the top layer)
    """
    b = OpGraphBuilder()
    for l in range(layers):
        device = pin if (pin and l == 0) else None
        held = weight_bytes[l] if isinstance(weight_bytes, list) else weight_bytes
        b.add_op(f"l{l}/w", 5, [1 * MiB], persistent_bytes=held, device=device)
    for t in range(steps):
        b.add_op(f"x{t}", 10, [256 << 10])
        for l in range(layers):
            cell = f"l{l}/t{t}/cell"
            b.add_op(cell, 400 + 10 * ((l * 7 + t * 3) % 5), [256 << 10, 256 << 10])
            b.add_edge(f"l{l}/w", cell)
            b.add_edge(f"x{t}" if l == 0 else f"l{l - 1}/t{t}/cell", cell)
            if t:
                b.add_edge(f"l{l}/t{t - 1}/cell", cell, 1)
    b.add_op("loss", 50, [4])
    for t in range(steps):
        b.add_edge(f"l{layers - 1}/t{t}/cell", "loss")
    return b.build()


def device_of_layers(graph, placement):
    """Layer number -> set of devices its ops are on."""
    out = {}
    for op, name in enumerate(graph.names):
        if name.startswith("l") and "/" in name:
            out.setdefault(int(name.split("/")[0][1:]), set()).add(int(placement.device_of[op]))
    return out


def test_find_layers_reads_scopes_not_op_names():
    b = OpGraphBuilder()
    for name, us in [
        ("enc/layer_0/MatMul", 100),
        ("gradients/enc/layer_1/MatMul_grad/MatMul_1", 100),  # gradients/ dropped
        ("gradients_2/enc/layer_2/add", 100),
        ("MatMul_3", 1000),  # an op's own name is not a scope
        ("block7/relu", 50),  # one number only: no stem
    ]:
        b.add_op(name, us, [4])
    g = b.build()
    [(stem, number)] = find_layers(g, 4)
    assert stem == "layer"
    assert number.tolist() == [0, 1, 2, -1, -1]


def test_find_layers_heaviest_stems_first_and_skips_light_ones():
    b = OpGraphBuilder()
    for l in range(2):
        for t in range(3):
            b.add_op(f"layer_{l}/t{t}/cell", 100, [4])  # stems layer and t, 600 us each
        b.add_op(f"tiny{l}/x", 1, [4])  # 2 us of 1,400: under the share a stem needs
    b.add_op("head_0/a", 400, [4])
    b.add_op("head_1/a", 400, [4])  # stem head, 800 us: the heaviest
    stems = [s for s, _ in find_layers(b.build(), 4)]
    assert stems == ["head", "layer"]  # at most two, heaviest first; 't' ties 'layer' and loses on name
    assert find_layers(graphs.chain(5), 4) == []


def test_find_layers_skips_steps_that_outnumber_the_devices():
    g = rnn(layers=3, steps=9)  # stems l (3 numbers) and t (9)
    assert [s for s, _ in find_layers(g, 2)] == ["l"]  # 9 > 4 per device on 2 devices
    assert sorted(s for s, _ in find_layers(g, 3)) == ["l", "t"]


def test_each_layer_on_its_own_device_and_the_rest_beside():
    g = rnn()
    c = graphs.cluster(4)
    p = place_layers(g, c, colocation_groups(g))
    assert device_of_layers(g, p) == {0: {0}, 1: {1}, 2: {2}, 3: {3}}
    # Inputs go where layer 0 reads them, the loss where the top layer is.
    assert {int(p.device_of[g.op_id(f"x{t}")]) for t in range(6)} == {0}
    assert p.device_of[g.op_id("loss")] == 3
    assert p.method == "layers"


def test_more_layers_than_devices_round_robin_or_blocks():
    g = rnn(layers=8, steps=4)
    c = graphs.cluster(4)
    p = place_layers(g, c, colocation_groups(g))
    layout = device_of_layers(g, p)
    assert all(len(devices) == 1 for devices in layout.values())
    devices = [layout[l].pop() for l in range(8)]
    assert devices in ([0, 1, 2, 3, 0, 1, 2, 3], [0, 0, 1, 1, 2, 2, 3, 3])


def test_groups_stay_whole_and_pins_stay():
    b = OpGraphBuilder()
    b.add_op("l0/a", 100, [4], colocation=("shared",))
    b.add_op("l1/b", 300, [4], colocation=("shared",))  # heavier: the group is layer 1's
    b.add_op("l2/c", 100, [4], device="/device:GPU:3")
    b.add_op("l3/d", 100, [4])
    b.add_edge("l0/a", "l2/c")
    b.add_edge("l1/b", "l3/d")
    g = b.build()
    c = graphs.cluster(4)
    groups = colocation_groups(g)
    p = place_layers(g, c, groups)
    check_placement(g, c, groups, p)
    assert p.device_of[g.op_id("l0/a")] == p.device_of[g.op_id("l1/b")]
    assert p.device_of[g.op_id("l2/c")] == 3


@pytest.mark.parametrize("seed", range(12))
def test_invariants_on_random_graphs_with_layer_scopes(seed):
    base = graphs.random_dag(seed, 25, edge_prob=0.15, group_prob=0.2, persistent_prob=0.3)
    b = OpGraphBuilder()
    scoped = [f"block_{i % (2 + seed % 5)}/{name}" for i, name in enumerate(base.names)]
    for op, name in enumerate(scoped):
        b.add_op(
            name, float(base.compute_us[op]), list(base.output_bytes[op]),
            temp_bytes=int(base.temp_bytes[op]), persistent_bytes=int(base.persistent_bytes[op]),
            colocation=tuple(f"block_{int(c[2:]) % (2 + seed % 5)}/{c}" for c in base.colocation[op]),
        )
    for src, dst, slot in zip(base.edge_src.tolist(), base.edge_dst.tolist(), base.edge_src_output.tolist()):
        if slot < 0:
            b.add_control_edge(scoped[src], scoped[dst])
        else:
            b.add_edge(scoped[src], scoped[dst], slot)
    g = b.build()
    c = graphs.cluster(3, memory_bytes=64 << 20)
    try:
        result = place(g, c, PlacementOptions(placement_method="layers"))
    except InfeasiblePlacementError as e:
        assert "persistent memory" in str(e) or "no device can hold it" in str(e)
        return
    assert_valid_schedule(g, c, result.groups, result.schedule)
    assert result.makespan_us >= result.lower_bound_us - 1e-6


def test_layers_too_heavy_for_a_device_are_refused_and_auto_goes_on():
    # Round robin puts layers 0 and 4 on device 0, blocks layers 0 and 1: 120 MiB either way.
    g = rnn(layers=5, steps=1, weight_bytes=[60 * MiB, 60 * MiB, 10 * MiB, 10 * MiB, 60 * MiB])
    c = Cluster.homogeneous(4, 100 * MiB)
    with pytest.raises(InfeasiblePlacementError, match=r"layers .*on '/device:GPU:0' hold 120\.00 MiB"):
        place_layers(g, c, colocation_groups(g))
    result = place(g, c, PlacementOptions(placement_method="auto", refine_seconds=0.1))
    assert result.candidates["layers"] is None
    assert_valid_schedule(g, c, result.groups, result.schedule)


def test_auto_tries_layers_only_where_there_are_layers():
    g = rnn()
    c = Cluster.homogeneous(4, GiB)
    result = place(g, c, PlacementOptions(placement_method="auto", refine_seconds=0))
    assert result.candidates["layers"] is not None
    # m-ETF, slower, may have been stopped before it finished (None): run it alone.
    m_etf = place(g, c, PlacementOptions(placement_method="m_etf"))
    assert result.candidates["layers"] <= m_etf.makespan_us
    flat = place(graphs.chain(5), c, PlacementOptions(placement_method="auto", refine_seconds=0))
    assert "layers" not in flat.candidates


def test_asking_for_layers_without_scopes_says_what_to_do():
    with pytest.raises(ConfigError, match="needs numbered layer scopes.*use auto or m_etf"):
        place(graphs.chain(4), graphs.cluster(2), PlacementOptions(placement_method="layers"))


def test_placement_is_the_same_each_time():
    g = rnn(layers=8, steps=4)
    c = graphs.cluster(4)
    a = place_layers(g, c, colocation_groups(g))
    b = place_layers(g, c, colocation_groups(g))
    np.testing.assert_array_equal(a.device_of, b.device_of)


def test_pinned_groups_count_where_they_are_pinned():
    # Layers 0..3 on three devices: round robin gives 0, 1, 2, 0 and blocks 0, 0, 1, 2, so layer 0
    # shares device 0 with layer 3 or layer 1. Those two are pinned elsewhere, so device 0 holds
    # only layer 0's 60 MiB, and the layout fits in 100 MiB devices.
    b = OpGraphBuilder()
    pins = {1: "/device:GPU:2", 3: "/device:GPU:1"}
    for l, held in enumerate([60, 60, 10, 60]):
        b.add_op(f"l{l}/w", 5, [4], persistent_bytes=held * MiB, colocation=(f"l{l}",), device=pins.get(l))
        b.add_op(f"l{l}/cell", 100, [4], colocation=(f"l{l}",), device=pins.get(l))
        b.add_edge(f"l{l}/w", f"l{l}/cell")
        if l:
            b.add_edge(f"l{l - 1}/cell", f"l{l}/cell")
    g = b.build()
    c = Cluster.homogeneous(3, 100 * MiB)
    groups = colocation_groups(g)
    p = place_layers(g, c, groups)
    check_placement(g, c, groups, p)
    assert p.device_of[g.op_id("l1/cell")] == 2 and p.device_of[g.op_id("l3/cell")] == 1


def test_each_distinct_layout_is_scheduled_once_and_large_graphs_try_one_stem(caplog, monkeypatch):
    import logging

    from baechi_tf.placer import layers

    b = OpGraphBuilder()  # every op numbered by both stems: nothing is left to put beside
    for l in range(6):
        for t in range(2):
            b.add_op(f"layer_{l}/t{t}/cell", 100 + l, [4])
            if l:
                b.add_edge(f"layer_{l - 1}/t{t}/cell", f"layer_{l}/t{t}/cell")
    g = b.build()
    c = graphs.cluster(4)
    with caplog.at_level(logging.INFO, logger="baechi_tf.placer.layers"):
        place_layers(g, c, colocation_groups(g))
    tried = [r.getMessage() for r in caplog.records if r.getMessage().startswith("layers by")]
    # 'layer': round robin and blocks (6 layers > 4 devices); 't': 2 layers, round robin only.
    assert [m.split(":")[0] for m in tried] == [
        "layers by 'layer', round robin", "layers by 'layer', blocks", "layers by 't', round robin"
    ]
    caplog.clear()
    monkeypatch.setattr(layers, "_LARGE_OPS", g.num_ops - 1)
    with caplog.at_level(logging.INFO, logger="baechi_tf.placer.layers"):
        place_layers(g, c, colocation_groups(g))
    assert {r.getMessage().split(",")[0] for r in caplog.records} == {"layers by 'layer'"}


def test_a_scope_split_by_the_sweeps_is_made_whole_when_that_is_faster(caplog):
    import logging

    # att/a1 sits beside layer 0 and att/a2 beside layer 1 (each reads 4 bytes from its layer);
    # att/a3 joins their 16 MiB outputs. Kept whole, only 4 bytes cross devices instead of 16 MiB.
    b = OpGraphBuilder()
    for l in range(2):
        b.add_op(f"l{l}/cell", 1000, [4])
        b.add_op(f"l{l}/next", 1000, [4])
        b.add_edge(f"l{l}/cell", f"l{l}/next")
    b.add_op("att/a1", 50, [16 * MiB])
    b.add_op("att/a2", 50, [16 * MiB])
    b.add_op("att/a3", 50, [4])
    b.add_edge("l0/cell", "att/a1")
    b.add_edge("l1/cell", "att/a2")
    b.add_edge("att/a1", "att/a3")
    b.add_edge("att/a2", "att/a3")
    g = b.build()
    c = graphs.cluster(2)
    with caplog.at_level(logging.INFO, logger="baechi_tf.placer.layers"):
        p = place_layers(g, c, colocation_groups(g))
    assert "scope of 3 groups kept whole" in caplog.text
    assert len({int(p.device_of[g.op_id(f"att/a{i}")]) for i in (1, 2, 3)}) == 1
    assert p.device_of[g.op_id("l0/cell")] != p.device_of[g.op_id("l1/cell")]


def test_layouts_that_cannot_beat_the_best_stop_early_and_change_nothing(monkeypatch):
    """Each layout and each scope made whole is an m-ETF run of the whole graph, kept only when
    it ends before the best so far: a run stops once an op would start after that (a fifth of
    the layers placer's time on `make demo`'s graph). The placements are those of full runs."""
    from baechi_tf.placer import layers
    from baechi_tf.placer.policies import ScheduleCutOff

    run, stopped = layers._run, []

    def counting(*args):
        try:
            return run(*args)
        except ScheduleCutOff:
            stopped.append(args[5])
            raise

    cases = [rnn(layers=l, steps=s) for l, s in ((4, 6), (6, 3), (5, 4))]
    cases += [rnn(layers=4, steps=6, weight_bytes=[MiB, 8 * MiB, MiB, 8 * MiB])]
    for g in cases:
        c = graphs.cluster(4)
        groups = colocation_groups(g)
        monkeypatch.setattr(layers, "_run", counting)
        cut = place_layers(g, c, groups)
        monkeypatch.setattr(layers, "_run", lambda *args: run(*args[:6]))  # never stopped
        full = place_layers(g, c, groups)
        assert np.array_equal(cut.device_of, full.device_of)
    assert stopped, stopped  # some runs did stop early
