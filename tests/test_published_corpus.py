"""Published drafts, as their users serve them: every draft config of `tests/published/corpus.toml`
(published on the Hugging Face Hub or in its trainer's repository, with the URL) on the engine
releases its publisher or the engine's docs serve it with, through the launch line they show.
Most serve well: they must come out consistent, with the assumptions listed; the others must name
the cause that the release's code shows (the corpus says why, citing that code)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rca.diagnose import Inputs, diagnose

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

pytestmark = pytest.mark.release

CORPUS = Path(__file__).parent / "published"
DRAFTS = tomllib.loads((CORPUS / "corpus.toml").read_text(encoding="utf-8"))
RUNS = [
    pytest.param(
        draft, serve, id=f"{draft['name']}-{serve['engine']}{'-capped' if '--max-model-len' in serve['launch'] else ''}"
    )
    for draft in DRAFTS["draft"]
    for serve in draft["serve"]
]


def test_the_corpus_spans_publishers_families_and_engines() -> None:
    """At least 25 drafts from 8 publishers, for 6 families of targets, served on vLLM and SGLang."""
    drafts = DRAFTS["draft"]
    assert len(drafts) >= 25
    assert len({draft["publisher"].split(" ")[0] for draft in drafts}) >= 8
    families = {draft["target"].split("--")[1].split("-")[0].rstrip("0123456789.").lower() for draft in drafts}
    assert len(families) >= 6, families
    assert {serve["engine"].split("==")[0] for draft in drafts for serve in draft["serve"]} == {"vllm", "sglang"}
    for draft in drafts:
        assert draft["source"].startswith("https://") and draft["target"] in DRAFTS["targets"]
        assert all(serve["why"] for serve in draft["serve"])


def _as_launched(draft: dict, serve: dict) -> Inputs:
    """A corpus draft served as its launch line says."""
    return Inputs(
        serving=serve["engine"],
        serving_args=serve["launch"],
        draft=str(CORPUS / "drafts" / f"{draft['name']}.json"),
        target=str(CORPUS / "targets" / f"{draft['target']}.json"),
    )


@pytest.mark.parametrize(("draft", "serve"), RUNS)
def test_a_published_draft_gets_its_expected_verdict(draft: dict, serve: dict) -> None:
    inputs = _as_launched(draft, serve)
    diagnosis = diagnose(inputs, parallel=False).diagnosis
    verdict = diagnosis.verdict
    said = f"{verdict.summary}\n{serve['why']}"
    assert verdict.status.value == serve["status"], said
    assert sorted(verdict.causes) == sorted(serve["causes"]), said
    assert sorted(verdict.warnings) == sorted(serve["warnings"]), said
    if serve["status"] == "consistent":  # what the verdict rested on is said
        assert any(item.startswith("the trainer") for item in verdict.assumptions), verdict.assumptions


@pytest.mark.parametrize("anchor", ["num_nextn_predict_layers", "get_pp_group"])
def test_an_anchor_that_allows_more_of_the_engine_keeps_a_consistent_verdict(
    monkeypatch: pytest.MonkeyPatch, anchor: str
) -> None:
    """The files an analyzer's anchors hit are allowed to every evaluation of its side. An anchor on
    `num_nextn_predict_layers` allows vLLM 0.33's models/utils.py, so its `make_layers` (the layers
    split by pipeline stage, with a stage count the analysis does not know) is followed instead of
    left unknown; one on `get_pp_group` allows distributed/parallel_state.py, whose `get_pp_group()`
    asserts a group set at runtime (`_PP`, None at import). Qwen3's default taps must still be read,
    not lost."""
    from rca.static.analyzer import Registry

    anchors = Registry.anchors
    monkeypatch.setattr(Registry, "anchors", lambda self, side: anchors(self, side) | {anchor})
    monkeypatch.setenv("RCA_ANALYSIS_CACHE", "off")
    draft = next(draft for draft in DRAFTS["draft"] if draft["name"] == "specforge-qwen3-8b")
    serve = next(serve for serve in draft["serve"] if serve["engine"] == "vllm==0.33.0")
    inputs = _as_launched(draft, serve)
    diagnosis = diagnose(inputs, parallel=False).diagnosis
    assert diagnosis.verdict.status.value == "consistent", diagnosis.verdict.summary
    assert [str(slot) for slot in diagnosis.wirings["serving"].slots] == ["h2", "h18", "h33"]
