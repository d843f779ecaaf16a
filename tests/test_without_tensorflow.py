"""baechi_tf installed without a TensorFlow extra: the core places, the TensorFlow ends say how to
install TensorFlow.

Each test runs Python with `-S` and a PYTHONPATH of this checkout and a folder of links to every
entry of the environment's site-packages but TensorFlow's (tensorflow, its dist-info, Keras):
TensorFlow cannot be imported there, as after a ``pip install baechi_tf`` without ``[cpu]`` or
``[gpu]``.
"""

import json
import os
import pathlib
import re
import subprocess
import sys
import sysconfig

import pytest

pytestmark = pytest.mark.slow

ROOT = pathlib.Path(__file__).resolve().parents[1]
TENSORFLOW = re.compile(r"^(tensorflow|tf_keras|keras)([-_.].*)?$", re.IGNORECASE)
EXTRAS = ("pip install 'baechi_tf[cpu]' (tensorflow-cpu)", "pip install 'baechi_tf[gpu]' (tensorflow[and-cuda])")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """`run(*args)`: a Python without TensorFlow runs `args`; the finished process."""
    site = tmp_path_factory.mktemp("site_without_tensorflow")
    left_out = []
    for entry in pathlib.Path(sysconfig.get_paths()["purelib"]).iterdir():
        if TENSORFLOW.match(entry.name):
            left_out.append(entry.name)
        else:
            (site / entry.name).symlink_to(entry)
    assert "tensorflow" in left_out  # the environment has it: what is left out is left out
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(site)])

    def run(*args):
        return subprocess.run([sys.executable, "-S", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)

    done = run("-c", "import tensorflow")
    assert "No module named 'tensorflow'" in done.stderr, done.stderr
    return run


@pytest.mark.parametrize(
    "how",
    ["import baechi_tf; baechi_tf.BaechiSession", "from baechi_tf import place_graph_def", "import baechi_tf; baechi_tf.function"],
)
def test_the_tensorflow_ends_name_both_extras(run, how):
    code = f"""
try:
    {how}
except ModuleNotFoundError as e:
    from baechi_tf.errors import ConfigError
    print(type(e).__name__, isinstance(e, ConfigError), e.name)
    print(e)
"""
    done = run("-c", code)
    assert done.returncode == 0, done.stderr
    kind, message = done.stdout.split("\n", 1)
    assert kind == "TensorFlowMissingError True tensorflow"
    name = how.split()[-1].rsplit(".", 1)[-1]
    assert message.startswith(f"baechi_tf.{name} needs TensorFlow, which is not installed: ")
    assert all(extra in message for extra in EXTRAS), message


def test_baechi_place_says_so_in_one_line(run, tmp_path):
    for name in ("g.pb", "step.pb"):  # read before TensorFlow is needed to parse them
        (tmp_path / name).write_bytes(b"\n\x01a")
    done = run("-m", "baechi_tf.cli", "place", "--graph", str(tmp_path / "g.pb"), "--run_metadata",
               str(tmp_path / "step.pb"), "--num_devices", "2", "--out", str(tmp_path / "placed.pb"))
    assert done.returncode == 2
    [line] = done.stderr.splitlines()
    assert line.startswith("baechi place: error: this command needs TensorFlow, which is not installed: "), line
    assert all(extra in line for extra in EXTRAS), line


def test_the_core_places_a_json_graph(run, tmp_path):
    out = tmp_path / "placement.json"
    done = run("-m", "baechi_tf.cli", "place-json", "examples/fork_join.json", "--placement_method", "m_etf",
               "--out", str(out))
    assert done.returncode == 0, done.stderr
    placement = json.loads(out.read_text())
    assert placement["makespan_us"] > 0 and placement["placement"], placement
