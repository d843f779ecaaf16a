"""How far from the best placement? A CP-SAT model of the simulator, solved beside auto.

For each small graph of bench/quality_graphs.py, OR-Tools' CP-SAT solves a relaxation of the
simulator (`simulator.simulate`) over every placement at once:

* each op runs on one device, one op at a time, for its compute time;
* a tensor is sent to a device at most once, when a consumer there needs it, at or after its
  producer's end, and occupies the channels of both devices for ``transfer_us(bytes)``; a
  consumer starts after its tensors are on its device.

It drops what the simulator adds: memory limits, TF's colocation groups and the rule that ops run
in earliest-start order (the model may hold an op back). Times are in tenths of a microsecond,
rounded down. Every simulated schedule of every placement is therefore a solution of the model,
so the solver's proven bound is a bound on the makespan of any placement, and an OPTIMAL status
means no placement does better. Its best solution is printed too; it may use an op order that
TensorFlow does not follow (the simulated makespan of its placement is printed beside it).

The figures are all divided by `bounds.lower_bound_us` (the bound of bench/quality.py), so
they read as that table does. The model needs the same link between every two devices.

OR-Tools pins an older protobuf than TensorFlow's, so it runs in its own environment:

    make bench-optimality            # makes .venv-cp, then runs this with its defaults
    .venv-cp/bin/python bench/optimality.py [--graphs rnn-4x20,...] [--seconds 60]
    .venv-cp/bin/python bench/optimality.py --check_model --seconds 60   # the claim above
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

try:
    from ortools.sat.python import cp_model
except ImportError:  # reported by main, after --help
    cp_model = None

from baechi_tf.cluster import Cluster  # noqa: E402
from baechi_tf.errors import InfeasiblePlacementError  # noqa: E402
from baechi_tf.graph import OpGraph  # noqa: E402
from baechi_tf.placer.pipeline import PlacementOptions, place  # noqa: E402
from baechi_tf.placer.schedule import Placement, Schedule  # noqa: E402
from baechi_tf.placer.simulator import simulate  # noqa: E402
from quality_graphs import cases  # noqa: E402

SMALL = ("fork-join-16x5", "rnn-4x20", "rnn-8x30", "transformer-4x8", "comm-heavy-200")
TICKS_PER_US = 10


def _ticks(us: float) -> int:
    return int(math.floor(us * TICKS_PER_US))


def _one_link(cluster: Cluster):
    """The link every two devices share; the model has one transfer time per tensor."""
    nd = cluster.num_devices
    links = {cluster.link(a, b) for a in range(nd) for b in range(nd) if a != b}
    if len(links) != 1:
        raise SystemExit(f"bench/optimality.py: the model needs one link between all devices, "
                         f"the cluster has {len(links)}")
    return links.pop()


class RelaxedModel:
    """The CP-SAT model of the module docstring for `graph` on `cluster`."""

    def __init__(self, graph: OpGraph, cluster: Cluster):
        n, k = graph.num_ops, cluster.num_devices
        link = _one_link(cluster)
        self.graph, self.num_devices = graph, k
        dur = [_ticks(c) for c in graph.compute_us.tolist()]
        producer = graph.tensor_src.tolist()
        consumers = graph.tensor_consumers
        length = [_ticks(link(b)) for b in graph.tensor_bytes.tolist()]
        horizon = sum(dur) + k * sum(length) + 1
        m = self.model = cp_model.CpModel()
        self.start = [m.NewIntVar(0, horizon, f"start{v}") for v in range(n)]
        self.on = [[m.NewBoolVar(f"op{v}_on{d}") for d in range(k)] for v in range(n)]
        end = [self.start[v] + dur[v] for v in range(n)]
        runs: list[list] = [[] for _ in range(k)]
        channel: list[list] = [[] for _ in range(k)]
        for v in range(n):
            m.AddExactlyOne(self.on[v])
            for d in range(k):
                runs[d].append(m.NewOptionalFixedSizeIntervalVar(self.start[v], dur[v], self.on[v][d], ""))
        for t in range(graph.num_tensors):
            u, w = producer[t], length[t]
            for v in consumers[t]:
                m.Add(self.start[v] >= end[u])
            for d in range(k):
                # Sent to d: at least when a consumer is on d and the producer is not (the model
                # may send more; that only costs channel time).
                sent = m.NewBoolVar("")
                m.AddImplication(sent, self.on[u][d].Not())
                for v in consumers[t]:
                    m.Add(sent >= self.on[v][d] - self.on[u][d])
                at = m.NewIntVar(0, horizon, "")
                m.Add(at >= end[u]).OnlyEnforceIf(sent)
                for v in consumers[t]:
                    m.Add(self.start[v] >= at + w).OnlyEnforceIf([sent, self.on[v][d]])
                channel[d].append(m.NewOptionalFixedSizeIntervalVar(at, w, sent, ""))
                for a in range(k):  # the sender's channel: the producer's device
                    if a != d:
                        from_a = m.NewBoolVar("")
                        m.AddBoolAnd([sent, self.on[u][a]]).OnlyEnforceIf(from_a)
                        m.AddBoolOr([sent.Not(), self.on[u][a].Not(), from_a])
                        channel[a].append(m.NewOptionalFixedSizeIntervalVar(at, w, from_a, ""))
        for d in range(k):
            m.AddNoOverlap(runs[d])
            m.AddNoOverlap(channel[d])
        self.makespan = m.NewIntVar(0, horizon, "makespan")
        for v in range(n):
            m.Add(self.makespan >= end[v])
        # The devices are alike: the first op's device is called 0.
        self.first = int(graph.topo_order[0])
        m.Add(self.on[self.first][0] == 1)
        m.Minimize(self.makespan)

    def _each_op(self, schedule: Schedule):
        """(op, its device, its start in ticks) of `schedule`, devices renamed so that the first
        op is on 0, as the model has it."""
        device = schedule.placement.device_of.tolist()
        rename = {device[self.first]: 0}
        for d in range(self.num_devices):
            rename.setdefault(d, len(rename))
        for v, d in enumerate(device):
            yield v, rename[d], _ticks(float(schedule.start_us[v]))

    def hint(self, schedule: Schedule) -> None:
        """Starts the search from a simulated schedule."""
        for v, d, start in self._each_op(schedule):
            for e in range(self.num_devices):
                self.model.AddHint(self.on[v][e], int(d == e))
            self.model.AddHint(self.start[v], start)

    def fix(self, schedule: Schedule) -> None:
        """Pins the placement and the starts to `schedule`'s (for --check_model)."""
        for v, d, start in self._each_op(schedule):
            self.model.Add(self.on[v][d] == 1)
            self.model.Add(self.start[v] == start)

    def solve(self, seconds: float, workers: int):
        """(status name, best makespan us, proven bound us, best placement or None, seconds)."""
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = seconds
        solver.parameters.num_workers = workers
        t0 = time.perf_counter()
        status = solver.Solve(self.model)
        took = time.perf_counter() - t0
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return solver.StatusName(status), math.inf, solver.BestObjectiveBound() / TICKS_PER_US, None, took
        device = [next(d for d, x in enumerate(row) if solver.Value(x)) for row in self.on]
        placement = Placement(device_of=np.asarray(device, dtype=np.int32), method="cp_sat")
        return (solver.StatusName(status), solver.ObjectiveValue() / TICKS_PER_US,
                solver.BestObjectiveBound() / TICKS_PER_US, placement, took)


def check_model(wanted: list[str], known: dict, seconds: float, workers: int) -> int:
    """Pins the model to simulated schedules (all on one device, a seeded random placement, ops
    striped over the devices): each must be a solution, or the proven bounds mean nothing."""
    rng = np.random.default_rng(0)
    infeasible = 0
    print("simulated schedules pinned in the model (each must be a solution):")
    for name in wanted:
        graph, cluster = known[name]
        n, k = graph.num_ops, cluster.num_devices
        tries = {"one device": np.zeros(n), "random": rng.integers(0, k, n), "striped": np.arange(n) // 3 % k}
        for label, device in tries.items():
            try:
                schedule = simulate(graph, cluster, Placement(device_of=device.astype(np.int32), method=label))
            except InfeasiblePlacementError:
                print(f"  {name:<18}{label:<12}does not fit")
                continue
            model = RelaxedModel(graph, cluster)
            model.fix(schedule)
            status, best, _, _, took = model.solve(seconds, workers)
            infeasible += status == "INFEASIBLE"
            print(f"  {name:<18}{label:<12}{status:<11}simulated {schedule.makespan_us:.1f} us, "
                  f"model {best:.1f} us ({took:.1f} s)", flush=True)
    if infeasible:
        print(f"CHECK FAILED: {infeasible} simulated schedule(s) are not solutions of the model")
    return 1 if infeasible else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--graphs", default=",".join(SMALL),
                        help="comma-separated names from bench/quality_graphs.py (default: %(default)s)")
    parser.add_argument("--seconds", type=float, default=180.0, help="CP-SAT time per graph (default: %(default)s)")
    parser.add_argument("--workers", type=int, default=2, help="CP-SAT threads (default: %(default)s)")
    parser.add_argument("--refine_seconds", type=float, default=3.0, help="auto's refinement (default: %(default)s)")
    parser.add_argument("--check_model", action="store_true",
                        help="instead of solving, check that simulated schedules are solutions of the model "
                             "(--seconds each; UNKNOWN: ran out of time, not a failure)")
    args = parser.parse_args()
    if cp_model is None:
        parser.exit(2, "bench/optimality.py needs OR-Tools: run it with `make bench-optimality`, which "
                       "installs it into .venv-cp (beside TensorFlow's protobuf it cannot install)\n")
    wanted = [g for g in args.graphs.split(",") if g]
    known = {name: (graph, cluster) for name, graph, cluster in cases()}
    unknown = [g for g in wanted if g not in known]
    if unknown:
        parser.error(f"unknown graph(s) {', '.join(unknown)}; choose from {', '.join(known)}")
    if args.check_model:
        return check_model(wanted, known, args.seconds, args.workers)
    print(f"CP-SAT {args.seconds:g} s per graph on {args.workers} threads; all figures are makespan / "
          "lower bound (bench/quality.py's)")
    header = (f"{'graph':<18}{'ops':>5}{'m_etf':>8}{'auto':>8}{'cp best':>9}{'cp placed':>11}"
              f"{'no placement below':>20}  status")
    print(header)
    print("-" * len(header))
    for name in wanted:
        graph, cluster = known[name]
        auto = place(graph, cluster, PlacementOptions(placement_method="auto", refine_seconds=args.refine_seconds))
        m_etf = place(graph, cluster, PlacementOptions(placement_method="m_etf"))
        bound = auto.lower_bound_us
        model = RelaxedModel(graph, cluster)
        model.hint(auto.schedule)
        status, best, proven, placement, _ = model.solve(args.seconds, args.workers)
        placed = "-"
        if placement is not None:
            try:  # the solver's placement run as TensorFlow would: earliest start first
                placed = f"{simulate(graph, cluster, placement).makespan_us / bound:.3f}"
            except InfeasiblePlacementError:
                placed = "no fit"
        print(f"{name:<18}{graph.num_ops:>5}{m_etf.makespan_us / bound:>8.3f}{auto.makespan_us / bound:>8.3f}"
              f"{best / bound:>9.3f}{placed:>11}{proven / bound:>20.3f}  {status}", flush=True)
    print("\ncp best: the model's best schedule, in any op order; cp placed: its placement simulated; "
          "no placement below: the solver's proven bound on every placement (under 1: weaker than "
          "the lower bound itself; OPTIMAL: equal to cp best)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
