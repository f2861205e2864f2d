"""Bad and hostile inputs, as a user (or someone preparing files for one) would give them.

Every row runs one command on a deployment whose inputs are all good but one, and checks what the
project promises for bad input: the documented exit status, exactly one `rca: error:` line that
names the input and says how to fix it, no traceback, nothing of the analyzed code executed (its
files would leave a marker), and nothing written outside the output.
"""

from __future__ import annotations

import gzip
import io
import json
import logging
import os
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rca.cli import app
from rca.errors import SourceFetchError
from rca.inputs import sources
from tests.conftest import HUB, TREES, edit, hub_snapshot, make_patch, sglang_like_configs, write_json
from tests.test_cli import EMBED_EDITS, MODEL

runner = CliRunner()


@dataclass
class Deployment:
    """Good inputs, in one scratch directory, for a row to spoil one of."""

    root: Path
    serving: Path
    training: Path
    draft: Path
    target: Path
    marker: Path  # written by the analyzed code if anything ever ran it
    extra: list[str] = field(default_factory=list)  # options a row adds

    def args(self) -> list[str]:
        return [
            "--serving", str(self.serving), "--training", str(self.training),
            "--draft", str(self.draft), "--target", str(self.target), *self.extra,
        ]  # fmt: skip


@dataclass(frozen=True)
class Bad:
    id: str
    spoil: Callable[[Deployment], list[str] | None]  # changes the deployment; returns the command, or None for diagnose
    says: str  # what the error line must contain (the input it names)
    code: int = 2
    seconds: float | None = None  # how long it may take, for an input that once hung or exhausted memory


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _loop(path: Path) -> Path:
    path.symlink_to(path)
    return path


def _option(flag: str, value: Callable[[Deployment], Path | str]) -> Callable[[Deployment], None]:
    def spoil(deployment: Deployment) -> None:
        deployment.extra += [flag, str(value(deployment))]

    return spoil


def _run_config(text: str, name: str = "run.yaml") -> Callable[[Deployment], None]:
    """The trainer's run config, as given with --training-args."""

    def spoil(deployment: Deployment) -> None:
        (deployment.root / name).write_text(text)
        deployment.extra += ["--training-args", str(deployment.root / name)]

    return spoil


def _replace(attribute: str, value: Callable[[Deployment], Path]) -> Callable[[Deployment], None]:
    def spoil(deployment: Deployment) -> None:
        setattr(deployment, attribute, value(deployment))

    return spoil


def _patch(text: str) -> Callable[[Deployment], None]:
    def spoil(deployment: Deployment) -> None:
        patch = deployment.root / "serving.patch"
        patch.write_text(text)
        deployment.extra += ["--serving-patch", str(patch)]

    return spoil


def _patch_bytes(data: bytes) -> Callable[[Deployment], None]:
    def spoil(deployment: Deployment) -> None:
        patch = deployment.root / "serving.patch"
        patch.write_bytes(data)
        deployment.extra += ["--serving-patch", str(patch)]

    return spoil


def _fifo_over(path: Path) -> None:
    path.unlink()
    _fifo(path)


def _draft_text(text: str | bytes) -> Callable[[Deployment], None]:
    def spoil(deployment: Deployment) -> None:
        deployment.draft.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))

    return spoil


def _serving_syntax_error(deployment: Deployment) -> None:
    model = deployment.serving / MODEL
    model.write_text(
        model.read_text().replace(
            "    def set_eagle3_layers_to_capture(self, layer_ids: Optional[List[int]] = None):",
            "    def set_eagle3_layers_to_capture(self, layer_ids:",
        )
    )


def _declare_speculative_algorithm(deployment: Deployment) -> None:
    (deployment.serving / "sglang/srt/server_args.py").write_text(
        'def add_cli_args(parser):\n    parser.add_argument("--speculative-algorithm", type=str)\n'
    )


TRAINING_READER = "speculators/data_generation/custom_worker.py"


def _layers(deployment: Deployment, value: object) -> None:
    config = json.loads(deployment.target.read_text())
    config["text_config"].pop("num_hidden_layers", None)
    if value is not None:
        config["text_config"]["num_hidden_layers"] = value
    write_json(deployment.target, config)


def _expression(path: Path, expression: str) -> None:
    """Append a statement holding `expression` to a source file the analysis parses."""
    path.write_text(path.read_text() + f"\nHUGE = {expression}\n")


def _ids(value: str) -> str:
    """A draft config whose nested ids are `value` (JSON text)."""
    head = '{"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 7168, '
    return head + '"eagle_config": {"eagle_aux_hidden_state_layer_ids": ' + value + "}}"


def _dumps(text: str | bytes | None) -> Callable[[Deployment], None]:
    """A --dumps directory whose data_config.json holds `text` (None: no directory at all)."""

    def spoil(deployment: Deployment) -> None:
        dumps = deployment.root / "dumps"
        if text is not None:
            dumps.mkdir()
            (dumps / "data_config.json").write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
        deployment.extra += ["--dumps", str(dumps)]

    return spoil


def _target_text(text: str | bytes) -> Callable[[Deployment], None]:
    def spoil(deployment: Deployment) -> None:
        deployment.target.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))

    return spoil


def _launch_file(data: bytes) -> Callable[[Deployment], None]:
    def spoil(deployment: Deployment) -> None:
        launch = deployment.root / "launch.sh"
        launch.write_bytes(data)
        deployment.extra += ["--serving-args", str(launch)]

    return spoil


def _git(root: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-c", "user.name=Test", "-c", "user.email=test@example.com", *args],
        cwd=root, check=True, capture_output=True,
    )  # fmt: skip


def _repository(deployment: Deployment, commits: int = 2) -> Path:
    """The deployment as a git repository with `commits` commits (the last one changes the draft)."""
    _git(deployment.root, "init", "-q")
    for number in range(commits):
        (deployment.root / "NOTES.txt").write_text(f"revision {number}\n")
        _git(deployment.root, "add", "-A")
        _git(deployment.root, "commit", "-q", "--no-verify", "-m", f"revision {number}")
    return deployment.root


def _diff(deployment: Deployment, *args: str, repo: Path | None = None) -> list[str]:
    inputs = ["--serving", "serving", "--training", "training", "--draft", "draft", "--target", "target"]
    return ["diff", *args, "--quiet", "--repo", str(repo or deployment.root), *inputs]


def _broken_at_head(deployment: Deployment) -> list[str]:
    _repository(deployment)
    deployment.draft.write_text("{not json")
    _git(deployment.root, "commit", "-q", "-a", "-m", "break the draft config")
    return _diff(deployment, "HEAD")


def _bare(deployment: Deployment) -> list[str]:
    _repository(deployment)
    bare = deployment.root.parent / "bare.git"
    _git(deployment.root.parent, "clone", "-q", "--bare", str(deployment.root), str(bare))
    return _diff(deployment, repo=bare)


def _shallow(deployment: Deployment) -> list[str]:
    _repository(deployment, commits=3)
    clone = deployment.root.parent / "shallow"
    _git(deployment.root.parent, "clone", "-q", "--depth", "1", f"file://{deployment.root}", str(clone))
    return _diff(deployment, "HEAD~2..HEAD", repo=clone)


_INPUTS = '[inputs]\nserving = "serving"\ntraining = "training"\ndraft = "draft"\ntarget = "target"\n'


def _case(deployment: Deployment, text: str | None) -> None:
    """A case directory beside the deployment whose case.toml is `text` (None: a pipe)."""
    case = deployment.root / "case"
    case.mkdir()
    for name in ("serving", "training", "draft", "target"):
        (case / name).symlink_to(deployment.root / name)
    if text is None:
        _fifo(case / "case.toml")
    else:
        (case / "case.toml").write_text(text or _INPUTS)


def _draft_file(name: str, data: bytes) -> Callable[[Deployment], None]:
    """A file of the draft's checkpoint, next to its config."""

    def spoil(deployment: Deployment) -> None:
        (deployment.draft.parent / name).write_bytes(data)

    return spoil


def _safetensors(header: object, data: bytes = b"") -> bytes:
    raw = json.dumps(header).encode()
    return len(raw).to_bytes(8, "little") + raw + data


def _draft_field(key: str, value: object) -> Callable[[Deployment], None]:
    def spoil(deployment: Deployment) -> None:
        config = json.loads(deployment.draft.read_text())
        write_json(deployment.draft, {**config, key: value})

    return spoil


def _draft_index(weight_map: object) -> Callable[[Deployment], None]:
    return _draft_file("model.safetensors.index.json", json.dumps({"weight_map": weight_map}).encode())


def _hub_link_out(model: str, file: str) -> Callable[[Deployment], None]:
    """The target, draft and parent as a hub download (tests/fixtures/hf-cache), where one file of
    `model` is a link out of its repository (to a copy of itself: only the link is wrong)."""

    def spoil(deployment: Deployment) -> None:
        hub = Path(shutil.copytree(HUB, deployment.root / "hub", symlinks=True))
        snapshots = {name: hub_snapshot(hub, name) for name in ("target", "draft", "parent")}
        link = snapshots[model] / file
        elsewhere = deployment.root / "elsewhere" / file
        elsewhere.parent.mkdir()
        shutil.copyfile(link, elsewhere)
        link.unlink()
        link.symlink_to(elsewhere)
        deployment.target, deployment.draft = snapshots["target"], snapshots["draft"]
        deployment.extra += ["--parent-draft", str(snapshots["parent"])]

    return spoil


# Unpickled without weights_only, this would run a shell command that leaves the marker.
_CODE_PICKLE = "cos\nsystem\n(S'touch {marker}'\ntR."


def _torch_zip(pickled: bytes, compressed: bool = False) -> bytes:
    """A zip-format torch.save file whose pickle is `pickled` (deflated when `compressed`)."""
    import torch

    saved, rebuilt = io.BytesIO(), io.BytesIO()
    torch.save({"d2t": torch.zeros(4, dtype=torch.long)}, saved)
    with zipfile.ZipFile(saved) as original, zipfile.ZipFile(rebuilt, "w") as archive:
        for record in original.infolist():
            if record.filename.endswith("data.pkl"):
                record.compress_type = zipfile.ZIP_DEFLATED if compressed else zipfile.ZIP_STORED
            archive.writestr(record, pickled if record.filename.endswith("data.pkl") else original.read(record))
    return rebuilt.getvalue()


def _bin(pickled: bytes | Callable[[Deployment], bytes], compressed: bool = False) -> Callable[[Deployment], None]:
    """The draft's pytorch_model.bin, its pickle replaced (made when the row runs)."""

    def spoil(deployment: Deployment) -> None:
        data = pickled(deployment) if callable(pickled) else pickled
        _draft_file("pytorch_model.bin", _torch_zip(data, compressed))(deployment)

    return spoil


# Malformed pickles, as a weights-only unpickler meets them.
BROKEN_PICKLES = {
    "empty-stack": b"\x80\x020.",  # POP with nothing on the stack
    "stop-on-empty-stack": b"\x80\x02.",
    "missing-memo-key": b"\x80\x02h\x05.",  # BINGET of a key never put
    "bad-reduce": b"\x80\x02K\x01K\x02R.",  # REDUCE calling an integer
}


DEEP = "[" * 100_000 + "]" * 100_000
# "Billion laughs": nine lines of nine aliases each, which a loader expands to 9**9 strings.
LAUGHS = 'a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n' + "".join(
    f"{name}: &{name} [{', '.join(['*' + previous] * 9)}]\n"
    for previous, name in zip("abcdefgh", "bcdefghi", strict=True)
)
CLIMBING = "--- a/../../../../etc/hostname\n+++ b/../../../../etc/hostname\n@@ -1 +1 @@\n-x\n+y\n"

ROWS = [
    # -- the draft's checkpoint, next to its config
    Bad("draft-weights-header-length", _draft_file("model.safetensors", (10**9).to_bytes(8, "little")), "bad header"),
    Bad("draft-weights-header-list", _draft_file("model.safetensors", _safetensors([1, 2])), "corrupt safetensors"),
    Bad("draft-weights-header-number", _draft_file("model.safetensors", _safetensors(7)), "corrupt safetensors"),
    Bad(
        "draft-weights-claim-more-bytes",
        _draft_file(
            "model.safetensors", _safetensors({"d2t": {"dtype": "I64", "shape": [64], "data_offsets": [0, 512]}})
        ),
        "truncated safetensors shard",
    ),
    Bad("draft-index-missing-shard", _draft_index({"d2t": "model-00001.safetensors"}), "a shard the index names"),
    Bad("draft-index-outside", _draft_index({"d2t": "../outside.safetensors"}), "outside the checkpoint directory"),
    Bad("draft-index-not-a-map", _draft_index(["model.safetensors"]), "weight_map is not a mapping"),
    Bad(
        "draft-bin-not-a-pickle",
        _draft_file("pytorch_model.bin", b"not a pickle"),
        "pytorch_model.bin is not in torch.save's zip format",
    ),
    Bad(
        "draft-bin-legacy-pickle-with-code",
        lambda d: _draft_file("pytorch_model.bin", _CODE_PICKLE.format(marker=d.marker).encode())(d),
        "pytorch_model.bin is not in torch.save's zip format",
    ),
    Bad(
        "draft-bin-needs-code",
        _bin(lambda d: _CODE_PICKLE.format(marker=d.marker).encode()),
        "pytorch_model.bin cannot be loaded as plain tensors: it pickles os.system, which would run code",
    ),
    *(
        Bad(
            f"draft-bin-pickle-{name}",
            _bin(pickled),
            "pytorch_model.bin cannot be loaded as plain tensors: it is corrupt (",
        )
        for name, pickled in BROKEN_PICKLES.items()
    ),
    Bad(
        "draft-bin-pickle-inflates",  # 80 MiB of pickle, deflated to 80 KB
        _bin(b"\x80\x02B" + (80 << 20).to_bytes(4, "little") + bytes(80 << 20) + b".", compressed=True),
        "pytorch_model.bin's pickle and compressed records expand to 83,886,088 bytes; rca holds at most 67,108,864",
        seconds=20,
    ),
    Bad(
        "draft-index-a-million-shards",
        lambda d: _draft_index({f"t{i}": f"model-{i:07d}.safetensors" for i in range(10**6)})(d),
        "the index names 1,000,000 shard files; a checkpoint has at most 10,000",
        seconds=20,
    ),
    Bad(
        "draft-index-a-million-tensors-in-a-missing-shard",
        lambda d: _draft_index(dict.fromkeys((f"t{i}" for i in range(10**6)), "model-1.safetensors"))(d),
        "a shard the index names is missing",
        seconds=20,
    ),
    Bad("draft-vocab-size-string", _draft_field("draft_vocab_size", "32000"), "draft_vocab_size"),
    Bad("draft-vocab-size-negative", _draft_field("draft_vocab_size", -1), "draft_vocab_size"),
    Bad("draft-max-positions-float", _draft_field("max_position_embeddings", 2048.5), "max_position_embeddings"),
    # -- models as a hub download: links into the repository's blobs are read, links out of it are not
    Bad("hub-target-config-links-out", _hub_link_out("target", "config.json"), "--target file is a link out of"),
    Bad("hub-draft-config-links-out", _hub_link_out("draft", "config.json"), "--draft file is a link out of"),
    Bad("hub-draft-weights-link-out", _hub_link_out("draft", "model.safetensors"), "shard is a link out of"),
    Bad("hub-parent-config-links-out", _hub_link_out("parent", "config.json"), "--parent-draft file is a link out"),
    Bad("hub-parent-weights-link-out", _hub_link_out("parent", "model.safetensors"), "shard is a link out of"),
    # -- paths of every kind, for each input that names a file
    Bad("draft-missing", _replace("draft", lambda d: d.root / "nope.json"), "--draft path does not exist"),
    Bad("draft-fifo", _replace("draft", lambda d: _fifo(d.root / "draft.fifo")), "not a regular file"),
    Bad("draft-dev-zero", _replace("draft", lambda d: Path("/dev/zero")), "/dev/zero"),
    Bad("draft-symlink-loop", _replace("draft", lambda d: _loop(d.root / "loop.json")), "symlink loop"),
    Bad(
        "draft-directory-without-config",
        _replace("draft", lambda d: Path(d.root / "empty").mkdir() or d.root / "empty"),
        "has no config.json",
    ),
    Bad("target-fifo", _replace("target", lambda d: _fifo(d.root / "target.fifo")), "not a regular file"),
    Bad("target-dev-zero", _replace("target", lambda d: Path("/dev/zero")), "/dev/zero"),
    Bad("patch-missing", _option("--serving-patch", lambda d: d.root / "nope.patch"), "patch file does not exist"),
    Bad("patch-directory", _option("--serving-patch", lambda d: d.root), "patch file is a directory"),
    Bad("patch-fifo", _option("--serving-patch", lambda d: _fifo(d.root / "p.fifo")), "not a regular file"),
    Bad("patch-dev-zero", _option("--serving-patch", lambda d: Path("/dev/zero")), "/dev/zero"),
    Bad("launch-file-fifo", _option("--serving-args", lambda d: _fifo(d.root / "launch.fifo")), "not a regular file"),
    Bad("launch-file-directory", _option("--serving-args", lambda d: d.root), "launch file is a directory"),
    # -- configs
    Bad("draft-nested-100000-deep", _draft_text(DEEP), "nested deeper than"),
    Bad("draft-not-utf8", _draft_text(b"\xff\xfe{}"), "not UTF-8"),
    Bad("draft-json-list", _draft_text("[1, 2]"), "not an object"),
    Bad("draft-truncated", _draft_text('{"architectures": ['), "malformed JSON"),
    *(
        Bad(f"draft-ids-{name}", _draft_text(_ids(value)), "eagle_config.eagle_aux_hidden_state_layer_ids is")
        for name, value in [
            ("string", '"2,30,58"'),
            ("floats", "[2.0, 30.0, 58.0]"),
            ("nan", "NaN"),
            ("mapping", '{"a": 1}'),
            ("empty", "[]"),
            ("strings", '["2", "30", "58"]'),
            ("booleans", "[true, false]"),
        ]
    ),
    # -- patches
    Bad("patch-climbs-out", _patch(CLIMBING), "outside the source tree"),
    Bad(
        "patch-absolute",
        _patch(CLIMBING.replace("a/../../../..", "").replace("b/../../../..", "")),
        "outside the source tree",
    ),
    Bad("patch-no-hunks", _patch(f"--- a/{MODEL}\n+++ b/{MODEL}\n"), "no hunks"),
    Bad("patch-not-a-diff", _patch("just some text\n"), "no file changes found"),
    Bad("patch-does-not-apply", _patch(make_patch(MODEL, "no such\nlines\n", "other\nlines\n")), "does not apply"),
    Bad(
        "patch-ends-inside-a-hunk", _patch(f"--- a/{MODEL}\n+++ b/{MODEL}\n@@ -1,3 +1,3 @@\n x\n"), "ends inside a hunk"
    ),
    Bad(
        "draft-malformed",
        _draft_text('{"architectures": ["X"],\n  "eagle_config": {"ids": [2, 30]\n'),
        "malformed JSON",
    ),
    # -- targets
    Bad("target-layers-10e30", lambda d: _layers(d, 10**30), "no model has that many decoder layers"),
    Bad("target-layers-zero", lambda d: _layers(d, 0), "not a positive integer"),
    Bad("target-layers-negative", lambda d: _layers(d, -3), "not a positive integer"),
    Bad("target-layers-string", lambda d: _layers(d, "61"), "not a positive integer"),
    Bad("target-layers-bool", lambda d: _layers(d, True), "not a positive integer"),
    Bad("target-no-layers", lambda d: _layers(d, None), "no num_hidden_layers"),
    # -- source files no parser should be handed
    Bad(
        "serving-5000-nested-parentheses",
        lambda d: _expression(d.serving / MODEL, "(" * 5000 + "1" + ")" * 5000),
        "too many nested parentheses",
    ),
    Bad(
        "serving-5000-term-expression",
        lambda d: _expression(d.serving / MODEL, "+".join(["a"] * 5000)),
        "nested 5001 deep",
    ),
    Bad(
        "training-100000-term-expression",
        lambda d: _expression(d.training / TRAINING_READER, "+".join(["a"] * 100_000)),
        "too deeply nested",
    ),
    Bad(
        "serving-beyond-the-parsing-budget",
        lambda d: _expression(d.serving / MODEL, "[" + "a, " * 170_000 + "]"),
        "beyond the parsing budget",
    ),
    Bad(
        "training-5000-nested-brackets",
        lambda d: _expression(d.training / TRAINING_READER, "[" * 5000 + "]" * 5000),
        "too many nested parentheses",
    ),
    # -- where reports and captures go
    Bad(
        "output-is-a-directory",
        lambda d: ["diagnose", "--quiet", *d.args(), "--output", str(d.root)],
        "--output names a directory",
    ),
    Bad(
        "output-under-proc",
        lambda d: ["diagnose", "--quiet", *d.args(), "--output", "/proc/rca-nope/report.json"],
        "cannot create the directory of --output",
    ),
    Bad(
        "capture-output-is-a-file",
        lambda d: ["capture", "--output", str(d.draft), "--", "true"],
        "--output names a file",
    ),
    Bad(
        "capture-output-under-proc",
        lambda d: ["capture", "--output", "/proc/rca-nope", "--", "true"],
        "cannot be written",
    ),
    Bad(
        "capture-command-not-found",
        lambda d: ["capture", "--output", str(d.root / "cap"), "--", "rca-no-such-command"],
        "command not found",
    ),
    Bad(
        "capture-command-not-executable",
        lambda d: ["capture", "--output", str(d.root / "cap"), "--", str(d.draft)],
        "cannot run",
    ),
    Bad("capture-no-command", lambda d: ["capture", "--output", str(d.root / "cap")], "no launch command"),
    # -- case directories
    Bad(
        "case-new-under-a-file",
        lambda d: ["case", "new", str(d.draft / "case"), *d.args(), "--quiet"],
        "cannot write the case directory",
    ),
    Bad(
        "case-new-under-proc",
        lambda d: ["case", "new", "/proc/rca-nope/case", *d.args(), "--quiet"],
        "cannot write the case directory",
    ),
    Bad(
        "case-new-not-empty", lambda d: ["case", "new", str(d.serving), *d.args(), "--quiet"], "exists and is not empty"
    ),
    Bad(
        "case-new-bad-draft-names-the-original",
        lambda d: _draft_text("{")(d) or ["case", "new", str(d.root / "case"), *d.args(), "--quiet"],
        "draft/config.json",
    ),
    Bad(
        "case-run-missing",
        lambda d: ["case", "run", str(d.root / "no-case"), "--quiet"],
        "case directory does not exist",
    ),
    Bad("case-show-never-run", lambda d: _case(d, "") or ["case", "show", str(d.root / "case")], "has not been run"),
    Bad(
        "case-toml-fifo",
        lambda d: _case(d, None) or ["case", "run", str(d.root / "case"), "--quiet"],
        "not a regular file",
    ),
    Bad(
        "case-toml-malformed",
        lambda d: _case(d, "[inputs\n") or ["case", "run", str(d.root / "case"), "--quiet"],
        "malformed case file",
    ),
    Bad(
        "case-toml-no-inputs",
        lambda d: _case(d, 'title = "x"\n') or ["case", "run", str(d.root / "case"), "--quiet"],
        "no [inputs] table",
    ),
    Bad(
        "case-toml-unknown-input",
        lambda d: _case(d, '[inputs]\nservng = "x"\n') or ["case", "run", str(d.root / "case"), "--quiet"],
        "unknown inputs",
    ),
    Bad(
        "case-toml-input-not-string",
        lambda d: _case(d, "[inputs]\ndraft = 3\n") or ["case", "run", str(d.root / "case"), "--quiet"],
        "not a string",
    ),
    Bad(
        "case-expected-not-a-tap",
        lambda d: (
            _case(d, _INPUTS + '[expected]\nserving = ["h3", "layer7"]\n')
            or ["case", "check", "--quiet", str(d.root / "case")]
        ),
        "'layer7', which is not a tap",
    ),
    Bad(
        "case-expected-taps-not-a-list",
        lambda d: (
            _case(d, _INPUTS + '[expected]\ntraining = "h3"\n') or ["case", "check", "--quiet", str(d.root / "case")]
        ),
        "not a list of strings",
    ),
    Bad(
        "case-expected-bad-status",
        lambda d: (
            _case(d, _INPUTS + '[expected]\nstatus = "fine"\n') or ["case", "check", "--quiet", str(d.root / "case")]
        ),
        "consistent, mismatch or inconclusive",
    ),
    Bad(
        "case-expected-fix-ids-strings",
        lambda d: (
            _case(d, _INPUTS + '[expected]\nfix_ids = ["2"]\n') or ["case", "check", "--quiet", str(d.root / "case")]
        ),
        "a list of integers",
    ),
    Bad(
        "case-expected-unknown-key",
        lambda d: _case(d, _INPUTS + '[expected]\nroot = "x"\n') or ["case", "check", "--quiet", str(d.root / "case")],
        "unknown [expected] keys",
    ),
    # -- more configs, launch files and dump metadata
    Bad("draft-over-the-size-limit", _draft_text("{" + " " * (17 * 1024 * 1024) + "}"), "bytes; at most"),
    Bad("draft-empty-file", _draft_text(""), "malformed JSON"),
    Bad("target-empty-file", _target_text(""), "malformed JSON"),
    Bad("target-json-list", _target_text("[]"), "not an object"),
    Bad("target-nested-100000-deep", _target_text(DEEP), "nested deeper than"),
    Bad("target-not-utf8", _target_text(b'{"a": "\xff"}'), "not UTF-8"),
    Bad("target-layers-float", lambda d: _layers(d, 61.5), "not a positive integer"),
    Bad(
        "target-directory-without-config",
        _replace("target", lambda d: Path(d.root / "no-config").mkdir() or d.root / "no-config"),
        "has no config.json",
    ),
    Bad("target-missing", _replace("target", lambda d: d.root / "nope.json"), "--target path does not exist"),
    Bad("patch-not-utf8", _patch_bytes(b"--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-\xff\n+x\n"), "not UTF-8"),
    Bad("patch-over-the-size-limit", _patch_bytes(b"#" * (33 * 1024 * 1024)), "bytes; at most"),
    Bad("launch-file-not-utf8", _launch_file(b"python -m sglang.launch_server --tp \xff\n"), "not UTF-8"),
    Bad("launch-unbalanced-quote", _option("--serving-args", lambda d: "--tp '8"), "--serving-args"),
    Bad("dumps-missing", _dumps(None), "--dumps path does not exist"),
    Bad("dumps-is-a-file", _option("--dumps", lambda d: d.draft), "--dumps is not a directory"),
    Bad("dump-metadata-malformed", _dumps('{"hidden_states": '), "malformed JSON"),
    Bad("dump-metadata-100000-deep", _dumps(DEEP), "nested deeper than"),
    Bad("dump-metadata-not-utf8", _dumps(b'{"layer_ids": "\xff"}'), "not UTF-8"),
    Bad("dump-metadata-ids-string", _dumps('{"hidden_states": {"layer_ids": "2,30"}}'), "not a list of layer ids"),
    Bad(
        "dump-metadata-fifo",
        lambda d: _dumps("{}")(d) or _fifo_over(d.root / "dumps" / "data_config.json"),
        "not a regular file",
    ),
    Bad("serving-release-malformed", _replace("serving", lambda d: "sglang=="), "--serving source"),
    Bad("serving-release-bad-version", _replace("serving", lambda d: "sglang==0.5..12"), "'0.5..12' is not a valid"),
    # -- repositories and revisions, for rca diff and rca history
    Bad("diff-not-a-repository", lambda d: _diff(d), "not a git repository"),
    Bad("diff-repository-missing", lambda d: _diff(d, repo=d.root / "nope"), "repository path does not exist"),
    Bad("diff-no-commits", lambda d: _repository(d, commits=0) and _diff(d), "has no commits yet"),
    Bad("diff-unknown-revision", lambda d: _repository(d) and _diff(d, "v9.9"), "unknown revision 'v9.9'"),
    Bad("diff-unknown-range-end", lambda d: _repository(d) and _diff(d, "HEAD..nope"), "unknown revision 'nope'"),
    Bad("diff-symmetric-range", lambda d: _repository(d) and _diff(d, "HEAD~1...HEAD"), "symmetric ranges"),
    Bad("diff-first-commit", lambda d: _repository(d, commits=1) and _diff(d, "HEAD"), "is the first commit"),
    Bad("diff-shallow-clone", _shallow, "shallow clone"),
    Bad("diff-bare-repository-without-range", _bare, "bare repository has no working tree"),
    Bad("diff-input-broken-at-a-revision", _broken_at_head, "draft/config.json:1:2 (at "),
    Bad(
        "history-unknown-since",
        lambda d: (
            _repository(d) and ["history", "--quiet", "--since", "nope", "--repo", str(d.root), "--draft", "draft"]
        ),
        "unknown revision 'nope'",
    ),
    Bad("history-not-a-repository", lambda d: ["history", "--quiet", "--repo", str(d.root)], "not a git repository"),
    # -- the command line itself
    Bad("unknown-option", lambda d: ["diagnose", "--no-such-option"], "No such option"),
    Bad("unknown-command", lambda d: ["diagnosis"], "No such command"),
    Bad("missing-required-option", lambda d: ["probe", "fingerprint"], "Missing option '--dumps'"),
    Bad("option-without-value", lambda d: ["diagnose", *d.args(), "--format"], "requires an argument"),
    Bad("unknown-format", lambda d: ["diagnose", "--quiet", *d.args(), "--format", "yaml"], "unknown format 'yaml'"),
    Bad("unknown-side", lambda d: ["graph", "--quiet", *d.args(), "--side", "both"], "unknown side 'both'"),
    Bad("unknown-hypothesis", lambda d: ["explain", "no-such-hypothesis"], "unknown hypothesis"),
    # -- sources and the rest of the command line
    Bad("serving-syntax-error", _serving_syntax_error, "syntax error"),
    Bad("nothing-to-diagnose", lambda d: ["diagnose", "--quiet", "--draft", str(d.draft)], "nothing to diagnose"),
    Bad(
        "engine-without-training",
        lambda d: ["diagnose", "--quiet", *d.args()[:2], *d.args()[4:], "--training-engine", str(d.serving)],
        "no --training was given",
    ),
    Bad(
        "launch-flag-without-value",
        lambda d: (
            _declare_speculative_algorithm(d)
            or ["diagnose", "--quiet", *d.args(), "--serving-args", "--tp 8 --speculative-algorithm"]
        ),
        "--speculative-algorithm needs a value",
    ),
    Bad(
        "launch-flag-value-60000-deep",
        lambda d: (
            _declare_speculative_algorithm(d)
            or ["diagnose", "--quiet", *d.args(), "--serving-args", "--speculative-algorithm " + DEEP[50_000:150_000]]
        ),
        "the value of --speculative-algorithm is nested deeper than 100 levels",
    ),
    Bad(
        "launch-args-without-serving",
        lambda d: ["diagnose", "--quiet", *d.args()[2:], "--serving-args", "--speculative-algorithm EAGLE"],
        "no serving source was given",
    ),
    Bad("serving-missing", _replace("serving", lambda d: d.root / "no-such-dir"), "--serving source"),
    Bad("serving-not-python", _replace("serving", lambda d: write_json(d.root / "x.json", {})), "not a .py file"),
    Bad(
        "engine-missing", _option("--training-engine", lambda d: d.root / "no-such-engine"), "--training-engine source"
    ),
    Bad("launch-file-missing", _option("--serving-args", lambda d: d.root / "launch.sh"), "no such launch file"),
    Bad("launch-file-name-too-long", _option("--serving-args", lambda d: "x" * 300), "no such launch file"),
    Bad(
        "training-args-without-training",
        lambda d: ["diagnose", "--quiet", *d.args()[:2], *d.args()[4:], "--training-args", "--chat-template qwen"],
        "no training source was given",
    ),
    Bad(
        "training-run-config-malformed",
        _run_config("data:\n  chat_template: [qwen\n"),
        "malformed run config",
    ),
    Bad(
        "training-run-config-not-a-mapping",
        _run_config("- qwen\n"),
        "not a mapping of sections",
    ),
    Bad("training-run-config-alias-bomb", _run_config(LAUGHS), "run.yaml: its aliases expand to more than", seconds=20),
    Bad(
        "training-run-config-self-referencing-alias",
        _run_config("data: &data\n  chat_template: *data\n"),
        "run.yaml:2: the alias *data refers to the value that holds it",
    ),
    Bad(
        "training-run-config-python-tag",
        lambda d: _run_config(f"data: !!python/object/apply:os.system ['touch {d.marker}']\n")(d),
        "run.yaml:1: the tag !!python/object/apply:os.system",
    ),
    Bad("training-run-config-100000-deep", _run_config(DEEP), "run.yaml:1: nested deeper than 100 levels", seconds=20),
    Bad(
        "training-run-config-json-100000-deep",
        _run_config('{"data": ' + DEEP + "}", "run.json"),
        "run.json:1: nested deeper than 100 levels",
        seconds=20,
    ),
    Bad(
        "training-run-config-fifo",
        lambda d: _fifo(d.root / "run.yaml") and _option("--training-args", lambda d: d.root / "run.yaml")(d),
        "run config is not a regular file (a device, pipe or socket) (fix: pass the trainer's",
    ),
    Bad(
        "training-args-directory",
        _option("--training-args", lambda d: d.training),
        "launch file is a directory, not a file (fix: pass the script or command line that starts the trainer",
    ),
]


@pytest.fixture
def deployment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Deployment:
    monkeypatch.setenv("RCA_CACHE_DIR", str(tmp_path / "cache"))  # a release fetched is a file written
    root = tmp_path / "deployment"
    serving = Path(shutil.copytree(TREES / "sglang_like", root / "serving"))
    training = Path(shutil.copytree(TREES / "speculators_like", root / "training"))
    marker = tmp_path / "EXECUTED"
    for tree in (serving, training):  # any execution of analyzed code would leave the marker
        (tree / "rca_marker_module.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    draft, target = sglang_like_configs(root, [2, 30, 58])
    return Deployment(root, serving, training, draft, target, marker)


def _listing(root: Path) -> dict[str, int]:
    return {
        str(path.relative_to(root)): path.lstat().st_mtime_ns
        for path in root.rglob("*")
        if not path.is_symlink() and path.is_file()
    }


@pytest.mark.parametrize("row", ROWS, ids=lambda row: row.id)
def test_bad_input_is_one_line_with_its_fix(row: Bad, deployment: Deployment, tmp_path: Path) -> None:
    command = row.spoil(deployment) or ["diagnose", "--quiet", "--no-cache", *deployment.args()]
    before = _listing(tmp_path)
    started = time.monotonic()
    result = runner.invoke(app, command)
    elapsed = time.monotonic() - started
    assert result.exit_code == row.code, result.output
    assert row.seconds is None or elapsed < row.seconds, f"took {elapsed:.1f} s"
    errors = [line for line in result.stderr.splitlines() if line.startswith("rca: error:")]
    assert len(errors) == 1 and len([line for line in result.stderr.splitlines() if line.strip()]) == 1, result.stderr
    assert row.says in errors[0] and "(fix: " in errors[0], errors[0]
    assert "Traceback" not in result.output
    assert not deployment.marker.exists(), "analyzed code was executed"
    assert _listing(tmp_path) == before, "a file was written or changed outside the output"


def _unreadable(monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    """Opening `path` fails as it does for a file the user may not read (tests may run as root,
    whom file modes do not stop)."""
    denied = path.resolve()
    real_open = Path.open

    def guarded(self: Path, *args, **kwargs):
        if self.resolve() == denied:
            raise PermissionError(13, "Permission denied", str(self))
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", guarded)


_D2T = _safetensors({"d2t": {"dtype": "I64", "shape": [4], "data_offsets": [0, 32]}}, bytes(32))


def _weights(deployment: Deployment, name: str, data: bytes) -> Path:
    """A file of the draft's checkpoint, and its path."""
    _draft_file(name, data)(deployment)
    return deployment.draft.parent / name


UNREADABLE = [
    ("draft", lambda d: d.draft, [], "--draft file cannot be read (Permission denied)"),
    ("target", lambda d: d.target, [], "--target file cannot be read (Permission denied)"),
    ("patch", lambda d: _patch(CLIMBING)(d) or d.root / "serving.patch", [], "patch file cannot be read"),
    ("launch-file", lambda d: _launch_file(b"--tp 8\n")(d) or d.root / "launch.sh", [], "launch file cannot be read"),
    ("dump-metadata", lambda d: _dumps("{}")(d) or d.root / "dumps" / "data_config.json", [], "dump metadata cannot"),
    ("case-file", lambda d: _case(d, "") or d.root / "case" / "case.toml", ["case"], "the case file cannot be read"),
    ("draft-weights", lambda d: _weights(d, "model.safetensors", _D2T), [], "a safetensors shard cannot be read"),
    (
        "draft-bin",
        lambda d: _weights(d, "pytorch_model.bin", _torch_zip(b"}.")),
        [],
        "pytorch_model.bin cannot be read",
    ),
]


@pytest.mark.parametrize(("name", "denied", "command", "says"), UNREADABLE, ids=[row[0] for row in UNREADABLE])
def test_an_unreadable_input_is_one_line_naming_it(
    name: str, denied, command: list[str], says: str, deployment: Deployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = denied(deployment)
    _unreadable(monkeypatch, path)
    arguments = (
        ["case", "run", "--quiet", str(deployment.root / "case")]
        if command
        else ["diagnose", "--quiet", "--no-cache", *deployment.args()]
    )
    result = runner.invoke(app, arguments)
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("rca: error: ") and says in line and str(path.name) in line, line
    assert "(fix: make it readable by this user" in line, line  # a permission, not a file to download again


def test_a_link_out_of_a_source_tree_and_a_pipe_in_it_are_skipped_with_a_note(
    deployment: Deployment, tmp_path: Path
) -> None:
    """The serving model file links to an edited copy outside the tree (read, it would make the
    verdict a mismatch), and a pipe is named like a module (read, it would block the run for good):
    the run goes on without both, names each in a warning, and ends in seconds."""
    model = deployment.serving / MODEL
    elsewhere = tmp_path / "elsewhere.py"
    elsewhere.write_text(edit(model.read_text(), *EMBED_EDITS))
    model.unlink()
    model.symlink_to(elsewhere)
    _fifo(deployment.serving / "sglang" / "srt" / "pipe.py")
    before = _listing(tmp_path)
    command = [sys.executable, "-m", "rca", "diagnose", "--no-cache", "--format", "json", *deployment.args()]
    start = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert time.perf_counter() - start < 60
    assert result.returncode == 3, result.stderr  # the serving side has lost its model file: inconclusive
    assert "Traceback" not in result.stderr
    assert json.loads(result.stdout)["warnings"] == [
        "sglang/srt/pipe.py: skipped, not a regular file (a pipe, device or socket)",
        f"{MODEL}: skipped, a link to {elsewhere.resolve()}, outside the source tree",
    ]
    assert _listing(tmp_path) == before, "a file was written or changed outside the output"


def test_a_release_the_index_does_not_have_leaves_nothing_in_the_cache(
    deployment: Deployment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pip finds no such release (played by a downloader that fails as rca's does once pip and the
    index have answered, after a partial download): one line, and the cache keeps no lock file,
    download or directory of it, so the next try starts clean."""
    cache = tmp_path / "cache"

    def no_such_release(name: str, version: str, wheel_dir: Path, progress=None) -> None:
        wheel_dir.mkdir(parents=True, exist_ok=True)
        (wheel_dir / f"{name}-{version}-py3-none-any.whl.part").write_bytes(b"partial")
        raise SourceFetchError(
            f"{name} has no release {version} on the package index", fix="pass a release that exists"
        )

    monkeypatch.setattr(sources, "_pip_download", no_such_release)
    # No download happens: the test session's download reporter (on a fresh cache) must not print it
    # from inside the command's captured streams.
    monkeypatch.setattr(logging.getLogger("rca.inputs.sources"), "handlers", [])
    deployment.serving = "sglang==99.0.0"
    result = runner.invoke(app, ["diagnose", "--quiet", "--no-cache", *deployment.args()])
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("rca: error: sglang has no release 99.0.0") and "(fix: " in line, line
    assert "Traceback" not in result.output
    assert [path.relative_to(cache).as_posix() for path in cache.rglob("*")] == ["locks"]


# -- tensor inputs: dumps, a target's weights and index, for the probes -------------------------------


@dataclass
class Tensors:
    """A tiny target model directory and good dumps of it, for a row to spoil one of."""

    root: Path
    target: Path
    dumps: Path


@pytest.fixture(scope="module")
def tensor_originals(tmp_path_factory: pytest.TempPathFactory) -> Tensors:
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tests.dumpwriters import write_dumps
    from tests.tinymodels import VOCAB, reference_taps, save_model, tiny_model

    root = tmp_path_factory.mktemp("tensors")
    model = tiny_model("llama", 8)
    target = save_model(model, root / "target")
    token_ids = [torch.randint(0, VOCAB, (24,), generator=torch.Generator().manual_seed(seed)) for seed in range(2)]
    taps = [reference_taps(model, ids) for ids in token_ids]
    write_dumps(
        root / "dumps", "safetensors", token_ids, [[t["h3"], t["h5"], t["h7"]] for t in taps], [t["h8"] for t in taps]
    )
    return Tensors(root, target, root / "dumps")


@pytest.fixture
def tensors(tensor_originals: Tensors, tmp_path: Path) -> Tensors:
    root = tmp_path / "tensors"
    shutil.copytree(tensor_originals.root, root)
    return Tensors(root, root / "target", root / "dumps")


def _rewrite_dump(tensors: Tensors, change: Callable[[dict], dict]) -> None:
    from safetensors.torch import load_file, save_file

    for file in sorted(tensors.dumps.glob("*.safetensors"))[:1]:
        save_file(change(load_file(file)), file)


def _narrow(data: dict) -> dict:
    return {
        **data,
        "hidden_states": data["hidden_states"][:, :, :32].contiguous(),
        "verifier_last": data["verifier_last"][:, :32].contiguous(),
    }


def _replace_dumps(tensors: Tensors, name: str, data: bytes) -> None:
    shutil.rmtree(tensors.dumps)
    tensors.dumps.mkdir()
    (tensors.dumps / name).write_bytes(data)


def _bomb() -> bytes:
    """A few hundred KB of gzip that expands to 300 MB."""
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb") as stream:
        for _ in range(300):
            stream.write(bytes(1 << 20))
    return buffer.getvalue()


def _index(tensors: Tensors, weight_map: object) -> None:
    write_json(tensors.target / "model.safetensors.index.json", {"metadata": {}, "weight_map": weight_map})


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _probe(name: str, spoil: Callable[[Tensors], None]) -> Callable[[Tensors], list[str]]:
    options = {"shape": [], "embedding": ["--target"], "fingerprint": ["--device", "cpu", "--target"]}[name]

    def run(tensors: Tensors) -> list[str]:
        spoil(tensors)
        target = [str(tensors.target)] if options else []
        return ["probe", name, "--quiet", "--dumps", str(tensors.dumps), *options, *target]

    return run


def _set_config(path: Path, **values: object) -> None:
    write_json(path, {**json.loads(path.read_text()), **values})


def _lineage(tensors: Tensors, child_header: object) -> list[str]:
    """`rca probe vocab-lineage` on a fine-tuned draft whose safetensors header is `child_header`."""
    commands = []
    for name, header in (
        ("parent", {"d2t": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}}),
        ("child", child_header),
    ):
        directory = tensors.root / name
        directory.mkdir()
        write_json(directory / "config.json", {"architectures": ["LlamaForCausalLMEagle3"]})
        (directory / "model.safetensors").write_bytes(_safetensors(header, bytes(8)))
        commands.append(str(directory))
    parent, child = commands
    return ["probe", "vocab-lineage", "--quiet", "--draft", child, "--parent-draft", parent]


def _template(spoil: Callable[[Tensors], object], extra: tuple[str, ...] = ()) -> Callable[[Tensors], list[str]]:
    """`rca probe template` on the target with a tiny tokenizer and a working template, once `spoil` broke one."""
    from tests.tinytokenizers import write_tokenizer

    def run(tensors: Tensors) -> list[str]:
        write_tokenizer(tensors.target)
        spoil(tensors)
        return ["probe", "template", "--quiet", "--dumps", str(tensors.dumps), "--target", str(tensors.target), *extra]

    return run


DUMP_ROWS = [
    Bad("widths-differ-across-files", lambda t: _rewrite_dump(t, _narrow), "wide"),
    Bad(
        "token-out-of-vocabulary",
        lambda t: _rewrite_dump(t, lambda d: {**d, "input_ids": d["input_ids"] + 1000}),
        "sample_0.safetensors: token id 1,",  # the dump, not the weights, is named
    ),
    Bad(
        "token-10e12",
        lambda t: _rewrite_dump(t, lambda d: {**d, "input_ids": d["input_ids"] + 10**12}),
        "sample_0.safetensors: token id 1,000,000,000,",
    ),
    Bad(
        "token-negative", lambda t: _rewrite_dump(t, lambda d: {**d, "input_ids": d["input_ids"] - 300}), "is negative"
    ),
    Bad(
        "token-minus-seven",
        lambda t: _rewrite_dump(t, lambda d: {**d, "input_ids": d["input_ids"].clamp(max=-7)}),
        "sample_0.safetensors: token id -7 is negative",
    ),
    Bad(
        "no-tokens",
        lambda t: _rewrite_dump(t, lambda d: {k: v[:0].contiguous() for k, v in d.items()}),
        "holds no tokens",
    ),
    Bad(
        "nan-states",
        lambda t: _rewrite_dump(t, lambda d: {**d, "hidden_states": d["hidden_states"] * float("nan")}),
        "NaN or Inf",
    ),
    Bad("symlink-loop-in-dumps", lambda t: _loop(t.dumps / "z.safetensors") and None, "leads nowhere"),
    Bad("dumps-missing", lambda t: shutil.rmtree(t.dumps), "does not exist"),
    Bad("dumps-empty", lambda t: [f.unlink() for f in t.dumps.iterdir()] and None, "holds no hidden-state dump files"),
    Bad("dump-truncated", lambda t: _truncate(sorted(t.dumps.glob("*.safetensors"))[0]), "truncated or corrupt"),
    Bad(
        "dump-not-safetensors",
        lambda t: sorted(t.dumps.glob("*.safetensors"))[0].write_text("x"),
        "truncated or corrupt",
    ),
    Bad("target-missing", lambda t: shutil.rmtree(t.target), "target"),
]
INDEX_ROWS = [  # the embedding probe reads the rows it needs through the index, shard by shard
    Bad("index-weight-map-list", lambda t: _index(t, ["model.safetensors"]), "weight_map is not a mapping"),
    Bad("index-weight-map-number", lambda t: _index(t, 7), "weight_map is not a mapping"),
    Bad("index-weight-map-string", lambda t: _index(t, "model.safetensors"), "weight_map is not a mapping"),
    Bad(
        "index-not-json",
        lambda t: (t.target / "model.safetensors.index.json").write_text("{"),
        "weight_map is not a mapping",
    ),
    Bad(
        "index-shard-climbs-out",
        lambda t: _index(t, {"model.embed_tokens.weight": "../../outside.safetensors"}),
        "outside the checkpoint directory",
    ),
    Bad(
        "index-shard-absolute",
        lambda t: _index(t, {"model.embed_tokens.weight": "/etc/hostname"}),
        "outside the checkpoint directory",
    ),
    Bad(
        "index-shard-missing",
        lambda t: _index(t, {"model.embed_tokens.weight": "model-00002.safetensors"}),
        "is missing",
    ),
    Bad("index-fifo", lambda t: _fifo(t.target / "model.safetensors.index.json") and None, "not a regular file"),
    Bad("weights-truncated", lambda t: _truncate(t.target / "model.safetensors"), "truncated"),
]
# Chat templates that build far more than any conversation: each step that builds is measured first.
HUGE_TEMPLATES = {
    "center-200-million": "{{ 'x'.center(200000000) }}",
    "center-ten-billion": "{{ 'x'.center(10**10) }}",
    "doubled-in-a-namespace": (
        "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}"
    ),
    "doubled-with-plus": (
        "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s }}"
    ),
    "one-string-joined-ten-times": "{% set s = 'x' * 999999 %}{{ [s, s, s, s, s, s, s, s, s, s]|join }}",
    "replace": "{{ ('x' * 100000).replace('x', 'y' * 10000) }}",
    "indent": "{{ ('x\\n' * 100000)|indent(10000) }}",
    "format-width": "{{ '{:>1000000000}'.format('x') }}",
    "percent-width": "{{ '%1000000000s' % 'x' }}",
    "written-in-a-loop": "{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}",
    "written-in-a-block": "{% set b %}{% for i in range(100000) %}{{ 'x' * 100000 }}{% endfor %}{% endset %}{{ b }}",
}

TENSOR_ROWS = [
    *(
        Bad(f"{probe}-{row.id}", _probe(probe, row.spoil), row.says)
        for probe in ("fingerprint", "embedding")
        for row in DUMP_ROWS
    ),
    *(Bad(f"embedding-{row.id}", _probe("embedding", row.spoil), row.says) for row in INDEX_ROWS),
    *(Bad(f"template-{row.id}", _template(row.spoil), row.says) for row in DUMP_ROWS if row.id.startswith("token-")),
    Bad(
        "fingerprint-target-of-no-layers",
        _probe("fingerprint", lambda t: _set_config(t.target / "config.json", num_hidden_layers=0)),
        "num_hidden_layers is 0, not a positive integer",
    ),
    Bad(
        "vocab-lineage-d2t-of-2-to-the-62",
        lambda t: _lineage(t, {"d2t": {"dtype": "I64", "shape": [2**62], "data_offsets": [0, 8]}}),
        "d2t has shape [4611686018427387904] of I64, but 8 bytes of data",
    ),
    Bad(
        "fingerprint-weights-truncated",
        _probe("fingerprint", lambda t: _truncate(t.target / "model.safetensors")),
        "do not load",
    ),
    Bad("shape-pt-garbage", _probe("shape", lambda t: _replace_dumps(t, "data_0.pt", b"x")), "not a torch.save file"),
    Bad("shape-ckpt-gzip-bomb", _probe("shape", lambda t: _replace_dumps(t, "data_0.ckpt.gz", _bomb())), "a gzip bomb"),
    Bad(
        "shape-ckpt-gzip-corrupt",
        _probe("shape", lambda t: _replace_dumps(t, "data_0.ckpt.gz", b"\x1f\x8bnot")),
        "corrupt gzip",
    ),
    Bad(
        "compare-capture-missing",
        lambda t: ["probe", "compare", "--capture", str(t.root / "none"), "--dumps", str(t.dumps)],
        "--capture path does not exist",
    ),
    Bad("compare-nothing-to-compare", lambda t: ["probe", "compare", "--capture", str(t.dumps)], "nothing to compare"),
    Bad("shape-dumps-missing", _probe("shape", lambda t: shutil.rmtree(t.dumps)), "does not exist"),
    Bad(
        "template-no-template",
        _template(lambda t: (t.target / "tokenizer_config.json").unlink()),
        "the target has no chat template",
    ),
    Bad(
        "template-no-tokenizer",
        _template(lambda t: (t.target / "tokenizer.json").unlink()),
        "cannot run: the target has no tokenizer.json",
    ),
    Bad(
        "template-tokenizer-garbage",
        _template(lambda t: (t.target / "tokenizer.json").write_text('{"model": 1')),
        "tokenizer.json: not a tokenizer",
    ),
    Bad(
        "template-does-not-render",
        _template(lambda t: (t.target / "tokenizer_config.json").write_text('{"chat_template": "{% if %}"}')),
        "tokenizer_config.json:1: the chat template does not render",
    ),
    *(
        Bad(
            f"template-builds-{name}",
            _template(lambda t, text=text: write_json(t.target / "tokenizer_config.json", {"chat_template": text})),
            "tokenizer_config.json:2: the chat template is refused: ",
            seconds=20,
        )
        for name, text in HUGE_TEMPLATES.items()
    ),
    Bad(
        "template-kwargs-not-json",
        _template(lambda t: None, ("--chat-template-kwargs", "{enable_thinking: false}")),
        "--chat-template-kwargs cannot be read as JSON (Expecting property name",
    ),
    Bad(
        "template-kwargs-60000-deep",
        _template(lambda t: None, ("--chat-template-kwargs", "[" * 60_000 + "]" * 60_000)),
        "--chat-template-kwargs cannot be read as JSON (nested deeper than 100 levels)",
    ),
    Bad(
        "shape-dump-truncated",
        _probe("shape", lambda t: _truncate(sorted(t.dumps.glob("*.safetensors"))[0])),
        "truncated or corrupt",
    ),
]


@pytest.mark.parametrize("row", TENSOR_ROWS, ids=lambda row: row.id)
def test_bad_tensor_input_is_one_line_with_its_fix(row: Bad, tensors: Tensors, tmp_path: Path) -> None:
    command = row.spoil(tensors)
    before = _listing(tmp_path)
    started = time.monotonic()
    result = runner.invoke(app, command)
    elapsed = time.monotonic() - started
    assert result.exit_code == row.code, result.output
    assert row.seconds is None or elapsed < row.seconds, f"took {elapsed:.1f} s"
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("rca: error:"), result.stderr
    assert row.says in lines[0] and "(fix: " in lines[0], lines[0]
    assert "Traceback" not in result.output
    assert _listing(tmp_path) == before, "a file was written or changed outside the output"


def _first_dump(tensors: Tensors) -> Path:
    return sorted(tensors.dumps.glob("*.safetensors"))[0]


UNREADABLE_TENSORS = [
    ("embedding", lambda t: t.target / "model.safetensors", "a safetensors shard cannot be read"),
    ("fingerprint", lambda t: t.target / "model.safetensors", "a safetensors shard cannot be read"),
    ("fingerprint", _first_dump, "a dump file cannot be read"),
    ("shape", _first_dump, "a dump file cannot be read"),
    ("template", _first_dump, "a dump file cannot be read"),
]


@pytest.mark.parametrize(
    ("probe", "denied", "says"), UNREADABLE_TENSORS, ids=[f"{row[0]}-{row[2].split()[1]}" for row in UNREADABLE_TENSORS]
)
def test_an_unreadable_tensor_file_is_one_line_naming_it(
    probe: str, denied, says: str, tensors: Tensors, monkeypatch: pytest.MonkeyPatch
) -> None:
    command = _template(lambda t: None)(tensors) if probe == "template" else _probe(probe, lambda t: None)(tensors)
    path = denied(tensors)
    _unreadable(monkeypatch, path)
    result = runner.invoke(app, command)
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("rca: error: ") and says in line and path.name in line, line
    assert "(fix: make it readable by this user" in line, line  # not called corrupt, nor to be downloaded again


def test_a_source_without_an_eagle3_path_is_inconclusive_and_says_what_to_pass(
    deployment: Deployment, tmp_path: Path
) -> None:
    """A release that predates EAGLE-3 (lmdeploy before 0.11) is no bad file, but the verdict's one
    line names it and what to pass instead; exit 3, as for any inconclusive diagnosis."""
    plain = tmp_path / "plain" / "engine" / "models"
    plain.mkdir(parents=True)
    (plain / "llama.py").write_text(
        "class LlamaForCausalLM:\n    def forward(self, input_ids):\n        return input_ids\n"
    )
    args = deployment.args()
    args[1] = str(tmp_path / "plain")
    result = runner.invoke(app, ["diagnose", "--no-cache", "--format", "json", *args])
    assert result.exit_code == 3, result.output
    summary = json.loads(result.stdout)["verdict"]["summary"]
    assert (
        "plain has no EAGLE-3 path" in summary
        and "pass a source or release that serves EAGLE-3 drafts to --serving" in summary
    )


# -- the analysis cache: an entry is trusted only when it proves rca wrote it for its key ----------


def _corrupt_entries(cache: Path, spoil: Callable[[bytes, bytes], bytes]) -> int:
    """Apply `spoil(entry, secret)` to every entry of the analysis cache; how many there were."""
    secret = (cache / "secret").read_bytes()
    entries = sorted((cache / "entries").iterdir())
    for entry in entries:
        entry.write_bytes(spoil(entry.read_bytes(), secret))
    return len(entries)


CORRUPTIONS = {
    "truncated": lambda data, secret: data[: len(data) // 2],
    "empty": lambda data, secret: b"",
    "header only": lambda data, secret: data[:38],
    "a payload byte flipped": lambda data, secret: data[:-1] + bytes([data[-1] ^ 1]),
    "another key's hmac": lambda data, secret: data[:6] + bytes(32) + data[38:],
    "not an entry": lambda data, secret: b"\x80\x05garbage" * 100,
}


@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_a_corrupt_analysis_cache_entry_is_ignored_and_rebuilt(
    corruption: str, deployment: Deployment, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_result_cache: Path
) -> None:
    """Every entry of the analysis cache spoiled (as a crash mid-write, a full disk or another
    program would leave it): the next run ignores each one, gives the same diagnosis as a run
    without the cache, and writes the entries again."""
    from rca.static import parsing

    cache = tmp_path / "analysis"
    monkeypatch.setenv("RCA_ANALYSIS_CACHE", str(cache))
    monkeypatch.setattr(parsing, "_PARSED", parsing.OrderedDict())
    uncached = runner.invoke(app, ["diagnose", "--format", "json", "--no-cache", *deployment.args()])
    assert not cache.exists(), "--no-cache wrote to the analysis cache"
    first = runner.invoke(app, ["diagnose", "--format", "json", *deployment.args()])
    assert first.exit_code == uncached.exit_code == 0, first.output
    assert first.stdout == uncached.stdout
    assert _corrupt_entries(cache, CORRUPTIONS[corruption]) >= 3  # parses and text searches
    spoiled = {entry.name: entry.read_bytes() for entry in (cache / "entries").iterdir()}

    shutil.rmtree(fresh_result_cache / "results", ignore_errors=True)  # analyze again, not remember
    monkeypatch.setattr(parsing, "_PARSED", parsing.OrderedDict())
    again = runner.invoke(app, ["diagnose", "--format", "json", *deployment.args()])
    assert again.exit_code == 0, again.output
    assert again.stdout == uncached.stdout
    assert "Traceback" not in again.output
    rebuilt = {entry.name: entry.read_bytes() for entry in (cache / "entries").iterdir()}
    assert all(rebuilt[name] != spoiled[name] for name in spoiled), "a spoiled entry was kept"


def test_a_forged_analysis_cache_entry_is_never_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An entry that passes the HMAC check (someone who read the secret) but whose pickle would
    call a function: the unpickler rebuilds syntax trees only, so it is refused and nothing runs."""
    import hashlib
    import hmac
    import pickle

    from rca.static import filecache

    marker = tmp_path / "RAN"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    monkeypatch.setenv("RCA_ANALYSIS_CACHE", str(tmp_path / "analysis"))
    name = filecache.key("parse", "0" * 40)
    assert filecache.store_tree(name, {"a": 1})
    entry = tmp_path / "analysis" / "entries" / name
    secret = (tmp_path / "analysis" / "secret").read_bytes()
    payload = pickle.dumps(Payload())
    entry.write_bytes(b"RCAA1\n" + hmac.new(secret, name.encode() + b"\0" + payload, hashlib.sha256).digest() + payload)
    assert filecache.load_tree(name) is None
    assert not marker.exists(), "a cache entry ran code"


def test_a_damaged_analysis_cache_secret_is_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A secret of the wrong length (a truncated write): entries are neither trusted nor lost for
    good; the next write makes another secret and its entries are read again."""
    from rca import signed
    from rca.static import filecache

    cache = tmp_path / "analysis"
    monkeypatch.setenv("RCA_ANALYSIS_CACHE", str(cache))
    monkeypatch.setattr(signed, "_OPENED", {})
    name = filecache.key("example", "a")
    assert filecache.store_json(name, {"value": 1})
    (cache / "secret").write_bytes(b"short")
    signed.forget()  # a new process
    assert filecache.load_json(name) is None
    assert filecache.store_json(name, {"value": 2}) and filecache.load_json(name) == {"value": 2}
    assert len((cache / "secret").read_bytes()) == 32
