"""A draft config in another trainer's format, read as the serving engine converts it before it
builds the draft (vLLM and speculators' format): found by evaluating the engine's converter, cited
at the lines of the file the user has, and what the conversion drops reported."""

from __future__ import annotations

from pathlib import Path

from rca.inputs.configs import DraftConfig, TargetConfig, load_config
from rca.inputs.sources import SourceTree
from rca.static.context import SideContext
from rca.static.engine import run_side
from tests.conftest import LLAMA_8B, write_json, write_tree

# An engine's format adapter in vLLM's shape: a registry filled by a decorator at import, and a
# classmethod that takes the raw config dict and returns the config the draft is built from. It
# copies norm_before_fc but not fc_norm, as vLLM's did before it knew the flag.
_ALGOS = """
SUPPORTED = {}


def register(name):
    def decorator(fn):
        SUPPORTED[name] = fn
        return fn

    return decorator


@register("eagle3")
def update_eagle3(config_dict, pre_trained_config):
    pre_trained_config["draft_vocab_size"] = config_dict.get("draft_vocab_size")
    pre_trained_config["norm_before_fc"] = config_dict.get("norm_before_fc", False)
    pre_trained_config["architectures"] = ["DraftForCausalLM"]
    if config_dict.get("eagle_aux_hidden_state_layer_ids"):
        pre_trained_config["eagle_aux_hidden_state_layer_ids"] = config_dict["eagle_aux_hidden_state_layer_ids"]
"""
_BASE = """
from engine.configs.algos import SUPPORTED


class FormatConfig:
    @classmethod
    def extract_config(cls, config_dict):
        kind = config_dict.get("speculators_model_type")
        if kind not in SUPPORTED:
            raise ValueError("not a supported format")
        pre_trained_config = config_dict.get("transformer_layer_config", {})
        SUPPORTED[kind](config_dict=config_dict, pre_trained_config=pre_trained_config)
        return pre_trained_config
"""
_DRAFT_MODEL = """
class DraftModel(nn.Module):
    def __init__(self, config):
        self.fc = nn.Linear(config.hidden_size * 3, config.hidden_size, bias=False)
        self.fc_norm = RMSNorm(config.hidden_size) if getattr(config, "fc_norm", False) else None


class DraftForCausalLM(nn.Module):
    def __init__(self, config):
        self.model = DraftModel(config)
"""
FILES = {
    "engine/configs/algos.py": _ALGOS,
    "engine/configs/base.py": _BASE,
    "engine/models/draft_eagle3.py": _DRAFT_MODEL,
}
DRAFT = {
    "architectures": ["Eagle3DraftModel"],
    "eagle_aux_hidden_state_layer_ids": [2, 16, 29],
    "fc_norm": True,
    "norm_before_fc": False,
    "speculators_config": {"algorithm": "eagle3"},
    "speculators_model_type": "eagle3",
    "transformer_layer_config": {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 1},
}


def _serving(tmp_path: Path, draft: dict) -> SideContext:
    target = TargetConfig(load_config("target", write_json(tmp_path / "target.json", LLAMA_8B)))
    config = DraftConfig(load_config("draft", write_json(tmp_path / "draft" / "config.json", draft)))
    ctx = SideContext("serving", SourceTree("serving", "engine", write_tree(tmp_path / "src", FILES)), target, config)
    run_side(ctx)
    return ctx


def test_the_engine_converts_the_draft_config_before_building_the_draft(tmp_path: Path) -> None:
    ctx = _serving(tmp_path, DRAFT)
    assert ctx.conversion is not None and ctx.conversion.converter == "FormatConfig.extract_config"
    assert (ctx.conversion.location.path, ctx.conversion.location.line) == ("engine/configs/base.py", 7)
    assert ctx.draft is not None and ctx.draft.architectures == ("DraftForCausalLM",)
    assert ctx.declared_draft.architectures == ("Eagle3DraftModel",)
    assert ctx.draft_model() is not None  # the class the converted config names is built
    # A key the converter copies is cited at the line the user wrote it on, nested keys at theirs.
    text = (tmp_path / "draft" / "config.json").read_text().splitlines()
    ids = ctx.draft.config.location(("eagle_aux_hidden_state_layer_ids",))
    assert '"eagle_aux_hidden_state_layer_ids"' in text[ids.line - 1]
    layers = ctx.draft.config.location(("num_hidden_layers",))
    assert '"num_hidden_layers"' in text[layers.line - 1]
    assert any("converts the draft config from its format" in note.text for note in ctx.notes)


def test_a_flag_the_conversion_drops_is_a_norm_the_draft_is_served_without(tmp_path: Path) -> None:
    ctx = _serving(tmp_path, DRAFT)
    [dropped] = [finding for finding in ctx.findings if finding.hypothesis == "norm-flag-dropped"]
    assert "FormatConfig.extract_config (engine/configs/base.py:7) drops the flag" in dropped.message
    assert dropped.location.path.endswith("config.json") and dropped.fix.startswith("serve on an engine release whose")


def test_a_config_with_a_model_type_of_its_own_is_not_converted(tmp_path: Path) -> None:
    ctx = _serving(tmp_path, {**DRAFT, "model_type": "llama", "architectures": ["DraftForCausalLM"]})
    assert ctx.conversion is None
    assert not [finding for finding in ctx.findings if finding.hypothesis == "draft-arch-unsupported"]
