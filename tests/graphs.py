"""A catalogue of small hand-drawn graphs for the placer tests.

Costs are microseconds and bytes. Unless a graph says otherwise it runs on `cluster(n)`: n devices
of 1 GiB with the default link (0.0001754 us/B + 134 us).
"""

from __future__ import annotations

import dataclasses
import random

from baechi_tf.cluster import Cluster, CommCost, GiB
from baechi_tf.graph import HELD, OpGraph
from baechi_tf.graph_builder import OpGraphBuilder

MiB = 1 << 20


def cluster(n: int = 2, memory_bytes: int = GiB, comm: CommCost = CommCost()) -> Cluster:
    return Cluster.homogeneous(n, memory_bytes, comm=comm)


def chain(n: int = 4, compute_us: float = 100.0, nbytes: int = 1 * MiB) -> OpGraph:
    """op0 -> op1 -> ... -> op{n-1}"""
    b = OpGraphBuilder()
    for i in range(n):
        b.add_op(f"op{i}", compute_us, [nbytes])
        if i:
            b.add_edge(f"op{i - 1}", f"op{i}")
    return b.build()


def diamond(compute_us=(10.0, 100.0, 100.0, 10.0), nbytes: int = 4) -> OpGraph:
    """
        a
       / \\
      b   c
       \\ /
        d
    """
    b = OpGraphBuilder()
    for name, us in zip("abcd", compute_us):
        b.add_op(name, us, [nbytes])
    for s, d in ("ab", "ac", "bd", "cd"):
        b.add_edge(s, d)
    return b.build()


def fork_join(width: int = 4, branch_us: float = 1000.0, nbytes: int = 4096) -> OpGraph:
    """
           src
        /  |  ... \\
      b0  b1  ... b{w-1}
        \\  |  ... /
           sink
    """
    b = OpGraphBuilder()
    b.add_op("src", 10, [nbytes])
    b.add_op("sink", 10, [4])
    for i in range(width):
        b.add_op(f"b{i}", branch_us, [nbytes])
        b.add_edge("src", f"b{i}")
        b.add_edge(f"b{i}", "sink")
    return b.build()


def control_scope(updates: int = 12, scoped: int = 40, compute_us: float = 50.0) -> OpGraph:
    """Ops made under one control scope, as tf_keras's batch-norm updates make them: `updates`
    chains ``x{i} -> update{i}``, and `scoped` constants ``const{j}`` with a control input from
    every update, each read by ``use{j}`` (which also reads ``x{j % updates}``). The constants'
    inputs are the same, in the same order."""
    b = OpGraphBuilder()
    for i in range(updates):
        b.add_op(f"x{i}", compute_us * (1 + i % 3), [4096])
        b.add_op(f"update{i}", compute_us)
        b.add_edge(f"x{i}", f"update{i}")
    for j in range(scoped):
        b.add_op(f"const{j}", 1.0, [64])
        for i in range(updates):
            b.add_control_edge(f"update{i}", f"const{j}")
        b.add_op(f"use{j}", compute_us, [4096])
        b.add_edge(f"const{j}", f"use{j}")
        b.add_edge(f"x{j % updates}", f"use{j}")
    return b.build()


def independent(n: int = 4, compute_us: float = 1000.0) -> OpGraph:
    """n ops and no edges:  x0  x1  x2  x3"""
    b = OpGraphBuilder()
    for i in range(n):
        b.add_op(f"x{i}", compute_us, [4])
    return b.build()


def group_cycle() -> OpGraph:
    """a and b are TF-colocated (group 'a'); merging c into it would close a cycle via d.

        a     b
        |    / \\
        |   d   f
        |  / \\
        c     e
    """
    b = OpGraphBuilder()
    b.add_op("a", 10, [4], colocation=["a"])
    b.add_op("b", 10, [4, 4], colocation=["a"])
    for name in "cdef":
        b.add_op(name, 10, [4, 4])
    b.add_edge("a", "c")
    b.add_edge("b", "d")
    b.add_edge("b", "f", 1)
    b.add_edge("d", "c")
    b.add_edge("d", "e", 1)
    return b.build()


def too_big_for_one(memory_bytes: int = 100 * MiB) -> tuple[OpGraph, Cluster]:
    """Two independent chains, each holding 60 MiB of weights; devices hold 100 MiB.

      w0 -> m0        w1 -> m1
    """
    b = OpGraphBuilder()
    for i in range(2):
        b.add_op(f"w{i}", 5, [4 * MiB], persistent_bytes=60 * MiB)
        b.add_op(f"m{i}", 500, [4 * MiB])
        b.add_edge(f"w{i}", f"m{i}")
    return b.build(), cluster(2, memory_bytes)


def colocated_pair() -> OpGraph:
    """v and its reader r are colocated; s is free.

      v -> r -> s
    """
    b = OpGraphBuilder()
    b.add_op("v", 1, [1024], persistent_bytes=1024, colocation=["v"])
    b.add_op("r", 100, [1024], colocation=["v"])
    b.add_op("s", 100, [4])
    b.add_edge("v", "r")
    b.add_edge("r", "s")
    return b.build()


def random_dag(
    seed: int,
    num_ops: int,
    *,
    edge_prob: float = 0.3,
    max_compute_us: float = 1000.0,
    max_bytes: int = 1 * MiB,
    group_prob: float = 0.0,
    pin_prob: float = 0.0,
    num_devices: int = 2,
    persistent_prob: float = 0.0,
) -> OpGraph:
    """A seeded random DAG: edges only go from lower to higher op ids."""
    rng = random.Random(seed)
    b = OpGraphBuilder()
    for i in range(num_ops):
        colocation = ()
        if i and rng.random() < group_prob:
            colocation = (f"op{rng.randrange(i)}",)
        device = f"/device:GPU:{rng.randrange(num_devices)}" if rng.random() < pin_prob else None
        b.add_op(
            f"op{i}",
            round(rng.uniform(1, max_compute_us), 1),
            [rng.randrange(4, max_bytes + 1) for _ in range(rng.randint(1, 2))],
            temp_bytes=rng.randrange(0, max_bytes // 4 + 1),
            persistent_bytes=rng.randrange(0, max_bytes + 1) if rng.random() < persistent_prob else 0,
            device=device,
            colocation=colocation,
        )
    for j in range(num_ops):
        for i in range(j):
            if rng.random() < edge_prob:
                if rng.random() < 0.15:
                    b.add_control_edge(f"op{i}", f"op{j}")
                else:
                    b.add_edge(f"op{i}", f"op{j}", rng.randrange(1))
    return b.build()


def integer_dag_case(seed: int) -> tuple[OpGraph, Cluster, list[int], bool]:
    """(graph, cluster, favourite child of each op or -1, whether to group by TF colocation (else
    one op a group)): a seeded DAG whose compute times are
    drawn from a few integers, so that many starts coincide and ties decide, with chains, control
    edges, groups, pins and persistent memory by chance; 2-6 devices on one of several links,
    with ample or tight memory; favourite children drawn among each op's successors.

    The seeds the tests name are cases in which the list scheduler's lazy heaps once missed the
    earliest start (found by a review's fuzzing of m-SCT with and without tail queues)."""
    rng = random.Random(seed)
    nd = rng.randint(2, 6)
    kind = rng.choice(["rdag", "int", "int", "shape", "layered"])
    n = rng.choice([20, 30, 40, 60, 80, 120, 160, 220, 300])
    if kind != "int":
        raise ValueError(f"seed {seed} draws a {kind!r} case; integer_dag_case makes 'int' ones")
    times = rng.choice([[50, 100, 150, 200, 300], [1, 2, 3, 5], [0, 1, 2, 10], [100], [0, 100, 200], [2, 100]])
    sizes = rng.choice([[4096], [4, 4096, MiB], [MiB, 4 * MiB], [4]])
    group_prob = rng.choice([0, 0, 0.1, 0.3])
    pin_prob = rng.choice([0, 0, 0.05, 0.2])
    persistent_prob = rng.choice([0, 0.1, 0.3])
    edges_per_op = rng.choice([1.0, 2.0, 3.0, 5.0])
    control_prob = rng.choice([0, 0.15, 0.5])
    b = OpGraphBuilder()
    for i in range(n):
        colocation = (f"op{rng.randrange(i)}",) if i and rng.random() < group_prob else ()
        device = f"/device:GPU:{rng.randrange(nd)}" if rng.random() < pin_prob else None
        b.add_op(f"op{i}", float(rng.choice(times)), [rng.choice(sizes) for _ in range(rng.randint(1, 2))],
                 temp_bytes=rng.choice([0, 0, 4096, MiB]),
                 persistent_bytes=rng.choice([4096, MiB, 4 * MiB]) if rng.random() < persistent_prob else 0,
                 device=device, colocation=colocation)
    p = min(0.9, edges_per_op / n)
    for j in range(n):
        if j and rng.random() < 0.3:
            b.add_edge(f"op{j - 1}", f"op{j}")
        for i in range(j):
            if rng.random() < p:
                if rng.random() < control_prob:
                    b.add_control_edge(f"op{i}", f"op{j}")
                else:
                    b.add_edge(f"op{i}", f"op{j}", rng.randrange(1))
    graph = b.build()
    comm = rng.choice([CommCost(), CommCost(0.0, 100.0), CommCost(0.0, 0.0), CommCost(0.0, 1.0),
                       CommCost(0.0, 50.0), CommCost(1e-5, 10.0)])
    memory = rng.choice(["ample", "ample", "tight", "tighter"])
    if memory == "ample":
        memory_bytes = GiB
    else:
        need = graph.output_total_bytes + graph.temp_bytes + graph.persistent_bytes
        share = 0.5 if memory == "tight" else 0.2
        memory_bytes = max(3 * int(need.max()), int(int(need.sum()) * share / nd),
                           4 * MiB if memory == "tight" else MiB)
    child_kind = rng.choice(["lp", "random", "random", "first"])
    colocate = rng.choice(["tf", "tf", "single"]) == "tf"
    if child_kind == "lp":
        raise ValueError(f"seed {seed} draws LP favourite children; integer_dag_case draws its own")
    children = []
    for op in range(graph.num_ops):
        succ = list(graph.successors[op])
        if not succ:
            children.append(-1)
        elif child_kind == "first":
            children.append(int(succ[0]))
        else:
            children.append(int(rng.choice(succ)) if rng.random() < 0.8 else -1)
    return graph, cluster(nd, memory_bytes, comm), children, colocate


def with_aliases(graph: OpGraph, rng: random.Random, share: float) -> OpGraph:
    """`graph` with about `share` of its output slots reusing a buffer (`OpGraph.output_alias`):
    one of their op's data inputs' (three in four) or a view of persistent memory (HELD). Some
    are not reused after all (a sink's, an output larger than its input)."""
    if not share:
        return graph
    inputs: dict[int, list[tuple[int, int]]] = {}
    for s, d, o in zip(graph.edge_src.tolist(), graph.edge_dst.tolist(), graph.edge_src_output.tolist()):
        if o >= 0:
            inputs.setdefault(d, []).append((s, o))
    aliases = []
    for op, outs in enumerate(graph.output_bytes):
        row = []
        for _ in outs:
            if rng.random() < share:
                row.append(rng.choice(inputs[op]) if op in inputs and rng.random() < 0.75 else HELD)
            else:
                row.append(None)
        aliases.append(tuple(row))
    out = dataclasses.replace(graph, output_alias=tuple(aliases))
    out.validate()
    return out
