#!/bin/sh
# The Python interpreter of bazel's py_binary targets (see BUILD): $BAECHI_PYTHON if set, else the
# checkout's .venv/bin/python. bazel runs this file through a runfiles symlink; `readlink -f`
# leads back to the source tree, two levels below the checkout.
if [ -n "${BAECHI_PYTHON:-}" ]; then
    exec "$BAECHI_PYTHON" "$@"
fi
checkout=$(dirname "$(dirname "$(dirname "$(readlink -f "$0")")")")
if [ -x "$checkout/.venv/bin/python" ]; then
    exec "$checkout/.venv/bin/python" "$@"
fi
echo "baechi_tf: no Python environment at $checkout/.venv: run 'make test' once to create it," \
    "or set BAECHI_PYTHON to a python that has tensorflow-cpu and absl-py" >&2
exit 127
