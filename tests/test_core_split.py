"""`make test-core` (``pytest --core``) runs the tests that need no TensorFlow, and TensorFlow
stays out of them: an import of it there fails the test that made it (tests/conftest.py,
tests/no_tensorflow/)."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"

UNMARKED = '''
def test_imports_tensorflow():
    import tensorflow  # noqa: F401


def test_starts_a_program_that_imports_tensorflow():
    import subprocess, sys

    done = subprocess.run([sys.executable, "-c", "import tensorflow"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_needs_none():
    import baechi_tf.graph  # noqa: F401
'''
MARKED = '''
import pytest
import tensorflow  # collected, this file would fail under --core

pytestmark = [pytest.mark.tf]


def test_whole_file_needs_tensorflow():
    pass
'''
SLOW = '''
import pytest


@pytest.mark.slow
def test_slow():
    import tensorflow  # noqa: F401
'''


def _pytest(args, tmp_path, log):
    env = dict(os.environ, BAECHI_TENSORFLOW_REFUSED=str(log))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900,
    )


def test_core_refuses_tensorflow_to_tests_that_are_not_marked(tmp_path):
    for name, text in {"test_unmarked.py": UNMARKED, "test_marked.py": MARKED, "test_slow.py": SLOW}.items():
        (tmp_path / name).write_text(text)
    log = tmp_path / "refused.txt"
    # This folder's conftest as a plugin; pyproject.toml's settings (the markers, --strict-markers).
    done = _pytest(["-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path), "-p", "conftest", "--core",
                    "-rf", str(tmp_path)], tmp_path, log)
    assert done.returncode == 1, done.stdout + done.stderr
    assert re.match(r"2 failed, 1 passed, 1 deselected in ", done.stdout.splitlines()[-1]), done.stdout
    assert "FAILED test_unmarked.py::test_imports_tensorflow" in done.stdout
    assert "FAILED test_unmarked.py::test_starts_a_program_that_imports_tensorflow" in done.stdout
    assert done.stdout.count(
        "ImportError: import tensorflow: `make test-core` (pytest --core) runs only the tests that need no "
        "TensorFlow; mark a test that needs it @pytest.mark.tf"
    ) >= 2, done.stdout
    refused = log.read_text()
    assert refused.count("import tensorflow in ") == 2, refused  # the test's, and its program's
    assert "test_imports_tensorflow" in refused and "-c" in refused


@pytest.mark.tf
def test_the_same_files_without_core_run_whole(tmp_path):
    (tmp_path / "test_unmarked.py").write_text(UNMARKED)
    (tmp_path / "test_slow.py").write_text(SLOW)
    log = tmp_path / "refused.txt"
    done = _pytest(["-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path), "-p", "conftest", str(tmp_path)],
                   tmp_path, log)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"\b4 passed\b", done.stdout) and not log.exists()


@pytest.mark.slow
def test_make_test_core_imports_no_tensorflow(tmp_path):
    # What `make test-core` runs; `--core` is defined once, in tests/conftest.py.
    log = tmp_path / "refused.txt"
    done = _pytest(["--core", str(TESTS)], tmp_path, log)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert not log.exists(), log.read_text()[:4000]
    passed = int(re.search(r"(\d+) passed", done.stdout.splitlines()[-1]).group(1))
    assert passed > 500, done.stdout.splitlines()[-1]  # the core is there, not deselected away
