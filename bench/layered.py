"""Seeded layered graphs, the shape of unrolled models: layers of ops reading the layer before;
and fan-out graphs, thousands of small ops ready at once."""

from __future__ import annotations

import numpy as np

from baechi_tf.graph import OpGraph
from baechi_tf.graph_builder import OpGraphBuilder


def layered_graph(num_ops: int, seed: int = 0, width: int = 0) -> OpGraph:
    """`num_ops` ops in layers of `width` (default about sqrt(num_ops)/2), each reading 1-3 ops
    of the previous layer; compute 10-1000 us, outputs 4 KiB-4 MiB, 2% of ops hold 64 KiB-4 MiB of weights."""
    rng = np.random.default_rng(seed)
    width = width or max(2, int(np.sqrt(num_ops) / 2))
    layer = np.arange(num_ops) // width
    src, dst = [], []
    for op in range(width, num_ops):
        start = (layer[op] - 1) * width
        k = int(rng.integers(1, 4))
        for p in rng.choice(np.arange(start, start + width), size=k, replace=False):
            src.append(int(p))
            dst.append(op)
    persistent = np.where(rng.random(num_ops) < 0.02, rng.integers(64 << 10, 4 << 20, num_ops), 0)
    return OpGraph.from_arrays(
        names=[f"l{layer[i]}/op{i}" for i in range(num_ops)],
        compute_us=np.round(rng.uniform(10, 1000, num_ops), 1),
        output_bytes=[[int(b)] for b in rng.integers(4 << 10, 4 << 20, num_ops)],
        temp_bytes=rng.integers(0, 1 << 20, num_ops),
        persistent_bytes=persistent,
        edge_src=src,
        edge_dst=dst,
        edge_src_output=[0] * len(src),
    )


def fan_out_graph(num_ops: int) -> OpGraph:
    """About `num_ops` ops: src (100 us, 4 KiB) and c{k} (1 us) feed m{k} (2 us, 4 KiB), then
    m{k} -> r{k} (2 us) -> sink, for k < (num_ops - 2) // 3. Spread over devices, the copies
    (134 us each at the default cost) queue on the channels while one device runs all of it in
    5 us per k plus 105 us: the ready ops' start estimates go stale at every step.
    """
    b = OpGraphBuilder()
    b.add_op("src", 100, [4096])
    b.add_op("sink", 5, [4])
    for k in range(max(1, (num_ops - 2) // 3)):
        b.add_op(f"c{k}", 1, [4])
        b.add_op(f"m{k}", 2, [4096])
        b.add_op(f"r{k}", 2, [4])
        for u, v in (("src", f"m{k}"), (f"c{k}", f"m{k}"), (f"m{k}", f"r{k}"), (f"r{k}", "sink")):
            b.add_edge(u, v)
    return b.build()


def colocated_updates_graph(num_ops: int, chained: bool = False) -> OpGraph:
    """About `num_ops` ops: a variable `var` (1 MiB) and, for k < (num_ops - 1) // 2, a
    producer p{k} (100 us, 4 KiB) feeding an update u{k} (2 us) colocated with the variable and
    reading it: the shape of many updates of one variable. Placed over several devices the
    producers run side by side and their copies queue on the channel into the variable's device.
    `chained`: each update also reads the one before (4 bytes), so that m-SCT keeps the
    variable's device for the next update, its favourite child, while the producers wait (a
    control edge would not do: m-SCT's LP makes no op a favourite child through one).
    """
    b = OpGraphBuilder()
    b.add_op("var", 1, [1 << 20], persistent_bytes=1 << 20)
    for k in range(max(1, (num_ops - 1) // 2)):
        b.add_op(f"p{k}", 100, [4096])
        b.add_op(f"u{k}", 2, [4], colocation=["var"])
        b.add_edge(f"p{k}", f"u{k}")
        b.add_edge("var", f"u{k}")
        if chained and k:
            b.add_edge(f"u{k - 1}", f"u{k}")
    return b.build()


def colocated_gathers_graph(num_ops: int) -> OpGraph:
    """About `num_ops` ops: an embedding `emb` (8 MiB) and, for k < (num_ops - 2) // 3, an index
    i{k} (1 us) and a gather g{k} (2 us, 4 KiB, colocated with the embedding) feeding a consumer
    c{k} (100 us) that feeds `sink`: the shape of many lookups of one embedding, whose results
    queue on the channels out of the embedding's device."""
    b = OpGraphBuilder()
    b.add_op("emb", 1, [1 << 20], persistent_bytes=8 << 20)
    b.add_op("sink", 5, [4])
    for k in range(max(1, (num_ops - 2) // 3)):
        b.add_op(f"i{k}", 1, [64])
        b.add_op(f"g{k}", 2, [4096], colocation=["emb"])
        b.add_op(f"c{k}", 100, [4096])
        for u, v in (("emb", f"g{k}"), (f"i{k}", f"g{k}"), (f"g{k}", f"c{k}"), (f"c{k}", "sink")):
            b.add_edge(u, v)
    return b.build()


SHAPES = {
    "layered": lambda n: layered_graph(n, seed=n),
    "fan_out": fan_out_graph,
    "updates": colocated_updates_graph,
    "chained_updates": lambda n: colocated_updates_graph(n, chained=True),
    "gathers": colocated_gathers_graph,
}
"""Graph makers by shape name, each taking a number of ops (the benches' --shape)."""
