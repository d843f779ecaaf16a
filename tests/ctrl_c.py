"""Pressing Ctrl-C on a program at a known point, without timers: a real SIGINT sent when a module
is first imported (`at_import`), or once the program has printed a line (`after_output`)."""

import signal
import subprocess
import sys

# Runs a program as `python PROGRAM` (or `python -m MODULE` when it starts with "-m ") would,
# after adding an import hook that sends the process a SIGINT when `name` is first imported.
_DRIVER = """
import os, runpy, signal, sys

class CtrlCAtImport:
    def find_spec(self, name, path=None, target=None):
        if name == module:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None

module, program, sys.argv = sys.argv[1], sys.argv[2], sys.argv[2:]
sys.meta_path.insert(0, CtrlCAtImport())
if program.startswith("-m "):
    runpy.run_module(program[3:], run_name="__main__")
else:
    runpy.run_path(program, run_name="__main__")
"""


def _default_sigint() -> None:
    # A shell running the tests in the background may ignore SIGINT, which children inherit; a
    # user's terminal delivers it.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def at_import(name: str, program: str, *args: str, **run: object) -> subprocess.CompletedProcess:
    """Runs `program` with `args` and presses Ctrl-C when it first imports module `name`."""
    return subprocess.run(
        [sys.executable, "-c", _DRIVER, name, program, *args],
        capture_output=True, text=True, preexec_fn=_default_sigint, **{"timeout": 120, **run},
    )


def after_output(command: list, ready, *, watch: str = "stdout", **popen: object) -> tuple[int, str, str]:
    """Runs `command`, presses Ctrl-C once `ready(what it wrote on `watch` so far)` is true (at
    the end of a line), and returns (exit status, what `watch` had before the press, the rest
    of stderr)."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_default_sigint, **popen)
    stream = proc.stdout if watch == "stdout" else proc.stderr
    seen = ""
    try:
        while not ready(seen):
            line = stream.readline()
            assert line, f"the program ended before it was ready: {seen}{'' if watch == 'stderr' else proc.stderr.read()}"
            seen += line
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    return proc.returncode, seen, err
