"""Shared fixtures: small source trees, configs written to disk, and pinned releases."""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import difflib
import gc
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from rca.cases import resultcache
from rca.diagnose import Inputs, Run, diagnose
from rca.inputs.sources import cache_dir, fetch_release, release_dir
from rca.sdk.testing import write_json, write_safetensors, write_tree  # noqa: F401 (the tests import them from here)
from tests.releases import FOUNDING_SERVING, FOUNDING_TRAINING, PINNED

ROOT = Path(__file__).resolve().parent.parent
TREES = Path(__file__).parent / "trees"
CASES = ROOT / "cases"
# Three tiny models (a target, a draft and the parent it was fine-tuned from) as huggingface_hub's
# cache keeps a download: each file of a snapshot a relative link into the repository's blobs.
HUB = Path(__file__).parent / "fixtures" / "hf-cache"

LLAMA_8B = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 32, "hidden_size": 4096}


def hub_snapshot(hub: Path, name: str) -> Path:
    """The one snapshot of the model `name` in a hub cache shaped like HUB."""
    (snapshot,) = (hub / f"models--lab--{name}" / "snapshots").iterdir()
    return snapshot


def make_patch(relpath: str, before: str, after: str) -> str:
    """A unified diff, as `git diff` would write it, turning `before` into `after`."""
    lines = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), f"a/{relpath}", f"b/{relpath}"
    )
    return "".join(lines)


def edit(text: str, *replacements: tuple[str, str]) -> str:
    """Apply exact replacements, failing loudly when the real file no longer has the text."""
    for old, new in replacements:
        assert text.count(old) == 1, f"expected exactly one occurrence of {old!r}"
        text = text.replace(old, new)
    return text


def eagle_configs(
    root: Path,
    ids: list[int] | None,
    where: str = "nested",
    *,
    architecture: str | None = None,
    use_aux_hidden_state: bool | None = None,
) -> tuple[Path, Path]:
    """The configs of a Kimi-K2.5-shaped target (61 layers under text_config) and of an EAGLE-3 draft
    declaring `ids` nested under `eagle_config` or at the top level (`where="top"`), written as
    root/draft/config.json and root/target/config.json; returns (draft, target). `architecture`
    renames the target (the SGLang-shaped test tree's `KimiLikeForConditionalGeneration`)."""
    target = json.loads((CASES / "kimi-k25-consistent" / "target" / "config.json").read_text())
    if architecture is not None:
        target["architectures"] = [architecture]
    draft: dict[str, Any] = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "hidden_size": 7168,
        "target_hidden_size": 7168,
        "rope_theta": target["text_config"]["rope_theta"],  # as trainers export it: the target's RoPE
    }
    if ids is not None and where == "nested":
        draft["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": ids}
        if use_aux_hidden_state is not None:
            draft["eagle_config"]["use_aux_hidden_state"] = use_aux_hidden_state
    elif ids is not None:
        draft["eagle_aux_hidden_state_layer_ids"] = ids
    return write_json(root / "draft" / "config.json", draft), write_json(root / "target" / "config.json", target)


def sglang_like_configs(root: Path, ids: list[int] | None, where: str = "nested") -> tuple[Path, Path]:
    """eagle_configs for the SGLang-shaped test tree, whose Kimi-like target is KimiLikeForConditionalGeneration."""
    return eagle_configs(root, ids, where, architecture="KimiLikeForConditionalGeneration")


def pytest_configure(config: pytest.Config) -> None:
    """The analysis cache of this test session: a directory of its own (never the user's), shared by
    the session's tests (entries are keyed by content and by rca's code, so sharing is safe, and
    the tests that read the same trees parse them once), removed when the session ends;
    RCA_ANALYSIS_CACHE=off runs them without one. Tests of the cache itself point
    RCA_ANALYSIS_CACHE elsewhere. The `rca` processes the tests start run in their own processes
    and leave no server behind (RCA_SERVER=off), except in the server's own tests. pytest-xdist
    sends files in the order pytest_collection_modifyitems gives them, not its own."""
    global _SESSION_ANALYSIS
    os.environ["RCA_SERVER"] = "off"
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
    if os.environ.get("RCA_ANALYSIS_CACHE", "").lower() == "off":  # asked for: every run derives everything
        return
    _SESSION_ANALYSIS = tempfile.mkdtemp(prefix="rca-test-analysis-")
    os.environ["RCA_ANALYSIS_CACHE"] = _SESSION_ANALYSIS


def pytest_unconfigure(config: pytest.Config) -> None:
    if _SESSION_ANALYSIS is not None:
        shutil.rmtree(_SESSION_ANALYSIS, ignore_errors=True)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A pytest-xdist worker is ended by execnet interrupting its main thread (a KeyboardInterrupt):
    landing in hypothesis' garbage-collection timer, it printed a warning into a green run. The
    timer serves hypothesis' health checks only, which are over once the session is."""
    if hasattr(session.config, "workerinput"):
        gc.callbacks[:] = [callback for callback in gc.callbacks if "hypothesis" not in callback.__module__]


_SESSION_ANALYSIS: str | None = None


@pytest.fixture(autouse=True)
def fresh_result_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test starts with no remembered diagnoses (releases stay in the shared cache)."""
    directory = tmp_path_factory.mktemp("rca-cache")
    monkeypatch.setattr(resultcache, "cache_dir", lambda: directory)
    return directory


def run(**inputs: Any) -> Run:
    return diagnose(Inputs(**{key: str(value) for key, value in inputs.items() if value is not None}))


@pytest.fixture
def sglang_like(tmp_path: Path) -> Path:
    """A writable copy of the SGLang-shaped tree (tests patch and break it)."""
    return Path(shutil.copytree(TREES / "sglang_like", tmp_path / "sglang_like"))


@pytest.fixture
def speculators_like() -> Path:
    return TREES / "speculators_like"


@pytest.fixture(scope="session")
def sglang_0_5_12() -> Path:
    return fetch_release(*FOUNDING_SERVING)


@pytest.fixture(scope="session")
def speculators_0_4_0() -> Path:
    return fetch_release(*FOUNDING_TRAINING)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In one process, the engine lab's tests last: its engine's venv, made once, installs meanwhile.
    Under pytest-xdist, the engine lab's file first, then the others by their number of tests: a
    file runs on one worker, and the engine tests (a few minutes, a few tests) sent last, as
    xdist's own order by number of tests sends them, kept one worker busy alone for minutes after
    the other had finished. Their worker waits for an install still running (see .ci/run)."""
    engine = {item.path for item in items if item.get_closest_marker("engine") is not None}
    if not hasattr(config, "workerinput"):
        items.sort(key=lambda item: item.path in engine)
        return
    tests = collections.Counter(item.path for item in items)
    items.sort(key=lambda item: (item.path not in engine, -tests[item.path], str(item.path)))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Say what the selected tests will download before they start, and show each download; start
    the lab engine's install when its tests are selected (without pytest-xdist)."""
    if any(item.get_closest_marker("release") for item in session.items):
        _announce_downloads(session.config)
    if any(item.get_closest_marker("engine") for item in session.items):
        _install_engine_meanwhile(session.config)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    """Under pytest-xdist, once a worker has collected: the lab engine's install starts, in a
    process of its own, when the engine tests are among those to run."""
    engine_files = {path.name for path in Path(__file__).parent.glob("test_*.py") if "mark.engine" in path.read_text()}
    if any(Path(test_id.split("::")[0]).name in engine_files for test_id in ids):
        _install_engine_meanwhile(node.config)


def _install_engine_meanwhile(config: pytest.Config) -> None:
    """The lab engine's venv (about four minutes and 3.4 GB, once) installed while the other tests
    run, said on the terminal with where its log is; the engine tests run last and wait for it."""
    from tests.enginelab import ENGINE, engine_venv_path

    if "not engine" in (config.option.markexpr or "") or getattr(config, "_rca_engine_install", None):
        return
    venv = engine_venv_path()
    if (venv / ".complete").is_file():
        return
    log = cache_dir() / "engines" / "install.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as output:
        config._rca_engine_install = subprocess.Popen(  # type: ignore[attr-defined]
            [sys.executable, "-m", "tests.enginelab"], cwd=ROOT, stdout=output, stderr=subprocess.STDOUT
        )
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(
            f"rca tests: installing the lab engine {ENGINE[0]}=={ENGINE[1]} into {venv} (once: about four minutes, "
            f"3.4 GB) while the other tests run; the engine tests run last and wait for it. Its log: {log}"
        )


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """Under pytest-xdist (`-n`), the process that hands tests to the workers collects none: it
    fetches the missing releases itself, four at a time and shown as they come, before the workers
    start (they would otherwise each fetch in silence), unless release tests are deselected."""
    config = session.config
    if hasattr(config, "workerinput") or not config.pluginmanager.has_plugin("dsession"):
        return
    if "not release" in (config.option.markexpr or ""):
        return
    missing = _announce_downloads(config)
    if missing:
        with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(lambda release: fetch_release(*release), missing))


def _announce_downloads(config: pytest.Config) -> list[tuple[str, str]]:
    """The pinned releases not in the cache yet; a line saying so, and each download's progress on
    the terminal as it happens."""
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    missing = [(name, version) for name, version in PINNED if not (release_dir(name, version) / ".complete").is_file()]
    if reporter is None or not missing:
        return missing
    reporter.write_line(
        f"rca tests: {len(missing)} of the {len(PINNED)} framework releases the release tests read "
        f"(tests/releases.py) are not in {cache_dir()} yet: each is downloaded once with pip download "
        "--no-deps, and only its Python files are kept. "
        "`python -m pytest -q -m 'not release and not engine and not browser'` runs the offline tests only (no "
        "download, no engine install)."
    )
    handler = _ReporterHandler(reporter, config.pluginmanager.get_plugin("capturemanager"), len(missing))
    logger = logging.getLogger("rca.inputs.sources")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # pytest's log capture would hold the lines until a test fails
    return missing


class _ReporterHandler(logging.Handler):
    """Each download's progress on the terminal as it happens, past the tests' output capture."""

    def __init__(self, reporter, capture, missing: int) -> None:
        super().__init__()
        self.reporter, self.capture, self.missing, self.started = reporter, capture, missing, 0

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        # The first line of each release fetched is counted; the others name their release, as
        # several releases are fetched at a time.
        first = message.startswith("fetching ")
        self.started += first
        shown = f"[{self.started}/{self.missing}] {message}" if first else message
        with self.capture.global_and_fixture_disabled() if self.capture is not None else contextlib.nullcontext():
            self.reporter.write_line(f"rca tests: {shown}")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-snapshots",
        action="store_true",
        help="Rewrite the rendered-report snapshots under tests/snapshots/ instead of comparing.",
    )


@pytest.fixture
def snapshot(request: pytest.FixtureRequest):
    """Compare rendered text with tests/snapshots/NAME, or rewrite it with --update-snapshots."""
    update = request.config.getoption("--update-snapshots")

    def check(name: str, text: str) -> None:
        path = Path(__file__).parent / "snapshots" / name
        if not path.exists() and not update and os.environ.get("CI") == "true":
            pytest.fail(
                f"snapshots/{name} is missing: write it with python -m pytest {request.node.nodeid.split('::')[0]} "
                "--update-snapshots, review it and commit it",
                pytrace=False,
            )
        if update or not path.exists():
            path.parent.mkdir(exist_ok=True)
            path.write_text(text, encoding="utf-8")
            return
        expected = path.read_text(encoding="utf-8")
        if text != expected:
            diff = "".join(
                difflib.unified_diff(expected.splitlines(True), text.splitlines(True), f"snapshots/{name}", "rendered")
            )
            pytest.fail(
                f"{name} differs from its snapshot; if the change is intended, accept it with:\n"
                f"  python -m pytest {request.node.nodeid.split('::')[0]} --update-snapshots\n\n{diff}",
                pytrace=False,
            )

    return check
