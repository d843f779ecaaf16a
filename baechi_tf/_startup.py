"""The start of the command-line programs outside the package (train.py, the communication
benchmark): `main` under `interrupts.recording`, and TensorFlow's import without its C++
start-up lines; and `collector_paused`, for the programs and for placement. (Each program sets
its own SIGINT handler for the time its modules load, this one included, before it imports
anything of the package.)"""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import signal
import sys
from typing import Callable, Iterator, NoReturn, Sequence

from baechi_tf import interrupts
from baechi_tf._lazy import require_tensorflow
from baechi_tf.errors import ConfigError

__all__ = ["collector_paused", "exit_now", "flag_parser", "import_tensorflow_quietly", "native_stderr_quiet", "run_main"]


def run_main(
    main: Callable[[], int], argv: Sequence[str], *, prog: str, interrupted: str, loading_handler: Callable
) -> int:
    """`main()` under `interrupts.recording`, its errors turned into one line ``{prog}: error:
    ...`` and an exit status (`interrupts.exit_status`): all of it, so that a Ctrl-C at any point
    is the one line `interrupted` and 130. Arguments left in `argv` after the flags are an error.
    `loading_handler`, the program's SIGINT handler while its modules loaded, gives way first."""
    try:
        if signal.getsignal(signal.SIGINT) is loading_handler:
            signal.signal(signal.SIGINT, signal.default_int_handler)  # for `recording`
        with interrupts.recording():
            if len(argv) > 1:
                raise ConfigError(f"unexpected arguments: {' '.join(argv[1:])}")
            return main()
    except BaseException as e:
        return interrupts.exit_status(e, interrupted=interrupted, failed=f"{prog}: error: ")


_HELP_FLAGS = frozenset({"help", "?", "helpshort", "helpfull", "helpxml"})


def flag_parser(prog: str) -> Callable[[list[str]], list[str]]:
    """absl's flag parsing, for ``app.run(main, flags_parser=...)``, but a bad flag is one line
    ``{prog}: error: ...`` on stderr and exit status 2 (absl's own is a usage dump and 1)."""
    from absl import flags

    def parse(argv: list[str]) -> list[str]:
        try:
            return flags.FLAGS(argv)
        except flags.Error as e:
            print(f"{prog}: error: {' '.join(str(e).split())}", file=sys.stderr)
            sys.exit(2)
        except SystemExit as e:
            # absl's --help (and --helpfull, ...) prints the help and exits with 1; asking for
            # help is not a failure (argparse exits with 0).
            if e.code == 1 and any(a.split("=")[0].lstrip("-") in _HELP_FLAGS for a in argv[1:]):
                sys.exit(0)
            raise

    return parse


# What TensorFlow's import loads of Keras at once, "so that any function/method that needs to
# happen at load time will trigger" (its __init__: the optimizers' registration for SavedModels),
# with ImportError caught: Keras 3's and, under TF_USE_LEGACY_KERAS, tf_keras's.
_KERAS_AT_TF_IMPORT = ("keras.src.optimizers", "tf_keras.src.optimizers")


def import_tensorflow_quietly() -> None:
    """Imports TensorFlow with stderr sent to /dev/null unless TF_CPP_MIN_LOG_LEVEL is 0.

    TF's C++ start-up lines ("All log messages before absl::InitializeLog() ...", oneDNN) are
    printed before TF_CPP_MIN_LOG_LEVEL applies; without this, an error would not be one line.
    Without TensorFlow it raises `TensorFlowMissingError`, which a command says in one line.

    The programs place and run graphs, not Keras models: the Keras optimizers that TF's import
    loads at once (a fifth of the import, some 0.65 s here) are left to the first import of
    Keras after it (`_KERAS_AT_TF_IMPORT`, each blocked for the import alone unless already
    loaded), which then loads them as it would have. ``tf.keras`` and ``import keras`` work as
    before.
    """
    require_tensorflow("this command")
    if "tensorflow" in sys.modules:
        return
    blocked = [name for name in _KERAS_AT_TF_IMPORT if name not in sys.modules]
    for name in blocked:
        sys.modules[name] = None  # type: ignore[assignment]  # an import of it raises ImportError
    try:
        with native_stderr_quiet():
            import tensorflow  # noqa: F401
    finally:
        for name in blocked:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused for the block, as it was after it.

    TensorFlow's import and the import of a large GraphDef allocate millions of objects that live
    on; each of the collector's passes over the oldest generation walks all of them again (a
    sixth of `baechi place`'s time on a 16k-op graph). Nothing of the block needs cycles freed
    before it ends: reference counting still frees everything else at once, and the collector
    takes the cycles at its first pass after the block.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def exit_now(status: int) -> NoReturn:
    """Ends a finished command's process with `status`: the atexit handlers run (logging's flush,
    the stop of local workers) and stdout and stderr are flushed, but Python's finalisation is
    skipped. Once TensorFlow is imported, that finalisation (its modules and objects torn down
    one by one) takes about a second and does nothing a command that has closed its files needs.
    """
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken stream: nothing more can be written
            pass
    os._exit(status)


@contextlib.contextmanager
def native_stderr_quiet() -> Iterator[None]:
    """File descriptor 2 (C++'s stderr, and Python's) goes to /dev/null for the block, unless
    TF_CPP_MIN_LOG_LEVEL is 0 (the user asked for TF's logs).

    For C++ calls that log errors the caller turns into one line of its own: gRPC's two error
    lines when a server cannot take its port, and absl's "All log messages before
    absl::InitializeLog()" line before the first log of a process (which TensorFlow's import
    prints only where oneDNN is on).
    """
    if os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0") in ("", "0"):
        yield
        return
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
