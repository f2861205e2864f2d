"""Whether the serving engine honours a draft that declares it takes no auxiliary hidden states."""

from __future__ import annotations

import re
from collections.abc import Iterator

from rca.sdk import Analyzer, Compares, DraftInput, Example, Fact, Finding, Reports, SideContext, StepKind
from rca.sdk.code import first_line
from rca.sdk.examples import CAPTURE_BEFORE, LOOP_MODEL, SGLANG_RUNNER, SMALL_TARGET

from .runners import FLAG, RunnerChoice, runner_choice

_MODEL = LOOP_MODEL.format(capture_before=CAPTURE_BEFORE, capture_after="pass")
_READ = re.compile(rf"""["']{FLAG}["']""")
_DRAFT = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 3, 5], FLAG: False}}

# -- a vLLM-shaped engine with two model runners, picked by an environment variable ----------------
_ENVS = """
import os

environment_variables = {
    "ENGINE_USE_V2_RUNNER": lambda: maybe_convert_bool(os.getenv("ENGINE_USE_V2_RUNNER", None)),
}
"""
_CONFIG = """
from engine import envs


class EngineConfig:
    @property
    def use_v2_runner(self):
        use_v2_runner = envs.ENGINE_USE_V2_RUNNER
        if use_v2_runner is not None:
            return use_v2_runner
        return self.model_config.architecture in DEFAULT_V2_ARCHITECTURES
"""
_WORKER = """
class Worker:
    def __init__(self, config):
        self.config = config
        self.use_v2_runner = config.use_v2_runner

    def init_device(self):
        if self.use_v2_runner:
            from engine.runner_v2 import Runner as RunnerV2

            self.runner = RunnerV2(self.config)
        else:
            from engine.runner import Runner as RunnerV1

            self.runner = RunnerV1(self.config)
"""
_PROPOSER = """
class EagleProposer:
    def __init__(self, config):
        self.draft_config = config.speculative_config.draft_model_config.hf_config
        self.eagle3_use_aux_hidden_state = self._eagle3_use_aux_hidden_state_from_config()

    def _eagle3_use_aux_hidden_state_from_config(self):
        eagle_config = getattr(self.draft_config, "eagle_config", None) or {}
        return eagle_config.get("use_aux_hidden_state", True)
"""
# {decide}: how the runner sets its switch for an EAGLE-3 draft
_RUNNER = """
from engine.proposer import EagleProposer


class Runner:
    def __init__(self, config):
        self.speculative_config = config.speculative_config
        self.use_aux_hidden_state_outputs = False
        if self.speculative_config.method == "eagle3":
            self.drafter = EagleProposer(config)
            {decide}

    def execute(self, model_output):
        if self.use_aux_hidden_state_outputs:
            hidden_states, aux_hidden_states = model_output
        else:
            hidden_states, aux_hidden_states = model_output, None
        return hidden_states, aux_hidden_states
"""
_READS = "self.use_aux_hidden_state_outputs = self.drafter.eagle3_use_aux_hidden_state"
_IGNORES = "self.use_aux_hidden_state_outputs = True"
_CALLS = "self.use_aux_hidden_state_outputs = requires_aux_hidden_states(self.speculative_config)"
_CLEARS = (
    "self.use_aux_hidden_state_outputs = True\n"
    "            if not self.drafter.eagle3_use_aux_hidden_state:\n"
    "                self.use_aux_hidden_state_outputs = False"
)
_REQUIRES = """
def requires_aux_hidden_states(spec_config):
    eagle_config = getattr(spec_config.draft_model_config.hf_config, "eagle_config", None) or {}
    return eagle_config.get("use_aux_hidden_state", True)
"""
_TWO_RUNNERS = {
    "runner.py": SGLANG_RUNNER,
    "model.py": _MODEL,
    "engine/envs.py": _ENVS,
    "engine/config.py": _CONFIG,
    "engine/worker.py": _WORKER,
    "engine/proposer.py": _PROPOSER,
    "engine/runner.py": _RUNNER.format(decide=_READS),
    "engine/runner_v2.py": _RUNNER.format(decide=_IGNORES),
}


class AuxFlag(Analyzer):
    """Reads whether the serving engine reads `use_aux_hidden_state`, when the draft declares it false.

    ## What it reads
    The draft config's `use_aux_hidden_state` (in `eagle_config` or at the top level). When it is
    false, the serving source is searched for code that reads the key; without any, the engine
    captures its layers and feeds their concatenation through `fc` whatever the draft declares.

    Where some code reads it, what matters is whether the runner that serves the target does.
    The runners are the classes that set the capture switch: the field the code tests before
    taking auxiliary hidden states out of the target's output (`if self.use_aux_hidden_state_outputs:
    hidden_states, aux_hidden_states = model_output`). For each, its assignment for an EAGLE-3 draft
    (under a test for `eagle3`) is read: a value that reads the key, directly or one or two hops
    away (`self.drafter.eagle3_use_aux_hidden_state`, a field set from a method that reads it;
    `requires_aux_hidden_states(...)`, a function that does), or a constant `True` that ignores it.
    Where the engine builds one runner or another under a test (`if self.use_v2_model_runner:`),
    the test is followed to the environment variable it reads (through the field and the property
    computing it, `VLLM_USE_V2_MODEL_RUNNER`), and the launch's environment (`--serving-args`,
    `VLLM_USE_V2_MODEL_RUNNER=1 vllm serve ...`) or the variable's default settles which runs.

    - The selected runner ignores the flag: a finding, citing the draft's key, the runner's
      assignment and the setting that selects it; the fix names the value that selects the other.
    - It reads the flag: a note, citing the read.
    - The launch leaves the variable unset and the engine computes the choice per model and
      platform (vLLM 0.22 on): a note that says which runner ignores the flag and how to select
      the one that reads it, not a finding. The runner that ignores it may never run for this
      target (vLLM 0.22 picks Model Runner V2 by default for a few architectures only), and a
      finding would accuse a deployment that serves the draft right.

    ## Why it matters
    Some EAGLE-3 drafts (e.g. heads trained on the target's last hidden state, like EAGLE-1) declare
    `use_aux_hidden_state: false`. An engine that ignores the flag feeds them a concatenation of
    captured layers through an `fc` they never trained: acceptance collapses without an error.
    vLLM's Model Runner V2 did so in 0.22 and 0.30 (it sets the switch for EAGLE-3 unconditionally)
    while its V1 runner read the flag, so the same draft served right or not by the launch's
    `VLLM_USE_V2_MODEL_RUNNER`. Where the engine reads the flag, the draft is fed the last hidden
    state, and the capture shown for the wiring is not what it is fed (the side's notes say so).
    """

    code = "RCA-S111"
    name = "aux-flag"
    sides = frozenset({"serving"})
    compares = Compares(
        training="use_aux_hidden_state as the draft config records it: trained on the last state or on layers",
        serving="every line of the engine that reads the key, and the runner the launch selects",
    )
    reports = (Reports("aux-flag-unread", hypothesis="aux-flag-ignored"),)
    INVALID = (
        Example(
            files={"runner.py": SGLANG_RUNNER, "model.py": _MODEL},
            target=SMALL_TARGET,
            draft=_DRAFT,
            finding="aux-flag-unread",
            path="draft.json",
            key=("eagle_config", "use_aux_hidden_state"),
            message=(
                "the draft declares use_aux_hidden_state false (it takes the target's last hidden state), but "
                "nothing in example reads the key: the captured layers are fed through fc"
            ),
            why="an engine release that predates the flag",
        ),
        Example(
            files=_TWO_RUNNERS,
            target=SMALL_TARGET,
            draft=_DRAFT,
            settings="ENGINE_USE_V2_RUNNER=1 engine serve model",
            finding="aux-flag-unread",
            path="draft.json",
            key=("eagle_config", "use_aux_hidden_state"),
            message=(
                "the draft declares use_aux_hidden_state false (it takes the target's last hidden state), but the "
                "runner the launch selects with ENGINE_USE_V2_RUNNER=1, Runner (engine/runner_v2.py), returns the "
                "captured layers for an EAGLE-3 draft whatever the draft declares: they are fed through fc"
            ),
            why="the proposer reads the flag, but the runner the launch selects sets the switch for EAGLE-3 "
            "unconditionally (vLLM 0.22's and 0.30's Model Runner V2)",
        ),
    )
    VALID = (
        Example(
            files={
                "runner.py": SGLANG_RUNNER.replace(
                    "    def init_aux_hidden_state_capture(self):",
                    "    def init_aux_hidden_state_capture(self):\n"
                    '        if not self.draft_config.eagle_config.get("use_aux_hidden_state", True):\n'
                    "            return",
                ),
                "model.py": _MODEL,
            },
            target=SMALL_TARGET,
            draft=_DRAFT,
            why="the runner reads the flag and captures nothing for such a draft",
        ),
        Example(
            files=_TWO_RUNNERS,
            target=SMALL_TARGET,
            draft=_DRAFT,
            settings="export ENGINE_USE_V2_RUNNER=0\nengine serve model",
            why="the launch selects the runner whose switch is the proposer's reading of the flag",
        ),
        Example(
            files=_TWO_RUNNERS,
            target=SMALL_TARGET,
            draft=_DRAFT,
            why="the launch leaves the choice to the engine's default per model: a note says which runner "
            "ignores the flag, no finding",
        ),
        Example(
            files={
                **_TWO_RUNNERS,
                "engine/runner_v2.py": "from engine.utils import requires_aux_hidden_states\n"
                + _RUNNER.format(decide=_CALLS),
                "engine/utils.py": _REQUIRES,
            },
            target=SMALL_TARGET,
            draft=_DRAFT,
            settings="ENGINE_USE_V2_RUNNER=1 engine serve model",
            why="the selected runner's switch is a function that reads the flag (vLLM 0.33's Model Runner V2)",
        ),
        Example(
            files={**_TWO_RUNNERS, "engine/runner_v2.py": _RUNNER.format(decide=_CLEARS)},
            target=SMALL_TARGET,
            draft=_DRAFT,
            settings="ENGINE_USE_V2_RUNNER=1 engine serve model",
            why="the selected runner sets the switch for EAGLE-3, then clears it under a test that reads the flag",
        ),
    )

    def applies_to(self, ctx: SideContext) -> bool:
        return ctx.draft is not None and self._declared(ctx) is not None

    def _declared(self, ctx: SideContext) -> tuple[str, ...] | None:
        assert ctx.draft is not None
        for path in (("eagle_config", FLAG), (FLAG,)):
            present, value = ctx.draft.config.lookup(path)
            if present and value is False:
                return path
        return None

    def run(self, ctx: SideContext) -> Iterator[Fact | Finding]:
        assert ctx.draft is not None
        path = self._declared(ctx)
        assert path is not None
        declared = ctx.draft.config.step(path, f"{'.'.join(path)} = false")
        fed = ctx.fact(DraftInput)
        concatenation = tuple(fed.steps[-1:]) if fed is not None and fed.steps else ()
        files = sorted(ctx.anchor_files(f'"{FLAG}"') + ctx.anchor_files(f"'{FLAG}'"))
        read = first_line(ctx, files, _READ, f"reads {FLAG}", StepKind.CONFIG)
        if read is None:
            yield self.finding(
                ctx,
                "aux-flag-unread",
                f"the draft declares {FLAG} false (it takes the target's last hidden state), but nothing in "
                f"{ctx.tree.label} reads the key: the captured layers are fed through fc",
                declared.location,
                likelihood_ratio=10.0,
                steps=(declared, *concatenation),
                fix=f"serve the draft on an engine release that reads {FLAG}, or with a draft trained on the "
                "captured layers",
            )
            return
        choice = runner_choice(ctx)
        if choice is None:  # one way to run the target: whatever reads the key decides
            ctx.note(
                f"the draft declares {FLAG} false, which {ctx.tree.label} reads ({read.location}): the draft is fed "
                "the target's last hidden state, not the captured layers the wiring shows"
            )
            return
        selected = choice.selected
        if selected is None and choice.verdict(True) == choice.verdict(False):
            selected = True  # whichever runs, it decides alike
        elif selected is None:
            self._unsettled(ctx, choice)
            return
        verdict = choice.verdict(selected)
        if verdict != "ignores":
            reader = next((decision for decision in choice.when[selected] if decision.reads), None)
            ctx.note(
                f"the draft declares {FLAG} false, which {choice.selects(selected)} reads "
                f"({reader.reads[-1].location}): the draft is fed the target's last hidden state, not the captured "
                "layers the wiring shows"
                if reader is not None and verdict == "reads"
                else f"the draft declares {FLAG} false; whether {choice.selects(selected)} reads it could not be read"
            )
            return
        ignorer, other = choice.when[selected][0], choice.when[not selected][0]
        fix = (
            f"launch with {choice.env}={choice.spelled(not selected)}: it selects {other.label}, which reads {FLAG}"
            if choice.verdict(not selected) == "reads" and choice.env is not None
            else f"serve the draft on an engine release whose runner reads {FLAG}, or with a draft trained on the "
            "captured layers"
        )
        yield self.finding(
            ctx,
            "aux-flag-unread",
            f"the draft declares {FLAG} false (it takes the target's last hidden state), but "
            f"{choice.selects(selected)} returns the captured layers for an EAGLE-3 draft whatever the draft "
            "declares: they are fed through fc",
            declared.location,
            likelihood_ratio=10.0,
            steps=(declared, ignorer.assignment, *choice.why, choice.test, *concatenation),
            fix=fix,
        )

    def _unsettled(self, ctx: SideContext, choice: RunnerChoice) -> None:
        """Which runner runs is computed at run time (per model and platform): a note, not a finding.
        Where the launch leaves the choice to the engine, the runner that ignores the flag may never
        run (vLLM 0.22 picks Model Runner V2 by default for a few architectures only), and a finding
        would accuse a deployment that serves the draft right."""
        sides = {verdict: side for side in (False, True) if (verdict := choice.verdict(side)) is not None}
        if set(sides) != {"reads", "ignores"}:
            ctx.note(
                f"the draft declares {FLAG} false; which runner serves it is decided at run time "
                f"({choice.test.location}), and whether each reads the flag could not be read"
            )
            return
        reader = next(decision for decision in choice.when[sides["reads"]] if decision.reads)
        ignorer = choice.when[sides["ignores"]][0]
        unset = (
            ""
            if choice.env is None
            else f"by {choice.env}, which the launch leaves unset, and then "
            if choice.written is None
            else f"by {choice.env} (the launch's {choice.written!r} reads as neither 1 nor 0) and "
        )
        select = (
            f": launch with {choice.env}={choice.spelled(sides['reads'])} to select the runner that reads it"
            if choice.env is not None
            else ""
        )
        ctx.note(
            f"the draft declares {FLAG} false, which {reader.label} reads ({reader.reads[-1].location}), but "
            f"{ignorer.label} returns the captured layers for an EAGLE-3 draft whatever the draft declares "
            f"({ignorer.assignment.location}); which runs is decided {unset}by the engine per model and platform "
            f"({choice.test.location}){select}"
        )
