"""Time `rca history` over a synthetic 1,000-commit history against re-diagnosing every commit.

    python scripts/history_benchmark.py [--commits 1000]

The repository (written with `git fast-import`, not timed) holds the SGLang-shaped test tree and
its draft and target configs. Most commits touch a README; every 100th touches the serving model
file without changing the wiring, and every 250th changes the draft's ids (alternately breaking
and restoring the wiring). The baseline is the naive way, one diagnosis per commit, estimated
from the mean of diagnosing a sample of commits in this process; the figure is the ratio.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rca.diagnose import diagnose  # noqa: E402
from rca.history.changes import history  # noqa: E402
from rca.history.revisions import Context, Repository, Snapshot  # noqa: E402
from rca.inputs import Inputs  # noqa: E402

TREE = ROOT / "tests" / "trees" / "sglang_like"
TRAINING = ROOT / "tests" / "trees" / "speculators_like"
TARGET = ROOT / "cases" / "kimi-k25-consistent" / "target" / "config.json"
MODEL = "sglang/srt/models/deepseek_like.py"


def _blob(path: str, data: bytes) -> bytes:
    return b"M 100644 inline " + path.encode() + b"\ndata " + str(len(data)).encode() + b"\n" + data + b"\n"


def _draft(ids: list[int]) -> bytes:
    return (
        json.dumps(
            {
                "architectures": ["LlamaForCausalLMEagle3"],
                "hidden_size": 7168,
                "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids},
            },
            indent=2,
        )
        + "\n"
    ).encode()


def build(directory: Path, commits: int) -> Path:
    subprocess.run(["git", "init", "-q", str(directory)], check=True)
    stream = bytearray()
    model = (TREE / MODEL).read_bytes()
    for number in range(commits):
        files = b""
        if number == 0:
            for path in sorted(TREE.rglob("*.py")):
                files += _blob(path.relative_to(TREE).as_posix(), path.read_bytes())
            target = json.loads(TARGET.read_text())
            target["architectures"] = ["KimiLikeForConditionalGeneration"]
            files += _blob("target/config.json", json.dumps(target, indent=2).encode()) + _blob(
                "draft/config.json", _draft([2, 30, 58])
            )
        elif number % 250 == 0:
            files += _blob("draft/config.json", _draft([2, 30, 58] if (number // 250) % 2 == 0 else [2, 30, 57]))
        elif number % 100 == 0:
            model += f"# touched by commit {number}\n".encode()
            files += _blob(MODEL, model)
        else:
            files += _blob("README.md", f"notes {number}\n".encode())
        message = f"commit {number}".encode()
        stream += (
            b"commit refs/heads/main\ncommitter Bench <bench@example.com> "
            + str(1700000000 + number).encode()
            + b" +0000\n"
        )
        stream += b"data " + str(len(message)).encode() + b"\n" + message + b"\n"
        stream += files + b"\n"
    subprocess.run(["git", "fast-import", "--quiet"], input=bytes(stream), cwd=directory, check=True)
    subprocess.run(["git", "symbolic-ref", "HEAD", "refs/heads/main"], cwd=directory, check=True)
    return directory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=1000)
    parser.add_argument("--sample", type=int, default=10, help="commits diagnosed one by one for the baseline")
    args = parser.parse_args()
    directory = Path(tempfile.mkdtemp(prefix="rca-history-bench-"))
    try:
        build(directory, args.commits)
        repository = Repository(directory)
        head = repository.revision("HEAD")
        context = Context.of(repository, Inputs(training=str(TRAINING), draft="draft", target="target"), head)
        started = time.perf_counter()
        found = history(repository, context, None, head)
        elapsed = time.perf_counter() - started
        sample = [revision for revision, _ in repository.commits(None, head)][: args.sample]
        timings = []
        with Snapshot(repository, context) as snapshot:
            for revision in sample:
                started = time.perf_counter()
                diagnose(snapshot.inputs_at(revision), parallel=False)
                timings.append(time.perf_counter() - started)
        naive = statistics.mean(timings) * found.commits
        print(
            f"rca history over {found.commits} commits: {elapsed:.2f} s, {found.analyzed} commits "
            f"re-analyzed, {len(found.changes)} wiring changes found"
        )
        print(
            f"baseline (one diagnosis per commit, {statistics.mean(timings):.3f} s each over {len(timings)} "
            f"sampled): {naive:.1f} s"
        )
        print(f"ratio: {naive / elapsed:.0f}x faster than the baseline; budget: under 30 s")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
