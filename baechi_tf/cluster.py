"""Devices and the cost of moving bytes between them.

A `Cluster` is a tuple of `Device` values and a linear communication cost per ordered pair of
distinct devices: ``slope_us_per_byte * bytes + intercept_us`` microseconds (0 on one device).
Devices of one TF task (one host) share the ``comm`` line; devices of different tasks pay
``inter_task_comm`` when it is given. The default line is the original Baechi's,
``0.0001754 x + 134`` (about 5.7 GB/s plus 134 us per message).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
from typing import Optional

import numpy as np

from baechi_tf.errors import ConfigError
from baechi_tf.graph import MAX_TOTAL_COMPUTE_US
from baechi_tf.ranges import SHARE_OF_MEMORY, check_range

__all__ = [
    "CommCost", "Cluster", "Device", "DEFAULT_COMM", "GiB", "check_device_count", "device_task",
    "merged_device_name",
]

GiB = 1 << 30
MAX_MEMORY_BYTES = (1 << 63) - 1
"""Most bytes a device may hold: capacities are int64, as TF's are (no limit, in effect)."""
MAX_COPY_US = MAX_TOTAL_COMPUTE_US
"""The longest a copy of a GiB, or a copy's fixed cost, may take: a step's limit, so that
schedules of any graph stay finite."""
_DEFAULT_SLOPE_US_PER_BYTE = 0.0001754  # the seed's fit: 5.7 GB/s
_DEFAULT_INTERCEPT_US = 134.0

_TASK = re.compile(r"^/job:([^/]+)(?:/replica:(\d+))?(?:/task:(\d+))?")
_DEVICE = re.compile(r"(?:^|/)(?:device:([A-Za-z_]+)|((?i:gpu|cpu|tpu))):(\d+)$")
# A whole device name as TF's runtime parses it (DeviceNameUtils): a job is a letter then letters,
# digits and '_', replica and task are numbers, and nothing else may stand between the parts.
_JOB = re.compile(r"[A-Za-z][A-Za-z0-9_]*\Z")
_WHOLE = re.compile(
    r"(?:(?:/job:[^/]*)?(?:/replica:\d+)?(?:/task:\d+)?/|/?)"
    r"(?:device:[A-Za-z_]+|(?i:gpu|cpu|tpu)):\d+\Z"
)


def device_task(name: str) -> str:
    """The task part of a device name, ``'/job:worker/replica:0/task:1'``, or ``''`` if none."""
    m = _TASK.match(name)
    if not m:
        return ""
    job, replica, task = m.group(1), m.group(2) or "0", m.group(3) or "0"
    return f"/job:{job}/replica:{replica}/task:{task}"


def _local_part(name: str) -> str:
    """``'device:GPU:1'`` from any spelling of a device name (case of the type kept upper)."""
    m = _DEVICE.search(name)
    if m:
        return f"device:{(m.group(1) or m.group(2)).upper()}:{int(m.group(3))}"
    short = re.fullmatch(r"/?([A-Za-z_]+):(\d+)", name.strip())
    if short:
        return f"device:{short.group(1).upper()}:{int(short.group(2))}"
    return name


def merged_device_name(a: str, b: str) -> Optional[str]:
    """The more specific of two device names if they can name one device, else None.

    They can when their local parts are the same device (``GPU:1``, ``/gpu:1`` and
    ``/device:GPU:1`` are one spelling) and their tasks are equal or one of them names no task:
    TF merges a partial device spec such as ``'GPU:1'`` with a full one. Two ops pinned to
    ``'/device:GPU:0'`` and ``'GPU:0'`` are pinned to the same device, not to two.
    """
    if _local_part(a) != _local_part(b):
        return None
    ta, tb = device_task(a), device_task(b)
    if ta and tb and ta != tb:
        return None
    return b if tb and not ta else a


@dataclasses.dataclass(frozen=True)
class Device:
    """One placement target."""

    name: str  # full TF device name, e.g. '/job:localhost/replica:0/task:0/device:GPU:0'
    memory_bytes: int  # capacity the placer may fill
    type: str = "GPU"  # 'GPU' or 'CPU'; decides which kernels can run here
    # Serves the copies it sends and receives on the thread that runs its ops, as a CPU worker
    # task serves gRPC's RecvTensor on its inter-op pool: a copy out starts only when no op runs
    # here, and the time a copy in or out holds the channels is compute time here too. GPUs copy
    # on streams of their own (False).
    sends_on_compute: bool = False
    # Its memory is its process's, which the other devices of its task with this flag use too
    # (CPU devices of one process, as stand-ins for GPUs are): a tensor one of them reads from
    # another is the sender's buffer, handed over, not copied. A GPU's memory is its own (False).
    shared_memory: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.sends_on_compute, bool):
            raise ConfigError(
                f"device {self.name!r} has sends_on_compute={self.sends_on_compute!r}; give True "
                "(copies out wait until no op runs here, as on a CPU worker task) or False"
            )
        if not isinstance(self.shared_memory, bool):
            raise ConfigError(
                f"device {self.name!r} has shared_memory={self.shared_memory!r}; give True (its "
                "task's devices with the flag share one memory, as CPU devices of one process do) "
                "or False"
            )
        if not isinstance(self.name, str) or not _WHOLE.match(self.name):
            raise ConfigError(
                f"device name {self.name!r} is malformed: use a TF device name such as "
                "'/device:GPU:0' or '/job:worker/replica:0/task:1/device:GPU:0'"
            )
        job = _TASK.match(self.name)
        if job and not _JOB.match(job.group(1)):
            raise ConfigError(
                f"device name {self.name!r} has the job {job.group(1)!r}, which TF cannot run: a "
                "job name is a letter followed by letters, digits and '_' (as 'worker' or 'ps_1')"
            )
        if isinstance(self.memory_bytes, bool) or not isinstance(self.memory_bytes, int):
            if not (isinstance(self.memory_bytes, float) and self.memory_bytes.is_integer()):
                raise ConfigError(
                    f"device {self.name!r} has memory_bytes={self.memory_bytes!r}; give a whole "
                    "number of bytes"
                )
            object.__setattr__(self, "memory_bytes", int(self.memory_bytes))
        if not 0 < self.memory_bytes <= MAX_MEMORY_BYTES:
            raise ConfigError(
                f"device {self.name!r} has memory_bytes={self.memory_bytes}; give it a positive "
                f"capacity in bytes, at most 2**63 - 1 ({MAX_MEMORY_BYTES})"
            )

    @property
    def task(self) -> str:
        return device_task(self.name)


def check_device_count(num_devices: object, per: str = "") -> None:
    """A `ConfigError` unless `num_devices` is a whole number of at least 1 (`per`: " per task")."""
    if isinstance(num_devices, bool) or not isinstance(num_devices, int):
        raise ConfigError(f"num_devices={num_devices!r} is not a whole number; give the number of devices{per}")
    if num_devices < 1:
        raise ConfigError(f"num_devices={num_devices!r}; give at least one device{per}")

@dataclasses.dataclass(frozen=True)
class CommCost:
    """A linear transfer time: ``slope_us_per_byte * bytes + intercept_us`` microseconds.

    `copies_in_flight` (K, a number >= 1, ``math.inf`` for no bound) is how many copies' fixed
    costs the link overlaps. A copy holds the channels of both its devices for
    ``slope_us_per_byte * bytes + intercept_us / K`` and arrives ``intercept_us * (1 - 1/K)``
    after that: its bytes share the link's bandwidth with every other copy, one after another,
    and a new copy may start every ``intercept_us / K``, so that at most K copies are in flight
    at once and the K+1th starts when the first arrives. K = 1 (the default): a copy holds the
    channels for its whole time. K = inf: for its bytes alone, the intercept paid in flight. gRPC
    between worker tasks overlaps its copies so (`comm_fit.fit_copies_in_flight` fits K to
    copies timed in flight together)."""

    slope_us_per_byte: float = _DEFAULT_SLOPE_US_PER_BYTE
    intercept_us: float = _DEFAULT_INTERCEPT_US
    copies_in_flight: float = 1.0

    def __post_init__(self) -> None:
        k = self.copies_in_flight
        if isinstance(k, bool) or not isinstance(k, (int, float)) or not k >= 1:
            raise ConfigError(
                f"communication copies_in_flight={k!r}; give a number >= 1: how many copies' fixed "
                "costs the link overlaps (1, the default: one copy at a time; math.inf: no bound)"
            )
        object.__setattr__(self, "copies_in_flight", float(k))
        for field in ("slope_us_per_byte", "intercept_us"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"communication {field}={value!r} is not a number")
            if not math.isfinite(value) or value < 0:
                raise ConfigError(
                    f"communication {field}={value!r}; it must be a finite number >= 0"
                )
        # A copy may take no longer than a step may (MAX_COPY_US): past that,
        # schedules overflowed to inf us or printed 300-digit step times, and HEFT failed.
        if self.intercept_us > MAX_COPY_US:
            raise ConfigError(
                f"communication intercept_us={self.intercept_us!r}: every copy would take more than "
                f"the {MAX_COPY_US:g} us (31 years) a step may take; give microseconds (the default "
                f"is {_DEFAULT_INTERCEPT_US:g})"
            )
        if self.slope_us_per_byte * GiB > MAX_COPY_US:
            raise ConfigError(
                f"communication slope_us_per_byte={self.slope_us_per_byte!r}: a copy of a GiB would "
                f"take more than the {MAX_COPY_US:g} us (31 years) a step may take; give "
                f"microseconds per byte (the default is {_DEFAULT_SLOPE_US_PER_BYTE:g})"
            )

    def __call__(self, nbytes: float) -> float:
        return self.slope_us_per_byte * nbytes + self.intercept_us

    @classmethod
    def parse(cls, text: str) -> "CommCost":
        """Parses ``'slope,intercept'`` as given to ``--comm_cost_coeffs``."""
        parts = [p.strip() for p in str(text).split(",")]
        try:
            slope, intercept = (float(p) for p in parts)
        except ValueError:
            raise ConfigError(
                f"communication cost {text!r} is not 'slope,intercept' (two numbers, e.g. "
                "'0.0001754,134')"
            ) from None
        return cls(slope, intercept)


DEFAULT_COMM = CommCost()


@dataclasses.dataclass(frozen=True)
class Cluster:
    """Devices and the communication cost between each ordered pair of them."""

    devices: tuple[Device, ...]
    comm: CommCost = DEFAULT_COMM  # cost between devices of one task (host)
    inter_task_comm: Optional[CommCost] = None  # cost between tasks; None: same as `comm`

    def __post_init__(self) -> None:
        devices = tuple(self.devices)
        object.__setattr__(self, "devices", devices)
        if not devices:
            raise ConfigError("the cluster has no devices; give at least one device")
        if not all(isinstance(d, Device) for d in devices):
            raise ConfigError("Cluster.devices must be Device values")
        seen: dict[str, str] = {}
        for d in devices:
            key = self._key(d.name)
            if key in seen:
                raise ConfigError(
                    f"devices {seen[key]!r} and {d.name!r} are the same device; list each once"
                )
            seen[key] = d.name
        object.__setattr__(self, "_index", {self._key(d.name): i for i, d in enumerate(devices)})
        tasks = [d.task for d in devices]
        object.__setattr__(self, "_tasks", tuple(tasks))

    @staticmethod
    def _key(name: str) -> str:
        return device_task(name) + "/" + _local_part(name)

    @classmethod
    def homogeneous(
        cls,
        num_devices: int,
        memory_bytes: int,
        *,
        device_type: str = "GPU",
        comm: CommCost = DEFAULT_COMM,
        prefix: str = "",
    ) -> "Cluster":
        """`num_devices` devices named ``{prefix}/device:{type}:{i}`` with equal memory."""
        check_device_count(num_devices)
        return cls(
            tuple(
                Device(f"{prefix}/device:{device_type}:{i}", memory_bytes, device_type)
                for i in range(num_devices)
            ),
            comm,
        )

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.devices)

    def link(self, src: int, dst: int) -> CommCost:
        """The cost line between devices `src` and `dst` (indices, src != dst)."""
        if self.inter_task_comm is not None and self._tasks[src] != self._tasks[dst]:  # type: ignore[attr-defined]
            return self.inter_task_comm
        return self.comm

    def link_tables(self) -> tuple[list[list[float]], list[list[float]]]:
        """(slope, intercept) of each ordered pair of devices as nested lists, 0 from a device to
        itself, so that a copy from a to b takes slope[a][b] * bytes + intercept[a][b] us (the
        form the schedulers' inner loops read). Made once per cluster (O(D^2)), shared: do not
        change them."""
        return self._links[:2]

    def pair_links(self) -> tuple[np.ndarray, np.ndarray]:
        """(slope, intercept) of each ordered pair of distinct devices, a then b, as float64
        arrays of D * (D - 1) (empty with one device): what means and extremes over the pairs
        read. Made once per cluster, read-only."""
        return self._pair_links

    @functools.cached_property
    def _pair_links(self) -> tuple[np.ndarray, np.ndarray]:
        pairs = ~np.eye(self.num_devices, dtype=bool)
        out = tuple(np.asarray(t, dtype=np.float64)[pairs] for t in self.link_tables())
        for a in out:
            a.setflags(write=False)
        return out  # type: ignore[return-value]

    def min_link_intercept_us(self) -> float:
        """The least fixed cost of a copy between two devices; 0 with one device."""
        return self._links[2]

    def channel_tables(self) -> tuple[list[list[float]], list[list[float]], list[list[float]]]:
        """(slope, held, latency) of each ordered pair as nested lists, 0 from a device to
        itself: a copy from a to b holds the channels of a and b for
        slope[a][b] * bytes + held[a][b] us and arrives latency[a][b] us after that. held is the
        intercept over the link's `CommCost.copies_in_flight` K, latency the rest of it (0 for
        K = 1). Made once per cluster (O(D^2)), shared: do not change."""
        return self._links[3]

    def min_hold_us(self) -> float:
        """The least fixed time a copy between two devices holds their channels (`held` of
        `channel_tables`): no copy fits a gap shorter than that. 0 with one device."""
        return self._links[4]

    @functools.cached_property
    def _links(self) -> tuple[list[list[float]], list[list[float]], float, tuple, float]:
        nd = self.num_devices
        links = [[self.link(a, b) if a != b else None for b in range(nd)] for a in range(nd)]
        slope = [[link.slope_us_per_byte if link else 0.0 for link in row] for row in links]
        intercept = [[link.intercept_us if link else 0.0 for link in row] for row in links]
        least = min((link.intercept_us for row in links for link in row if link), default=0.0)
        held = [[link.intercept_us / link.copies_in_flight if link else 0.0 for link in row] for row in links]
        latency = [[i - h for i, h in zip(irow, hrow)] for irow, hrow in zip(intercept, held)]
        least_held = min((h for a, row in enumerate(held) for b, h in enumerate(row) if a != b), default=0.0)
        return slope, intercept, least, (slope, held, latency), least_held

    def twins(self) -> tuple[tuple[int, ...], ...]:
        """Sets of at least two interchangeable devices, each ascending: of one memory, type,
        `Device.sends_on_compute` and `Device.shared_memory`, and swapping any two of a set
        changes no copy's cost (copies between them, and to and from every other device, cost
        the same). A placer may weigh one device of a set for all those the schedule has not yet
        touched. One task's devices of one memory and type, in any cluster `link` describes
        (`comm` within a task, `inter_task_comm` between), and all devices of one memory and type
        when copies between tasks cost what copies within do."""
        return self._twins

    @functools.cached_property
    def _twins(self) -> tuple[tuple[int, ...], ...]:
        costs = [np.asarray(t, dtype=np.float64) for t in self.channel_tables()]
        by_kind: dict[tuple[int, str, bool, bool], list[int]] = {}
        for i, d in enumerate(self.devices):
            by_kind.setdefault((d.memory_bytes, d.type, d.sends_on_compute, d.shared_memory), []).append(i)
        out = []
        for kind in by_kind.values():
            # Checked on the links, not assumed from the tasks: the first device left and those
            # left that it can swap with make a set.
            left = np.asarray(kind)
            while len(left) > 1:
                ok = np.logical_and.reduce([_swappable(cost, left[0], left) for cost in costs])
                if ok.sum() > 1:
                    out.append(tuple(left[ok].tolist()))
                left = left[~ok]
        return tuple(sorted(out))

    def sends_on_compute(self) -> tuple[bool, ...]:
        """Per device, `Device.sends_on_compute`: whether a copy out of it waits until it runs
        no op (the schedulers' rule)."""
        return tuple(d.sends_on_compute for d in self.devices)

    def shares_memory(self) -> tuple[tuple[bool, ...], ...]:
        """Per ordered pair of devices (a, b), whether a tensor read on b from a is a's buffer,
        handed over, not a copy (the schedulers' memory rule): a and b are two devices of one
        task, both with `Device.shared_memory`. Made once per cluster (O(D^2)), shared."""
        return self._shares_memory

    @functools.cached_property
    def _shares_memory(self) -> tuple[tuple[bool, ...], ...]:
        tasks: tuple[str, ...] = self._tasks  # type: ignore[attr-defined]
        flag = [d.shared_memory for d in self.devices]
        return tuple(
            tuple(a != b and flag[a] and flag[b] and tasks[a] == tasks[b] for b in range(self.num_devices))
            for a in range(self.num_devices)
        )

    def transfer_us(self, src: int, dst: int, nbytes: float) -> float:
        """Microseconds to move `nbytes` from device `src` to `dst`; 0 on one device."""
        if src == dst:
            return 0.0
        return self.link(src, dst)(nbytes)

    def find(self, name: str) -> Optional[int]:
        """Index of the device called `name`, in any of TF's spellings, or None."""
        hits = self._matches(name)
        return hits[0] if len(hits) == 1 else None

    def _matches(self, name: str) -> list[int]:
        """The devices `name` may be: one, none, or several when it names no task."""
        index: dict[str, int] = self._index  # type: ignore[attr-defined]
        key = self._key(name)
        if key in index:
            return [index[key]]
        task = device_task(name)
        # '/device:GPU:1' or 'GPU:1' matches the one device with that local part, if unique. So
        # does TF's in-process spelling, '/job:localhost/replica:0/task:0/device:GPU:1', in a
        # cluster whose names carry no task (one host: its own devices); a name of any other task
        # may be another machine's device.
        local_task = task.startswith("/job:localhost/") and not any(device_task(n) for n in self.names)
        if not task or local_task:
            local = "/" + _local_part(name)
            return [i for k, i in index.items() if k.endswith(local)]
        return []

    def ambiguity(self, name: str) -> Optional[str]:
        """When `name` is none of the devices because it could be several (it names no task, and
        devices of several tasks have its local part), a clause saying so for an error message,
        after the name; else None."""
        hits = self._matches(name)
        if len(hits) < 2:
            return None
        return (
            f"which names {len(hits)} devices of different tasks "
            f"({', '.join(self.names[i] for i in hits)}): give its task too, as in {self.names[hits[0]]!r}"
        )

    def device_index(self, name: str) -> int:
        """Like `find`, but raises `ConfigError` listing the devices when there is none."""
        i = self.find(name)
        if i is None:
            raise ConfigError(
                f"device {name!r} "
                + (self.ambiguity(name) or f"is not in the cluster; the devices are {', '.join(map(repr, self.names))}")
            )
        return i

    def with_memory_fraction(self, fraction: float) -> "Cluster":
        """A copy whose capacities are multiplied by `fraction` (0 < fraction <= 1)."""
        check_range("memory_fraction", fraction, SHARE_OF_MEMORY)
        return dataclasses.replace(
            self,
            devices=tuple(
                dataclasses.replace(d, memory_bytes=max(1, int(d.memory_bytes * fraction)))
                for d in self.devices
            ),
        )



def _swappable(cost: np.ndarray, a: int, others: np.ndarray) -> np.ndarray:
    """Per device b of `others`, whether swapping devices a and b leaves `cost` (one per ordered
    pair of devices) unchanged: a's and b's rows agree but at a and b, so do their columns, and
    a to b costs what b to a does."""
    ok = np.ones(len(others), dtype=bool)
    for table in (cost, cost.T):
        same = table[others] == table[a]
        same[:, a] = True
        same[np.arange(len(others)), others] = True
        ok &= same.all(axis=1)
    return ok & (cost[a, others] == cost[others, a])
