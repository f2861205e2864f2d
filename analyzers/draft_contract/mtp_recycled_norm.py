"""Whether the state an MTP draft step passes on to the next is normalized as the target's state
that its first step is handed."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import libcst as cst

from rca.sdk import Analyzer, Compares, Drafting, Example, Fact, Finding, Reports, Severity, SideContext, Step
from rca.sdk.code import ClassInfo, FunctionInfo, dotted_name, guarded_statements, inherited_method, walk

_DEPTH = 5  # modules followed from the MTP model to the layer that makes its state
_LAUNCH = '--speculative-config \'{{"method": "mtp", "num_speculative_tokens": {steps}}}\''
_OVERRIDE = """
class SpeculativeConfig:
    @staticmethod
    def hf_config_override(hf_config):
        if hf_config.model_type in ("deepseek_v3", "deepseek_v32"):
            hf_config.model_type = "deepseek_mtp"
        if hf_config.model_type == "deepseek_mtp":
            hf_config.update({"architectures": ["DeepSeekMTPModel"]})
        return hf_config
"""
_TARGET_MODEL = """
class DeepseekV2Model(nn.Module):
    def __init__(self, config):
        self.norm = RMSNorm(config.hidden_size)

    def forward(self, input_ids, positions):
        hidden_states, residual = self.layers(input_ids, positions)
        hidden_states, _ = self.norm(hidden_states, residual)
        return hidden_states


class DeepseekV3ForCausalLM(nn.Module):
    def __init__(self, config):
        self.model = DeepseekV2Model(config)

    def forward(self, input_ids, positions):
        hidden_states = self.model(input_ids, positions)
        return hidden_states
"""
_MTP_MODEL = """
class SharedHead(nn.Module):
    def __init__(self, config):
        self.norm = RMSNorm(config.hidden_size)

    def forward(self, hidden_states):
        return self.norm(hidden_states)


class DeepSeekMultiTokenPredictorLayer(nn.Module):
    def __init__(self, config):
        self.hnorm = RMSNorm(config.hidden_size)
        self.shared_head = SharedHead(config)
        self.mtp_block = DecoderLayer(config)

    def forward(self, positions, previous_hidden_states):
        previous_hidden_states = self.hnorm(previous_hidden_states)
        hidden_states, residual = self.mtp_block(positions, previous_hidden_states)
        hidden_states = residual + hidden_states{marker}
        return {returned}


class DeepSeekMTP(nn.Module):
    def __init__(self, config):
        self.layers = nn.ModuleDict({{"61": DeepSeekMultiTokenPredictorLayer(config)}})

    def forward(self, positions, hidden_states, spec_step_idx=0):
        return self.layers[str(61 + spec_step_idx)](positions, hidden_states)
"""
_ARGS = """
def add_cli_args(parser):
    parser.add_argument("--speculative-config", type=json.loads)
"""
_FILES = {"engine/arg_utils.py": _ARGS, "config/speculative.py": _OVERRIDE, "models/deepseek_v2.py": _TARGET_MODEL}
_REGISTRY = 'MODELS = {"DeepSeekMTPModel": ("deepseek_mtp", "DeepSeekMTP")}'
_TARGET = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "model_type": "deepseek_v3",
    "num_hidden_layers": 61,
    "num_nextn_predict_layers": 1,
}


def _files(returned: str, finding: str = "") -> dict[str, str]:
    model = _MTP_MODEL.format(returned=returned, marker=f"  # finding: {finding}" if finding else "")
    return {**_FILES, "models/registry.py": _REGISTRY, "models/deepseek_mtp.py": model}


@dataclass(frozen=True)
class _State:
    """A hidden state as one side's code makes it: normalized or not, and the statement that made it."""

    normed: bool
    statement: cst.CSTNode
    function: FunctionInfo

    def step(self, note: str) -> Step:
        return self.function.module.step(self.statement, self.function.node, note)


@dataclass(frozen=True)
class _Pair:
    """A forward's (logits state, passed-on state): the engine scores the first and hands the
    second to the next draft step."""

    logits: _State
    passed_on: _State


_Value = _State | _Pair


class MtpRecycledNorm(Analyzer):
    """Whether each MTP draft step after the first is handed a state normalized as the one the
    target hands the first.

    ## What it reads
    For a launch that drafts with the target's own MTP layers, the MTP model the engine builds for
    the target (the architecture its draft-config rewrite assigns where a test names the target's
    `model_type` or architecture: vLLM's `SpeculativeConfig.hf_config_override`, SGLang's draft
    `ModelConfig`), and, following its `forward` through the modules it calls, the state it returns
    for the next step: of a `(logits, passed-on)` pair the second (what vLLM's proposer feeds back),
    of a single state that one, of a logits processor's output the state it was given (SGLang's
    `LogitsProcessorOutput.hidden_states`). A state is normalized where it was last made by a call
    of a norm (`self.norm(...)`, `self.shared_head.norm(...)`, a module whose forward returns one).
    The same reading of the target model's `forward` gives the state its first step is handed;
    the launch gives how many steps are chained (`num_speculative_tokens`, `--speculative-num-steps`).

    ## Why it matters
    The MTP layer was trained on the target's final state, normalized by its final norm, and its
    first draft step is handed that. Each later step is handed the layer's own output instead: an
    engine that passes on the state before the MTP layer's final norm (`shared_head.norm`) gives
    every later step states of another scale per channel (the norm's rescale is idempotent, its
    per-channel weight is not), and acceptance collapses after the first draft position with no
    error (vLLM's GLM and DeepSeek MTP before vllm#45895 and #47448).
    """

    code = "RCA-D114"
    name = "mtp-recycled-norm"
    sides = frozenset({"serving"})
    # no anchors: it reads the engine's draft-config rewrite and the MTP model it names, never evaluates them
    drafting = frozenset({Drafting.OWN_LAYERS})
    compares = Compares(
        training="the state the MTP layer was trained on: the target's final state, as the target model hands it to "
        "the first draft step",
        serving="the state the engine's MTP model passes on to each later draft step",
    )
    reports = (
        Reports("mtp-recycled-norm-differs", hypothesis="mtp-recycled-norm-differs", severity=Severity.CAUSE),
        Reports("mtp-recycled-norm-may-differ", hypothesis="mtp-recycled-norm-differs", severity=Severity.WARNING),
    )
    VALID = (
        Example(
            files=_files("hidden_states, self.shared_head(hidden_states)"),
            target=_TARGET,
            settings=_LAUNCH.format(steps=3),
            why="the MTP layer passes on its state after its final norm, as the target hands its first step",
        ),
        Example(
            files=_files("hidden_states"),
            target=_TARGET,
            settings=_LAUNCH.format(steps=1),
            why="one draft step: no state is passed on, whatever the layer returns",
        ),
    )
    INVALID = (
        Example(
            files=_files("hidden_states", "mtp-recycled-norm-differs"),
            target=_TARGET,
            settings=_LAUNCH.format(steps=3),
            finding="mtp-recycled-norm-differs",
            path="models/deepseek_mtp.py",
            message=(
                "each of the 2 MTP draft steps after the first is handed the state DeepSeekMultiTokenPredictorLayer."
                "forward returns before any final norm, but the first is handed the target's state after its final "
                "norm (DeepseekV2Model.forward), the state the MTP layer was trained on: every later draft position "
                "sees states of another scale per channel"
            ),
            why="vLLM's DeepSeek MTP before the fix: the pre-norm state recycled, the step 0 state post-norm",
        ),
        Example(
            files=_files("hidden_states", "mtp-recycled-norm-may-differ"),
            target=_TARGET,
            settings='--speculative-config \'{"method": "mtp"}\'',
            finding="mtp-recycled-norm-may-differ",
            path="models/deepseek_mtp.py",
            message=(
                "each MTP draft step after the first is handed the state DeepSeekMultiTokenPredictorLayer.forward "
                "returns before any final norm, but the first is handed the target's state after its final norm "
                "(DeepseekV2Model.forward), the state the MTP layer was trained on: every later draft position sees "
                "states of another scale per channel, if the launch chains more than one draft step (it does not say "
                "how many)"
            ),
            why="the launch does not say how many steps it chains: the difference matters from the second on",
        ),
    )

    def applies_to(self, ctx: SideContext) -> bool:
        return ctx.target.mtp_layers() is not None

    def run(self, ctx: SideContext) -> Iterator[Fact | Finding]:
        assert ctx.settings is not None
        steps = ctx.settings.draft_steps()
        if steps is not None and steps[0] <= 1:
            return  # one draft step per verification: no state is passed on
        built = _mtp_class(ctx)
        if built is None:
            ctx.note(
                "which MTP model the engine builds for the target was not read (no draft-config rewrite names its "
                f"architecture, {ctx.target.architectures[0]}): the state its later draft steps are handed is unchecked"
            )
            return
        cls, rewrite = built
        recycled = _returned(ctx, cls, _DEPTH)
        first = next((_returned(ctx, found, _DEPTH) for found in _target_classes(ctx)), None)
        if recycled is None or first is None:
            which = cls.name if recycled is None else f"the target's {ctx.target.architectures[0]}"
            ctx.note(f"the state {which} returns was not read: the state later MTP draft steps are handed is unchecked")
            return
        passed_on = recycled.passed_on if isinstance(recycled, _Pair) else recycled
        given = first.logits if isinstance(first, _Pair) else first
        if passed_on.normed == given.normed:
            ctx.note(
                f"each MTP draft step after the first is handed {_form(passed_on)} ({_holder(passed_on)}), as the "
                f"first is handed the target's ({_holder(given)})"
            )
            return
        later = (
            f"each of the {steps[0] - 1} MTP draft steps after the first"
            if steps
            else "each MTP draft step after the first"
        )
        message = (
            f"{later} is handed the state {_holder(passed_on)} returns {_form(passed_on, short=True)}, but the first "
            f"is handed the target's state {_form(given, short=True)} ({_holder(given)}), the state the MTP layer was "
            "trained on: every later draft position sees states of another scale per channel"
        )
        cited = (
            rewrite,
            given.step(f"{_holder(given)} hands the first step {_form(given)}"),
            passed_on.step(f"{_holder(passed_on)} passes {_form(passed_on)} on to the next step"),
        )
        state = "after its final norm" if given.normed else "as the target hands it"
        fix = (
            f"serve on an engine release whose MTP model for this target passes its state on {state} (rca diagnose "
            f"--serving on that release says whether it does), or chain one draft step only (vLLM: "
            "num_speculative_tokens 1; SGLang: --speculative-num-steps 1)"
        )
        if steps is None:
            yield self.finding(
                ctx,
                "mtp-recycled-norm-may-differ",
                f"{message}, if the launch chains more than one draft step (it does not say how many)",
                passed_on.step("").location,
                likelihood_ratio=2.0,
                steps=cited,
                fix=f"{fix}; or say the number of draft steps in the launch",
            )
            return
        yield self.finding(
            ctx,
            "mtp-recycled-norm-differs",
            message,
            passed_on.step("").location,
            likelihood_ratio=20.0,
            steps=(*cited, steps[1].step),
            fix=fix,
        )


def _form(state: _State, short: bool = False) -> str:
    if short:
        return "after its final norm" if state.normed else "before any final norm"
    return "the state after its final norm" if state.normed else "the state before its final norm"


def _holder(state: _State) -> str:
    return state.function.qualname


def _target_classes(ctx: SideContext) -> Iterator[ClassInfo]:
    for name in ctx.target.architectures:
        found = ctx.find_class(name)
        if found is not None:
            yield found


def _mtp_class(ctx: SideContext) -> tuple[ClassInfo, Step] | None:
    """The class the engine builds as the target's MTP model: the architecture a draft-config
    rewrite assigns under a test that names the target's `model_type` or architecture (following a
    `model_type` it rewrites to on to the tests that name that), with the statement, cited."""
    assert ctx.index is not None
    model_type = str(ctx.target.config.data.get("model_type") or "")
    names = [name for name in (*ctx.target.architectures[:1], model_type) if name]
    needles = [f'"{name}"' for name in names]
    for relpath in sorted({path for paths in ctx.tree.grep(needles).values() for path in paths}):
        ctx.index.allow(relpath)
        module = ctx.index.load(relpath)
        if module is None:
            continue
        for function in module.all_functions:
            if "architectures" not in function.text or not any(needle in function.text for needle in needles):
                continue
            for name, statement in _rewrites(function, set(names), model_type):
                found = ctx.find_class(name)
                if found is not None and inherited_method(ctx, found, "forward") is not None:
                    step = module.step(statement, function.node, f"the engine builds the target's MTP model as {name}")
                    return found, step
    return None


def _rewrites(function: FunctionInfo, names: set[str], model_type: str) -> Iterator[tuple[str, cst.CSTNode]]:
    """The architectures `function` assigns under a test naming one of `names` (a `model_type` it
    assigns there joins them), in order, with the statement assigning each."""
    for statement, _, guards in guarded_statements(function):
        if not any(
            taken and any(f'"{name}"' in test or f"'{name}'" in test for name in names) for test, taken in guards
        ):
            continue
        for small in statement.body:
            if isinstance(small, cst.Assign) and isinstance(small.value, cst.SimpleString):
                target = small.targets[0].target
                value = small.value.evaluated_value
                if isinstance(target, cst.Attribute) and target.attr.value == "model_type" and isinstance(value, str):
                    names.add(value)
                elif (
                    isinstance(target, cst.Subscript)
                    and (dotted_name(target.value) or "").endswith("architectures")
                    and isinstance(value, str)
                ):
                    yield value, statement
        for element in walk(statement):
            if not (
                isinstance(element, cst.DictElement)
                and isinstance(element.key, cst.SimpleString)
                and element.key.evaluated_value == "architectures"
                and isinstance(element.value, cst.List)
                and element.value.elements
            ):
                continue
            chosen = _chosen(element.value.elements[0].value, function, model_type)
            if chosen is not None:
                yield chosen, statement


def _chosen(value: cst.BaseExpression, function: FunctionInfo, model_type: str) -> str | None:
    """An architecture name written as a string, or as `"A" if flag else "B"` where `flag` is
    assigned in the function from a test of `model_type` against strings."""
    if isinstance(value, cst.SimpleString):
        name = value.evaluated_value
        return name if isinstance(name, str) else None
    if not (isinstance(value, cst.IfExp) and isinstance(value.test, cst.Name)):
        return None
    for statement, _, _ in guarded_statements(function):
        for small in statement.body:
            if (
                isinstance(small, cst.Assign)
                and isinstance(small.targets[0].target, cst.Name)
                and small.targets[0].target.value == value.test.value
                and isinstance(small.value, cst.Comparison)
                and (dotted_name(small.value.left) or "").endswith("model_type")
            ):
                strings = {
                    node.evaluated_value
                    for node in walk(small.value.comparisons[0])
                    if isinstance(node, cst.SimpleString)
                }
                holds = model_type in strings
                if isinstance(small.value.comparisons[0].operator, (cst.NotIn, cst.NotEqual)):
                    holds = not holds
                return _chosen(value.body if holds else value.orelse, function, model_type)
    return None


def _returned(ctx: SideContext, cls: ClassInfo, depth: int) -> _Value | None:
    """What the forward an instance of `cls` runs returns, read statement by statement (every
    branch taken, later bindings winning), following the calls of its own modules."""
    if depth <= 0:
        return None
    _allow_bases(ctx, cls, _DEPTH)
    method = inherited_method(ctx, cls, "forward")
    if method is None:
        return None
    bound: dict[str, _Value] = {}
    # each return: what it returns (None: not read), whether a test guards it, whether it scores
    returned: list[tuple[_Value | None, bool, bool]] = []
    for statement, _, guards in guarded_statements(method):
        for small in statement.body:
            if isinstance(small, cst.Return) and small.value is not None:
                value = _value(ctx, cls, method, statement, small.value, bound, depth)
                returned.append((value, bool(guards), _scores(small.value)))
            elif isinstance(small, (cst.Assign, cst.AnnAssign)) and small.value is not None:
                value = _value(ctx, cls, method, statement, small.value, bound, depth)
                target = small.targets[0].target if isinstance(small, cst.Assign) else small.target
                _bind(target, value, statement, method, bound)
    # where some return hands a logits processor its state, one of those (generation, not pooling);
    # of them the last that no test guards (the last pipeline stage's, a batch not idle's), else the last
    if any(scores for _, _, scores in returned):
        returned = [entry for entry in returned if entry[2]]
    read = [(value, guarded) for value, guarded, _ in returned if value is not None]
    unguarded = [value for value, guarded in read if not guarded]
    chosen = unguarded or [value for value, _ in read]
    return chosen[-1] if chosen else None


def _bind(
    target: cst.BaseExpression, value: _Value | None, statement: cst.CSTNode, method: FunctionInfo, bound: dict
) -> None:
    """Bind names to a value: of a tuple of names, the first to the state (a norm's `(normed,
    residual)`) and the rest to states that are not normalized, or each to its element of a pair."""
    if isinstance(target, cst.Name):
        if value is not None:
            bound[target.value] = value
        else:
            bound.pop(target.value, None)
        return
    if not isinstance(target, (cst.Tuple, cst.List)):
        return
    names = [element.value for element in target.elements]
    parts: list[_Value | None]
    if isinstance(value, _Pair) and len(names) == 2:
        parts = [value.logits, value.passed_on]
    else:
        rest = _State(False, statement, method) if value is not None else None
        parts = [value.logits if isinstance(value, _Pair) else value, *[rest] * (len(names) - 1)]
    for name, part in zip(names, parts, strict=True):
        _bind(name, part, statement, method, bound)


def _value(
    ctx: SideContext,
    cls: ClassInfo,
    method: FunctionInfo,
    statement: cst.CSTNode,
    expression: cst.BaseExpression,
    bound: dict[str, _Value],
    depth: int,
) -> _Value | None:
    """The state an expression makes, where it is one the reading follows."""
    if isinstance(expression, cst.Name):
        return bound.get(expression.value)
    if isinstance(expression, cst.Subscript) and isinstance(expression.value, cst.Name):
        return bound.get(expression.value.value)  # a slice of a state: as normalized as the state
    if isinstance(expression, cst.Tuple) and len(expression.elements) == 2:
        first, second = (
            _value(ctx, cls, method, statement, element.value, bound, depth) for element in expression.elements
        )
        if isinstance(first, _State) and isinstance(second, _State):
            return _Pair(first, second)
        return None
    if isinstance(expression, cst.BinaryOperation):
        return _State(False, statement, method)
    if not isinstance(expression, cst.Call):
        return None
    callee = expression.func.value if isinstance(expression.func, cst.Subscript) else expression.func
    name = dotted_name(callee) or ""
    last = name.rsplit(".", 1)[-1]
    if "norm" in last.lower():
        return _State(True, statement, method)
    if name.startswith("self.") and name.count(".") == 1:
        if "logits" in last:  # a logits processor's output carries the state it was given
            given = [arg.value.value for arg in expression.args if isinstance(arg.value, cst.Name)]
            return next((bound[name] for name in given if name in bound), None)
        inner = _module_class(ctx, cls, last)
        if inner is None:
            return _State(False, statement, method)  # a module the reading does not follow: a projection, a block
        return _returned(ctx, inner, depth - 1)
    argument = expression.args[0].value if expression.args else None
    if isinstance(argument, cst.Name) and argument.value in bound:
        return bound[argument.value]  # a function of a state (a gather, a chunk): as normalized as the state
    return None  # another function's result: not a state the reading follows


def _scores(expression: cst.BaseExpression) -> bool:
    """Whether an expression calls a logits processor (the state serving reads is the one it is given)."""
    return isinstance(expression, cst.Call) and "logits" in (dotted_name(expression.func) or "")


def _module_class(ctx: SideContext, cls: ClassInfo, attribute: str) -> ClassInfo | None:
    """The class of the module a constructor assigns to `self.<attribute>` (the first class built
    in the assignment that has a forward: `ModuleDict({...: Layer(config)})` gives `Layer`, and
    `self.model_cls(...)` the class the class attribute `model_cls` names)."""
    for klass in ctx.evaluator.mro(cls):
        init = klass.methods.get("__init__")
        if init is None:
            continue
        for statement, _, _ in guarded_statements(init):
            for small in statement.body:
                if not isinstance(small, cst.Assign) or dotted_name(small.targets[0].target) != f"self.{attribute}":
                    continue
                for node in walk(small.value):
                    built = _built_class(ctx, cls, klass, node) if isinstance(node, cst.Call) else None
                    if built is not None and inherited_method(ctx, built, "forward") is not None:
                        return built
    return None


def _built_class(ctx: SideContext, cls: ClassInfo, klass: ClassInfo, call: cst.Call) -> ClassInfo | None:
    """The class a call builds: a name, or `self.<class attribute>` naming one."""
    if isinstance(call.func, cst.Name):
        return _named_class(ctx, klass, call.func.value)
    name = dotted_name(call.func) or ""
    if name.startswith("self.") and name.count(".") == 1:
        for owner in ctx.evaluator.mro(cls):
            value = owner.attributes.get(name[5:])
            if isinstance(value, cst.Name):
                return _named_class(ctx, owner, value.value)
    return None


def _named_class(ctx: SideContext, where: ClassInfo, name: str) -> ClassInfo | None:
    """The class `name` means in the module of `where`: its own, the one it imports, else the
    class of that name the side's code defines."""
    assert ctx.index is not None
    module = where.module
    if name in module.classes:
        return module.classes[name]
    binding = module.imports.get(name)
    if binding is not None and binding.attr is not None:
        relpath = ctx.index.resolve(binding.module)
        if relpath is not None:
            ctx.index.allow(relpath)
            imported = ctx.index.load(relpath)
            if imported is not None and binding.attr in imported.classes:
                return imported.classes[binding.attr]
    return ctx.find_class(name)


def _allow_bases(ctx: SideContext, cls: ClassInfo, depth: int) -> None:
    """Let the modules defining the class's bases be read (a model whose forward it inherits:
    SGLang's `Glm4MoeModel(DeepseekV2Model)`)."""
    assert ctx.index is not None
    for base in cls.base_expressions:
        binding = cls.module.imports.get(dotted_name(base) or "")
        relpath = ctx.index.resolve(binding.module) if binding is not None else None
        if relpath is None or not depth:
            continue
        ctx.index.allow(relpath)
        module = ctx.index.load(relpath)
        if module is not None and binding is not None and binding.attr in module.classes:
            _allow_bases(ctx, module.classes[binding.attr], depth - 1)
