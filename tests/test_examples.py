"""examples/gnmt_v2.py runs at a tiny size: places GNMT v2 through BaechiSession and trains."""

import os
import re
import subprocess
import sys

import pytest

import ctrl_c
from loaded import run_listing_modules

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TASK = "/job:localhost/replica:0/task:0"


TINY = ["--batch_size=4", "--vocab_size=40", "--max_seq_length=3", "--rnn_units=8",
        "--num_layers=2", "--num_devices=4", "--profile_steps=1", "--learning_rate=0.01"]


@pytest.mark.tf
def test_gnmt_v2_example_places_and_trains():
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", "gnmt_v2.py"), *TINY, "--steps=4"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    # The placement summary: the four stand-in devices and the simulated step time.
    for i in range(1, 5):
        assert re.search(rf"^{re.escape(TASK)}/device:CPU:{i}\s+\d+", out, re.M), out
    assert re.search(r"^method\s+auto\([a-z_+]+\)$", out, re.M), out
    first = re.search(r"^first step \(profile 1 step, place, run\): [0-9.]+ s; placement "
                      r"[0-9.]+ s; loss ([0-9.]+)$", out, re.M)
    assert first, out
    losses = [float(x) for x in re.findall(r"^step \d: loss ([0-9.]+), [0-9.]+ ms$", out, re.M)]
    assert len(losses) == 4, out
    assert losses[-1] < float(first.group(1))  # it trains
    assert re.search(r"^average step time [0-9.]+ ms over 4 steps; simulated [0-9.]+ ms$", out,
                     re.M), out


@pytest.mark.tf
def test_gnmt_v2_example_stops_on_ctrl_c_with_one_line():
    status, seen, err = ctrl_c.after_output(
        [sys.executable, os.path.join(ROOT, "examples", "gnmt_v2.py"), *TINY, "--steps=100000"],
        lambda seen: re.search(r"^step 1: ", seen, re.M),  # placed, and training
        cwd=ROOT, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
    )
    assert status == 130, seen + err
    assert err.strip().splitlines()[-1] == "gnmt_v2: interrupted", err
    assert "Traceback" not in err, err


@pytest.mark.parametrize("flag, says", [
    ("--steps=-1", "argument --steps: '-1' is not a positive number"),
    ("--learning_rate=nan", "argument --learning_rate: 'nan' is not a positive number"),
    ("--num_devices=0", "argument --num_devices: '0' is not a positive number"),
    ("--refine_seconds=-1", "refine_seconds -1.0 must be a finite number >= 0"),
    ("--placement_method=expert", "argument --placement_method: invalid choice: 'expert'"),
])
def test_gnmt_v2_example_refuses_bad_flags_before_building_the_model(flag, says, tmp_path):
    # --steps=-1 and a learning rate of nan ran (nothing trained, or a loss of nan) and exited 0;
    # --num_devices=0 said "GNMT num_gpus=0", a flag the example lacks; a bad --refine_seconds
    # was found only after the model was built. Each was refused only after TensorFlow had loaded
    # (seconds).
    done, loaded = run_listing_modules(
        [sys.executable, os.path.join(ROOT, "examples", "gnmt_v2.py"), *TINY, flag], tmp_path,
        cwd=ROOT, timeout=120,
    )
    assert done.returncode == 2 and done.stdout == ""
    last = done.stderr.splitlines()[-1]
    assert last.startswith("gnmt_v2.py: error: ") and says in last, last
    assert "tensorflow" not in loaded


def test_gnmt_v2_example_help_comes_before_tensorflow_loads(tmp_path):
    done, loaded = run_listing_modules(
        [sys.executable, os.path.join(ROOT, "examples", "gnmt_v2.py"), "--help"], tmp_path,
        cwd=ROOT, timeout=120,
    )
    assert done.returncode == 0 and "--placement_method METHOD" in done.stdout, done.stdout
    assert "sentences per step (default: 128)" in done.stdout  # GNMTHParams' defaults
    assert "tensorflow" not in loaded


def _placed_beside_unplaced(example, flags, steps, variables, mean_of):
    """Runs a TF2 example; checks its summary, that each step's loss placed equals the unplaced
    one to 1e-5, and its step-time line."""
    done = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", example), *flags],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert re.search(r"^method\s+auto\([a-z_+]+\)$", out, re.M), out
    assert re.search(rf"^variables: {variables} pinned where they live", out, re.M), out
    losses = re.findall(r"^step \d: loss placed ([0-9.]+), unplaced ([0-9.]+)$", out, re.M)
    assert len(losses) == steps and all(float(a) == pytest.approx(float(b), rel=1e-5) for a, b in losses), out
    assert re.search(rf"^step time: placed [0-9.]+ ms, unplaced [0-9.]+ ms \(mean of {mean_of}\); "
                     r"simulated [0-9.]+ ms placed, [0-9.]+ ms on one device$", out, re.M), out


@pytest.mark.tf
def test_tf2_function_example_places_and_trains_as_tf_function():
    _placed_beside_unplaced(
        "tf2_function.py",
        ["--towers=2", "--layers=1", "--hidden=32", "--features=16", "--batch_size=32", "--steps=3"],
        steps=4, variables=4, mean_of="3 steps",
    )


@pytest.mark.tf
def test_keras_fit_example_places_and_fits_as_keras_does():
    _placed_beside_unplaced(
        "keras_fit.py", ["--model=mlp", "--batch_size=32", "--steps=2"],
        steps=3, variables=r"\d+", mean_of="2 fit epochs of one step",
    )
