"""Chat templates and loss masks on real trainer releases: the registered template each name gives,
the separator the trainer's own code builds from it, and the template arguments it passes on.
Every expectation is read from the release's lines; the analysis reads the same code."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import torch

from rca.cases.casefile import load_case
from rca.diagnose import diagnose
from rca.evidence.probes import ProbeInputs
from rca.inputs.configs import TargetConfig, load_config
from rca.inputs.launch import read_training_settings
from rca.inputs.sources import SourceTree, fetch_release
from rca.static.context import SideContext
from rca.static.engine import run_side
from rca.static.wiring import resolve_wiring
from tests.conftest import write_json
from tests.dumpwriters import write_dumps
from tests.releases import SPECFORGE, SPECULATORS
from tests.tinytokenizers import QWEN3_TEMPLATE, encode, write_tokenizer

pytestmark = pytest.mark.release

QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "num_hidden_layers": 36, "hidden_size": 4096}
_HEADER = re.compile(r'name="(?P<name>[\w.-]+)",\s*template=ChatTemplate\(\s*assistant_header="(?P<header>[^"]*)"')


def _training(tmp_path: Path, package: str, version: str, name: str | None):
    root = fetch_release(package, version)
    target_file = write_json(tmp_path / "target" / "config.json", QWEN3)
    write_json(tmp_path / "target" / "tokenizer_config.json", {"chat_template": QWEN3_TEMPLATE})
    tree = SourceTree("training", f"{package} {version}", root)
    settings = None
    if name is not None:
        (tmp_path / "run.yaml").write_text(f"data:\n  chat_template: {name}\n")
        settings = read_training_settings("run.yaml", tmp_path, tree)
    ctx = SideContext("training", tree, TargetConfig(load_config("target", target_file)), settings=settings)
    run_side(ctx, only={"chat-template"})
    return root, ctx


def _registered_headers(root: Path) -> dict[str, str]:
    text = (root / "specforge/data/template.py").read_text()
    return {match["name"]: match["header"].encode().decode("unicode_escape") for match in _HEADER.finditer(text)}


@pytest.mark.parametrize("version", SPECFORGE)
@pytest.mark.parametrize("name", ["llama3", "qwen"])
def test_specforge_loss_mask_separator_against_a_chatml_target(tmp_path: Path, version: str, name: str) -> None:
    root, ctx = _training(tmp_path, "specforge", version, name)
    header = _registered_headers(root)[name]
    unmatched = [finding for finding in ctx.findings if finding.name == "assistant-turns-unmatched"]
    assert bool(unmatched) == (name == "llama3"), [f.message for f in ctx.findings] + [n.text for n in ctx.notes]
    if unmatched:
        assert repr(header)[1:-1] in unmatched[0].message
        assert unmatched[0].location.path == "specforge/data/template.py"
        cited = [step for step in unmatched[0].steps if "separator" in step.note]
        assert cited and "assistant_message_separator" in cited[0].code  # the trainer's own assignment
    use = resolve_wiring(ctx).aspect("chat_template")
    assert use is not None and use.prompt.endswith("<|im_start|>assistant\n")


def test_specforge_0_2_passes_enable_thinking_for_a_thinking_template(tmp_path: Path) -> None:
    root, ctx = _training(tmp_path, "specforge", "0.2.0", "qwen3-thinking")
    use = resolve_wiring(ctx).aspect("chat_template")
    assert use is not None and dict(use.kwargs) == {"enable_thinking": True}
    passed = [step for step in use.steps if "enable_thinking" in step.note]
    line = (root / passed[0].location.path).read_text().splitlines()[passed[0].location.line - 1]
    assert 'kwargs["enable_thinking"] = True' in line
    assert not ctx.findings


def test_specforge_0_2_defaults_to_the_llama3_template_its_schema_declares(tmp_path: Path) -> None:
    root, ctx = _training(tmp_path, "specforge", "0.2.0", None)
    (finding,) = [finding for finding in ctx.findings if finding.name == "assistant-turns-unmatched"]
    chosen = finding.steps[0]
    assert chosen.location.path == "specforge/config/schema.py"
    assert (
        'chat_template: str = "llama3"'
        in (root / chosen.location.path).read_text().splitlines()[chosen.location.line - 1]
    )


@pytest.mark.parametrize("version", SPECULATORS)
def test_speculators_renders_with_the_targets_template_and_no_registry(tmp_path: Path, version: str) -> None:
    root, ctx = _training(tmp_path, "speculators", version, None)
    use = resolve_wiring(ctx).aspect("chat_template")
    assert use is not None and not use.kwargs and not ctx.findings
    call = next(step for step in use.steps if "renders conversations" in step.note)
    line = (root / call.location.path).read_text().splitlines()[call.location.line - 1]
    assert "apply_chat_template(" in line or "/chat/completions/render" in line


def test_the_agent_reads_the_dumps_tokens_as_evidence_on_the_template(tmp_path: Path) -> None:
    """The thinking case with its dumps: rendered with thinking on, as training's template says, so no
    assistant turn opens as the server (thinking off) prompts: observed evidence for the mismatch."""
    case = tmp_path / "case"
    shutil.copytree(Path(__file__).parent.parent / "cases" / "thinking-data-served-without-thinking-on-sglang", case)
    write_tokenizer(tmp_path / "tokens")
    shutil.copy(tmp_path / "tokens" / "tokenizer.json", case / "target" / "tokenizer.json")
    turn = "<|im_start|>user\nWhy?<|im_end|>\n<|im_start|>assistant\n<think>\nbecause\n</think>\n\nSo.<|im_end|>\n"
    ids = [torch.tensor(encode(tmp_path / "tokens", turn))] * 3
    write_dumps(
        case / "dumps", "specforge-ckpt", ids, [[torch.zeros(len(ids[0]), 8)]] * 3, [torch.zeros(len(ids[0]), 8)] * 3
    )
    inputs = load_case(case).inputs
    probing = ProbeInputs(case / "dumps", case / "target", "cpu", 64, case)
    diagnosis = diagnose(inputs, parallel=False, probing=probing).diagnosis
    top = diagnosis.hypotheses[0]
    assert top.id == "template-mismatch"
    observed = [item for item in top.evidence if item.confidence.value == "observed"]
    assert observed and observed[0].likelihood_ratio > 1, [item.summary for item in top.evidence]
    assert "no assistant turn in 3 dump files opens as the server prompts" in observed[0].summary
