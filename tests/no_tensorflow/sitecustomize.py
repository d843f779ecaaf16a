"""Refuses TensorFlow's import, for `make test-core` (``pytest --core``): its tests are the ones
that need no TensorFlow, and this keeps them so.

The pytest process loads this file through tests/conftest.py, and every Python program that its
tests start loads it as ``sitecustomize`` (``--core`` puts this folder first on PYTHONPATH). An
``import tensorflow`` (or of any of its modules) then fails with an error that names the fix, and
is also written to the file ``$BAECHI_TENSORFLOW_REFUSED`` when that is set, so that an import
caught by an ``except ImportError`` is still seen.
"""

import os
import sys
import traceback


class RefuseTensorFlow:
    """A `sys.meta_path` finder that refuses the modules of TensorFlow's package."""

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] != "tensorflow":
            return None
        where = "".join(traceback.format_stack(limit=12)[:-1])
        log = os.environ.get("BAECHI_TENSORFLOW_REFUSED")
        if log:
            with open(log, "a") as f:
                f.write(f"import {name} in {' '.join(sys.argv)} (pid {os.getpid()}), from:\n{where}\n")
        raise ImportError(
            f"import {name}: `make test-core` (pytest --core) runs only the tests that need no "
            "TensorFlow; mark a test that needs it @pytest.mark.tf (a whole file: pytestmark = "
            "pytest.mark.tf), or keep TensorFlow out of the code it runs"
        )


if not any(type(finder).__name__ == "RefuseTensorFlow" for finder in sys.meta_path):
    sys.meta_path.insert(0, RefuseTensorFlow())
