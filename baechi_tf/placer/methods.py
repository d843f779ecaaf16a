"""The registry of placement methods: name -> placer, paper, what it needs.

`BUILTIN` is one immutable `Registry` of frozen `Method` records. The command lines' choices
(`PLACEMENT_METHODS`), `PlacementOptions.validate`, auto's portfolio (`Registry.portfolio`, in
the order that breaks ties) and the methods table of the docs (`methods_table`, rendered by
docs/hooks/tables.py) all read it. `register_method` (for a placer of one's own) swaps in a new
registry made by `Registry.with_method`; no registry is ever changed in place, and `current()`
is the one in force. A method replaced so is no longer built-in: auto runs it without a cutoff
and in this process only (`auto.candidates.in_worker`), and the pipeline simulates its placement
(no `own_schedule`).

A placer is ``place(graph, cluster, groups, options) -> Placement``; one with ``cutoff`` also
takes ``cutoff_us`` after the options, which auto passes to stop it early.
"""

from __future__ import annotations

import dataclasses
import math
import types
from typing import Callable, Iterator, Mapping, Optional

from baechi_tf.cluster import Cluster
from baechi_tf.errors import ConfigError, InfeasiblePlacementError
from baechi_tf.graph import OpGraph
from baechi_tf.placer.grouping import Groups
from baechi_tf.placer.heft import place_heft
from baechi_tf.placer.layers import place_layers
from baechi_tf.placer.m_etf import METFOptions, place_m_etf, schedule_m_etf
from baechi_tf.placer.m_topo import MTopoOptions, place_m_topo
from baechi_tf.placer.pack import place_packed
from baechi_tf.placer.schedule import Placement, Schedule
from baechi_tf.placer.simulator import single_device_schedule

__all__ = [
    "BUILTIN", "PLACEMENT_METHODS", "Method", "Registry", "current", "methods_table", "not_ported",
    "register_method", "single_schedule",
]

Place = Callable[..., Placement]  # (graph, cluster, groups, options[, cutoff_us]) -> Placement


@dataclasses.dataclass(frozen=True)
class Method:
    """One placement method."""

    name: str  # --placement_method
    place: Place  # (graph, cluster, groups, options[, cutoff_us]) -> Placement
    paper: str = "none"  # where the algorithm comes from
    does: str = ""  # what it does, in one sentence
    when: str = ""  # when to use it
    needs: str = "nothing"  # what it needs besides a graph and a cluster
    cutoff: bool = False  # `place` takes cutoff_us (auto stops a hopeless run early)
    # the placement with its own list-scheduler schedule under the simulator's model, which the
    # pipeline checks instead of simulating the placement again (m-ETF on a 16k-op DenseNet: half
    # of the time to place it); not m-SCT's, whose run holds devices for favourite children
    own_schedule: Optional[Callable[..., Schedule]] = None


class Registry(Mapping[str, Method]):
    """An immutable mapping of method names to `Method` records, with auto's portfolio: the
    methods it runs on every graph, in the order that breaks ties."""

    __slots__ = ("_methods", "portfolio")

    def __init__(self, methods: tuple[Method, ...], portfolio: tuple[str, ...]):
        object.__setattr__(self, "_methods", types.MappingProxyType({m.name: m for m in methods}))
        object.__setattr__(self, "portfolio", tuple(portfolio))

    def __setattr__(self, name, value):
        raise AttributeError("a Registry is immutable: make a new one with with_method")

    def __getitem__(self, name: str) -> Method:
        return self._methods[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._methods)

    def __len__(self) -> int:
        return len(self._methods)

    def with_method(self, name: str, place: Place) -> "Registry":
        """A registry with `name` added, or replaced, by a placer without a cutoff."""
        method = Method(name, place, paper="user's", does="registered with register_method")
        methods = [m for m in self._methods.values() if m.name != name] + [method]
        if name in self._methods:  # in place, so that the order stays
            methods = [method if m.name == name else m for m in self._methods.values()]
        return Registry(tuple(methods), self.portfolio)

    def in_portfolio(self) -> list[str]:
        """The portfolio's methods that this registry has, in the portfolio's order."""
        return [m for m in self.portfolio if m in self._methods]


def single_schedule(graph: OpGraph, cluster: Cluster, groups: Groups) -> Schedule:
    """The schedule of everything on one device (pinned ops where pinned); a clear error when
    the graph fits on no one device."""
    schedule = single_device_schedule(graph, cluster, groups)
    if schedule is None:
        if cluster.num_devices == 1:
            raise InfeasiblePlacementError(
                f"the graph does not fit on the only device, {cluster.names[0]} "
                f"({cluster.devices[0].memory_bytes / 2**20:,.2f} MiB); use more devices or give it "
                "more memory"
            )
        raise InfeasiblePlacementError(
            "the graph does not fit on one device; use a multi-device method such as m_etf"
        )
    return schedule


def _single(graph: OpGraph, cluster: Cluster, groups: Groups, options) -> Placement:
    return single_schedule(graph, cluster, groups).placement


def expert(graph: OpGraph, cluster: Cluster, groups: Groups, options) -> Placement:
    """The model's own layout (op name -> device), completed by TF's rule: an op without one
    goes where its group or its first placed input went, else to the first device."""
    if not options.expert:
        raise ConfigError(
            "placement method 'expert' needs a hand layout and none was given: give "
            "PlacementOptions(expert={op name: device name}) (train.py gives its model's own), or "
            "choose another method"
        )
    device_of = [-1] * graph.num_ops
    for name, device in options.expert.items():
        op = graph.index.get(name)
        if op is not None:
            device_of[op] = cluster.device_index(device)
    group_device: dict[int, int] = {}
    for op in graph.topo_order.tolist():
        g = int(groups.group_of[op])
        if device_of[op] < 0:
            if g in group_device:
                device_of[op] = group_device[g]
            else:
                placed = [device_of[p] for p in graph.predecessors[op] if device_of[p] >= 0]
                device_of[op] = placed[0] if placed else 0
        group_device.setdefault(g, device_of[op])
    for g, members in enumerate(groups.members):  # one device per group: the first member's
        for op in members.tolist():
            device_of[op] = device_of[int(members[0])]
    for op, name in enumerate(graph.pinned_device):
        if name is not None and cluster.find(name) != device_of[op]:
            raise InfeasiblePlacementError(f"the expert layout moves pinned op {graph.names[op]!r}")
    return Placement(device_of, "expert")


def _m_etf(graph: OpGraph, cluster: Cluster, groups: Groups, options, cutoff_us: float = math.inf) -> Placement:
    return place_m_etf(graph, cluster, groups, options=METFOptions(cutoff_us=cutoff_us))


# In auto's portfolio m-SCT gives up (SolverError, skipped) on an LP piece of more than this many
# arcs with a choice and rows of control-only arcs (`relaxation._check_size`), a bound on its work
# that does not depend on the machine: such a piece is solved by
# cvxopt when its normal equations are sparse and by HiGHS's budgeted simplex or interior point
# otherwise (`baechi_tf.sct.solvers`), which can take a second (layered graphs of 10k ops) to
# some 15 s (a DenseNet121 step's 65k-arc piece, by interior point) of auto's budget.
_AUTO_MAX_LP_ARCS = 5000


def _m_sct(graph: OpGraph, cluster: Cluster, groups: Groups, options, cutoff_us: float = math.inf) -> Placement:
    from baechi_tf.placer.m_sct import MSCTOptions, place_m_sct  # scipy loads when m-SCT runs

    limit = _AUTO_MAX_LP_ARCS if options.placement_method == "auto" else None
    sct = MSCTOptions(
        threshold=options.sct_threshold, lp_solver=options.lp_solver, max_lp_arcs=limit,
        lp_time_limit_s=options.lp_time_limit, cutoff_us=cutoff_us,
    )
    return place_m_sct(graph, cluster, groups, options=sct)


def _m_topo_nonuniform(graph: OpGraph, cluster: Cluster, groups: Groups, options) -> Placement:
    """The original's variant of m-TOPO: each device filled to its capacity in turn, not to an
    equal share of the graph's memory."""
    placement = place_m_topo(graph, cluster, groups, options=MTopoOptions(uniform=False))
    return Placement(placement.device_of, "m_topo_nonuniform")


def _auto(graph: OpGraph, cluster: Cluster, groups: Groups, options) -> Placement:
    from baechi_tf.placer.auto import run_auto  # auto's portfolio reads this registry

    return run_auto(graph, cluster, groups, options).placement


BUILTIN = Registry(
    (
        Method(
            "m_topo", lambda g, c, gr, o: place_m_topo(g, c, gr), "Baechi, SoCC 2020, section 4.1",
            "fills the devices in turn with topological slices of equal memory; ignores compute and "
            "communication", "the fastest baseline; graphs that only need to fit",
        ),
        Method(
            "m_topo_nonuniform", _m_topo_nonuniform, "the original Baechi's variant",
            "m-TOPO filling each device to its capacity in turn instead of to an equal share",
            "reproducing the original; few large devices",
        ),
        Method(
            "m_etf", _m_etf, "Baechi, section 4.2; ETF: Hwang, Chow, Anger and Lee, SIAM J. Comput. 18(2), 1989",
            "schedules the ready op that can start first on the device where it starts first, only "
            "where it fits", "a good, fast time-driven placement; without memory limits ETF is within "
            "(2 - 1/m) of the optimum plus the longest chain of communication",
            cutoff=True, own_schedule=lambda g, c, gr, o: schedule_m_etf(g, c, gr),
        ),
        Method(
            "m_sct", _m_sct, "Baechi, section 4.3; SCT: Hanen and Munier, ETFA 1995 (Discrete Applied "
            "Mathematics 108(3), 2001)", "solves an LP relaxation for each op's *favourite child*, keeps "
            "that child on the op's device, otherwise schedules like m-ETF", "graphs whose copies are "
            "cheap against their ops; its LP grows with the edges (`--lp_solver`, `--lp_time_limit`)",
            needs="scipy (HiGHS), or cvxopt or MOSEK (`--lp_solver`)", cutoff=True,
        ),
        Method(
            "heft", lambda g, c, gr, o: place_heft(g, c, gr), "Topcuoglu, Hariri and Wu, IEEE TPDS 13(3), 2002",
            "list scheduling by upward rank (critical path first), each op where it finishes first",
            "costly communication, where it keeps a chain together that m-ETF spreads",
        ),
        Method(
            "layers", lambda g, c, gr, o: place_layers(g, c, gr),
            "the hand layout of GNMT (Wu et al., 2016) that Baechi compares against",
            "each numbered layer (`layer_0/`, `l1/`, ...) whole on one device, the other ops beside the "
            "layer they exchange most with", "deep recurrent and layered models with numbered name scopes",
            needs="numbered name scopes (`layer_0/`, `l1/`, ...)",
        ),
        Method(
            "packed", lambda g, c, gr, o: place_packed(g, c, gr), does="memory-first packing of whole "
            "groups, nothing counted as freed", when="a placement that must fit whatever the order ops "
            "run in",
        ),
        Method(
            "single", _single, does="everything on one device (the pinned ops stay pinned)",
            when="the baseline every summary compares with", needs="a device the graph fits on",
            own_schedule=lambda g, c, gr, o: single_schedule(g, c, gr),
        ),
        Method(
            "expert", expert, does="the model's own hand layout (`train.py`, `PlacementOptions(expert="
            "{op: device})`)", when="comparing with a layout of your own; not in `baechi place` and "
            "`place-json`", needs="a hand layout, `PlacementOptions(expert=...)`",
        ),
        Method(
            "auto", _auto, "beyond Baechi", "runs all of the above, keeps the lowest simulated step "
            "time, then refines it", "the default: never slower than the best of them, nor than one "
            "device when the graph fits there",
        ),
    ),
    portfolio=("m_topo", "m_etf", "m_sct", "heft", "single", "packed", "m_topo_nonuniform"),
)

_current = BUILTIN  # the registry in force (`register_method` swaps it)


def current() -> Registry:
    """The registry in force: `BUILTIN`, unless `register_method` added or replaced a method."""
    return _current


def register_method(name: str, place: Place) -> None:
    """Adds a placement method, or replaces one (auto then runs it without a cutoff, and in this
    process only)."""
    global _current
    _current = _current.with_method(name, place)


class _Placers(Mapping[str, Place]):
    """The registry in force as name -> placer, read-only (--help, validation, the benches)."""

    def __getitem__(self, name: str) -> Place:
        return _current[name].place

    def __iter__(self) -> Iterator[str]:
        return iter(_current)

    def __len__(self) -> int:
        return len(_current)


PLACEMENT_METHODS: Mapping[str, Place] = _Placers()

# The original's placement methods that are not here, and what to use instead.
_RESERVE = (
    "it reserved memory for each group when the group was first placed; here {0} places a group "
    "only while its weights leave room for tensors, and retries with more room when memory runs "
    "out. Use {0}"
)
_NOT_PORTED = types.MappingProxyType(
    {"m_etf_reserve": _RESERVE.format("m_etf"), "m_sct_reserve": _RESERVE.format("m_sct")}
)


def not_ported(name: str) -> Optional[str]:
    """Why the original's method `name` is not here and what to use instead; None for others."""
    return _NOT_PORTED.get(name)


def methods_table(registry: Registry = BUILTIN) -> str:
    """The docs' table of the methods (docs/methods.md), one row per method of `registry`."""
    rows = ["| method | paper | what it does | when to use it | needs |", "|---|---|---|---|---|"]
    for m in registry.values():
        rows.append(f"| `{m.name}` | {m.paper} | {m.does} | {m.when} | {m.needs} |")
    return "\n".join(rows)
