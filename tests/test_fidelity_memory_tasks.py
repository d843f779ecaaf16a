"""bench/fidelity_memory_tasks.py: placements run on worker tasks, a device each, measured and
simulated again from a saved run."""

import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _bench():
    """bench/fidelity_memory_tasks.py as a module (test_fidelity_memory's `_bench` imports
    fidelity_memory, which it needs, and puts TF_USE_LEGACY_KERAS back)."""
    from test_fidelity_memory import _bench as fidelity_memory

    fidelity_memory()
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    try:
        import fidelity_memory_tasks
    finally:
        sys.path.remove(os.path.join(ROOT, "bench"))
    return fidelity_memory_tasks


@pytest.mark.tf
def test_a_run_on_two_tasks_measures_each_task_and_is_simulated_again_as_saved(tmp_path):
    """Each task is a device of its own: a row per task of each placement, named by its task,
    its measured peak that of its own traced records (what it received and was fed included);
    --save keeps the run, and bench/fidelity_memory_resim.py places the saved layouts again on
    the same tasks' cluster and gets every device's simulated peak as the run printed it."""
    from baechi_tf.cost_model.measured_memory import measured_memory

    fmt = _bench()
    tasks = fmt.start_tasks(2)
    try:
        assert tasks.devices == (fmt.TASK_DEVICE.format(0), fmt.TASK_DEVICE.format(1))
        rows = fmt.measure_graph("rnn", tasks, ["m_etf"], ["m_etf"], warmup_steps=0, traced_steps=1,
                                 save=str(tmp_path), out=io.StringIO())
    finally:
        tasks.workers.stop()
    assert {(r.method, r.limit) for r in rows} == {("m_etf", "loose"), ("m_etf", "1.5x")}
    assert sorted(r.device for r in rows if r.limit == "loose") == ["task:0", "task:1"]
    for r in rows:
        assert r.ops > 0 and r.measured_step_bytes > 0
        assert r.measured_bytes == r.measured_persistent_bytes + r.measured_step_bytes == max(r.measured_peaks)
        assert r.simulated_bytes > 0 and r.sim_schedule_bytes > 0  # TF frees copies sooner: either may be higher
        assert (r.capacity_bytes == fmt.LOOSE_BYTES) == (r.limit == "loose")
    outside = {(r.method, r.limit) for r in rows if not r.measured_bytes <= r.simulated_bytes <= 1.25 * r.measured_bytes}
    assert sorted(n for n in os.listdir(tmp_path) if n.endswith(".steps")) == sorted(
        f"rnn.{m}.{limit}.steps" for m, limit in outside)
    fed = {t: int(np.asarray(v).nbytes) for t, v in fmt.fidelity_graphs.build("rnn").feeds.items()}
    for m, limit in outside:  # the step that ran: each device's peak as measured
        ran_def, steps = fmt.fm.load_steps(str(tmp_path / f"rnn.{m}.{limit}.steps"))
        assert len(steps) == 1
        peaks = {fmt.short_name(k): v.peak_bytes for k, v in measured_memory(steps[0], ran_def, fed).items()}
        assert {r.device: r.measured_bytes for r in rows if (r.method, r.limit) == (m, limit)}.items() <= peaks.items()
    doc = json.loads((tmp_path / "rnn.json").read_text())
    assert doc["tasks"] == 2 and doc["shared_memory"] is False
    assert {d for p in doc["placements"] for d in p["op_to_device"].values()} == set(tasks.devices)
    done = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "fidelity_memory_resim.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert f"{len(rows)} of {len(rows)} devices simulated as saved" in done.stdout, done.stdout


@pytest.mark.tf
def test_the_kept_steps_of_a_tasks_run_are_read_per_task_with_what_it_was_fed(tmp_path, monkeypatch):
    """bench/fidelity_memory_steps.py on a tasks run names each device by its task, as the rows
    do, and measures it from its own records and what it was fed, as the run did: each task's
    measured peak there is its row's. (Both tasks' devices are 'device:CPU:0'; keyed by that
    name, one task's figures stood for both.)"""
    fmt = _bench()
    monkeypatch.setattr(fmt.fm, "HIGH", 0.0)  # every placement outside the target: its steps kept
    tasks = fmt.start_tasks(2)
    try:
        rows = fmt.measure_graph("rnn", tasks, ["m_etf"], [], warmup_steps=0, traced_steps=1, save=str(tmp_path),
                                 out=io.StringIO())
    finally:
        tasks.workers.stop()
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    try:
        import fidelity_memory_steps as steps
        from fidelity_memory_resim import placed_again
    finally:
        sys.path.remove(os.path.join(ROOT, "bench"))
    doc = json.loads((tmp_path / "rnn.json").read_text())
    is_tasks, key, fed = steps.run_kind(doc)
    assert is_tasks and fed == {t: int(np.asarray(v).nbytes) for t, v in fmt.fidelity_graphs.build("rnn").feeds.items()}
    assert fed and all(b > 0 for b in fed.values())
    (p, result, _), = placed_again(str(tmp_path / "rnn.json"))
    ran_def, stats = fmt.fm.load_steps(str(tmp_path / "rnn.m_etf.loose.steps"))
    found = steps.peak_contents(result, ran_def, stats, low=2.0, high=0.0, key=key, fed=fed)  # every device
    assert {device: measured for device, _, measured, _, _ in found} == {r.device: r.measured_bytes for r in rows}
    assert sorted(device for device, *_ in found) == ["task:0", "task:1"]


def test_the_summary_of_a_tasks_run_reads_back(tmp_path):
    row = {"model": "rnn", "method": "m_etf", "chosen": "m_etf", "limit": "loose", "capacity_bytes": 8 << 30,
           "device": "task:1", "ops": 10, "simulated_bytes": 11 << 20, "measured_bytes": 10 << 20,
           "measured_persistent_bytes": 0, "measured_step_bytes": 10 << 20, "replaced_bytes": 0,
           "sim_ran_bytes": None, "sim_alias_bytes": None, "sim_standin_bytes": None, "replay_bytes": None,
           "measured_peaks": [10 << 20], "sim_schedule_bytes": 9 << 20}
    path = tmp_path / "rows.json"
    path.write_text(json.dumps([row]))
    out = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "fidelity_memory_tasks.py"), "--summary_of",
                          str(path)], capture_output=True, text=True, timeout=120, check=True).stdout
    assert "both (the target, [1.0, 1.25]):   1/1 devices" in out
    assert "worst under-prediction: 1.100 (rnn m_etf loose task:1: simulated 11.00 MiB, measured 10.00 MiB)" in out
    # the simulated order alone: 9 of 10 MiB
    assert "  both (the target, [1.0, 1.25]):   0/1 devices" in out
