"""Chat templates: reading them from a target's tokenizer files, rendering them in a sandbox, the
trainer's run config, and the probe of the dumps' token ids and loss masks."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from rca.analyzers.across.chat_template import ChatTemplate

from rca.errors import InputError
from rca.evidence.probes import ProbeInputs, registered_probes
from rca.explain.hypotheses import Situation, rank
from rca.inputs import templates
from rca.inputs.configs import TargetConfig, load_config
from rca.inputs.launch import read_launch_settings, read_training_settings
from rca.inputs.sources import SourceTree
from rca.inputs.templates import TemplateError, load_tokenizer, served_template_use, target_template
from rca.model import Tap, Wiring
from rca.static.context import SideContext
from rca.static.engine import run_side
from rca.static.wiring import resolve_wiring
from tests.conftest import write_json, write_tree
from tests.dumpwriters import write_dumps
from tests.tinytokenizers import QWEN3_TEMPLATE, encode, write_tokenizer

QUESTION, ANSWER = "<|im_start|>user\nWhy?<|im_end|>\n", "Because.<|im_end|>\n"
THOUGHT = "<think>\nthe user asks why\n</think>\n\n"


def test_the_template_is_read_from_the_tokenizer_config_with_its_line(tmp_path: Path) -> None:
    write_tokenizer(tmp_path)
    template = target_template(tmp_path / "config.json")
    assert template is not None and template.text == QWEN3_TEMPLATE
    assert (template.step.location.path.endswith("tokenizer_config.json"), template.step.location.line) == (True, 3)
    assert template.special == {"eos_token": "<|im_end|>"}


def test_a_template_file_beside_the_config_wins_and_a_named_list_gives_its_default(tmp_path: Path) -> None:
    write_tokenizer(tmp_path, template=None)
    config = tmp_path / "tokenizer_config.json"
    config.write_text(
        json.dumps({"chat_template": [{"name": "tool_use", "template": "x"}, {"name": "default", "template": "d"}]})
    )
    assert target_template(tmp_path).text == "d"
    (tmp_path / "chat_template.jinja").write_text("{{ messages[0].content }}")
    assert target_template(tmp_path).text == "{{ messages[0].content }}"


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("{% for m in messages %}", "does not render"),
        ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "does not render"),
        ("{{ messages.append(1) }}", "does not render"),
        ("{{ raise_exception('no system role') }}", "the template raised: no system role"),
        ("{{ 'x' * 10**12 }}", "is refused: the operator * could build more than 1,000,000 characters"),
        ("{{ 'x' * 100000000 }}", "is refused: the operator * could build more than 1,000,000 characters"),
        ("{{ 10 ** 1000 }}", "does not render (SecurityError: the power 1000 is too large)"),
        ("{% for a in range(99999) %}{% for b in range(99999) %}{% endfor %}{% endfor %}", "still renders after 0.5 s"),
    ],
)
def test_a_template_that_fails_or_reaches_outside_the_sandbox_is_one_error_naming_its_file(
    tmp_path: Path, text: str, said: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(templates, "RENDER_SECONDS", 0.5)
    write_tokenizer(tmp_path, template=text)
    with pytest.raises(TemplateError) as raised:
        target_template(tmp_path).use({}, [])
    assert said in str(raised.value) and "tokenizer_config.json:" in str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_malformed_tokenizer_config_names_the_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text('{"chat_template": "x",\n')
    with pytest.raises(TemplateError, match=r"tokenizer_config.json:\d+:\d+: malformed JSON"):
        target_template(tmp_path)


@pytest.mark.parametrize("content", ["", "{not a tokenizer", '{"model": {"type": "Nothing"}}'])
def test_a_missing_or_broken_tokenizer_is_one_error_with_its_fix(tmp_path: Path, content: str) -> None:
    if content:
        (tmp_path / "tokenizer.json").write_text(content)
    with pytest.raises(InputError) as raised:
        load_tokenizer(tmp_path)
    assert "tokenizer.json" in str(raised.value) and "fix:" in str(raised.value)


def test_a_yaml_run_config_gives_settings_by_their_last_key_with_lines(tmp_path: Path) -> None:
    (tmp_path / "run.yaml").write_text("model:\n  target: Qwen/Qwen3-8B\ndata:\n  chat_template: qwen3-instruct\n")
    settings = read_training_settings("run.yaml", tmp_path, SourceTree("training", "t", tmp_path))
    chosen = settings.get("chat_template")
    assert chosen is not None and chosen.value == "qwen3-instruct" and chosen.flag == "data.chat_template"
    assert str(chosen.step.location) == "run.yaml:4"
    (tmp_path / "bad.yaml").write_text("data:\n  chat_template: [qwen\n")
    with pytest.raises(InputError, match=r"bad.yaml:\d+: malformed run config"):
        read_training_settings("bad.yaml", tmp_path, SourceTree("training", "t", tmp_path))


def _dumps(tmp_path: Path, tokens_dir: Path, turns: list[str], masked: list[tuple[int, int]] | None = None) -> Path:
    """SpecForge-shaped dumps of `QUESTION + turn` samples; `masked` (start, end) spans of each mask are 1
    (default: the whole turn after the question)."""
    ids, masks = [], []
    for turn in turns:
        sample = encode(tokens_dir, QUESTION + turn)
        mask = torch.zeros(len(sample), dtype=torch.long)
        head = len(encode(tokens_dir, QUESTION + "<|im_start|>assistant\n"))
        for start, end in masked or [(head, len(sample))]:
            mask[start:end] = 1
        ids.append(torch.tensor(sample))
        masks.append(mask)
    slots = [[torch.zeros(len(sample), 4)] for sample in ids]
    write_dumps(
        tmp_path / "dumps", "specforge-ckpt", ids, slots, [torch.zeros(len(s), 4) for s in ids], loss_masks=masks
    )
    return tmp_path / "dumps"


def _observe(tmp_path: Path, dumps: Path, served_kwargs: str | None, trained_kwargs: str | None = None):
    served = served_template_use(tmp_path / "target", None, served_kwargs)
    trained = served_template_use(tmp_path / "target", None, trained_kwargs) if trained_kwargs is not None else None
    probe = registered_probes()["chat-template-tokens"]()
    inputs = ProbeInputs(dumps, tmp_path / "target", served_template=served, trained_template=trained)
    assert probe.unavailable(inputs) is None
    return probe.run(inputs)


def test_dumps_rendered_as_served_and_fully_masked_settle_against_both_hypotheses(tmp_path: Path) -> None:
    target = write_tokenizer(tmp_path / "target")
    dumps = _dumps(tmp_path, target, ["<|im_start|>assistant\n" + THOUGHT + ANSWER] * 3)
    seen = _observe(tmp_path, dumps, None, "{}")
    assert (seen.value, seen.data["loss_mask"]) == ("served", "covered"), seen.summary
    bearing = registered_probes()["chat-template-tokens"]().bearing(seen, None)
    assert bearing["template-mismatch"].likelihood_ratio < 1 and bearing["loss-mask-gap"].likelihood_ratio < 1


def test_non_thinking_dumps_served_in_thinking_mode_are_another_rendering(tmp_path: Path) -> None:
    """Data rendered with enable_thinking false (an empty block after the prompt), served with thinking on."""
    target = write_tokenizer(tmp_path / "target")
    dumps = _dumps(tmp_path, target, ["<|im_start|>assistant\n<think>\n\n</think>\n\n" + ANSWER] * 4)
    seen = _observe(tmp_path, dumps, None, '{"enable_thinking": false}')
    assert seen.value == "other", seen.summary
    assert seen.data["turns_continued_by_training_prompt"] == 4
    assert "4 of 4 assistant turns continue the served prompt" in seen.summary


def test_thinking_dumps_served_with_thinking_off_open_as_no_served_prompt(tmp_path: Path) -> None:
    target = write_tokenizer(tmp_path / "target")
    dumps = _dumps(tmp_path, target, ["<|im_start|>assistant\n" + THOUGHT + ANSWER] * 2)
    seen = _observe(tmp_path, dumps, '{"enable_thinking": false}', "{}")
    assert seen.value == "other" and seen.data["turns_opened_as_trained_only"] == 2, seen.summary


def test_a_mask_that_leaves_the_thinking_block_out_is_a_gap_quoting_where(tmp_path: Path) -> None:
    target = write_tokenizer(tmp_path / "target")
    turn = "<|im_start|>assistant\n" + THOUGHT + ANSWER
    sample = encode(target, QUESTION + turn)
    answer_from = len(encode(target, QUESTION + "<|im_start|>assistant\n" + THOUGHT))
    dumps = _dumps(tmp_path, target, [turn], masked=[(answer_from, len(sample))])
    seen = _observe(tmp_path, dumps, None)
    assert seen.data["loss_mask"] == "gap", seen.summary
    assert seen.data["assistant_tokens_unlearned"] == len(encode(target, THOUGHT))
    assert "rows_0-5000/data_0.ckpt, token 23 ('<think>" in seen.summary and "'<think>" in seen.summary
    assert registered_probes()["chat-template-tokens"]().bearing(seen, None)["loss-mask-gap"].likelihood_ratio > 1


def test_the_probe_alone_diagnoses_a_loss_mask_gap_no_code_shows(tmp_path: Path) -> None:
    """The trainer's code is not at hand (no finding); the dumps' masks are the evidence, and the diagnosis."""
    target = write_tokenizer(tmp_path / "target")
    turn = "<|im_start|>assistant\n" + THOUGHT + ANSWER
    answer_from = len(encode(target, QUESTION + "<|im_start|>assistant\n" + THOUGHT))
    dumps = _dumps(tmp_path, target, [turn], masked=[(answer_from, len(encode(target, QUESTION + turn)))])
    seen = _observe(tmp_path, dumps, None)
    bearing = registered_probes()["chat-template-tokens"]().bearing(seen, None)
    taps = (Tap(2), Tap(16), Tap(29))
    consistent = Situation(Wiring("training", taps, None), Wiring("serving", taps, None, fc_slots=3), [])
    consistent.observed = {name: [item] for name, item in bearing.items()}
    top = rank(consistent)[0]
    assert top.id == "loss-mask-gap" and top.score > 0.5 and "<think>" in top.reason


def test_dumps_without_loss_masks_say_so_and_bear_on_the_template_only(tmp_path: Path) -> None:
    target = write_tokenizer(tmp_path / "target")
    ids = [torch.tensor(encode(target, QUESTION + "<|im_start|>assistant\n" + ANSWER))]
    write_dumps(
        tmp_path / "dumps",
        "speculators-safetensors",
        ids,
        [[torch.zeros(len(ids[0]), 4)]],
        [torch.zeros(len(ids[0]), 4)],
    )
    seen = _observe(tmp_path, tmp_path / "dumps", None)
    assert seen.value == "served" and seen.data["loss_mask"] is None
    assert "the dumps keep no loss mask" in seen.summary
    assert set(registered_probes()["chat-template-tokens"]().bearing(seen, None)) == {"template-mismatch"}


def test_the_probe_reads_only_token_ids_and_masks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Hidden states are memory-mapped, never read: the files' hidden bytes stay untouched."""
    target = write_tokenizer(tmp_path / "target")
    dumps = _dumps(tmp_path, target, ["<|im_start|>assistant\n" + ANSWER] * 2)
    loaded = []
    original = torch.load
    monkeypatch.setattr(
        torch, "load", lambda *args, **kwargs: loaded.append(kwargs.get("mmap")) or original(*args, **kwargs)
    )
    started = time.perf_counter()
    _observe(tmp_path, dumps, None)
    assert loaded and all(loaded), loaded
    assert time.perf_counter() - started < 5


def test_a_broken_template_skips_the_comparison_with_a_note_and_no_crash(tmp_path: Path) -> None:
    target = write_json(
        tmp_path / "target" / "config.json", {"architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 4}
    )
    write_tokenizer(tmp_path / "target", template="{% if %}")
    tree = SourceTree("training", "t", write_tree(tmp_path / "src", {"t.py": "x = tokenizer.apply_chat_template(m)\n"}))
    ctx = SideContext("training", tree, TargetConfig(load_config("target", target)))
    run_side(ctx, only={"chat-template"})
    (note,) = [note.text for note in ctx.notes if "chat templates" in note.text]
    assert note.startswith("chat templates not compared:") and "tokenizer_config.json:3" in note and "fix:" in note
    assert not ctx.facts and not ctx.findings


def test_a_served_template_file_that_renders_otherwise_is_a_mismatch_citing_the_launch_line(tmp_path: Path) -> None:
    target = TargetConfig(
        load_config("target", write_json(tmp_path / "target" / "config.json", {"num_hidden_layers": 4}))
    )
    write_tokenizer(tmp_path / "target")
    (tmp_path / "plain.jinja").write_text(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    (tmp_path / "serve.sh").write_text("serve --chat-template plain.jinja\n")
    trainer = write_tree(tmp_path / "trainer", {"t.py": "text = tokenizer.apply_chat_template(messages)\n"})
    engine = write_tree(tmp_path / "engine", {"e.py": 'def add(p):\n    p.add_argument("--chat-template", type=str)\n'})
    sides = {}
    for side, root in (("training", trainer), ("serving", engine)):
        tree = SourceTree(side, side, root)
        settings = read_launch_settings("serve.sh", tmp_path, tree) if side == "serving" else None
        ctx = SideContext(side, tree, target, settings=settings, base=tmp_path)
        run_side(ctx, only={"chat-template"})
        sides[side] = resolve_wiring(ctx)
    (finding,) = ChatTemplate().across(sides["training"], sides["serving"])
    assert finding.name == "rendering-differs" and str(finding.location) == "serve.sh:1"
    assert (
        "<think>\\n\\n</think>\\n\\n2 + 2 is 4." in finding.message
    )  # training's last turn, as Qwen3's shape renders it
    assert {step.location.path for step in finding.steps} >= {"plain.jinja", "serve.sh", "t.py"}


def _training_rendering(tmp_path: Path, trainer: str, flags: str | None = None) -> SideContext:
    """The chat-template analysis of a one-file trainer, run with `flags`, on a Qwen3-shaped target."""
    target = write_json(tmp_path / "target" / "config.json", {"num_hidden_layers": 4})
    write_tokenizer(tmp_path / "target")
    tree = SourceTree("training", "t", write_tree(tmp_path / "trainer", {"train.py": trainer}))
    settings = read_training_settings(flags, tmp_path, tree) if flags is not None else None
    ctx = SideContext("training", tree, TargetConfig(load_config("target", target)), settings=settings, base=tmp_path)
    run_side(ctx, only={"chat-template"})
    return ctx


PLAIN = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
PASSES_ARGUMENT = (
    "def render(tokenizer, messages, args):\n"
    "    return tokenizer.apply_chat_template(messages, chat_template=args.chat_template, tokenize=False)\n"
    "\n\n"
    "def add_cli_args(parser):\n"
    '    parser.add_argument("--chat-template", type=str)\n'
)


def test_a_template_the_trainer_passes_from_its_settings_is_the_one_it_renders_with(tmp_path: Path) -> None:
    (tmp_path / "plain.jinja").write_text(PLAIN)
    wiring = resolve_wiring(_training_rendering(tmp_path, PASSES_ARGUMENT, "--chat-template plain.jinja"))
    template = wiring.aspect("chat_template")
    assert template is not None and template.exchange.startswith("[user] What is 2 + 2?")
    cited = {(step.location.path, step.location.line) for step in template.steps}
    assert {("plain.jinja", 1), ("train.py", 2), ("--training-args", 1)} <= cited


def test_a_passed_template_whose_value_is_not_read_is_a_note_not_the_tokenizers(tmp_path: Path) -> None:
    ctx = _training_rendering(tmp_path, PASSES_ARGUMENT)
    assert resolve_wiring(ctx).aspect("chat_template") is None
    (note,) = [note.text for note in ctx.notes if "chat_template=" in note.text]
    assert "chat_template=args.chat_template (train.py:2), whose value is not read" in note
