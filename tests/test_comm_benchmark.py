"""utils/communication_benchmark.py times real transfers between two virtual CPU devices."""

import os
import pathlib
import re
import subprocess
import sys

import pytest
import tensorflow as tf

import ctrl_c

pytestmark = pytest.mark.tf

ROOT = pathlib.Path(__file__).resolve().parents[1]
BENCHMARK = ROOT / "utils" / "communication_benchmark.py"
LINE = re.compile(r"^Communication cost function: (\S+) x \+ (\S+)$", re.MULTILINE)


def _run(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    return subprocess.run(
        [sys.executable, str(BENCHMARK), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


def test_tiny_run_prints_progress_and_the_fitted_line():
    done = _run("--exponent=4", "--num_warmup=1", "--num_runs=3", "--device_type=CPU")
    assert done.returncode == 0, done.stderr
    # GPU 0 and 1 are train.py's stand-ins CPU:1 and CPU:2; it timed the host, CPU:0, and CPU:1.
    assert done.stdout.startswith(
        "GPU 0 and GPU 1 are the virtual CPU devices /device:CPU:1 and /device:CPU:2, as in train.py --num_gpus\n"
        "Timing transfers /device:CPU:1 -> /device:CPU:2 of 2^0 .. 2^3 float32 elements"), done.stdout
    bars = re.findall(r"\[([#-]{30})\] (\d)/4 2\^(\d) elements: median [\d.]+ us", done.stderr)
    assert [(b.count("#"), int(i), int(e)) for b, i, e in bars] == [
        (7, 1, 0), (15, 2, 1), (22, 3, 2), (30, 4, 3)
    ]
    assert "12 transfers of 4 sizes" in done.stdout or "Dropped" in done.stdout
    match = LINE.search(done.stdout)
    assert match, done.stdout
    slope, intercept = float(match.group(1)), float(match.group(2))
    assert slope >= 0.0 and intercept >= 0.0
    assert slope + intercept > 0.0  # a transfer between two devices is never free
    assert f"--comm_cost_coeffs={match.group(1)},{match.group(2)}" in done.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (["--from_gpu_id=1", "--to_gpu_id=1"], "give two different device indices >= 0"),
        (["--exponent=1"], "flag --exponent=1: 1 is not an integer in the range [2, 31]"),
        (["--num_runs=0"], "flag --num_runs=0: 0 is not a positive integer"),
        (["--bogus"], "Unknown command line flag 'bogus'"),
        (["--from_gpu_id=abc"], "flag --from_gpu_id=abc: invalid literal for int()"),
        (["extra"], "unexpected arguments: extra"),
        (["--cluster_spec={bad"], "--cluster_spec is not valid JSON"),
        # Not 100,001 virtual CPU devices: a cap, named with the fix.
        (["--to_gpu_id=100000", "--device_type=CPU"],
         "virtual CPU devices take indices below 63 (the line between two of them does not "
         "depend on their indices); give e.g. --from_gpu_id=0 --to_gpu_id=1"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message):
    done = _run(*args)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.startswith("communication_benchmark: error: "), done.stderr[-3000:]
    assert done.stderr.count("\n") == 1 and message in done.stderr, done.stderr[-3000:]
    assert done.stdout == ""


def test_the_help_gives_the_index_from_which_virtual_devices_are_refused():
    # It said 'for virtual CPU devices, 64 or more' while 63 is refused (CPU:64 and the host
    # would be 65 devices); the error line and the README say 'below 63'.
    assert "below 63" in _run("--to_gpu_id=63", "--device_type=CPU").stderr
    text = " ".join(_run("--help").stdout.split())
    assert "for virtual CPU devices, 63 or more;" in text, text[:3000]


@pytest.mark.skipif(bool(tf.config.list_physical_devices("GPU")), reason="the machine has GPUs")
def test_gpus_asked_of_a_machine_without_them_is_one_line_and_exit_2():
    done = _run("--device_type=GPU")
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr == ("communication_benchmark: error: GPU 1 is wanted but this machine has "
                           "0 GPU(s): use --device_type=CPU for virtual CPU devices\n")


def test_ctrl_c_during_the_runs_is_one_line_and_exit_130():
    status, seen, err = ctrl_c.after_output(
        # More runs than it will make: still running whenever the signal comes.
        [sys.executable, str(BENCHMARK), "--device_type=CPU", "--num_runs=100000"],
        lambda seen: "Timing" in seen,  # printed as the timing starts
        env=dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2"),
    )
    assert "\nTiming transfers /device:CPU:1 -> /device:CPU:2 " in seen, seen
    assert status == 130, err[-3000:]
    # One line of ours, and no traceback of ours. (A Ctrl-C that lands in TensorFlow's C++ code
    # can make TF print a SystemError of its own before it is dropped: see baechi_tf.interrupts.)
    assert err.splitlines()[-1] == "communication_benchmark: interrupted; no line was fitted"
    assert err.count("communication_benchmark:") == 1 and "KeyboardInterrupt" not in err, err


def test_ctrl_c_while_tensorflow_loads_is_one_line_and_exit_130():
    # A Ctrl-C when the benchmark first imports TensorFlow.
    done = ctrl_c.at_import("tensorflow", str(BENCHMARK), "--device_type=CPU",
                            env=dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2"))
    assert done.returncode == 130, done.stderr[-3000:]
    assert done.stderr == "communication_benchmark: interrupted; no line was fitted\n"
