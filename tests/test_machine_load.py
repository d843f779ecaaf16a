"""The CPU time other work took while steps were profiled: the kernel's counters, the profile's
record of it, and the warnings that tell a user the op times are suspect."""

import dataclasses
import os
import select
import signal
import subprocess
import sys
import uuid

import pytest

from baechi_tf.cost_model import machine_load
from baechi_tf.cost_model.machine_load import BUSY_SHARE, MIN_SPAN_S, LoadMeter, MachineLoad, busy_warning, cpu_counters
from baechi_tf.cost_model.profile import (
    CostProfile, OpCost, merge_profiles, profile_from_bytes, profile_to_bytes,
)
from baechi_tf.errors import ProfileError
from baechi_tf.proto import cost_profile_pb2

_LINUX = os.path.exists("/proc/stat")

# /proc/stat of a 2-CPU machine: user nice system idle iowait irq softirq steal guest guest_nice.
_STAT = """cpu  1578074 7 145197 1182345 6004 3 2964 1905 0 0
cpu0 789000 3 72000 591000 3000 1 1500 950 0 0
cpu1 789074 4 73197 591345 3004 2 1464 955 0 0
intr 123 0 0
ctxt 456
"""


_WAIT_S = 60.0  # a bound on waiting for a process's word, not a wait: past it, the test fails


def _said(fd: int, count: int, word: bytes, what: str) -> None:
    """Reads `fd` until `word` has come `count` times; fails after `_WAIT_S` without it."""
    seen = 0
    while seen < count:
        ready, _, _ = select.select([fd], [], [], _WAIT_S)
        if not ready:
            pytest.fail(f"{what}: no word {word!r} in {_WAIT_S:.0f} s ({seen} of {count})")
        seen += os.read(fd, 64).count(word)


class _Spinners:
    """As many busy processes as the machine has CPUs, of another program (a shell that exits
    leaves them to init), each saying through a FIFO that it started (``s``) and that it has
    used `burn_s` CPU seconds (``b``); killed on exit."""

    def __init__(self, tmp_path, burn_s: float = 2.0) -> None:
        self.cpus = cpu_counters(open("/proc/stat").read())[2]
        self.fifo = str(tmp_path / "spinners.fifo")
        self.marker = f"baechi_load_{uuid.uuid4().hex}"
        self.burn_s = burn_s

    def __enter__(self) -> "_Spinners":
        os.mkfifo(self.fifo)
        self.read = os.open(self.fifo, os.O_RDONLY | os.O_NONBLOCK)
        self.hold = os.open(self.fifo, os.O_WRONLY)  # a writer always there: no end of file
        spin = (f"import os, time\nfd = os.open({self.fifo!r}, os.O_WRONLY)\nos.write(fd, b's')\n"
                f"t = time.process_time()\nwhile time.process_time() - t < {self.burn_s}: pass\n"
                f"os.write(fd, b'b')\nend = time.time() + 600\nwhile time.time() < end: pass  # {self.marker}")
        for _ in range(self.cpus):
            subprocess.run(["sh", "-c", f'{sys.executable} -c "{spin}" >/dev/null 2>&1 &'], check=True)
        return self

    def started(self) -> None:
        _said(self.read, self.cpus, b"s", "the busy processes starting")

    def burned(self) -> None:
        _said(self.read, self.cpus, b"b", f"the busy processes using {self.burn_s} CPU seconds")

    def __exit__(self, *exc) -> None:
        for entry in os.listdir("/proc"):
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if self.marker.encode() in f.read():
                        os.kill(int(entry), signal.SIGKILL)
            except (OSError, ValueError):  # gone meanwhile, or not a process
                continue
        os.close(self.read)
        os.close(self.hold)


def test_the_counters_are_the_busy_columns_the_steal_and_the_cpus():
    busy, steal, cpus = cpu_counters(_STAT)
    assert busy == 1578074 + 7 + 145197 + 3 + 2964  # idle and iowait are not busy; guest is in user
    assert steal == 1905
    assert cpus == 2
    with pytest.raises(ValueError, match="no aggregate cpu line"):
        cpu_counters("cpu0 1 2 3 4 5 6 7 8\n")
    with pytest.raises(ValueError, match="3 counters, not at least 8"):
        cpu_counters("cpu 1 2 3\n")


def test_share_busy_and_the_warning():
    half = MachineLoad(wall_s=2.0, cpus=2, others_cpu_s=1.5, steal_s=0.5)
    assert half.busy_cpus == pytest.approx(1.0) and half.share == pytest.approx(0.5) and half.busy
    text = busy_warning(half, "the 7 profiling runs")
    assert text.startswith("while the 7 profiling runs ran, other work kept 1.00 of this machine's 2 CPUs busy (50%)")
    assert "Profile again with the machine otherwise idle" in text
    # Measured step times (train.py, examples/gnmt_v2.py) say what follows for them.
    timed = busy_warning(half, "the steps", "they ran slower than on an idle machine")
    assert timed == ("while the steps ran, other work kept 1.00 of this machine's 2 CPUs busy (50%) over 2.0 s: "
                     "they ran slower than on an idle machine")
    calm = dataclasses.replace(half, others_cpu_s=0.1, steal_s=0.0)
    assert calm.share < BUSY_SHARE and not calm.busy and busy_warning(calm) is None
    short = dataclasses.replace(half, wall_s=MIN_SPAN_S / 2, others_cpu_s=0.5, steal_s=0.0)
    assert short.share == 1.0 and not short.busy  # too short to tell from 10 ms ticks
    assert busy_warning(None) is None


@pytest.mark.skipif(not _LINUX, reason="the machine's CPU counters are read from Linux's /proc/stat")
def test_a_busy_process_elsewhere_is_measured_and_one_of_ours_is_not(tmp_path):
    # Measured from when every busy process has started until each has used 2 CPU seconds.
    with _Spinners(tmp_path, burn_s=2.0) as spinners:
        spinners.started()
        with LoadMeter() as meter:
            spinners.burned()
    load = meter.load
    assert load is not None and load.cpus == spinners.cpus
    assert load.wall_s >= 1.5
    assert load.share >= BUSY_SHARE and load.busy, load
    # A process of ours (a worker task it started) is its own work, not other work: measured
    # once the child says it has used half a CPU second, this process waiting for its word.
    before = machine_load._own_cpu_s(machine_load._tick())
    child = subprocess.Popen(
        [sys.executable, "-c", "import os, time\nt = time.process_time()\n"
         "while time.process_time() - t < 0.5: pass\nos.write(1, b'b')\nend = time.time() + 600\n"
         "while time.time() < end: pass"], stdout=subprocess.PIPE)
    try:
        _said(child.stdout.fileno(), 1, b"b", "the child using half a CPU second")
        after = machine_load._own_cpu_s(machine_load._tick())
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
    assert after - before >= 0.3  # the child's CPU time counted as ours (this process waited)


def _profile(load):
    return CostProfile(ops={"a": OpCost("a", "MatMul", 10.0, (64,))}, graph_fingerprint="f", graph_nodes=(),
                       num_traced_steps=3, traced_compute_us=10.0, unmatched_compute_us={}, machine_load=load)


def test_the_profile_keeps_the_load_and_a_merge_keeps_the_busier():
    busy = MachineLoad(wall_s=3.0, cpus=2, others_cpu_s=2.4, steal_s=0.3)
    calm = MachineLoad(wall_s=3.0, cpus=2, others_cpu_s=0.2, steal_s=0.0)
    again = profile_from_bytes(profile_to_bytes(_profile(busy)))
    assert again.machine_load == busy
    assert profile_from_bytes(profile_to_bytes(_profile(None))).machine_load is None
    assert merge_profiles(_profile(calm), _profile(busy)).machine_load == busy
    assert merge_profiles(_profile(busy), _profile(calm)).machine_load == busy
    assert merge_profiles(_profile(None), _profile(calm)).machine_load == calm
    assert merge_profiles(_profile(None), _profile(None)).machine_load is None
    # A file of format 5 has none; a negative figure is a corrupt file.
    pb = cost_profile_pb2.CostProfile.FromString(profile_to_bytes(_profile(busy)))
    assert pb.format_version == 6
    pb.format_version = 5
    pb.ClearField("machine_load")
    assert profile_from_bytes(pb.SerializeToString()).machine_load is None
    pb = cost_profile_pb2.CostProfile.FromString(profile_to_bytes(_profile(busy)))
    pb.machine_load.others_cpu_s = -1.0
    with pytest.raises(ProfileError, match="negative or non-numeric machine load; the file is corrupt"):
        profile_from_bytes(pb.SerializeToString())



@pytest.mark.tf
@pytest.mark.skipif(not _LINUX, reason="the machine's CPU counters are read from Linux's /proc/stat")
def test_profiling_on_a_busy_machine_warns_and_the_placement_summary_says_so(tmp_path, caplog, capsys):
    import tensorflow as tf

    from baechi_tf.cli import main
    from baechi_tf.cost_model import profile_fetch, save_profile

    graph = tf.Graph()
    with graph.as_default():
        x = tf.random.normal([768, 768], seed=1)  # drawn each step: nothing to fold
        y = x
        for i in range(6):
            y = tf.tanh(tf.matmul(y, x, name=f"mm{i}"))
        fetch = tf.reduce_sum(y)
    with _Spinners(tmp_path) as spinners:
        spinners.started()
        with tf.compat.v1.Session(graph=graph) as sess, caplog.at_level("WARNING", logger="baechi_tf"):
            profile = profile_fetch(sess, fetch, warmup_steps=2, traced_steps=10)
    load = profile.machine_load
    assert load is not None and load.wall_s >= MIN_SPAN_S, f"the runs took too short a span to judge: {load}"
    assert load.busy, load
    assert "while the 12 profiling runs ran, other work kept" in caplog.text
    # Saved with the profile, and told with the placement made of it.
    save_profile(profile, tmp_path / "cost.pb")
    (tmp_path / "graph.pb").write_bytes(graph.as_graph_def().SerializeToString())
    capsys.readouterr()
    assert main(["place", "--graph", str(tmp_path / "graph.pb"), "--cost_path", str(tmp_path / "cost.pb"),
                 "--num_devices", "2", "--out", str(tmp_path / "placed.pb")]) == 0
    printed = capsys.readouterr().out
    assert "while the profile's steps ran, other work kept" in printed, printed
