"""Shared fixtures, and ``--core``: the tests that need no TensorFlow (`make test-core`).

Markers (registered in pyproject.toml, where ``--strict-markers`` refuses any other):
``tf`` needs TensorFlow, ``slow`` takes seconds, ``bazel`` builds with bazel, ``distributed``
starts ``tf.distribute.Server`` processes. ``--core`` runs the tests that carry none of them,
leaves uncollected a file marked ``tf`` as a whole (its module-level ``pytestmark``), and refuses
TensorFlow's import in pytest and in the programs its tests start (tests/no_tensorflow/).
"""

import ast
import importlib.util
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

# oneDNN's CPU kernels and graph rewrites are TF's default on CPUs with AVX-512 and off on others
# (an AVX2-only AMD EPYC, say), and several tests check what they do: fused MatMul + BiasAdd and
# filter-and-bias gradients, an allocator that counts its bytes in use. On for every run, before
# TensorFlow is imported here or in the programs the tests start, so that every machine runs the
# same kernels; tests of the other path set it off for their programs (test_models, test_train).
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")

NOT_CORE = ("tf", "slow", "bazel", "distributed")
_REFUSER = os.path.join(os.path.dirname(__file__), "no_tensorflow")


def pytest_addoption(parser):
    parser.addoption(
        "--core",
        action="store_true",
        help=f"run only the tests marked none of {', '.join(NOT_CORE)}, with TensorFlow's import "
        "refused (make test-core)",
    )


def pytest_configure(config):
    if not config.getoption("--core"):
        return
    spec = importlib.util.spec_from_file_location("baechi_refuse_tensorflow", os.path.join(_REFUSER, "sitecustomize.py"))
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [_REFUSER, os.environ.get("PYTHONPATH")]))


def _marked_tf_as_a_whole(path) -> bool:
    """Whether the test file assigns a module-level ``pytestmark`` that names ``pytest.mark.tf``."""
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets):
            return any(
                isinstance(n, ast.Attribute) and n.attr == "tf" and ast.unparse(n.value) == "pytest.mark"
                for n in ast.walk(node.value)
            )
    return False


def pytest_ignore_collect(collection_path, config):
    if config.getoption("--core") and collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        return _marked_tf_as_a_whole(collection_path) or None
    return None


def pytest_collection_modifyitems(config, items):
    if not config.getoption("--core"):
        return
    left_out = [item for item in items if any(item.get_closest_marker(m) for m in NOT_CORE)]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if not any(item.get_closest_marker(m) for m in NOT_CORE)]


@pytest.fixture
def methods():
    """Restores the registered placement methods after a test that registers its own."""
    from baechi_tf.placer import methods

    saved = methods.current()
    yield
    methods._current = saved
