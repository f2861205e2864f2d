"""The caches under hostile conditions: what sits in them, or where a setting points them, never
hangs rca, is never believed unless rca wrote it, and is never deleted or overwritten unless rca
wrote it.

Each test points the analysis cache and the remembered diagnoses at directories of its own.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rca import signed
from rca.cases import resultcache
from rca.cli import app
from rca.model import Diagnosis, Status, Verdict
from rca.signed import TAG_NAME
from rca.static import filecache

runner = CliRunner()
NAME = "ab" * 32


@pytest.fixture
def caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RCA_ANALYSIS_CACHE", str(tmp_path / "analysis"))
    monkeypatch.setenv("RCA_CACHE_DIR", str(tmp_path / "rca"))
    monkeypatch.setattr(resultcache, "cache_dir", lambda: tmp_path / "rca")
    monkeypatch.setattr(signed, "_OPENED", {})
    return tmp_path


@pytest.fixture(autouse=True)
def _never_hang() -> Iterator[None]:
    """A read that blocks (a FIFO opened for reading) fails the test instead of hanging it."""

    def hung(signum: int, frame: object) -> None:
        raise TimeoutError("a cache read blocked")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(20)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _diagnosis() -> Diagnosis:
    return Diagnosis(wirings={}, hypotheses=(), verdict=Verdict(Status.CONSISTENT, None, "as trained"))


def _entry(caches: Path, name: str = NAME) -> Path:
    return caches / "analysis" / "entries" / name


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory", "too-large"])
def test_an_entry_that_is_not_a_plain_file_of_bounded_size_is_passed_by(
    caches: Path, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert filecache.store_json(NAME, {"value": 1}) and filecache.load_json(NAME) == {"value": 1}
    entry = _entry(caches)
    entry.unlink()
    if kind == "fifo":
        os.mkfifo(entry)
    elif kind == "dev-zero":
        entry.symlink_to("/dev/zero")
    elif kind == "directory":
        entry.mkdir()
    else:
        monkeypatch.setattr(filecache._store(caches / "analysis"), "max_entry_bytes", 8)
        assert filecache.store_json(NAME, {"value": 1}) is False
        entry.write_bytes(b"x" * 100)
    assert filecache.load_json(NAME) is None


def test_a_fifo_or_a_link_among_the_remembered_diagnoses_is_passed_by(caches: Path) -> None:
    resultcache.store(NAME, _diagnosis())
    assert resultcache.load(NAME) == _diagnosis()
    entry = caches / "rca" / "results" / "entries" / NAME
    entry.unlink()
    os.mkfifo(entry)
    assert resultcache.load(NAME) is None
    entry.unlink()
    entry.symlink_to("/dev/zero")
    assert resultcache.load(NAME) is None


def test_an_edited_or_forged_remembered_diagnosis_is_not_believed(caches: Path) -> None:
    resultcache.store(NAME, _diagnosis())
    entry = caches / "rca" / "results" / "entries" / NAME
    entry.write_bytes(entry.read_bytes().replace(b"consistent", b"mismatch"))
    assert resultcache.load(NAME) is None
    forged = json.dumps({"schema": resultcache.SCHEMA, "diagnosis": resultcache._encode(_diagnosis())})
    entry.write_bytes(b"RCAR1\n" + b"\0" * 32 + forged.encode())  # the format, without the secret
    assert resultcache.load(NAME) is None


def test_a_cache_of_another_user_is_refused_and_its_entries_never_read(
    caches: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert filecache.store_json(NAME, {"value": "forged"})
    signed.forget()  # a new process
    me = os.geteuid()
    monkeypatch.setattr(os, "geteuid", lambda: me + 1)  # every file there is now someone else's
    assert filecache.load_json(NAME) is None
    assert filecache.store_json(NAME, {"value": 2}) is False
    said = capsys.readouterr().err
    assert said.count("\n") == 1 and "the analysis cache at" in said and "belongs to another user" in said
    assert "fix: point RCA_ANALYSIS_CACHE at a new directory" in said


def test_a_directory_of_the_users_own_is_neither_used_nor_written_nor_cleared(
    caches: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RCA_ANALYSIS_CACHE set by mistake to a directory of the user's: their `secret` is not
    overwritten, their files are not deleted by `rca cache clear`, their directory's mode stays."""
    mine = caches / "mine"
    (mine / "entries").mkdir(parents=True)
    (mine / "secret").write_text("my password\n")
    (mine / "notes.txt").write_text("keep me\n")
    (mine / "entries" / NAME).write_text("a file of mine with a digest for a name\n")
    mine.chmod(0o775)
    before = {path: path.read_bytes() for path in mine.rglob("*") if path.is_file()}
    monkeypatch.setenv("RCA_ANALYSIS_CACHE", str(mine))
    assert filecache.store_json(filecache.key("example", "a"), {"value": 1}) is False
    signed.forget()  # a new process: said again, once
    cleared = runner.invoke(app, ["cache", "clear"])
    assert cleared.exit_code == 0 and "cleared 0 analysis entries" in cleared.stdout
    assert "holds files rca did not make (notes.txt, secret)" in cleared.stderr
    assert {path: path.read_bytes() for path in mine.rglob("*") if path.is_file()} == before
    assert (mine.stat().st_mode & 0o777) == 0o775 and not (mine / TAG_NAME).exists()


def test_a_file_named_secret_alone_is_not_taken_for_a_cache_key(caches: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mine = caches / "mine"
    mine.mkdir()
    (mine / "secret").write_text("hunter2\n")
    monkeypatch.setenv("RCA_ANALYSIS_CACHE", str(mine))
    assert filecache.store_json(filecache.key("example", "a"), {"value": 1}) is False
    assert (mine / "secret").read_text() == "hunter2\n"


def test_an_empty_directory_becomes_rcas_and_is_closed_to_others(caches: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    given = caches / "given"
    given.mkdir(mode=0o777)
    given.chmod(0o777)
    monkeypatch.setenv("RCA_ANALYSIS_CACHE", str(given))
    name = filecache.key("example", "a")
    assert filecache.store_json(name, {"value": 1}) and filecache.load_json(name) == {"value": 1}
    assert (given / TAG_NAME).read_bytes().startswith(b"Signature: 8a477f597d28d172789f06886806bc55")
    assert given.stat().st_mode & 0o022 == 0 and (given / "entries").stat().st_mode & 0o077 == 0
    assert (given / "secret").stat().st_mode & 0o077 == 0


def test_clearing_deletes_only_entries_rca_wrote_never_through_a_link(caches: Path) -> None:
    assert filecache.store_json(NAME, {"value": 1})
    entries = caches / "analysis" / "entries"
    (entries / ("cd" * 32)).write_text("not an entry of rca's, though named like one\n")
    (entries / "README").write_text("not rca's\n")
    outside = caches / "outside"
    outside.mkdir()
    (outside / ("ef" * 32)).write_bytes(b"RCAA1\n" + b"\0" * 40)
    (entries / ("ef" * 32)).symlink_to(outside / ("ef" * 32))
    assert filecache.clear() == 1
    assert sorted(path.name for path in entries.iterdir()) == sorted(["cd" * 32, "README", "ef" * 32])
    assert (outside / ("ef" * 32)).exists()


def test_an_entries_directory_that_is_a_link_is_refused(caches: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Eviction through a symlinked directory deleted what it pointed at."""
    resultcache.store(NAME, _diagnosis())
    results = caches / "rca" / "results"
    elsewhere = caches / "elsewhere"
    (results / "entries").rename(elsewhere)
    (results / "entries").symlink_to(elsewhere)
    signed.forget()
    assert resultcache.load(NAME) is None and resultcache.clear() == 0
    assert (elsewhere / NAME).exists()
    assert "its entries directory is not a directory" in capsys.readouterr().err


def test_eviction_keeps_the_users_files(caches: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RCA_ANALYSIS_CACHE_MB", "1")
    entries = caches / "analysis" / "entries"
    assert filecache.store_json(NAME, {"value": 1})
    stranger = entries / ("cd" * 32)
    stranger.write_bytes(b"y" * (2 << 20))  # over the limit, named like an entry, not rca's
    for index in range(6):
        filecache.store_json(filecache.key("example", str(index)), {"value": "x" * 300_000})
    filecache.evict()
    assert stranger.exists()
    assert sum(1 for _ in entries.iterdir()) < 8


def test_an_older_rcas_cache_is_taken_on(caches: Path) -> None:
    """A cache an older rca made (its secret and entries, no tag) is still rca's, not a stranger's."""
    older = caches / "analysis"
    (older / "entries").mkdir(parents=True)
    (older / "secret").write_bytes(os.urandom(32))
    (older / "secret").chmod(0o600)
    (older / ".evict.lock").write_text("")
    assert filecache.store_json(NAME, {"value": 1}) and filecache.load_json(NAME) == {"value": 1}
    legacy = caches / "rca" / "results"
    legacy.mkdir(parents=True)
    (legacy / f"{NAME}.json").write_text('{"schema": "rca.cache/1", "diagnosis": {}}')
    resultcache.store("cd" * 32, _diagnosis())
    assert resultcache.load("cd" * 32) == _diagnosis()
    assert resultcache.clear() == 2 and not (legacy / f"{NAME}.json").exists()
