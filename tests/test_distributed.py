"""Several hosts: cluster specs, device discovery, local workers, placing and training on them.

The workers are ``tf.distribute.Server`` processes on loopback ports of this machine, two virtual
devices each. Nothing here sleeps: waits are on pipes (select), on process exits (pidfds,
``Popen.wait(timeout)``) and on ports, each with a deadline.
"""

import json
import math
import os
import pathlib
import re
import select
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from baechi_tf import BaechiSession, CommCost, ConfigError
from baechi_tf.cli import main as baechi_main
from baechi_tf.cost_model import profile_fetch, profiling_config, save_profile
from baechi_tf.cost_model.executed import where_ops_ran
from baechi_tf.rewriter.devices import DEFAULT_MEMORY_BYTES_PER_DEVICE
from baechi_tf.rewriter.distributed import (
    ClusterSpec,
    ClusterUnreachableError,
    cluster_from_flags,
    devices_from_listing,
    discover_devices,
    parse_cluster_spec,
    placement_by_host,
    remote_session_config,
    resolve_cluster_spec,
    start_local_workers,
)
from baechi_tf.rewriter.distributed.spec import _tf_config_task
import ctrl_c
from loaded import run_listing_modules
from tf_models import build_lstm, profiled_lstm

pytestmark = [pytest.mark.tf, pytest.mark.distributed]

ROOT = pathlib.Path(__file__).resolve().parents[1]
W0, W1 = "/job:worker/replica:0/task:0", "/job:worker/replica:0/task:1"
STEPS = 3


# ---------------------------------------------------------------------------- helpers


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gone(pid: int) -> bool:
    """Whether `pid` has exited (a zombie counts as exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def wait_gone(pids, timeout_s: float = 20.0) -> list:
    """Waits on a pidfd per process until each has exited; returns those still alive."""
    deadline = time.monotonic() + timeout_s
    alive = []
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            while not _gone(pid):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    alive.append(pid)
                    break
                select.select([fd], [], [], remaining)
        finally:
            os.close(fd)
    return alive


def read_line_matching(proc: subprocess.Popen, pattern: str, timeout_s: float) -> re.Match:
    """Reads `proc`'s stdout until a line matches `pattern`, with a deadline."""
    deadline = time.monotonic() + timeout_s
    fd = proc.stdout.fileno()
    buffer = b""
    while True:
        for line in buffer.decode(errors="replace").splitlines():
            match = re.search(pattern, line)
            if match:
                return match
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"no line matching {pattern!r} within {timeout_s} s: {buffer!r}"
        readable, _, _ = select.select([fd], [], [], remaining)
        if readable:
            chunk = os.read(fd, 65536)
            assert chunk, f"stdout closed before a line matched {pattern!r}: {buffer!r}"
            buffer += chunk


def _env() -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    env.pop("TF_CONFIG", None)
    return env


def _ports_closed(spec: ClusterSpec) -> bool:
    for task in spec.tasks:
        host, port = task.address.rsplit(":", 1)
        try:
            socket.create_connection((host, int(port)), timeout=1).close()
            return False
        except OSError:
            pass
    return True


@pytest.fixture(scope="module")
def workers():
    with start_local_workers(2, 2) as w:
        yield w
    assert wait_gone(w.pids) == []


# ---------------------------------------------------------------------------- cluster specs


SPEC = {"worker": ["127.0.0.1:2222", "127.0.0.1:2223"], "chief": ["127.0.0.1:2221"]}


def test_cluster_spec_from_json_a_file_and_tf_config(tmp_path):
    spec = parse_cluster_spec(json.dumps(SPEC))
    assert spec.as_dict() == SPEC
    assert spec.master.name == "/job:chief/replica:0/task:0"
    assert spec.target == "grpc://127.0.0.1:2221"
    assert [t.name for t in spec.tasks] == ["/job:chief/replica:0/task:0", W0, W1]
    path = tmp_path / "cluster.json"
    path.write_text(json.dumps({"cluster": SPEC, "task": {"type": "worker", "index": 1}}))
    assert parse_cluster_spec(str(path)) == spec
    assert parse_cluster_spec(path) == spec
    env = {"TF_CONFIG": json.dumps({"cluster": {"worker": ["127.0.0.1:3000"]}})}
    assert resolve_cluster_spec(None, env).as_dict() == {"worker": ["127.0.0.1:3000"]}
    assert resolve_cluster_spec(json.dumps(SPEC), env) == spec  # the flag wins
    assert resolve_cluster_spec(None, {}) is None
    assert resolve_cluster_spec(None, {"TF_CONFIG": "{}"}) is None
    # An empty flag ("$SPEC" unset), an empty cluster or a TF_CONFIG that is no object placed on
    # this machine alone, without a word.
    with pytest.raises(ConfigError, match="the cluster spec is empty"):
        resolve_cluster_spec("", {"TF_CONFIG": "{}"})
    with pytest.raises(ConfigError, match="has no task"):
        resolve_cluster_spec(None, {"TF_CONFIG": '{"cluster": {}}'})
    with pytest.raises(ConfigError, match="TF_CONFIG environment variable is not a JSON object"):
        resolve_cluster_spec(None, {"TF_CONFIG": "[1, 2]"})


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('{"worker": ["127.0.0.1"]}', r"not 'host:port'"),
        ('{"worker": "127.0.0.1:1"}', r"give a list of 'host:port' addresses"),
        ('{"worker": ["a:1", "a:1"]}', r"share the address 'a:1'; give each task its own port"),
        ('{"worker": []}', r"has no task"),
        ('{"worker": [', r"not valid JSON"),
        ("/no/such/cluster.json", r"cannot read cluster spec file '/no/such/cluster.json'"),
    ],
)
def test_bad_cluster_specs_say_what_to_fix(text, match):
    with pytest.raises(ConfigError, match=match):
        parse_cluster_spec(text)


def test_malformed_tf_config_is_named():
    with pytest.raises(ConfigError, match="TF_CONFIG environment variable is not valid JSON"):
        resolve_cluster_spec(None, {"TF_CONFIG": "{oops"})


# ---------------------------------------------------------------------------- devices


def _listing(gpus_on_task1: int = 0):
    listed = [(f"{W0}/device:CPU:{i}", "CPU", 1 << 28) for i in range(3)]
    listed += [(f"{W1}/device:CPU:{i}", "CPU", 1 << 28) for i in range(3 if not gpus_on_task1 else 1)]
    listed += [(f"{W1}/device:GPU:{i}", "GPU", 1 << 30) for i in range(gpus_on_task1)]
    return listed


def test_every_tasks_standins_become_targets_with_full_names():
    fast, slow = CommCost(0.0001, 10), CommCost(0.001, 500)
    setup = devices_from_listing(_listing(), memory_bytes_per_device=1 << 30, comm=fast,
                                 inter_host_comm=slow)
    assert setup.cluster.names == (
        f"{W0}/device:CPU:1", f"{W0}/device:CPU:2", f"{W1}/device:CPU:1", f"{W1}/device:CPU:2")
    assert setup.host.name == f"{W0}/device:CPU:0"
    assert setup.virtual and setup.num_cpus == 0
    assert setup.aliases == {"device:GPU:0": f"{W0}/device:CPU:1", "device:GPU:1": f"{W0}/device:CPU:2"}
    assert setup.cluster.link(0, 1) == fast and setup.cluster.link(2, 3) == fast
    assert setup.cluster.link(1, 2) == slow and setup.cluster.link(3, 0) == slow
    # Copies to the other task are RecvTensor calls, served on the pool that runs a task's ops.
    assert setup.cluster.sends_on_compute() == (True,) * 4
    # The master's task comes first, whatever the listing's order.
    again = devices_from_listing(list(reversed(_listing())), master_task=W1)
    assert again.cluster.names[0] == f"{W1}/device:CPU:1" and again.host.name == f"{W1}/device:CPU:0"


def test_gpus_are_taken_where_a_task_has_them():
    setup = devices_from_listing(_listing(gpus_on_task1=2), num_devices_per_task=2,
                                 memory_fraction=0.5)
    assert setup.cluster.names[2:] == (f"{W1}/device:GPU:0", f"{W1}/device:GPU:1")
    assert [d.memory_bytes for d in setup.cluster.devices[2:]] == [1 << 29, 1 << 29]
    # The fraction applies to the stand-ins of the task without GPUs too.
    assert [d.memory_bytes for d in setup.cluster.devices[:2]] == [DEFAULT_MEMORY_BYTES_PER_DEVICE // 2] * 2
    assert {d.type for d in setup.cluster.devices} == {"CPU", "GPU"}


def test_too_few_devices_on_a_task_say_how_to_start_it():
    # Fewer asked for: each entry point's own way (train.py has no --num_devices).
    with pytest.raises(ConfigError, match=r"task /job:worker/replica:0/task:0 has 2 virtual CPU "
                       r"devices .* but 3 devices per task .*train.py's --num_gpus, baechi place's "
                       r"--num_devices, BaechiSession's num_devices=.*--num_devices=3"):
        devices_from_listing(_listing(), num_devices_per_task=3)
    bare = [(f"{W0}/device:CPU:0", "CPU", 1 << 28)]
    with pytest.raises(ConfigError, match=r"has no GPU and no CPU device but its host CPU:0: "
                       r"start its server with N \+ 1 virtual CPU devices"):
        devices_from_listing(bare)


def test_placement_by_host_counts_ops_per_task_and_device():
    text = placement_by_host({"a": f"{W0}/device:CPU:1", "b": f"{W1}/device:CPU:2",
                              "c": f"{W1}/device:CPU:2", "d": f"{W1}/device:CPU:1"})
    assert text.splitlines() == [
        f"{W0}: 1 ops (device:CPU:1: 1)",
        f"{W1}: 3 ops (device:CPU:1: 1, device:CPU:2: 2)",
    ]


# ---------------------------------------------------------------------------- unreachable


def test_an_absent_worker_is_named_within_the_timeout():
    # Task 0's port accepts connections (a bare listener); nothing listens on task 1's.
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        up = f"127.0.0.1:{listener.getsockname()[1]}"
        down = f"127.0.0.1:{_free_port()}"
        spec = ClusterSpec((("worker", (up, down)),))
        started = time.monotonic()
        with pytest.raises(ClusterUnreachableError) as info:
            discover_devices(spec=spec, timeout_s=1.0)
        assert time.monotonic() - started < 10
    message = str(info.value)
    assert f"task {W1} at {down}" in message and up not in message.split("(python")[0]
    assert "python -m baechi_tf.rewriter.distributed" in message and "--task_index=1" in message


def test_a_session_on_an_unreachable_target_fails_fast():
    target = f"grpc://127.0.0.1:{_free_port()}"
    started = time.monotonic()
    with pytest.raises(ClusterUnreachableError, match=r"cannot reach the server at 127\.0\.0\.1:\d+ "
                       r"\(Connection refused\) within 1 s: start the TensorFlow server"):
        BaechiSession(graph=tf.Graph(), target=target, connect_timeout_s=1.0)
    assert time.monotonic() - started < 10


def test_a_port_that_is_no_tensorflow_server_fails_within_the_timeout():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        started = time.monotonic()
        with pytest.raises(ClusterUnreachableError,
                           match=rf"the TensorFlow server at {address} did not list its cluster's "
                           r"devices within 1\.5 s"):
            BaechiSession(graph=tf.Graph(), target=f"grpc://{address}", connect_timeout_s=1.5)
        assert time.monotonic() - started < 15


@pytest.mark.parametrize(
    ("args", "tf_config", "match"),
    [
        ([], None, "give --cluster_spec or set TF_CONFIG"),
        (['--cluster_spec={"worker": ["127.0.0.1:1"]}', "--task_index=3"], None,
         "task worker:3 is not in the cluster spec"),
        ([], {"cluster": {"ps": ["127.0.0.1:1"]}, "task": {"type": "ps", "index": 2}},
         "task ps:2 is not in the cluster spec"),
        (['--cluster_spec={"worker": ["127.0.0.1:1"]}', "--cpu_cores=first"], None,
         "--cpu_cores='first': give core numbers such as '0', '0,2' or '0-3'"),
        (['--cluster_spec={"worker": ["127.0.0.1:1"]}', "--cpu_cores=4000"], None,
         "--cpu_cores='4000': cannot run on those cores"),
        (['--cluster_spec={"worker": ["127.0.0.1:1"]}', "--inter_op_threads=-1"], None,
         "--inter_op_threads and --intra_op_threads: give 0 (TensorFlow chooses) or more"),
    ],
)
def test_a_worker_with_a_bad_task_says_so(args, tf_config, match):
    env = _env()
    if tf_config is not None:
        env["TF_CONFIG"] = json.dumps(tf_config)
    done = subprocess.run([sys.executable, "-m", "baechi_tf.rewriter.distributed", *args],
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2 and match in done.stderr


def test_a_worker_stops_on_ctrl_c_and_says_when_its_port_is_taken():
    # Serving, it waited in server.join(), in C++, where Ctrl-C never reached Python: it ran
    # until killed. A port already in use was a 21-line traceback and exit status 1.
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        env = _env()
        env.pop("TF_CPP_MIN_LOG_LEVEL")  # as a user starts it: TF's start-up lines came first
        done = subprocess.run(
            [sys.executable, "-m", "baechi_tf.rewriter.distributed", f'--cluster_spec={{"worker": ["127.0.0.1:{port}"]}}'],
            capture_output=True, text=True, env=env, timeout=120,
        )
    assert done.returncode == 2, done.stderr
    # One line: neither TF's start-up lines nor gRPC's own two (with absl's InitializeLog line
    # first where oneDNN is off, as TF's import then logs nothing).
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.splitlines()[-1] == (
        f"python -m baechi_tf.rewriter.distributed: error: cannot start the server of /job:worker/task:0 at "
        f"127.0.0.1:{port} (Could not start gRPC server): is the port in use, or the host not this "
        "machine's? give another address"
    )
    status, seen, err = ctrl_c.after_output(
        [sys.executable, "-m", "baechi_tf.rewriter.distributed", f'--cluster_spec={{"worker": ["127.0.0.1:{port}"]}}'],
        lambda seen: seen, env=_env(),  # its ready line
    )
    assert seen.startswith("baechi worker ready /job:worker/replica:0/task:0"), seen
    assert status == 130, err
    assert err.splitlines()[-1] == "python -m baechi_tf.rewriter.distributed: interrupted; server stopped"


def test_no_cluster_means_one_machine(monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert cluster_from_flags(None) is None


# ---------------------------------------------------------------------------- two workers


def _losses(sess, model, steps=STEPS):
    return [sess.run([model.loss, model.train_op], model.feed(i))[0] for i in range(steps)]


def test_comm_auto_times_copies_on_the_cluster(workers):
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [8, 8], name="x")
        y = tf.reduce_sum(tf.matmul(x, x))
    with BaechiSession(graph=graph, target=workers.target, comm="auto", num_devices=2,
                       warmup_steps=0, profile_steps=1) as sess:
        fit = sess.link_fit
        assert (fit.src, fit.dst) == (f"{W0}/device:CPU:1", f"{W0}/device:CPU:2")
        assert fit.note == "copies within one task" and fit.fit.num_sizes == 20
        assert sess.devices.cluster.comm == fit.fit.comm
        assert sess.devices.cluster.sends_on_compute() == (True,) * 4
        assert sess.run(y, {x: np.ones([8, 8], np.float32)}) == 512


def test_comm_auto_between_two_tasks_fits_the_copies_in_flight(workers):
    from baechi_tf.cluster import Cluster, Device
    from baechi_tf.cost_model.comm_bench import auto_comm

    devices = tuple(Device(f"{w}/device:CPU:1", 1 << 30, "CPU", sends_on_compute=True) for w in (W0, W1))
    fit = auto_comm(Cluster(devices), remote_session_config(tf.compat.v1.ConfigProto()),
                    workers.target, exponent=4)
    assert fit.note == "half round trips between two tasks" and fit.in_flight is not None
    # The spacing is timed on a shared machine, where a few microseconds between copies of 4 to
    # 32 bytes can come out either side of 0 (-2.97 us in one run): its value is not asserted,
    # only that it was fitted and gave K, which is inf where copies overlap whole.
    assert fit.in_flight.num_counts == 6 and math.isfinite(fit.in_flight.spacing_us)
    assert fit.comm.copies_in_flight >= 1 and fit.comm == fit.in_flight.comm
    assert (fit.comm.slope_us_per_byte, fit.comm.intercept_us) == (
        fit.fit.comm.slope_us_per_byte, fit.fit.comm.intercept_us)
    assert f"{fit.comm.copies_in_flight:.3g} copies in flight (copies sent together" in fit.describe()


def test_training_across_two_workers_equals_one_process_and_stops_them():
    model = build_lstm()
    with tf.compat.v1.Session(graph=model.graph) as plain:
        plain.run(model.init)
        expected = _losses(plain, model)
    full_trace = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE,
                                         output_partition_graphs=True)
    with start_local_workers(2, 2) as workers:
        assert len(set(workers.pids)) == 2
        with BaechiSession(
            graph=model.graph, target=workers.target, placement_method="m_topo",
            comm=CommCost(0.0001, 10), inter_host_comm=CommCost(0.001, 500),
            warmup_steps=0, profile_steps=1,
        ) as sess:
            sess.run(model.init)
            losses = _losses(sess, model)
            metadata = tf.compat.v1.RunMetadata()
            sess.run([model.loss, model.train_op], model.feed(0), options=full_trace,
                     run_metadata=metadata)
            report = sess.placement
            placed_def = sess.placed_graph_def
            listed = {d.name for d in sess.list_devices()}
        assert listed == {f"{t}/device:CPU:{i}" for t in (W0, W1) for i in range(3)}
        cluster = report.result.cluster
        assert cluster.link(0, 2) == CommCost(0.001, 500) and cluster.link(0, 1) == CommCost(0.0001, 10)
        # Profiling on the cluster: the traced step stats of the placed graph hold both tasks.
        graph = tf.Graph()
        with graph.as_default():
            tf.graph_util.import_graph_def(placed_def, name="")
        config = remote_session_config(profiling_config())
        with tf.compat.v1.Session(workers.target, graph=graph, config=config) as s:
            s.run(model.init.name)
            profile = profile_fetch(s, [model.loss.name, model.train_op.name],
                                    model.feed_by_name(0), warmup_steps=0, traced_steps=1)
        assert {c.device.split("/device:")[0] for c in profile.ops.values()} == {W0, W1}
    assert wait_gone(workers.pids) == []
    assert _ports_closed(workers.spec)
    np.testing.assert_allclose(losses, expected, rtol=1e-5)
    # The traced step ran ops on both tasks, each where the placement put it (Grappler's nodes
    # and fused ones where the ops they were made of are placed).
    ran = where_ops_ran(metadata.step_stats, placed_def, metadata.partition_graphs)
    placed = [n for n in ran if n in report.op_to_device]
    assert len(placed) > 250
    moved = {n: (ran[n], report.op_to_device[n]) for n in placed if ran[n] != {report.op_to_device[n]}}
    assert not moved
    assert {d.split("/device:")[0] for n in placed for d in ran[n]} == {W0, W1}


def _threads_cores(pid: int) -> set:
    """The core sets of every thread of process `pid`."""
    out = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out.add(frozenset(os.sched_getaffinity(int(tid))))
        except ProcessLookupError:  # a thread that ended meanwhile
            pass
    return out


def test_workers_pinned_to_cores_run_one_op_at_a_time_on_their_cpu0():
    cores = sorted(os.sched_getaffinity(0))
    pinned = [cores[0], cores[-1]]  # two cores when the machine has them
    with start_local_workers(2, 0, cpu_cores=pinned, inter_op_threads=1,
                             intra_op_threads=1) as workers:
        # Every thread of each task, TF's and gRPC's, started after the pin: all on its core.
        for pid, core in zip(workers.pids, pinned):
            assert _threads_cores(pid) == {frozenset([core])}
        d0, d1 = (f"{t}/device:CPU:0" for t in (W0, W1))
        graph = tf.Graph()
        with graph.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [256, 256], name="x")
            with tf.device(d0):  # two independent chains on one task
                left, right = x, x
                for i in range(4):
                    left = tf.matmul(left, x, name=f"left{i}") * 0.01
                    right = tf.matmul(right, x, name=f"right{i}") * 0.01
            with tf.device(d1):
                total = tf.add(tf.reduce_sum(left), tf.reduce_sum(right), name="total")
        value = np.full([256, 256], 0.01, np.float32)
        metadata = tf.compat.v1.RunMetadata()
        with tf.compat.v1.Session(workers.target, graph=graph,
                                  config=remote_session_config(profiling_config())) as sess:
            listed = {d.name for d in sess.list_devices()}
            got = sess.run(total, {x: value}, run_metadata=metadata, options=tf.compat.v1.RunOptions(
                trace_level=tf.compat.v1.RunOptions.FULL_TRACE))
    assert wait_gone(workers.pids) == []
    assert listed == {d0, d1}  # num_devices_per_worker=0: TF's own devices, CPU:0 alone
    chain = value
    for _ in range(4):
        chain = chain @ value * 0.01
    np.testing.assert_allclose(got, 2 * chain.sum(), rtol=1e-4)
    # One inter-op thread and one intra-op thread: the task's ops never overlap in time.
    spans = sorted(
        (ns.all_start_nanos, ns.all_start_nanos + ns.all_end_rel_nanos)
        for dev in metadata.step_stats.dev_stats if dev.device == d0
        for ns in dev.node_stats if ns.node_name.startswith(("left", "right"))
    )
    assert len(spans) == 8
    assert all(end <= start for (_, end), (start, _) in zip(spans, spans[1:])), spans


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"cpu_cores": [0]}, "cpu_cores gives 1 entry for 2 workers"),
        ({"cpu_cores": [[], [0]]}, r"cpu_cores\[0\]=\[\]: give cores this process may run on"),
        ({"cpu_cores": [0, 4000]}, r"cpu_cores\[1\]=\[4000\]"),
        ({"intra_op_threads": -1}, "intra_op_threads=-1; give a whole number of threads"),
        ({"num_devices_per_worker": -1}, "num_devices_per_worker=-1; give 0"),
    ],
)
def test_bad_pins_and_pools_are_refused_before_any_worker_starts(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        start_local_workers(2, **{"num_devices_per_worker": 0, **kwargs})


def test_an_error_inside_stops_the_workers():
    with pytest.raises(RuntimeError, match="boom"):
        with start_local_workers(1, 1) as workers:
            pids = workers.pids
            raise RuntimeError("boom")
    assert wait_gone(pids) == []



def test_a_port_taken_between_its_choice_and_the_servers_start_is_retried(monkeypatch):
    # The retry looked for "address already in use" in the worker's log; TF 2.21 says "Could not
    # start gRPC server", so the workers failed instead (multi_host.py, now and then).
    import baechi_tf.rewriter.distributed.local_workers as distributed

    chosen = []
    real = distributed._free_ports
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)

        def ports(count, host):  # the first choice is a port that is in use by then
            chosen.append(1)
            return [taken.getsockname()[1]] + real(count - 1, host) if len(chosen) == 1 else real(count, host)

        monkeypatch.setattr(distributed, "_free_ports", ports)
        with start_local_workers(1, 1, timeout_s=60) as workers:
            assert workers.spec.tasks[0].address != f"127.0.0.1:{taken.getsockname()[1]}"
            pids = workers.pids
    assert len(chosen) == 2 and wait_gone(pids) == []

def test_workers_exit_when_their_parent_is_killed(tmp_path):
    code = (
        "import sys\n"
        "from baechi_tf.rewriter.distributed import start_local_workers\n"
        "w = start_local_workers(1, 1)\n"
        "print('pids', *w.pids, flush=True)\n"
        "sys.stdin.read()\n"
    )
    with open(tmp_path / "parent.log", "wb") as log:
        parent = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=log, env=_env())
    try:
        pids = [int(p) for p in read_line_matching(parent, r"^pids ([\d ]+)$", 120).group(1).split()]
        assert not any(_gone(p) for p in pids)  # running
        parent.kill()  # no atexit, no cleanup: only the closed stdin tells the workers
        parent.wait(timeout=30)
        assert wait_gone(pids) == []
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(timeout=30)
        parent.stdin.close()
        parent.stdout.close()


def test_baechi_place_against_the_cluster(workers, tmp_path, capsys, monkeypatch):
    lstm = profiled_lstm()
    graph, cost, out = tmp_path / "g.pb", tmp_path / "cost.pb", tmp_path / "placed.pb"
    graph.write_bytes(lstm.graph_def.SerializeToString())
    save_profile(lstm.profile, cost)
    monkeypatch.delenv("TF_CONFIG", raising=False)
    assert baechi_main(["place", "--graph", str(graph), "--cost_path", str(cost), "--out", str(out),
                        "--cluster_spec", workers.spec.to_json(), "--placement_method", "m_topo",
                        "--comm_cost_coeffs", "0.0001,10",
                        "--inter_host_comm_cost_coeffs", "0.001,500"]) == 0
    printed = capsys.readouterr().out
    assert f"cluster at {workers.target}: 4 devices on 2 tasks" in printed
    assert "placement per host:" in printed and f"{W0}: " in printed and f"{W1}: " in printed
    placed = tf.compat.v1.GraphDef.FromString(out.read_bytes())
    devices = {n.device for n in placed.node}
    assert devices <= {f"{t}/device:CPU:{i}" for t in (W0, W1) for i in (1, 2)}
    assert {d.split("/device:")[0] for d in devices} == {W0, W1}
    # The placed graph runs on the cluster and trains like the unplaced one.
    g = tf.Graph()
    with g.as_default():
        tf.graph_util.import_graph_def(placed, name="")
    model = lstm.model
    with tf.compat.v1.Session(workers.target, graph=g, config=remote_session_config()) as s:
        s.run(model.init.name)
        got = [s.run([model.loss.name, model.train_op.name], model.feed_by_name(i))[0]
               for i in range(2)]
    with tf.compat.v1.Session(graph=model.graph) as s:
        s.run(model.init)
        want = [s.run([model.loss, model.train_op], model.feed(i))[0] for i in range(2)]
    np.testing.assert_allclose(got, want, rtol=1e-5)
    # TF_CONFIG stands in for --cluster_spec; --num_devices is then per task.
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": workers.spec.as_dict()}))
    assert baechi_main(["place", "--graph", str(graph), "--cost_path", str(cost), "--out", str(out),
                        "--num_devices", "1", "--placement_method", "m_topo"]) == 0
    assert f"cluster at {workers.target}: 2 devices on 2 tasks" in capsys.readouterr().out
    placed = tf.compat.v1.GraphDef.FromString(out.read_bytes())
    assert {n.device for n in placed.node} <= {f"{W0}/device:CPU:1", f"{W1}/device:CPU:1"}


def test_session_from_a_cluster_spec_or_a_wrapped_grpc_session(workers):
    model = build_lstm()
    with tf.compat.v1.Session(graph=model.graph) as plain:
        plain.run(model.init)
        expected = plain.run(model.predictions, model.feed(0))
    with BaechiSession(graph=model.graph, cluster_spec=workers.spec.to_json(), num_devices=1,
                       placement_method="m_topo", warmup_steps=0, profile_steps=1) as sess:
        assert sess.devices.cluster.names == (f"{W0}/device:CPU:1", f"{W1}/device:CPU:1")
        sess.run(model.init)
        np.testing.assert_allclose(sess.run(model.predictions, model.feed(0)), expected, rtol=1e-5)
    user = tf.compat.v1.Session(workers.target, graph=model.graph, config=remote_session_config())
    user.run(model.init)
    with BaechiSession(user, placement_method="m_topo", warmup_steps=0, profile_steps=1) as sess:
        assert sess.devices.cluster.num_devices == 4
        np.testing.assert_allclose(sess.run(model.predictions, model.feed(0)), expected, rtol=1e-5)
    with pytest.raises(ConfigError, match="is none of the cluster spec's tasks"):
        BaechiSession(graph=model.graph, cluster_spec=workers.spec,
                      target=f"grpc://127.0.0.1:{_free_port()}")



def test_a_cluster_spec_that_is_not_the_servers_is_refused(workers):
    # A spec naming only the master placed on the task it left out, without a word.
    first, _ = workers.spec.as_dict()["worker"]
    for wrong in ({"worker": [first]},):
        with pytest.raises(ConfigError, match=(
            r"the cluster spec lists the tasks .*, but the server at 127\.0\.0\.1:\d+ belongs to a cluster "
            r"of /job:worker/replica:0/task:0, /job:worker/replica:0/task:1: give the cluster spec its "
            r"servers were started with"
        )):
            discover_devices(workers.target, spec=parse_cluster_spec(json.dumps(wrong)), timeout_s=5)
    # A target with a trailing slash (TF: "Could not interpret 'host:port/' as a host-port pair").
    setup = discover_devices(workers.target + "/", spec=workers.spec, timeout_s=10)
    assert setup.target == workers.target and setup.devices.cluster.num_devices == 4


def test_cluster_specs_in_tfs_forms_and_bad_timeouts():
    spec = tf.train.ClusterSpec({"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]})
    assert parse_cluster_spec(spec).as_dict() == {"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]}
    sparse = {"worker": {"1": "127.0.0.1:2223", "0": "127.0.0.1:2222"}}  # TF's {index: address}
    assert parse_cluster_spec(sparse).as_dict() == {"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]}
    # A task index that is no number was a traceback (ValueError) in the worker.
    with pytest.raises(ConfigError, match="TF_CONFIG's task index 'x' is not a whole number"):
        _tf_config_task({"TF_CONFIG": json.dumps({"task": {"type": "worker", "index": "x"}})})
    # BaechiSession's timeout was not checked: inf waited for ever on a task that is down.
    for bad in (float("inf"), 0, -5.0, float("nan"), "3", True):
        with pytest.raises(ConfigError, match="give a positive number of seconds"):
            BaechiSession(graph=tf.Graph(), target=f"grpc://127.0.0.1:{_free_port()}", connect_timeout_s=bad)


def test_cluster_from_flags_for_train_py(workers, monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    setup = cluster_from_flags(workers.spec.to_json(), num_devices=2, memory_per_device="1GiB",
                               comm_cost_coeffs="0.0001,10", inter_host_comm_cost_coeffs="0.001,500")
    assert setup.target == workers.target and setup.spec == workers.spec
    assert setup.devices.cluster.num_devices == 4
    assert {d.memory_bytes for d in setup.devices.cluster.devices} == {1 << 30}
    assert setup.devices.cluster.link(1, 2) == CommCost(0.001, 500)


def test_communication_benchmark_measures_both_links(workers):
    done = subprocess.run(
        [sys.executable, str(ROOT / "utils" / "communication_benchmark.py"),
         f"--cluster_spec={workers.spec.to_json()}", "--exponent=3", "--num_warmup=0",
         "--num_runs=2"],
        capture_output=True, text=True, env=_env(), timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert f"{W0}/device:CPU:1 -> {W0}/device:CPU:2 of 2^0 .. 2^2" in out
    assert f"{W0}/device:CPU:1 -> {W1}/device:CPU:2 of 2^0 .. 2^2" in out
    assert "(half round trips)" in out
    intra = re.search(r"^Communication cost function: (\S+) x \+ (\S+)$", out, re.M)
    inter = re.search(r"^Inter-host communication cost function: (\S+) x \+ (\S+)$", out, re.M)
    assert intra and inter, out
    assert all(float(v) >= 0 for v in intra.groups() + inter.groups())
    assert (f"--comm_cost_coeffs={intra.group(1)},{intra.group(2)} "
            f"--inter_host_comm_cost_coeffs={inter.group(1)},{inter.group(2)}") in out


# ---------------------------------------------------------------------------- the example


def _example(tmp_path, steps: int):
    log = open(tmp_path / "example.err", "wb")
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "examples" / "multi_host.py"), "--steps", str(steps),
         "--max_seq_length", "3", "--num_layers", "2"],
        stdout=subprocess.PIPE, stderr=log, env=_env(),
        # A shell running the tests in the background may ignore SIGINT, which children inherit
        # (and Python then never raises KeyboardInterrupt); a terminal's Ctrl-C would arrive.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    log.close()
    return proc


def _started(proc) -> list:
    line = read_line_matching(proc, r"^workers started: (.*)$", 120).group(1)
    return [int(p) for p in re.findall(r"\(pid (\d+)\)", line)]


def test_example_places_gnmt_across_two_workers_and_stops_them(tmp_path):
    proc = _example(tmp_path, steps=2)
    try:
        pids = _started(proc)
        assert len(pids) == 2
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    text = out.decode()
    assert proc.returncode == 0, (tmp_path / "example.err").read_text()[-3000:]
    assert re.search(r"^placement per host \(m_etf, \d+ ops\):$", text, re.M), text
    hosts = re.findall(r"^/job:worker/replica:0/task:(\d): (\d+) ops \(", text, re.M)
    assert hosts and {t for t, _ in hosts} <= {"0", "1"}
    assert re.search(r"^step time: [\d.]+ ms \(median of 1 step after the first\)$", text, re.M)
    assert text.rstrip().endswith("workers stopped")
    assert "deprecat" not in (tmp_path / "example.err").read_text()  # TF's _colocate_with warning
    assert wait_gone(pids) == []


def test_example_stops_its_workers_on_ctrl_c(tmp_path):
    proc = _example(tmp_path, steps=100000)  # still running whenever the signal comes
    try:
        pids = _started(proc)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        proc.stdout.close()
    assert proc.returncode == 130, (tmp_path / "example.err").read_text()[-3000:]
    assert "multi_host: interrupted; workers stopped" in (tmp_path / "example.err").read_text()
    assert wait_gone(pids) == []


@pytest.mark.parametrize("flag, says", [
    ("--comm_cost_coeffs=-1,5", "--comm_cost_coeffs: communication slope_us_per_byte=-1.0"),
    ("--inter_host_comm_cost_coeffs=1", "--inter_host_comm_cost_coeffs: communication cost '1' is not"),
    ("--num_layers=1", "--num_layers of 2 or more"),
])
def test_example_refuses_bad_flags_before_starting_workers(flag, says, tmp_path):
    # They were found after both workers had started, some seconds in, without the flag's name;
    # then before the workers, but after TensorFlow had loaded (seconds).
    done, loaded = run_listing_modules([sys.executable, str(ROOT / "examples" / "multi_host.py"), flag],
                                       tmp_path, env=_env(), timeout=120)
    assert done.returncode == 2 and "workers started" not in done.stdout
    assert done.stderr.splitlines()[-1].startswith("multi_host.py: error: ") and says in done.stderr
    assert "tensorflow" not in loaded
