"""The devices a placed graph runs on: real GPUs, or virtual CPU devices standing in for them.

With at least `num_devices` GPUs, the cluster is GPU 0..N-1, each holding `memory_fraction` of
the GPU, out of TF's ``memory_limit_bytes``, which already is a config's
``per_process_gpu_memory_fraction`` of the GPU when one is set (`gpu_share`). With fewer, the
session asks TF for N + 1 CPU devices (``ConfigProto(device_count={"CPU": N + 1})``):
CPU:1..CPU:N stand in for GPU:0..GPU:N-1, each with `memory_bytes_per_device` times
`memory_fraction`, and CPU:0 stays the host. The host CPU is never a placement target; it runs
only the ops that must run there (pinned to the CPU by the user, or without a kernel for the
devices' type), exactly as on a machine with GPUs. A pin to ``/gpu:i`` in the graph means the
stand-in of GPU i.

Placed sessions run with TensorFlow's optimizations, but for those that move ops off the devices
a placement gave them (`placed_graph_config` says which, and why).

``comm="auto"`` (``--comm_cost_coeffs=auto``): `with_fitted_link` times copies between the
setup's first two devices (`baechi_tf.cost_model.comm_bench.auto_comm`) and gives the setup with
the fitted line.

Everything but `session_devices`, `session_config`, `placed_graph_config` and `with_fitted_link`
is pure (no TensorFlow import).
"""

from __future__ import annotations

import dataclasses
import decimal
import os
import re
from typing import Any, Mapping, Optional

from baechi_tf.cluster import (
    DEFAULT_COMM,
    MAX_MEMORY_BYTES,
    Cluster,
    CommCost,
    Device,
    GiB,
    check_device_count,
)
from baechi_tf.errors import ConfigError
from baechi_tf.ranges import SHARE_OF_MEMORY, check_range

__all__ = [
    "DEFAULT_MEMORY_BYTES_PER_DEVICE",
    "DeviceSetup",
    "gpu_cluster",
    "gpu_share",
    "host_device",
    "host_memory_bytes",
    "memory_share",
    "placed_graph_config",
    "parse_comm",
    "resolve_memory",
    "with_fitted_link",
    "session_config",
    "session_devices",
    "standin_cluster",
]

DEFAULT_MEMORY_BYTES_PER_DEVICE = 8 * GiB
LOCAL_TASK = "/job:localhost/replica:0/task:0"


@dataclasses.dataclass(frozen=True)
class DeviceSetup:
    """Placement targets, the host CPU, and how a session must be configured to have them."""

    cluster: Cluster  # the devices the placer chooses from
    host: Device  # the host CPU (not a placement target)
    aliases: Mapping[str, str]  # 'device:GPU:i' -> the stand-in's name (virtual devices only)
    num_cpus: int  # CPU devices the session must ask for (0: leave TF's default)
    virtual: bool  # True when CPU devices stand in for GPUs


def host_memory_bytes() -> int:
    """Physical memory of this machine (the host CPU's capacity), 64 GiB when unknown."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return 64 * GiB


def host_device(prefix: str = "") -> Device:
    """The host CPU, ``{prefix}/device:CPU:0``."""
    return Device(f"{prefix}/device:CPU:0", host_memory_bytes(), "CPU")


def standin_cluster(
    num_devices: int,
    memory_bytes: int = DEFAULT_MEMORY_BYTES_PER_DEVICE,
    *,
    comm: CommCost = DEFAULT_COMM,
    prefix: str = "",
    shared_memory: bool = False,
) -> DeviceSetup:
    """CPU:1..CPU:N standing in for GPU:0..GPU:N-1; CPU:0 is the host. They are devices of one
    process, where a tensor one reads from another is handed over, not copied; `shared_memory`
    models them so (`Device.shared_memory`), and without it they are modelled as the GPUs they
    stand for, each reader receiving a copy (docs/fidelity.md says which is nearer TF, and why
    the copy stays the default)."""
    check_device_count(num_devices)
    devices = tuple(
        Device(f"{prefix}/device:CPU:{i + 1}", memory_bytes, "CPU", shared_memory=shared_memory)
        for i in range(num_devices)
    )
    return DeviceSetup(
        cluster=Cluster(devices, comm),
        host=host_device(prefix),
        aliases={f"device:GPU:{i}": d.name for i, d in enumerate(devices)},
        num_cpus=num_devices + 1,
        virtual=True,
    )


def gpu_cluster(
    num_devices: int,
    memory_bytes: int = DEFAULT_MEMORY_BYTES_PER_DEVICE,
    *,
    comm: CommCost = DEFAULT_COMM,
    prefix: str = "",
) -> DeviceSetup:
    """GPU:0..GPU:N-1 with equal memory; the host is CPU:0 (for graphs placed offline)."""
    check_device_count(num_devices)
    return DeviceSetup(
        cluster=Cluster.homogeneous(num_devices, memory_bytes, comm=comm, prefix=prefix),
        host=host_device(prefix),
        aliases={},
        num_cpus=0,
        virtual=False,
    )


def memory_share(nbytes: int, fraction: float) -> int:
    """`fraction` of `nbytes`, at least a byte; `nbytes` itself when it is not positive, for
    `Device` to refuse."""
    return max(1, int(nbytes * fraction)) if nbytes > 0 else nbytes


def gpu_share(memory_fraction: float, config_fraction: float) -> float:
    """The share of a GPU's listed memory that is `memory_fraction` of the whole GPU, when TF lists
    it as `config_fraction` of the GPU (its ``per_process_gpu_memory_fraction``; 0 or less: unset,
    the listing is the whole GPU). TF's allocator takes no more than the listing, so neither does
    the placer."""
    if config_fraction <= 0:
        return memory_fraction
    return min(1.0, memory_fraction / config_fraction)


def session_devices(
    num_devices: int,
    *,
    memory_bytes_per_device: int = DEFAULT_MEMORY_BYTES_PER_DEVICE,
    memory_fraction: float = 1.0,
    comm: CommCost = DEFAULT_COMM,
    config: Any = None,
) -> DeviceSetup:
    """The devices of a local session: GPUs when there are `num_devices` of them, else stand-ins;
    either way with `memory_fraction` of their memory."""
    import tensorflow as tf

    check_device_count(num_devices)
    check_range("memory_fraction", memory_fraction, SHARE_OF_MEMORY)
    standin_bytes = memory_share(memory_bytes_per_device, memory_fraction)
    if len(tf.config.list_physical_devices("GPU")) < num_devices:
        return standin_cluster(num_devices, standin_bytes, comm=comm, prefix=LOCAL_TASK)
    probe_config = tf.compat.v1.ConfigProto()
    if config is not None:
        probe_config.CopyFrom(config)
    with tf.compat.v1.Session(graph=tf.Graph(), config=probe_config) as probe:
        listed = probe.list_devices()
    gpus = sorted(
        (d for d in listed if d.device_type == "GPU"),
        key=lambda d: int(d.name.rsplit(":", 1)[1]),
    )[:num_devices]
    if len(gpus) < num_devices:  # the config hides some GPUs: fall back to stand-ins
        return standin_cluster(num_devices, standin_bytes, comm=comm, prefix=LOCAL_TASK)
    # TF lists each GPU with what its allocator may take, already `per_process_gpu_memory_fraction`
    # of the GPU when the config sets one (train.py's --memory_fraction does): scaling that by
    # `memory_fraction` again gave the placer the fraction squared.
    share = gpu_share(memory_fraction, probe_config.gpu_options.per_process_gpu_memory_fraction)
    devices = tuple(Device(d.name, memory_share(d.memory_limit_bytes, share), "GPU") for d in gpus)
    return DeviceSetup(
        cluster=Cluster(devices, comm),
        host=host_device(LOCAL_TASK),
        aliases={},
        num_cpus=0,
        virtual=False,
    )


def session_config(setup: DeviceSetup, base: Any = None, *, grappler: bool = True, remapping: bool = True) -> Any:
    """A ``ConfigProto`` for a session that has `setup`'s devices, built on `base` (copied).

    With `grappler`, TF optimizes the graph as `placed_graph_config` says (`remapping` passed on);
    without, Grappler and the classic graph optimizer are off, and the graph runs as written.
    """
    import tensorflow as tf

    from baechi_tf.cost_model.profiler import profiling_config

    config = tf.compat.v1.ConfigProto()
    if base is not None:
        config.CopyFrom(base)
    if setup.num_cpus:
        config.device_count["CPU"] = max(setup.num_cpus, config.device_count.get("CPU", 0))
    return placed_graph_config(config, remapping=remapping) if grappler else profiling_config(config)


def placed_graph_config(config: Any = None, *, remapping: bool = True) -> Any:
    """A copy of `config` (a ``ConfigProto``) with which TF optimizes a placed graph and keeps
    every op on its device: Grappler and the classic graph optimizer as `config` sets them, but
    these of Grappler's optimizers, turned off by name, whatever `config` says:

    * ``pin_to_host_optimization``: moves ops whose inputs and outputs are small int32, int64 or
      float tensors (64 elements at most: shapes, sizes, counters) from a GPU to the host CPU
      (``pin_to_host_optimizer.cc``, ``TryFindHostDevice``). TF runs it only when a config
      turns it on.
    * ``auto_parallel``: replicates the graph over the devices along the batch, whatever they
      were placed on. Off unless a config enables it.
    * ``remapping``, when `remapping` is False: the remapper fuses chains of ops (Conv2D or
      MatMul + BiasAdd + activation, FusedBatchNorm + activation, Sigmoid + Mul, ...) into one
      node, named after the last op, on the first op's device, without asking whether they share
      one (``remapper.cc``: the fused node takes ``contraction.device()``). Seen here: Conv2D on
      CPU:1, BiasAdd on CPU:2 and Relu on CPU:3 ran as one node 'Relu' on CPU:1. A profile taken
      with it on says which ops it fused (``OpCost.fused_into``) and placements keep those on one
      device, so BaechiSession turns it off only for a placement that still splits one.

    Kept, as they leave each op where it was placed:

    * ``layout_optimizer``: on GPUs it converts convolutions to NCHW, its Transpose and
      DataFormat nodes on the device of the op they serve; without GPUs (CPU stand-ins, whose
      TF kernels need NHWC) it changes nothing unless ``cpu_layout_conversion`` asks.
    * ``arithmetic_optimization`` and ``common_subgraph_elimination``: merge nodes of one device
      only (``UniqueNodes::SameNode`` compares devices; AddOpsRewrite, HoistCommonFactor and the
      dedup were checked here with the ops on three devices).
    * ``constant_folding``: a folded constant takes the device of the op it replaces.
    * ``function_optimization``: an inlined function's nodes take the device of its call
      (checked here); ``memory_optimization``: its swap and recompute nodes take the device of the
      op they serve; ``dependency_optimization`` removes Identity and NoOp nodes, and gathers the
      control edges that leave one device in a NoOp on that device
      (``GroupCrossDeviceControlEdges_0/<op>``: no work, moved from no op); the loop and shape
      optimizers, ``implementation_selector``, ``scoped_allocator_optimization`` (collectives
      only) and ``debug_stripper`` move no op.
    * The classic graph optimizer (``OptimizerOptions``: common subexpressions, constant folding,
      inlining) and oneDNN's rewrites run on each device's part of the graph after it is split
      between devices: no op can change device there.
    """
    import tensorflow as tf

    out = tf.compat.v1.ConfigProto()
    if config is not None:
        out.CopyFrom(config)
    rewrite = out.graph_options.rewrite_options
    from tensorflow.core.protobuf import rewriter_config_pb2

    off = rewriter_config_pb2.RewriterConfig.OFF
    rewrite.pin_to_host_optimization = off
    rewrite.auto_parallel.enable = False
    if not remapping:
        rewrite.remapping = off
    return out


_MEMORY_UNITS = {
    "B": 1, "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30, "TIB": 1 << 40,
    "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
}
_KNOWN_UNITS = "KiB, MiB, GiB, TiB, KB, MB, GB, TB or none (bytes)"
_SIZE = re.compile(r"([-+]?(?:inf(?:inity)?|nan|(?:\d+\.?\d*|\.\d+)(?:e[-+]?\d+)?))([a-z]*)\Z", re.IGNORECASE)


AUTO = "auto"


def parse_comm(value: Any, flag: str = "--comm_cost_coeffs") -> Optional[CommCost]:
    """`value` ('slope,intercept', a `CommCost` or None) as a `CommCost`; None for ``'auto'``
    (fit it with `with_fitted_link` once the devices are there). `flag` names it in errors."""
    if value is None or isinstance(value, CommCost):
        return value
    if isinstance(value, str) and value.strip().lower() == AUTO:
        return None
    try:
        return CommCost.parse(value)
    except ConfigError as e:
        raise ConfigError(f"{flag}={value!r}: {e}; or 'auto' to fit it to copies between the "
                          "devices before placing") from None


def with_fitted_link(setup: DeviceSetup, config: Any = None, target: str = "",
                     flag: str = "--comm_cost_coeffs=auto") -> tuple[DeviceSetup, Any]:
    """(`setup` with ``comm`` fitted to copies between its first two devices, the
    `comm_bench.AutoComm` measured, or None with one device) for ``comm="auto"``. A session of
    `config` (`session_config` of the setup when None) on `target` runs the copies.

    Raises `ConfigError` naming the fix when this process cannot run them: GPUs asked for on a
    machine without them (placing offline for another machine)."""
    import tensorflow as tf

    from baechi_tf.cost_model.comm_bench import auto_comm

    cluster = setup.cluster
    if cluster.num_devices < 2:
        return setup, None
    if not target and cluster.devices[0].type == "GPU":
        have = len(tf.config.list_physical_devices("GPU"))
        if have < 2:
            raise ConfigError(
                f"{flag} times copies between the devices placed on, and this machine has {have} "
                "GPU(s): run it on the machine with the GPUs, or give the line as SLOPE,INTERCEPT "
                "(utils/communication_benchmark.py prints it there), or place on CPU stand-ins "
                "(--device_type=CPU)"
            )
    fitted = auto_comm(cluster, config if config is not None else session_config(setup, grappler=False), target)
    return dataclasses.replace(setup, cluster=dataclasses.replace(cluster, comm=fitted.comm)), fitted


def resolve_memory(text: Optional[str], flag: str = "--memory_per_device") -> int:
    """Parses ``'8GiB'``, ``'512MiB'``, ``'1TB'``, ``'4096'`` (bytes) into bytes; a `ConfigError`
    naming `flag` and what to write otherwise (an unknown unit, a number that is not positive,
    finite and at most 2**63 - 1 bytes). Units are case-insensitive; a fraction is rounded down."""
    if text is None:
        return DEFAULT_MEMORY_BYTES_PER_DEVICE
    example = "write e.g. '8GiB', '512MiB' or a number of bytes"
    match = _SIZE.match(str(text).replace(" ", ""))
    if match is None:
        raise ConfigError(f"{flag} {text!r} is not a memory size; {example}")
    number, unit = match.groups()
    scale = _MEMORY_UNITS.get(unit.upper() or "B")
    if scale is None:
        raise ConfigError(f"{flag} {text!r} has the unknown unit {unit!r}; use {_KNOWN_UNITS}: {example}")
    with decimal.localcontext() as exact:  # no rounding; too large an exponent gives Infinity
        exact.prec, exact.traps[decimal.Overflow] = decimal.MAX_PREC, False
        value = decimal.Decimal(number) * scale
    if value.is_nan() or value.is_infinite() and "inf" in number.lower():
        raise ConfigError(f"{flag} {text!r} is not a finite size; {example}")
    if not value >= 1:
        raise ConfigError(f"{flag} {text!r} is not a positive size; {example}")
    if value > MAX_MEMORY_BYTES:
        raise ConfigError(
            f"{flag} {text!r} is more than a device can hold (2**63 - 1 bytes, about 8 EiB); {example}"
        )
    return int(value)
