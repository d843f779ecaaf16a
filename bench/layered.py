"""Seeded layered graphs, the shape of unrolled models: layers of ops reading the layer before."""

from __future__ import annotations

import numpy as np

from baechi_tf.graph import OpGraph


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
