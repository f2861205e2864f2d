"""What each side's draft module does with its final norm: before its lm_head, and on the state it passes on."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import libcst as cst

from rca.sdk import (
    Analyzer,
    Compares,
    Establishes,
    Example,
    Fact,
    Finding,
    Reports,
    SideContext,
    Step,
    StepKind,
    Wiring,
)
from rca.sdk.code import ClassInfo, FunctionInfo, dotted_name, walk
from rca.sdk.examples import LLAMA_8B_TARGET
from rca.sdk.inputs import DraftConfig
from rca.sdk.sides import trainer_draft_module
from rca.sdk.values import ConfigObj, ObjRef, Val

FLAG = "norm_output"  # the draft config key both trainers and engines read, with meanings of their own
_NESTED = (cst.FunctionDef, cst.ClassDef, cst.Lambda)
_HEAD_CALL = re.compile(r"\.lm_head\(")


@dataclass(frozen=True, slots=True)
class NormUse:
    """What one side's draft module does with its final norm: whether its lm_head reads the
    normalized state, and whether the state it passes on to its next step is normalized."""

    head_normed: bool
    passed_on_normed: bool
    holder: str  # the method that decides both (`LlamaForCausalLMEagle3.compute_logits`)
    steps: tuple[Step, ...] = ()

    @property
    def head(self) -> str:
        return "lm_head(norm(h))" if self.head_normed else "lm_head(h), no norm"

    @property
    def passed_on(self) -> str:
        return "norm(h)" if self.passed_on_normed else "the pre-norm h"

    @property
    def reads_flag(self) -> bool:
        """Whether the side's code tests the draft config's flag (a cited test step)."""
        return any(step.kind == StepKind.TEST for step in self.steps)

    def describe(self) -> str:
        return f"{self.head}; passes {self.passed_on} on to its next step"

    def to_json(self) -> dict[str, Any]:
        return {
            "lm_head_input": "post-norm" if self.head_normed else "pre-norm",
            "passed_on": "post-norm" if self.passed_on_normed else "pre-norm",
            "holder": self.holder,
            "steps": [step.citation() for step in self.steps],
        }


_TRAINER_DRAFT = """
import torch


class LlamaForCausalLMEagle3(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.norm = torch.nn.RMSNorm(config.hidden_size)
        self.lm_head = torch.nn.Linear(config.hidden_size, config.draft_vocab_size)
        {flag}

    def compute_logits(self, hidden_states):
{logits}
        return self.lm_head(norm_hidden_states)
"""
_FLAGGED_LOGITS = """        if self.norm_output:
            norm_hidden_states = self.norm(hidden_states)
        else:
            norm_hidden_states = hidden_states"""
_ALWAYS_NORMED = "        norm_hidden_states = self.norm(hidden_states)"

_ENGINE_DRAFT = """
import torch


class LlamaModel(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.midlayer = torch.nn.Linear(config.hidden_size, config.hidden_size)
        self.norm = torch.nn.RMSNorm(config.hidden_size)
        self.norm_output = getattr(config, "norm_output", False)

    def forward(self, hidden_states, residual):
        hidden_states, residual = self.midlayer(hidden_states, residual)
        to_logits, to_aux = self.norm(hidden_states, residual)
        aux = to_logits if self.norm_output else to_aux
        return to_logits, [aux]


class LlamaForCausalLMEagle3(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.model = LlamaModel(config)
"""
_DRAFT = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 4096, "draft_vocab_size": 32000}


def _trainer(flag: str, logits: str) -> dict[str, str]:
    return {"modeling/draft/llama3_eagle.py": _TRAINER_DRAFT.format(flag=flag, logits=logits)}


_DEFAULT_TRUE = 'self.norm_output = getattr(config, "norm_output", True)'


class FinalNormUse(Analyzer):
    """Reads what the draft module of each side does with its final norm, and compares the two.

    ## What it reads
    On each side, the draft class built for the draft's `architectures` (and the module it holds
    as `model`), evaluated with the draft's config, and in it the method that decides the norm:
    the one that calls `lm_head` (a trainer's `compute_logits`), else a `forward` that returns
    the state for the logits and the state it passes on (an engine's draft model). A small
    reading of that method, taking the branch that the draft's `norm_output` selects as the
    evaluated object holds it, says whether `lm_head` reads a normalized state, and whether the
    state passed on to the next step (the pair's second element, else the `hidden_states` the
    method rebinds) is normalized.

    ## Why it matters
    `norm_output` has two meanings. SpecForge 0.2 reads it (default true) as "apply the final
    norm before lm_head"; SGLang, vLLM and speculators read it (default false) as "pass the
    post-norm state on to the next step", and always norm before lm_head. A draft trained with
    one meaning and served with the other sees states of another scale at every step after the
    first, or logits it never learned: acceptance drops with no error.
    """

    code = "RCA-X102"
    name = "final-norm-use"
    formerly = ("RCA-T109",)
    sides = frozenset({"serving", "training"})
    # no anchors: they would let the whole side's code be parsed (every model file names lm_head);
    # the files it reads are the draft's module and those it searches for by name
    establishes = Establishes(
        "draft_norm",
        "what the side's draft module does with its final norm: before its lm_head, and on the state it passes on",
    )
    compares = Compares(
        training="what the trainer's draft module does with its final norm under the config's flag",
        serving="what the engine's draft module does with it under the same flag",
    )
    reports = (
        Reports("norm-before-head-differs", hypothesis="norm-semantics-differ"),
        Reports("passed-on-norm-differs", hypothesis="norm-semantics-differ"),
    )
    VALID = (
        Example(
            files=_trainer(_DEFAULT_TRUE, _FLAGGED_LOGITS),
            serving_files={"models/llama_eagle3.py": _ENGINE_DRAFT},
            target=LLAMA_8B_TARGET,
            draft=_DRAFT,
            why="no norm_output in the draft config: both norm before lm_head and pass the pre-norm state on",
        ),
        Example(
            files=_trainer("", _ALWAYS_NORMED),
            serving_files={"models/llama_eagle3.py": _ENGINE_DRAFT},
            target=LLAMA_8B_TARGET,
            draft=_DRAFT,
            why="a trainer that always norms before lm_head, as the engine does",
        ),
    )
    INVALID = (
        Example(
            files=_trainer(_DEFAULT_TRUE, _FLAGGED_LOGITS),
            serving_files={"models/llama_eagle3.py": _ENGINE_DRAFT},
            target=LLAMA_8B_TARGET,
            draft={**_DRAFT, "norm_output": False},
            finding="norm-before-head-differs",
            path="modeling/draft/llama3_eagle.py",
            line=17,
            message=(
                "norm_output = False means another thing to each side: in training, LlamaForCausalLMEagle3."
                "compute_logits computes lm_head(h), no norm; served, LlamaModel.forward computes lm_head(norm(h)): "
                "the draft's head was trained on states the engine never gives it"
            ),
            why="norm_output: false written for a trainer that reads it as 'no norm before lm_head'",
        ),
        Example(
            files=_trainer(_DEFAULT_TRUE, _FLAGGED_LOGITS),
            serving_files={"models/llama_eagle3.py": _ENGINE_DRAFT},
            target=LLAMA_8B_TARGET,
            draft={**_DRAFT, "norm_output": True},
            finding="passed-on-norm-differs",
            path="modeling/draft/llama3_eagle.py",
            line=17,
            message=(
                "norm_output = True means another thing to each side: in training, LlamaForCausalLMEagle3."
                "compute_logits passes the pre-norm h on to its next step; served, LlamaModel.forward passes "
                "norm(h) on: every step after the first sees states of another scale than in training"
            ),
            why="norm_output: true written for a trainer that reads it as 'norm before lm_head'",
        ),
    )

    def applies_to(self, ctx: SideContext) -> bool:
        return ctx.draft is not None

    def run(self, ctx: SideContext) -> Iterator[Fact | Finding]:
        built = ctx.draft_model() or (trainer_draft_module(ctx, FLAG) if ctx.side == "training" else None)
        if built is None:
            return
        cls, draft = built
        holders = [draft] + [inner for inner in (ctx.evaluator.field(draft, "model"),) if isinstance(inner.v, ObjRef)]
        found = [(holder, method) for holder in holders for method in _deciding_methods(ctx, holder)]
        if not any(FLAG in method.text for _, method in found):
            found += _module_flag_readers(ctx, cls)
        if not found:
            return
        # the method that tests the flag decides; else the first that reads the head
        holder, method = next(((h, m) for h, m in found if FLAG in m.text), found[0])
        reading = _Reading(ctx, holder, method)
        use = reading.run()
        if use is None:
            return
        yield self.aspect(ctx, use.steps[0].location, use.describe(), use)

    def across(self, training: Wiring, serving: Wiring) -> Iterator[Finding]:
        trained, served = self.established(training), self.established(serving)
        if trained is None or served is None:
            return
        flag = next((step for step in (*trained.steps, *served.steps) if step.kind == StepKind.CONFIG), None)
        means = _meaning(trained, served, flag)
        steps = (*((flag,) if flag else ()), *trained.steps, *served.steps)
        where = next(step for step in trained.steps if step.kind == StepKind.CALL).location  # the trainer's code
        fix = _fix(trained, served, flag)
        for name, differs, what in (
            (
                "norm-before-head-differs",
                trained.head_normed != served.head_normed,
                f"in training, {trained.holder} computes {trained.head}; served, {served.holder} computes "
                f"{served.head}: the draft's head was trained on states the engine never gives it",
            ),
            (
                "passed-on-norm-differs",
                trained.passed_on_normed != served.passed_on_normed,
                f"in training, {trained.holder} passes {trained.passed_on} on to its next step; served, "
                f"{served.holder} passes {served.passed_on} on: every step after the first sees states of another "
                "scale than in training",
            ),
        ):
            if differs:
                yield self.finding(
                    "training", name, f"{means}: {what}", where, likelihood_ratio=10.0, steps=steps, fix=fix
                )


def _meaning(trained: NormUse, served: NormUse, flag: Step | None) -> str:
    """How the flag came to mean two things: read by both sides apart, or by one side only."""
    reads = [trained.reads_flag, served.reads_flag]
    said = flag.note if flag is not None else f"{FLAG} (not in the draft config)"
    if all(reads):
        return f"{said} means another thing to each side"
    if reads[1]:
        return f"{said} is read by the engine's draft module only"
    if reads[0]:
        return f"{said} is read by the trainer's draft module only"
    return "the two draft modules use the final norm apart"


def _fix(trained: NormUse, served: NormUse, flag: Step | None) -> str:
    where = f" ({flag.location})" if flag is not None else ""
    if not trained.head_normed:
        at = f" at {flag.location}" if flag is not None else ""
        how = f" (set {FLAG}: true{at}; {trained.holder} then applies it)" if trained.reads_flag else ""
        return f"retrain with the final norm before lm_head{how}: the engine always applies it"
    if not served.reads_flag:
        return (
            f"serve on an engine release whose draft module reads {FLAG} ({served.holder} here always passes "
            f"{served.passed_on} on), or retrain to match it"
        )
    value = "true" if trained.passed_on_normed else "false"
    state = "post-norm" if trained.passed_on_normed else "pre-norm"
    return f"serve with {FLAG}: {value}{where}: the engine then passes the {state} state on, as training did"


def _module_flag_readers(ctx: SideContext, cls: ClassInfo) -> list[tuple[Val, FunctionInfo]]:
    """The deciding methods of the draft module's other classes that read the flag, each built
    with the draft's config: the inner model a constructor builds where the evaluation of that
    constructor stopped early (an argument read from run-time state)."""
    assert ctx.draft is not None
    found: list[tuple[Val, FunctionInfo]] = []
    for other in cls.module.classes.values():
        if other is cls or not any(FLAG in method.text for method in other.methods.values()):
            continue
        holder = ctx.evaluator.new_object(other, [Val(ConfigObj(ctx.draft.config))], {})
        found += [(holder, method) for method in _deciding_methods(ctx, holder) if FLAG in method.text]
    return found


def _declared_default(ctx: SideContext, near: str) -> tuple[bool, Step] | None:
    """The flag's default where a config class declares it (`norm_output: bool = Field(default=False)`),
    in the package of `near`: what a draft config without the key gets."""
    assert ctx.index is not None
    package = near.rsplit("/", 1)[0]
    for relpath in sorted(ctx.anchor_files(FLAG), key=lambda path: not path.startswith(package)):
        ctx.index.allow(relpath)
        module = ctx.index.load(relpath)
        if module is None:
            continue
        for cls in module.classes.values():
            for statement in cls.node.body.body:
                line = statement.body[0] if isinstance(statement, cst.SimpleStatementLine) else None
                if not (isinstance(line, cst.AnnAssign) and isinstance(line.target, cst.Name)):
                    continue
                if line.target.value != FLAG or line.value is None:
                    continue
                value: cst.BaseExpression | None = line.value
                if isinstance(value, cst.Call):
                    value = next(
                        (arg.value for arg in value.args if arg.keyword and arg.keyword.value == "default"), None
                    )
                if isinstance(value, cst.Name) and value.value in ("True", "False"):
                    default = value.value == "True"
                    step = module.step(line, cls.node, f"{cls.name}.{FLAG} defaults to {default}")
                    return default, replace(step, kind=StepKind.ASSIGN)
    return None


def _deciding_methods(ctx: SideContext, holder: Val) -> list[FunctionInfo]:
    """The methods of the holder's class that decide the norm: those calling an lm_head, else a
    forward returning a (logits state, passed-on state) pair made by a norm."""
    assert isinstance(holder.v, ObjRef)
    methods = [m for klass in ctx.evaluator.mro(holder.v.cls) for m in klass.methods.values()]
    heads = [m for m in methods if _HEAD_CALL.search(m.text) and "norm" in m.text]
    if heads:
        return heads
    return [m for m in methods if m.name == "forward" and "norm" in m.text and _returns_pair(m)]


def _returns_pair(method: FunctionInfo) -> bool:
    return any(
        isinstance(node, cst.Return) and isinstance(node.value, cst.Tuple) and len(node.value.elements) == 2
        for node in walk(method.node.body, lambda node: not isinstance(node, _NESTED))
    )


@dataclass
class _Reading:
    """Which names hold a normalized state, statement by statement, down the branch the flag selects."""

    ctx: SideContext
    holder: Val
    method: FunctionInfo
    normed: dict[str, bool] = field(default_factory=dict)
    head: tuple[bool, cst.CSTNode] | None = None
    returned: tuple[bool, bool, cst.CSTNode] | None = None
    flag: tuple[bool, cst.CSTNode] | None = None  # the flag's value and the test that read it
    default: Step | None = None  # where a config class declares the value a config without the key gets
    unknown: bool = False

    def run(self) -> NormUse | None:
        self._block(self.method.node.body.body)
        if self.unknown:
            self.ctx.note(f"how {self.method.qualname} uses the final norm was not read: {FLAG} is not known here")
            return None
        if self.returned is not None and self.head is None:
            head, passed_on, anchor = self.returned
        elif self.head is not None:
            params = [p.name.value for p in self.method.node.params.params if p.name.value != "self"]
            head, anchor = self.head
            passed_on = self.normed.get(params[0], False) if params else False
        else:
            return None
        module = self.method.module
        name = f"{self.method.owner.name if self.method.owner else ''}.{self.method.name}".lstrip(".")
        use = NormUse(head, passed_on, name)
        steps = [
            replace(
                module.step(
                    anchor,
                    self.method.node,
                    f"{name}: {use.describe()}",
                ),
                kind=StepKind.CALL,
            )
        ]
        if self.flag is not None:
            value, test = self.flag
            steps.append(replace(module.step(test, self.method.node, f"{FLAG} is {value} here"), kind=StepKind.TEST))
            config = self._config_step()
            if config is not None:
                steps.insert(0, config)
            if self.default is not None:
                steps.append(self.default)
        return replace(use, steps=tuple(steps))

    def _draft(self) -> DraftConfig:
        draft = self.ctx.declared_draft if self.ctx.side == "serving" else self.ctx.draft
        assert draft is not None
        return draft

    def _config_step(self) -> Step | None:
        draft = self._draft()
        for path in ((FLAG,), ("eagle_config", FLAG)):
            present, declared = draft.config.lookup(path)
            if present:
                return replace(draft.config.step(path, f"{'.'.join(path)} = {declared}"), kind=StepKind.CONFIG)
        return None

    def _block(self, statements) -> None:
        for statement in statements:
            self._statement(statement)

    def _statement(self, statement: cst.CSTNode) -> None:
        if isinstance(statement, cst.If):
            chosen = self._flag_value(statement.test)
            if chosen is None:
                self._block(statement.body.body)
                if isinstance(statement.orelse, cst.Else):
                    self._block(statement.orelse.body.body)
            elif chosen:
                self._block(statement.body.body)
            elif isinstance(statement.orelse, cst.Else):
                self._block(statement.orelse.body.body)
            elif isinstance(statement.orelse, cst.If):
                self._statement(statement.orelse)
            return
        if isinstance(statement, (cst.For, cst.While, cst.With)):
            self._block(statement.body.body)
            return
        if isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                self._small(small, statement)

    def _small(self, small: cst.CSTNode, line: cst.CSTNode) -> None:
        self._heads(small, line)
        if isinstance(small, cst.Assign):
            for target in small.targets:
                self._bind(target.target, small.value)
        elif isinstance(small, cst.Return) and isinstance(small.value, cst.Tuple):
            first, second = (element.value for element in small.value.elements[:2])
            if isinstance(second, cst.List) and len(second.elements) == 1:
                second = second.elements[0].value  # `[aux]`: one passed-on state per draft layer group
            self.returned = (self._value(first), self._value(second), line)

    def _heads(self, small: cst.CSTNode, line: cst.CSTNode) -> None:
        for node in walk(small, lambda node: not isinstance(node, _NESTED)):
            if isinstance(node, cst.Call) and (dotted_name(node.func) or "").endswith(".lm_head") and node.args:
                self.head = (self._value(node.args[0].value), line)

    def _bind(self, target: cst.BaseExpression, value: cst.BaseExpression) -> None:
        if isinstance(target, cst.Name):
            self.normed[target.value] = self._value(value)
        elif isinstance(target, (cst.Tuple, cst.List)):
            names = [element.value for element in target.elements]
            fused = _is_norm(value)  # a fused add-and-norm returns (normed sum, sum)
            for index, element in enumerate(names):
                if isinstance(element, cst.Name):
                    self.normed[element.value] = fused and index == 0

    def _value(self, expression: cst.BaseExpression) -> bool:
        if isinstance(expression, cst.Name):
            return self.normed.get(expression.value, False)
        if isinstance(expression, cst.IfExp):
            chosen = self._flag_value(expression.test)
            if chosen is None:
                return self._value(expression.body)
            return self._value(expression.body if chosen else expression.orelse)
        if isinstance(expression, cst.Call):
            return _is_norm(expression)
        if isinstance(expression, (cst.Subscript, cst.Attribute)):
            return self._value(expression.value)
        return False

    def _flag_value(self, test: cst.BaseExpression) -> bool | None:
        """The flag's value where `test` reads it (`self.norm_output`, `self.config.norm_output`),
        from the evaluated draft object; None for a test that does not read the flag."""
        chain = (dotted_name(test) or "").split(".")
        if chain[-1:] != [FLAG] or chain[0] != "self":
            return None
        value = self.holder
        for name in chain[1:]:
            value = self.ctx.evaluator.field(value, name)
        if not isinstance(value.v, bool) and value.v is not None and chain[-2:-1] == ["config"]:
            present, written = self._draft().config.lookup((FLAG,))  # the config object is the draft's
            if present and isinstance(written, bool):
                self.flag = (written, test)
                return written
        if not isinstance(value.v, bool) and value.v is not None:
            declared = _declared_default(self.ctx, self.method.module.relpath)
            if declared is None:
                self.unknown = True
                return None
            self.flag, self.default = (declared[0], test), declared[1]
            return declared[0]
        self.flag = (bool(value.v), test)
        return bool(value.v)


def _is_norm(expression: cst.BaseExpression) -> bool:
    if not isinstance(expression, cst.Call):
        return False
    callee = (dotted_name(expression.func) or "").rsplit(".", 1)[-1].lower()
    return "norm" in callee and "lm_head" not in callee
