"""The diagnosis: read both sides, resolve their wirings, explain the difference, propose the fix."""

from __future__ import annotations

import gc
import multiprocessing
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from rca.errors import InputError, ParseFailure, SourceFetchError
from rca.evidence.agent import Investigation, candidates, investigate, measure_impact
from rca.evidence.probes import ProbeInputs
from rca.explain.fixes import proposer, with_recovered_map
from rca.explain.hypotheses import Situation, rank
from rca.explain.verdict import mtp_weights_index, own_layers_drafting, own_layers_unjudged, verdict_of
from rca.inputs import Inputs
from rca.inputs.checkpoint import has_weights
from rca.inputs.configs import DraftConfig, TargetConfig, display_path, load_config
from rca.inputs.draft import load_draft
from rca.inputs.dumps import read_dump_metadata
from rca.inputs.launch import LaunchSettings, read_launch_settings, read_training_settings
from rca.inputs.provenance import AssumedTraining, Provenance, assume_training, family_name, infer_trainer
from rca.inputs.sources import SourceSpec, SourceTree, materialize
from rca.model import SIDES, Diagnosis, Drafting, Hypothesis, Note, Status, Verdict, Wiring
from rca.static import codeindex, filecache, parsing
from rca.static.analyzer import registry
from rca.static.builders import LaunchOverrides, launch_overrides
from rca.static.context import SideContext
from rca.static.engine import run_side
from rca.static.facts import Finding
from rca.static.wiring import resolve_wiring

Progress = Callable[[str], None]


@dataclass
class Side:
    """One side's analysis: its wiring, findings and warnings, and (when it ran in this process)
    the context behind them."""

    wiring: Wiring
    findings: tuple[Finding, ...] = ()
    warnings: tuple[str, ...] = ()
    debug: tuple[str, ...] = ()
    ctx: SideContext | None = None


@dataclass
class Run:
    """A finished diagnosis and the per-side analysis behind it (for reports and graphs)."""

    diagnosis: Diagnosis
    sides: dict[str, Side] = field(default_factory=dict)


def load_tree(
    side: str, spec: str, patch: Path | None, inputs: Inputs, progress: Progress | None, flag: str | None = None
) -> SourceTree:
    tree = materialize(SourceSpec.parse(spec, flag or f"--{side}", inputs.base), side, progress)
    if patch is not None:
        tree.apply(patch, display_path(patch, inputs.base))
    return tree


def diagnose(
    inputs: Inputs,
    progress: Progress | None = None,
    parallel: bool = True,
    probing: ProbeInputs | None = None,
    remembered: list | None = None,
) -> Run:
    """Diagnose `inputs`. With `parallel`, the training side is analyzed in a forked process
    while this one reads the serving side (its context is then not kept). With `probing`, the
    agent gathers tensor evidence on what training fed before the hypotheses are ranked, reusing
    the `remembered` observations of a case's earlier runs."""
    with _few_collections():
        run = _diagnose(inputs, progress, parallel, probing, remembered or [])
    filecache.flush()  # what this run derived from the sources, for the next run on them
    return run


@contextmanager
def _few_collections() -> Iterator[None]:
    """Syntax trees are large and acyclic; the collector's default pace spends a fifth of an
    analysis walking them for cycles that are not there."""
    thresholds = gc.get_threshold()
    gc.set_threshold(100_000, 50, 100)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)


@dataclass(frozen=True)
class Loaded:
    """The configs the inputs name, and what stands for training where no trainer's source is given:
    read once, before any source is fetched, for every stage after."""

    target: TargetConfig
    layers: int  # the target's decoder layers
    draft: DraftConfig | None
    trained: DraftConfig | None  # --trained-draft: the draft config as training saw it, where it was edited since
    parent: DraftConfig | None  # --parent-draft
    dumps: Path | None
    provenance: Provenance | None  # the trainer the draft config names, where --training is not given
    assumed: AssumedTraining | None  # what training is assumed to have fed, where nothing names a trainer
    unnamed: str  # why no trainer is named, for the training side's note


@dataclass(frozen=True)
class Sources:
    """The source trees, fetched and patched, and how each side was launched."""

    trees: dict[str, SourceTree]  # by side; a side without a source has none
    settings: LaunchSettings | None  # --serving-args
    training_settings: LaunchSettings | None  # --training-args
    overrides: LaunchOverrides | None  # the config overrides the serving launch hands the engine
    engine: SourceTree | None  # --training-engine


@dataclass(frozen=True)
class Analyzed:
    """Both sides analyzed. The sides are the run's own: the stages after update them in place (a
    wiring the tensors settled, a warning), so that reports show what the diagnosis rests on."""

    sides: dict[str, Side]
    assumed: AssumedTraining | None  # as the serving engine numbers the ids, where training is assumed
    launched: LaunchSettings | None = None  # the serving launch's settings, where given


@dataclass(frozen=True)
class Settled:
    """The wirings the diagnosis compares, after the tensors had their say (with probes)."""

    training: Wiring
    serving: Wiring
    probing: ProbeInputs | None  # with the chat templates both sides render
    investigation: Investigation | None  # the agent's, with probes


@dataclass(frozen=True)
class Explained:
    """What explains the difference: the ranked hypotheses and the verdict on them."""

    hypotheses: tuple[Hypothesis, ...]
    verdict: Verdict


def _diagnose(
    inputs: Inputs, progress: Progress | None, parallel: bool, probing: ProbeInputs | None, remembered: list
) -> Run:
    """The diagnosis in its stages, each handing the next what it found: the inputs loaded, both
    sides analyzed, their wirings settled with tensors, the difference explained, the run assembled."""
    loaded = _load(inputs, progress)
    sources = _fetch(inputs, loaded, progress)
    # With probes, the training side's context stays here: what tensors settle is checked again on it.
    sides = _analyze(inputs, loaded, sources, progress, parallel and probing is None)
    analyzed = _attribute(loaded, sources, sides)
    settled = _settle_with_tensors(inputs, loaded, analyzed, probing, remembered, progress)
    explained = _explain(inputs, loaded, analyzed, settled, progress)
    return _assemble(inputs, loaded, analyzed, settled, explained, progress)


def _load(inputs: Inputs, progress: Progress | None) -> Loaded:
    """The configs before any source: a bad config is bad input, said before a download starts."""
    target_path = inputs.path(inputs.target)
    if target_path is None:
        raise InputError("no target config given", fix="pass --target with the target model's config.json or directory")
    target = TargetConfig(load_config("target", target_path, inputs.base))
    layers = target.num_layers  # a config without a usable layer count is bad input: say so first
    if progress:
        progress(f"target: {', '.join(target.architectures) or 'unnamed architecture'}, {layers} decoder layers")
    draft_path = inputs.path(inputs.draft)
    draft = load_draft(draft_path, inputs.base) if draft_path is not None else None
    if draft is not None and draft.weights is not None and progress:
        weights = draft.weights
        progress(
            f"draft checkpoint: {len(weights.tensors)} tensors, {weights.bytes_read:,} of "
            f"{weights.total_bytes:,} bytes read"
        )
    trained_path = inputs.path(inputs.trained_draft)
    trained = load_draft(trained_path, inputs.base, "--trained-draft") if trained_path is not None else None
    parent_path = inputs.path(inputs.parent_draft)
    parent = load_draft(parent_path, inputs.base, "--parent-draft") if parent_path is not None else None
    dumps = inputs.path(inputs.dumps)
    provenance, assumed, unnamed = _stand_in_for_training(inputs, draft, trained, layers, dumps, progress)
    return Loaded(target, layers, draft, trained, parent, dumps, provenance, assumed, unnamed)


def _stand_in_for_training(
    inputs: Inputs,
    draft: DraftConfig | None,
    trained: DraftConfig | None,
    layers: int,
    dumps: Path | None,
    progress: Progress | None,
) -> tuple[Provenance | None, AssumedTraining | None, str]:
    """Without --training, the trainer the draft config names stands for it; where it names none
    (and no dumps say what training fed), an assumption does. Also returns why no trainer is named."""
    provenance, unnamed = infer_trainer(draft) if draft is not None and inputs.training is None else (None, "")
    if provenance is not None and progress:
        progress(f"training: not given; the draft config names {provenance.summary} ({provenance.how})")
    assumed = None
    if draft is not None and provenance is None and inputs.training is None and dumps is None:
        assumed, why_not = assume_training(trained or draft, layers)
        unnamed = f"{unnamed}, {why_not}" if assumed is None else unnamed
        if assumed is not None and progress:
            progress(f"training: not given, and the draft config names no trainer; {assumed.assumption}")
    return provenance, assumed, unnamed


def _fetch(inputs: Inputs, loaded: Loaded, progress: Progress | None) -> Sources:
    """Every source fetched and patched, and the launches read, before any is analyzed: downloads
    report progress, and bad input stops the run early."""
    if inputs.training_engine and not inputs.training:
        raise InputError(
            "--training-engine names the engine behind a training source, but no --training was given",
            fix="pass --training too, or drop --training-engine",
        )
    trees: dict[str, SourceTree] = {}
    for side in SIDES:
        provenance = loaded.provenance
        spec = (
            inputs.serving
            if side == "serving"
            else inputs.training or (provenance.spec if provenance is not None else None)
        )
        if spec is not None:
            trees[side] = _fetch_side(side, spec, inputs, provenance, progress)
    settings = _launched("serving", inputs.serving_args, inputs, trees, progress)
    training_settings = _launched("training", inputs.training_args, inputs, trees, progress)
    overrides = launch_overrides(trees["serving"], settings) if "serving" in trees else None
    engine = (
        load_tree("engine", inputs.training_engine, None, inputs, progress, "--training-engine")
        if inputs.training_engine
        else None
    )
    return Sources(trees, settings, training_settings, overrides, engine)


def _fetch_side(
    side: str, spec: str, inputs: Inputs, provenance: Provenance | None, progress: Progress | None
) -> SourceTree:
    """One side's source. A trainer the draft config names that cannot be fetched is bad input that
    says where it was named."""
    patch = inputs.path(inputs.serving_patch if side == "serving" else inputs.training_patch)
    try:
        return load_tree(side, spec, patch, inputs, progress)
    except SourceFetchError as error:
        if side == "serving" or provenance is None:
            raise
        raise InputError(
            f"the draft config names {provenance.summary} as its trainer, which cannot be fetched: {error.what}",
            where=str(provenance.steps[-1].location),
            fix="pass --training SRC with the trainer's code (a directory, or pkg==version)",
        ) from None


def _analyze(
    inputs: Inputs, loaded: Loaded, sources: Sources, progress: Progress | None, parallel: bool
) -> dict[str, Side]:
    """Both sides' static analysis. With `parallel` and both sources given, the training side is
    analyzed in a forked process while this one reads the serving side (its context is not kept)."""

    def analyze(side: str) -> Side:
        return _analyze_side(side, inputs, loaded, sources)

    training_result = None
    if parallel and len(sources.trees) == 2:
        _announce("training", sources, progress)
        training_result = concurrently(lambda: analyze("training"), sources.trees["training"].label)
    _announce("serving", sources, progress)
    sides = {"serving": analyze("serving")}
    if training_result is None:
        _announce("training", sources, progress)
    sides["training"] = training_result() if training_result is not None else analyze("training")
    return sides


def _announce(side: str, sources: Sources, progress: Progress | None) -> None:
    """Said here for both sides, also for one analyzed in a forked process: the same lines in the
    same order every run."""
    if progress and side in sources.trees:
        progress(f"analyzing the {side} source ({sources.trees[side].label})")


def _analyze_side(side: str, inputs: Inputs, loaded: Loaded, sources: Sources) -> Side:
    """One side's wiring, findings and warnings. An assumed training side has its assumed wiring; a
    side without a source, a note saying so; a source whose wiring does not parse is bad input."""
    if side == "training" and loaded.assumed is not None:
        return Side(loaded.assumed.wiring())
    if side not in sources.trees:
        launched = sources.settings
        if side == "training" and launched is not None and launched.drafting(loaded.target) is Drafting.OWN_LAYERS:
            return Side(Wiring(side, (), None))  # MTP layers train with the target: no trainer's capture to read
        why = f", and {loaded.unnamed}" if side == "training" and loaded.unnamed else ""
        return Side(Wiring(side, (), None, notes=(str(Note(side, f"no source given (--{side}){why}")),)))
    ctx = _serving_context(inputs, loaded, sources) if side == "serving" else _training_context(inputs, loaded, sources)
    run_side(ctx)
    wiring = resolve_wiring(ctx)
    if not wiring.resolved:
        _raise_parse_failure(ctx)
    launched = ctx.settings
    ignored = [flag for flag in launched.unknown if flag not in ctx.read_flags] if launched else []
    unknown = (
        (f"{launched.display}: {', '.join(ignored)} not declared by {ctx.tree.label}; ignored",)
        if launched is not None and ignored
        else ()
    )
    warnings = (*ctx.tree.warnings, *unknown, *(str(note) for note in ctx.notes if note.side != side))
    return Side(wiring, tuple(ctx.findings), warnings, tuple(ctx.debug), ctx)


def _serving_context(inputs: Inputs, loaded: Loaded, sources: Sources) -> SideContext:
    """Serving reads the configs as its engine builds them: with the launch's overrides applied to
    both (the draft config then differs from the one training recorded)."""
    draft, recorded, target = loaded.draft, loaded.trained, loaded.target
    overrides = sources.overrides
    if overrides is not None:
        target = TargetConfig(overrides.apply(target.config))
        if draft is not None:
            draft, recorded = DraftConfig(overrides.apply(draft.config), draft.weights), loaded.trained or draft
    ctx = SideContext(
        "serving",
        sources.trees["serving"],
        target,
        draft,
        None,
        None,
        settings=sources.settings,
        parent=loaded.parent,
        recorded=recorded,
        base=inputs.base,
    )
    if overrides is not None:
        ctx.note(overrides.note())
    return ctx


def _training_context(inputs: Inputs, loaded: Loaded, sources: Sources) -> SideContext:
    """Training reads the draft config it trained with, its dumps and the engine that captured them."""
    return SideContext(
        "training",
        sources.trees["training"],
        loaded.target,
        loaded.trained or loaded.draft,
        loaded.dumps,
        sources.engine,
        settings=sources.training_settings,
        parent=None,
        recorded=None,
        base=inputs.base,
    )


def _attribute(loaded: Loaded, sources: Sources, sides: dict[str, Side]) -> Analyzed:
    """What stands for training, in the terms of the analysis: an assumed training's ids numbered as
    the serving engine numbers them, and an inferred trainer's inference cited as the first step of
    what training fed."""
    assumed = loaded.assumed
    if assumed is not None and "serving" in sources.trees:
        engine = sources.trees["serving"].top_package()
        read = assumed.read_by(sides["serving"].wiring, engine) if engine else assumed
        if read is not assumed:
            assumed = read
            sides["training"] = Side(read.wiring())
    provenance = loaded.provenance
    if provenance is not None:
        inferred = sides["training"].wiring
        inference = f"the trainer is inferred from the draft config: {provenance.summary} ({provenance.how})"
        sides["training"].wiring = replace(
            inferred,
            steps=(*provenance.steps, *inferred.steps),
            notes=(str(Note("training", inference)), *inferred.notes),
        )
    return Analyzed(sides, assumed, sources.settings)


def _settle_with_tensors(
    inputs: Inputs,
    loaded: Loaded,
    analyzed: Analyzed,
    probing: ProbeInputs | None,
    remembered: list,
    progress: Progress | None,
) -> Settled:
    """With probes, the agent weighs the candidate wirings of training on the tensors (reusing the
    `remembered` observations): a wiring they establish replaces the code's, and its findings are
    redone on it; an observation of what the engine fed may show serving's. Without, the code's stand."""
    sides = analyzed.sides
    training, serving = sides["training"].wiring, sides["serving"].wiring
    if probing is None:
        return Settled(training, serving, None, None)
    probing = replace(
        probing, served_template=serving.aspect("chat_template"), trained_template=training.aspect("chat_template")
    )
    pool = candidates(training, serving, _recorded_ids(loaded.draft, loaded.dumps, inputs.base), loaded.layers)
    investigation = investigate(pool, probing, progress, remembered=remembered)
    established = investigation.wiring(training)
    if established is not None:
        training = sides["training"].wiring = established
        _settle(sides["training"], established)
    captured = investigation.served(serving, training)
    if captured is not None:
        serving = sides["serving"].wiring = captured
    return Settled(training, serving, probing, investigation)


def _explain(
    inputs: Inputs, loaded: Loaded, analyzed: Analyzed, settled: Settled, progress: Progress | None
) -> Explained:
    """The difference explained: every finding (each side's, and the analyzers' across both) and the
    tensor evidence rank the hypotheses, with the fix each proposes; the verdict follows from them."""
    training, serving, probing = settled.training, settled.serving, settled.probing
    sides = analyzed.sides
    compared = [finding for analyzer in registry().analyzers for finding in analyzer().across(training, serving)]
    findings = [finding for side in SIDES for finding in sides[side].findings] + compared
    propose, defaults = proposer(sides["serving"].ctx, loaded.draft, loaded.target, progress)
    observed = settled.investigation.evidence(serving) if settled.investigation is not None else {}
    situation = Situation(training, serving, findings, propose, defaults, observed)
    hypotheses = rank(situation, wiring_known=training.resolved and serving.resolved)
    if probing is not None:  # a lost vocab map may be recovered from the draft's head: a fix to serve
        hypotheses, unrecovered = with_recovered_map(
            hypotheses, probing.draft, probing.model_directory, probing.base, probing.device, progress
        )
        if unrecovered:
            sides["serving"].warnings += (f"the vocab map was not recovered from the draft's head: {unrecovered}",)
    provenance = loaded.provenance
    assumed = _assumptions(inputs, provenance, analyzed.assumed, loaded.draft)
    drafting = own_layers_drafting(analyzed.launched, loaded.target)
    verdict = verdict_of(training, serving, hypotheses, assumed, drafting)
    if drafting is not None:
        verdict = replace(verdict, drafting=drafting)
    if drafting is not None and verdict.status is Status.INCONCLUSIVE:  # nothing else was judged: say why
        target = loaded.target.config.file.parent
        source = analyzed.launched.mtp_source() if analyzed.launched is not None else None
        where = analyzed.launched.mtp_directory(target) if analyzed.launched is not None else target
        weights = where is not None and has_weights(where)
        settled_by = "" if weights else mtp_weights_index(source)
        summary = own_layers_unjudged(drafting) + ("" if weights else f"; {settled_by} would settle whether it does")
        verdict = replace(verdict, summary=summary, settled_by=settled_by)
    if provenance is not None:
        verdict = replace(
            verdict, summary=f"{verdict.summary}; training inferred from the draft config ({provenance.summary})"
        )
    return Explained(hypotheses, verdict)


def _assemble(
    inputs: Inputs,
    loaded: Loaded,
    analyzed: Analyzed,
    settled: Settled,
    explained: Explained,
    progress: Progress | None,
) -> Run:
    """The diagnosis as reports and caches take it. Where the tensors settled a mismatch of slots,
    the agent also measures what fixing it would gain."""
    sides = analyzed.sides
    training, serving, probing = settled.training, settled.serving, settled.probing
    warnings = [warning for side in SIDES for warning in sides[side].warnings]
    agent = settled.investigation.to_json() if settled.investigation is not None else None
    if (
        agent is not None
        and probing is not None
        and explained.verdict.status is Status.MISMATCH
        and training.slots != serving.slots
    ):
        agent["impact"] = measure_impact(probing, inputs.path(inputs.draft), serving, training, progress)
    diagnosis = Diagnosis(
        {side: sides[side].wiring for side in SIDES},
        explained.hypotheses,
        explained.verdict,
        inputs.as_dict(),
        tuple(dict.fromkeys(warnings)),
        agent,
        _trainer_json(loaded.provenance),
    )
    return Run(diagnosis, sides)


def _settle(side: Side, wiring: Wiring) -> None:
    """The side's findings that depend on its wiring, again on the one the tensors settled."""
    if side.ctx is None:
        return
    redone: dict[str, list[Finding]] = {}
    for analyzer in registry().for_side(side.wiring.side):
        again = analyzer().settled(side.ctx, wiring)
        if again is not None:
            redone[analyzer.code] = list(again)
    kept = [finding for finding in side.findings if finding.code not in redone]
    side.findings = (*kept, *(finding for found in redone.values() for finding in found))


_LAUNCHES = {  # side: how its launch is read, what it gives, and its progress line
    "serving": (read_launch_settings, "the serving engine's launch settings", "launch settings"),
    "training": (read_training_settings, "how the trainer was launched", "training settings"),
}


def _launched(
    side: str, value: str | None, inputs: Inputs, trees: dict[str, SourceTree], progress: Progress | None
) -> LaunchSettings | None:
    """A side's launch settings (`--serving-args`, `--training-args`), read with its source's flags."""
    if value is None:
        return None
    read, gives, said = _LAUNCHES[side]
    if side not in trees:
        raise InputError(
            f"--{side}-args gives {gives}, but no {side} source was given",
            fix=f"pass --{side} too, or drop --{side}-args",
        )
    settings = read(value, inputs.base, trees[side])
    if progress:
        declared = ", ".join(f"{s.dest}={s.value!r}" for s in settings.settings)
        progress(f"{said}: {declared or f'none the {side} source declares'}")
    return settings


def _assumptions(
    inputs: Inputs, provenance: Provenance | None, training: AssumedTraining | None, draft: DraftConfig | None
) -> tuple[str, ...]:
    """What the checks that decide rest on, beyond the inputs given, in words for the verdict."""
    assumed = []
    if provenance is not None:
        assumed.append(f"the trainer is the one the draft config names, {provenance.summary} ({provenance.how})")
    if training is not None:
        assumed.append(f"the trainer is not recorded: {training.assumption} (--training SRC reads what it fed)")
    if inputs.trained_draft is not None:
        assumed.append(
            f"the draft config was edited since training: training is read from {inputs.trained_draft}, serving "
            f"from {inputs.draft}"
        )
    if inputs.serving_args is None:
        family = family_name(draft)
        assumed.append(
            f"no launch was given: one pipeline stage serving the {family} draft, optional runtime features off "
            "(--serving-args LAUNCH reads the real one)"
        )
    return tuple(assumed)


def _trainer_json(provenance: Provenance | None) -> dict | None:
    if provenance is None:
        return None
    return {
        "inferred": True,
        "source": provenance.spec,
        "name": provenance.trainer.name,
        "release": provenance.version,
        "recorded": provenance.recorded,
        "how": provenance.how,
        "citations": [step.citation() for step in provenance.steps],
    }


def _recorded_ids(
    draft: DraftConfig | None, dumps: Path | None, base: Path | None
) -> list[tuple[str, tuple[int, ...]]]:
    """Layer ids the draft config and the dump metadata record, for the agent's candidates."""
    recorded = []
    for keypath, value in draft.declared_ids() if draft is not None else ():
        if (
            isinstance(value, list)
            and value
            and all(isinstance(item, int) and not isinstance(item, bool) for item in value)
        ):
            recorded.append((f"the draft config's {'.'.join(keypath)}", tuple(value)))
    metadata = read_dump_metadata(dumps, base) if dumps is not None else None
    if metadata is not None:
        recorded.append(("the dump metadata's layer ids", metadata.ids))
    return recorded


def concurrently(job: Callable[[], Side], label: str = "") -> Callable[[], Side]:
    """Start `job` in a forked process (the other core) and return a function that waits for its
    result. Where fork is unavailable or there is one core, the job simply runs now. `label` names
    what the job reads, for the error when the process is killed."""
    if sys.platform != "linux" or (os.cpu_count() or 1) < 2:
        result = job()
        return lambda: result
    context = multiprocessing.get_context("fork")
    reader, writer = context.Pipe(duplex=False)
    being_parsed = context.Array("c", 4096, lock=False)  # the file the child is parsing, should it be killed

    def child() -> None:
        def witness(relpath: str) -> None:
            being_parsed.value = relpath.encode("utf-8", "replace")[:4095]

        codeindex.parsing_witness = witness
        try:
            side = replace(job(), ctx=None)
            filecache.after_answer = False  # this process answers its parent: it cannot write after that
            filecache.flush()  # what this side derived, kept by the process that derived it
            outcome: tuple[str, object] = ("result", (side, parsing.kept()))
        except BaseException as error:
            outcome = ("error", error)
        try:
            writer.send(outcome)
        except Exception as error:
            writer.send(("error", RuntimeError(f"{type(outcome[1]).__name__}: {outcome[1]} ({error})")))

    process = context.Process(target=child, daemon=True)
    process.start()
    writer.close()

    def wait() -> Side:
        try:
            kind, value = reader.recv()
        except EOFError:
            process.join()
            file = being_parsed.value.decode("utf-8", "replace")
            if process.exitcode is not None and process.exitcode < 0 and file:
                raise ParseFailure(
                    f"the analysis was killed by signal {-process.exitcode} while parsing {file}",
                    where=label,
                    fix="check that file (an expression nested or repeated far beyond real code?), or exclude it",
                ) from None
            raise RuntimeError(f"the forked analysis ended without a result (exit status {process.exitcode})") from None
        finally:
            process.join()
            reader.close()
        if kind == "error":
            raise value  # type: ignore[misc]
        side, parses = value  # type: ignore[misc]
        parsing.kept_elsewhere(parses)  # for a server to hold for the next command
        return side

    return wait


def _raise_parse_failure(ctx: SideContext) -> None:
    """A side that resolved nothing because a file with its wiring does not parse is bad input."""
    assert ctx.index is not None
    for relpath, reason in ctx.index.failures.items():
        if ctx.index.loadable(relpath) and reason != "unreadable":
            raise ParseFailure(
                reason, where=ctx.tree.label, fix="fix the syntax error (or the patch that introduced it)"
            )
