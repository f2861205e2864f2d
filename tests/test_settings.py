"""Launch settings: flags read with the serving engine's own declarations, and what they decide."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rca.cases.casefile import load_case
from rca.diagnose import Inputs, diagnose
from rca.errors import InputError
from rca.inputs.launch import declared_options, parse_launch
from rca.inputs.sources import SourceTree, fetch_release
from tests.conftest import CASES, write_json, write_tree
from tests.releases import SGLANG_LAUNCH_GATED

ARGPARSE = """
class ServerArgs:
    @staticmethod
    def add_cli_args(parser):
        parser.add_argument("--tensor-parallel-size", "--tp-size", type=int, default=1)
        parser.add_argument("--speculative-algorithm", type=str, choices=["EAGLE", "EAGLE3"])
        parser.add_argument("--enable-flashinfer-allreduce-fusion", action="store_true")
        parser.add_argument("--json-model-override-args", type=str, default="{}")
        parser.add_argument("--draft-path", dest="speculative_draft_model_path")

    @classmethod
    def from_cli_args(cls, args):
        args.tp_size = args.tensor_parallel_size
        return cls(**vars(args))
"""
FIELDS = """
@dataclasses.dataclass
class SpecArgs:
    speculative_algorithm: A[Optional[str], "Speculative algorithm."] = None
    tp_size: A[int, Arg(help="The tensor parallelism size.", aliases=["--tensor-parallel-size"])] = 1
    enable_return_aux: A[bool, "Return aux states."] = False
    internal: A[int, Arg(help="set by code", no_cli=True)] = 0
    other: A[str, Arg(cli_name="--renamed")] = ""
"""


def _options(tmp_path: Path, text: str) -> dict:
    return declared_options(
        SourceTree("serving", "example", write_tree(tmp_path / "src", {"engine/server_args.py": text}))
    )


def test_flags_map_to_the_attributes_the_engine_reads(tmp_path: Path) -> None:
    launch = """#!/bin/sh
# serve the target with its draft
python -m engine.launch_server --model-path m \\
  --tp 8 \\
  --speculative-algorithm=EAGLE --enable-flashinfer-allreduce-fusion \\
  --json-model-override-args '{"num_hidden_layers": 4}' --draft-path d --no-such-flag 3
"""
    settings = parse_launch(launch, "launch.sh", _options(tmp_path, ARGPARSE))
    values = {setting.dest: setting.value for setting in settings.settings}
    assert values == {
        "tensor_parallel_size": 8,
        "tp_size": 8,  # `--tp` is argparse's prefix of --tp-size; from_cli_args copies it
        "speculative_algorithm": "EAGLE",
        "enable_flashinfer_allreduce_fusion": True,
        "json_model_override_args": {"num_hidden_layers": 4},
        "speculative_draft_model_path": "d",
    }
    assert settings.get("speculative_algorithm").step.location.line == 5  # continued lines keep their own numbers
    assert settings.get("tp_size").step.code == "--tp 8 \\"
    assert settings.unknown == ("--model-path", "--no-such-flag")


def test_dataclass_fields_declare_flags_too(tmp_path: Path) -> None:
    options = _options(tmp_path, FIELDS)
    settings = parse_launch(
        "--speculative-algorithm EAGLE3 --tensor-parallel-size 4 --enable-return-aux --renamed x --internal 3",
        "--serving-args",
        options,
    )
    values = {setting.dest: setting.value for setting in settings.settings}
    assert values == {"speculative_algorithm": "EAGLE3", "tp_size": 4, "enable_return_aux": True, "other": "x"}
    assert settings.unknown == ("--internal",)


def test_the_launch_environment_is_read_as_settings(tmp_path: Path) -> None:
    launch = """#!/bin/sh
export VLLM_USE_V2_MODEL_RUNNER=0
# export IGNORED=1
export CUDA_VISIBLE_DEVICES=0,1; VLLM_USE_V2_MODEL_RUNNER=1 \\
  env HF_HOME="/data/hf cache" python -m engine.launch_server --tp 2 \\
  --speculative-algorithm EAGLE3 NOT_ENV=1 --draft-path d
"""
    settings = parse_launch(launch, "launch.sh", _options(tmp_path, ARGPARSE))
    values = {setting.dest: setting.value for setting in settings.settings}
    assert values == {
        "tensor_parallel_size": 2,
        "tp_size": 2,
        "speculative_algorithm": "EAGLE3",
        "speculative_draft_model_path": "d",
        "VLLM_USE_V2_MODEL_RUNNER": "1",  # as written; the prefix on line 4 overrides the export
        "CUDA_VISIBLE_DEVICES": "0,1",
        "HF_HOME": "/data/hf cache",
    }
    chosen = settings.get("VLLM_USE_V2_MODEL_RUNNER")
    assert chosen.flag == "VLLM_USE_V2_MODEL_RUNNER" and chosen.step.location.line == 4
    assert chosen.step.code.startswith("export CUDA_VISIBLE_DEVICES=0,1;")
    assert settings.unknown == ()  # NOT_ENV=1 after the command is an argument, not the environment


def test_undeclared_flags_are_kept_apart_as_argparse_would_read_them(tmp_path: Path) -> None:
    launch = """torchrun --nproc_per_node=8 scripts/train.py --tp 2 \\
    --use-off-policy-tokens \\
    --ttt-steps 3 --data-path=./data
"""
    settings = parse_launch(launch, "train.sh", _options(tmp_path, ARGPARSE), "training-args")
    assert {setting.dest for setting in settings.settings} == {"tensor_parallel_size", "tp_size"}
    assert settings.unknown == ("--nproc_per_node", "--use-off-policy-tokens", "--ttt-steps", "--data-path")
    undeclared = {setting.dest: setting.value for setting in settings.undeclared}
    assert undeclared == {"nproc_per_node": "8", "use_off_policy_tokens": True, "ttt_steps": "3", "data_path": "./data"}
    flag = next(setting for setting in settings.undeclared if setting.dest == "use_off_policy_tokens")
    assert (flag.flag, flag.step.location.line) == ("--use-off-policy-tokens", 2)
    assert settings.get("use_off_policy_tokens") is None  # never a setting an analyzer reads unasked


def test_an_assignment_is_not_a_flags_value(tmp_path: Path) -> None:
    settings = parse_launch(
        "VLLM_USE_V2_MODEL_RUNNER=1 python -m engine.launch_server -m x --speculative-algorithm EAGLE3",
        "--serving-args",
        _options(tmp_path, ARGPARSE),
    )
    assert settings.get("VLLM_USE_V2_MODEL_RUNNER").value == "1"
    assert settings.get("speculative_algorithm").value == "EAGLE3"
    assert settings.unknown == ()  # `-m` before any flag the engine declares is the interpreter's, as before
    with pytest.raises(InputError, match="--speculative-algorithm needs a value"):
        parse_launch("--speculative-algorithm\nA=1 python x", "--serving-args", _options(tmp_path, ARGPARSE))


def test_a_flag_missing_its_value_is_bad_input(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="--speculative-algorithm needs a value"):
        parse_launch("--speculative-algorithm --tp 2", "--serving-args", _options(tmp_path, ARGPARSE))


# -- on real releases --------------------------------------------------------------------------

# Where each release enables the layer capture for an EAGLE-3 draft: the runner's
# `spec_algorithm.is_eagle3()`, from 0.5.16 inside `_resolve_eagle_aux_hidden_state`.


@pytest.mark.release
@pytest.mark.parametrize("version", SGLANG_LAUNCH_GATED)
def test_an_eagle3_draft_launched_as_eagle_gets_no_captured_layers(tmp_path: Path, version: str) -> None:
    target = write_json(
        tmp_path / "target.json", {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 32, "hidden_size": 4096}
    )
    draft = write_json(
        tmp_path / "draft.json",
        {
            "architectures": ["LlamaForCausalLMEagle3"],
            "hidden_size": 4096,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 15, 28]},
        },
    )
    serving = str(fetch_release("sglang", version))
    runs = {
        algorithm: diagnose(
            Inputs(
                serving=serving,
                serving_args=f"--tp 2 --speculative-algorithm {algorithm}",
                draft=str(draft),
                target=str(target),
            )
        )
        for algorithm in ("EAGLE3", "EAGLE")
    }
    assert [str(tap) for tap in runs["EAGLE3"].diagnosis.wirings["serving"].slots] == ["h2", "h16", "h29"]
    assert not [f for f in runs["EAGLE3"].sides["serving"].findings if f.name == "aux-capture-off"]
    eagle = runs["EAGLE"]
    assert [str(tap) for tap in eagle.diagnosis.wirings["serving"].slots] == ["h32+norm"]
    findings = {f.name: f for f in eagle.sides["serving"].findings}
    assert "--speculative-algorithm EAGLE" in findings["aux-capture-off"].steps[0].code
    assert (
        findings["fc-skipped"].location.path == "sglang/srt/models/llama_eagle3.py"
    )  # `if hidden_states.shape[-1] != embeds.shape[-1]`


@pytest.mark.release
def test_the_launch_file_is_cited_in_the_fix() -> None:
    from rca.cases.casefile import load_case

    run = diagnose(load_case(CASES / "kimi-k25-launched-as-eagle").inputs)
    top = run.diagnosis.hypotheses[0]
    assert top.id == "aux-capture-off" and "--speculative-algorithm EAGLE3" in top.fix and "launch.sh:7" in top.fix
    cited = {(step.location.path, step.location.line) for step in top.citations}
    assert ("launch.sh", 7) in cited
    assert ("sglang/srt/model_executor/model_runner.py", 904) in cited  # the hand-off that never runs
    assert ("sglang/srt/models/llama_eagle3.py", 218) in cited  # the width guard that skips fc
    assert json.dumps(run.diagnosis.verdict.root_cause) == '"aux-capture-off"'


TRAINER = """
import argparse

def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--chat-template", type=str, default="llama3")
    return parser.parse_args()
"""


@pytest.mark.parametrize("key", ["serving_args", "training_args"])
def test_flags_in_quotes_are_read_as_flags_not_as_a_path(key: str) -> None:
    """As --help says: the launch's flags in quotes. A path that does not exist stays what was typed,
    for the reader to take as flags, or to refuse as a missing file."""
    from rca.cli.options import given_paths

    assert given_paths({key: "--chat-template qwen"}) == {key: "--chat-template qwen"}


def test_the_trainers_flags_given_in_quotes_reach_the_analysis(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from rca.cli import app

    write_tree(tmp_path / "trainer", {"train.py": TRAINER})
    draft, target = (write_json(tmp_path / name / "config.json", {"architectures": ["LlamaForCausalLM"],
                     "num_hidden_layers": 4}) for name in ("draft", "target"))  # fmt: skip
    arguments = ["diagnose", "--training", str(tmp_path / "trainer"), "--draft", str(draft), "--target", str(target)]
    result = CliRunner().invoke(app, [*arguments, "--training-args", "--chat-template qwen"])
    assert "training settings: chat_template='qwen'" in result.stderr, result.stderr
    missing = CliRunner().invoke(app, [*arguments, "--training-args", "run.yaml"])
    assert missing.exit_code == 2 and "no such launch file" in missing.stderr


def test_a_speculative_config_flag_keeps_the_draft_config_readable() -> None:
    """vLLM builds a `SpeculativeConfig` from `--speculative-config`'s JSON: its keys are read as
    that object's fields, and `speculative_config.draft_model_config.hf_config` is still the
    draft's config, so the fc width comes out of the config's defaults as without the flag."""
    case = CASES / "specforge-draft-raised-to-40k-served-at-40k-on-vllm-0.33"
    draft = json.loads((case / "draft" / "config.json").read_text())
    assert "target_hidden_size" not in draft and "--speculative-config" in (case / "launch.sh").read_text()
    run = diagnose(load_case(case).inputs, parallel=False)
    serving = run.diagnosis.wirings["serving"]
    assert "fc takes 3 x 2048 = 6144 inputs (3 slots)" in "\n".join(step.note for step in serving.steps)
    assert not [note for note in serving.notes if "not known here" in note or "0 built" in note], serving.notes


# vLLM's shape: flags generated from config classes (`get_kwargs`), a bool made a boolean optional
# action, a `bool | str` field a flag whose value may follow; and a benchmark that declares a flag
# of the same name another way.
GENERATED = {
    "engine/config.py": """
from dataclasses import dataclass


@dataclass
class ModelConfig:
    trust_remote_code: bool = False
    max_model_len: int | None = None
    hf_token: bool | str | None = None
""",
    "engine/arg_utils.py": """
import argparse


def get_kwargs(cls):
    kwargs = {}
    for name, kind in fields(cls):
        if kind is bool:
            kwargs[name] = {"action": argparse.BooleanOptionalAction}
    return kwargs


class EngineArgs:
    @staticmethod
    def add_cli_args(parser):
        model_kwargs = get_kwargs(ModelConfig)
        parser.add_argument("--trust-remote-code", **model_kwargs["trust_remote_code"])
        parser.add_argument("--max-model-len", **model_kwargs["max_model_len"])
        parser.add_argument("--hf-token", **{**model_kwargs["hf_token"], "default": None})
        parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction)
        parser.add_argument("--speculative-config", type=json.loads)
""",
    "engine/bench.py": """
def add_cli_args(parser):
    parser.add_argument("--trust-remote-code", type=str)
    parser.add_argument("--a", type=int)
    parser.add_argument("--b", type=int)
    parser.add_argument("--c", type=int)
    parser.add_argument("--d", type=int)
    parser.add_argument("--e", type=int)
""",
}


def test_flags_are_read_as_the_engine_generates_them(tmp_path: Path) -> None:
    """A bare `--trust-remote-code` is a switch, `--no-enable-prefix-caching` turns the switch off,
    `--hf-token` alone is True and takes a value when one follows; the benchmark's declaration of the
    same flag, which takes a value, does not count: the module of the speculative flags wins."""
    options = declared_options(SourceTree("serving", "example", write_tree(tmp_path / "src", GENERATED)))
    launch = "vllm serve m --trust-remote-code --no-enable-prefix-caching --hf-token --max-model-len=2048"
    values = {setting.dest: setting.value for setting in parse_launch(launch, "launch.sh", options).settings}
    assert values == {
        "trust_remote_code": True,
        "enable_prefix_caching": False,
        "hf_token": True,
        "max_model_len": 2048,
    }
    settings = parse_launch("--hf-token abc --no-trust-remote-code", "launch.sh", options)
    assert {setting.dest: setting.value for setting in settings.settings} == {
        "hf_token": "abc",
        "trust_remote_code": False,
    }
    assert settings.unknown == ()


@pytest.mark.release
@pytest.mark.parametrize("version", ["0.5.14", "0.5.23"])
def test_a_bare_trust_remote_code_is_a_switch_on_sglang(version: str) -> None:
    """SGLang 0.5.14 and later generate their flags from the server-args fields: a bool field is a
    `store_true` switch (https://github.com/sgl-project/sglang, `srt/arg_groups/arg_utils.py`)."""
    options = declared_options(SourceTree("serving", f"sglang=={version}", fetch_release("sglang", version)))
    launch = (
        "python -m sglang.launch_server --model-path m --trust-remote-code --speculative-algorithm EAGLE3 "
        "--speculative-draft-window-size 2048 --tp 8"
    )
    settings = parse_launch(launch, "launch.sh", options)
    values = {setting.dest: setting.value for setting in settings.settings}
    assert values["trust_remote_code"] is True and values["speculative_draft_window_size"] == 2048
    assert settings.unknown == ()


OVERRIDING = {
    "engine/server_args.py": """
def add_cli_args(parser):
    parser.add_argument("--speculative-algorithm", type=str)
    parser.add_argument("--json-model-override-args", type=str, default="{}")
""",
    "engine/model_config.py": """
class ModelConfig:
    @staticmethod
    def from_server_args(server_args, model_path=None, is_draft_model=False):
        return ModelConfig(
            model_path=model_path,
            model_override_args=server_args.json_model_override_args,
            is_draft_model=is_draft_model,
        )
""",
}


def test_launch_overrides_reach_the_draft_where_the_engine_hands_them_to_every_model_config(tmp_path: Path) -> None:
    from rca.static.builders import launch_overrides

    tree = SourceTree("serving", "example", write_tree(tmp_path / "src", OVERRIDING))
    launch = """--speculative-algorithm EAGLE3 --json-model-override-args '{"max_position_embeddings": 131072}'"""
    settings = parse_launch(launch, "launch.sh", declared_options(tree))
    overrides = launch_overrides(tree, settings)
    assert overrides is not None and overrides.values == {"max_position_embeddings": 131072}
    assert (overrides.handed.location.path, overrides.handed.location.line) == ("engine/model_config.py", 7)
    draft = write_json(tmp_path / "draft.json", {"architectures": ["X"], "max_position_embeddings": 2048})
    from rca.inputs.configs import load_config

    applied = overrides.apply(load_config("draft", draft))
    assert (
        applied.data["max_position_embeddings"] == 131072 and applied.location(("max_position_embeddings",)).line == 5
    )
    bad = parse_launch("--json-model-override-args '{oops'", "launch.sh", declared_options(tree))
    with pytest.raises(InputError, match="is not JSON"):
        launch_overrides(tree, bad)
