"""The options commands share, declared once: the deployment's inputs, the probe settings, the
report's format and destination. A command takes a group with a decorator and receives it as one
value."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated

import typer

from rca.inputs.files import resolved
from rca.inputs.hub import is_hub_id
from rca.inputs.launchline import MODEL_INPUTS
from rca.report import RENDERERS

ServingOpt = Annotated[
    str | None,
    typer.Option(
        "--serving",
        help="Serving source: a directory, a .py file, an installed package, or pkg==version (e.g. sglang==0.5.12).",
    ),
]
ServingPatchOpt = Annotated[
    Path | None,
    typer.Option("--serving-patch", help="Unified diff applied (in memory) on top of the serving source."),
]
ServingArgsOpt = Annotated[
    str | None,
    typer.Option(
        "--serving-args",
        help="How the server is launched: a script or file holding the launch command, or its flags in quotes "
        '("--speculative-algorithm EAGLE3 --tp 8"). Read with the engine\'s own flag declarations.',
    ),
]
TrainingOpt = Annotated[
    str | None,
    typer.Option(
        "--training",
        help="Training source: a directory, a .py file, an installed package, or pkg==version (e.g. "
        "speculators==0.4.0).",
    ),
]
TrainingArgsOpt = Annotated[
    str | None,
    typer.Option(
        "--training-args",
        help="How the training data was rendered: the trainer's launch script or flags in quotes, or its YAML/JSON "
        "run config (SpecForge 0.2). Read with the trainer's own flag declarations; its chat template name and "
        "arguments are compared with serving's.",
    ),
]
TrainingEngineOpt = Annotated[
    str | None,
    typer.Option(
        "--training-engine",
        help="The engine that captured the training hidden states (e.g. vllm==0.20.0 for speculators 0.5+, "
        "sglang==0.5.14 for SpecForge 0.2): its numbering is then read from its code instead of assumed.",
    ),
]
TrainingPatchOpt = Annotated[
    Path | None,
    typer.Option("--training-patch", help="Unified diff applied (in memory) on top of the training source."),
]
DumpsOpt = Annotated[
    Path | None,
    typer.Option(
        "--dumps", help="Directory of the training hidden-state dumps (its data_config.json records the captured ids)."
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print it as JSON.")]
_MODEL_FORMS = "its model directory, a Hugging Face cache repository (models--ORG--NAME) or its Hub id (org/name)"
DraftOpt = Annotated[str | None, typer.Option("--draft", help=f"The draft's config.json, {_MODEL_FORMS}.")]
TargetOpt = Annotated[str | None, typer.Option("--target", help=f"The target's config.json, {_MODEL_FORMS}.")]
OfflineOpt = Annotated[
    bool,
    typer.Option(
        "--offline",
        help="Never ask the Hugging Face Hub: Hub ids are read from the cache only (as with HF_HUB_OFFLINE=1).",
    ),
]
ParentDraftOpt = Annotated[
    str | None,
    typer.Option(
        "--parent-draft",
        help="The draft this one was fine-tuned from (its directory, with the checkpoint): its vocab map is compared "
        "with this draft's.",
    ),
]
FormatOpt = Annotated[str, typer.Option("--format", "-f", help=f"Output format: {', '.join(RENDERERS)}.")]
OutputOpt = Annotated[
    Path | None, typer.Option("--output", "-o", help="Write the report to this file instead of standard output.")
]
CaseOpt = Annotated[
    Path | None,
    typer.Option("--case", help="A case directory: its case.toml gives the inputs (options given here override them)."),
]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show tracebacks of internal errors.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress messages on standard error.")]
NoCacheOpt = Annotated[
    bool, typer.Option("--no-cache", help="Analyze again even if the inputs are unchanged since a previous run.")
]
ProbeOpt = Annotated[
    bool,
    typer.Option(
        "--probe",
        help="Let the agent run tensor probes on --dumps (and the weights in a --target model directory) to settle "
        "what training fed.",
    ),
]
DeviceOpt = Annotated[
    str, typer.Option("--device", help="Where probes run: auto (the GPU when there is one), cpu or cuda.")
]
MaxTokensOpt = Annotated[int, typer.Option("--max-tokens", min=1, help="How many dump tokens probes read.")]
CaptureOpt = Annotated[
    Path | None,
    typer.Option(
        "--capture",
        help="What rca capture wrote (its directory): what the engine fed the draft, compared with the target's taps "
        "(--target MODEL_DIR) or the dumps, enters the diagnosis as evidence. Implies --probe.",
    ),
]

INPUT_OPTIONS = {
    "serving": ServingOpt,
    "serving_patch": ServingPatchOpt,
    "serving_args": ServingArgsOpt,
    "training": TrainingOpt,
    "training_patch": TrainingPatchOpt,
    "training_args": TrainingArgsOpt,
    "training_engine": TrainingEngineOpt,
    "dumps": DumpsOpt,
    "draft": DraftOpt,
    "target": TargetOpt,
    "parent_draft": ParentDraftOpt,
}


@dataclasses.dataclass(frozen=True)
class Probing:
    """The probe options of a command: whether the agent may run probes, where, on how many tokens."""

    probe: bool = False
    device: str = "auto"
    max_tokens: int = 1024
    capture: Path | None = None

    @property
    def wanted(self) -> bool:
        """Whether the command runs the agent's probes (asked for, or a capture to read)."""
        return self.probe or self.capture is not None


PROBING_OPTIONS = {"probe": ProbeOpt, "device": DeviceOpt, "max_tokens": MaxTokensOpt, "capture": CaptureOpt}


def option_group(
    options: Mapping[str, object], into: str, defaults: Callable[[], object], build: Callable[[dict], object]
) -> Callable[[Callable], Callable]:
    """A decorator giving a command a group of options declared once (`options`: name ->
    annotated type); the command receives them built into one value, as the parameter `into`."""
    default = defaults()

    def decorate(command: Callable) -> Callable:
        signature = inspect.signature(command)
        hints = typing.get_type_hints(
            command, include_extras=True
        )  # a set __signature__ is not evaluated again: resolve here
        kept = [
            parameter.replace(annotation=hints[name])
            for name, parameter in signature.parameters.items()
            if name != into
        ]
        added = [
            inspect.Parameter(
                name,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
                default=getattr(default, name, None),
                annotation=annotation,
            )
            for name, annotation in options.items()
        ]
        where = next(
            (
                index
                for index, parameter in enumerate(kept)
                if parameter.name in ("format", "output", "quiet", "debug", *PROBING_OPTIONS)
            ),
            len(kept),
        )

        @functools.wraps(command)
        def wrapper(*args: object, **kwargs: object) -> object:
            return command(
                *args,
                **{into: build({name: kwargs.pop(name, getattr(default, name, None)) for name in options})},
                **kwargs,
            )

        wrapper.__signature__ = signature.replace(parameters=[*kept[:where], *added, *kept[where:]])  # type: ignore[attr-defined]
        wrapper.__annotations__ = {**{name: hint for name, hint in hints.items() if name != into}, **options}
        return wrapper

    return decorate


with_inputs = option_group(INPUT_OPTIONS, "given", lambda: None, lambda values: values)
with_probing = option_group(PROBING_OPTIONS, "probing", Probing, lambda values: Probing(**values))


def _absolute(key: str, value: str) -> str:
    """Paths given on the command line are relative to the working directory, not the case."""
    if key in ("serving", "training", "training_engine", "serving_args", "training_args") and not os.path.exists(value):
        return value  # a release (pkg==version), an installed package name, or launch flags (maybe too long for a path)
    if key in MODEL_INPUTS and is_hub_id(value):
        return value  # a Hugging Face id, found in the cache (or fetched) before the diagnosis
    return str(resolved(Path(value)))


def given_paths(given: dict[str, object]) -> dict[str, str]:
    """The input options given on the command line, paths made absolute."""
    return {key: _absolute(key, str(value)) for key, value in given.items() if value is not None}


RepoOpt = Annotated[
    Path,
    typer.Option(
        "--repo",
        help="The git repository: a framework fork, or a deployment repo that vendors configs, patches and launch "
        "scripts.",
    ),
]
ChangesFormatOpt = Annotated[
    str,
    typer.Option(
        "--format", "-f", help="Output format: text, markdown (a pull-request comment), json or sarif (2.1.0)."
    ),
]
CaseDirArg = Annotated[Path, typer.Argument(metavar="DIR", help="The case directory.")]

DUMP_PROMPT_LENGTH = 32  # tokens of each dump sample sent to an engine as a prompt, unless told otherwise
# The engine options come after the inputs in --help, in a panel of their own.
SERVE_PANEL = "Serving in the engine (--serve-with)"
ServeWithOpt = Annotated[
    bool,
    typer.Option(
        "--serve-with",
        rich_help_panel=SERVE_PANEL,
        help="Serve the draft with the launch command after -- (or the case's \\[serve] command), as given and with "
        "the fix rca proposes, and measure the engine's own acceptance of both.",
    ),
]
ServePromptsOpt = Annotated[
    Path | None,
    typer.Option(
        "--serve-prompts",
        rich_help_panel=SERVE_PANEL,
        help="Prompts for the engine (as rca probe served --prompts); default: the case's, else the --dumps tokens.",
    ),
]
ServeRequestsOpt = Annotated[
    int,
    typer.Option("--serve-requests", min=1, rich_help_panel=SERVE_PANEL, help="How many prompts the engine serves."),
]
ServeTokensOpt = Annotated[
    int,
    typer.Option(
        "--serve-max-new-tokens", min=1, rich_help_panel=SERVE_PANEL, help="Tokens each served prompt generates."
    ),
]
ServeUrlOpt = Annotated[
    str | None,
    typer.Option(
        "--serve-url",
        rich_help_panel=SERVE_PANEL,
        help="Where the launched server answers (default: its --host and --port).",
    ),
]


@dataclasses.dataclass(frozen=True)
class Serve:
    """The engine options of a command: whether to serve the draft, with what prompts, where."""

    serve_with: bool = False
    serve_prompts: Path | None = None
    serve_requests: int = 32
    serve_max_new_tokens: int = 64
    serve_url: str | None = None


SERVE_OPTIONS = {
    "serve_with": ServeWithOpt,
    "serve_prompts": ServePromptsOpt,
    "serve_requests": ServeRequestsOpt,
    "serve_max_new_tokens": ServeTokensOpt,
    "serve_url": ServeUrlOpt,
}
with_serve = option_group(SERVE_OPTIONS, "serve", Serve, lambda values: Serve(**values))
