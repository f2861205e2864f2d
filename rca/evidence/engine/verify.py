"""A fix checked in the engine: the draft served as given and with the fix rca proposes, measured
by the engine's own counters.

The fix is served from a temporary copy of the draft directory: its config with the edit made (or
the tensors the fix gives its checkpoint, in a file of their own), every other file of it copied
(not linked: an engine that writes into its model directory must not write the user's files). The
user's launch command is run twice, once as given and once with each mention of the draft
directory pointed at the copy; nothing of the user's is changed, and the copy is removed afterwards.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rca.errors import InputError, RcaError, printable
from rca.evidence.engine.served import Prompts, ServedAcceptance, measure_launched
from rca.model import CheckpointEdit, ConfigEdit, Diagnosis, Hypothesis, Status

Progress = Callable[[str], None]
RESTORES = 0.1  # acceptance the fix must add, at least, to count as verified
FIX_FILE = "rca-fix.safetensors"  # where a fixed copy keeps the tensors the fix gives the checkpoint
_FICLONE = 0x40049409  # Linux's ioctl that clones a file (copy-on-write), as `cp --reflink` does


@dataclass(frozen=True)
class ServeWith:
    """How to serve the draft: the user's launch command, the prompts, where it answers."""

    command: tuple[str, ...]
    prompts: Prompts
    url: str | None = None
    startup_timeout: float = 900.0


@dataclass(frozen=True)
class EngineCheck:
    """The engine's acceptance as served and with the fix (when one could be served)."""

    hypothesis: str
    fix: str
    as_served: ServedAcceptance | None
    with_fix: ServedAcceptance | None = None
    not_served: str = ""  # why the fix was not served (not an edit of the draft config, ...)
    failed: tuple[str, ...] = field(default=())  # runs that could not be measured, and why

    @property
    def verified(self) -> bool | None:
        if self.as_served is None or self.with_fix is None:
            return None
        return self.with_fix.acceptance - self.as_served.acceptance >= RESTORES

    @property
    def summary(self) -> str:
        if self.as_served is None:
            return f"acceptance could not be measured in the engine: {'; '.join(self.failed)}"
        served = f"{self.as_served.acceptance:.2f}"
        if self.with_fix is None:
            reason = self.not_served or "; ".join(self.failed)
            return f"acceptance in the engine as served: {served} (the fix was not served: {reason})"
        fixed = f"{self.with_fix.acceptance:.2f}"
        if self.verified:
            return f"fix verified in the engine: acceptance {served} -> {fixed}"
        return (
            f"fix not verified in the engine: acceptance {served} -> {fixed} with it "
            f"(it must add at least {RESTORES:.2f})"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "hypothesis": self.hypothesis,
            "fix": self.fix,
            "as_served": self.as_served.to_json() if self.as_served else None,
            "with_fix": self.with_fix.to_json() if self.with_fix else None,
            "verified": self.verified,
            "not_served": self.not_served or None,
            "failed": list(self.failed),
            "summary": self.summary,
        }


def check_in_engine(
    hypothesis: Hypothesis | None, draft: Path | None, serve: ServeWith, progress: Progress | None = None
) -> EngineCheck:
    """Measure the draft as served and, when the top hypothesis's fix edits the draft config, with it."""
    name, fix = (hypothesis.id, hypothesis.fix) if hypothesis is not None else ("", "")
    directory = None if draft is None else (draft if draft.is_dir() else draft.parent)
    failed: list[str] = []

    def measured(command: Sequence[str], label: str) -> ServedAcceptance | None:
        if progress:
            progress(f"serving the draft {label}")
        try:
            return measure_launched(
                command, serve.prompts, serve.url, startup_timeout=serve.startup_timeout, progress=progress
            )
        except RcaError as error:
            failed.append(f"{label}: {printable(error.what)}")
            return None

    as_served = measured(serve.command, "as given")
    edit = hypothesis.fix_edit if hypothesis is not None else None
    if directory is None:
        return EngineCheck(name, fix, as_served, None, "the draft directory is not known (--draft)", tuple(failed))
    if edit is None:
        return EngineCheck(name, fix, as_served, None, "it is not an edit of the draft", tuple(failed))
    if as_served is None:
        return EngineCheck(name, fix, None, None, "", tuple(failed))
    if not _mentions(serve.command, directory):
        return EngineCheck(
            name,
            fix,
            as_served,
            None,
            f"the launch command does not name the draft directory {directory}, so a fixed copy cannot be served",
            tuple(failed),
        )
    config = draft if draft is not None and draft.is_file() else directory / "config.json"
    try:
        with fixed_copy(config, edit) as copy:
            with_fix = measured(_pointed_at(serve.command, directory, copy), f"with the fix ({fix})")
    except RcaError as error:  # the fixed copy could not be made
        return EngineCheck(name, fix, as_served, None, printable(error.what), tuple(failed))
    return EngineCheck(name, fix, as_served, with_fix, "", tuple(failed))


class fixed_copy:
    """A temporary copy of the directory of a draft config with `edit` made: to the config (a
    ConfigEdit), or to the checkpoint (a CheckpointEdit: its tensors written to a file of their own,
    and any shard that held them written again without them). The copy is removed on exit.

    Every other file of the directory is copied, the weights too: a link (symbolic or hard) would
    let an engine that opens a file of its model directory for writing write the user's. The
    copy costs the draft's size on the temporary directory's disk (an EAGLE-3 draft is one decoder
    layer: a few GB at most), and nothing where that disk clones files (btrfs, XFS: set TMPDIR on
    the draft's file system). Subdirectories are left out: a model engines load is its top-level
    files, and a training run's directory may hold every checkpoint below them."""

    def __init__(self, config_path: Path, edit: ConfigEdit | CheckpointEdit) -> None:
        self.config_path, self.directory, self.edit = config_path, config_path.parent, edit
        self.root: Path | None = None

    def __enter__(self) -> Path:
        self.root = Path(tempfile.mkdtemp(prefix="rca-fixed-draft-"))
        copy = self.root / self.directory.name
        copy.mkdir()
        try:
            for entry in self.directory.iterdir():
                if entry.is_file():  # a regular file, or a link to one (a hub snapshot's)
                    _own_copy(entry, copy / entry.name)
            if isinstance(self.edit, ConfigEdit):
                self._edit_config(copy)
            else:
                self._edit_checkpoint(copy, self.edit)
        except OSError as error:
            self.__exit__()
            raise InputError(
                f"the draft directory cannot be copied to serve the fix ({error.strerror})",
                where=str(error.filename or self.directory),
                fix="make its files readable, and give the temporary directory room for them (TMPDIR sets where it is)",
            ) from None
        except BaseException:
            self.__exit__()
            raise
        return copy

    def _edit_config(self, copy: Path) -> None:
        assert isinstance(self.edit, ConfigEdit)
        config_path = self.config_path
        try:
            config = json.loads(config_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise InputError(
                f"the draft config cannot be read to apply the fix ({error})",
                where=str(config_path),
                fix="pass --draft the draft's directory with its config.json",
            ) from None
        if not isinstance(config, dict):
            raise InputError(
                "the draft config is not a JSON object", where=str(config_path), fix="pass the draft's config.json"
            )
        (copy / config_path.name).write_text(json.dumps(self.edit.apply(config), indent=2) + "\n", encoding="utf-8")

    def _edit_checkpoint(self, copy: Path, edit: CheckpointEdit) -> None:
        from safetensors import safe_open
        from safetensors.torch import save_file

        written = edit.file_tensors()
        replaced = set(written) | set(edit.dropped)
        for shard in sorted(self.directory.glob("*.safetensors")):
            with safe_open(str(shard), "pt") as handle:
                names = list(handle.keys())
                if not set(names) & replaced:
                    continue
                kept = {name: handle.get_tensor(name) for name in names if name not in replaced}
            save_file(kept, str(copy / shard.name), metadata={"format": "pt"})
        if written:
            save_file(written, str(copy / FIX_FILE), metadata={"format": "pt", "writer": "rca"})
        index = copy / "model.safetensors.index.json"
        if index.exists():  # the engines load only the shards the index names
            data = json.loads(index.read_text(encoding="utf-8"))
            data["weight_map"] = {
                **{name: file for name, file in data.get("weight_map", {}).items() if name not in replaced},
                **dict.fromkeys(written, FIX_FILE),
            }
            index.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")

    def __exit__(self, *exc: object) -> None:
        if self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)


def _own_copy(source: Path, target: Path) -> None:
    """`source` copied to `target`, sharing no storage a write could reach the user's file through:
    cloned (copy-on-write, instant) where the file system can, else copied byte for byte."""
    with source.open("rb") as reading, target.open("xb") as writing:
        try:
            import fcntl

            fcntl.ioctl(writing.fileno(), _FICLONE, reading.fileno())
        except (ImportError, OSError):  # not Linux, another file system than the draft's, or none that clones
            shutil.copyfileobj(reading, writing, 1 << 20)


def naming(directory: Path) -> re.Pattern[str]:
    """How a launch command may name the directory (resolved, absolute or as given, with or
    without a trailing slash), as a whole path, not as part of another name."""
    names = {str(directory.resolve()), str(directory.absolute()), str(directory)}
    spelled = sorted({name.rstrip("/") for name in names if name.rstrip("/")}, key=len, reverse=True)
    return re.compile(r"(?<![\w./-])(?:" + "|".join(map(re.escape, spelled)) + r")(?![\w.-])")


def _mentions(command: Sequence[str], directory: Path) -> bool:
    pattern = naming(directory)
    return any(pattern.search(argument) for argument in command)


def _pointed_at(command: Sequence[str], directory: Path, copy: Path) -> list[str]:
    """The launch command with each mention of the draft directory replaced by the copy."""
    pattern = naming(directory)
    return [pattern.sub(lambda _: str(copy), argument) for argument in command]


def with_engine_check(
    diagnosis: Diagnosis, draft: Path | None, serve: ServeWith, progress: Progress | None = None
) -> Diagnosis:
    """The diagnosis with what the engine measured: as served, and with the fix of a diagnosed mismatch."""
    top = diagnosis.hypotheses[0] if diagnosis.verdict.status is Status.MISMATCH and diagnosis.hypotheses else None
    check = check_in_engine(top, draft, serve, progress)
    verdict = dataclasses.replace(diagnosis.verdict, summary=f"{diagnosis.verdict.summary}; {check.summary}")
    return dataclasses.replace(diagnosis, verdict=verdict, engine=check.to_json())
