"""The analysis cache: what rca derives from a source file, kept across runs, changes no answer.

Each test points RCA_ANALYSIS_CACHE at a directory of its own and forgets the parses kept in
memory between runs, so that a run reads what the previous one wrote (as a new process would).
The bad-input suite (tests/test_bad_inputs.py) spoils its entries.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rca import fingerprint
from rca.cli import app
from rca.static import filecache, parsing
from tests.conftest import edit, sglang_like_configs, write_tree
from tests.test_cli import EMBED_EDITS, MODEL, embed_patch, inputs

runner = CliRunner()


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache of the test's own, with nothing parsed, searched or owed by the worker's earlier tests."""
    from rca.inputs import sources

    directory = tmp_path / "analysis"
    monkeypatch.setenv("RCA_ANALYSIS_CACHE", str(directory))
    monkeypatch.setattr(parsing, "_PARSED", parsing.OrderedDict())
    monkeypatch.setattr(sources, "_ASKED", {})
    monkeypatch.setattr(sources, "_PENDING", {})
    monkeypatch.setattr(filecache, "_owed", False)
    return directory


def _diagnose(args: list[str], results: Path, cached: bool = True) -> tuple[int, dict]:
    """A run as a new process would make it: nothing remembered in memory, no remembered diagnosis."""
    parsing._PARSED.clear()
    shutil.rmtree(results / "results", ignore_errors=True)
    result = runner.invoke(app, ["diagnose", "--format", "json", *([] if cached else ["--no-cache"]), *args])
    assert result.exit_code in (0, 1, 3), result.output
    return result.exit_code, json.loads(result.stdout)


def test_a_new_draft_config_and_a_patch_on_a_tree_seen_before_give_the_answers_of_a_fresh_analysis(
    cache: Path, tmp_path: Path, sglang_like: Path, speculators_like: Path, fresh_result_cache: Path
) -> None:
    """The iteration a user makes: a first run, then another draft config, then a patch, each on the
    tree the cache knows; every answer is the one an uncached run gives, and the later runs read
    entries the first one wrote."""
    draft, target = sglang_like_configs(tmp_path / "a", [2, 30, 58])
    first = inputs(sglang_like, speculators_like, draft, target)
    assert _diagnose(first, fresh_result_cache) == _diagnose(first, fresh_result_cache, cached=False)
    written = {entry.name: entry.stat().st_mtime_ns for entry in (cache / "entries").iterdir()}
    assert len(written) >= 3

    other_draft, _ = sglang_like_configs(tmp_path / "b", [-1, 2, 30])
    second = inputs(sglang_like, speculators_like, other_draft, target)
    loads = []
    real_load = filecache.load_tree

    def counted(name: str, records: tuple = ()):
        found = real_load(name, records)
        loads.append(found is not None)
        return found

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(filecache, "load_tree", counted)
        status, report = _diagnose(second, fresh_result_cache)
    assert loads and all(loads), "a file of the tree seen before was parsed again"
    assert (status, report) == _diagnose(second, fresh_result_cache, cached=False)

    patched = inputs(sglang_like, speculators_like, other_draft, target, embed_patch(tmp_path, sglang_like))
    status, report = _diagnose(patched, fresh_result_cache)
    assert status == 1 and report["verdict"]["root_cause"] == "embed-slot-added"
    assert (status, report) == _diagnose(patched, fresh_result_cache, cached=False)


def test_an_edited_file_is_analyzed_as_it_is_now(
    cache: Path, tmp_path: Path, sglang_like: Path, speculators_like: Path, fresh_result_cache: Path
) -> None:
    """A local tree edited between runs (the same edit a patch makes, written into the file): its
    text searches and parses are those of the new text, never the remembered ones."""
    draft, target = sglang_like_configs(tmp_path, [-1, 2, 30])
    args = inputs(sglang_like, speculators_like, draft, target)
    before = _diagnose(args, fresh_result_cache)
    model = sglang_like / MODEL
    model.write_text(edit(model.read_text(), *EMBED_EDITS))
    status, report = _diagnose(args, fresh_result_cache)
    assert status == 1 and report["verdict"]["root_cause"] == "embed-slot-added"
    assert (status, report) != before and (status, report) == _diagnose(args, fresh_result_cache, cached=False)


def test_entries_are_keyed_by_rcas_own_code(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An entry written by another version of rca (its code changed) is never read."""
    name = filecache.key("parse", "0" * 40)
    assert filecache.store_json(name, {"value": 1}) and filecache.load_json(name) == {"value": 1}
    monkeypatch.setattr(fingerprint, "_CODE", "another rca")
    assert filecache.key("parse", "0" * 40) != name


def test_derived_keeps_a_per_file_derivation(cache: Path) -> None:
    calls = []

    def compute() -> list[int]:
        calls.append(1)
        return [1, 2, 3]

    assert filecache.derived("example", "digest", compute) == [1, 2, 3]
    assert filecache.derived("example", "digest", compute) == [1, 2, 3]
    assert len(calls) == 1
    with filecache.turned_off():
        assert filecache.derived("example", "digest", compute) == [1, 2, 3]
    assert len(calls) == 2


def test_a_server_copy_writes_what_it_derived_once_it_has_answered(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server's copy of itself outlives its answer: `flush` (at the end of a diagnosis) leaves the
    entries for `flush_owed`, which the copy calls once the client has its exit status."""
    from rca.inputs import sources

    monkeypatch.setattr(filecache, "after_answer", True)
    sources._asked("serving", ["aux_hidden_states"])  # a run's text searches, kept for the next run
    assert filecache.flush() == 0
    assert filecache.load_json(sources.needles_entry("serving")) is None
    assert filecache.flush_owed() == 1 and not filecache.after_answer
    assert filecache.load_json(sources.needles_entry("serving")) == ["aux_hidden_states"]
    assert filecache.flush_owed() == 0  # owed once

    monkeypatch.setattr(filecache, "after_answer", True)  # a command of many diagnoses (`rca history`)
    sources._asked("training", ["self.fc"])
    assert filecache.flush() == 0  # the first diagnosis's: owed
    sources._asked("serving", ["self.fc"])
    assert filecache.flush() == 2  # the second's: written as it goes, the first's with it
    assert filecache.load_json(sources.needles_entry("serving")) == ["self.fc"]
    assert filecache.load_json(sources.needles_entry("training")) == ["self.fc"]


def test_the_cache_stays_under_its_limit(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past its limit, the least recently used entries are deleted first."""
    monkeypatch.setenv("RCA_ANALYSIS_CACHE_MB", "1")
    names = [filecache.key("example", str(number)) for number in range(6)]
    for age, name in enumerate(names):
        assert filecache.store_json(name, {"value": "x" * 300_000})
        os.utime(cache / "entries" / name, (1_000_000 + age, 1_000_000 + age))
    assert filecache.load_json(names[0]) is not None  # used now: kept
    filecache.evict()
    kept = {entry.name for entry in (cache / "entries").iterdir()}
    assert names[0] in kept and names[1] not in kept and names[-1] in kept
    assert filecache.summary()["bytes"] <= 1024 * 1024


def test_a_cache_that_cannot_be_written_only_costs_speed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sglang_like: Path, speculators_like: Path, fresh_result_cache: Path
) -> None:
    blocker = write_tree(tmp_path, {"blocked": "a file where the cache directory would be"}) / "blocked"
    monkeypatch.setenv("RCA_ANALYSIS_CACHE", str(blocker / "analysis"))
    draft, target = sglang_like_configs(tmp_path, [2, 30, 58])
    assert _diagnose(inputs(sglang_like, speculators_like, draft, target), fresh_result_cache)[0] == 0


def test_rca_cache_shows_and_clears(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RCA_CACHE_DIR", str(tmp_path / "rca-cache"))
    assert filecache.store_json(filecache.key("example", "a"), {"value": 1})
    shown = runner.invoke(app, ["cache", "--json"])
    assert shown.exit_code == 0, shown.output
    figures = json.loads(shown.stdout)
    assert figures["analysis"]["location"] == str(cache) and figures["analysis"]["entries"] == 1
    text = runner.invoke(app, ["cache"])
    assert text.exit_code == 0 and str(cache) in text.stdout and "1 entries" in text.stdout
    cleared = runner.invoke(app, ["cache", "clear"])
    assert cleared.exit_code == 0 and "cleared 1 analysis entries" in cleared.stdout
    assert filecache.summary()["entries"] == 0
    monkeypatch.setenv("RCA_ANALYSIS_CACHE", "off")
    assert "analysis cache: off" in runner.invoke(app, ["cache"]).stdout


def test_the_command_line_writes_the_cache_after_its_answer(
    cache: Path, tmp_path: Path, sglang_like: Path, speculators_like: Path
) -> None:
    """`rca` writes the entries from a detached process once the answer is out: the command
    returns (its output pipe closed, nothing waiting on the writer), the entries appear, and the
    next run reads them and answers the same."""
    import subprocess
    import sys
    import time

    draft, target = sglang_like_configs(tmp_path, [2, 30, 58])
    command = [
        sys.executable,
        "-m",
        "rca",
        "diagnose",
        "--format",
        "json",
        *inputs(sglang_like, speculators_like, draft, target),
    ]
    environment = {**os.environ, "RCA_ANALYSIS_CACHE": str(cache), "RCA_CACHE_DIR": str(tmp_path / "rca-cache")}
    first = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=120, check=False)
    assert first.returncode == 0, first.stderr
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(list((cache / "entries").glob("*"))) < 3:
        time.sleep(0.1)
    assert len([entry for entry in (cache / "entries").iterdir() if not entry.name.startswith(".")]) >= 3
    shutil.rmtree(tmp_path / "rca-cache" / "results")
    again = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=120, check=False)
    assert (again.returncode, again.stdout) == (first.returncode, first.stdout)


def test_the_searches_a_sides_last_run_asked_for_are_made_ahead(cache: Path, sglang_like: Path) -> None:
    """A process with its imports still to do starts the text searches the side's last run asked
    for in a forked process; the tree's searches then find their answers in the cache, the same
    answers a search of its own gives."""
    from rca.inputs import sources

    asked = ["aux_hidden_states", "set_eagle3_layers_to_capture", "a needle in no file"]
    assert filecache.store_json(sources.needles_entry("serving"), asked)
    sources.search_ahead((("serving", str(sglang_like)), ("training", None)), None)
    assert set(sources._AHEAD) == {"serving"}
    sources._searched_ahead("serving")

    spec = sources.SourceSpec.parse(str(sglang_like), "--serving", None)
    tree = sources.materialize(spec, "serving")
    remembered = tree._remembered_grep()
    assert remembered is not None and set(remembered["hits"]) == set(asked)
    with filecache.turned_off():
        searched = sources.materialize(spec, "serving").grep(asked)
    assert tree.grep(asked) == searched and searched["aux_hidden_states"] and not searched["a needle in no file"]


def test_nothing_is_searched_ahead_on_a_release_still_to_download(cache: Path) -> None:
    """A release not downloaded yet is fetched by the run itself, with its progress shown."""
    from rca.inputs import sources

    assert filecache.store_json(sources.needles_entry("serving"), ["aux_hidden_states"])
    sources.search_ahead((("serving", "sglang==0.0.1"), ("training", "not a spec at all ==")), None)
    assert not sources._AHEAD


def test_a_diagnose_command_line_searches_ahead_before_it_is_parsed(
    cache: Path, tmp_path: Path, sglang_like: Path, speculators_like: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trees a cold `rca diagnose` names (with `--serving`, `--training` or its case, whose
    paths are the case's) are searched ahead before typer parses the command line; an option
    given beside the case wins, as it does for the command, and `--no-cache` searches nothing."""
    from rca.cli import diagnose
    from rca.inputs import sources

    started: list[tuple[str, str | None, Path | None]] = []
    monkeypatch.setattr(
        diagnose, "search_ahead", lambda sides, base: started.extend((side, spec, base) for side, spec in sides)
    )
    case = tmp_path / "case"
    case.mkdir()
    (case / "case.toml").write_text(f'[inputs]\nserving = "{sglang_like}"\ntraining = "trainer"\n')

    diagnose.search_ahead_of(["--case", str(case), "--quiet"])
    assert started == [("serving", str(sglang_like), case), ("training", "trainer", case)]

    started.clear()
    diagnose.search_ahead_of([f"--case={case}", "--training", str(speculators_like)])
    assert started == [("serving", str(sglang_like), case), ("training", str(speculators_like), None)]

    started.clear()
    diagnose.search_ahead_of(["--serving", "sglang==0.5.12", "--no-cache"])
    assert started == []
    assert not sources._AHEAD
