"""A trainer's draft module is found by what it does (it builds an fc over the target's states and
computes the head), and, among several, by the name the draft config gives it: never by its path."""

from __future__ import annotations

from pathlib import Path

from rca.inputs.configs import TargetConfig, load_config
from rca.inputs.draft import load_draft
from rca.inputs.sources import SourceTree
from rca.sdk.sides import trainer_draft_module
from rca.static.context import SideContext
from tests.conftest import write_json, write_tree

_DRAFT_MODULE = """
class {name}(nn.Module):
    def __init__(self, config):
        self.fc = nn.Linear(config.hidden_size * 3, config.hidden_size)

    def compute_logits(self, hidden_states):
        return self.lm_head(self.norm(hidden_states))
"""

_REGISTERED = """
@SpeculatorModel.register("{key}")
class {name}(nn.Module):
    def __init__(self, config):
        self.fc = nn.Linear(config.hidden_size * 3, config.hidden_size)

    def forward(self, hidden_states):
        return self.lm_head(hidden_states)
"""


def _found(tmp_path: Path, files: dict[str, str], draft: dict) -> str | None:
    tree = SourceTree("training", "example", write_tree(tmp_path / "src", files))
    target = TargetConfig(load_config("target", write_json(tmp_path / "target.json", {"num_hidden_layers": 8})))
    ctx = SideContext("training", tree, target, load_draft(write_json(tmp_path / "draft.json", draft)))
    ctx.prepare(set())
    built = trainer_draft_module(ctx)
    return None if built is None else f"{built[0].module.relpath}:{built[0].name}"


def test_a_draft_module_in_a_file_named_for_nothing_is_found(tmp_path: Path) -> None:
    files = {"trainer/draft.py": _DRAFT_MODULE.format(name="Drafter"), "trainer/model.py": "class Target:\n    pass\n"}
    assert _found(tmp_path, files, {"architectures": ["Drafter"]}) == "trainer/draft.py:Drafter"


def test_the_module_registered_for_the_configs_family_wins_over_one_sorted_first(tmp_path: Path) -> None:
    files = {
        "models/aaa/core.py": _REGISTERED.format(key="dflash", name="DFlashDraftModel"),
        "models/zzz/core.py": _REGISTERED.format(key="eagle3", name="Eagle3DraftModel"),
    }
    draft = {"architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": 32}
    assert _found(tmp_path, files, draft) == "models/zzz/core.py:Eagle3DraftModel"
