"""Writing what a command produced: checked before the work, atomic for regular files, streamed otherwise.

:func:`output_target` is called before any work is done, so an unwritable location (missing folder, a
directory, no permission) is refused in one line up front rather than after a long search. :meth:`Output.open`
then writes a regular file atomically (a temporary file beside it, ``os.replace`` on success, removed on any
failure or interruption: nothing is ever left half-written) and streams to anything else (``-``: stdout; a
pipe, ``/dev/null`` or another device is written in place and never replaced).
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from autoplan.errors import UserInputError
from autoplan.inputs import user_path

TMP_SUFFIX = ".autoplan-tmp"


@dataclass(frozen=True)
class Output:
    shown: str
    path: Path | None  # None: stdout
    regular: bool  # a regular file (or a new one): written atomically

    @contextlib.contextmanager
    def open(self) -> Iterator[IO[str]]:
        if self.path is None:
            yield sys.stdout
            sys.stdout.flush()
            return
        if not self.regular:
            with open(self.path, "w", encoding="utf-8") as f:
                yield f
            return
        fd, tmp = _temporary(self.path)
        try:
            with os.fdopen(fd, "w", encoding="utf-8", closefd=False) as f, _terminate_as_exit():
                yield f
                f.flush()
                os.fchmod(fd, _mode_for(self.path))
                if tmp is None:  # unnamed (O_TMPFILE): give it a name only now, then move it in place
                    tmp = f"{self.path.parent}/.{self.path.name}.{os.getpid()}{TMP_SUFFIX}"
                    _link_unnamed(fd, tmp, self.path.parent)
            os.replace(tmp, self.path)
        except BaseException:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
            raise
        finally:
            os.close(fd)

    def write_text(self, text: str) -> None:
        with self.open() as f:
            f.write(text)


def output_target(path: str, *, what: str = "output") -> Output:
    """Check that ``path`` can be written (before any work) and say how it will be."""
    if path == "-":
        return Output(path, None, False)
    p = user_path(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        st = None
    except OSError as err:
        raise UserInputError(f"cannot write {what} '{path}': {err.strerror or err}") from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise UserInputError(f"{what} '{path}' is a directory; give a file name")
    if st is not None and not stat.S_ISREG(st.st_mode):
        if not os.access(p, os.W_OK):
            raise UserInputError(f"cannot write {what} '{path}': permission denied")
        return Output(path, p, False)  # a pipe or device: stream into it, never replace it
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise UserInputError(f"cannot write {what} '{path}': folder '{parent}' does not exist")
    if not os.access(parent, os.W_OK | os.X_OK) or (st is not None and not os.access(p, os.W_OK)):
        raise UserInputError(f"cannot write {what} '{path}': permission denied")
    return Output(path, p, True)


def _temporary(path: Path) -> tuple[int, str | None]:
    """A file descriptor to write ``path``'s new content into, and the temporary's name. On Linux the file
    is unnamed (``O_TMPFILE``) until it is complete, so even a SIGKILL leaves nothing behind."""
    flags = getattr(os, "O_TMPFILE", 0)
    if flags and os.path.isdir("/proc/self/fd"):
        try:
            return os.open(path.parent, flags | os.O_WRONLY, 0o600), None
        except OSError:  # a file system without O_TMPFILE support
            pass
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TMP_SUFFIX)
    return fd, tmp


def _link_unnamed(fd: int, name: str, folder: Path) -> None:
    """Name an O_TMPFILE file: linkat(AT_SYMLINK_FOLLOW) on /proc/self/fd/N (open(2), "O_TMPFILE")."""
    dir_fd = os.open(folder, os.O_RDONLY)
    try:  # a dir_fd makes CPython call linkat, which follows the /proc link with follow_symlinks=True
        os.link(f"/proc/self/fd/{fd}", os.path.basename(name), dst_dir_fd=dir_fd, follow_symlinks=True)
    finally:
        os.close(dir_fd)


def _mode_for(path: Path) -> int:
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


@contextlib.contextmanager
def _terminate_as_exit() -> Iterator[None]:
    """While writing, SIGTERM unwinds like Ctrl-C (so the temporary file is removed), then exits 143."""
    def handler(signum: int, frame: Any) -> None:
        del frame
        raise SystemExit(128 + signum)
    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
