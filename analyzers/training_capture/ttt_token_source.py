"""Which token a trainer's training-time-test loop feeds the draft at the steps after the first."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

import libcst as cst

from rca.sdk import Analyzer, Compares, Example, Fact, Finding, Location, Reports, SideContext, Step, StepKind
from rca.sdk.code import (
    CLEAN,
    Flow,
    FunctionInfo,
    ModuleInfo,
    State,
    Taint,
    call_name,
    first_line,
    has_loop,
    names_in,
    walk,
)
from rca.sdk.examples import DATA_GENERATOR_FILES, DUMP_READER, LLAMA_8B_TARGET
from rca.sdk.inputs import Setting

ARGMAX = "argmax("
# A trainer's EAGLE-3 loop lives in a module named for EAGLE (`eagle3/core.py`, `hf_eagle.py`,
# `eagle/core.py`), not in another draft kind's (`peagle/`).
_EAGLE_PATH = re.compile(r"(^|/|_)eagle", re.IGNORECASE)
# ... or in a module defining an EAGLE model class (ModelOpt's `plugins/transformers.py`), not another draft kind's
_EAGLE_CLASS = re.compile(r"^class \w*Eagle\w*\(", re.MULTILINE)
_OTHER_DRAFT = re.compile(r"peagle|dflash|medusa|mtp", re.IGNORECASE)
_TOKEN_NAMES = ("input_ids", "embeds")  # what a name that holds the draft's input tokens (or their embeddings) says
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")

Sites = frozenset[int]  # the argmax assignments a value derives from (node ids)


@dataclass(frozen=True)
class _Gate:
    """A parameter with a default that decides a branch of the loop, and what decided it."""

    name: str
    default: object
    value: bool
    test: cst.If
    param: cst.Param
    setting: Setting | None  # the run's setting that gave the value; None: the default (or unknown launch)
    undeclared: bool = False  # the setting is a flag the trainer's source does not declare


@dataclass
class _Reading:
    """What the loop feeds at the steps after the first, and what its labels come from."""

    loop: cst.For | cst.While
    tokens: list[tuple[cst.CSTNode, Taint]] = field(default_factory=list)  # each read of the input tokens
    labels: list[tuple[str, Taint]] = field(default_factory=list)  # the label arguments of its loss calls

    @property
    def fed(self) -> Taint:
        """What the token reads after the first step derive from (no sites: the data's tokens)."""
        found = CLEAN
        for _node, taint in self.tokens:
            found = found | taint
        return found


class _Walker(Flow):
    """Which names of one function derive from an argmax of the draft's logits computed in its
    training-time-test loop; a branch on a parameter with a default is decided by the run's settings
    or the default."""

    def __init__(self, ctx: SideContext, function: FunctionInfo) -> None:
        super().__init__()
        self.ctx, self.function = ctx, function
        self.params = {
            param.name.value: param
            for param in (*function.node.params.params, *function.node.params.kwonly_params)
            if param.default is not None
        }
        self.reading: _Reading | None = None  # the outermost loop that reads the tokens and computes a loss
        self.current: _Reading | None = None  # the outermost loop being walked
        self.pass_number = 0  # step 0 reads the data's tokens; the second pass sees what it left for step 1
        self.seeds: dict[int, cst.CSTNode] = {}
        self.gates: dict[int, _Gate] = {}
        self.unknown_gates: dict[int, tuple[str, cst.If, cst.Param]] = {}

    def source(self, value: cst.BaseExpression, line: cst.CSTNode, depth: int) -> Taint:
        if depth and self._argmax_of_step(value):
            self.seeds[id(line)] = line
            return Taint(frozenset({id(line)}))
        return CLEAN

    def _argmax_of_step(self, node: cst.CSTNode) -> bool:
        """Whether the value takes the argmax of a tensor this loop computes (the draft's logits at
        this step: a name assigned inside the loop), not of one computed before it (the target's)."""
        for child in walk(node):
            if isinstance(child, cst.Call) and call_name(child) == "argmax":
                if isinstance(child.func, cst.Attribute) and not _is_module(child.func.value):
                    operand: cst.BaseExpression | None = child.func.value  # logits.argmax(-1)
                else:
                    operand = child.args[0].value if child.args else None  # torch.argmax(logits, dim=-1)
                if isinstance(operand, cst.Name) and operand.value in self.assigned_in_loop:
                    return True
        return False

    def loop_pass(self, node: cst.For | cst.While, depth: int, number: int | None) -> None:
        if depth:
            return
        if number == 0:
            self.current = _Reading(node)
        self.pass_number = number or 0
        reading = self.current
        if number is None and reading is not None:
            if reading.tokens and any("loss" in name for name in names_in(node)) and self.reading is None:
                self.reading = reading

    # -- what a loop body reads --------------------------------------------------------------------

    def visit(self, node: cst.BaseSmallStatement, state: State, depth: int) -> None:
        reading = self.current
        if not depth or self.pass_number != 1 or reading is None:
            return
        for call in (child for child in walk(node) if isinstance(child, cst.Call)):
            name = (call_name(call) or "").lower()
            for arg in call.args:
                keyword = arg.keyword.value if arg.keyword is not None else ""
                if "embed" in name and not keyword:
                    reading.tokens.append((arg.value, self.taint(arg.value, state)))
                elif any(token in keyword for token in _TOKEN_NAMES) or _names_tokens(arg.value):
                    reading.tokens.append((arg.value, self.taint(arg.value, state)))
                if ("loss" in name or "metric" in name) and (
                    "target" in keyword or (isinstance(arg.value, cst.Name) and "target" in arg.value.value)
                ):
                    label = arg.value.value if isinstance(arg.value, cst.Name) else keyword
                    reading.labels.append((label, self.taint(arg.value, state)))

    def decide(self, node: cst.If, depth: int) -> bool | None:
        """A test in the loop on a parameter with a default (`if use_off_policy_tokens:`, `if not flag:`):
        its value in this run, from the run's settings or else the default; None for any other test."""
        if not depth:
            return None
        test, negated = node.test, False
        while isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            test, negated = test.expression, not negated
        if not isinstance(test, cst.Name) or test.value not in self.params:
            return None
        param = self.params[test.value]
        default = _literal(param.default)
        if not isinstance(default, bool):
            return None
        settings = self.ctx.settings
        if settings is None:
            self.unknown_gates.setdefault(id(node), (test.value, node, param))
            return None  # both branches: where they differ, the note says the run's flags decide
        setting, undeclared = settings.get(test.value), False
        if setting is None:
            setting = next((item for item in settings.undeclared if item.dest == test.value), None)
            undeclared = setting is not None
        value = default if setting is None else _truth(setting.value)
        if value is None:
            return None
        if undeclared and setting is not None and setting.flag not in self.ctx.read_flags:
            self.ctx.read_flags.add(setting.flag)
            self.ctx.note(
                f"{setting.flag} is not declared by {self.ctx.tree.label} (the training script that declares it is "
                f"not part of it): read as argparse names it, {test.value} = {value} ({setting.step.location}), "
                f"the parameter of {_qualified(self.function)} its branch at "
                f"{_first_line(self.function.module.location(node, self.function.node))} tests"
            )
        self.gates.setdefault(id(node), _Gate(test.value, default, value, node, param, setting, undeclared))
        return value != negated


def _names_tokens(node: cst.BaseExpression) -> bool:
    """A name (or `x.name`) that says it holds the input tokens or their embeddings."""
    name = node.attr.value if isinstance(node, cst.Attribute) else node.value if isinstance(node, cst.Name) else ""
    return any(token in name for token in _TOKEN_NAMES)


def _mentions_tokens(text: str) -> bool:
    return "embed" in text or "input_ids" in text


def _is_module(node: cst.BaseExpression) -> bool:
    return isinstance(node, cst.Name) and node.value in ("torch", "np", "numpy", "F")


def _literal(node: cst.BaseExpression | None) -> object:
    if isinstance(node, cst.Name) and node.value in ("True", "False", "None"):
        return {"True": True, "False": False, "None": None}[node.value]
    return cst.ensure_type(node, cst.Integer).evaluated_value if isinstance(node, cst.Integer) else object()


def _truth(value: object) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return bool(value)
    if isinstance(value, str) and value.lower() in _TRUE + _FALSE:
        return value.lower() in _TRUE
    return None


# -- examples (written for them, in the shape of the real trainers) --------------------------------

_TRAINER = """
import torch


class Eagle3DraftModel(torch.nn.Module):
    def forward(self, hidden_states, input_ids, verifier_last_hidden_states, ttt_steps=3, {flag}=False):
        hidden_states = self.fc(hidden_states)
        original_input_ids = input_ids.clone()
        with torch.no_grad():
            targets = self.verifier_lm_head(self.verifier_norm(verifier_last_hidden_states))
        loss = 0.0
        for ttt_step in range(ttt_steps):
            input_embeds = self.embed_tokens(input_ids)
            hidden_states = self.layer(torch.cat([input_embeds, hidden_states], dim=-1))
            logits = self.lm_head(self.norm(hidden_states))
            loss += compute_loss(logits, targets, ttt_step)
            input_ids = torch.argmax(logits, dim=-1)
            if {flag}:
                input_ids = original_input_ids[:, 1 + ttt_step :]
        return loss
"""

# SpecForge's and NeMo Automodel's shape: the data's tokens shifted by one at every step
_TEACHER_FORCED = """
import torch


class Eagle3Model(torch.nn.Module):
    def forward(self, input_ids, hidden_states, target, loss_mask):
        losses = []
        for idx in range(self.length):
            inputs_embeds = self.draft_model.embed_input_ids(input_ids)
            hidden_states = self.draft_model.backbone(input_embeds=inputs_embeds, hidden_states=hidden_states)
            logits = self.draft_model.compute_logits(hidden_states)
            losses.append(soft_cross_entropy_loss(logits, target, loss_mask))
            accepted = (logits.argmax(-1) == target.argmax(-1)).float().mean()
            if idx < self.length - 1:
                input_ids = padding(input_ids, left=False)
                target = padding(target, left=False)
        return losses
"""

# labels recomputed at each step over what the draft was fed (a verifier run on its own tokens)
_ON_POLICY_LABELS = """
import torch


class Eagle3DraftModel(torch.nn.Module):
    def forward(self, hidden_states, input_ids, verifier_last_hidden_states, ttt_steps=3):
        hidden_states = self.fc(hidden_states)
        targets = self.verifier_lm_head(self.verifier_norm(verifier_last_hidden_states))
        loss = 0.0
        for ttt_step in range(ttt_steps):
            input_embeds = self.embed_tokens(input_ids)
            hidden_states = self.layer(torch.cat([input_embeds, hidden_states], dim=-1))
            logits = self.lm_head(self.norm(hidden_states))
            loss += compute_loss(logits, targets, ttt_step)
            input_ids = torch.argmax(logits, dim=-1)
            targets = self.verifier_logits_after(input_ids)
        return loss
"""

_TRAIN_SCRIPT = """
import argparse

parser = argparse.ArgumentParser()
parser.add_argument("--ttt-steps", type=int, default=3)
parser.add_argument("--use-teacher-tokens", action="store_true", default=False)
"""


def _files(trainer: str, path: str = "models/eagle3/core.py", **extra: str) -> dict[str, str]:
    return {**DATA_GENERATOR_FILES, "train/data.py": DUMP_READER, path: trainer, **extra}


_FLAGGED = _TRAINER.format(flag="use_teacher_tokens")
_ALWAYS_ARGMAX = "\n".join(
    line for line in _FLAGGED.splitlines() if "use_teacher_tokens:" not in line and "original_input_ids[" not in line
)


class TttTokenSource(Analyzer):
    """Reads which token the trainer's training-time-test loop feeds the draft after the first step.

    ## What it reads
    In the trainer's EAGLE modules (a path naming `eagle`, or a module defining an EAGLE model
    class, other draft kinds' aside), each training function (not one run under `no_grad`) whose loop computes a
    loss and reads the draft's input tokens (an `embed...(ids)` call, or a name or keyword saying
    `input_ids` / `embeds`), walked in order with each loop body taken twice, so that what step 0
    leaves is what step 1 reads: whether those tokens derive from an `argmax` of a tensor the loop
    computes (the draft's own logits at that step) or from the data (the tokens shifted by one, as
    `padding(input_ids)` or `original_input_ids[:, 1 + step:]`). A branch on a parameter with a
    default (`if use_off_policy_tokens:`) follows the run's setting of that name (`--training-args`:
    a flag the trainer declares, a run config key, or a flag of its training script named as
    argparse names it), else its default; without the launch both branches are read, and where
    they differ a note says the run's flags decide (no finding). The labels are the `target`
    arguments of the loop's loss or metric call: whether they are the verifier's distribution over
    the data's tokens (computed before the loop) or recomputed from what the draft was fed.
    A training function that writes its steps out without a loop (two or more embedding calls)
    is not read: a note says so.

    ## Why it matters
    The label at step k is the verifier's next-token distribution over the ground-truth prefix.
    Fed its own argmax instead of the ground-truth token, the draft is trained to continue a prefix
    the label was never computed for, exactly at the positions where it predicted wrong: an
    inconsistent target that makes its later draft tokens somewhat less likely to be accepted (a
    weaker draft, not a collapsed one). Speculators fed the argmax by default until its flag was
    removed and the loop always teacher-forced (its PR 818); SpecForge, ModelOpt's HF path and NeMo
    Automodel feed the ground-truth tokens.
    """

    code = "RCA-T113"
    name = "ttt-token-source"
    sides = frozenset({"training"})
    anchors = (ARGMAX,)
    compares = Compares(
        training="the tokens the trainer's training-time-test loop feeds the draft at later steps",
        serving="the ground-truth prefix the verifier accepts, which the draft's labels assume",
    )
    reports = (Reports("ttt-fed-own-argmax", hypothesis="ttt-own-argmax"),)
    VALID = (
        Example(
            files=_files(_FLAGGED, **{"scripts/train.py": _TRAIN_SCRIPT}),
            target=LLAMA_8B_TARGET,
            training_args="python scripts/train.py --ttt-steps 3 --use-teacher-tokens",
            slots=("h3", "h17", "h30"),
            verifier_last="h32",
            why="the run sets the flag whose branch feeds the data's next token: teacher-forced",
        ),
        Example(
            files=_files(_FLAGGED),
            target=LLAMA_8B_TARGET,
            training_args="python train.py --ttt-steps 3 --use-teacher-tokens",
            slots=("h3", "h17", "h30"),
            verifier_last="h32",
            why="the flag is set on a training script the source does not hold: read as argparse names it",
        ),
        Example(
            files=_files(_FLAGGED),
            target=LLAMA_8B_TARGET,
            slots=("h3", "h17", "h30"),
            verifier_last="h32",
            why="how training was launched is not given: the flag decides, a note says so (no finding)",
        ),
        Example(
            files=_files(_TEACHER_FORCED, path="core/eagle3.py"),
            target=LLAMA_8B_TARGET,
            slots=("h3", "h17", "h30"),
            verifier_last="h32",
            why="the data's tokens shifted at every step; the argmax is only a metric",
        ),
        Example(
            files=_files(_ON_POLICY_LABELS),
            target=LLAMA_8B_TARGET,
            slots=("h3", "h17", "h30"),
            verifier_last="h32",
            why="the draft is fed its own argmax, but its labels are recomputed over what it was fed: consistent",
        ),
    )
    INVALID = (
        Example(
            files=_files(_FLAGGED, **{"scripts/train.py": _TRAIN_SCRIPT}),
            target=LLAMA_8B_TARGET,
            training_args="python scripts/train.py --ttt-steps 3",
            slots=("h3", "h17", "h30"),
            verifier_last="h32",
            finding="ttt-fed-own-argmax",
            path="models/eagle3/core.py",
            line=17,
            message=(
                "at every training-time-test step after the first, Eagle3DraftModel.forward feeds the draft the "
                "argmax of its own logits (models/eagle3/core.py:17) while its labels, targets, are the verifier's "
                "distributions over the data's own tokens (models/eagle3/core.py:10): where the draft mispredicted, "
                "it is trained to continue a prefix the label was not computed for (the branch that feeds the "
                "data's token, models/eagle3/core.py:18, needs use_teacher_tokens, which this run leaves at its "
                "default False); its later draft tokens are accepted somewhat less often, not collapsed"
            ),
            why="the trainer's default feeds the draft's own prediction, and the run keeps the default",
        ),
        Example(
            files=_files(_ALWAYS_ARGMAX),
            target=LLAMA_8B_TARGET,
            slots=("h3", "h17", "h30"),
            verifier_last="h32",
            finding="ttt-fed-own-argmax",
            path="models/eagle3/core.py",
            line=17,
            message=(
                "at every training-time-test step after the first, Eagle3DraftModel.forward feeds the draft the "
                "argmax of its own logits (models/eagle3/core.py:17) while its labels, targets, are the verifier's "
                "distributions over the data's own tokens (models/eagle3/core.py:10): where the draft mispredicted, "
                "it is trained to continue a prefix the label was not computed for; its later draft tokens are "
                "accepted somewhat less often, not collapsed"
            ),
            why="a loop that always feeds the argmax: the code decides, whatever the launch",
        ),
    )

    def run(self, ctx: SideContext) -> Iterator[Fact | Finding]:
        for module, function, walker in self.loops(ctx):
            yield from self._function(ctx, module, function, walker)

    @staticmethod
    def loops(ctx: SideContext) -> Iterator[tuple[ModuleInfo, FunctionInfo, _Walker]]:
        """Each training function of the trainer's EAGLE modules with a TTT loop, walked."""
        assert ctx.index is not None
        for relpath in sorted(ctx.anchor_files(ARGMAX)):
            if not _EAGLE_PATH.search(relpath) and not (
                _EAGLE_CLASS.search(ctx.tree.read(relpath) or "") and not _OTHER_DRAFT.search(relpath)
            ):
                continue
            module = ctx.index.load(relpath)
            if module is None:
                continue
            for function in module.all_functions:
                text = function.text
                if "loss" not in text or not _mentions_tokens(text):
                    continue
                if not re.search(r"\b(for|while)\b", text) or not has_loop(function):
                    if len(re.findall(r"\.embed\w*\(", text)) >= 2:  # steps written out one after another
                        ctx.note(
                            f"{_qualified(function)} ({module.relpath}) unrolls its training-time-test steps without "
                            "a loop: which token it feeds the draft after the first step was not read"
                        )
                    continue
                if "no_grad" in names_in(list(function.node.decorators)):
                    continue  # generation, not training: feeding its own tokens is what drafting does
                walker = _Walker(ctx, function)
                walker.body(function.node.body.body, {}, 0)
                if walker.reading is not None:
                    yield module, function, walker

    def _function(
        self, ctx: SideContext, module: ModuleInfo, function: FunctionInfo, walker: _Walker
    ) -> Iterator[Finding]:
        reading = walker.reading
        assert reading is not None
        where = _qualified(function)
        fed = reading.fed
        if not fed.sites:
            return  # the data's tokens at every step: teacher-forced
        seed = min(
            (walker.seeds[site] for site in fed.sites), key=lambda node: module.location(node, function.node).line
        )
        seed_step = module.step(seed, function.node, "the draft's own argmax, fed to the next step")
        labels = list(reading.labels)
        if fed.unsure:
            _note_undecided(ctx, module, function, walker, seed_step)
            return
        if not labels:
            ctx.note(
                f"{where} feeds the draft its own argmax after the first training-time-test step "
                f"({seed_step.location}), but the labels of its loss were not found: not compared"
            )
            return
        if any(taint.sites for _, taint in labels):
            return  # the labels follow what the draft was fed: consistent
        label = labels[0][0]
        label_steps = [
            module.step(node, function.node, f"the label, {label}: the verifier's distribution over the data's tokens")
            for node in walker.assigned.get(label, [])
            if not _inside(node, reading.loop)
        ][:1]
        steps: list[Step] = [seed_step, *label_steps]
        gate_text, fix, gate_steps = _teacher_forcing_gate(ctx, module, function, walker)
        steps.extend(gate_steps)
        message = (
            f"at every training-time-test step after the first, {where} feeds the draft the argmax of its own "
            f"logits ({seed_step.location}) while its labels, {label}, are the verifier's distributions over the "
            f"data's own tokens ({label_steps[0].location if label_steps else 'computed before the loop'}): where the "
            f"draft mispredicted, it is trained to continue a prefix the label was not computed for{gate_text}; its "
            "later draft tokens are accepted somewhat less often, not collapsed"
        )
        yield self.finding(
            ctx,
            "ttt-fed-own-argmax",
            message,
            seed_step.location,
            likelihood_ratio=3.0,
            steps=tuple(steps),
            fix=fix,
        )


def _note_undecided(
    ctx: SideContext, module: ModuleInfo, function: FunctionInfo, walker: _Walker, seed_step: Step
) -> None:
    """Note that the loop feeds its own argmax on some runs only: a gate this run's settings do not
    decide (no --training-args), or a test rca cannot decide."""
    where = _qualified(function)
    unknown = list(walker.unknown_gates.values())
    if unknown:
        name, test, _param = unknown[0]
        gate = _first_line(module.location(test, function.node))
        ctx.note(
            f"{where} feeds the draft its own argmax after the first training-time-test step "
            f"({seed_step.location}) unless {name} is set ({gate}), while its labels are the verifier's "
            "distributions over the data's tokens: how training was launched was not given "
            "(--training-args), so whether this run fed the data's tokens is unknown"
        )
    else:
        ctx.note(
            f"{where} feeds the draft its own argmax after the first training-time-test step on some "
            f"branches ({seed_step.location}) and the data's tokens on others, chosen by a test rca does not "
            "decide: whether the run teacher-forced is unknown"
        )


def _teacher_forcing_gate(
    ctx: SideContext, module: ModuleInfo, function: FunctionInfo, walker: _Walker
) -> tuple[str, str, list[Step]]:
    """The branch that would feed the data's token, where a setting this run leaves off gates it:
    what the message says of it, the fix, and the steps citing it (the default fix, no steps,
    where there is none)."""
    reading = walker.reading
    assert reading is not None
    steps: list[Step] = []
    gate_text, fix = (
        "",
        (
            "retrain with a trainer whose training-time-test loop feeds the ground-truth token at every step "
            "(teacher forcing), as the label assumes"
        ),
    )
    token_names = {child.value for node, _ in reading.tokens for child in walk(node) if isinstance(child, cst.Name)}
    for gate in walker.gates.values():
        if gate.value or not _assigns(gate.test, token_names):
            continue  # a branch the run takes, or one that does not change the tokens fed
        if_location = _first_line(module.location(gate.test, function.node))
        said = (
            f"which this run leaves at its default {gate.default}"
            if gate.setting is None
            else f"which this run sets to {gate.setting.value!r}"
        )
        gate_text = f" (the branch that feeds the data's token, {if_location}, needs {gate.name}, {said})"
        steps.append(Step(if_location, f"if {gate.name}: the data's token instead", module.code(if_location.line)))
        steps.append(module.step(gate.param, function.node, f"{gate.name} defaults to {gate.default}"))
        passed = first_line(
            ctx,
            sorted(ctx.anchor_files(f'"{gate.name}"')),
            re.compile(rf"[\"']{gate.name}[\"']\s*:"),
            f"the run's {gate.name} handed to the loop",
            StepKind.CALL,
        )
        if passed is not None:
            steps.append(passed)
        if gate.setting is not None:
            steps.append(gate.setting.step)
        flag = "--" + gate.name.replace("_", "-")
        fix = (
            f"retrain with {gate.name} set ({flag} on the trainer's command line): its branch at {if_location} "
            "feeds the ground-truth token at every step, as the label assumes; or with a trainer release whose "
            "loop always teacher-forces"
        )
        break
    return gate_text, fix, steps


def _qualified(function: FunctionInfo) -> str:
    return f"{function.owner.name + '.' if function.owner else ''}{function.name}"


def _first_line(location: Location) -> Location:
    return dataclasses.replace(location, end_line=location.line)


def _assigns(test: cst.If, names: set[str]) -> bool:
    """Whether the branch taken when `test` holds assigns one of `names`."""
    return any(
        isinstance(node, cst.AssignTarget) and isinstance(node.target, cst.Name) and node.target.value in names
        for node in walk(test.body)
    )


def _inside(node: cst.CSTNode, loop: cst.CSTNode) -> bool:
    return any(child is node for child in walk(loop))
