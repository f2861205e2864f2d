"""The symbolic evaluator on small programs: what it concludes, and where it says it did."""

from __future__ import annotations

import textwrap
from pathlib import Path

import libcst as cst
import pytest

from rca.inputs.configs import load_config
from rca.inputs.sources import SourceTree
from rca.static.codeindex import CodeIndex, call_name, iter_calls
from rca.static.evaluate.interp import Evaluator
from rca.static.evaluate.values import (
    ConfigObj,
    EvalRaise,
    FuncRef,
    MutDict,
    MutList,
    ObjRef,
    Opaque,
    TensorVal,
    Val,
    describe,
)
from rca.static.graph import DataflowGraph
from tests.conftest import write_json, write_tree


def evaluator(
    tmp_path: Path, code: str, draft: dict | None = None, target: dict | None = None
) -> tuple[Evaluator, CodeIndex]:
    root = write_tree(tmp_path / "src", {"mod.py": textwrap.dedent(code)})
    index = CodeIndex(SourceTree("serving", "test", root))
    draft_file = load_config("draft", write_json(tmp_path / "draft.json", draft)) if draft is not None else None
    target_file = load_config("target", write_json(tmp_path / "target.json", target or {"num_hidden_layers": 8}))
    return Evaluator(
        index,
        DataflowGraph(),
        num_layers=(target or {}).get("num_hidden_layers", 8),
        target=target_file,
        draft=draft_file,
    ), index


def call_args(ev: Evaluator, index: CodeIndex, cls: str, method: str, callee: str) -> list[Val]:
    function = index.load("mod.py").classes[cls].methods[method]
    call = next(c for c in iter_calls(function.node) if call_name(c) == callee)
    result = ev.run_to(function, call, Val(ObjRef(function.owner)))
    assert result.reached, result.reason
    return result.args[0]


RUNNER = """
class Runner:
    def __init__(self, args):
        self.ids = "unset"
        if self.algorithm.is_eagle3():
            draft = self._load(args)
            try:
                eagle_config = getattr(draft.hf_config, "eagle_config", None)
                self.ids = eagle_config["eagle_aux_hidden_state_layer_ids"]
            except:
                self.ids = None

    def capture(self):
        self.model.set_layers(self.ids)
"""


def test_field_read_through_goal_directed_init(tmp_path: Path) -> None:
    ev, index = evaluator(tmp_path, RUNNER, draft={"eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 30, 58]}})
    [ids] = call_args(ev, index, "Runner", "capture", "set_layers")
    assert describe(ids) == "[2, 30, 58]"
    assert not ev.events.handled
    config = [key for key in ev.graph.ancestors(next(iter(ids.src))) if key.kind == "config"]
    assert {key.location.line for key in config} >= {3}  # the key's line in the draft config


def test_silent_fallback_is_recorded_with_its_handler(tmp_path: Path) -> None:
    ev, index = evaluator(tmp_path, RUNNER, draft={"eagle_aux_hidden_state_layer_ids": [2, 30, 58]})
    [ids] = call_args(ev, index, "Runner", "capture", "set_layers")
    assert ids.v is None
    [event] = ev.events.handled
    assert event.kind == "TypeError"
    assert (event.handled_at.path, event.handled_at.line) == ("mod.py", 10)
    assert set(ev.graph.keypaths(event.sources)) == {
        ("eagle_config", "eagle_aux_hidden_state_layer_ids"),
        ("eagle_config",),
    }


def test_reaching_definition_follows_the_branch_taken(tmp_path: Path) -> None:
    code = """
    class Gen:
        def __init__(self, config, layer_ids=None):
            if hasattr(config, "num_hidden_layers"):
                n = config.num_hidden_layers
            elif hasattr(config, "text_config"):
                n = config.text_config.num_hidden_layers
            else:
                raise ValueError("no layers")
            if layer_ids is None:
                self.layer_ids = [2, n // 2, n - 3, n - 1]
            else:
                self.layer_ids = layer_ids
    """
    for target, expected in (
        ({"num_hidden_layers": 32}, "[2, 16, 29, 31]"),
        ({"text_config": {"num_hidden_layers": 61}}, "[2, 30, 58, 60]"),
    ):
        ev, index = evaluator(tmp_path, code, target=target)
        cls = index.load("mod.py").classes["Gen"]
        gen = ev.new_object(cls, [Val(ConfigObj(ev.target))], {})
        assert describe(ev.field(gen, "layer_ids")) == expected


def test_explicit_argument_takes_the_other_store(tmp_path: Path) -> None:
    code = """
    class Gen:
        def __init__(self, layer_ids=None):
            if layer_ids is None:
                self.layer_ids = [1, 2]
            else:
                self.layer_ids = layer_ids
    """
    ev, index = evaluator(tmp_path, code)
    cls = index.load("mod.py").classes["Gen"]
    assert describe(ev.field(ev.new_object(cls, [], {}), "layer_ids")) == "[1, 2]"
    chosen = Val(MutList([Val(5), Val(7)]))
    assert describe(ev.field(ev.new_object(cls, [chosen], {}), "layer_ids")) == "[5, 7]"


def test_transform_through_helpers_and_comprehensions(tmp_path: Path) -> None:
    code = """
    OFFSET = 1

    def shift(ids, by=OFFSET):
        return sorted({i + by for i in ids if i >= 0})

    class Model:
        def set_layers(self, layer_ids):
            self.capture = shift(layer_ids) + [x * 2 for x in range(2)]
    """
    ev, index = evaluator(tmp_path, code)
    model = Val(ObjRef(index.load("mod.py").classes["Model"]))
    ev.call(ev.field(model, "set_layers"), [Val(MutList([Val(30), Val(-1), Val(2)]))])
    assert describe(model.v.fields["capture"]) == "[3, 31, 0, 2]"


def test_super_init_passes_the_config_to_the_base(tmp_path: Path) -> None:
    code = """
    class Base:
        def __init__(self, config, prefix=""):
            self.config = config

    class Child(Base):
        def __init__(self, config):
            super().__init__(config.text_config, prefix="model")
    """
    ev, index = evaluator(tmp_path, code, target={"text_config": {"num_hidden_layers": 61}})
    child = ev.new_object(index.load("mod.py").classes["Child"], [Val(ConfigObj(ev.target))], {})
    config = ev.field(ev.field(child, "config"), "num_hidden_layers")
    assert config.v == 61


CAPTURE = "if i in self.at:\n    aux.append({captured})"
LAYER = "h, r = self.layers[i](h, r)"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ((CAPTURE.format(captured="h + r"), LAYER), "[h2, h5]"),
        ((LAYER, CAPTURE.format(captured="h + r")), "[h3, h6]"),
        ((LAYER, CAPTURE.format(captured="h")), "[h3-residual, h6-residual]"),
        ((LAYER, CAPTURE.format(captured="(r + h).clone()")), "[h3, h6]"),
    ],
    ids=["before-layer", "after-layer", "residual-missing", "sum-reordered"],
)
def test_capture_position_decides_the_tap(tmp_path: Path, body: tuple[str, str], expected: str) -> None:
    loop = textwrap.indent("\n".join(body), " " * 12)
    code = (
        "class Model:\n"
        "    def forward(self, input_ids):\n"
        "        h = self.embed_tokens(input_ids)\n"
        "        r = None\n"
        "        aux = []\n"
        "        for i in range(self.start_layer, self.end_layer):\n"
        f"{loop}\n"
        "        return aux\n"
    )
    ev, index = evaluator(tmp_path, code)
    model = Val(ObjRef(index.load("mod.py").classes["Model"], fields={"at": Val(MutList([Val(2), Val(5)]))}))
    out = ev.call(ev.field(model, "forward"), [Val(Opaque("input_ids"))])
    assert describe(out) == expected


def test_capture_before_the_first_layer_without_residual_raises(tmp_path: Path) -> None:
    code = """
    class Model:
        def forward(self, ids):
            h = self.embed_tokens(ids)
            r = None
            aux = []
            for i in range(4):
                if i in self.at:
                    aux.append(h + r)
                h, r = self.layers[i](h, r)
            return aux
    """
    ev, index = evaluator(tmp_path, code)
    model = Val(ObjRef(index.load("mod.py").classes["Model"], fields={"at": Val(MutList([Val(0)]))}))
    with pytest.raises(EvalRaise) as raised:
        ev.call(ev.field(model, "forward"), [Val(Opaque("ids"))])
    assert raised.value.kind == "TypeError" and raised.value.location.line == 9


def test_unknown_condition_takes_the_branch_that_does_not_raise(tmp_path: Path) -> None:
    code = """
    def pick(model):
        if hasattr(model, "language_model"):
            base = model.language_model
        elif hasattr(model, "model"):
            base = model.model
        else:
            raise AttributeError("no base model")
        return base
    """
    ev, index = evaluator(tmp_path, code)
    out = ev.call(Val(FuncRef(index.load("mod.py").functions["pick"])), [Val(Opaque("model"))])
    assert isinstance(out.v, Opaque) and out.v.hint == "model"
    assert any("the other branch raises" in ev.graph.g.nodes[key]["note"] for key in ev.events.assumptions)


def test_hf_output_hidden_states_indexing(tmp_path: Path) -> None:
    code = """
    import torch
    from transformers import AutoModelForCausalLM

    def features(batch):
        model = AutoModelForCausalLM.from_pretrained("x")
        hs = model(**batch, output_hidden_states=True).hidden_states
        return torch.cat([hs[0], hs[3], hs[-1]], dim=-1)
    """
    ev, index = evaluator(tmp_path, code, target={"num_hidden_layers": 32})
    out = ev.call(Val(FuncRef(index.load("mod.py").functions["features"])), [Val(MutDict({}))])
    assert isinstance(out.v, TensorVal) and describe(out) == "concat[h0, h3, h32+norm]"


def test_nothing_is_executed(tmp_path: Path) -> None:
    code = """
    import os

    def danger():
        os.system("touch pwned")
        open("pwned2", "w").write("x")
        return 1
    """
    ev, index = evaluator(tmp_path, code)
    ev.call(Val(FuncRef(index.load("mod.py").functions["danger"])), [])
    assert not (Path.cwd() / "pwned").exists() and not (Path.cwd() / "pwned2").exists()


def test_locations_are_one_based_and_survive_decorators(tmp_path: Path) -> None:
    code = """
    import functools


    class Model:
        @functools.cache
        def set_layers(self, ids):
            # a comment line
            self.capture = [i + 1 for i in ids]
    """
    _, index = evaluator(tmp_path, code)
    module = index.load("mod.py")
    function = module.classes["Model"].methods["set_layers"]
    statement = function.node.body.body[0]
    assert module.location(statement, function.node).line == 9
    assert isinstance(statement, cst.SimpleStatementLine)


ENUM = """
from enum import Enum, auto


class Algorithm(Enum):
    EAGLE = auto()
    EAGLE3 = auto()

    def is_eagle3(self):
        return self == Algorithm.EAGLE3

    @classmethod
    def from_string(cls, name):
        return cls[name.upper()]


class Runner:
    def __init__(self, server_args):
        self.algorithm = Algorithm.from_string(server_args.speculative_algorithm)
"""


@pytest.mark.parametrize(("name", "eagle3"), [("eagle3", True), ("EAGLE", False)])
def test_enum_members_compare_by_identity_and_are_looked_up_by_name(tmp_path: Path, name: str, eagle3: bool) -> None:
    ev, index = evaluator(tmp_path, ENUM)
    ev.link("speculative_algorithm", Val(name))
    runner = index.load("mod.py").classes["Runner"]
    init = runner.methods["__init__"]
    value = ev.evaluate(init, cst.parse_expression("self.algorithm.is_eagle3()"), {}, ev.new_object(runner))
    assert value.v is eagle3
    member = ev.evaluate(init, cst.parse_expression("self.algorithm.name"), {}, ev.new_object(runner))
    assert member.v == name.upper()


def test_an_unknown_enum_name_raises_key_error(tmp_path: Path) -> None:
    ev, index = evaluator(tmp_path, ENUM)
    ev.link("speculative_algorithm", Val("ngram"))
    runner = index.load("mod.py").classes["Runner"]
    value = ev.evaluate(runner.methods["__init__"], cst.parse_expression("self.algorithm"), {}, ev.new_object(runner))
    assert isinstance(value.v, Opaque)  # the lookup raised: the field has no value, nothing is invented


def test_a_comprehension_over_unknown_items_is_unknown_not_empty(tmp_path: Path) -> None:
    code = """
    def partitions(size):
        return [4 for _ in range(size)], {k: 0 for k in range(size)}, [4 for _ in range(2)]
    """
    ev, index = evaluator(tmp_path, code)
    out = ev.call(Val(FuncRef(index.load("mod.py").functions["partitions"])), [Val(Opaque("size"))])
    unknown_list, unknown_dict, known = out.v.items
    assert isinstance(unknown_list.v, Opaque) and isinstance(unknown_dict.v, Opaque)
    assert describe(known) == "[4, 4]"


BUILT_BY_A_PIPELINE_AWARE_BUILDER = """
from itertools import islice

def get_pp_indices(num_layers, rank, size):
    per = num_layers // size
    partitions = [per for _ in range(size)]
    start = sum(partitions[:rank])
    return start, start + partitions[rank]

def make_layers(num_layers, layer_fn):
    start, end = get_pp_indices(num_layers, get_pp_group().rank_in_group, get_pp_group().world_size)
    modules = ModuleList(
        [Missing() for _ in range(start)] + [layer_fn(i) for i in range(start, end)]
        + [Missing() for _ in range(end, num_layers)]
    )
    return start, end, modules

class Model:
    def __init__(self, config):
        self.start_layer, self.end_layer, self.layers = make_layers(config.num_hidden_layers, lambda i: Layer(i))

    def default_layers(self):
        assert hasattr(self, "layers")
        n = len(self.layers)
        return (2, n // 2, n - 3)

    def forward(self, ids):
        h = self.embed_tokens(ids)
        r = None
        aux = []
        for i, layer in enumerate(islice(self.layers, self.start_layer, self.end_layer), start=self.start_layer):
            if i in self.at:
                aux.append(h + r)
            h, r = layer(h, r)
        return aux
"""


def test_layers_built_by_a_followed_builder_are_the_target_layers(tmp_path: Path) -> None:
    """vLLM's `make_layers` splits the layers by pipeline stage, with a stage count the analysis
    does not know: followed rather than left unknown, what it builds is still the target's layers,
    and its first and last layer still the single stage's (the count of layers decides the default
    taps, the bounds the forward's loop)."""
    ev, index = evaluator(tmp_path, BUILT_BY_A_PIPELINE_AWARE_BUILDER)
    model = ev.new_object(index.load("mod.py").classes["Model"], [Val(ConfigObj(ev.target))], {})
    assert describe(ev.call(ev.field(model, "default_layers"), [])) == "(2, 4, 5)"
    ev.set_attribute(model, "at", Val(MutList([Val(2), Val(5)])))
    assert describe(ev.call(ev.field(model, "forward"), [Val(Opaque("ids"))])) == "[h2, h5]"


def test_module_state_a_function_sets_at_runtime_is_unknown_not_its_value_at_import(tmp_path: Path) -> None:
    """vLLM's `_PP = None` is set by `initialize_model_parallel` (`global _PP`) before any model is
    built: `get_pp_group()` asserts it is set. Its value at import is not what later code reads;
    a module constant nothing rebinds still is."""
    code = """
    _PP = None
    _LIMIT = None

    def initialize_model_parallel(size):
        global _PP
        _PP = GroupCoordinator(size)

    def get_pp_group():
        assert _PP is not None, "pipeline model parallel group is not initialized"
        return _PP

    def limit():
        return _LIMIT
    """
    ev, index = evaluator(tmp_path, code)
    functions = index.load("mod.py").functions
    group = ev.call(Val(FuncRef(functions["get_pp_group"])), [])
    assert isinstance(group.v, Opaque) and "sets at runtime" in group.v.reason
    assert ev.call(Val(FuncRef(functions["limit"])), []).v is None
