"""`bazel build :train //utils:communication_benchmark` works offline and the binaries run.

Needs Debian's bazel-bootstrap 4.2.3 (`apt-get install bazel-bootstrap`); skipped without bazel.
bazel runs in --batch mode (no server is left behind) with its own output base outside the
checkout, `$BAECHI_BAZEL_OUTPUT_BASE` or `~/.cache/baechi_tf/bazel-<checkout hash>`, kept between
runs so that a second run only re-checks the build, and with `--symlink_prefix=/` so that the
checkout's own bazel-bin/bazel-out links are left alone. About 15 s here (two JVM starts of ~5 s,
then two runs of the built binaries).
"""

import glob
import hashlib
import os
import pathlib
import re
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

pytestmark = [
    pytest.mark.bazel,
    pytest.mark.tf,  # the built binaries import TensorFlow
    pytest.mark.skipif(
        shutil.which("bazel") is None,
        reason="bazel is not on PATH: install Debian's bazel-bootstrap "
        "(apt-get install bazel-bootstrap)",
    ),
]


def _output_base() -> str:
    if os.environ.get("BAECHI_BAZEL_OUTPUT_BASE"):
        return os.environ["BAECHI_BAZEL_OUTPUT_BASE"]
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    tag = hashlib.sha1(str(ROOT).encode()).hexdigest()[:12]
    return os.path.join(cache, "baechi_tf", f"bazel-{tag}")


@pytest.fixture(scope="module")
def bazel_bin() -> pathlib.Path:
    output_base = _output_base()
    done = subprocess.run(
        ["bazel", "--batch", f"--output_base={output_base}", "build", "--symlink_prefix=/",
         ":train", "//utils:communication_benchmark"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    bins = glob.glob(os.path.join(output_base, "execroot", "*", "bazel-out", "*-fastbuild", "bin"))
    assert len(bins) == 1, f"expected one bazel-bin under {output_base}, found {bins}"
    return pathlib.Path(bins[0])


def test_train_binary_prints_its_help(bazel_bin):
    done = subprocess.run(
        [str(bazel_bin / "train"), "--help"], capture_output=True, text=True, timeout=120
    )
    # absl's own --help exits with status 1; the program makes it 0, as argparse's is.
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert "--model_name" in done.stdout and "Try --helpfull" in done.stdout, done.stdout


def test_benchmark_binary_runs_with_the_project_python(bazel_bin):
    # Imports TensorFlow and baechi_tf: the py_binary runs with .venv's Python (third_party/py).
    done = subprocess.run(
        [str(bazel_bin / "utils" / "communication_benchmark"), "--exponent=2",
         "--num_warmup=0", "--num_runs=2", "--device_type=CPU"],
        capture_output=True, text=True, timeout=120,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert re.search(r"^Communication cost function: \S+ x \+ \S+$", done.stdout, re.MULTILINE)
