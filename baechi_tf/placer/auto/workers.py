"""Worker processes that place auto's candidates side by side (`place_auto`'s `remote`).

Each worker is ``python -m baechi_tf.placer.auto.workers CONTEXT LEVEL``: it loads the pickled
(graph, cluster, groups, options, fused, host) of one `auto.run_auto` call from the file
CONTEXT, builds the same candidates (`candidates.auto_candidates`), and for each (index, name,
cutoff) it reads on stdin writes back on stdout that candidate's outcome
(`portfolio.judge_candidate`: its simulated schedule, or the `BaechiError` or `ScheduleCutOff` that
stopped it) with the log records of LEVEL and above made meanwhile, which the parent logs again.

A fresh interpreter, not multiprocessing's fork or spawn: forking a process that runs
TensorFlow's threads may deadlock the child, and spawn imports the user's main module again, which
re-runs a script without a ``__main__`` guard. A worker that cannot start, dies or hits a bug
costs nothing but time: its candidate is placed in this process instead, where a bug raises
as it would without workers. Ctrl-C reaches the workers too; they ignore it, and the parent,
interrupted, kills them.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import pickle
import select
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback
from typing import BinaryIO, Callable, Optional, Sequence

__all__ = ["CandidateWorkers", "usable_cores"]

log = logging.getLogger(__name__)

_HEADER = struct.Struct(">Q")  # the length of the pickle that follows
_LOGGER = "baechi_tf"  # whose level the workers log at


def usable_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _write(stream: BinaryIO, message: object) -> None:
    blob = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(blob)))
    stream.write(blob)
    stream.flush()


def _read_exactly(stream: BinaryIO, n: int) -> Optional[bytes]:
    chunks, left = [], n
    while left:
        chunk = stream.read(left)
        if not chunk:
            return None  # the other end closed
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _read(stream: BinaryIO) -> Optional[object]:
    """The next message, None when the other end closed."""
    head = _read_exactly(stream, _HEADER.size)
    if head is None:
        return None
    blob = _read_exactly(stream, _HEADER.unpack(head)[0])
    return None if blob is None else pickle.loads(blob)


class _Worker:
    def __init__(self, process: subprocess.Popen, stderr_path: str):
        self.process = process
        self.stderr_path = stderr_path

    def why(self) -> str:
        """What the worker wrote on stderr, for the log."""
        try:
            with open(self.stderr_path, "rb") as f:
                text = f.read().decode(errors="replace").strip()
        except OSError:
            text = ""
        return text[-2000:] or f"exit status {self.process.poll()}"


class CandidateWorkers:
    """Up to `count` worker processes for one auto run, started by `start`, stopped on exit.

    `in_worker(name)` says which candidates a worker builds as this process does (`run` places
    the others here)."""

    def __init__(self, count: int, in_worker: Callable[[str], bool]):
        self.count = count
        self._in_worker = in_worker
        self._workers: list[_Worker] = []
        self._dir: Optional[str] = None

    def __enter__(self) -> "CandidateWorkers":
        return self

    def __exit__(self, kind, value, tb) -> None:
        self.close(kill=kind is not None)  # an error or Ctrl-C: the workers' work is of no use

    def start(self, context: tuple) -> None:
        """Starts the workers on `context` (`auto.run_auto`'s arguments). When they cannot
        start (an argument that does not pickle, no interpreter to run), logs why and leaves
        every candidate to this process."""
        try:
            blob = pickle.dumps(context, protocol=pickle.HIGHEST_PROTOCOL)
        except (pickle.PicklingError, TypeError, AttributeError) as e:
            log.info("auto: candidates placed in this process: its arguments do not pickle (%s)", e)
            return
        if not sys.executable:
            log.info("auto: candidates placed in this process: no Python interpreter to start workers with")
            return
        try:
            self._dir = tempfile.mkdtemp(prefix="baechi_tf-workers-")
            path = os.path.join(self._dir, "context.pickle")
            with open(path, "wb") as f:
                f.write(blob)
        except OSError as e:
            log.info("auto: candidates placed in this process: the workers' arguments could not be written (%s)", e)
            return
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in sys.path if p and os.path.isdir(p)])
        env["BAECHI_TF_PROGRESS"] = "0"
        level = str(logging.getLogger(_LOGGER).getEffectiveLevel())
        for k in range(self.count):
            stderr_path = os.path.join(self._dir, f"worker-{k}.stderr")
            try:
                with open(stderr_path, "wb") as err:
                    process = subprocess.Popen(
                        [sys.executable, "-m", __name__, path, level],
                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=env, bufsize=0,
                    )
            except OSError as e:
                log.info("auto: could not start a worker process (%s)", e)
                break
            self._workers.append(_Worker(process, stderr_path))
        if self._workers:
            log.info(
                "auto: %d worker processes (pid %s)", len(self._workers),
                ", ".join(str(w.process.pid) for w in self._workers),
            )

    def accepts(self, name: str) -> bool:
        return bool(self._workers) and self._in_worker(name)

    def run(
        self, tasks: Sequence[tuple[int, str]], cutoff: float, local: Callable[[int], object],
        done: Callable[[int], None],
    ) -> dict[int, object]:
        """`portfolio.Remote.run`: the workers take the tasks they accept, in order, one each at a
        time; this process places the others meanwhile, and those of a worker that failed."""
        outcomes: dict[int, object] = {}
        remote = [t for t in tasks if self.accepts(t[1])]
        here = [t for t in tasks if not self.accepts(t[1])]
        idle = list(self._workers)
        busy: dict[int, tuple[_Worker, tuple[int, str]]] = {}  # by the fd of its stdout
        with selectors.DefaultSelector() as selector:
            while remote or here or busy:
                while remote and idle:
                    worker, task = idle.pop(0), remote.pop(0)
                    try:
                        _write(worker.process.stdin, ("run", task[0], task[1], cutoff))
                    except OSError:  # it died: another one, or this process, places the task
                        log.warning("auto: worker %d ended (%s)", worker.process.pid, worker.why())
                        self._drop(worker)
                        remote.insert(0, task)
                        continue
                    fd = worker.process.stdout.fileno()
                    busy[fd] = (worker, task)
                    selector.register(fd, selectors.EVENT_READ)
                if remote and not idle and not busy:  # every worker failed
                    here, remote = here + remote, []
                if here:
                    index = here.pop(0)[0]
                    outcomes[index] = local(index)
                    done(index)
                    continue
                if not busy:
                    continue
                for key, _ in selector.select():
                    selector.unregister(key.fd)
                    worker, task = busy.pop(key.fd)
                    try:
                        reply = _read(worker.process.stdout)
                    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError) as e:
                        reply = ("broken", repr(e))
                    if reply is None or reply[0] != "done":
                        why = worker.why() if reply is None else reply[1]
                        log.warning(
                            "auto: worker %d failed on %s, which is placed here instead: %s",
                            worker.process.pid, task[1], why,
                        )
                        if reply is not None and reply[0] == "failed":  # a bug of that candidate's
                            idle.append(worker)
                        else:
                            self._drop(worker)
                        here.append(task)
                        continue
                    _, index, outcome, records, seconds = reply
                    for name, level, text in records:
                        logging.getLogger(name).log(level, "%s", text)
                    log.info("auto: %s placed by worker %d in %.2f s", task[1], worker.process.pid, seconds)
                    outcomes[index] = outcome
                    done(index)
                    idle.append(worker)
        return outcomes

    def _drop(self, worker: _Worker) -> None:
        """Stops a worker that failed, and gives it no more work."""
        self._workers.remove(worker)
        worker.process.kill()
        worker.process.wait()
        for stream in (worker.process.stdin, worker.process.stdout):
            try:
                stream.close()
            except OSError:
                pass

    def close(self, kill: bool = False) -> None:
        """Stops the workers and removes their files. An idle worker ends when its stdin closes;
        one still at work (or every one, with `kill`) is killed."""
        workers, self._workers = self._workers, []
        for worker in workers:
            if kill:
                worker.process.kill()
            try:
                worker.process.stdin.close()
            except OSError:
                pass
        for worker in workers:
            try:
                worker.process.wait(timeout=0.5)
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait()
            worker.process.stdout.close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None


class _Records(logging.Handler):
    """Keeps (logger name, level, message) of the records logged while a candidate runs."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[tuple[str, int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.records.append((record.name, record.levelno, record.getMessage()))
        except Exception:  # a record that cannot be formatted: as logging's handlers do
            self.handleError(record)


def _serve(context_path: str, level: int) -> None:
    """A worker's loop: one candidate per message on stdin, its outcome on stdout."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent, interrupted, stops this
    # Messages go out on a copy of stdout; anything else printed goes to stderr.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    records = _Records()
    root = logging.getLogger()
    root.handlers[:] = [records]
    root.setLevel(level)
    logging.captureWarnings(True)

    from baechi_tf.placer import engine
    from baechi_tf.placer.auto.candidates import auto_candidates, auto_work_caps
    from baechi_tf.placer.auto.portfolio import judge_candidate

    with open(context_path, "rb") as f:
        graph, cluster, groups, options, fused, host = pickle.load(f)
    judge = (graph, cluster) if host is None else (host.graph, host.cluster)
    candidates = None
    stdin = os.fdopen(0, "rb", buffering=0, closefd=False)  # unbuffered: `select` sees what is there
    # m-SCT's LP solvers (0.4 s and 0.3 s to load here) load while no candidate waits: while the
    # parent places the first ones, as a rule.
    preload = ["scipy.optimize"] + (["mosek"] if importlib.util.find_spec("mosek") is not None else [])
    while True:
        while preload and not select.select([stdin], [], [], 0)[0]:
            try:
                importlib.import_module(preload.pop(0))
            except ImportError:  # m-SCT, if it runs here, says what is missing
                pass
        message = _read(stdin)
        if message is None:
            return  # the parent is done
        _, index, name, cutoff = message
        records.records = []
        began = time.perf_counter()
        try:
            if candidates is None:
                candidates = dict(auto_candidates(graph, cluster, groups, options, fused, host))
                cap, _ = auto_work_caps(judge[0], options, len(candidates))  # as the parent's
            with engine.selected(options.engine):
                outcome = judge_candidate(*judge, candidates[name], cutoff, cap)
            _write(out, ("done", index, outcome, records.records, time.perf_counter() - began))
        except Exception:  # a bug, or an outcome that does not pickle (`_write` pickles first)
            _write(out, ("failed", traceback.format_exc()))


if __name__ == "__main__":
    _serve(sys.argv[1], int(sys.argv[2]))
