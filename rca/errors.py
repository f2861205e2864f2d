"""Domain errors and exit codes. Every error names the input, what is wrong and the fix."""

from __future__ import annotations

import enum
import re


class ExitCode(enum.IntEnum):
    CONSISTENT = 0
    MISMATCH = 1
    BAD_INPUT = 2
    INCONCLUSIVE = 3
    INTERNAL = 4


class RcaError(Exception):
    """An error the user can act on: printed as one line, never with a traceback."""

    exit_code = ExitCode.BAD_INPUT

    def __init__(self, what: str, *, where: str = "", fix: str = "") -> None:
        self.what = what
        self.where = where
        self.fix = fix
        super().__init__(str(self))

    def __str__(self) -> str:
        text = f"{self.where}: {self.what}" if self.where else self.what
        if self.fix:
            text += f" (fix: {self.fix})"
        return printable(text)


class InputError(RcaError):
    """A path, config, patch or source the user gave is missing or malformed."""


class SourceFetchError(InputError):
    """A `pkg==version` source could not be downloaded or unpacked."""


class PatchError(InputError):
    """A patch does not apply to the source it was given for."""


class ParseFailure(InputError):
    """A source file that the analysis needs cannot be parsed."""


_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """`text` safe for one line of a terminal: control characters (an engine's colour codes, a
    server's newlines, a terminal escape) written as escapes, never sent raw."""
    return _CONTROL.sub(lambda match: match.group().encode("unicode_escape").decode("ascii"), text)


def brief(error: BaseException, limit: int = 160) -> str:
    """An exception as a short quote for an error line: its type and the first line of its message
    (the type alone where it has none, as a MemoryError)."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0][:limit]}" if lines else type(error).__name__
