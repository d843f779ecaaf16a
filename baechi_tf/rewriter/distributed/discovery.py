"""Reaching the tasks of a cluster and the devices they offer: the placement targets.

The client asks the master for the cluster's devices (a session's ``list_devices``), within a
bounded time (`discover_devices`); before that it checks that every task's port accepts
connections (`wait_for_tasks`), so that an absent worker is named in the error
(`ClusterUnreachableError`) instead of TensorFlow waiting for it forever. As on one machine
(`baechi_tf.rewriter.devices`), a task with GPUs contributes its GPUs; a task without them its
virtual CPU devices CPU:1..CPU:N, which stand in for GPUs (`devices_from_listing`). The master's
CPU:0 is the host of the placement. Devices of one task share the intra-task communication line,
devices of different tasks pay the inter-host one (`baechi_tf.cluster.Cluster.link`). Sessions
against a cluster isolate their state (`remote_session_config`): the profiling session and the
placed session hold variables of the same names on the same servers, which must not be shared.

Only `discover_devices` and `remote_session_config` import TensorFlow.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import math
import re
import socket
import time
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

from baechi_tf.cluster import DEFAULT_COMM, Cluster, CommCost, Device, check_device_count, device_task
from baechi_tf.errors import ConfigError, first_line
from baechi_tf.ranges import SHARE_OF_MEMORY, check_range
from baechi_tf.rewriter.devices import (
    DEFAULT_MEMORY_BYTES_PER_DEVICE,
    DeviceSetup,
    host_device,
    memory_share,
    resolve_memory,
)
from baechi_tf.rewriter.distributed.spec import (
    _WORKER_MODULE,
    ClusterSpec,
    ClusterTask,
    ClusterUnreachableError,
    _split_address,
    resolve_cluster_spec,
)

__all__ = [
    "DistributedSetup",
    "check_timeout",
    "cluster_from_flags",
    "devices_from_listing",
    "discover_devices",
    "is_remote_target",
    "placement_by_host",
    "remote_session_config",
    "wait_for_tasks",
]

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 30.0


def is_remote_target(target: str) -> bool:
    """Whether a session target names a TF server (``grpc://...``) rather than this process."""
    return str(target).startswith("grpc://")


def _worker_command(spec: Optional[ClusterSpec], task: Optional[ClusterTask]) -> str:
    spec_text = f"'{spec.to_json()}'" if spec is not None else "'<the cluster spec>'"
    job = task.job if task is not None else "<job>"
    index = task.index if task is not None else "<index>"
    return (
        f"python -m {_WORKER_MODULE} --cluster_spec={spec_text} --job={job} --task_index={index} "
        "--num_devices=<N>"
    )


def wait_for_tasks(
    addresses: Iterable[str],
    timeout_s: float = DEFAULT_TIMEOUT_S,
    *,
    spec: Optional[ClusterSpec] = None,
) -> None:
    """Waits until every address accepts a TCP connection; `ClusterUnreachableError` after
    `timeout_s` seconds, naming each address that did not (and its task, given the `spec`)."""
    deadline = time.monotonic() + max(0.0, timeout_s)
    pending = {a: "" for a in dict.fromkeys(addresses)}
    while True:
        for address in list(pending):
            host, port = _split_address(address)
            remaining = deadline - time.monotonic()
            try:
                with socket.create_connection((host, port), timeout=max(0.05, min(remaining, 2.0))):
                    pass
                del pending[address]
            except OSError as e:
                pending[address] = e.strerror or type(e).__name__
        if not pending or time.monotonic() >= deadline:
            break
        time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))  # between rounds of attempts
    if not pending:
        return
    parts = []
    for address, why in pending.items():
        task = spec.task_at(address) if spec is not None else None
        who = f"task {task.name} at {address}" if task is not None else f"the server at {address}"
        parts.append(f"{who} ({why})")
    first = spec.task_at(next(iter(pending))) if spec is not None else None
    raise ClusterUnreachableError(
        f"cannot reach {'; '.join(parts)} within {timeout_s:g} s: start the TensorFlow server "
        f"there ({_worker_command(spec, first)}), or correct the address in --cluster_spec / "
        "TF_CONFIG"
    )


def remote_session_config(config: Any = None) -> Any:
    """A copy of `config` for sessions against a cluster: their state is isolated.

    With ``isolate_session_state`` every session has its own variables on the servers, so a
    profiling session and a placed session of the same graph do not share (and move) them.
    """
    import tensorflow as tf

    out = tf.compat.v1.ConfigProto()
    if config is not None:
        out.CopyFrom(config)
    out.isolate_session_state = True
    return out


# ---------------------------------------------------------------------------- devices


@dataclasses.dataclass(frozen=True)
class DistributedSetup:
    """A cluster of TF tasks ready to place on: where sessions go and the devices they have."""

    spec: Optional[ClusterSpec]  # the tasks, when known (None: only a target was given)
    target: str  # 'grpc://host:port' of the master, the target of every session
    devices: DeviceSetup  # placement targets of every task; the host is the master's CPU:0


def _index(name: str) -> int:
    return int(name.rsplit(":", 1)[1])


def devices_from_listing(
    listed: Sequence[tuple[str, str, int]],
    *,
    master_task: Optional[str] = None,
    num_devices_per_task: Optional[int] = None,
    memory_bytes_per_device: int = DEFAULT_MEMORY_BYTES_PER_DEVICE,
    memory_fraction: float = 1.0,
    comm: CommCost = DEFAULT_COMM,
    inter_host_comm: Optional[CommCost] = None,
) -> DeviceSetup:
    """The placement targets among a cluster's devices, ``(full name, type, memory limit)``.

    Per task: its GPUs (each ``memory_limit * memory_fraction``) when it has any, else its CPU
    devices but CPU:0, standing in for GPUs (`memory_bytes_per_device * memory_fraction` each); at most
    `num_devices_per_task` of them (None: all). The master's task (default: the first listed
    device's) comes first, then the others by job and index. Pure: no TensorFlow.
    """
    if num_devices_per_task is not None:
        check_device_count(num_devices_per_task, per=" per task")
    check_range("memory_fraction", memory_fraction, SHARE_OF_MEMORY)
    by_task: dict[str, list[tuple[str, str, int]]] = collections.OrderedDict()
    for name, device_type, limit in listed:
        by_task.setdefault(device_task(name), []).append((name, device_type.upper(), int(limit)))
    if not by_task:
        raise ConfigError("the cluster lists no device; check that its servers started")
    master = master_task or next(iter(by_task))
    if master not in by_task:
        raise ConfigError(f"the master task {master} lists no device of its own")

    def order(task: str) -> tuple:
        m = re.match(r"^/job:([^/]+)/replica:(\d+)/task:(\d+)$", task)
        return (task != master, m.group(1), int(m.group(2)), int(m.group(3))) if m else (True, task, 0, 0)

    devices: list[Device] = []
    aliases: dict[str, str] = {}
    virtual = False
    for task in sorted(by_task, key=order):
        entries = by_task[task]
        gpus = sorted((e for e in entries if e[1] == "GPU"), key=lambda e: _index(e[0]))
        cpus = sorted((e for e in entries if e[1] == "CPU" and _index(e[0]) > 0), key=lambda e: _index(e[0]))
        chosen = gpus or cpus
        if not chosen:
            raise ConfigError(
                f"task {task} has no GPU and no CPU device but its host CPU:0: start its server "
                f"with N + 1 virtual CPU devices ({_worker_command(None, None)})"
            )
        want = num_devices_per_task or len(chosen)
        if len(chosen) < want:
            kind = "GPUs" if gpus else "virtual CPU devices (CPU:1..)"
            raise ConfigError(
                f"task {task} has {len(chosen)} {kind} but {want} devices per task were asked "
                f"for: ask for fewer (train.py's --num_gpus, baechi place's --num_devices, "
                f"BaechiSession's num_devices=), or start its server with more "
                f"(--num_devices={want})"
            )
        for i, (name, device_type, limit) in enumerate(chosen[:want]):
            if device_type == "GPU":
                devices.append(Device(name, memory_share(limit, memory_fraction), "GPU"))
            else:
                virtual = True
                # Copies to other tasks are RecvTensor calls, which a CPU task serves on the pool
                # that runs its ops (`Device.sends_on_compute`).
                devices.append(Device(name, memory_share(memory_bytes_per_device, memory_fraction), "CPU",
                                      sends_on_compute=len(by_task) > 1))
                if task == master:
                    aliases[f"device:GPU:{i}"] = name
    return DeviceSetup(
        cluster=Cluster(tuple(devices), comm, inter_host_comm),
        host=host_device(master),
        aliases=aliases,
        num_cpus=0,  # the servers were started with their devices
        virtual=virtual,
    )


def check_timeout(timeout_s: Any) -> None:
    """`ConfigError` unless `timeout_s` is a positive, finite number of seconds."""
    if isinstance(timeout_s, bool) or not (isinstance(timeout_s, (int, float)) and 0 < timeout_s < math.inf):
        raise ConfigError(
            f"cluster timeout {timeout_s!r}: give a positive number of seconds (--cluster_timeout, "
            "BaechiSession's connect_timeout_s=)"
        )


def _address_of(target: str) -> str:
    if not is_remote_target(target):
        raise ConfigError(f"target {target!r} is not 'grpc://host:port'")
    return target[len("grpc://") :].rstrip("/")


def discover_devices(
    target: Optional[str] = None,
    *,
    spec: Optional[ClusterSpec] = None,
    num_devices_per_task: Optional[int] = None,
    memory_bytes_per_device: int = DEFAULT_MEMORY_BYTES_PER_DEVICE,
    memory_fraction: float = 1.0,
    comm: CommCost = DEFAULT_COMM,
    inter_host_comm: Optional[CommCost] = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    config: Any = None,
) -> DistributedSetup:
    """Asks a running cluster for its devices; see `devices_from_listing` for the choice.

    `target` defaults to the `spec`'s master. With a `spec`, every task's port is checked first;
    without one only the target's. All of it takes at most about `timeout_s` seconds, then
    raises `ClusterUnreachableError` naming what did not answer.
    """
    import tensorflow as tf

    check_timeout(timeout_s)
    if target is None:
        if spec is None:
            raise ConfigError("give a target ('grpc://host:port') or a cluster spec")
        target = spec.target
    address = _address_of(target)
    target = "grpc://" + address  # 'grpc://host:port/' is no host-port pair to TF
    if spec is not None and spec.task_at(address) is None:
        raise ConfigError(
            f"target {target!r} is none of the cluster spec's tasks "
            f"({', '.join(t.address for t in spec.tasks)}); target one of them"
        )
    started = time.monotonic()
    wait_for_tasks([t.address for t in spec.tasks] if spec else [address], timeout_s, spec=spec)
    remaining = max(1.0, timeout_s - (time.monotonic() - started))
    probe = remote_session_config(config)
    probe.operation_timeout_in_ms = int(remaining * 1000)
    try:
        with tf.compat.v1.Session(target, graph=tf.Graph(), config=probe) as session:
            listed = session.list_devices()
    except tf.errors.OpError as e:
        first = first_line(e)
        raise ClusterUnreachableError(
            f"the TensorFlow server at {address} did not list its cluster's devices within "
            f"{timeout_s:g} s ({type(e).__name__}: {first}): every task of its cluster spec "
            f"must run a server ({_worker_command(spec, None)}); check that none is missing "
            "and that the addresses are right"
        ) from None
    master = spec.task_at(address).name if spec is not None else None  # type: ignore[union-attr]
    if spec is not None:
        served = {device_task(d.name) for d in listed}
        given = {t.name for t in spec.tasks}
        if served != given:
            raise ConfigError(
                f"the cluster spec lists the tasks {', '.join(sorted(given))}, but the server at "
                f"{address} belongs to a cluster of {', '.join(sorted(served))}: give the cluster "
                "spec its servers were started with"
            )
    devices = devices_from_listing(
        [(d.name, d.device_type, d.memory_limit_bytes) for d in listed],
        master_task=master,
        num_devices_per_task=num_devices_per_task,
        memory_bytes_per_device=memory_bytes_per_device,
        memory_fraction=memory_fraction,
        comm=comm,
        inter_host_comm=inter_host_comm,
    )
    log.info(
        "cluster at %s: %d placement targets on %d tasks",
        target,
        devices.cluster.num_devices,
        len({d.task for d in devices.cluster.devices}),
    )
    return DistributedSetup(spec=spec, target=target, devices=devices)


def _comm(value: Union[str, CommCost, None]) -> Optional[CommCost]:
    if value is None or value == "":
        return None
    return value if isinstance(value, CommCost) else CommCost.parse(value)


def cluster_from_flags(
    cluster_spec: Optional[str] = None,
    *,
    num_devices: Optional[int] = None,
    memory_per_device: Union[str, int, None] = None,
    memory_fraction: float = 1.0,
    comm_cost_coeffs: Union[str, CommCost, None] = None,
    inter_host_comm_cost_coeffs: Union[str, CommCost, None] = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    config: Any = None,
    environ: Optional[Mapping[str, str]] = None,
) -> Optional[DistributedSetup]:
    """The cluster of ``--cluster_spec`` (else ``TF_CONFIG``) and its devices; None when neither
    is set (one machine). The arguments are the command-line flags' values: `num_devices` per
    task (None: every device of each task), `memory_per_device` as '8GiB' or bytes, the
    coefficients as 'slope,intercept' or `CommCost` (`inter_host_comm_cost_coeffs` None: the
    intra-host line), `config` the sessions' base ``ConfigProto``."""
    check_timeout(timeout_s)
    spec = resolve_cluster_spec(cluster_spec, environ)
    if spec is None:
        return None
    memory = memory_per_device if isinstance(memory_per_device, int) else resolve_memory(memory_per_device)
    return discover_devices(
        spec=spec,
        num_devices_per_task=num_devices,
        memory_bytes_per_device=memory,
        memory_fraction=memory_fraction,
        comm=_comm(comm_cost_coeffs) or DEFAULT_COMM,
        inter_host_comm=_comm(inter_host_comm_cost_coeffs),
        timeout_s=timeout_s,
        config=config,
    )


def placement_by_host(op_to_device: Mapping[str, str]) -> str:
    """Lines ``task: N ops (device: n, ...)`` counting the ops each task and device runs."""
    per_task: dict[str, collections.Counter] = {}
    for device in op_to_device.values():
        per_task.setdefault(device_task(device) or "(this process)", collections.Counter())[device] += 1
    lines = []
    for task in sorted(per_task):
        counts = per_task[task]
        detail = ", ".join(f"{d[len(task):].lstrip('/') or d}: {n}" for d, n in sorted(counts.items()))
        lines.append(f"{task}: {sum(counts.values())} ops ({detail})")
    return "\n".join(lines)
