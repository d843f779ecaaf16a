"""A whole cluster of workers on this machine, for tests, examples and benchmarks.

`start_local_workers` starts one worker process per task (``python -m
baechi_tf.rewriter.distributed``) on loopback ports, each task in its own process group, waits
until every server runs, and stops them on exit, on error, at interpreter exit and when this
process dies (a worker started so exits when its stdin closes). A worker can be held to some
cores (every thread of its process, TF's and gRPC's, runs only there) and given TF's thread pool
sizes: a task pinned to one core with pools of one thread is one device that runs one op at a
time, beside the other tasks' cores. No TensorFlow in this process.
"""

from __future__ import annotations

import atexit
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any, Optional, Sequence, Union

from baechi_tf.errors import ConfigError
from baechi_tf.rewriter.distributed.discovery import wait_for_tasks
from baechi_tf.rewriter.distributed.spec import (
    _READY,
    _WORKER_MODULE,
    ClusterSpec,
    ClusterUnreachableError,
)

__all__ = ["LocalWorkers", "start_local_workers"]

log = logging.getLogger(__name__)


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
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
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
