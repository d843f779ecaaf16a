"""The fixed, seeded graph set of bench/quality.py: shapes of real models, as OpGraphs."""

from __future__ import annotations

import numpy as np

from baechi_tf.cluster import Cluster, GiB
from baechi_tf.graph import OpGraph
from baechi_tf.graph_builder import OpGraphBuilder

KiB, MiB = 1 << 10, 1 << 20


def chain(n=60, seed=0):
    """A deep chain: nothing to parallelise, communication only hurts."""
    rng = np.random.default_rng(seed)
    b = OpGraphBuilder()
    for i in range(n):
        b.add_op(f"op{i}", float(rng.uniform(50, 500)), [int(rng.integers(64 * KiB, 4 * MiB))])
        if i:
            b.add_edge(f"op{i - 1}", f"op{i}")
    return b.build()


def fork_join(width=16, depth=5, seed=0):
    """Wide independent branches between a source and a join."""
    rng = np.random.default_rng(seed)
    b = OpGraphBuilder()
    b.add_op("src", 20, [1 * MiB])
    b.add_op("join", 50, [4])
    for w in range(width):
        prev = "src"
        for d in range(depth):
            name = f"b{w}/op{d}"
            b.add_op(name, float(rng.uniform(200, 2000)), [int(rng.integers(16 * KiB, 1 * MiB))])
            b.add_edge(prev, name)
            prev = name
        b.add_edge(prev, "join")
    return b.build()


def rnn(layers=4, steps=20, units_bytes=512 * KiB, seed=0):
    """An unrolled multi-layer RNN: cell (l, t) reads (l-1, t) and (l, t-1); weights per layer."""
    rng = np.random.default_rng(seed)
    b = OpGraphBuilder()
    for l in range(layers):
        b.add_op(f"l{l}/w", 5, [4 * MiB], persistent_bytes=4 * MiB, colocation=[f"l{l}/w"])
    for t in range(steps):
        b.add_op(f"x{t}", 10, [units_bytes])
        for l in range(layers):
            name = f"l{l}/t{t}/cell"
            b.add_op(name, float(rng.uniform(300, 600)), [units_bytes, units_bytes], temp_bytes=units_bytes)
            b.add_edge(f"l{l}/w", name)
            b.add_edge(f"x{t}" if l == 0 else f"l{l - 1}/t{t}/cell", name)
            if t:
                b.add_edge(f"l{l}/t{t - 1}/cell", name, 1)
    b.add_op("loss", 100, [4])
    for t in range(steps):
        b.add_edge(f"l{layers - 1}/t{t}/cell", "loss")
    return b.build()


def transformer(layers=4, heads=8, seed=0):
    """Transformer-like blocks: per head Q, K, V, attention; projection; a two-matmul FFN."""
    rng = np.random.default_rng(seed)
    act = 2 * MiB
    b = OpGraphBuilder()
    b.add_op("embed", 200, [act], persistent_bytes=32 * MiB)
    prev = "embed"
    for l in range(layers):
        for h in range(heads):
            p = f"l{l}/h{h}"
            for q in "qkv":
                b.add_op(f"{p}/{q}", float(rng.uniform(80, 160)), [act // heads])
                b.add_edge(prev, f"{p}/{q}")
            b.add_op(f"{p}/attn", float(rng.uniform(200, 400)), [act // heads], temp_bytes=act // 2)
            for q in "qkv":
                b.add_edge(f"{p}/{q}", f"{p}/attn")
        b.add_op(f"l{l}/proj", 300, [act], persistent_bytes=4 * MiB)
        for h in range(heads):
            b.add_edge(f"l{l}/h{h}/attn", f"l{l}/proj")
        b.add_op(f"l{l}/add1", 20, [act])
        b.add_edge(prev, f"l{l}/add1")
        b.add_edge(f"l{l}/proj", f"l{l}/add1")
        b.add_op(f"l{l}/ffn1", 900, [4 * act], persistent_bytes=8 * MiB)
        b.add_op(f"l{l}/ffn2", 900, [act], persistent_bytes=8 * MiB)
        b.add_edge(f"l{l}/add1", f"l{l}/ffn1")
        b.add_edge(f"l{l}/ffn1", f"l{l}/ffn2")
        b.add_op(f"l{l}/add2", 20, [act])
        b.add_edge(f"l{l}/add1", f"l{l}/add2")
        b.add_edge(f"l{l}/ffn2", f"l{l}/add2")
        prev = f"l{l}/add2"
    return b.build()


def comm_heavy(n=200, seed=0):
    """Many short ops passing large tensors: spreading them costs more than it gains."""
    rng = np.random.default_rng(seed)
    b = OpGraphBuilder()
    for i in range(n):
        b.add_op(f"op{i}", float(rng.uniform(20, 120)), [int(rng.integers(2 * MiB, 16 * MiB))])
        for p in rng.choice(i, size=min(i, 2), replace=False) if i else []:
            b.add_edge(f"op{int(p)}", f"op{i}")
    return b.build()


def layered(n=2000, seed=0):
    import os
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from layered import layered_graph

    return layered_graph(n, seed=seed)


def cases() -> list[tuple[str, OpGraph, Cluster]]:
    """(name, graph, cluster) of every case, in a fixed order."""
    four = Cluster.homogeneous(4, 16 * GiB)
    return [
        ("chain-60", chain(), four),
        ("fork-join-16x5", fork_join(), four),
        ("rnn-4x20", rnn(), four),
        ("rnn-8x30", rnn(8, 30, seed=1), four),
        ("transformer-4x8", transformer(), four),
        ("comm-heavy-200", comm_heavy(), four),
        ("layered-2000", layered(), four),
        ("rnn-4x20-tight", rnn(), Cluster.homogeneous(4, 24 * MiB)),
    ]
