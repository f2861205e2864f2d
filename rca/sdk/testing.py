"""The harness that runs an analyzer's own examples (`VALID`, `INVALID`), as the tests do for every
analyzer found: it writes each example's source tree, configs, weights and dumps to a directory,
analyzes the side, and checks what the example says it must conclude.

An INVALID example names the line its finding cites in one of three ways, so that no line is
counted by hand in a file the harness writes:

* `key=("torch_dtype",)`: the line of that key in the config named by `path` (`draft.json`,
  `target.json`, `target/config.json`), as the harness writes it;
* a marker `# finding: NAME` at the end of the line in the source file named by `path`;
* `line=N`, given outright.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rca.inputs.configs import TargetConfig, load_config
from rca.inputs.draft import load_draft
from rca.inputs.jsonpos import loads
from rca.inputs.launch import read_launch_settings, read_training_settings
from rca.inputs.sources import SourceTree
from rca.model import Tap, Wiring
from rca.static.analyzer import Analyzer, Example, registry
from rca.static.context import SideContext
from rca.static.engine import run_side
from rca.static.facts import CapturedTaps, DraftWidth
from rca.static.wiring import resolve_wiring

__all__ = [
    "analyze_example",
    "check_example",
    "expected_line",
    "write_json",
    "write_safetensors",
    "write_tree",
]

SAFETENSORS_DTYPES = ("I64", "I32", "I16", "I8", "U8", "BOOL", "F64", "F32", "F16", "BF16")
_MARKER = re.compile(r"#\s*finding:\s*([a-z0-9-]+)\s*$")


def write_json(path: Path, data: Mapping[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    return path


def write_safetensors(path: Path, tensors: Mapping[str, tuple[str, tuple[int, ...], Any]]) -> Path:
    """A small safetensors file: tensor name -> (dtype as safetensors spells it, shape, values or
    None for zeros), written with the safetensors library (the `probes` extra)."""
    import torch
    from safetensors.torch import save_file

    dtypes = dict(
        zip(
            SAFETENSORS_DTYPES,
            (
                torch.int64,
                torch.int32,
                torch.int16,
                torch.int8,
                torch.uint8,
                torch.bool,
                torch.float64,
                torch.float32,
                torch.float16,
                torch.bfloat16,
            ),
            strict=True,
        )
    )
    dtypes |= {"F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}  # FP8 exports' weights
    built = {
        name: torch.zeros(shape, dtype=dtypes[dtype])
        if values is None
        else torch.tensor(list(values), dtype=dtypes[dtype]).reshape(shape)
        for name, (dtype, shape, values) in tensors.items()
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(built, str(path))
    return path


def write_tree(root: Path, files: Mapping[str, str]) -> Path:
    for relpath, text in files.items():
        path = root / relpath
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def _side(analyzer: type[Analyzer]) -> str:
    return "serving" if "serving" in analyzer.sides else "training"  # both-sided analyzers run as serving


def analyze_example(
    directory: Path, analyzer: type[Analyzer], example: Example, side: str | None = None
) -> SideContext:
    """Write the example under `directory` and analyze one side of it (every analyzer of the side
    runs, as in a diagnosis): the training side when the example gives both, else the analyzer's."""
    side = side or ("training" if example.serving_files else _side(analyzer))
    files = example.serving_files if side == "serving" and example.serving_files else example.files
    root = write_tree(directory / f"{side}-src", files)
    target_file = directory / ("target/config.json" if example.target_weights else "target.json")
    target = TargetConfig(load_config("target", write_json(target_file, example.target)))
    if example.target_weights:
        write_safetensors(directory / "target" / "model.safetensors", example.target_weights)
    if example.weights:
        write_safetensors(directory / "model.safetensors", example.weights)
    for name, data in (example.draft_files or {}).items():
        (directory / name).write_bytes(data)
    draft = load_draft(write_json(directory / "draft.json", example.draft)) if example.draft else None
    parent = None
    if example.parent_weights and example.draft:
        write_safetensors(directory / "parent" / "model.safetensors", example.parent_weights)
        parent = load_draft(
            write_json(directory / "parent" / "config.json", example.draft), directory, "--parent-draft"
        )
    dumps = None
    if example.dumps:
        dumps = directory / "dumps"
        for name, content in example.dumps.items():
            write_json(dumps / name, content)
    engine = (
        SourceTree("engine", "example engine", write_tree(directory / "engine", example.engine))
        if example.engine
        else None
    )
    if example.tokenizer_config is not None:
        write_json(target_file.parent / "tokenizer_config.json", example.tokenizer_config)
    if example.tokenizer is not None:
        write_json(target_file.parent / "tokenizer.json", example.tokenizer)
    tree = SourceTree(side, "example", root)
    settings = None
    if side == "training" and example.training_args:
        settings = read_training_settings(example.training_args, None, tree)
    elif example.settings and (side == "serving" or not example.serving_files):
        settings = read_launch_settings(example.settings, None, tree)
    ctx = SideContext(side, tree, target, draft, dumps, engine, settings=settings, parent=parent)
    run_side(ctx)
    return ctx


def expected_line(example: Example) -> int | None:
    """The line an INVALID example's finding must cite: given, computed from `key` in the config
    `path` names, or from the `# finding: NAME` marker in the source file `path` names."""
    if example.line is not None:
        return example.line
    if example.key is not None:
        configs = {"draft.json": example.draft, "target.json": example.target, "target/config.json": example.target}
        data = configs.get(example.path or "")
        if data is None:
            raise ValueError(f"key={example.key!r}: path {example.path!r} names no config ({', '.join(configs)})")
        document = loads(json.dumps(data, indent=2) + "\n")
        if example.key not in document.lines:
            raise ValueError(f"key={example.key!r} is not in {example.path}")
        return document.lines[example.key][0]
    sources = {**example.files, **(example.serving_files or {})}
    text = sources.get(example.path or "")
    if text is None:
        return None
    marked = [number for number, line in enumerate(text.splitlines(), 1) if _marked(line, example.finding)]
    if len(marked) != 1:
        raise ValueError(f"{example.path}: {len(marked)} lines marked '# finding: {example.finding}', need one")
    return marked[0]


def _marked(line: str, finding: str | None) -> bool:
    match = _MARKER.search(line)
    return match is not None and match.group(1) == finding


def check_example(directory: Path, analyzer: type[Analyzer], kind: str, example: Example) -> None:
    """Analyze the example and assert what it says: a VALID one gives the expected taps and no
    finding of this analyzer; an INVALID one exactly its finding, with its message, path and line.
    Every finding reported along the way must be one its analyzer declares."""
    ctx = analyze_example(directory, analyzer, example)
    assert not [note for note in ctx.notes if "failed" in note.text], ctx.notes + ctx.debug
    produced = [fact for fact in ctx.facts if fact.analyzer == analyzer.name]
    own = [finding for finding in ctx.findings if finding.code == analyzer.code]
    if example.serving_files:  # both sides: what each established, compared
        serving = analyze_example(directory, analyzer, example, "serving")
        assert [fact for fact in serving.facts if fact.analyzer == analyzer.name], serving.notes
        own += analyzer().across(resolve_wiring(ctx), resolve_wiring(serving))
    elif ctx.side == "serving":  # compared with a training side given no source: serving's own record stands
        own += analyzer().across(Wiring("training", (), None), resolve_wiring(ctx))
    assert produced or own or not analyzer.provides, f"{analyzer.name} established nothing: {ctx.notes}"
    if example.captured is not None:
        captured = ctx.fact(CapturedTaps)
        assert captured is not None, ctx.notes
        assert [str(tap) for tap in captured.taps] == list(example.captured)
    if example.slots is not None:
        wiring = resolve_wiring(ctx)
        assert [str(tap) for tap in wiring.slots] == list(example.slots), wiring.notes
        assert wiring.verifier_last == (Tap.parse(example.verifier_last) if example.verifier_last else None)
    if example.fc_slots is not None:
        width = ctx.fact(DraftWidth)
        assert width is not None and width.slots == example.fc_slots
    if kind == "VALID":
        assert not own, [finding.message for finding in own]
    else:
        assert [finding.name for finding in own] == [example.finding]
        assert own[0].message == example.message
        assert own[0].location.path == example.path or own[0].location.path.endswith(
            "/" + (example.path or "")
        )  # configs are shown by path
        assert own[0].location.line == expected_line(example)
    for finding in ctx.findings:  # whatever ran: every finding is one its analyzer declares, for a catalog hypothesis
        declared = {
            (report.name, report.hypothesis)
            for other in registry().analyzers
            if other.code == finding.code
            for report in other.reports
        }
        assert (finding.name, finding.hypothesis) in declared, finding
