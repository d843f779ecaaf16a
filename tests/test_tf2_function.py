"""baechi_tf.function places a TF2 training loop and computes what tf.function computes.

Each program runs in a fresh process (tests/tf2_programs.py): TF's eager context takes its CPU
stand-ins only before it runs anything. Where ops ran is what TF's function runtime recorded
(the partition graphs of the first call), not what the placement asked for.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import baechi_tf
from baechi_tf.cost_model import load_profile
from baechi_tf.errors import ConfigError

pytestmark = [pytest.mark.tf, pytest.mark.slow]

HERE = os.path.dirname(os.path.abspath(__file__))
TASK = "/job:localhost/replica:0/task:0"
HOST = f"{TASK}/device:CPU:0"


def run(*scenario):
    done = subprocess.run(
        [sys.executable, os.path.join(HERE, "tf2_programs.py"), *scenario],
        capture_output=True, text=True, timeout=600, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    line = [t for t in done.stdout.splitlines() if t.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def test_a_training_loop_placed_computes_what_tf_function_computes():
    out = run("train")
    np.testing.assert_allclose(out["placed"], out["plain"], rtol=1e-5, atol=1e-5)
    assert out["placed"][-1] < out["placed"][0]  # it trains
    assert out["weights_apart"] <= 1e-5
    # The ops ran where the placement put them, on at least two stand-ins.
    standins = [d for d in out["ran_on"] if d != HOST]
    assert len(standins) >= 2, out["ran_on"]
    ran, planned = out["ran"], out["planned"]
    checked = [n for n in ran if n in planned]
    assert len(checked) >= 10
    assert all(ran[n] == planned[n] for n in checked), {n: (ran[n], planned[n]) for n in checked if ran[n] != planned[n]}
    # The variables stay where they live (the host): their reads and updates with them.
    assert planned["MatMul/ReadVariableOp"] == HOST
    assert "variables: 3 pinned where they live" in out["summary"] and "(the host)" in out["summary"]
    assert out["placements"] == 1


def test_each_input_signature_is_placed_on_its_own():
    out = run("signatures")
    assert out["placements"] == 2  # batches of 256 and of 64, each placed once
    np.testing.assert_allclose(out["placed"], out["plain"], rtol=1e-5, atol=1e-5)


def test_a_decorated_method_is_placed_per_instance():
    out = run("method")
    np.testing.assert_allclose(out["placed"], out["plain"], rtol=1e-5, atol=1e-5)
    assert out["placements"] == [1, 1] and out["same_object"]


def test_variables_made_after_decoration_and_by_the_first_call():
    out = run("late_variables")
    np.testing.assert_allclose(out["placed"], out["plain"], rtol=1e-5, atol=1e-5)
    assert out["placed_devices"] == out["plain_devices"]
    assert out["placed_devices"]["early"] == f"{TASK}/device:CPU:2"
    # Pinned where each lives: a stand-in, and the host.
    summary = out["summary"]
    assert "variables: 3 pinned where they live" in summary
    assert f"early:0 on {TASK}/device:CPU:2" in summary
    assert f"late_w:0, momentum:0 on {HOST} (the host)" in summary
    assert out["planned"]["AssignSubVariableOp_1"] == f"{TASK}/device:CPU:2"  # early's update


def test_python_state_that_changes_the_trace_is_refused_and_nothing_changes():
    out = run("side_effects")
    assert out["error"].startswith("InvalidGraphError: the function traced differently from one trace to the next")
    assert "Python counter" in out["error"]
    assert out["w"] == [[1.0] * 4] * 4  # the profiling ran on copies; the placed run never ran
    assert out["placements"] == 0


def test_a_pin_to_a_device_that_does_not_exist_is_refused():
    out = run("pinned", "/device:GPU:7")
    assert out["error"].startswith("ConfigError: step 'import' failed: op 'MatMul' is pinned to '/device:GPU:7'")
    assert "ignore_user_devices=True" in out["error"]
    assert out["w_sum"] == 64 * 64  # nothing ran


@pytest.mark.parametrize(
    "pin, device", [("/device:GPU:0", f"{TASK}/device:CPU:1"), ("/device:CPU:0", HOST)]
)
def test_a_pin_holds(pin, device):
    # A pin to GPU 0 means its stand-in; the host is the host.
    out = run("pinned", pin)
    assert out["error"] is None
    assert out["matmul"] == out["ran"] == device


def test_tf_colocation_is_kept():
    out = run("colocated")
    assert out["loss"] == pytest.approx(out["plain"], rel=1e-5)
    assert sorted(out["colocated"]) == ["MatMul", "Relu", "add", "add/y"]
    assert len(set(out["planned"].values())) == 1
    ran = {n: d for n, d in out["ran"].items() if d is not None}  # Grappler fuses some away
    assert ran and all(d == out["planned"][n] for n, d in ran.items())


def test_reports_and_profiles_of_each_signature(tmp_path):
    out = run("reports", str(tmp_path))
    assert out["placements"] == 2
    for suffix in ("", ".1"):
        summary = json.loads((tmp_path / f"reports{suffix}" / "summary.json").read_text())
        assert summary["makespan_us"] > 0
        assert (tmp_path / f"reports{suffix}" / "gantt.png").is_file()
        profile = load_profile(tmp_path / f"costs{suffix}.pb")
        assert profile.num_traced_steps == 5 and "MatMul" in profile.ops


def test_too_few_cpu_devices_in_a_running_eager_context_is_a_clear_error():
    out = run("too_few_devices")
    assert out["error"].startswith("ConfigError: placing on 4 CPU stand-ins needs 5 CPU devices")
    assert "baechi_tf.tf2.standin_devices(4) before TensorFlow runs anything" in out["error"]


def test_jit_compile_is_refused():
    with pytest.raises(ConfigError, match="jit_compile=True: XLA compiles the whole function into one cluster"):
        baechi_tf.function(lambda x: x, num_devices=4, jit_compile=True)


def test_a_tf_function_is_refused():
    import tensorflow as tf

    with pytest.raises(ConfigError, match="is a tf.function already; decorate the Python function"):
        baechi_tf.function(tf.function(lambda x: x), num_devices=1)
