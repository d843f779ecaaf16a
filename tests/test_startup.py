"""The start-up helpers of the command-line programs (`baechi_tf._startup`)."""

from __future__ import annotations

import gc

import pytest

from baechi_tf._startup import collector_paused


@pytest.fixture
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def test_the_collector_is_paused_in_the_block_and_back_after_it(collector_on):
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():  # nested: the outer block's pause holds after the inner one
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_the_collector_comes_back_after_an_error(collector_on):
    with pytest.raises(KeyError):
        with collector_paused():
            raise KeyError("x")
    assert gc.isenabled()


def test_a_collector_the_caller_paused_stays_paused(collector_on):
    gc.disable()
    with collector_paused():
        pass
    assert not gc.isenabled()


def test_exit_now_keeps_the_status_the_output_and_the_atexit_handlers(tmp_path):
    """`exit_now` skips Python's finalisation, nothing else: a large buffered stdout reaches a pipe
    whole, stderr too, atexit handlers run (logging's flush, the stop of local workers), and the
    status is the command's."""
    import subprocess
    import sys

    marker = tmp_path / "atexit-ran"
    program = (
        "import atexit, sys\n"
        "from baechi_tf._startup import exit_now\n"
        f"atexit.register(lambda: open({str(marker)!r}, 'w').write('ran'))\n"
        "sys.stdout.write('x' * 200000)\n"
        "sys.stderr.write('warned')\n"
        "exit_now(3)\n"
        "print('not reached')\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert done.returncode == 3
    assert done.stdout == "x" * 200000
    assert done.stderr == "warned"
    assert marker.read_text() == "ran"


@pytest.mark.tf
def test_tensorflow_imported_for_a_program_leaves_keras_to_its_first_import():
    """The Keras optimizers TF's import loads at once are left out of the programs' import of it
    (a fifth of its time), and load as before when Keras is imported: ``tf.keras`` and ``import
    keras`` work, and the block is gone."""
    import subprocess
    import sys

    program = (
        "import sys\n"
        "from baechi_tf._startup import import_tensorflow_quietly\n"
        "import_tensorflow_quietly()\n"
        "assert 'tensorflow' in sys.modules\n"
        "assert 'keras.src.optimizers' not in sys.modules, 'loaded, or still blocked'\n"
        "import tensorflow as tf\n"
        "assert type(tf.keras.layers.Dense(2)).__name__ == 'Dense'\n"
        "import keras\n"
        "assert keras.optimizers.Adam(0.1).learning_rate is not None\n"
        "assert 'keras.src.optimizers' in sys.modules\n"
        "g = tf.Graph()\n"
        "with g.as_default():\n"
        "    y = tf.matmul(tf.ones([2, 2]), tf.ones([2, 2]))\n"
        "with tf.compat.v1.Session(graph=g) as s:\n"
        "    print(s.run(y).sum())\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "8.0"
