"""Time `rca diagnose` on real releases against parsing their whole trees with libcst.

    python scripts/benchmark.py            # all scenarios
    python scripts/benchmark.py --quick    # the founding case only
    python scripts/benchmark.py --only 0.5.23   # the scenarios whose name holds this text

Each scenario is diagnosed in fresh `rca` processes (interpreter start and imports counted), as a
user iterating on it would run it:

* first: the first run on the release (downloaded already, not timed): no remembered diagnosis,
  an analysis cache that holds nothing of this release (only what no release owns: the text
  searches each side's last run asked for, here those of the scenario before, or for the first
  scenario, of the last one), which the run fills, and no rca server running, so the process
  imports everything itself; like every command, it leaves a server behind;
* first, server up: the same, on such an analysis cache again, with a server that holds no parses
  (a user who ran rca on another release a moment before);
* new draft: the same release and patch again with another draft config (a key changed), once
  the first run's analysis cache is written: the cache is warm, the diagnosis is new;
* new patch: the same again with another serving patch (a comment added to the file the scenario
  patches, else to the largest serving file the analysis parses): only that file is searched and
  parsed again;
* warm: the same inputs again: the remembered diagnosis is reused;

and against the baseline, which parses every Python file of the serving and training trees with
libcst in this process, as a tool that indexes a whole tree up front would. Every run gets inputs
of its own (a draft config or patch no other run used), so no run reuses another's diagnosis, and
the first runs an analysis cache of their own. Figures are ratios against the baseline of the
same command, so they compare across machines; the budgets are those of the design: the first run
(with no server) under 1.5 s and at least 30x faster than the baseline, a new draft config or patch under 0.5 s, the
same inputs again under 0.5 s, and `rca --version` under 0.3 s.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import libcst as cst

from rca.cases.casefile import load_case
from rca.inputs.sources import SourceTree, fetch_release

ROOT = Path(__file__).resolve().parent.parent
FIRST_BUDGET, CHANGED_BUDGET, WARM_BUDGET, RATIO_BUDGET, VERSION_BUDGET = 1.5, 0.5, 0.5, 30.0, 0.3

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
    draft: Path  # the draft config (a file, or the directory holding config.json)
    patch: Path | None = None  # the serving patch, when there is one


def slug(name: str) -> str:
    """A scenario's name as a directory name (up to its first comma)."""
    return name.split(",")[0].replace(" ", "-")


def analysis_caches(work: Path, scenario: Scenario) -> Path:
    """Where a scenario's runs keep their analysis caches (`warm` holds the one its last runs used)."""
    return work / "analysis" / slug(scenario.name)


def scenarios(work: Path, quick: bool) -> list[Scenario]:
    found = []
    for name, case in (
        ("founding case (sglang 0.5.12 + patch)", "kimi-k25-embed-slot"),
        ("lmdeploy 0.18.0, Kimi-K2.5", "kimi-k25-on-lmdeploy"),
        ("vllm 0.33.0 + nvidia-modelopt 0.47.0, Llama-3.1-8B", "modelopt-draft-on-vllm"),
        ("sglang 0.5.12 + nemo-automodel 0.7.0, Llama-3.1-8B", "nemo-custom-ids-on-sglang"),
    ):
        directory = ROOT / "cases" / case
        inputs = load_case(directory).inputs
        assert inputs.serving and inputs.training and inputs.draft
        draft = inputs.path(inputs.draft)
        assert draft is not None
        patch = inputs.path(inputs.serving_patch)
        found.append(Scenario(name, inputs.serving, inputs.training, ("--case", str(directory)), draft, patch))
        if quick:
            return found
    for name, engine, target, draft in (
        (
            "sglang 0.5.23, DeepSeek-V3",
            "sglang==0.5.23",
            DEEPSEEK_V3,
            {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 29, 57]}},
        ),
        ("vllm 0.33.0, Llama-3.1-8B", "vllm==0.33.0", LLAMA_8B, {"eagle_aux_hidden_state_layer_ids": [2, 16, 29]}),
    ):
        directory = work / slug(name)
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
        found.append(Scenario(name, engine, "speculators==0.4.0", args, directory / "draft.json"))
    return found


class Inputs:
    """Inputs no other run of the benchmark used: a draft config with a key of its own, and the
    scenario's serving patch (if any) with a comment of its own added to a file the analysis reads
    (the file it patches, else the largest serving file the analysis parses)."""

    def __init__(self, work: Path, scenario: Scenario) -> None:
        self.work = work / "inputs" / slug(scenario.name)
        self.work.mkdir(parents=True, exist_ok=True)
        self.scenario = scenario
        self.count = 0
        name, version = scenario.serving.split("==")
        self.tree = SourceTree("serving", scenario.serving, fetch_release(name, version))
        patch = scenario.patch
        if patch is not None:
            self.tree.apply(patch, patch.name)
        self.patched = min(self.tree.overlay) if self.tree.overlay else read_by_analysis(scenario)

    def draft(self) -> tuple[str, ...]:
        self.count += 1
        source = self.scenario.draft
        if source.is_dir():
            copy = Path(shutil.copytree(source, self.work / f"draft-{self.count}"))
            config = copy / "config.json"
        else:
            copy = config = self.work / f"draft-{self.count}.json"
        data = json.loads((source / "config.json" if source.is_dir() else source).read_text())
        data["rca_benchmark_run"] = self.count
        config.write_text(json.dumps(data, indent=2))
        return ("--draft", str(copy))

    def patch(self) -> tuple[str, ...]:
        self.count += 1
        diffs = []
        for relpath in sorted({*self.tree.overlay, self.patched}):
            original = (
                (self.tree.root / relpath).read_text(encoding="utf-8") if (self.tree.root / relpath).is_file() else ""
            )
            changed = self.tree.read(relpath) or ""
            if relpath == self.patched:
                changed += f"\n# rca benchmark run {self.count}\n"
            diffs.extend(
                difflib.unified_diff(
                    original.splitlines(keepends=True),
                    changed.splitlines(keepends=True),
                    f"a/{relpath}",
                    f"b/{relpath}",
                )
            )
        path = self.work / f"serving-{self.count}.patch"
        path.write_text("".join(diffs))
        return ("--serving-patch", str(path))


def read_by_analysis(scenario: Scenario) -> str:
    """The largest serving file the scenario's analysis parses (found by running it here once)."""
    from rca.diagnose import Inputs as Given
    from rca.diagnose import diagnose
    from rca.static import codeindex, filecache

    if scenario.args[0] == "--case":
        given = load_case(Path(scenario.args[1])).inputs
    else:
        flags = dict(zip(scenario.args[::2], scenario.args[1::2], strict=True))
        given = Given(
            serving=flags["--serving"], training=flags["--training"], draft=flags["--draft"], target=flags["--target"]
        )
    parsed: list[tuple[int, str]] = []
    load = codeindex.CodeIndex.load

    def recorded(index: codeindex.CodeIndex, relpath: str) -> codeindex.ModuleInfo | None:
        module = load(index, relpath)
        if module is not None and index.tree.input == "serving":
            parsed.append((len(module.text), relpath))
        return module

    codeindex.CodeIndex.load = recorded  # type: ignore[method-assign]
    try:
        with filecache.turned_off():
            diagnose(given, parallel=False)
    finally:
        codeindex.CodeIndex.load = load  # type: ignore[method-assign]
    return max(parsed)[1]


def timed(command: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    if result.returncode not in (0, 1, 3):
        raise SystemExit(f"rca failed ({result.returncode}): {result.stderr.strip()}")
    return elapsed


def timed_rca(args: tuple[str, ...], env: dict[str, str]) -> float:
    return timed([sys.executable, "-m", "rca", "diagnose", "--quiet", *args], env)


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


@dataclass
class Row:
    name: str
    files: int
    baseline: float
    first: float
    served_first: float
    draft: float
    patch: float
    warm: float


def settled(cache: Path, env: dict[str, str]) -> None:
    """Wait until the analysis cache is written and the server holds the parses the last run used:
    rca writes the cache from a detached process once its answer is out, and the server loads the
    parses in its idle time; a user's next run comes seconds later, not milliseconds."""
    entries = cache / "entries"
    deadline = time.monotonic() + 30
    seen: list[tuple[str, int]] | None = None
    while time.monotonic() < deadline:
        listing = []
        for path in entries.glob("*") if entries.is_dir() else ():
            with contextlib.suppress(FileNotFoundError):  # a writer's temporary file, renamed meanwhile
                listing.append((path.name, path.stat().st_size))
        listing.sort()
        if listing == seen and not any(name.startswith(".tmp-") for name, _ in listing):
            break
        seen = listing
        time.sleep(0.25)
    while time.monotonic() < deadline:
        answer = server(env, "status", "--json")
        state = json.loads(answer.stdout)["server"] if answer.returncode == 0 else None
        if state is None or not state["parses_pending"]:
            return
        time.sleep(0.25)


def server(env: dict[str, str], *command: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rca", "server", *command], env=env, capture_output=True, text=True, check=False
    )


def stop_server(env: dict[str, str]) -> None:
    server(env, "stop")


def server_up(env: dict[str, str]) -> None:
    """Wait until the server the last run left answers (it imports rca first: about a second)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        answer = server(env, "status", "--json")
        if answer.returncode == 0 and json.loads(answer.stdout)["running"]:
            return
        time.sleep(0.2)
    raise SystemExit("rca left no server behind (is RCA_SERVER=off set?)")


def seeded(cache: Path, seed: Path) -> Path:
    """`cache` emptied, then given what the analysis cache `seed` holds that no release owns: the
    text searches each side's last run asked for (and the secret its entries are signed with)."""
    from rca.inputs.sources import needles_entry

    kept = {needles_entry(side) for side in ("serving", "training")}
    shutil.rmtree(cache, ignore_errors=True)
    shutil.copytree(  # the directory as rca made it (its tag, its secret), with those entries only
        seed, cache, ignore=lambda folder, names: [n for n in names if Path(folder).name == "entries" and n not in kept]
    )
    return cache


def measure(
    scenario: Scenario, work: Path, env: dict[str, str], repeat: int, seed: Path
) -> tuple[float, float, float, float, float]:
    """The median of `repeat` runs of each kind, each with inputs of its own; the first runs on an
    analysis cache given only what `seed`, another scenario's, holds that no release owns."""
    made = Inputs(work, scenario)
    caches = analysis_caches(work, scenario)
    first_runs, served_runs, draft_runs, patch_runs = [], [], [], []
    for number in range(repeat):
        cache = seeded(caches / str(number), seed)
        environment = {**env, "RCA_ANALYSIS_CACHE": str(cache)}
        stop_server(env)
        first_runs.append(timed_rca((*scenario.args, *made.draft()), environment))
        settled(cache, env)
        stop_server(env)  # a server that holds no parses (one started by a command that parsed nothing)
        timed([sys.executable, "-m", "rca", "cache", "show"], environment)
        server_up(env)
        seeded(cache, seed)
        served_runs.append(timed_rca((*scenario.args, *made.draft()), environment))
        settled(cache, env)
        draft_runs.append(timed_rca((*scenario.args, *made.draft()), environment))
        settled(cache, env)
        patch_runs.append(timed_rca((*scenario.args, *made.patch()), environment))
        settled(cache, env)
        shutil.rmtree(cache, ignore_errors=True)
    remembered = (*scenario.args, *made.draft())
    environment = {**env, "RCA_ANALYSIS_CACHE": str(caches / "warm")}
    timed_rca(remembered, environment)  # remember the diagnosis
    warm = statistics.median(timed_rca(remembered, environment) for _ in range(repeat))
    medians = (statistics.median(runs) for runs in (first_runs, served_runs, draft_runs, patch_runs))
    return (*medians, warm)  # type: ignore[return-value]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only the founding case")
    parser.add_argument("--only", metavar="TEXT", help="only the scenarios whose name holds TEXT")
    parser.add_argument("--repeat", type=int, default=5, help="runs of each kind per scenario (the median is reported)")
    options = parser.parse_args()

    # rca writes its analysis cache from a detached process after each answer: one may still be
    # writing into the scratch directory when it is removed
    with tempfile.TemporaryDirectory(prefix="rca-bench-", ignore_cleanup_errors=True) as scratch:
        work = Path(scratch)
        env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
        env["RCA_SERVER"] = "on"  # as installed: bytecode is cached, commands leave a server behind
        chosen = [scenario for scenario in scenarios(work, options.quick) if (options.only or "") in scenario.name]
        if not chosen:
            raise SystemExit(f"no scenario's name holds {options.only!r}")
        for scenario in chosen:  # downloads are not part of the figures
            for spec in (scenario.serving, scenario.training):
                name, version = spec.split("==")
                fetch_release(name, version)
        timed_rca((*chosen[0].args, "--no-cache"), env)  # compile bytecode once
        version = statistics.median(
            timed([sys.executable, "-m", "rca", "--version"], env) for _ in range(max(options.repeat, 5))
        )

        seed = work / "analysis" / "seed"  # what a run of the last scenario leaves, for the first one's first runs
        seeding = Inputs(work / "seed", chosen[-1])
        seeding.count = 1000  # a draft config no timed run uses: its diagnosis is not remembered for one
        timed_rca((*chosen[-1].args, *seeding.draft()), {**env, "RCA_ANALYSIS_CACHE": str(seed)})
        settled(seed, env)
        baselines: dict[str, tuple[int, float]] = {}
        rows = []
        for scenario in chosen:
            for spec in (scenario.serving, scenario.training):
                if spec not in baselines:
                    print(f"baseline: parsing every file of {spec} with libcst ...", file=sys.stderr, flush=True)
                    baselines[spec] = parse_everything(spec)
            files = baselines[scenario.serving][0] + baselines[scenario.training][0]
            baseline = baselines[scenario.serving][1] + baselines[scenario.training][1]
            print(f"timing {scenario.name} ...", file=sys.stderr, flush=True)
            rows.append(Row(scenario.name, files, baseline, *measure(scenario, work, env, options.repeat, seed)))
            seed = analysis_caches(work, scenario) / "warm"

    header = (
        f"{'scenario':52} {'files':>6} {'parse all':>10} {'first':>6} {'served':>6} {'draft':>6} {'patch':>6} "
        f"{'warm':>6}"
    )
    print(f"\n{header} {'all/first':>9} {'all/draft':>9} {'all/warm':>9}")
    missed = []
    for row in rows:
        times = (
            f"{row.name:52} {row.files:6d} {row.baseline:9.1f}s {row.first:5.2f}s {row.served_first:5.2f}s "
            f"{row.draft:5.2f}s "
            f"{row.patch:5.2f}s {row.warm:5.2f}s"
        )
        ratios = f"{row.baseline / row.first:8.0f}x {row.baseline / row.draft:8.0f}x {row.baseline / row.warm:8.0f}x"
        print(f"{times} {ratios}")
        if row.first > FIRST_BUDGET:
            missed.append(f"{row.name}: first run {row.first:.2f}s > {FIRST_BUDGET}s")
        for kind, value in (("new draft config", row.draft), ("new patch", row.patch)):
            if value > CHANGED_BUDGET:
                missed.append(f"{row.name}: {kind} {value:.2f}s > {CHANGED_BUDGET}s")
        if row.warm > WARM_BUDGET:
            missed.append(f"{row.name}: warm {row.warm:.2f}s > {WARM_BUDGET}s")
        if row.baseline / row.first < RATIO_BUDGET:
            missed.append(f"{row.name}: first run {row.baseline / row.first:.0f}x < {RATIO_BUDGET:.0f}x")
    print(f"\nrca --version: {version:.2f}s")
    if version > VERSION_BUDGET:
        missed.append(f"rca --version {version:.2f}s > {VERSION_BUDGET}s")
    print(f"machine: {os.cpu_count()} cores, Python {sys.version.split()[0]}; times include starting the rca process")
    if missed:
        print("budgets missed:\n  " + "\n  ".join(missed))
        raise SystemExit(1)
    print(
        f"budgets met: first run < {FIRST_BUDGET}s and >= {RATIO_BUDGET:.0f}x faster than parsing the trees, "
        f"a new draft config or patch < {CHANGED_BUDGET}s, warm < {WARM_BUDGET}s, rca --version < {VERSION_BUDGET}s"
    )


if __name__ == "__main__":
    main()
