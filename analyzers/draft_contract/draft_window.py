"""The attention window the draft config declares, against the one the serving engine builds the
draft's attention with."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, replace

from rca.sdk import Analyzer, Compares, Example, Fact, Finding, Reports, SideContext, Step, StepKind
from rca.sdk.code import ClassInfo, classes_built_with, code_steps, constructor_kwargs, guarded_statements, submodules
from rca.sdk.examples import SMALL_VOCAB_TARGET, WINDOW_ATTENTION, WINDOW_DRAFT, WINDOW_LAYER
from rca.sdk.inputs import ConfigFile, declared_layers
from rca.sdk.values import Val

PER_LAYER = "per_layer_sliding_window"  # the engine attention's own window, where a layer passes one
SIZED = "sliding_window_size"  # the window an attention without a fallback is built with (-1: none)
_FALLBACK = re.compile(r"sliding_window\s*=\s*cache_config\.sliding_window")


@dataclass(frozen=True)
class Declared:
    """The window the draft config declares for one of its decoder layers."""

    layer: int
    window: int
    steps: tuple[Step, ...]
    how: str


# An engine whose draft sets its layers' window from the launch (SGLang 0.5.12+'s Llama EAGLE-3 draft).
_LAUNCH_WINDOW_DRAFT = """
class DraftForCausalLM(nn.Module):
    def __init__(self, config):
        self.config = config

    def get_attention_sliding_window_size(self):
        server_args = get_global_server_args()
        return server_args.speculative_draft_window_size
"""
# An engine whose attention is built with its window and has no fallback (SGLang's DFlash draft).
_SIZED_ATTENTION = """
class RadixAttention(nn.Module):
    def __init__(self, num_heads, head_dim, sliding_window_size: int = -1, attn_type=None):
        self.sliding_window_size = sliding_window_size or -1
"""
_SIZED_LAYER = """
from radix_attention import RadixAttention


def window_left(config, layer_id):
    if config.layer_types[layer_id] == "sliding_attention":
        return config.sliding_window - 1
    return -1


class DraftLayer(nn.Module):
    def __init__(self, config, layer_id):
        self.attn = RadixAttention(2, 4, sliding_window_size=window_left(config, layer_id))


class DraftForCausalLM(nn.Module):
    def __init__(self, config):
        self.layers = nn.ModuleList([DraftLayer(config, i) for i in range(config.num_hidden_layers)])
"""
_SWA_DRAFT = {
    **WINDOW_DRAFT,
    "layer_types": ["full_attention"],
    "dflash_config": {"use_swa": True, "swa_window_size": 2048},
}
_WINDOW_FLAG = """
def add_cli_args(parser):
    parser.add_argument("--speculative-draft-window-size", type=int, default=None)
"""


class DraftWindow(Analyzer):
    """Reads the sliding window each draft layer's attention is built with, against the draft config's.

    ## What it reads
    The draft config's attention-window fields (`layer_types`, `sliding_window`,
    `use_sliding_window`, `max_window_layers`, inside `transformer_layer_config` for a
    speculators-format draft, as the engine converts it; a DFlash draft's `dflash_config.use_swa`
    with `swa_window_size`, a window on every layer, as NVIDIA ModelOpt exports it): which of its
    decoder layers attend over a window, and how wide. Then the draft class the engine builds,
    evaluated with that config, down to each decoder layer's attention module (the engine class
    whose constructor takes `per_layer_sliding_window`): whether the layer hands it a window, and,
    where it hands none, the statement of that class that falls back to
    `cache_config.sliding_window`, the served model's (the verifier's) window. Where the engine's
    attention is built with its window and has no fallback (`sliding_window_size`, -1 for none,
    SGLang's), the window each layer's attention is built with, counted without the current token
    as SGLang counts it. Where the draft class takes its layers' window from a launch
    setting instead (SGLang's `--speculative-draft-window-size`, read in one of its methods), the
    window a config turns on for its layers is compared with the one the launch sets (none: full
    attention). A draft config that declares a window and an engine whose draft attention could not
    be followed is said in a note: the window was not checked.

    ## Why it matters
    A draft trained with a windowed attention and served with the verifier's (full attention for
    Qwen3-8B) attends over a context it never learned to use: acceptance drops at short contexts
    and the windowed draft's gain at long ones is lost, and nothing is logged
    (https://github.com/vllm-project/speculators/pull/684, vLLM 0.24-0.25's Qwen3 EAGLE-3 layer).
    """

    code = "RCA-D109"
    name = "draft-window"
    formerly = ("RCA-S118",)
    sides = frozenset({"serving"})
    anchors = (f"{PER_LAYER}: int", f"{SIZED}: int")  # the engine attention's constructor
    compares = Compares(
        training="the sliding window the draft config declares for each layer",
        serving="the window the engine gives each draft layer's attention",
    )
    reports = (Reports("draft-window-ignored", hypothesis="window-ignored"),)

    INVALID = (
        Example(
            files={"attention.py": WINDOW_ATTENTION, "draft.py": WINDOW_LAYER.format(passed="")},
            target=SMALL_VOCAB_TARGET,
            draft=WINDOW_DRAFT,
            finding="draft-window-ignored",
            path="draft.json",
            key=("layer_types",),
            message=(
                "the draft config declares a 2,048-token sliding window for its layer 0 (layer_types[0] = "
                "sliding_attention, sliding_window 2048), but DraftLayer builds its attention without "
                "per_layer_sliding_window: Attention falls back to cache_config.sliding_window (attention.py:8), the "
                "served model's window, which the target config does not set (full attention): the draft attends "
                "over the whole context"
            ),
            why="a draft layer that builds its attention without the draft config's window (vLLM 0.25's Qwen3)",
        ),
        Example(
            files={"draft.py": _LAUNCH_WINDOW_DRAFT, "server_args.py": _WINDOW_FLAG},
            target=SMALL_VOCAB_TARGET,
            draft=WINDOW_DRAFT,
            finding="draft-window-ignored",
            path="draft.json",
            key=("layer_types",),
            message=(
                "the draft config declares a 2,048-token sliding window for its layer 0 (layer_types[0] = "
                "sliding_attention, sliding_window 2048), but DraftForCausalLM takes its layers' window from the "
                "launch's speculative_draft_window_size (draft.py:8), not from its config: the launch sets none: the "
                "draft attends over the whole context"
            ),
            why="an engine whose draft takes its window from a launch flag, launched without it (SGLang 0.5.12+)",
        ),
        Example(
            files={"radix_attention.py": _SIZED_ATTENTION, "draft.py": _SIZED_LAYER},
            target=SMALL_VOCAB_TARGET,
            draft=_SWA_DRAFT,
            finding="draft-window-ignored",
            path="draft.json",
            key=("dflash_config", "use_swa"),
            message=(
                "the draft config declares a 2,048-token sliding window for its layer 0 (dflash_config.use_swa, "
                "dflash_config.swa_window_size 2048), but DraftLayer builds its RadixAttention with "
                "sliding_window_size -1: no window: the draft attends over the whole context"
            ),
            why="a DFlash draft trained with a window on every layer (use_swa, as ModelOpt exports it), served by "
            "an engine that reads the window from layer_types alone (SGLang 0.5.23)",
        ),
    )
    VALID = (
        Example(
            files={"radix_attention.py": _SIZED_ATTENTION, "draft.py": _SIZED_LAYER},
            target=SMALL_VOCAB_TARGET,
            draft=WINDOW_DRAFT,
            why="the layer's attention is built with the config's window, counted without the current token",
        ),
        Example(
            files={
                "attention.py": WINDOW_ATTENTION,
                "draft.py": WINDOW_LAYER.format(passed="\n            per_layer_sliding_window=config.sliding_window,"),
            },
            target=SMALL_VOCAB_TARGET,
            draft=WINDOW_DRAFT,
            why="the draft layer hands its attention the draft config's window (vLLM 0.26 and later)",
        ),
        Example(
            files={"attention.py": WINDOW_ATTENTION, "draft.py": WINDOW_LAYER.format(passed="")},
            target=SMALL_VOCAB_TARGET,
            draft={**WINDOW_DRAFT, "layer_types": ["full_attention"]},
            why="a draft that declares no window: the served model's full attention is what it was trained with",
        ),
        Example(
            files={"attention.py": WINDOW_ATTENTION, "draft.py": WINDOW_LAYER.format(passed="")},
            target={**SMALL_VOCAB_TARGET, "sliding_window": 2048, "use_sliding_window": True},
            draft=WINDOW_DRAFT,
            why="the fallback is the verifier's window, and the verifier's is the draft's",
        ),
        Example(
            files={"draft.py": _LAUNCH_WINDOW_DRAFT, "server_args.py": _WINDOW_FLAG},
            target=SMALL_VOCAB_TARGET,
            draft=WINDOW_DRAFT,
            settings="--speculative-draft-window-size 2048",
            why="launched with the draft's window",
        ),
    )

    def _from_launch(
        self, ctx: SideContext, cls: ClassInfo, declared: list[Declared], setting: str, read: Step
    ) -> Iterator[Finding]:
        """An engine whose draft takes its window from the launch, not its config: the window
        declared against the one launched."""
        # a bare sliding_window copied from a windowed target (Mistral) says nothing of what a Llama-style
        # draft trained with: only a window the config turns on for its layers is one it learned
        declared = [item for item in declared if len(item.steps) > 1]
        launched = ctx.settings.get(setting) if ctx.settings is not None else None
        value = launched.value if launched is not None else None
        served = int(value) if isinstance(value, (int, str)) and str(value).strip().isdigit() else None
        item = next((item for item in declared if item.window != served), None)
        if item is None:
            return
        flag = f"--{setting.replace('_', '-')}"
        said = (
            f"the launch sets {served:,} ({launched.step.location})"
            if served is not None and launched is not None
            else "the launch sets none: the draft attends over the whole context"
        )
        yield self.finding(
            ctx,
            "draft-window-ignored",
            f"the draft config declares a {item.window:,}-token sliding window for its layer {item.layer} "
            f"({item.how}), but {cls.name} takes its layers' window from the launch's {setting} "
            f"({read.location}), not from its config: {said}",
            item.steps[0].location,
            likelihood_ratio=10.0,
            steps=(*item.steps, read, *((launched.step,) if launched is not None else ())),
            fix=f"launch with {flag} {item.window}, the window the draft was trained with",
        )

    def applies_to(self, ctx: SideContext) -> bool:
        return ctx.draft is not None and bool(_declared(ctx.draft.config))

    def run(self, ctx: SideContext) -> Iterator[Fact | Finding]:
        assert ctx.draft is not None
        declared = _declared(ctx.draft.config)
        built = ctx.draft_model()
        if built is not None and (launched := _launch_window(ctx, built[0])) is not None:
            yield from self._from_launch(ctx, built[0], declared, *launched)
            return
        engine = _engine_attention(ctx)
        if built is not None and engine is None and (sized := classes_built_with(ctx, f"{SIZED}: int", "attn_type")):
            yield from self._built_with(ctx, built, declared, sized)
            return
        if built is None or engine is None:
            ctx.note(
                f"the draft config declares a {declared[0].window:,}-token sliding window ({declared[0].how}); how "
                f"{ctx.tree.label} builds the draft's attention window was not read: "
                + ("no draft class was found" if built is None else "no attention taking a per-layer window was found")
            )
            return
        names, fallback = engine
        attentions = _layer_attentions(ctx, built, names)
        if attentions is None:
            return
        served = _served_window(ctx.target.config)
        for item in declared:
            attention_class, module, layer_class = attentions[item.layer]
            kwargs = constructor_kwargs(module)
            if kwargs is None or PER_LAYER in kwargs or served == item.window:
                continue  # a window handed on (computed from the draft config), or the verifier's is the draft's
            builder = layer_class.name if layer_class is not None else built[0].name
            verifier = f"a {served:,}-token window" if served else "no window (full attention)"
            target_step = ctx.target.config.step(
                ("sliding_window",) if ctx.target.config.lookup(("sliding_window",))[0] else (),
                f"the served model's window: {served}",
            )
            yield self.finding(
                ctx,
                "draft-window-ignored",
                f"the draft config declares a {item.window:,}-token sliding window for its layer {item.layer} "
                f"({item.how}), but {builder} builds its attention without {PER_LAYER}: {attention_class} falls "
                f"back to cache_config.sliding_window ({fallback.location}), the served model's window, which the "
                f"target config {'sets to ' + format(served, ',') if served else 'does not set (full attention)'}: "
                f"the draft attends over {'another window' if served else 'the whole context'}",
                item.steps[0].location,
                likelihood_ratio=10.0,
                steps=(*item.steps, target_step, fallback),
                fix=f"serve the draft on an engine release whose {builder} hands its attention the draft config's "
                f"window ({PER_LAYER}); the served model has {verifier}",
            )
            return

    def _built_with(
        self, ctx: SideContext, built: tuple[ClassInfo, Val], declared: list[Declared], names: set[str]
    ) -> Iterator[Finding]:
        """An engine whose attention takes its window as built, with no fallback (SGLang's
        RadixAttention, -1 for none): the window each windowed layer's attention is built with. It
        counts the tokens before the current one, so the HF window W is built as W - 1
        (SGLang's dflash_utils.get_dflash_attention_sliding_window_size says so)."""
        attentions = _layer_attentions(ctx, built, names)
        if attentions is None:
            return
        for item in declared:
            attention_class, module, layer_class = attentions[item.layer]
            kwargs = constructor_kwargs(module)
            value = kwargs.get(SIZED) if kwargs is not None else None
            window = value.v if value is not None else -1  # the constructor's default: no window
            if type(window) is not int or window in (item.window - 1, item.window):
                continue  # not known statically, or the window trained with (counted without the current token)
            builder = layer_class.name if layer_class is not None else built[0].name
            cited = code_steps(ctx, value) if value else []
            served = (
                f"a {window + 1:,}-token window"
                if window > 0
                else "no window: the draft attends over the whole context"
            )
            yield self.finding(
                ctx,
                "draft-window-ignored",
                f"the draft config declares a {item.window:,}-token sliding window for its layer {item.layer} "
                f"({item.how}), but {builder} builds its {attention_class} with {SIZED} {window}"
                + (f" ({cited[-1].location})" if cited else "")
                + f": {served}",
                item.steps[0].location,
                likelihood_ratio=10.0,
                steps=(*item.steps, *cited[-1:]),
                fix=f"serve the draft on an engine release whose {builder} builds its attention with the draft "
                f"config's window ({item.window:,}), or give the config the layout that engine reads the window from",
            )
            return


def _layer_attentions(
    ctx: SideContext, built: tuple[ClassInfo, Val], names: set[str]
) -> list[tuple[str, Val, ClassInfo | None]] | None:
    """The engine attention module of each draft decoder layer, or None (said in a note) where
    their count is not the draft's layer count."""
    assert ctx.draft is not None
    attentions = submodules(ctx, built[1], names)
    layers = declared_layers(ctx.draft.config)
    if len(attentions) != layers:
        ctx.note(
            f"the draft's attention window was not checked: {len(attentions)} attention modules were found in "
            f"{built[0].name} for {layers} decoder layers"
        )
        return None
    return attentions


# a launch setting of the draft's window, read from the server's arguments (not a field of the model)
_LAUNCH_WINDOW = re.compile(r"(?<!self)\.(\w*draft_window\w*)\b")


def _launch_window(ctx: SideContext, cls: ClassInfo) -> tuple[str, Step] | None:
    """The launch setting the draft class sets its layers' window from (SGLang's
    `--speculative-draft-window-size`, read in one of the draft model's methods), and where it reads it."""
    for method in cls.methods.values():
        where = cls.module.location(method.node, method.node)
        for number, line in enumerate(method.text.splitlines()):  # from the `def` line on
            match = _LAUNCH_WINDOW.search(line)
            if match:
                location = replace(where, line=where.line + number, end_line=where.line + number)
                note = f"the draft's window is the launch's {match[1]}"
                return match[1], Step(location, note, line.strip(), StepKind.ASSIGN)
    return None


def _declared(config: ConfigFile) -> list[Declared]:
    """Each draft decoder layer the config gives a sliding window: DFlash's `use_swa` (every layer)
    where its `layer_types` turn on none, else the HF way: `layer_types`, else `use_sliding_window`
    from `max_window_layers` on, else a `sliding_window` for every layer."""
    return _swa_declared(config) or _hf_declared(config)


def _swa_declared(config: ConfigFile) -> list[Declared]:
    """A DFlash config's `dflash_config.use_swa`: every layer trained with the window of
    `swa_window_size` (else `sliding_window`), whatever its `layer_types` say, as NVIDIA ModelOpt
    exports a draft trained with sliding-window attention (its layer types left full)."""
    used_present, used = config.lookup(("dflash_config", "use_swa"))
    _, types = config.lookup(("layer_types",))
    if not used_present or used is not True or (isinstance(types, list) and "sliding_attention" in types):
        return []
    key: tuple[str, ...] = ("dflash_config", "swa_window_size")
    if not config.lookup(key)[0]:
        key = ("sliding_window",)
    _, window = config.lookup(key)
    if not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        return []
    used_step = config.step(("dflash_config", "use_swa"), "dflash_config.use_swa true")
    window_step = config.step(key, f"{'.'.join(key)} {window}")
    how = f"dflash_config.use_swa, {'.'.join(key)} {window}"
    return [Declared(i, window, (used_step, window_step), how) for i in range(declared_layers(config))]


def _hf_declared(config: ConfigFile) -> list[Declared]:
    present, window = config.lookup(("sliding_window",))
    if not present or not isinstance(window, int) or isinstance(window, bool) or window <= 0:
        return []
    layers = declared_layers(config)
    window_step = config.step(("sliding_window",), f"sliding_window {window}")
    _, types = config.lookup(("layer_types",))
    if isinstance(types, list):
        step = config.step(("layer_types",), f"layer_types {types}")
        return [
            Declared(i, window, (step, window_step), f"layer_types[{i}] = sliding_attention, sliding_window {window}")
            for i, kind in enumerate(types[:layers])
            if kind == "sliding_attention"
        ]
    used_present, used = config.lookup(("use_sliding_window",))
    if used_present:
        first_present, first = config.lookup(("max_window_layers",))
        if used is not True or not first_present or not isinstance(first, int):
            return []
        step = config.step(("use_sliding_window",), "use_sliding_window true")
        return [
            Declared(i, window, (step, window_step), f"use_sliding_window from max_window_layers {first} on")
            for i in range(first, layers)
        ]
    return [Declared(i, window, (window_step,), f"sliding_window {window}") for i in range(layers)]


def _served_window(config: ConfigFile) -> int | None:
    """The model-level window the engine takes from the served (target) config."""
    _, window = config.lookup(("sliding_window",))
    _, used = config.lookup(("use_sliding_window",))
    if used is False or not isinstance(window, int) or isinstance(window, bool):
        return None
    return window


def _engine_attention(ctx: SideContext) -> tuple[set[str], Step] | None:
    """The engine's attention classes (a constructor taking `per_layer_sliding_window`) and the
    statement that falls back to the served model's window when a layer passes none."""
    assert ctx.index is not None
    names: set[str] = set()
    fallback: Step | None = None
    for relpath in ctx.anchor_files(f"{PER_LAYER}: int"):
        module = ctx.index.load(relpath)
        if module is None:
            continue
        for cls in module.classes.values():
            init = cls.methods.get("__init__")
            if init is None or f"{PER_LAYER}:" not in init.text:
                continue
            statement = next((node for node, text, _ in guarded_statements(init) if _FALLBACK.search(text)), None)
            if statement is None:
                continue
            names.add(cls.name)
            if fallback is None:
                step = module.step(
                    statement, init.node, "falls back to the served model's window when a layer passes none"
                )
                fallback = replace(step, kind=StepKind.ASSIGN)
    return (names, fallback) if names and fallback is not None else None
