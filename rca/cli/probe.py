"""`rca probe ...` (one tensor probe) and `rca capture` (what a serving draft receives)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from rca.cli.options import DUMP_PROMPT_LENGTH, DebugOpt, DeviceOpt, MaxTokensOpt, OutputOpt, QuietOpt
from rca.cli.runner import fail, run_report
from rca.errors import InputError, RcaError
from rca.evidence.probes import ProbeInputs
from rca.inputs.files import resolved

app = typer.Typer(
    help="Run one tensor probe on training dumps and print what it observed.",
    no_args_is_help=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)
ProbeDumpsOpt = Annotated[
    Path,
    typer.Option(
        "--dumps",
        help="Directory (or file) of training hidden-state dumps: speculators data_*.pt or hs_*.safetensors, "
        "SpecForge *.ckpt[.gz], or safetensors.",
    ),
]
ProbeTargetOpt = Annotated[
    Path | None,
    typer.Option("--target", help="The target's model directory (config.json and *.safetensors weights)."),
]
ProbeFormatOpt = Annotated[str, typer.Option("--format", "-f", help="Output format: text or json.")]


PROBE_RENDERERS: dict[str, Callable] = {
    "text": lambda observation: f"rca probe {observation.probe}: {observation.summary}\n",
    "json": lambda observation: (
        json.dumps(
            {"schema": f"rca.{observation.probe}/1", **observation.data, "summary": observation.summary}, indent=2
        )
        + "\n"
    ),
}


def _run_probe(
    name: str,
    dumps: Path,
    target: Path | None,
    device: str,
    max_tokens: int,
    format: str,
    output: Path | None,
    quiet: bool,
    debug: bool,
) -> None:
    inputs = ProbeInputs(resolved(dumps), resolved(target) if target else None, device, max_tokens, Path.cwd())
    _report_probe(name, inputs, format, output, quiet, debug)


def _report_probe(name: str, inputs: ProbeInputs, format: str, output: Path | None, quiet: bool, debug: bool) -> None:
    from rca.evidence.probes import registered_probes

    probe = registered_probes()[name]()

    def work(progress: Callable[[str], None] | None) -> tuple[object, int]:
        reason = probe.unavailable(inputs)
        if reason is not None:
            raise InputError(f"{name} cannot run: {reason}", fix=f"pass {probe.arguments}")
        return probe.run(inputs, progress), 0

    run_report(work, PROBE_RENDERERS, format, output, quiet, debug)


@app.command("shape")
def probe_shape_command(
    dumps: ProbeDumpsOpt,
    format: ProbeFormatOpt = "text",
    output: OutputOpt = None,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """How many slots the dumps hold, in which format (reads one file)."""
    _run_probe("dump-shape", dumps, None, "cpu", 1024, format, output, quiet, debug)


@app.command("embedding")
def probe_embedding_command(
    dumps: ProbeDumpsOpt,
    target: ProbeTargetOpt = None,
    max_tokens: MaxTokensOpt = 1024,
    format: ProbeFormatOpt = "text",
    output: OutputOpt = None,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Which dump slots equal embed_tokens\\[token_ids], reading only those rows of the checkpoint."""
    _run_probe("embedding-rows", dumps, target, "cpu", max_tokens, format, output, quiet, debug)


@app.command("fingerprint")
def probe_fingerprint_command(
    dumps: ProbeDumpsOpt,
    target: ProbeTargetOpt = None,
    device: DeviceOpt = "auto",
    max_tokens: MaxTokensOpt = 1024,
    format: ProbeFormatOpt = "text",
    output: OutputOpt = None,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Name each dump slot's tap by running the target on the dump's tokens (cosine against h0..hN, hN+norm)."""
    _run_probe("fingerprint", dumps, target, device, max_tokens, format, output, quiet, debug)


@app.command("vocab-map")
def probe_vocab_map_command(
    draft: Annotated[Path, typer.Option("--draft", help="The draft's directory (config.json and *.safetensors).")],
    target: ProbeTargetOpt = None,
    write_map: Annotated[
        Path | None,
        typer.Option(
            "--write-map",
            help="Recover the vocab map from the draft's lm_head rows (each row's nearest target row) and write d2t "
            "and t2d to this safetensors file, to put beside the draft's weights.",
        ),
    ] = None,
    device: DeviceOpt = "auto",
    format: ProbeFormatOpt = "text",
    output: OutputOpt = None,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Whether the draft's lm_head rows match the target's rows its d2t names (or rows i), reading only those rows;
    with --write-map, the map the rows give, written out."""
    inputs = ProbeInputs(None, resolved(target) if target else None, device, 0, Path.cwd(), resolved(draft))
    if write_map is None:
        _report_probe("vocab-map-rows", inputs, format, output, quiet, debug)
        return

    def work(progress: Callable[[str], None] | None) -> tuple[object, int]:
        from safetensors.torch import save_file

        from rca.evidence.vocab_recovery import recover_map

        if inputs.model_directory is None:
            raise InputError("recovering the vocab map reads the target's head", fix="pass --target MODEL_DIR")
        recovered = recover_map(resolved(draft), inputs.model_directory, Path.cwd(), device, progress)
        try:
            save_file(recovered.edit.file_tensors(), str(write_map), metadata={"format": "pt", "writer": "rca"})
        except OSError as error:
            raise InputError(
                f"cannot write the vocab map ({error.strerror})", where=str(write_map), fix="pass a writable path"
            ) from None
        return recovered, 0

    renderers = {
        "text": lambda recovered: f"rca probe vocab-map: wrote d2t and t2d to {write_map}, {recovered.summary}\n",
        "json": lambda recovered: (
            json.dumps(
                {
                    "schema": "rca.vocab-map-recovered/1",
                    "file": str(write_map),
                    "d2t_entries": len(recovered.d2t),
                    "mean_cosine": round(recovered.mean_cosine, 4),
                    "aligned": round(recovered.aligned, 4),
                    "summary": recovered.summary,
                },
                indent=2,
            )
            + "\n"
        ),
    }
    run_report(work, renderers, format, output, quiet, debug)


@app.command("vocab-lineage")
def probe_vocab_lineage_command(
    draft: Annotated[
        Path, typer.Option("--draft", help="The fine-tuned draft's directory (config.json, *.safetensors).")
    ],
    parent_draft: Annotated[
        Path, typer.Option("--parent-draft", help="The directory of the draft it was fine-tuned from.")
    ],
    target: ProbeTargetOpt = None,
    format: ProbeFormatOpt = "text",
    output: OutputOpt = None,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Whether the lm_head rows where a fine-tune changed the vocab map still score the parent's tokens."""
    inputs = ProbeInputs(
        None, resolved(target) if target else None, "cpu", 0, Path.cwd(), resolved(draft), resolved(parent_draft)
    )
    _report_probe("vocab-map-carried", inputs, format, output, quiet, debug)


@app.command("template")
def probe_template_command(
    dumps: ProbeDumpsOpt,
    target: Annotated[
        Path, typer.Option("--target", help="The target's model directory (tokenizer.json, tokenizer_config.json).")
    ],
    chat_template: Annotated[
        Path | None,
        typer.Option("--chat-template", help="The template file the server renders with (default: the target's)."),
    ] = None,
    kwargs: Annotated[
        str | None,
        typer.Option(
            "--chat-template-kwargs", help='The server\'s template arguments as JSON ({"enable_thinking": false}).'
        ),
    ] = None,
    format: ProbeFormatOpt = "text",
    output: OutputOpt = None,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Whether the dumps' assistant turns open as the server prompts, and their loss masks cover every
    assistant token."""
    from rca.inputs.templates import served_template_use

    try:
        served = served_template_use(resolved(target), resolved(chat_template) if chat_template else None, kwargs)
    except RcaError as error:
        raise fail(str(error), error.exit_code) from None
    inputs = ProbeInputs(resolved(dumps), resolved(target), "cpu", 0, Path.cwd(), served_template=served)
    _report_probe("chat-template-tokens", inputs, format, output, quiet, debug)


@app.command("acceptance")
def probe_acceptance_command(
    dumps: ProbeDumpsOpt,
    target: ProbeTargetOpt = None,
    wiring: Annotated[
        list[str] | None,
        typer.Option(
            "--wiring",
            help="A wiring to measure, as comma-separated taps (h0,h3,h31); repeat for several (what serving feeds, "
            "a candidate fix).",
        ),
    ] = None,
    draft: Annotated[
        Path | None,
        typer.Option(
            "--draft",
            help="The draft checkpoint to measure (config.json and *.safetensors, speculators' Eagle3 layout); "
            "without it a surrogate head is trained on the dumps.",
        ),
    ] = None,
    steps: Annotated[int, typer.Option("--steps", min=1, help="Training steps of the surrogate draft head.")] = 1000,
    device: DeviceOpt = "auto",
    max_tokens: Annotated[
        int, typer.Option("--max-tokens", min=16, help="How many dump tokens to train and measure on.")
    ] = 32768,
    format: ProbeFormatOpt = "text",
    output: OutputOpt = None,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Measure first-token acceptance under each --wiring (what a mismatch costs): of the --draft checkpoint, or of
    a surrogate head trained on the dumps."""
    from rca.evidence.acceptance import measure_acceptance

    def work(progress: Callable[[str], None] | None) -> tuple[object, int]:
        if target is None:
            raise InputError("the acceptance probe runs the target", fix="pass --target MODEL_DIR with the weights")
        wirings = [tuple(tap.strip() for tap in item.split(",") if tap.strip()) for item in wiring or ()]
        return measure_acceptance(
            resolved(dumps),
            resolved(target),
            wirings,
            device,
            max_tokens,
            steps,
            base=Path.cwd(),
            progress=progress,
            draft=resolved(draft) if draft else None,
        ), 0

    renderers = {
        "text": lambda report: f"rca probe acceptance: {report.summary}\n",
        "json": lambda report: json.dumps(report.to_json(), indent=2) + "\n",
    }
    run_report(work, renderers, format, output, quiet, debug)


@app.command("compare")
def probe_compare_command(
    capture: Annotated[
        Path,
        typer.Option(
            "--capture", help="What rca capture wrote: its directory or one capture_r<rank>_<n>.safetensors file."
        ),
    ],
    dumps: Annotated[
        Path | None,
        typer.Option("--dumps", help="Training dumps; without --target the capture must replay one of their prompts."),
    ] = None,
    target: ProbeTargetOpt = None,
    device: DeviceOpt = "auto",
    max_tokens: MaxTokensOpt = 1024,
    format: ProbeFormatOpt = "text",
    output: OutputOpt = None,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Match the slots serving fed the draft (a capture) to the training slots or the target's taps: the shift or
    permutation, and whether TP ranks agree."""
    from rca.evidence.compare import compare

    def work(progress: Callable[[str], None] | None) -> tuple[object, int]:
        return compare(
            resolved(capture),
            resolved(dumps) if dumps else None,
            resolved(target) if target else None,
            device,
            max_tokens,
            Path.cwd(),
            progress,
        ), 0

    renderers = {
        "text": lambda result: (
            f"rca probe compare: {result.summary}\n"
            + (f"  tensor-parallel ranks: {result.ranks['summary']}\n" if result.ranks else "")
        ),
        "json": lambda result: json.dumps(result.to_json(), indent=2) + "\n",
    }
    run_report(work, renderers, format, output, quiet, debug)


def capture_command(
    ctx: typer.Context,
    output: Annotated[
        Path,
        typer.Option(
            "--output",
            "-o",
            help="Directory for the capture files: a new one, or one without an earlier capture"
            " (a second capture into it is refused).",
        ),
    ] = Path("rca-capture"),
    requests: Annotated[int, typer.Option("--requests", min=1, help="How many draft inputs to save per process.")] = 4,
    min_tokens: Annotated[
        int, typer.Option("--min-tokens", min=1, help="Save only batches of at least this many tokens (prefills).")
    ] = 8,
) -> None:
    """Run a serving engine's launch command (after --) with a hook that saves what the EAGLE-3 draft receives.

    Example: rca capture --output cap -- python -m sglang.launch_server --model-path ...
    --speculative-algorithm EAGLE3 ... then send a request, stop the server, and run rca probe compare
    --capture cap --dumps DUMPS (or --target MODEL_DIR).
    """
    from rca.evidence.capture import HOOK_ERRORS, run_capture

    try:
        run = run_capture(list(ctx.args), output, requests, min_tokens)
    except RcaError as error:
        raise fail(str(error), error.exit_code) from None
    status = run.ended.status
    if run.engine_failed:
        lines = "".join(f"\n  {line}" for line in run.ended.error_lines())
        typer.echo(
            f"rca: the command {run.ended.describe()}" + (f"; its last lines:{lines}" if lines else ""), err=True
        )
    if run.hook_errors:
        typer.echo(
            f"rca: the capture hook failed {len(run.hook_errors)} time(s), the engine ran on untouched "
            f"(first: {run.hook_errors[0]}; all in {output / HOOK_ERRORS})",
            err=True,
        )
    if run.files:
        typer.echo(
            f"rca: captured {len(run.files)} draft input(s) in {output}: {', '.join(f.name for f in run.files)}",
            err=True,
        )
    elif run.engine_failed:
        typer.echo(f"rca: nothing captured in {output}: the engine stopped before its draft ran", err=True)
    else:
        typer.echo(
            f"rca: nothing captured in {output}: send the server a prompt of at least {min_tokens} tokens before "
            f"stopping it (the draft model must be an EAGLE-3 module of SGLang or vLLM)",
            err=True,
        )
    raise typer.Exit(status)


def probe_served_command(
    ctx: typer.Context,
    url: Annotated[
        str | None,
        typer.Option(
            "--url",
            help="The running server (http://host:port). With a launch command after --, where it will answer "
            "(default: its --host and --port, else the engine's default port).",
        ),
    ] = None,
    prompts: Annotated[
        Path | None,
        typer.Option(
            "--prompts",
            help='The prompts to send: JSON (token-id lists or strings, or {"prompts": [...]}), JSON lines, or text '
            "lines.",
        ),
    ] = None,
    dumps: Annotated[
        Path | None, typer.Option("--dumps", help="Send the training dumps' own tokens as prompts instead.")
    ] = None,
    requests: Annotated[int, typer.Option("--requests", "-n", min=1, help="How many prompts to send.")] = 32,
    max_new_tokens: Annotated[
        int, typer.Option("--max-new-tokens", min=1, help="Tokens each prompt generates (greedy, EOS ignored).")
    ] = 64,
    prompt_length: Annotated[
        int, typer.Option("--prompt-length", min=1, help="With --dumps: how many of each sample's tokens to send.")
    ] = DUMP_PROMPT_LENGTH,
    startup_timeout: Annotated[
        float, typer.Option("--startup-timeout", min=1, help="Seconds a launched engine may take to answer.")
    ] = 900.0,
    format: ProbeFormatOpt = "text",
    output: OutputOpt = None,
    quiet: QuietOpt = False,
    debug: DebugOpt = False,
) -> None:
    """Measure acceptance in the engine itself: send prompts to a running server (--url), or to one it launches
    (after --) and stops, and read the engine's own speculative-decoding counters.

    Example: rca probe served --prompts prompts.json -- vllm serve TARGET --speculative-config
    '{"method": "eagle3", "model": "DRAFT", "num_speculative_tokens": 3}'
    """
    from rca.evidence.engine.served import measure, measure_launched, prompts_from_dumps, reachable, read_prompts

    command = list(ctx.args)

    def work(progress: Callable[[str], None] | None) -> tuple[object, int]:
        if (prompts is None) == (dumps is None):
            raise InputError(
                "say what to send: --prompts FILE or --dumps DIR (one of them)",
                fix="pass --prompts prompts.json, or --dumps with the training dumps",
            )
        if url is None and not command:
            raise InputError(
                "no server to measure", fix="pass --url of a running server, or its launch command after --"
            )
        sent = (
            read_prompts(resolved(prompts), requests, max_new_tokens, Path.cwd())
            if prompts is not None
            else prompts_from_dumps(resolved(dumps), requests, prompt_length, max_new_tokens, Path.cwd())  # type: ignore[arg-type]
        )
        if command:
            return measure_launched(command, sent, url, startup_timeout=startup_timeout, progress=progress), 0
        return measure(reachable(url), sent, progress), 0  # type: ignore[arg-type]

    renderers = {
        "text": lambda result: f"rca probe served: {result.summary}\n",
        "json": lambda result: json.dumps(result.to_json(), indent=2) + "\n",
    }
    run_report(work, renderers, format, output, quiet, debug)
