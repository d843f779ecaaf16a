"""The layers of the package, checked on its imports: graph and cluster, then the placer, then the
rewriter (and the other ends), then the session and the command lines. A module imports only from
its own layer and the layers below it, no TensorFlow is imported below the rewriter, and inside the
placer nothing imports the pipeline, the top of it (auto's package and the fallback ladder sit
below it), and the list scheduler's core imports neither the compiled engine's side nor the entry
points that run it, and passes on no name it imports. The rules are read from the source with `ast` (every import, also those inside
functions), and the TensorFlow rule is checked again by importing the placer in a fresh process.
"""

import ast
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "baechi_tf")

# Module name prefixes by layer; the longest prefix that matches a module gives its layer.
LAYERS = {
    "baechi_tf.errors": 0,
    "baechi_tf.graph": 0,
    "baechi_tf.graph_builder": 0,  # OpGraphBuilder: a graph built op by op, by name
    "baechi_tf.control_edges": 0,  # the control edges other paths imply
    "baechi_tf.cluster": 0,
    "baechi_tf._steps": 0,
    "baechi_tf._lazy": 0,
    "baechi_tf._files": 0,
    "baechi_tf.progress": 0,
    "baechi_tf.interrupts": 0,
    "baechi_tf.proto": 0,
    "baechi_tf.ranges": 0,  # the one range check of options and arguments
    "baechi_tf.placer": 1,
    "baechi_tf.sct": 1,
    "baechi_tf.report": 1,  # the text summary of a placement
    "baechi_tf.rewriter": 2,
    "baechi_tf.cost_model": 2,
    "baechi_tf.models": 2,
    "baechi_tf.reports": 2,
    "baechi_tf.json_io": 2,
    "baechi_tf._startup": 2,
    "baechi_tf.rewriter.session": 3,
    "baechi_tf.tf2": 3,  # baechi_tf.function: placed tf.functions, over the session's arguments
    "baechi_tf.rewriter.cli_place": 3,
    "baechi_tf.cli": 3,
    "baechi_tf.options": 3,  # the placement flags of argparse and absl
    "baechi_tf.__main__": 3,
    "baechi_tf": 3,  # the package itself: the public API, the session's included
}
NAMES = {0: "graph and cluster", 1: "placer", 2: "rewriter", 3: "session and CLI"}
TF_FROM = 2  # the lowest layer that may import TensorFlow


def _modules() -> dict[str, str]:
    """Module name -> path, for every module of the package but the compiled engine's sources."""
    found = {}
    for directory, subdirectories, files in os.walk(PACKAGE):
        subdirectories[:] = sorted(d for d in subdirectories if d not in ("__pycache__", "native"))
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                module = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                found[module.removesuffix(".__init__")] = path
    return found


MODULES = _modules()


def layer(module: str) -> int:
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        prefix = ".".join(parts[:n])
        if prefix in LAYERS:
            return LAYERS[prefix]
    raise AssertionError(f"{module} is in no layer: add it to LAYERS")


def imports(module: str) -> list[tuple[int, str]]:
    """(line, imported module) of every import in `module`, relative ones resolved; ``from A
    import B`` gives A.B when that is a module, else A."""
    path = MODULES[module]
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            for a in node.names:
                name = f"{base}.{a.name}"
                found.append((node.lineno, name if name in MODULES else base))
    return found


def test_every_module_is_in_a_layer():
    for module in MODULES:
        layer(module)


def test_no_module_imports_from_a_layer_above_its_own():
    wrong = [
        f"{module}:{line} ({NAMES[layer(module)]}) imports {target} ({NAMES[layer(target)]})"
        for module in MODULES
        for line, target in imports(module)
        if target.split(".")[0] == "baechi_tf" and layer(target) > layer(module)
    ]
    assert not wrong, "\n".join(wrong)


def test_no_tensorflow_below_the_rewriter():
    wrong = [
        f"{module}:{line} imports {target}"
        for module in MODULES
        if layer(module) < TF_FROM
        for line, target in imports(module)
        if target.split(".")[0] in ("tensorflow", "keras", "tf_keras")
    ]
    assert not wrong, "\n".join(wrong)


def test_nothing_in_the_placer_imports_the_pipeline():
    # The pipeline is the top of the placer: auto, the ladder and the registry sit below it.
    wrong = [
        f"{module}:{line} imports {target}"
        for module in MODULES
        if module.startswith(("baechi_tf.placer", "baechi_tf.sct")) and module != "baechi_tf.placer.pipeline"
        for line, target in imports(module)
        if target == "baechi_tf.placer.pipeline"
    ]
    assert not wrong, "\n".join(wrong)


# The list scheduler's modules: its core (the Python engine's loop and what it is made of), then
# the compiled engine's side, then the entry points that pick an engine and run it.
SCHEDULER_CORE = tuple(
    f"baechi_tf.placer.{m}"
    for m in ("list_scheduler", "scheduler_state", "policies", "twins", "tail_queues", "pins", "snapshots", "buffers")
)
SCHEDULER_ENTRIES = ("baechi_tf.placer.run_scheduler", "baechi_tf.placer.headroom")


def test_the_scheduler_core_imports_neither_engine_choice_nor_entry_points():
    above = SCHEDULER_ENTRIES + ("baechi_tf.placer.native_scheduler",)
    wrong = [
        f"{module}:{line} imports {target}"
        for module in SCHEDULER_CORE
        for line, target in imports(module)
        if target in above
    ]
    wrong += [
        f"baechi_tf.placer.native_scheduler:{line} imports {target}"
        for line, target in imports("baechi_tf.placer.native_scheduler")
        if target in SCHEDULER_ENTRIES
    ]
    assert not wrong, "\n".join(wrong)


def _reexported(module: str) -> list[str]:
    """The names in `module`'s `__all__` that it imports instead of defining."""
    tree = ast.parse(open(MODULES[module]).read())
    imported = {a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names}
    listed = [
        e.value
        for n in tree.body
        if isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in n.targets)
        for e in n.value.elts
    ]
    assert listed, f"{module} has no __all__"
    return sorted(set(listed) & imported)


def test_each_name_of_the_scheduler_has_one_home():
    # A name is imported from the module that defines it, never from one that passes it on.
    wrong = {m: _reexported(m) for m in SCHEDULER_CORE + SCHEDULER_ENTRIES + ("baechi_tf.placer.native_scheduler",)}
    assert not {m: names for m, names in wrong.items() if names}


def test_the_registry_loads_auto_only_when_auto_runs():
    # auto's candidates read the registry of methods, and the registry's `auto` runs auto: that
    # edge is an import inside the function, so that neither module needs the other to load.
    tree = ast.parse(open(MODULES["baechi_tf.placer.methods"]).read())
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert not [n.module for n in top if isinstance(n, ast.ImportFrom) and "auto" in (n.module or "")]
    assert "baechi_tf.placer.auto" in [t for _, t in imports("baechi_tf.placer.methods")]


def test_the_rules_catch_an_import_from_above(tmp_path, monkeypatch):
    # A placer module that imported the rewriter, or TensorFlow, would be reported.
    module = "baechi_tf.placer.check"
    source = open(MODULES[module]).read() + "\n\ndef _f():\n    import tensorflow\n    from baechi_tf.rewriter import graph_pass\n"
    path = tmp_path / "check.py"
    path.write_text(source)
    monkeypatch.setitem(MODULES, module, str(path))
    found = dict((t, line) for line, t in imports(module))
    assert "tensorflow" in found and "baechi_tf.rewriter.graph_pass" in found
    with pytest.raises(AssertionError, match="baechi_tf.placer.check:.* imports baechi_tf.rewriter.graph_pass"):
        test_no_module_imports_from_a_layer_above_its_own()
    with pytest.raises(AssertionError, match="baechi_tf.placer.check:.* imports tensorflow"):
        test_no_tensorflow_below_the_rewriter()


def test_importing_the_placer_leaves_tensorflow_out():
    below = sorted(m for m in MODULES if layer(m) < TF_FROM)
    code = (
        "import importlib, sys\n"
        f"for m in {below!r}:\n"
        "    importlib.import_module(m)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "[]", out.stdout[:2000]
