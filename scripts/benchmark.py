"""Time `rca diagnose` on real releases against parsing their whole trees with libcst.

    python scripts/benchmark.py            # all scenarios
    python scripts/benchmark.py --quick    # the founding case only

Each scenario is diagnosed three ways, each in a fresh `rca` process so that interpreter start and
imports are counted: cold (`--no-cache`: every file it needs is read and parsed), warm (the same
inputs again: the remembered diagnosis is reused), and the baseline, which parses every Python
file of the serving and training trees with libcst in this process, as a tool that indexes a
whole tree up front would. Releases are downloaded first (not timed). Figures are ratios
against the baseline of the same run, so they compare across machines; the budgets are those of
the design (cold under 3 s, warm under 0.5 s, at least 30x faster than the baseline).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import libcst as cst

from rca.inputs.sources import SourceTree, fetch_release

ROOT = Path(__file__).resolve().parent.parent
COLD_BUDGET, WARM_BUDGET, RATIO_BUDGET = 3.0, 0.5, 30.0

LLAMA_8B = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 32, "hidden_size": 4096}
DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"],
    "num_hidden_layers": 61,
    "hidden_size": 7168,
    "first_k_dense_replace": 3,
}


@dataclass(frozen=True)
class Scenario:
    name: str
    serving: str
    training: str
    args: tuple[str, ...]  # the rest of the command line (configs, patches)


def scenarios(work: Path, quick: bool) -> list[Scenario]:
    case = ROOT / "cases" / "kimi-k25-embed-slot"
    found = [
        Scenario("founding case (sglang 0.5.12 + patch)", "sglang==0.5.12", "speculators==0.4.0", ("--case", str(case)))
    ]
    if quick:
        return found
    for name, engine, trainer, case in (
        ("lmdeploy 0.18.0, Kimi-K2.5", "lmdeploy==0.18.0", "speculators==0.4.0", "kimi-k25-on-lmdeploy"),
        (
            "vllm 0.33.0 + nvidia-modelopt 0.47.0, Llama-3.1-8B",
            "vllm==0.33.0",
            "nvidia-modelopt==0.47.0",
            "modelopt-draft-on-vllm",
        ),
        (
            "sglang 0.5.12 + nemo-automodel 0.7.0, Llama-3.1-8B",
            "sglang==0.5.12",
            "nemo-automodel==0.7.0",
            "nemo-custom-ids-on-sglang",
        ),
    ):
        found.append(Scenario(name, engine, trainer, ("--case", str(ROOT / "cases" / case))))
    for name, engine, target, draft in (
        (
            "sglang 0.5.23, DeepSeek-V3",
            "sglang==0.5.23",
            DEEPSEEK_V3,
            {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 29, 57]}},
        ),
        ("vllm 0.33.0, Llama-3.1-8B", "vllm==0.33.0", LLAMA_8B, {"eagle_aux_hidden_state_layer_ids": [2, 16, 29]}),
    ):
        directory = work / name.split(",")[0].replace(" ", "-")
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "target.json").write_text(json.dumps(target))
        (directory / "draft.json").write_text(
            json.dumps({"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": target["hidden_size"], **draft})
        )
        args = (
            "--serving",
            engine,
            "--training",
            "speculators==0.4.0",
            "--draft",
            str(directory / "draft.json"),
            "--target",
            str(directory / "target.json"),
        )
        found.append(Scenario(name, engine, "speculators==0.4.0", args))
    return found


def timed_rca(args: tuple[str, ...], env: dict[str, str]) -> float:
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "rca", "diagnose", "--quiet", *args],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    elapsed = time.perf_counter() - start
    if result.returncode not in (0, 1, 3):
        raise SystemExit(f"rca failed ({result.returncode}): {result.stderr.strip()}")
    return elapsed


def parse_everything(spec: str) -> tuple[int, float]:
    """The baseline: every Python file of a release's tree through libcst, as one process would."""
    name, version = spec.split("==")
    tree = SourceTree("baseline", spec, fetch_release(name, version))
    files = tree.files()
    start = time.perf_counter()
    for relpath in files:
        text = tree.read(relpath)
        if text is None:
            continue
        try:
            cst.parse_module(text)
        except (cst.ParserSyntaxError, RecursionError):
            pass
    return len(files), time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only the founding case")
    parser.add_argument(
        "--repeat", type=int, default=5, help="cold and warm runs per scenario (the median is reported)"
    )
    options = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="rca-bench-") as scratch:
        work = Path(scratch)
        env = {
            key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"
        }  # as installed: bytecode is cached
        chosen = scenarios(work, options.quick)
        for scenario in chosen:  # downloads are not part of the figures
            for spec in (scenario.serving, scenario.training):
                name, version = spec.split("==")
                fetch_release(name, version)
        timed_rca((*chosen[0].args, "--no-cache"), env)  # compile bytecode once

        baselines: dict[str, tuple[int, float]] = {}
        rows = []
        for scenario in chosen:
            for spec in (scenario.serving, scenario.training):
                if spec not in baselines:
                    print(f"baseline: parsing every file of {spec} with libcst ...", file=sys.stderr, flush=True)
                    baselines[spec] = parse_everything(spec)
            files = baselines[scenario.serving][0] + baselines[scenario.training][0]
            baseline = baselines[scenario.serving][1] + baselines[scenario.training][1]
            cold = statistics.median(timed_rca((*scenario.args, "--no-cache"), env) for _ in range(options.repeat))
            timed_rca(scenario.args, env)  # remember the diagnosis
            warm = statistics.median(timed_rca(scenario.args, env) for _ in range(options.repeat))
            rows.append((scenario.name, files, baseline, cold, warm))

    header = f"{'scenario':40} {'files':>6} {'parse all':>10} {'cold':>7} {'warm':>7}"
    print(f"\n{header} {'parse all/cold':>15} {'parse all/warm':>15}")
    missed = []
    for name, files, baseline, cold, warm in rows:
        times = f"{name:40} {files:6d} {baseline:9.1f}s {cold:6.2f}s {warm:6.2f}s"
        print(f"{times} {baseline / cold:14.0f}x {baseline / warm:14.0f}x")
        if cold > COLD_BUDGET:
            missed.append(f"{name}: cold {cold:.2f}s > {COLD_BUDGET}s")
        if warm > WARM_BUDGET:
            missed.append(f"{name}: warm {warm:.2f}s > {WARM_BUDGET}s")
        if baseline / cold < RATIO_BUDGET:
            missed.append(f"{name}: {baseline / cold:.0f}x < {RATIO_BUDGET:.0f}x")
    print(f"\nmachine: {os.cpu_count()} cores, Python {sys.version.split()[0]}; times include starting the rca process")
    if missed:
        print("budgets missed:\n  " + "\n  ".join(missed))
        raise SystemExit(1)
    print(
        f"budgets met: cold < {COLD_BUDGET}s, warm < {WARM_BUDGET}s, >= {RATIO_BUDGET:.0f}x faster than parsing the "
        f"trees"
    )


if __name__ == "__main__":
    main()
