"""The cluster spec of several TensorFlow tasks, and the names its clients and workers share.

A cluster spec is a JSON object like ``TF_CONFIG``'s ``"cluster"``
(``{"worker": ["host0:2222", "host1:2222"]}``), a file holding one, or ``TF_CONFIG`` itself
(`resolve_cluster_spec`: the flag wins over the environment). `ClusterSpec` holds its tasks in
order; a bad spec is a `ConfigError` that says what to fix. Pure: no TensorFlow.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any, Mapping, Optional, Sequence, Union

from baechi_tf.errors import ConfigError

__all__ = [
    "ClusterSpec",
    "ClusterTask",
    "ClusterUnreachableError",
    "parse_cluster_spec",
    "resolve_cluster_spec",
]

_JOB = re.compile(r"^[A-Za-z0-9_]+$")
_READY = "baechi worker ready"  # the line a worker prints once its server runs
_WORKER_MODULE = "baechi_tf.rewriter.distributed"  # what ``python -m`` runs as a worker


class ClusterUnreachableError(ConfigError):
    """A task of the cluster did not answer within the time allowed."""


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
