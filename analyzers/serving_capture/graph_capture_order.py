"""Whether device graphs are captured with the default layers before the configured ids arrive."""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst

from rca.sdk import Analyzer, CaptureSet, Example, Fact, Finding, IdsOrigin, Reports, SideContext, Step, StepKind
from rca.sdk.code import FunctionInfo, calls_named, inherited_method, walk
from rca.sdk.engines import HANDOFFS
from rca.sdk.examples import DEFAULTS_MODEL, DRAFT_IDS_0_3_5, SMALL_TARGET

MAX_DEPTH = 4  # how many calls deep the search for a no-ids hand-off goes

_RUNNER = """
from graph_runner import CudaGraphRunner


class ModelRunner:
    def initialize(self):
        self.load_model()
        self.init_cuda_graphs()
        self.model.set_eagle3_layers_to_capture(self.draft_config.eagle_config["eagle_aux_hidden_state_layer_ids"])

    def init_cuda_graphs(self):
        self.graph_runner = CudaGraphRunner(self)
"""

_HANDOFF = (
    'self.model.set_eagle3_layers_to_capture(self.draft_config.eagle_config["eagle_aux_hidden_state_layer_ids"])\n'
)
_RUNNER_FIXED = _RUNNER.replace(  # the ids handed over before the graphs are captured
    "        self.init_cuda_graphs()\n        " + _HANDOFF, "        " + _HANDOFF + "        self.init_cuda_graphs()\n"
)

_GRAPH_RUNNER = """
class CudaGraphRunner:
    def __init__(self, model_runner):
        self.model_runner = model_runner
        if model_runner.is_eagle3:
            self.model_runner.model.set_eagle3_layers_to_capture()
        self.capture()
"""


class GraphCaptureOrder(Analyzer):
    """Finds device graphs captured with the model's default layers before the config's ids are set.

    ## What it reads
    Calls of the capture hand-off with no ids (SGLang's CUDA-graph runner and dummy run call
    `set_eagle3_layers_to_capture()` to size their buffers), and whether the function that hands
    over the configured ids calls into one of them first: its calls before the hand-off are
    followed (methods through the class's bases, module and imported functions, constructors,
    also of classes only named, as in a table of graph runners), a few calls deep.

    ## Why it matters
    A graph records the capture set it was captured with. Batches replayed from graphs (decode,
    target verify) keep capturing the defaults; only eager batches (prefill) use the config's ids.
    SGLang 0.4.10 to 0.5.10 capture graphs before applying the ids; 0.5.16 applies them first.

    ## Finding
    `graphs-captured-before-ids`: evidence for `graph-captured-defaults`.
    """

    code = "RCA-S105"
    name = "graph-capture-order"
    sides = frozenset({"serving"})
    anchors = HANDOFFS
    requires = (CaptureSet,)
    reports = (Reports("graphs-captured-before-ids", hypothesis="graph-captured-defaults"),)

    VALID = (
        Example(
            files={"runner.py": _RUNNER_FIXED, "graph_runner.py": _GRAPH_RUNNER, "model.py": DEFAULTS_MODEL},
            target=SMALL_TARGET,
            draft=DRAFT_IDS_0_3_5,
            captured=("h1", "h4", "h6"),
            why="graphs captured after the ids are set record the configured layers",
        ),
    )
    INVALID = (
        Example(
            files={"runner.py": _RUNNER, "graph_runner.py": _GRAPH_RUNNER, "model.py": DEFAULTS_MODEL},
            target=SMALL_TARGET,
            draft=DRAFT_IDS_0_3_5,
            captured=("h1", "h4", "h6"),
            finding="graphs-captured-before-ids",
            message=(
                "ModelRunner.init_cuda_graphs -> CudaGraphRunner.__init__ (called at runner.py:8) reaches "
                "graph_runner.py:6: each sets the capture to the model's defaults before runner.py:9 hands over "
                "the configured ids, and graphs captured then keep capturing the defaults"
            ),
            path="runner.py",
            line=8,
            why="init_cuda_graphs() runs the graph runner's no-ids hand-off before the config's ids are applied",
        ),
    )

    def run(self, ctx: SideContext) -> Iterator[Fact | Finding]:
        capture = ctx.fact(CaptureSet)
        assert capture is not None and ctx.index is not None
        if capture.delivery is None or capture.ids_origin is not IdsOrigin.CONFIG:
            return
        defaults = {
            id(function.node): (function, call)
            for name in HANDOFFS
            for function, call in calls_named(ctx, name, outside_definitions=True)
            if not call.args
        }
        if not defaults:
            return
        handoff = self._handoff_site(ctx, capture)
        if handoff is None:
            return
        function, _ = handoff
        delivery_line = capture.delivery.location.line
        routes: list[tuple[Step, Step, str]] = []
        for node, callee in _callees(ctx, function):
            location = function.module.location(node, function.node)
            if location.line >= delivery_line:
                break
            chain = _path_to(ctx, callee, defaults, MAX_DEPTH, set())
            if chain is None or any(route == " -> ".join(link.qualname for link in chain) for _, _, route in routes):
                continue
            site_function, site_call = defaults[id(chain[-1].node)]
            default_step = site_function.module.step(
                site_call, site_function.node, "hands over no ids: the model captures its default layers"
            )
            route = " -> ".join(link.qualname for link in chain)
            routes.append(
                (
                    Step(
                        location,
                        f"runs {route} before the ids are handed over",
                        function.module.code(location.line, location.end_line),
                        StepKind.CALL,
                    ),
                    default_step,
                    route,
                )
            )
        if not routes:
            return
        described = "; ".join(
            f"{route} (called at {first.location}) reaches {default.location}" for first, default, route in routes
        )
        yield self.finding(
            ctx,
            "graphs-captured-before-ids",
            f"{described}: each sets the capture to the model's defaults before {capture.delivery.location} hands "
            f"over the configured ids, "
            "and graphs captured then keep capturing the defaults",
            routes[0][0].location,
            likelihood_ratio=20.0,
            steps=(*(step for first, default, _ in routes for step in (first, default)), capture.delivery),
        )

    def _handoff_site(self, ctx: SideContext, capture: CaptureSet) -> tuple[FunctionInfo, cst.Call] | None:
        assert capture.delivery is not None
        for name in HANDOFFS:
            for function, call in calls_named(ctx, name, outside_definitions=True):
                if call.args and function.module.location(call, function.node) == capture.delivery.location:
                    return function, call
        return None


def _path_to(
    ctx: SideContext, function: FunctionInfo, targets: dict[int, tuple], depth: int, seen: set[int]
) -> list[FunctionInfo] | None:
    """The calls from `function` to one of `targets`, at most `depth` deep, or None."""
    if id(function.node) in targets:
        return [function]
    if depth == 0 or id(function.node) in seen:
        return None
    seen.add(id(function.node))
    for _, callee in _callees(ctx, function):
        rest = _path_to(ctx, callee, targets, depth - 1, seen)
        if rest is not None:
            return [function, *rest]
    return None


def _callees(ctx: SideContext, function: FunctionInfo) -> Iterator[tuple[cst.CSTNode, FunctionInfo]]:
    """What the function's code calls, in source order: `self.method(...)` through the class's
    bases, module functions and imported ones, and classes (their `__init__`), also when only
    named (a table of classes to construct)."""
    assert ctx.index is not None
    nested = (cst.FunctionDef, cst.ClassDef)
    for node in walk(function.node.body, lambda node: not isinstance(node, nested)):
        if (
            isinstance(node, cst.Call)
            and isinstance(node.func, cst.Attribute)
            and isinstance(node.func.value, cst.Name)
            and node.func.value.value == "self"
        ):
            if function.owner is not None:
                for klass in ctx.evaluator.mro(function.owner):
                    method = klass.methods.get(node.func.attr.value)
                    if method is not None:
                        yield node, method
                        break
        elif isinstance(node, cst.Name):
            target = _global(ctx, function, node.value)
            if target is not None:
                yield node, target


def _global(ctx: SideContext, function: FunctionInfo, name: str) -> FunctionInfo | None:
    """A module-level name as a function to descend into: a function, or a class's `__init__`."""
    assert ctx.index is not None
    module = function.module
    found = module.functions.get(name) or module.classes.get(name)
    binding = module.imports.get(name)
    if found is None and binding is not None and binding.attr is not None:
        imported = ctx.index.module_by_name(binding.module)
        if imported is not None:
            found = imported.functions.get(binding.attr) or imported.classes.get(binding.attr)
    if isinstance(found, FunctionInfo):
        return found
    if found is not None:
        return inherited_method(ctx, found, "__init__")
    return None
