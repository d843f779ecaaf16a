"""m-SCT's LP at scale: seconds to build it and to solve it with each back end, m-SCT end to end,
and fusion's op-count reduction on an unrolled RNN.

Graphs (seeded, deterministic):

* ``model``: forward graphs shaped like a Transformer encoder (multi-head attention and a
  feed-forward block per layer; every matmul reads a weight, a source op). Layers are joined by
  one op, so the LP splits into pieces (`baechi_tf.sct.relaxation`).
* ``layered``: `bench/layered.py`, layers of ops each reading 1-3 random ops of the layer before;
  no op joins the layers, so the LP does not split: the hard case for simplex solvers.
* ``rnn``: an unrolled multi-layer LSTM (plain ops per cell), for fusion.

Table 1 gives, per graph: the seconds to build the whole LP, to solve it whole with each back end
and with each of HiGHS's methods on its own (dual simplex "DS", with its pivots per row, and
interior point "IPM"; the ``highs`` back end picks between them, `baechi_tf.sct.solvers`), and
the default path (exact reductions and pieces, with HiGHS; build included). Table 2 runs the
placement pipeline (validate, group, place, check, baseline) with m-SCT and m-ETF on four devices
of 16 GiB and gives its wall time, the placer's own time and the simulated makespan over the lower
bound. Table 3 fuses the RNN with the coplace grouper.

    .venv/bin/python bench/lp_scaling.py [--sizes 1000,10000,30000] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from baechi_tf.cluster import Cluster  # noqa: E402
from baechi_tf.graph import OpGraph  # noqa: E402
import flags  # noqa: E402

_OPS_PER_LAYER = 142  # model_graph with 8 heads


class _Ops:
    """Appends ops and edges to arrays; each op has one output."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.names: list[str] = []
        self.compute: list[float] = []
        self.out: list[list[int]] = []
        self.persistent: list[int] = []
        self.src: list[int] = []
        self.dst: list[int] = []

    def op(self, name: str, us: float, nbytes: float, inputs=(), persistent: int = 0) -> int:
        i = len(self.names)
        self.names.append(name)
        self.compute.append(round(us * self.rng.uniform(0.8, 1.2), 2))
        self.out.append([int(nbytes)])
        self.persistent.append(persistent)
        for p in inputs:
            self.src.append(p)
            self.dst.append(i)
        return i

    def weight(self, name: str, nbytes: int) -> int:
        return self.op(name, 2, nbytes, persistent=nbytes)

    def graph(self) -> OpGraph:
        return OpGraph.from_arrays(
            self.names, self.compute, self.out, persistent_bytes=self.persistent,
            edge_src=self.src, edge_dst=self.dst, edge_src_output=[0] * len(self.src),
        )


def model_graph(num_ops: int, seed: int = 0, heads: int = 8) -> OpGraph:
    """A Transformer-encoder-shaped forward graph of about `num_ops` ops (142 per layer)."""
    g = _Ops(seed)
    act = 4 * 64 * 1024 * 4  # batch 4, sequence 64, hidden 1024, float32
    h = g.op("input", 5, act)
    for layer in range(max(1, round(num_ops / _OPS_PER_LAYER))):
        p = f"layer{layer}/"
        outs = []
        for k in range(heads):
            q = g.op(p + f"head{k}/q", 40, act / heads, [h, g.weight(p + f"head{k}/wq", 1 << 19)])
            key = g.op(p + f"head{k}/k", 40, act / heads, [h, g.weight(p + f"head{k}/wk", 1 << 19)])
            v = g.op(p + f"head{k}/v", 40, act / heads, [h, g.weight(p + f"head{k}/wv", 1 << 19)])
            s = g.op(p + f"head{k}/scores", 60, act / 2, [q, key])
            s = g.op(p + f"head{k}/scale", 5, act / 2, [s])
            m = g.op(p + f"head{k}/max", 5, act / 64, [s])
            s = g.op(p + f"head{k}/sub", 5, act / 2, [s, m])
            s = g.op(p + f"head{k}/exp", 8, act / 2, [s])
            z = g.op(p + f"head{k}/sum", 5, act / 64, [s])
            s = g.op(p + f"head{k}/softmax", 5, act / 2, [s, z])
            outs.append(g.op(p + f"head{k}/attend", 50, act / heads, [s, v]))
        x = g.op(p + "concat", 10, act, outs)
        x = g.op(p + "proj", 80, act, [x, g.weight(p + "wo", 4 << 20)])
        x = _layer_norm(g, p + "ln1/", g.op(p + "residual1", 5, act, [x, h]), act)
        f = g.op(p + "ffn1", 160, 4 * act, [x, g.weight(p + "w1", 16 << 20)])
        f = g.op(p + "relu", 10, 4 * act, [f])
        f = g.op(p + "ffn2", 160, act, [f, g.weight(p + "w2", 16 << 20)])
        h = _layer_norm(g, p + "ln2/", g.op(p + "residual2", 5, act, [f, x]), act)
    return g.graph()


def _layer_norm(g: _Ops, p: str, x: int, act: float) -> int:
    mean = g.op(p + "mean", 5, act / 64, [x])
    centred = g.op(p + "centred", 5, act, [x, mean])
    var = g.op(p + "variance", 5, act / 64, [g.op(p + "square", 5, act, [centred])])
    y = g.op(p + "normed", 5, act, [centred, g.op(p + "rsqrt", 3, act / 64, [var])])
    y = g.op(p + "scaled", 5, act, [y, g.weight(p + "gamma", 4096)])
    return g.op(p + "shifted", 5, act, [y, g.weight(p + "beta", 4096)])


def unrolled_rnn(steps: int, layers: int = 2, seed: int = 0, hidden: int = 1024) -> OpGraph:
    """A multi-layer LSTM unrolled over `steps` (14 ops per cell, one weight and bias per layer)."""
    g = _Ops(seed)
    act = 64 * hidden * 4  # batch 64
    weights = [(g.weight(f"layer{l}/kernel", 8 * hidden * hidden * 4), g.weight(f"layer{l}/bias", 16 * hidden))
               for l in range(layers)]
    state = [(g.op(f"layer{l}/h0", 1, act), g.op(f"layer{l}/c0", 1, act)) for l in range(layers)]
    for t in range(steps):
        x = g.op(f"t{t}/input", 2, act)
        for l, (kernel, bias) in enumerate(weights):
            p = f"t{t}/layer{l}/"
            h, c = state[l]
            z = g.op(p + "concat", 5, 2 * act, [x, h])
            z = g.op(p + "matmul", 120, 4 * act, [z, kernel])
            z = g.op(p + "bias_add", 8, 4 * act, [z, bias])
            gates = g.op(p + "split", 4, 4 * act, [z])
            i = g.op(p + "input_gate", 4, act, [gates])
            f = g.op(p + "forget_gate", 4, act, [gates])
            o = g.op(p + "output_gate", 4, act, [gates])
            j = g.op(p + "candidate", 4, act, [gates])
            c = g.op(p + "new_c", 6, act, [g.op(p + "keep", 4, act, [f, c]), g.op(p + "write", 4, act, [i, j])])
            h = g.op(p + "new_h", 4, act, [o, g.op(p + "tanh_c", 4, act, [c])])
            state[l] = (h, c)
            x = h
        g.op(f"t{t}/output", 10, act, [x])
    return g.graph()


# ---------------------------------------------------------------- measurements (one per process)

_DEVICES = 4
_TIMEOUT_S = 300.0


def _graph(family: str, size: int) -> OpGraph:
    if family == "model":
        return model_graph(size, seed=size)
    if family == "rnn":
        return unrolled_rnn(steps=max(1, size // 54), layers=4, seed=size)  # 54 ops per step
    from layered import layered_graph

    return layered_graph(size, seed=size)


def _cluster() -> Cluster:
    return Cluster.homogeneous(_DEVICES, 16 << 30)


def _preload() -> None:
    """Imports the solvers before any clock starts (scipy.optimize alone takes ~0.4 s)."""
    import cvxopt.solvers  # noqa: F401
    import scipy.optimize  # noqa: F401


def measure_lp(family: str, size: int, how: str) -> dict:
    """Build (and solve) the LP of one graph: how = 'build', a back end, a HiGHS method
    ('highs-ds', 'highs-ipm') or 'pieces:<back end>'."""
    from baechi_tf.sct.lp import build_sct_lp
    from baechi_tf.sct.relaxation import solve_sct_relaxation
    from baechi_tf.sct.solvers import mosek_licence_problem, solve_lp

    graph, cluster = _graph(family, size), _cluster()
    graph.topo_order, graph.num_tensors  # derived arrays: part of the graph, not of the LP
    _preload()
    if how.startswith("pieces:"):
        t0 = time.perf_counter()
        r = solve_sct_relaxation(graph, cluster, solver=how.split(":")[1])
        return {"s": time.perf_counter() - t0, "w": r.w_us, "lps": r.num_lps, "lp_arcs": r.lp_arcs}
    if how == "mosek" and mosek_licence_problem():
        return {"skip": "no licence"}
    t0 = time.perf_counter()
    lp = build_sct_lp(graph, cluster)
    t1 = time.perf_counter()
    out = {"ops": graph.num_ops, "arcs": lp.num_arcs, "rows": lp.num_rows, "build_s": t1 - t0}
    if how.startswith("highs-"):
        from scipy.optimize import linprog

        # One HiGHS method alone, without the back end's pivot budget and fallback.
        res = linprog(lp.c, A_ub=lp.A_ub, b_ub=lp.b_ub, bounds=np.column_stack((lp.lower, lp.upper)),
                      method=how)
        out["s"] = time.perf_counter() - t1
        out["w"] = float(res.fun) * lp.time_unit_us
        out["pivots_per_row"] = res.nit / lp.num_rows
    elif how != "build":
        out["w"] = solve_lp(lp, how).w_us
        out["s"] = time.perf_counter() - t1
    return out


def measure_place(family: str, size: int, method: str, placer_type: str) -> dict:
    """The placement pipeline with one method; m-SCT uses HiGHS."""
    from baechi_tf.placer.pipeline import PlacementOptions, place

    graph, cluster = _graph(family, size), _cluster()
    _preload()
    grouper = "coplace" if placer_type == "fusion" else "tf"
    options = PlacementOptions(placement_method=method, lp_solver="highs", placer_type=placer_type, grouper=grouper)
    t0 = time.perf_counter()
    result = place(graph, cluster, options)
    one = result.single_device_makespan_us
    return {
        "s": time.perf_counter() - t0,
        "group_s": result.step_seconds["group"],
        "place_s": result.step_seconds["place"],
        "ratio": result.makespan_us / result.lower_bound_us,
        "one_ratio": None if one is None else one / result.lower_bound_us,
        "ops": graph.num_ops,
    }


def measure_fusion(size: int) -> dict:
    from baechi_tf.placer.fusion import fuse
    from baechi_tf.placer.grouping import coplace

    graph = _graph("rnn", size)
    t0 = time.perf_counter()
    groups = coplace(graph)
    t1 = time.perf_counter()
    fused = fuse(graph, groups)
    t2 = time.perf_counter()
    return {"ops": graph.num_ops, "groups": groups.num_groups, "fused": fused.graph.num_ops,
            "group_s": t1 - t0, "fuse_s": t2 - t1}


def _run(*args: str) -> dict:
    """One measurement in a fresh process, or {'skip': why} when it fails or runs too long."""
    cmd = [sys.executable, os.path.abspath(__file__), "--one", *args]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"skip": f"> {_TIMEOUT_S:.0f} s"}
    if done.returncode != 0:
        return {"skip": (done.stderr.strip().splitlines() or ["failed"])[-1][:60]}
    return json.loads(done.stdout)


def _cell(result: dict, key: str = "s") -> str:
    return result["skip"] if "skip" in result else f"{result[key]:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,10000,30000",
                        help="comma-separated op counts of the graphs (default: %(default)s)")
    parser.add_argument("--quick", action="store_true", help="model graphs only, no whole-LP HiGHS above 10k")
    parser.add_argument("--one", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        kind, *rest = args.one
        if kind == "lp":
            out = measure_lp(rest[0], int(rest[1]), rest[2])
        elif kind == "place":
            out = measure_place(rest[0], int(rest[1]), rest[2], rest[3])
        else:
            out = measure_fusion(int(rest[0]))
        print(json.dumps(out))
        return

    sizes = flags.sizes(parser, args.sizes)
    families = ["model"] if args.quick else ["model", "layered"]
    print(f"m-SCT LP, {_DEVICES} devices; seconds, solver imports excluded (each cell a fresh process,")
    print(f"cut off at {_TIMEOUT_S:.0f} s); MOSEK is skipped without a licence")
    print("whole = one LP for the graph; pieces = the default path (exact reductions, pieces solved in turn)")
    print(f"{'graph':<9}{'ops':>7}{'arcs':>7}{'rows':>8}{'build':>7}{'HiGHS':>10}{'DS':>8}{'pivots/row':>11}"
          f"{'IPM':>8}{'cvxopt':>10}{'MOSEK':>12}{'pieces HiGHS':>14}{'pieces cvxopt':>15}{'LPs':>6}{'LP arcs':>9}")
    for family in families:
        for size in sizes:
            built = _run("lp", family, str(size), "build")
            cells = {}
            for how in ("highs", "highs-ds", "highs-ipm", "cvxopt", "mosek", "pieces:highs", "pieces:cvxopt"):
                if how.startswith("highs") and family == "layered" and size > 10_000:
                    cells[how] = {"skip": "skipped"}  # minutes: see the note below
                    continue
                cells[how] = _run("lp", family, str(size), how)
            pieces, ds = cells["pieces:highs"], cells["highs-ds"]
            per_row = f"{ds['pivots_per_row']:.2f}" if "pivots_per_row" in ds else "-"
            print(f"{family:<9}{built['ops']:>7}{built['arcs']:>7}{built['rows']:>8}{built['build_s']:>7.2f}"
                  f"{_cell(cells['highs']):>10}{_cell(ds):>8}{per_row:>11}{_cell(cells['highs-ipm']):>8}"
                  f"{_cell(cells['cvxopt']):>10}{_cell(cells['mosek']):>12}"
                  f"{_cell(pieces):>14}{_cell(cells['pieces:cvxopt']):>15}"
                  f"{pieces.get('lps', '-'):>6}{pieces.get('lp_arcs', '-'):>9}")
            optima = [c["w"] for c in cells.values() if "w" in c]
            if optima and max(optima) - min(optima) > 1e-5 * max(optima):
                print(f"  optima differ: {optima}")
    if not args.quick:
        print("layered above 10k ops: whole-LP HiGHS skipped (at 10k dual simplex alone takes over a")
        print("minute: several pivots per row, at a cost growing with the LP; the graph has no cut op).")
        print("HiGHS = the back end m-SCT uses: DS for LPs of <= 5000 arcs; above, DS for at most one")
        print("pivot per row, then IPM from the start if DS is not done")

    print()
    print("Placement pipeline (validate, group, place, check, baseline), m-SCT with HiGHS; seconds.")
    print("'place' is the placer itself (m-SCT: LP, rounding, scheduling; with fusion also fusing);")
    print("fusion uses the coplace grouper, whose time is in 'group'. Ratios: simulated makespan over")
    print("the lower bound max(critical path, compute / devices), for the placement and for one device.")
    print(f"{'graph':<9}{'ops':>7}{'placer':>8}{'type':>8}{'total':>8}{'group':>8}{'place':>8}"
          f"{'makespan/bound':>16}{'1 device/bound':>16}")
    cases = [("model", 8000), ("model", 30000), ("layered", 8000), ("rnn", 8000)]
    if args.quick:
        cases = cases[:2]
    for family, size in cases:
        for method in ("m_sct", "m_etf"):
            for placer_type in ("default", "fusion"):
                r = _run("place", family, str(size), method, placer_type)
                ops = r.get("ops", "-")
                ratio = "-" if "skip" in r else f"{r['ratio']:.3f}"
                one = "-" if r.get("one_ratio") is None else f"{r['one_ratio']:.3f}"
                print(f"{family:<9}{ops:>7}{method:>8}{placer_type:>8}{_cell(r):>8}{_cell(r, 'group_s'):>8}"
                      f"{_cell(r, 'place_s'):>8}{ratio:>16}{one:>16}")

    print()
    print("Fusion of an unrolled 4-layer LSTM (coplace groups, then fuse); seconds")
    print(f"{'ops':>7}{'groups':>8}{'fused':>7}{'fused/ops':>11}{'group':>7}{'fuse':>7}")
    for size in sizes:
        r = _run("fusion", str(size))
        print(f"{r['ops']:>7}{r['groups']:>8}{r['fused']:>7}{r['fused'] / r['ops']:>11.3f}"
              f"{r['group_s']:>7.2f}{r['fuse_s']:>7.2f}")


if __name__ == "__main__":
    main()
