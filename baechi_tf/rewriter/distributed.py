"""Clusters of several TensorFlow tasks: the cluster spec, device discovery and local workers.

Several hosts run TensorFlow's own distributed runtime: one ``tf.distribute.Server`` per task
(gRPC), all started with the same cluster spec, and a client whose ``tf.compat.v1`` session
targets one of them, the master (``grpc://host:port``). The devices of every task are then
placement targets under their full names (``/job:worker/replica:0/task:1/device:GPU:0``), and a
``FULL_TRACE`` run's step stats hold the remote tasks' devices too, so profiling works unchanged.

* **Cluster spec**: a JSON object like ``TF_CONFIG``'s ``"cluster"``
  (``{"worker": ["host0:2222", "host1:2222"]}``), a file holding one, or ``TF_CONFIG`` itself
  (`resolve_cluster_spec`: the flag wins over the environment).
* **Devices** (`discover_devices`): the client asks the master for the cluster's devices (a
  session's ``list_devices``), within a bounded time; before that it checks that every task's
  port accepts connections, so that an absent worker is named in the error
  (`ClusterUnreachableError`) instead of TensorFlow waiting for it forever. As on one machine
  (`baechi_tf.rewriter.devices`), a task with GPUs contributes its GPUs; a task without them its
  virtual CPU devices CPU:1..CPU:N, which stand in for GPUs (a worker started with
  ``--num_devices=N`` has N + 1 CPU devices; CPU:0 is its host). The master's CPU:0 is the host
  of the placement (ops pinned to ``/cpu:0``). Devices of one task share the intra-task
  communication line, devices of different tasks pay the inter-host one
  (`baechi_tf.cluster.Cluster.link`).
* **Sessions** against a cluster isolate their state (``isolate_session_state``): the profiling
  session and the placed session hold variables of the same names on the same servers, which
  must not be shared.
* **Workers**: ``python -m baechi_tf.rewriter.distributed --cluster_spec=... --task_index=i
  --num_devices=N`` runs task i; `start_local_workers` starts a whole cluster on loopback ports
  of this machine, each task in its own process group, and stops it on exit, on error, at
  interpreter exit and when this process dies (a worker started so exits when its stdin closes).
  A worker can be held to some cores (``--cpu_cores``: every thread of its process, TF's and
  gRPC's, runs only there) and given TF's thread pool sizes (``--inter_op_threads``,
  ``--intra_op_threads``): a task pinned to one core with pools of one thread is one device that
  runs one op at a time, beside the other tasks' cores.

Only `discover_devices`, `remote_session_config` and the worker's ``main`` import TensorFlow.
"""

from __future__ import annotations

import argparse
import atexit
import collections
import dataclasses
import json
import logging
import math
import os
import re
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

from baechi_tf import interrupts
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

__all__ = [
    "ClusterSpec",
    "ClusterTask",
    "ClusterUnreachableError",
    "DistributedSetup",
    "LocalWorkers",
    "check_timeout",
    "cluster_from_flags",
    "devices_from_listing",
    "discover_devices",
    "is_remote_target",
    "parse_cluster_spec",
    "placement_by_host",
    "remote_session_config",
    "resolve_cluster_spec",
    "start_local_workers",
    "wait_for_tasks",
]

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 30.0
_JOB = re.compile(r"^[A-Za-z0-9_]+$")
_READY = "baechi worker ready"
_WAKE_S = 0.25  # a serving worker's longest wait before it sees a Ctrl-C
_WORKER_MODULE = "baechi_tf.rewriter.distributed"


class ClusterUnreachableError(ConfigError):
    """A task of the cluster did not answer within the time allowed."""


# ---------------------------------------------------------------------------- the cluster spec


def _split_address(address: str) -> tuple[str, int]:
    """('host', port) of ``'host:port'`` or ``'[v6]:port'``; `ConfigError` otherwise."""
    host, sep, port = str(address).rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not (0 < int(port) < 65536):
        raise ConfigError(
            f"task address {address!r} is not 'host:port' (e.g. 'localhost:2222'); fix it in "
            "--cluster_spec or TF_CONFIG"
        )
    return host, int(port)


@dataclasses.dataclass(frozen=True)
class ClusterTask:
    """One task of a cluster spec."""

    job: str  # job name, e.g. 'worker'
    index: int  # task index within the job
    address: str  # 'host:port' its server listens on

    @property
    def name(self) -> str:
        """``'/job:worker/replica:0/task:1'``, the prefix of its devices' names."""
        return f"/job:{self.job}/replica:0/task:{self.index}"


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    """The tasks of a TF cluster: job name -> task addresses by index (TF_CONFIG's "cluster")."""

    jobs: tuple[tuple[str, tuple[str, ...]], ...]  # (job, addresses by task index), by job name

    def __post_init__(self) -> None:
        jobs = tuple(sorted((str(j), tuple(str(a) for a in addrs)) for j, addrs in self.jobs))
        object.__setattr__(self, "jobs", jobs)
        if not jobs or not any(addrs for _, addrs in jobs):
            raise ConfigError(
                "the cluster spec has no task; give e.g. '{\"worker\": [\"localhost:2222\", "
                "\"localhost:2223\"]}'"
            )
        seen: dict[str, str] = {}
        for job, addrs in jobs:
            if not _JOB.match(job):
                raise ConfigError(f"job name {job!r} in the cluster spec: use letters, digits, _")
            for i, address in enumerate(addrs):
                _split_address(address)
                name = f"/job:{job}/replica:0/task:{i}"
                if address in seen:
                    raise ConfigError(
                        f"tasks {seen[address]} and {name} of the cluster spec share the address "
                        f"{address!r}; give each task its own port"
                    )
                seen[address] = name

    @classmethod
    def from_dict(cls, cluster: Mapping[str, Any], where: str = "the cluster spec") -> "ClusterSpec":
        if not isinstance(cluster, Mapping):
            raise ConfigError(
                f"{where} is not a JSON object of job names to address lists, e.g. "
                "'{\"worker\": [\"localhost:2222\", \"localhost:2223\"]}'"
            )
        jobs = []
        for job, addrs in cluster.items():
            if isinstance(addrs, Mapping):  # TF's sparse form, {index: address}, when complete
                try:
                    by_index = {int(i): a for i, a in addrs.items()}
                except (TypeError, ValueError):
                    by_index = {}
                if by_index and sorted(by_index) == list(range(len(by_index))):
                    addrs = [by_index[i] for i in range(len(by_index))]
            if isinstance(addrs, str) or not isinstance(addrs, Sequence):
                raise ConfigError(
                    f"job {job!r} of {where} is {addrs!r}; give a list of 'host:port' addresses, "
                    "one per task in task order"
                )
            jobs.append((job, tuple(addrs)))
        return cls(tuple(jobs))

    def as_dict(self) -> dict[str, list[str]]:
        """``{job: [address, ...]}``, what ``tf.train.ClusterSpec`` and TF_CONFIG take."""
        return {job: list(addrs) for job, addrs in self.jobs}

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), sort_keys=True, separators=(",", ":"))

    @property
    def tasks(self) -> tuple[ClusterTask, ...]:
        """Every task: the master first, then by job name and index."""
        tasks = [ClusterTask(job, i, a) for job, addrs in self.jobs for i, a in enumerate(addrs)]
        master = self.master
        return (master,) + tuple(t for t in tasks if t != master)

    @property
    def master(self) -> ClusterTask:
        """The task sessions target: task 0 of 'chief', else of 'worker', else of the first job."""
        by_job = dict(self.jobs)
        for job in ("chief", "worker"):
            if by_job.get(job):
                return ClusterTask(job, 0, by_job[job][0])
        job, addrs = next((j, a) for j, a in self.jobs if a)
        return ClusterTask(job, 0, addrs[0])

    @property
    def target(self) -> str:
        """``'grpc://host:port'`` of the master."""
        return "grpc://" + self.master.address

    def task_at(self, address: str) -> Optional[ClusterTask]:
        """The task listening at `address` (as written in the spec), or None."""
        return next((t for t in self.tasks if t.address == address), None)


def _load_json(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(
            f"{where} is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); give e.g. "
            + (
                "'{\"cluster\": {\"worker\": [\"localhost:2222\"]}, \"task\": {\"type\": \"worker\", "
                "\"index\": 0}}'"
                if "TF_CONFIG" in where
                else "'{\"worker\": [\"localhost:2222\", \"localhost:2223\"]}'"
            )
        ) from None


def parse_cluster_spec(value: Union[ClusterSpec, Mapping[str, Any], str, os.PathLike]) -> ClusterSpec:
    """A `ClusterSpec` from a spec, a dict, JSON text or the path of a JSON file.

    The JSON is either the cluster (``{"worker": [...]}``) or a whole TF_CONFIG document
    (``{"cluster": {...}, "task": {...}}``), whose ``"cluster"`` is taken.
    """
    if isinstance(value, ClusterSpec):
        return value
    where = "the cluster spec"
    if callable(getattr(value, "as_dict", None)) and not isinstance(value, (str, os.PathLike)):
        value = value.as_dict()  # a tf.train.ClusterSpec
    if isinstance(value, Mapping):
        doc: Any = value
    elif not str(os.fspath(value) if isinstance(value, os.PathLike) else value).strip():
        raise ConfigError(
            "the cluster spec is empty; give a JSON cluster such as '{\"worker\": "
            "[\"localhost:2222\"]}' or the path of a file holding one, or leave it out"
        )
    else:
        text = os.fspath(value) if isinstance(value, os.PathLike) else str(value)
        if text.lstrip().startswith(("{", "[")):
            doc = _load_json(text, "--cluster_spec")
        else:
            where = f"cluster spec file {text!r}"
            try:
                with open(text, encoding="utf-8") as f:
                    doc = _load_json(f.read(), where)
            except OSError as e:
                raise ConfigError(
                    f"cannot read {where} ({e.strerror}); give a JSON cluster such as "
                    "'{\"worker\": [\"localhost:2222\"]}' or the path of a file holding one"
                ) from None
    if isinstance(doc, Mapping) and isinstance(doc.get("cluster"), Mapping):
        doc = doc["cluster"]
    return ClusterSpec.from_dict(doc, where)


def resolve_cluster_spec(
    flag_value: Optional[Union[ClusterSpec, Mapping[str, Any], str]] = None,
    environ: Optional[Mapping[str, str]] = None,
) -> Optional[ClusterSpec]:
    """The cluster of `flag_value` when given, else of ``TF_CONFIG``, else None (one machine)."""
    if flag_value is not None:  # an empty one too, which is an error, not one machine
        return parse_cluster_spec(flag_value)
    environ = os.environ if environ is None else environ
    text = environ.get("TF_CONFIG", "").strip()
    if not text:
        return None
    doc = _load_json(text, "the TF_CONFIG environment variable")
    if not isinstance(doc, Mapping):
        raise ConfigError(
            "the TF_CONFIG environment variable is not a JSON object; give e.g. '{\"cluster\": "
            "{\"worker\": [\"localhost:2222\"]}, \"task\": {\"type\": \"worker\", \"index\": 0}}', or unset it"
        )
    if "cluster" not in doc:
        return None
    return ClusterSpec.from_dict(doc["cluster"], "TF_CONFIG's \"cluster\"")


def _tf_config_task(environ: Mapping[str, str]) -> tuple[Optional[str], Optional[int]]:
    """(type, index) of TF_CONFIG's "task", when set."""
    text = environ.get("TF_CONFIG", "").strip()
    if not text:
        return None, None
    doc = _load_json(text, "the TF_CONFIG environment variable")
    task = doc.get("task") if isinstance(doc, Mapping) else None
    if not isinstance(task, Mapping):
        return None, None
    index = task.get("index")
    if index is None:
        return task.get("type"), None
    try:
        return task.get("type"), int(index)
    except (TypeError, ValueError):
        raise ConfigError(
            f"TF_CONFIG's task index {index!r} is not a whole number; give e.g. "
            "'{\"task\": {\"type\": \"worker\", \"index\": 0}}'"
        ) from None


# ---------------------------------------------------------------------------- reaching the tasks


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


# ---------------------------------------------------------------------------- local workers


def _free_ports(count: int, host: str) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _tail(path: str, lines: int = 8) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return ""
    kept = [line for line in text.splitlines() if line.strip()][-lines:]
    return "\n".join(kept)


class LocalWorkers:
    """TF servers on loopback ports of this machine, one process (and process group) per task.

    Made by `start_local_workers`; a context manager: leaving it, normally or by an exception
    (Ctrl-C included), stops every worker, and so does the interpreter's exit. A worker also
    exits by itself when its stdin closes, i.e. when this process dies, however it dies.
    """

    def __init__(
        self,
        spec: ClusterSpec,
        processes: Sequence[subprocess.Popen],
        log_dir: str,
        own_log_dir: bool,
    ) -> None:
        self.spec = spec
        self.processes = tuple(processes)
        self.log_dir = log_dir
        self._own_log_dir = own_log_dir
        self._stopped = False
        atexit.register(self.stop)

    @property
    def target(self) -> str:
        return self.spec.target

    @property
    def pids(self) -> tuple[int, ...]:
        return tuple(p.pid for p in self.processes)

    def log_path(self, task_index: int) -> str:
        return os.path.join(self.log_dir, f"task{task_index}.log")

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stops every worker: closes its stdin, then SIGTERM, then SIGKILL to its group."""
        if self._stopped:
            return
        self._stopped = True
        atexit.unregister(self.stop)
        for p in self.processes:
            if p.stdin is not None and not p.stdin.closed:
                try:
                    p.stdin.close()
                except OSError:
                    pass
        for sig in (None, signal.SIGTERM, signal.SIGKILL):
            for p in self.processes:
                if sig is not None and p.poll() is None:  # not reaped: its pid is still ours
                    try:
                        os.killpg(p.pid, sig)
                    except ProcessLookupError:
                        pass
            deadline = time.monotonic() + (timeout_s / 3 if sig != signal.SIGKILL else timeout_s)
            for p in self.processes:
                try:
                    p.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
            if all(p.poll() is not None for p in self.processes):
                break
        for p in self.processes:
            if p.stdout is not None:
                p.stdout.close()
        if self._own_log_dir:
            for i in range(len(self.processes)):
                try:
                    os.unlink(self.log_path(i))
                except OSError:
                    pass
            try:
                os.rmdir(self.log_dir)
            except OSError:
                pass

    def __enter__(self) -> "LocalWorkers":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _spawn(
    spec: ClusterSpec,
    job: str,
    num_devices: int,
    log_dir: str,
    python: str,
    cpu_cores: Optional[Sequence[Sequence[int]]] = None,
    threads: tuple[int, int] = (0, 0),
) -> list[subprocess.Popen]:
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.pop("TF_CONFIG", None)
    processes = []
    for i, _ in enumerate(dict(spec.jobs)[job]):
        with open(os.path.join(log_dir, f"task{i}.log"), "wb") as log_file:
            processes.append(
                subprocess.Popen(
                    [
                        python, "-m", _WORKER_MODULE, f"--cluster_spec={spec.to_json()}",
                        f"--job={job}", f"--task_index={i}", f"--num_devices={num_devices}",
                        f"--inter_op_threads={threads[0]}", f"--intra_op_threads={threads[1]}",
                        "--exit_on_stdin_eof",
                    ]
                    + ([f"--cpu_cores={','.join(str(c) for c in cpu_cores[i])}"] if cpu_cores else []),
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log_file,
                    env=env,
                    start_new_session=True,  # own process group: Ctrl-C reaches only the parent
                )
            )
    return processes


def _await_ready(processes: Sequence[subprocess.Popen], deadline: float) -> Optional[int]:
    """Waits for each worker's ready line; the index of one that exited first, else None."""
    waiting = {p.stdout.fileno(): i for i, p in enumerate(processes)}  # type: ignore[union-attr]
    buffers = {fd: b"" for fd in waiting}
    while waiting:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        readable, _, _ = select.select(list(waiting), [], [], min(remaining, 0.5))
        for fd in readable:
            chunk = os.read(fd, 4096)
            buffers[fd] += chunk
            if _READY.encode() in buffers[fd]:
                del waiting[fd]
            elif not chunk:  # EOF before the ready line: the worker has exited
                processes[waiting[fd]].wait()
                return waiting[fd]
        for fd, i in list(waiting.items()):
            if processes[i].poll() is not None:
                return i
    if waiting:
        raise ClusterUnreachableError(
            f"local workers {sorted(waiting.values())} did not start within the time allowed; "
            "raise timeout_s (a busy machine imports TensorFlow slowly)"
        )
    return None


def start_local_workers(
    num_workers: int = 2,
    num_devices_per_worker: int = 2,
    *,
    timeout_s: float = 120.0,
    job: str = "worker",
    host: str = "127.0.0.1",
    log_dir: Optional[str] = None,
    python: str = sys.executable,
    cpu_cores: Optional[Sequence[Union[int, Sequence[int]]]] = None,
    inter_op_threads: int = 0,
    intra_op_threads: int = 0,
) -> LocalWorkers:
    """Starts a cluster of `num_workers` TF servers on free ports of `host` (loopback).

    Each worker is its own process in its own process group, with `num_devices_per_worker`
    virtual CPU devices standing in for GPUs (CPU:1..N; CPU:0 is its host), or with
    TensorFlow's own devices alone when it is 0 (on a machine without GPUs: CPU:0). Returns once
    every worker listens; the workers' TensorFlow logs go to ``{log_dir}/task{i}.log`` (a
    temporary directory by default, removed on stop). A port taken in between is retried with
    new ports.

    `cpu_cores`, one entry per worker (a core number or a list of them), holds every thread of
    worker i to those cores; `inter_op_threads` and `intra_op_threads` (0: TensorFlow chooses)
    size its servers' thread pools. A worker on one core with pools of one thread runs one op at
    a time, as one device does.
    """
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise ConfigError(f"num_workers={num_workers!r}; start at least one worker")
    if isinstance(num_devices_per_worker, bool) or not isinstance(num_devices_per_worker, int) \
            or num_devices_per_worker < 0:
        raise ConfigError(
            f"num_devices_per_worker={num_devices_per_worker!r}; give 0 (TensorFlow's own "
            "devices) or more"
        )
    for name, value in (("inter_op_threads", inter_op_threads), ("intra_op_threads", intra_op_threads)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"{name}={value!r}; give a whole number of threads, 0 to let TensorFlow choose")
    cores = _worker_cores(cpu_cores, num_workers)
    own = log_dir is None
    directory = tempfile.mkdtemp(prefix="baechi_workers_") if own else str(log_dir)
    os.makedirs(directory, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    for attempt in range(3):
        spec = ClusterSpec(((job, tuple(f"{host}:{p}" for p in _free_ports(num_workers, host))),))
        processes = _spawn(spec, job, num_devices_per_worker, directory, python, cores,
                           (inter_op_threads, intra_op_threads))
        workers = LocalWorkers(spec, processes, directory, own)
        try:
            failed = _await_ready(workers.processes, deadline)
            if failed is None:
                wait_for_tasks([t.address for t in spec.tasks], max(1.0, deadline - time.monotonic()),
                               spec=spec)
                log.info("started %d local workers: %s", num_workers, spec.to_json())
                return workers
            tail = _tail(workers.log_path(failed))
        except BaseException:
            workers.stop()
            raise
        code = workers.processes[failed].returncode
        workers._own_log_dir = False  # keep the log for the message below
        workers.stop()
        taken = any(s in tail.lower() for s in ("address already in use", "could not start grpc server"))
        if not taken or attempt == 2:
            raise ConfigError(
                f"local worker {failed} exited with status {code} before it listened; its log "
                f"({workers.log_path(failed)}) ends with:\n{tail}"
            )
        log.info("port taken meanwhile; starting the local workers again on other ports")
    raise AssertionError("unreachable")


def _worker_cores(
    cpu_cores: Optional[Sequence[Union[int, Sequence[int]]]], num_workers: int
) -> Optional[list[list[int]]]:
    """`cpu_cores` as one list of cores per worker (None: no pinning); `ConfigError` when its
    length is not `num_workers` or a core is not one this process may run on."""
    if cpu_cores is None:
        return None
    cores = [[c] if isinstance(c, int) and not isinstance(c, bool) else list(c) for c in cpu_cores]
    if len(cores) != num_workers:
        raise ConfigError(
            f"cpu_cores gives {len(cores)} entr{'y' if len(cores) == 1 else 'ies'} for "
            f"{num_workers} workers; give one core (or list of cores) per worker"
        )
    allowed = os.sched_getaffinity(0)
    for i, worker in enumerate(cores):
        bad = [c for c in worker if isinstance(c, bool) or not isinstance(c, int) or c not in allowed]
        if not worker or bad:
            raise ConfigError(
                f"cpu_cores[{i}]={worker!r}: give cores this process may run on "
                f"({', '.join(str(c) for c in sorted(allowed))})"
            )
    return cores


# ---------------------------------------------------------------------------- the worker


def _server_config(num_devices: int, inter_op_threads: int = 0, intra_op_threads: int = 0) -> Any:
    import tensorflow as tf

    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=inter_op_threads,
                                      intra_op_parallelism_threads=intra_op_threads)
    if num_devices and len(tf.config.list_physical_devices("GPU")) < num_devices:
        config.device_count["CPU"] = num_devices + 1  # CPU:1..N stand in for GPUs
    return config


def _pin_threads(cores: set[int]) -> None:
    """Holds every thread of this process to `cores`: the ones running now (numpy's BLAS may
    have started some at import) and, through the calling thread, every one made later."""
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = []
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cores)
        except ProcessLookupError:  # ended meanwhile
            pass
    os.sched_setaffinity(0, cores)


def _parse_cores(text: str) -> set[int]:
    """The cores of ``--cpu_cores`` ('0', '0,2' or '0-3'); `ConfigError` when not so."""
    cores: set[int] = set()
    try:
        for part in text.split(","):
            low, _, high = part.strip().partition("-")
            cores.update(range(int(low), int(high or low) + 1))
    except ValueError:
        cores = set()
    if not cores or min(cores) < 0:
        raise ConfigError(f"--cpu_cores={text!r}: give core numbers such as '0', '0,2' or '0-3'")
    return cores


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m baechi_tf.rewriter.distributed``: runs one task's TF server until stopped."""
    parser = argparse.ArgumentParser(
        prog=f"python -m {_WORKER_MODULE}",
        description="Runs one task of a TensorFlow cluster (tf.distribute.Server) for baechi_tf.",
    )
    parser.add_argument(
        "--cluster_spec",
        default=None,
        help="JSON cluster ({\"worker\": [\"host:port\", ...]}) or a file holding it "
        "(default: TF_CONFIG's)",
    )
    parser.add_argument("--job", default=None, help="this task's job (default: TF_CONFIG's, else worker)")
    parser.add_argument("--task_index", type=int, default=None, help="this task's index (default: TF_CONFIG's, else 0)")
    parser.add_argument(
        "--num_devices",
        type=int,
        default=0,
        help="devices to offer: with fewer GPUs than this, N + 1 virtual CPU devices whose "
        "CPU:1..N stand in for GPUs; 0: TensorFlow's own devices (default: %(default)s)",
    )
    parser.add_argument(
        "--cpu_cores",
        default=None,
        help="run every thread of this task on these cores only ('0', '0,2', '0-3'; "
        "default: wherever the OS schedules them)",
    )
    parser.add_argument("--inter_op_threads", type=int, default=0,
                        help="threads that run ops side by side (0: TensorFlow chooses)")
    parser.add_argument("--intra_op_threads", type=int, default=0,
                        help="threads within one op (0: TensorFlow chooses)")
    parser.add_argument(
        "--exit_on_stdin_eof",
        action="store_true",
        help="exit when stdin closes (how start_local_workers ties a worker to its parent)",
    )
    args = parser.parse_args(argv)
    prog = f"python -m {_WORKER_MODULE}"
    # TF's C++ start-up lines would come before an error line (start_local_workers' do the same).
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        with interrupts.recording():
            return _serve(args)  # returns only on an error: a server runs until stopped
    except BaseException as e:
        status = interrupts.exit_status(e, interrupted=f"{prog}: interrupted; server stopped",
                                        failed=f"{prog}: error: ")
        sys.stderr.flush()
        os._exit(status)  # the server's threads never end by themselves


def _serve(args: argparse.Namespace) -> int:
    """Starts this task's server and waits, until stdin closes (`--exit_on_stdin_eof`) or for
    ever; `ConfigError` for a task the spec lacks or an address the server cannot take."""
    if args.num_devices < 0:
        raise ConfigError(f"--num_devices={args.num_devices}: give 0 (TensorFlow's own devices) or more")
    if args.inter_op_threads < 0 or args.intra_op_threads < 0:
        raise ConfigError("--inter_op_threads and --intra_op_threads: give 0 (TensorFlow chooses) or more")
    if args.cpu_cores is not None:
        cores = _parse_cores(args.cpu_cores)
        try:  # before TensorFlow starts a thread: each thread it makes inherits the cores
            _pin_threads(cores)
        except OSError as e:
            raise ConfigError(
                f"--cpu_cores={args.cpu_cores!r}: cannot run on those cores ({e.strerror}); this "
                f"machine lets it run on {sorted(os.sched_getaffinity(0))}"
            ) from None
    spec = resolve_cluster_spec(args.cluster_spec)
    if spec is None:
        raise ConfigError("give --cluster_spec or set TF_CONFIG")
    env_job, env_index = _tf_config_task(os.environ)
    job = args.job or env_job or "worker"
    index = args.task_index if args.task_index is not None else (env_index or 0)
    addresses = dict(spec.jobs).get(job, ())
    if not (0 <= index < len(addresses)):
        raise ConfigError(
            f"task {job}:{index} is not in the cluster spec {spec.to_json()}; give a --job "
            "and --task_index it lists"
        )
    from baechi_tf._startup import import_tensorflow_quietly, native_stderr_quiet

    import_tensorflow_quietly()
    import tensorflow as tf

    try:
        with native_stderr_quiet():  # gRPC's own error lines: the ConfigError says it in one
            server = tf.distribute.Server(  # held until the process ends
                tf.train.ClusterSpec(spec.as_dict()),
                job_name=job,
                task_index=index,
                config=_server_config(args.num_devices, args.inter_op_threads, args.intra_op_threads),
                start=True,
            )
    except tf.errors.OpError as e:
        first = first_line(e)
        raise ConfigError(
            f"cannot start the server of /job:{job}/task:{index} at {addresses[index]} ({first}): "
            "is the port in use, or the host not this machine's? give another address"
        ) from None
    print(f"{_READY} /job:{job}/replica:0/task:{index} at {addresses[index]}", flush=True)
    if args.exit_on_stdin_eof:
        while sys.stdin.buffer.read(65536):
            pass
        sys.stdout.flush()
        os._exit(0)  # the server's threads never end by themselves
    # Not server.join(), which waits in C++, where Ctrl-C never reaches Python; nor one long
    # wait, which a Ctrl-C that comes just before it would leave waiting.
    while True:  # `server` stays referenced meanwhile
        time.sleep(_WAKE_S)


if __name__ == "__main__":
    sys.exit(main())
