"""Which modules a program had loaded when it exited, for tests that a program answers before
TensorFlow loads (which takes seconds).

A ``sitecustomize`` module put first on the program's PYTHONPATH writes the names in
``sys.modules`` to a file at exit. (``python -X importtime`` would list them on stderr, but the
programs silence stderr while TensorFlow loads.)
"""

import os
import subprocess

_SITECUSTOMIZE = '''
import atexit
import os
import sys


def _write_loaded():
    with open(os.environ["LOADED_MODULES_FILE"], "w") as f:
        f.write("\\n".join(sorted(sys.modules)))


atexit.register(_write_loaded)
'''


def run_listing_modules(args, tmp_path, **kwargs):
    """`subprocess.run(args, **kwargs)` (text output captured) and the set of modules the
    program had loaded when it exited."""
    site = tmp_path / "loaded_site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(_SITECUSTOMIZE)
    out = tmp_path / "loaded_modules.txt"
    env = dict(kwargs.pop("env", None) or os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    env["LOADED_MODULES_FILE"] = str(out)
    done = subprocess.run(args, capture_output=True, text=True, env=env, **kwargs)
    assert out.exists(), done.stderr[-2000:]  # the program ran to its exit
    names = set(out.read_text().split("\n"))
    assert "baechi_tf" in names, sorted(names)[:50]  # the listing is the program's (all import it)
    return done, names
