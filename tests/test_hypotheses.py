"""Ranking: one edit that explains several differences beats several edits."""

from __future__ import annotations

from pathlib import Path

import pytest
from rca.knowledge import CatalogError, catalog, load_catalog

from rca.errors import ExitCode
from rca.explain.fixes import Fix
from rca.explain.hypotheses import GENERATORS, Situation, differences, generation, rank
from rca.explain.verdict import verdict_of
from rca.model import Confidence, Evidence, Location, Severity, Step, Tap, Wiring
from rca.static.facts import Finding
from tests.conftest import CASES


def wiring(side: str, *taps: str, fc: int | None = None, ids=None, last: str | None = None) -> Wiring:
    steps = tuple(
        Step(Location(side, "x.py", 10 + i, 10 + i), f"appended: {tap}", kind="append") for i, tap in enumerate(taps)
    )
    return Wiring(side, tuple(Tap.parse(t) for t in taps), Tap.parse(last) if last else None, steps, fc, ids)


def ranked(training: Wiring, serving: Wiring, findings=(), propose=lambda slots: None):
    return rank(Situation(training, serving, list(findings), propose))


def test_embedding_slot_outranks_a_missing_layer() -> None:
    hypotheses = ranked(
        wiring("training", "h3", "h31", "h59", last="h61"), wiring("serving", "h0", "h3", "h31", fc=3, ids=(-1, 2, 30))
    )
    order = [h.id for h in hypotheses]
    assert order[0] == "embed-slot-added"
    assert order.index("layer-missing") > 0 and hypotheses[order.index("layer-missing")].params == {"tap": "h59"}
    top = hypotheses[0]
    assert top.score > 0.9 and top.params["displaced"] == ["h59"]
    assert "unexplained" in hypotheses[order.index("layer-missing")].reason
    assert sum(h.score for h in hypotheses) == pytest.approx(1.0)


def test_consistent() -> None:
    hypotheses = ranked(wiring("training", "h2", "h16", "h29"), wiring("serving", "h2", "h16", "h29", fc=3))
    assert [h.id for h in hypotheses] == ["wiring-consistent"] and hypotheses[0].score == pytest.approx(1.0)


def test_offset_by_one_is_one_explanation() -> None:
    hypotheses = ranked(wiring("training", "h3", "h17", "h30"), wiring("serving", "h2", "h16", "h29"))
    assert hypotheses[0].id == "layer-offset" and hypotheses[0].params == {"offset": -1}


def test_a_shift_that_pushes_the_last_id_past_the_final_layer_is_an_offset_not_a_count_mismatch() -> None:
    # ids [24, 30, 36] read as boundaries in training, shifted by one when served: h37 does not exist
    hypotheses = ranked(wiring("training", "h24", "h30", "h36", last="h36"), wiring("serving", "h25", "h31", fc=3))
    top = hypotheses[0]
    assert top.id == "layer-offset" and top.params == {"offset": 1}
    assert "[h37] would be past the target's last layer (h36)" in top.reason
    assert [h.id for h in hypotheses].index("aux-count-mismatch") > 0


def test_fewer_served_states_without_a_shift_past_the_end_are_no_offset() -> None:
    # the missing trained tap, shifted, is still inside the model: something else dropped it
    hypotheses = ranked(wiring("training", "h2", "h16", "h20", last="h32"), wiring("serving", "h3", "h17", fc=3))
    assert "layer-offset" not in [h.id for h in hypotheses]


def test_a_capture_without_the_residual_is_named_where_adding_it_back_restores_the_trained_slots() -> None:
    hypotheses = ranked(wiring("training", "h0", "h16", "h29"), wiring("serving", "h0", "h16-residual", "h29-residual"))
    top = hypotheses[0]
    assert top.id == "capture-missing-residual" and top.score > 0.9
    assert top.params == {"taps": ["h16-residual", "h29-residual"]}
    assert [step.location.line for step in top.citations] == [11, 12]  # the captures of the two updates


def test_a_capture_without_the_residual_at_other_layers_is_not_that_alone() -> None:
    hypotheses = ranked(wiring("training", "h0", "h16", "h29"), wiring("serving", "h0", "h15-residual", "h28-residual"))
    assert "capture-missing-residual" not in [h.id for h in hypotheses]


def test_slot_order() -> None:
    hypotheses = ranked(wiring("training", "h2", "h16", "h29"), wiring("serving", "h16", "h2", "h29"))
    assert differences(wiring("training", "h2", "h16"), wiring("serving", "h16", "h2")) == {"order"}
    assert hypotheses[0].id == "slot-order"


def test_ignored_config_explains_everything_when_the_fallback_is_seen() -> None:
    finding = Finding(
        "RCA-S101",
        "layer-ids-not-read",
        "serving",
        "read failed",
        Location("serving", "r.py", 3, 3),
        hypothesis="config-ignored",
        likelihood_ratio=20.0,
    )
    hypotheses = ranked(wiring("training", "h3", "h17", "h30"), wiring("serving", "h2", "h16", "h29"), [finding])
    assert hypotheses[0].id == "config-ignored"


@pytest.mark.parametrize(("enabled", "top"), [(True, "capture-before-allreduce"), (False, "wiring-consistent")])
def test_partial_sums_outrank_consistency_only_when_the_launch_turns_the_fusion_on(enabled: bool, top: str) -> None:
    finding = Finding(
        "RCA-S107",
        "capture-before-allreduce",
        "serving",
        "captures before a deferred all-reduce",
        Location("serving", "m.py", 7, 7),
        hypothesis="capture-before-allreduce",
        likelihood_ratio=20.0 if enabled else 1.0,
        taps=tuple(Tap.parse(tap) for tap in ("h3~partial", "h31~partial", "h59~partial")),
    )
    hypotheses = ranked(wiring("training", "h3", "h31", "h59"), wiring("serving", "h3", "h31", "h59", fc=3), [finding])
    assert [h.id for h in hypotheses] == [top, *({"capture-before-allreduce", "wiring-consistent"} - {top})]
    partial = next(h for h in hypotheses if h.id == "capture-before-allreduce")
    assert partial.params == {"partial_taps": ["h3~partial", "h31~partial", "h59~partial"]}
    mismatch = ranked(wiring("training", "h3", "h31", "h59"), wiring("serving", "h0", "h3", "h31", fc=3), [finding])
    assert mismatch[0].id == "embed-slot-added"  # it explains no difference of the slots


def test_count_and_width() -> None:
    diffs = differences(wiring("training", "h2", "h16", "h29", "h30"), wiring("serving", "h2", "h16", "h29", fc=4))
    assert diffs == {"-h30", "count", "width"}
    hypotheses = ranked(wiring("training", "h2", "h16", "h29", "h30"), wiring("serving", "h2", "h16", "h29", fc=4))
    assert {h.id for h in hypotheses} >= {"layer-missing", "aux-count-mismatch"}


def test_fix_is_the_verified_proposal() -> None:
    fix = Fix((2, 30, 58), "eagle_config.eagle_aux_hidden_state_layer_ids", None)
    hypotheses = ranked(
        wiring("training", "h3", "h31", "h59"), wiring("serving", "h0", "h3", "h31"), propose=lambda slots: fix
    )
    assert hypotheses[0].fix == "set eagle_config.eagle_aux_hidden_state_layer_ids to [2, 30, 58] in the draft config"


@pytest.mark.parametrize(("ratio", "raised"), [(20.0, True), (3.0, False)])
def test_a_probe_alone_raises_a_break_of_the_contract(ratio: float, raised: bool) -> None:
    """A vocab map every static check passes (in range, each id once) that the head rows show wrong:
    the probe's observation is the finding. A weaker observation only weighs on what code found."""
    from rca.model import Confidence, Evidence

    seen = Evidence(
        "the draft's lm_head rows are target rows, but not the rows d2t names",
        Confidence.OBSERVED,
        ratio,
        (Step(Location("draft", "draft/model.safetensors", 1, 1), "rows compared"),),
    )
    situation = Situation(
        wiring("training", "h2", "h16", "h29"),
        wiring("serving", "h2", "h16", "h29", fc=3),
        [],
        observed={"vocab-map-invalid": [seen]},
    )
    hypotheses = rank(situation)
    assert (hypotheses[0].id == "vocab-map-invalid") is raised, [(h.id, h.score) for h in hypotheses]
    if raised:
        assert hypotheses[0].reason == seen.summary and hypotheses[0].citations == seen.citations
        assert hypotheses[0].score > 0.8
    else:
        assert [h.id for h in hypotheses] == ["wiring-consistent"]


def test_every_catalog_entry_declares_a_generator_that_exists() -> None:
    entries = catalog()
    unknown = {entry.id: entry.generator for entry in entries.values() if entry.generator not in GENERATORS}
    assert not unknown, f"entries naming no generator of rca/explain/hypotheses.py: {unknown}"
    made = [(entry.id, generate) for entry, generate in generation(entries)]
    assert sorted(made) == sorted((entry.id, GENERATORS[entry.generator]) for entry in entries.values())
    # a break of the contract is made by the contract's generator, a wiring hypothesis by its own
    assert all((entry.generator == "contract") == entry.contract for entry in entries.values())


def test_every_wiring_generator_serves_an_entry() -> None:
    """A generator no catalog entry declares is dead code."""
    unused = sorted(set(GENERATORS) - {entry.generator for entry in catalog().values()})
    assert not unused, f"generators no entry of knowledge/hypotheses/ declares: {unused}"


ENTRY = """id = "{id}"
title = "A hypothesis"
prior = 0.05
{generator}
summary = "What it says."
why = "Why it hurts."
fix = "What to do."
"""


@pytest.mark.parametrize(
    ("generator", "refused", "names"),
    [
        (
            'generator = "no_such_generator"',
            "generator 'no_such_generator' is not one of rca's: wiring_consistent, ",
            True,
        ),
        ("", "declares no generator (the other entries declare layer_missing)", True),
        ('generator = "contract"', "generator 'contract' does not fit scope 'wiring'", False),
    ],
)
def test_an_entry_naming_no_known_generator_is_refused_with_its_file(
    tmp_path: Path, generator: str, refused: str, names: bool
) -> None:
    (tmp_path / "layer-missing.toml").write_text(
        ENTRY.format(id="layer-missing", generator='generator = "layer_missing"'), encoding="utf-8"
    )
    broken = tmp_path / "new-cause.toml"
    broken.write_text(ENTRY.format(id="new-cause", generator=generator), encoding="utf-8")
    with pytest.raises(CatalogError) as refusal:
        generation(load_catalog(tmp_path))
    message = str(refusal.value)
    assert message.startswith(f"{broken}: {refused}") and "(fix: " in message, message
    assert ("layer_missing" in message) is names and refusal.value.exit_code == ExitCode.INTERNAL


def test_catalog_entries_are_complete() -> None:
    entries = catalog()
    for entry in entries.values():
        assert entry.title and entry.summary.strip() and entry.fix and 0 < entry.prior < 1
        assert entry.render().startswith(f"{entry.id}: {entry.title}")
    assert {
        "embed-slot-added",
        "embed-slot-missing",
        "layer-missing",
        "layer-extra",
        "layer-offset",
        "slot-order",
        "config-ignored",
        "wiring-consistent",
    } <= set(entries)
    assert CASES.is_dir()


QUANTIZED = Finding(
    "RCA-D110",
    "target-quantized",
    "serving",
    "the served target is quantized (fp8)",
    Location("target", "target/config.json", 8, 10),
    hypothesis="target-transformed",
    severity=Severity.WARNING,
)


@pytest.mark.parametrize("wiring_known", [True, False])
def test_a_suspicion_is_a_candidate_that_never_outranks_a_consistent_wiring(wiring_known: bool) -> None:
    training = wiring("training", "h2", "h16", "h29") if wiring_known else Wiring("training", (), None)
    serving = wiring("serving", "h2", "h16", "h29", fc=3)
    hypotheses = rank(Situation(training, serving, [QUANTIZED]), wiring_known=wiring_known)
    suspected = next(h for h in hypotheses if h.id == "target-transformed")
    assert suspected.params.get("suspicion") and "only tensors settle it" in suspected.reason
    verdict = verdict_of(training, serving, hypotheses)
    assert verdict.status.value == ("consistent" if wiring_known else "inconclusive") and verdict.root_cause is None
    if wiring_known:
        assert hypotheses[0].id == "wiring-consistent" and suspected.rank == 2


def test_a_suspicion_an_observation_raises_is_the_cause() -> None:
    seen = Evidence(
        "no serving slot resembles any tap of the target given (best cosine 0.08)",
        Confidence.OBSERVED,
        20.0,
        (Step(Location("capture", "capture/capture_r0_0.safetensors", 1, 1), "compared"),),
    )
    training, serving = wiring("training", "h2", "h16", "h29"), wiring("serving", "h2", "h16", "h29", fc=3)
    hypotheses = rank(Situation(training, serving, [QUANTIZED], observed={"target-transformed": [seen]}))
    assert hypotheses[0].id == "target-transformed" and not hypotheses[0].params.get("suspicion")
    assert verdict_of(training, serving, hypotheses).root_cause == "target-transformed"


def contract_finding(hypothesis: str, ratio: float = 5.0, severity=None) -> Finding:
    from rca.model import Severity

    return Finding(
        "RCA-X101",
        hypothesis,
        "serving",
        f"the engine breaks {hypothesis}",
        Location("draft", "draft.json", 6, 6),
        hypothesis=hypothesis,
        likelihood_ratio=ratio,
        severity=severity or Severity.CAUSE,
    )


def test_two_breaks_of_the_contract_are_two_causes_not_a_tie() -> None:
    """Each break explains its own difference: neither competes with the other, so neither is
    scored at 0.5 against it, and the verdict names both as causes."""
    training, serving = wiring("training", "h2", "h16", "h29"), wiring("serving", "h2", "h16", "h29", fc=3)
    findings = [contract_finding("context-too-short"), contract_finding("norm-flag-dropped", ratio=10.0)]
    hypotheses = rank(Situation(training, serving, findings))
    scores = {h.id: h.score for h in hypotheses}
    assert scores["norm-flag-dropped"] > scores["context-too-short"] > 0.6
    assert [h.severity.value for h in hypotheses[:2]] == ["cause", "cause"]
    verdict = verdict_of(training, serving, hypotheses)
    assert verdict.causes == ("norm-flag-dropped", "context-too-short")
    assert "also a cause: context-too-short" in verdict.summary and not verdict.settled_by


def test_rivals_for_the_same_difference_within_a_margin_name_what_separates_them() -> None:
    """[h3, h31] served where [h3, h31, h59] was trained, and a finding that the config's ids are not
    read: config-ignored and layer-missing explain the same missing tap about equally."""
    training, serving = wiring("training", "h3", "h31", "h59"), wiring("serving", "h3", "h31")
    ignored = Finding(
        "RCA-S101",
        "layer-ids-not-read",
        "serving",
        "the ids are read where the engine never looks",
        Location("serving", "r.py", 3, 3),
        hypothesis="config-ignored",
        likelihood_ratio=0.55,  # weak: the read is guarded by a test the analysis could not decide
    )
    hypotheses = rank(Situation(training, serving, [ignored]))
    top, runner = hypotheses[0], hypotheses[1]
    assert top.score - runner.score < 0.15, [(h.id, h.score) for h in hypotheses]
    verdict = verdict_of(training, serving, hypotheses)
    assert verdict.status.value == "mismatch" and verdict.causes == (top.id,)
    assert f"as likely: {runner.title[:1].lower()}" in verdict.summary and verdict.settled_by in verdict.summary
    assert catalog()[top.id].evidence_for[0] in verdict.settled_by


def test_a_break_no_likelier_than_its_absence_is_a_warning_and_the_verdict_stays_consistent() -> None:
    training, serving = wiring("training", "h2", "h16", "h29"), wiring("serving", "h2", "h16", "h29", fc=3)
    hypotheses = rank(Situation(training, serving, [contract_finding("rope-mismatch", ratio=0.5)]))
    weak = next(h for h in hypotheses if h.id == "rope-mismatch")
    assert weak.severity.value == "warning" and weak.score < 0.5
    verdict = verdict_of(training, serving, hypotheses, ("the trainer is not recorded",))
    assert verdict.status.value == "consistent" and verdict.warnings == ("rope-mismatch",)
    assert "1 warning (rope-mismatch)" in verdict.summary and verdict.assumptions == ("the trainer is not recorded",)
    assert "(under 1 assumption, listed)" in verdict.summary


def test_a_finding_declared_a_warning_never_makes_a_mismatch() -> None:
    from rca.model import Severity

    training, serving = wiring("training", "h2", "h16", "h29"), wiring("serving", "h2", "h16", "h29", fc=3)
    hypotheses = rank(
        Situation(training, serving, [contract_finding("context-too-short", 50.0, severity=Severity.WARNING)])
    )
    assert [(h.id, h.severity.value) for h in hypotheses] == [
        ("wiring-consistent", "note"),
        ("context-too-short", "warning"),
    ]
    assert verdict_of(training, serving, hypotheses).status.value == "consistent"


def test_an_unresolved_side_is_inconclusive_and_says_what_would_settle_it() -> None:
    training, serving = Wiring("training", (), None, notes=("training: no source given",)), wiring("serving", "h2")
    verdict = verdict_of(training, serving, rank(Situation(training, serving, []), wiring_known=False))
    assert verdict.status.value == "inconclusive" and "--training SRC" in verdict.settled_by
    assert verdict.settled_by in verdict.summary


def test_sarif_gives_each_cause_and_warning_its_level() -> None:
    import json

    from rca.model import Diagnosis, Severity
    from rca.report.sarif import render

    training, serving = wiring("training", "h2", "h16", "h29"), wiring("serving", "h2", "h16", "h29", fc=3)
    findings = [
        contract_finding("norm-flag-dropped", ratio=10.0),
        contract_finding("context-too-short", severity=Severity.WARNING),
    ]
    hypotheses = rank(Situation(training, serving, findings))
    diagnosis = Diagnosis(
        {"training": training, "serving": serving}, hypotheses, verdict_of(training, serving, hypotheses)
    )
    (run,) = json.loads(render(diagnosis))["runs"]
    assert [(result["ruleId"], result["level"]) for result in run["results"]] == [
        ("norm-flag-dropped", "error"),
        ("context-too-short", "warning"),
    ]


def test_tensors_showing_the_trained_taps_served_weigh_alike_on_every_hypothesis_that_keeps_those_taps() -> None:
    """Dumps that hold the layers serving feeds say nothing about whether serving feeds them as
    partial sums: that evidence must not favour a consistent wiring over a capture taken before a
    deferred all-reduce (it did, by its ratio of 5, and the cause ranked second)."""
    taps = ("h1", "h2", "h3")
    training, serving = wiring("training", *taps), wiring("serving", *taps, fc=3)
    partial = Finding(
        "RCA-S107",
        "capture-before-allreduce",
        "serving",
        "each rank captures a partial sum; the launch settings turn it on",
        Location("serving", "model.py", 10, 10),
        hypothesis="capture-before-allreduce",
        likelihood_ratio=20.0,
        taps=tuple(Tap(int(tap[1:]), partial=True) for tap in taps),
    )
    shown = Evidence("the dumps hold [h1, h2, h3], what serving feeds", Confidence.OBSERVED, 5.0, ())
    without = rank(Situation(training, serving, [partial]))
    with_dumps = rank(Situation(training, serving, [partial], observed={"wiring-consistent": [shown]}))
    assert (
        [h.id for h in with_dumps][:2]
        == [h.id for h in without][:2]
        == ["capture-before-allreduce", "wiring-consistent"]
    )
    assert with_dumps[0].score == pytest.approx(without[0].score) and with_dumps[0].severity is Severity.CAUSE
