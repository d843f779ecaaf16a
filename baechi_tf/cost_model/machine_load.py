"""How much of this machine's CPU time other work took while steps were profiled.

A traced op's time is wall time. Where other processes, or a hypervisor's other guests, compete
for the CPUs, TensorFlow's threads wait for them and the ops that run meanwhile look slower, by as
much as the competition was heavy while each ran: not a uniform factor that leaves a placement's
choices alone. A profile keeps the measure (`CostProfile.machine_load`), the profiling run warns
when it is high (`BUSY_SHARE`), and the placement's summary says so.

Measured from the kernel's counters over the profiled steps, on Linux (``/proc/stat``): the busy
time of all of the machine's CPUs (user, nice, system, irq, softirq; a guest's time is in user
already) and the time a hypervisor gave the CPUs to others (steal), less the CPU time of this
process (all its threads, TensorFlow's pools among them) and of its descendants (worker tasks it
started, `rewriter.distributed.local_workers`) over the same span. Elsewhere, or where the
counters cannot be read, the load is unknown (None). The counters tick every
1 / ``SC_CLK_TCK`` s (10 ms), so a span shorter than `MIN_SPAN_S` is not judged.

Only this machine is measured: the tasks of a cluster on other hosts are not, and tasks on this
one that another program started count as other work.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Optional

__all__ = ["BUSY_SHARE", "MIN_SPAN_S", "LoadMeter", "MachineLoad", "busy_warning", "cpu_counters"]

BUSY_SHARE = 0.25
"""Share of the machine's CPU time that other work may take while steps are profiled before the
profile's op times are called suspect: on a machine of 2 CPUs, one other busy process takes 0.5."""

MIN_SPAN_S = 0.2
"""Shortest span whose load is judged. Each CPU's counters tick every 10 ms and so does this
process's own CPU time, so a share over a span of w seconds is uncertain by about 0.01 / w plus
0.02 / (w * CPUs): some 7% at 0.2 s on 2 CPUs, against `BUSY_SHARE` and the half that one busy
process takes there. A small model's profiling runs take a few tenths of a second."""

_STAT = "/proc/stat"


@dataclasses.dataclass(frozen=True)
class MachineLoad:
    """CPU time other work took on this machine over a span of `wall_s` seconds."""

    wall_s: float  # length of the span
    cpus: int  # CPUs the machine's counters cover
    others_cpu_s: float  # CPU seconds used by every process but this one (and the kernel for them)
    steal_s: float  # CPU seconds a hypervisor gave other guests

    @property
    def busy_cpus(self) -> float:
        """CPUs that other work kept busy, on average over the span."""
        return (self.others_cpu_s + self.steal_s) / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def share(self) -> float:
        """`busy_cpus` over the machine's CPUs, in [0, 1]."""
        return min(1.0, max(0.0, self.busy_cpus / self.cpus)) if self.cpus > 0 else 0.0

    @property
    def busy(self) -> bool:
        """Whether other work took at least `BUSY_SHARE` of the machine over a span long enough
        to tell (`MIN_SPAN_S`)."""
        return self.wall_s >= MIN_SPAN_S and self.share >= BUSY_SHARE

    def describe(self) -> str:
        """``"other work kept 1.02 of this machine's 2 CPUs busy (51%) over 3.4 s"``."""
        return (
            f"other work kept {max(self.busy_cpus, 0.0):.2f} of this machine's {self.cpus} CPUs busy "
            f"({100 * self.share:.0f}%) over {self.wall_s:.1f} s"
        )


def cpu_counters(text: str) -> tuple[int, int, int]:
    """(busy ticks, steal ticks, CPUs) from the text of ``/proc/stat``: the aggregate ``cpu``
    line's user + nice + system + irq + softirq, its steal, and the number of ``cpuN`` lines.
    `ValueError` when the text has no aggregate line of at least 8 counters."""
    busy = steal = None
    cpus = 0
    for line in text.splitlines():
        fields = line.split()
        if not fields:
            continue
        if fields[0] == "cpu":
            values = [int(v) for v in fields[1:]]
            if len(values) < 8:
                raise ValueError(f"{_STAT}: the cpu line has {len(values)} counters, not at least 8")
            user, nice, system, _idle, _iowait, irq, softirq, steal = values[:8]
            busy = user + nice + system + irq + softirq
        elif fields[0].startswith("cpu") and fields[0][3:].isdigit():
            cpus += 1
    if busy is None or steal is None:
        raise ValueError(f"{_STAT}: no aggregate cpu line")
    return busy, steal, cpus


def _read_counters() -> Optional[tuple[int, int, int]]:
    try:
        with open(_STAT) as f:
            return cpu_counters(f.read())
    except (OSError, ValueError):
        return None


def _own_cpu_s(tick: float) -> float:
    """CPU seconds of this process, of its children it waited for, and of its live descendants
    with theirs. O(processes on the machine): a read of each one's ``/proc/<pid>/stat``."""
    times = os.times()
    own = times.user + times.system + times.children_user + times.children_system
    parent: dict[int, int] = {}
    ticks: dict[int, int] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return own
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                text = f.read()
        except OSError:  # gone meanwhile, or not ours to read
            continue
        fields = text[text.rfind(")") + 2:].split()  # after the command, which may hold spaces
        if len(fields) < 15:
            continue
        pid = int(entry)
        parent[pid] = int(fields[1])
        ticks[pid] = sum(int(v) for v in fields[11:15])  # utime, stime, and its waited children's
    me = os.getpid()
    for pid, cpu in ticks.items():
        seen = 0
        up = parent.get(pid)
        while up is not None and up != me and seen < 64:
            up, seen = parent.get(up), seen + 1
        if up == me:
            own += cpu / tick
    return own


def _tick() -> float:
    return float(os.sysconf("SC_CLK_TCK")) if hasattr(os, "sysconf") else 100.0


class LoadMeter:
    """Measures `MachineLoad` from `start` to `stop`; usable once, or as a context manager
    (`load` is set on exit)."""

    def __init__(self) -> None:
        self._begin: Optional[tuple[float, float, tuple[int, int, int]]] = None
        self.load: Optional[MachineLoad] = None

    def start(self) -> "LoadMeter":
        counters = _read_counters()
        self._begin = None if counters is None else (time.monotonic(), _own_cpu_s(_tick()), counters)
        return self

    def stop(self) -> Optional[MachineLoad]:
        """The load since `start`; None where the counters cannot be read."""
        if self._begin is None:
            return None
        t0, own0, (busy0, steal0, cpus) = self._begin
        counters = _read_counters()
        if counters is None:
            return None
        busy1, steal1, _ = counters
        tick = _tick()
        wall, own = time.monotonic() - t0, _own_cpu_s(tick) - own0
        others = max(0.0, (busy1 - busy0) / tick - own)
        self.load = MachineLoad(wall_s=wall, cpus=cpus, others_cpu_s=others, steal_s=(steal1 - steal0) / tick)
        return self.load

    def __enter__(self) -> "LoadMeter":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


_PROFILE_SUSPECT = (
    "the op times they measured include waiting for the CPUs, unevenly, and the placement rests "
    "on them. Profile again with the machine otherwise idle"
)


def busy_warning(load: Optional[MachineLoad], what: str = "the traced steps",
                 consequence: str = _PROFILE_SUSPECT) -> Optional[str]:
    """The warning for steps that ran while other work took much of the machine
    (`MachineLoad.busy`), naming `what` ran then and what follows (by default, for a profile's
    steps: their op times are suspect); None otherwise."""
    if load is None or not load.busy:
        return None
    return f"while {what} ran, {load.describe()}: {consequence}"
