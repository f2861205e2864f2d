"""The engine lab's ground-truth table: for each failure the lab induces in a real vLLM engine, the
acceptance vLLM measures as served and with the fix rca proposes, the control's, rca's rank-1
hypothesis, and the gap between rca's offline estimate and the engine.

    python scripts/engine_lab.py [--only NAME ...] [--readme README.md]

Each failure is one `rca diagnose ... --serve-with -- LAUNCH` (the engine started once as served
and, for a fix that edits the draft config, once with it); the offline estimate is `rca probe
acceptance` on the same draft and the dumps' prompts, against the engine's first-position
acceptance. It takes about twelve minutes on two cores (the engine's venv is made first if needed).
With --readme, the table replaces the one between the engine-lab markers of that file.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests import enginelab
from tests.enginelab import DUMPS, FAILURES, NOT_SHOWN, TARGET, failing_draft, failing_target, rca

PROMPTS, NEW_TOKENS = 16, 48  # the control's: each failure may set its own prompt and generation lengths
START, END = "<!-- engine-lab:start -->", "<!-- engine-lab:end -->"


def offline_estimate(draft: Path, wiring: list[str]) -> float | None:
    """rca's own first-token acceptance of the draft on the dumps, fed `wiring`; None where it cannot run."""
    result = rca(
        "probe", "acceptance", "--dumps", str(DUMPS), "--target", str(TARGET), "--draft", str(draft),
        "--wiring", ",".join(wiring), "--device", "cpu", "--format", "json", "-q",
    )  # fmt: skip
    if result.returncode != 0:
        return None
    results = json.loads(result.stdout)["results"]
    return next(item["acceptance"] for item in results if item["wiring"] == wiring)


def run_failure(name: str, scratch: Path) -> dict:
    failure = FAILURES[name]
    draft = failing_draft(failure, scratch / name / "draft")
    target = failing_target(failure, scratch / name / "target")
    overlay = (
        enginelab.patched_overlay(failure.serving_patch, scratch / name / "overlay") if failure.serving_patch else None
    )
    command = enginelab.serve_command(
        draft,
        enginelab.free_port(),
        overlay,
        max_model_len=failure.max_model_len,
        method=failure.method,
        tensor_parallel=failure.tensor_parallel,
        pipeline_parallel=failure.pipeline_parallel,
        target=target,
    )
    prompts = scratch / name / "prompts.json"
    prompts.write_text(json.dumps({"prompts": enginelab.dump_prompts(failure.prompt_tokens)[:PROMPTS]}))
    started = time.monotonic()
    result = rca(
        "diagnose", *enginelab.diagnose_arguments(failure, draft, target=target), "--format", "json", "-q",
        "--serve-with", "--serve-prompts", str(prompts), "--serve-requests", str(PROMPTS), "--serve-max-new-tokens",
        str(failure.new_tokens), "--", *command,
    )  # fmt: skip
    seconds = time.monotonic() - started
    if result.returncode not in (0, 1, 3):
        raise SystemExit(f"{name}: rca diagnose failed: {result.stderr[-2000:]}")
    diagnosis = json.loads(result.stdout)
    engine = diagnosis["engine"]
    served = diagnosis["wiring"]["serving"]["slots"]
    offline = offline_estimate(draft, served) if served and failure.method == "eagle3" else None
    as_served = engine["as_served"]
    return {
        "failure": name,
        "control": failure.control,
        "what": failure.what,
        "expected": failure.hypothesis,
        "rank1": diagnosis["hypotheses"][0]["id"] if diagnosis["hypotheses"] else diagnosis["verdict"]["status"],
        "status": diagnosis["verdict"]["status"],
        "as_served": as_served["acceptance"] if as_served else None,
        "first_position": as_served["by_position"][0] if as_served else None,
        "with_fix": engine["with_fix"]["acceptance"] if engine["with_fix"] else None,
        "verified": engine["verified"],
        "not_served": engine["not_served"],
        "failed": engine["failed"],
        "offline": offline,
        "startup_seconds": as_served["startup_seconds"] if as_served else None,
        "seconds": round(seconds, 1),
    }


def time_probe() -> str:
    """How long `rca probe served` takes on the lab engine, from the launch to the figures."""
    started = time.monotonic()
    result = rca(
        "probe", "served", "--dumps", str(DUMPS), "--prompt-length", str(PROMPTS), "--requests", str(PROMPTS),
        "--max-new-tokens", str(NEW_TOKENS), "--format", "json", "-q", "--",
        *enginelab.serve_command(enginelab.DRAFT, enginelab.free_port()),
    )  # fmt: skip
    seconds = time.monotonic() - started
    if result.returncode != 0:
        raise SystemExit(f"rca probe served failed: {result.stderr[-2000:]}")
    startup = json.loads(result.stdout)["startup_seconds"]
    return (
        f"`rca probe served` on the lab engine took {seconds:.0f} s from the launch to the figures, {startup:.0f} s "
        f"of them the engine's start (budget: 90 s)."
    )


def _figure(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def table(rows: list[dict]) -> str:
    controls = {row["failure"]: row["as_served"] for row in rows}
    lines = [
        "| failure induced | rca's rank 1 | measured as served | with rca's fix | control | "
        "offline estimate / engine, first token | gap |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        ok = "" if row["rank1"] == row["expected"] else f" (expected {row['expected']})"
        fixed = _figure(row["with_fix"]) + (" verified" if row["verified"] else "")
        if row["with_fix"] is None:
            fixed = "-" if row["status"] == "consistent" else "not served: " + (row["not_served"] or "-").split(" (")[0]
        gap = (
            f"{abs(row['offline'] - row['first_position']):.3f}"
            if row["offline"] is not None and row["first_position"] is not None
            else "-"
        )
        served = _figure(row["as_served"])
        if row["as_served"] is None and row["failed"]:  # the engine did not start: what it said, by its root cause
            served = "not served: " + row["failed"][0].removeprefix("as given: ")
        lines.append(
            f"| {row['failure']}: {row['what']} | `{row['rank1']}`{ok} | {served} | {fixed} | "
            f"{_figure(controls.get(row['control']))} | {_figure(row['offline'])} / {_figure(row['first_position'])} | "
            f"{gap} |"
        )
    lines += [f"| {name} | - | not shown | - | - | - | {why} |" for name, why in NOT_SHOWN.items()]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", choices=sorted(FAILURES), help="Run these failures only.")
    parser.add_argument("--readme", type=Path, help="Write the table into this file, between the markers.")
    args = parser.parse_args()
    enginelab.engine_venv()
    names = args.only or list(FAILURES)
    rows = []
    with tempfile.TemporaryDirectory(prefix="rca-engine-lab-") as scratch:
        for name in names:
            print(f"engine lab: {name} ...", file=sys.stderr, flush=True)
            rows.append(run_failure(name, Path(scratch)))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    text = table(rows) + "\n\n" + time_probe()
    print(text)
    if args.readme is not None:
        readme = args.readme.read_text()
        if START not in readme or END not in readme:
            raise SystemExit(f"{args.readme} has no {START} ... {END} markers")
        head, rest = readme.split(START, 1)
        args.readme.write_text(f"{head}{START}\n{text}\n{END}{rest.split(END, 1)[1]}")


if __name__ == "__main__":
    main()
