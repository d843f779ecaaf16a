"""utils/communication_benchmark.py times real transfers between two virtual CPU devices."""

import os
import pathlib
import re
import subprocess
import sys

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
    assert "/device:CPU:0 -> /device:CPU:1 of 2^0 .. 2^3 float32 elements" in done.stdout
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


def test_one_device_is_refused_with_the_fix():
    done = _run("--from_gpu_id=1", "--to_gpu_id=1", "--device_type=CPU")
    assert done.returncode != 0
    assert "give two different device indices" in done.stderr
