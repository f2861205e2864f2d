"""What the caller hands rca and may have taken away: its working directory (deleted under it) and
its standard output (closed, or on a full disk). Each is the user's to fix, said in one line with
exit status 2, never a traceback nor an internal error. Light to import: `rca --version` uses it."""

from __future__ import annotations

import contextlib
import io
import os
import sys
from typing import Any

from rca.errors import InputError, RcaError

_OUTPUT_FIX = "send the output where it can be written: a file on a disk with room, an open pipe or terminal"


class OutputError(InputError, OSError):
    """Standard output cannot be written: the answer is lost, through no fault of the inputs. An
    OSError too, so that whatever copes with a failed write (an engine's echoed output) still does."""


def said(error: RcaError) -> int:
    """Say `error` on standard error, where it can still be written, and return its exit status."""
    with contextlib.suppress(OSError, AttributeError):  # closed (None to Python), or full: nothing can be said
        sys.stderr.write(f"rca: error: {error}\n")
        sys.stderr.flush()
    return int(error.exit_code)


def hold_closed_descriptors() -> None:
    """Give each standard descriptor the caller closed a stand-in that cannot be written (/dev/null,
    read-only): its number stays taken, so no file or socket rca opens becomes its standard output
    (and the rca server's copy of the command gets the same closed output), and a write to it
    fails as a write to the closed descriptor would."""
    for number in (0, 1, 2):
        try:
            os.fstat(number)
        except OSError:
            os.open(os.devnull, os.O_RDONLY)  # the lowest free number: this one


class _Output(io.FileIO):
    """Descriptor 1 whose first failed write raises OutputError; the writes after it are dropped:
    the answer is lost already, and said so once. A reader that left (`rca ... | head`) is no
    error: what it did not read is dropped, as a program a pipe's SIGPIPE ends says nothing."""

    lost = False

    def write(self, data: Any) -> int | None:  # type: ignore[override]  # None where the write is dropped
        if self.lost:
            return len(data)
        try:
            return super().write(data)
        except BrokenPipeError:
            self.lost = True
            return len(data)
        except OSError as error:
            self.lost = True
            raise OutputError(f"cannot write to standard output ({error.strerror})", fix=_OUTPUT_FIX) from None


def guarded_output(stream: Any) -> io.TextIOWrapper:
    """Standard output as `stream` writes it (its encoding, errors and buffering; None when Python
    found descriptor 1 closed), whose failed writes raise OutputError."""
    return io.TextIOWrapper(
        io.BufferedWriter(_Output(1, "w", closefd=False)),
        getattr(stream, "encoding", None) or "utf-8",
        getattr(stream, "errors", None) or "strict",
        line_buffering=bool(getattr(stream, "line_buffering", False)),
    )


def working_directory_error() -> InputError | None:
    """Why the working directory cannot be used (deleted under rca, or out of reach), or None: the
    commands resolve their paths against it."""
    try:
        os.getcwd()
    except OSError as error:
        return InputError(
            f"the working directory cannot be read ({error.strerror}): it was deleted, or moved out of reach",
            fix="cd to a directory that exists and run rca again",
        )
    return None
