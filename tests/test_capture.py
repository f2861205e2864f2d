"""The serving capture, end to end: `rca capture` runs an engine in SGLang's shape (its draft,
its vocabulary-parallel embedding, one process per tensor-parallel rank) and the hook saves what
the draft's fc receives; `rca probe compare` lines it up with the training dumps or the target."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from safetensors import safe_open  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from rca.cli import app  # noqa: E402
from tests.dumpwriters import write_dumps  # noqa: E402
from tests.releases import CAPTURE_HOOK_ENGINES  # noqa: E402
from tests.tinymodels import VOCAB, reference_taps, save_model, tiny_model  # noqa: E402

ENGINE = Path(__file__).parent / "engines" / "sglang_shaped"
runner = CliRunner()


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    model = tiny_model("llama", 8)
    return model, save_model(model, tmp_path_factory.mktemp("target") / "llama")


@pytest.fixture(scope="module")
def prompt(tmp_path_factory) -> tuple[torch.Tensor, Path]:
    ids = torch.randint(0, VOCAB, (20,), generator=torch.Generator().manual_seed(3))
    path = tmp_path_factory.mktemp("prompt") / "prompt.json"
    path.write_text(json.dumps(ids.tolist()))
    return ids, path


def capture(
    tmp_path: Path, target_dir: Path, prompt_file: Path, taps: list[int], *extra: str
) -> tuple[subprocess.CompletedProcess, Path]:
    """`rca capture` in a real subprocess, as a user runs it in front of the launch command."""
    out = tmp_path / "cap"
    command = [
        sys.executable,
        "-m",
        "rca",
        "capture",
        "--output",
        str(out),
        "--",
        sys.executable,
        "serve.py",
        "--target",
        str(target_dir),
        "--prompt",
        str(prompt_file),
        "--taps",
        *map(str, taps),
        *extra,
    ]
    return subprocess.run(command, cwd=ENGINE, capture_output=True, text=True, timeout=300), out


def _compare_with_target(capture: Path, directory: Path):
    return runner.invoke(
        app,
        [
            "probe",
            "compare",
            "--capture",
            str(capture),
            "--target",
            str(directory),
            "--device",
            "cpu",
            "--format",
            "json",
            "--quiet",
        ],
    )


@pytest.mark.parametrize("shared", [False, True], ids=["own-embedding", "shared-embedding"])
def test_capture_saves_what_the_draft_receives(tmp_path: Path, target, prompt, shared: bool) -> None:
    model, directory = target
    ids, prompt_file = prompt
    done, out = capture(tmp_path, directory, prompt_file, [3, 5, 7], *(["--share-embedding"] if shared else []))
    assert done.returncode == 0, done.stderr
    assert "captured 1 draft input(s)" in done.stderr
    (file,) = sorted(out.glob("capture_r0_*.safetensors"))
    with safe_open(str(file), "pt") as handle:
        hidden, captured_ids = handle.get_tensor("hidden_states"), handle.get_tensor("input_ids")
    assert (
        hidden.shape == (20, 3, 64) and captured_ids.tolist() == ids.tolist()
    )  # the target's tokens, not the draft's shifted ones
    taps = reference_taps(model, ids)
    assert torch.allclose(hidden[:, 1], taps["h5"], atol=1e-4)
    result = _compare_with_target(out, directory)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["serving"] == ["h3", "h5", "h7"]


def test_compare_with_a_replayed_training_prompt_shows_the_added_slot_and_the_shift(
    tmp_path: Path, target, prompt
) -> None:
    model, directory = target
    ids, prompt_file = prompt
    taps = reference_taps(model, ids)
    other = torch.randint(0, VOCAB, (16,), generator=torch.Generator().manual_seed(9))
    other_taps = reference_taps(model, other)
    write_dumps(
        tmp_path / "dumps",
        "speculators-pt",
        [other, ids],
        [[other_taps[t] for t in ("h3", "h5", "h7")], [taps[t] for t in ("h3", "h5", "h7")]],
        [other_taps["h8"], taps["h8"]],
    )
    done, out = capture(tmp_path, directory, prompt_file, [0, 3, 5])  # the founding case: an embedding slot added
    assert done.returncode == 0, done.stderr
    result = runner.invoke(
        app,
        ["probe", "compare", "--capture", str(out), "--dumps", str(tmp_path / "dumps"), "--format", "json", "--quiet"],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["serving"] == ["?", "t0", "t1"] and report["training"] == ["t0", "t1", "t2"]
    assert [match.get("training_slot") for match in report["matches"]] == [None, 0, 1]
    assert "slot 0 (?) is not in training" in report["summary"] and "t2 is not fed" in report["summary"]
    assert "sit 1 position(s) later" in report["summary"] and "data_1.pt" in report["summary"]
    unrelated = tmp_path / "unrelated"
    write_dumps(unrelated, "speculators-pt", [other], [[other_taps[t] for t in ("h3", "h5", "h7")]], [other_taps["h8"]])
    refused = runner.invoke(app, ["probe", "compare", "--capture", str(out), "--dumps", str(unrelated), "--quiet"])
    assert refused.exit_code == 2 and "no training sample shares 8 leading tokens" in refused.stderr


@pytest.mark.parametrize(("partial", "agree"), [(False, True), (True, False)])
def test_ranks_that_captured_partial_sums_disagree(tmp_path: Path, target, prompt, partial: bool, agree: bool) -> None:
    _, directory = target
    _, prompt_file = prompt
    done, out = capture(
        tmp_path, directory, prompt_file, [3, 5, 7], "--ranks", "2", *(["--partial"] if partial else [])
    )
    assert done.returncode == 0, done.stderr
    assert sorted(file.name for file in out.iterdir()) == ["capture_r0_0.safetensors", "capture_r1_0.safetensors"]
    result = _compare_with_target(out, directory)
    assert result.exit_code == 0, result.output
    ranks = json.loads(result.stdout)["ranks"]
    assert ranks["agree"] is agree and ranks["captures"] == 1
    assert ("partial sums" in ranks["summary"]) is partial


def test_a_batch_is_cut_into_its_requests_by_their_positions(tmp_path: Path, target, prompt) -> None:
    """An engine batches a decode request's rows with two prefills: each prefill from position 0 is
    saved on its own with its own tokens, so that replaying it through the target reproduces it."""
    model, directory = target
    ids, prompt_file = prompt
    done, out = capture(tmp_path, directory, prompt_file, [3, 5, 7], "--batch")
    assert done.returncode == 0, done.stderr
    files = sorted(out.glob("capture_r0_*.safetensors"))
    assert [file.name for file in files] == ["capture_r0_0.safetensors", "capture_r0_1.safetensors"]
    for file, request in zip(files, [ids, ids.flip(0)[:12]], strict=True):
        with safe_open(str(file), "pt") as handle:
            hidden, captured_ids, metadata = (
                handle.get_tensor("hidden_states"),
                handle.get_tensor("input_ids"),
                handle.metadata(),
            )
        assert captured_ids.tolist() == request.tolist()
        assert torch.allclose(hidden[:, 2], reference_taps(model, request)["h7"], atol=1e-4)
        assert metadata["draft"] == "LlamaForCausalLMEagle3" and metadata["cut"] == "per request, from position 0"
    assert metadata["rows"] == "24-36 of 36"  # after the 4 decode rows and the first prompt's 20
    result = _compare_with_target(out, directory)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["serving"] == ["h3", "h5", "h7"] and all(match["cosine"] >= 0.99 for match in report["matches"])


def test_a_draft_called_without_positions_is_saved_whole(tmp_path: Path, target, prompt) -> None:
    _, directory = target
    _, prompt_file = prompt
    done, out = capture(tmp_path, directory, prompt_file, [3, 5, 7], "--batch", "--no-positions")
    assert done.returncode == 0, done.stderr
    (file,) = sorted(out.glob("capture_r0_*.safetensors"))
    with safe_open(str(file), "pt") as handle:
        assert handle.get_tensor("input_ids").shape == (36,)
        assert handle.metadata()["cut"] == "the whole batch (no positions)"


def _hook(monkeypatch, directory: Path):
    """The capture hook's module, loaded as an engine process loads it (enabled, writing to `directory`)."""
    import importlib.util

    from rca.evidence.capture import SITE

    monkeypatch.setenv("RCA_CAPTURE_DIR", str(directory))
    spec = importlib.util.spec_from_file_location("rca_capture_hook", SITE / "sitecustomize.py")
    hook = importlib.util.module_from_spec(spec)
    finders = list(sys.meta_path)
    spec.loader.exec_module(hook)
    monkeypatch.setattr(sys, "meta_path", finders)  # the finder it inserted goes with the test
    return hook


def test_the_hook_keeps_the_signature_engines_inspect(tmp_path: Path, monkeypatch) -> None:
    """vLLM reads a draft class's __init__ signature (vllm_config, prefix) to decide how to build it."""
    import inspect

    hook = _hook(monkeypatch, tmp_path)

    class Eagle3Draft(torch.nn.Module):
        def __init__(self, *, vllm_config: object, prefix: str = "") -> None:
            super().__init__()
            self.fc = torch.nn.Linear(6, 2)

    before = inspect.signature(Eagle3Draft.__init__)
    hook._instrument_draft(Eagle3Draft)
    assert inspect.signature(Eagle3Draft.__init__) == before
    assert list(before.parameters) == ["self", "vllm_config", "prefix"]
    assert Eagle3Draft(vllm_config=None)._rca_instrumented


def test_a_failure_of_the_hook_is_recorded_and_never_raised(tmp_path: Path, monkeypatch) -> None:
    hook = _hook(monkeypatch, tmp_path)
    hook._state["target_ids"], hook._state["width"] = torch.arange(4), 2
    assert hook._fc_hook("Eagle3Draft")(torch.nn.Linear(6, 2), (object(),)) is None  # no tensor: it cannot read it
    (line, *detail) = (tmp_path / "hook-errors.log").read_text().splitlines()
    assert line.startswith("pid ") and "the fc hook: AttributeError" in line and detail


def test_capture_says_how_the_engine_failed(tmp_path: Path) -> None:
    """An engine that dies is reported with its status and last lines, not as 'send a prompt'."""
    crash = (
        "import sys; print('Traceback (most recent call last):', file=sys.stderr); "
        "print('TypeError: __init__() missing 1 required keyword-only argument', file=sys.stderr); sys.exit(1)"
    )
    result = subprocess.run(
        [sys.executable, "-m", "rca", "capture", "--output", str(tmp_path / "cap"), "--", sys.executable, "-c", crash],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "rca: the command exited with status 1; its last lines:" in result.stderr
    assert "  TypeError: __init__() missing 1 required keyword-only argument" in result.stderr
    assert "the engine stopped before its draft ran" in result.stderr and "send the server" not in result.stderr


def test_capture_reports_what_the_hook_recorded(tmp_path: Path) -> None:
    writes = (
        "import os; open(os.path.join(os.environ['RCA_CAPTURE_DIR'], 'hook-errors.log'), 'a')"
        ".write('pid 7 the fc hook: RuntimeError: odd\\n')"
    )
    result = runner.invoke(app, ["capture", "--output", str(tmp_path / "cap"), "--", sys.executable, "-c", writes])
    assert result.exit_code == 0
    assert "the capture hook failed 1 time(s), the engine ran on untouched (first: pid 7 the fc hook" in result.stderr


def test_capture_without_a_command_and_with_nothing_captured(tmp_path: Path) -> None:
    result = runner.invoke(app, ["capture", "--output", str(tmp_path / "cap")])
    assert result.exit_code == 2 and "no launch command" in result.stderr
    result = runner.invoke(
        app, ["capture", "--output", str(tmp_path / "cap"), "--", sys.executable, "-c", "print('served')"]
    )
    assert result.exit_code == 0 and "nothing captured" in result.stderr


@pytest.mark.release
@pytest.mark.parametrize(("name", "version"), CAPTURE_HOOK_ENGINES)
def test_the_hook_finds_its_targets_in_real_releases(name: str, version: str) -> None:
    """What the hook waits for is there in the engines' code (read, never imported): the draft
    modules it would instrument define EAGLE-3 classes with an `fc`, and the embedding it watches
    exists under the module name it watches."""
    import ast
    import importlib.util

    from rca.evidence.capture import SITE
    from rca.inputs.sources import fetch_release

    spec = importlib.util.spec_from_file_location("rca_capture_hook", SITE / "sitecustomize.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)  # inert without RCA_CAPTURE_DIR: it only defines the finder
    root = fetch_release(name, version)
    embedding = next(module for module in hook._EMBEDDINGS if module.startswith(name))
    tree = ast.parse((root / (embedding.replace(".", "/") + ".py")).read_text())
    assert "VocabParallelEmbedding" in {node.name for node in tree.body if isinstance(node, ast.ClassDef)}
    prefix = next(prefix for prefix in hook._ENGINES if prefix.startswith(name))
    drafts = []
    for path in sorted((root / prefix.rstrip(".").replace(".", "/")).glob("*eagle3*.py")):
        module = ast.parse(path.read_text())
        classes = [node.name for node in module.body if isinstance(node, ast.ClassDef) and "eagle" in node.name.lower()]
        assigns_fc = any(
            isinstance(node, ast.Attribute) and node.attr == "fc" and isinstance(node.ctx, ast.Store)
            for node in ast.walk(module)
        )
        if classes and assigns_fc:
            drafts.append((path.stem, classes))
    assert any(stem == "llama_eagle3" for stem, _ in drafts), drafts


def test_an_interrupted_server_shuts_down_on_its_own(tmp_path: Path) -> None:
    """Ctrl-C reaches the server and rca alike: rca lets the server finish its own shutdown."""
    import os
    import signal
    import time

    server = (
        "import signal, sys, time\nsignal.signal(signal.SIGINT, lambda *a: (print('saved state'), "
        "sys.exit(3)))\nprint('ready', flush=True)\ntime.sleep(60)"
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "rca", "capture", "--output", str(tmp_path / "cap"), "--", sys.executable, "-c", server],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert process.stdout.readline().strip() == "ready"
    time.sleep(0.5)
    started = time.monotonic()
    os.killpg(process.pid, signal.SIGINT)  # as a terminal delivers Ctrl-C: to the whole foreground group
    out, err = process.communicate(timeout=60)
    assert process.returncode == 3 and "saved state" in out  # the server's own exit status and shutdown
    assert time.monotonic() - started < 20 and "nothing captured" in err


def test_a_command_killed_by_a_signal_exits_128_plus_its_number(tmp_path: Path) -> None:
    """As a shell reports it: SIGTERM is 143, and rca says which signal it was."""
    killed = "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"
    result = subprocess.run(
        [sys.executable, "-m", "rca", "capture", "--output", str(tmp_path / "cap"), "--", sys.executable, "-c", killed],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 143, result.stderr
    assert result.stderr.splitlines()[0] == "rca: the command was killed by SIGTERM (exit status 143)"


def test_a_capture_from_a_rotated_target_matches_no_tap_of_the_unrotated_one(tmp_path: Path, target, prompt) -> None:
    """A target with a rotation fused into its weights (QuaRot, SpinQuant's R1) feeds the draft X Q:
    no served slot resembles any tap of the model as given, and the summary names target-transformed."""
    from safetensors.torch import save_file

    _, directory = target
    _, prompt_file = prompt
    done, out = capture(tmp_path, directory, prompt_file, [3, 5, 7])
    assert done.returncode == 0, done.stderr
    (file,) = sorted(out.glob("capture_r0_*.safetensors"))
    with safe_open(str(file), "pt") as handle:
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}
    rotation, _ = torch.linalg.qr(torch.randn(64, 64, generator=torch.Generator().manual_seed(3)))
    tensors["hidden_states"] = (tensors["hidden_states"] @ rotation).contiguous()
    rotated = tmp_path / "rotated"
    rotated.mkdir()
    save_file(tensors, str(rotated / file.name))
    result = _compare_with_target(rotated, directory)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["serving"] == ["?", "?", "?"], report
    assert "target-transformed" in report["summary"] and "no serving slot resembles any tap" in report["summary"]


# -- a capture as evidence in the diagnosis: rca diagnose --capture DIR --------------------------


def _lab_capture(directory: Path, taps: tuple[str, ...], rotation: torch.Tensor | None = None) -> Path:
    """What a capture in the engine would hold for the lab target: `taps` of one dump prompt, rotated
    as a target with a rotation fused into its weights feeds them."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    from tests.enginelab import DUMPS, TARGET

    with safe_open(str(DUMPS / "sample_0.safetensors"), "pt") as handle:
        ids = handle.get_tensor("input_ids")[:32]
    states = reference_taps(AutoModelForCausalLM.from_pretrained(TARGET), ids)
    hidden = torch.stack([states[tap] for tap in taps], dim=1)
    directory.mkdir()
    tensors = {"hidden_states": (hidden @ rotation if rotation is not None else hidden).contiguous(), "input_ids": ids}
    save_file(tensors, str(directory / "capture_r0_0.safetensors"))
    return directory


def _diagnose_with(capture_dir: Path) -> dict:
    from tests.enginelab import DRAFT, DUMPS, TARGET

    result = runner.invoke(
        app,
        [
            "diagnose", "--serving", "vllm==0.33.0", "--draft", str(DRAFT), "--target", str(TARGET),
            "--dumps", str(DUMPS), "--capture", str(capture_dir), "--device", "cpu", "--format", "json", "--quiet",
        ],
    )  # fmt: skip
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.stdout)


@pytest.mark.release
def test_a_capture_in_another_basis_raises_target_transformed_by_itself(tmp_path: Path) -> None:
    """The code and the configs show nothing wrong; the capture alone shows the served states rotated."""
    rotation, _ = torch.linalg.qr(torch.randn(128, 128, generator=torch.Generator().manual_seed(3)))
    report = _diagnose_with(_lab_capture(tmp_path / "rotated", ("h1", "h2", "h3"), rotation))
    top = report["hypotheses"][0]
    assert report["verdict"]["root_cause"] == "target-transformed" and top["id"] == "target-transformed"
    assert "no serving slot resembles any tap" in top["reason"]
    assert any(c["path"] == "rotated/capture_r0_0.safetensors" for c in top["citations"])


@pytest.mark.release
def test_a_capture_that_matches_what_the_code_says_keeps_the_verdict_consistent(tmp_path: Path) -> None:
    report = _diagnose_with(_lab_capture(tmp_path / "capture", ("h1", "h2", "h3")))
    assert report["verdict"]["status"] == "consistent", report["hypotheses"][:2]
    assert report["wiring"]["serving"]["slots"] == ["h1", "h2", "h3"]


@pytest.mark.release
def test_a_capture_that_contradicts_the_serving_code_is_the_serving_wiring(tmp_path: Path) -> None:
    """A patched or misread engine: the code says [h1, h2, h3], the engine fed [h2, h3, h4]."""
    report = _diagnose_with(_lab_capture(tmp_path / "capture", ("h2", "h3", "h4")))
    assert report["wiring"]["serving"]["slots"] == ["h2", "h3", "h4"]
    assert any("the capture contradicts" in note for note in report["wiring"]["serving"]["notes"])
    assert report["verdict"]["root_cause"] == "layer-offset"
