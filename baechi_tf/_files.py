"""Writing files so that a reader never sees half of one: a temporary file, then a rename.

An output that is not a regular file (``/dev/null``, a FIFO, a terminal, ``/dev/stdout``) is
written into where it is instead: a rename would put a regular file in its place. A file replaced
keeps its permission bits and owner, and a link is followed: its target is replaced.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import tempfile

__all__ = [
    "REPORT_FILE", "atomic_write", "check_apart", "check_output_folder", "check_report_folder",
    "check_writable", "keep_mode", "output_error", "report_files",
]

REPORT_FILE = re.compile(r"(gantt\.png|memory_\d+\.png|trace\.json|summary\.json|graph\.pbtxt|events\.out\.tfevents\.baechi)\Z")
"""The names of the files `reports.write_reports` writes into a report folder."""


def check_writable(path: str, flag: str, inputs: tuple[str, ...] = ()) -> None:
    """Raises `ConfigError` unless `atomic_write` can write `path` (given as `flag`) without
    replacing one of the files `inputs`: run it before long work, so that a bad output path does
    not cost the work and end in a traceback."""
    from baechi_tf.errors import ConfigError

    folder = os.path.dirname(os.path.realpath(path))  # a link's target is what is replaced
    if any(_same_file(path, i) for i in inputs):
        raise ConfigError(f"{flag} {path!r} would overwrite an input; write elsewhere")
    if os.path.isdir(path):
        raise ConfigError(f"{flag} {path!r} is a folder; give the name of a file in it")
    if os.path.basename(path) in ("", ".", ".."):  # results/ is a folder, whether or not it exists
        raise ConfigError(f"{flag} {path!r} names a folder, not a file; give the name of a file")
    if _written_in_place(path):
        if stat.S_ISSOCK(os.stat(path).st_mode):
            raise ConfigError(f"{flag} {path!r} is a socket, which cannot be opened as a file; write elsewhere")
        if not os.access(path, os.W_OK):
            raise ConfigError(f"{flag} {path!r} is not writable; write elsewhere")
        return
    if not os.path.isdir(folder):
        existing = folder
        while not os.path.exists(existing):
            existing = os.path.dirname(existing)
        if not os.path.isdir(existing):  # a file where a folder should be: none can be made there
            what = ("is a file, not a folder" if existing == folder
                    else f"is a file, so the folder {folder!r} cannot be created")
            raise ConfigError(f"{flag} {path!r}: {existing!r} {what}; write elsewhere")
        raise ConfigError(f"{flag} {path!r}: the folder {folder!r} does not exist; create it first")
    if not _can_write_in(folder):
        raise ConfigError(f"{flag} {path!r}: the folder {folder!r} is not writable; write elsewhere")


def check_report_folder(path: str, flag: str, keep: tuple[str, ...] = ()) -> None:
    """`check_output_folder` for a report folder (`reports.write_reports`), also refused when a
    report would replace one of the files `keep` (the inputs and other outputs of the run: an
    input named graph.pbtxt beside --report_dir .) or a file of the user's: one with a report's
    name that the earlier report there (`report_files`) did not write."""
    from baechi_tf.errors import ConfigError

    for kept in keep:
        if kept and _report_replaces(path, kept):
            raise ConfigError(
                f"{flag} {path!r} would replace {kept!r} with a report of the same name; write "
                "the reports into another folder"
            )
    check_output_folder(path, flag)
    if not os.path.isdir(path):
        return
    earlier = report_files(path)
    others = sorted(n for n in os.listdir(path) if REPORT_FILE.match(n) and n not in earlier)
    if others:
        raise ConfigError(
            f"{flag} {path!r} holds {', '.join(map(repr, others))}, not from an earlier report, which "
            "a report would replace; write the reports into another folder, or remove "
            f"{'them' if len(others) > 1 else 'it'}"
        )


def report_files(folder: str) -> set[str]:
    """The files of the report in `folder` that its summary.json lists (none when there is no
    summary, or one `reports.write_reports` did not write)."""
    try:
        with open(os.path.join(folder, "summary.json"), encoding="utf-8") as f:
            doc = json.load(f)
        files = doc["files"]
        ours = "critical_path" in doc and "makespan_over_lower_bound" in doc  # not another tool's
    except (OSError, ValueError, KeyError, TypeError):
        return set()
    if not ours or not isinstance(files, list):
        return set()
    return {n for n in files if isinstance(n, str) and REPORT_FILE.match(n)}


def check_output_folder(path: str, flag: str) -> None:
    """Raises `ConfigError` unless a folder `path` (given as `flag`) exists and is writable or
    can be created: run it before long work, as `check_writable`."""
    from baechi_tf.errors import ConfigError

    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"{flag} {path!r} is a file, not a folder; give a folder (it is created if missing)")
    existing = os.path.abspath(path)
    while not os.path.exists(existing):
        if os.path.islink(existing):  # makedirs fails on it (FileExistsError), after the work
            raise ConfigError(
                f"{flag} {path!r}: {existing!r} is a link to {os.readlink(existing)!r}, which does "
                "not exist; create the folder it names, or give another folder"
            )
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise ConfigError(f"{flag} {path!r}: {existing!r} is a file, so the folder cannot be created")
    if not _can_write_in(existing):
        raise ConfigError(f"{flag} {path!r}: {existing!r} is not writable; write elsewhere")


def check_apart(folder: str, folder_flag: str, file: str, file_flag: str) -> None:
    """Raises `ConfigError` when the output folder `folder` (given as `folder_flag`) is the output
    file `file` (given as `file_flag`) or inside it, which each check alone lets through (neither
    exists yet) and the second one written would fail on, after the work."""
    from baechi_tf.errors import ConfigError

    real_folder, real_file = os.path.realpath(folder), os.path.realpath(file)
    if real_folder == real_file:
        raise ConfigError(
            f"{folder_flag} {folder!r} and {file_flag} {file!r} name the same path; give "
            f"{folder_flag} a folder of its own"
        )
    if real_folder.startswith(real_file.rstrip(os.sep) + os.sep):
        raise ConfigError(
            f"{folder_flag} {folder!r} is inside {file_flag} {file!r}, which is written as a file; "
            f"give {folder_flag} a folder elsewhere"
        )


def _report_replaces(folder: str, path: str) -> bool:
    """Whether a report written into `folder` would replace the file `path`."""
    for named in (path, os.path.realpath(path)):  # a link, and its target, which --out replaces
        if REPORT_FILE.match(os.path.basename(named)) and _same_file(os.path.dirname(os.path.abspath(named)), folder):
            return True
    if not os.path.isdir(folder) or not os.path.exists(path):
        return False
    # Under another name: a link to it in the folder.
    return any(REPORT_FILE.match(n) and _same_file(os.path.join(folder, n), path) for n in os.listdir(folder))


def _can_write_in(folder: str) -> bool:
    """Whether a file can be made in `folder`, tried (permissions alone say yes to root on a
    read-only or immutable folder)."""
    try:
        fd, probe = tempfile.mkstemp(prefix=".tmp-probe-", dir=folder)
    except OSError:
        return False
    os.close(fd)
    os.unlink(probe)
    return True


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist
        return os.path.abspath(a) == os.path.abspath(b)


def _written_in_place(path: str) -> bool:
    """Whether `path` exists and is not a regular file (a device, a FIFO, a socket), or is one of
    the process's file descriptors (``/dev/stdout``, ``/dev/fd/1``, ``/proc/self/fd/1``, even when
    that is a regular file): such a path is written into, never replaced."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return True
    except OSError:  # missing, or a link to nothing
        return False
    for _ in range(40):  # as many links as the kernel follows
        # Its folder with the links resolved: /dev/fd/1 is in /proc/<pid>/fd.
        path = os.path.join(os.path.realpath(os.path.dirname(os.path.abspath(path))), os.path.basename(path))
        if path.startswith("/proc/") or not os.path.islink(path):
            return path.startswith("/proc/")
        path = os.path.join(os.path.dirname(path), os.readlink(path))
    return False


def keep_mode(path: str, new: str) -> None:
    """Gives the file `new`, about to replace `path`, the permission bits of `path` and, where
    allowed, its owner; nothing when `path` does not exist."""
    try:
        old = os.stat(path)
    except FileNotFoundError:
        return
    try:
        os.chown(new, old.st_uid, old.st_gid)  # before chmod: chown clears set-user-ID bits
    except PermissionError:  # another user's file: this user's, as a new file would be
        pass
    os.chmod(new, stat.S_IMODE(old.st_mode))


def atomic_write(path: str, data: bytes | str) -> None:
    """Writes `data` to `path` through a temporary file in the same folder and `os.replace`;
    the file replaced keeps its mode (`keep_mode`), and a link's target is replaced.

    On any error (or Ctrl-C) the temporary file is removed and `path` is left as it was; an
    `OSError` (a full disk) is raised as an `OutputError` naming `path` (`output_error`). A path
    that is not a regular file (`_written_in_place`: ``/dev/null``, a FIFO, ``/dev/stdout``) is
    opened and written instead, and stays what it is.
    """
    if isinstance(data, str):
        data = data.encode("utf-8")
    try:
        _atomic_write(path, data)
    except OSError as e:
        raise output_error(e, path) from e


def output_error(error: OSError, path: str) -> OSError:
    """`error`, raised while `path` was written, as an `OutputError`: one line naming the path
    and why (``No space left on device``) and what to do about it, not a traceback; it keeps the
    errno. One already a `BaechiError` stays."""
    from baechi_tf.errors import BaechiError, OutputError

    if isinstance(error, BaechiError):
        return error
    why = error.strerror or str(error) or type(error).__name__
    advice = _OUTPUT_ADVICE.get(error.errno, "write elsewhere")
    out = OutputError(f"cannot write {path!r}: {why}; {advice}")
    out.errno = error.errno  # for callers that look at it; the message stays the one line above
    return out


# What to do about an error while an output was written, by errno; any other: write elsewhere.
_OUTPUT_ADVICE = {
    errno.ENOSPC: "free some space or write elsewhere",
    errno.EDQUOT: "free some space or write elsewhere",
    errno.EFBIG: "write elsewhere (a file system that takes files this large)",
    errno.EACCES: "give this user write permission there, or write elsewhere",
    errno.EPERM: "give this user write permission there, or write elsewhere",
    errno.EROFS: "the file system is read-only; write elsewhere",
}


def _atomic_write(path: str, data: bytes) -> None:
    if _written_in_place(path):
        with open(path, "wb") as f:
            f.write(data)
        return
    path = os.path.realpath(path)  # through links: the link stays, its target is replaced
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix="-" + os.path.basename(path), dir=os.path.dirname(path))
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)  # as open() would create it; mkstemp makes 0600
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        keep_mode(path, tmp)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
