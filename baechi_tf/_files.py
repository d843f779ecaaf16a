"""Writing files so that a reader never sees half of one: a temporary file, then a rename."""

from __future__ import annotations

import os
import tempfile

__all__ = ["atomic_write", "check_writable"]


def check_writable(path: str, flag: str) -> None:
    """Raises `ConfigError` unless `atomic_write` can write `path` (given as `flag`): run it
    before long work, so that a bad output path does not cost the work and end in a traceback."""
    from baechi_tf.errors import ConfigError

    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ConfigError(f"{flag} {path!r} is a folder; give the name of a file in it")
    if not os.path.isdir(folder):
        raise ConfigError(f"{flag} {path!r}: the folder {folder!r} does not exist; create it first")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {path!r}: the folder {folder!r} is not writable; write elsewhere")


def atomic_write(path: str, data: bytes | str) -> None:
    """Writes `data` to `path` through a temporary file in the same folder and `os.replace`.

    On any error (or Ctrl-C) the temporary file is removed and `path` is left as it was.
    """
    if isinstance(data, str):
        data = data.encode("utf-8")
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix="-" + os.path.basename(path), dir=folder)
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # as open() would create it; mkstemp makes 0600
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
