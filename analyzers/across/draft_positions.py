"""The rotary embedding and the maximum positions the serving engine builds the draft's layer with,
against the target's and the served context length."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from rca.sdk import (
    Analyzer,
    Compares,
    Establishes,
    Example,
    Fact,
    Finding,
    Location,
    Reports,
    SideContext,
    Step,
    StepKind,
    Wiring,
)
from rca.sdk.code import ClassInfo, first_line, guarded_statements
from rca.sdk.examples import CONTEXT_FLAG, ROPE_LAYER, SMALL_VOCAB_TARGET
from rca.sdk.inputs import ConfigFile
from rca.sdk.sides import of_another_family

# What makes two rotary embeddings rotate alike, in the keys configs spell them with.
_ROPE_KEYS = ("rope_type", "factor", "rope_theta", "original_max_position_embeddings", "low_freq_factor",
              "high_freq_factor", "beta_fast", "beta_slow")  # fmt: skip
_READS_ROPE = re.compile(r'config\s*,\s*"(rope_scaling|rope_parameters)"|config\.(rope_scaling|rope_parameters)\b')
_LAYER_CONFIGS = ("transformer_layer_config",)  # where a trainer's format nests the draft layer's config
_READS_THETA = re.compile(r'config\s*,\s*"rope_theta"|config\.rope_theta\b')
# A trainer that builds its draft's layer from the target's (the verifier's) config: it reads the
# target config's RoPE, or hands that config over as the draft layer's.
_FROM_TARGET = re.compile(
    r"\b(?:verifier|target|base)\w*config\w*\.(?:rope_parameters|rope_scaling)\b"
    r"|\b\w*layer_config\s*=\s*(?:verifier|target)\w*config\b"
)
_FROM_TARGET_NEEDLES = ("rope_parameters", "rope_scaling", "layer_config")
_READS_POSITIONS = re.compile(r'config\s*,\s*"max_position_embeddings"|config\.max_position_embeddings\b')
_CONTEXT_SETTINGS = ("context_length", "max_model_len")  # SGLang's --context-length, vLLM's --max-model-len

ROPE_TARGET = {
    **SMALL_VOCAB_TARGET,
    "max_position_embeddings": 131072,
    "rope_theta": 500000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192},
}
ROPE_DRAFT = {"architectures": ["DraftForCausalLM"], "hidden_size": 4, "max_position_embeddings": 131072}


_RAISES_POSITIONS = """
import os


def derive_context_length(hf_text_config, context_length, is_draft_model):
    if context_length > hf_text_config.max_position_embeddings:
        if os.getenv("ALLOW_LONGER_CONTEXT"):
            if is_draft_model:
                hf_text_config.max_position_embeddings = context_length
    return context_length
"""

# A trainer that builds its draft's decoder layer from the verifier's config (speculators' shape).
_TRAINER_FROM_VERIFIER = """
from copy import deepcopy

from transformers import AutoConfig, LlamaConfig


def create_transformer_layer_config(verifier_name_or_path):
    verifier_config = AutoConfig.from_pretrained(verifier_name_or_path)
    rope_params = deepcopy(verifier_config.rope_parameters)
    return LlamaConfig(hidden_size=verifier_config.hidden_size, num_hidden_layers=1, rope_parameters=rope_params)
"""

# ... and one that builds it from the draft config its user wrote (SpecForge's shape).
_TRAINER_OWN_CONFIG = """
import json

from transformers import LlamaConfig


def load_draft_config(path):
    with open(path) as file:
        return LlamaConfig(**json.load(file))
"""

# An engine's draft layer that reads the draft config's rope_theta and never its scaling.
ROPE_THETA_LAYER = """
class DecoderLayer(nn.Module):
    def __init__(self, config):
        rope_theta = getattr(config, "rope_theta", 10000)
        self.rotary_emb = get_rope(4, base=rope_theta)


class DraftForCausalLM(nn.Module):
    def __init__(self, config):
        self.layer = DecoderLayer(config)
"""

DRAFT_2K = {  # the target's RoPE, but built for 2,048 positions
    **ROPE_DRAFT,
    "max_position_embeddings": 2048,
    "rope_theta": 500000.0,
    "rope_scaling": ROPE_TARGET["rope_scaling"],
}


@dataclass(frozen=True)
class RopeUse:
    """The RoPE one side builds the draft's layer with (`_rope`'s form), where that comes from, and,
    served, the RoPE the draft config declares as its trainer wrote it (before any conversion)."""

    rope: Mapping[str, Any]
    source: str  # in words: "the draft config", "the target's config"
    steps: tuple[Step, ...]
    declared: Mapping[str, Any] | None = None
    declared_steps: tuple[Step, ...] = ()
    builder: str = ""  # served: the engine that builds the layer
    how: str = ""  # served: how it reads the config, where it reads part of it (`reading only its rope_theta`)

    def to_json(self) -> dict[str, Any]:
        return {
            "rope": dict(self.rope),
            "source": self.source,
            **({"declared": dict(self.declared)} if self.declared is not None else {}),
            "steps": [step.citation() for step in (*self.steps, *self.declared_steps)],
        }


class DraftPositions(Analyzer):
    """Reads the RoPE and maximum positions the engine builds the draft's layer with, against those it was trained with.

    ## What it reads
    Serving: the modules of the draft class the engine builds and of the layers it derives from,
    for where they take `rope_scaling` / `rope_parameters` (or only `rope_theta`) and
    `max_position_embeddings` from the config they are given (the draft's, as the engine converted
    it). Training: whether the trainer builds its draft's layer from the target's config (it reads
    the verifier's RoPE, or hands the verifier's config over as the draft layer's), where the
    trainer's code is given.

    Then it compares training with serving. The RoPE the draft was trained with is the target's
    where the trainer's code builds the draft from the target's config, else the one the draft
    config declares as its trainer wrote it; the RoPE it is served with is the one the engine builds
    from the draft config. A draft whose RoPE differs from its target's is no finding by itself:
    published drafts are often trained with their own. The draft's maximum positions are compared
    with the context served (`--context-length`, `--max-model-len` in `--serving-args`, else the
    target's maximum positions, which engines serve by default), citing where the engine sets a
    draft config's `max_position_embeddings` itself before building it (vLLM 0.33 raises it to the
    target's length, SGLang 0.5.12 to the served context when its override variable is set): that
    sizes the rotary table, not what the draft learned.

    ## Why it matters
    A converter that dropped `rope_scaling` from a draft trained with the target's leaves the served
    draft rotating positions differently from training beyond the original context; a draft config
    with 2,048 maximum positions served at 131,072 has no rotation for, and never learned, the
    positions it is asked about. Both lower acceptance exactly on long prompts, with nothing logged.
    """

    code = "RCA-X101"
    name = "draft-positions"
    formerly = ("RCA-S110",)
    sides = frozenset({"serving", "training"})
    compares = Compares(
        training=(
            "RoPE: the target's where the trainer's code builds the draft's layer from the verifier's config, else "
            "the draft config's as its trainer wrote it; positions: its max_position_embeddings as written"
        ),
        serving=(
            "the RoPE the engine's draft layer builds from the draft config; the context the launch serves "
            "(--max-model-len, --context-length, else the target's maximum, the engines' default)"
        ),
    )
    establishes = Establishes("draft_rope", "the RoPE the draft's layer is built with on the side: scaling and theta")
    reports = (
        Reports("draft-rope-differs", hypothesis="rope-mismatch"),
        Reports("draft-positions-short", hypothesis="context-too-short"),
    )
    INVALID = (
        Example(
            files={"train.py": _TRAINER_FROM_VERIFIER},
            serving_files={"draft.py": ROPE_LAYER},
            target=ROPE_TARGET,
            draft={**ROPE_DRAFT, "rope_theta": 500000.0},
            finding="draft-rope-differs",
            path="draft.json",
            key=("rope_theta",),
            message=(
                "the draft was trained with the RoPE of the target's config, llama3 (factor 8.0, theta 500000.0, "
                "original_max_position_embeddings 8192); example builds its layer from the draft config, with "
                "default (theta 500000.0): positions past 8192 rotate differently"
            ),
            why="a converter that forwarded rope_theta and dropped rope_scaling from a draft trained with the "
            "target's RoPE",
        ),
        Example(
            files={"draft.py": ROPE_THETA_LAYER},
            target=ROPE_TARGET,
            draft={**ROPE_DRAFT, "rope_theta": 500000.0, "rope_scaling": ROPE_TARGET["rope_scaling"]},
            finding="draft-rope-differs",
            path="draft.json",
            key=("rope_scaling",),
            message=(
                "the draft was trained with the RoPE of the draft config as its trainer wrote it, llama3 (factor "
                "8.0, theta 500000.0, original_max_position_embeddings 8192); example builds its layer with default "
                "(theta 500000.0), reading only the draft config's rope_theta: positions past 8192 rotate differently"
            ),
            why="an engine whose draft layer reads rope_theta and never the draft's rope_scaling",
        ),
        Example(
            files={"draft.py": ROPE_LAYER},
            target=ROPE_TARGET,
            draft=DRAFT_2K,
            finding="draft-positions-short",
            path="draft.json",
            key=("max_position_embeddings",),
            message=(
                "the draft's layer is built for 2,048 positions (max_position_embeddings), the target serves 131,072"
            ),
            why="a shipped draft config trained at 2k context",
        ),
        Example(
            files={"draft.py": ROPE_LAYER, "model_config.py": _RAISES_POSITIONS},
            target=ROPE_TARGET,
            draft=DRAFT_2K,
            finding="draft-positions-short",
            path="draft.json",
            key=("max_position_embeddings",),
            message=(
                "the draft's layer is built for 2,048 positions (max_position_embeddings), the target serves 131,072; "
                "example raises the draft's max_position_embeddings to the served context before building it where "
                "its tests allow (model_config.py:9, with ALLOW_LONGER_CONTEXT set), which sizes its rotary table but "
                "does not teach it positions past 2,048"
            ),
            why="an engine that raises a short draft's positions to the served context (SGLang 0.5.12 with its "
            "override variable set)",
        ),
    )
    VALID = (
        Example(
            files={"draft.py": ROPE_LAYER},
            target=ROPE_TARGET,
            draft={**ROPE_DRAFT, "rope_theta": 500000.0, "rope_scaling": ROPE_TARGET["rope_scaling"]},
            why="the draft config carries the target's llama3 scaling and context",
        ),
        Example(
            files={"draft.py": ROPE_LAYER},
            target=ROPE_TARGET,
            draft={**ROPE_DRAFT, "rope_theta": 10000.0},
            why="a published draft trained with its own RoPE (no scaling, theta 10000), served with it: the draft "
            "differs from its target, as it was trained",
        ),
        Example(
            files={"train.py": _TRAINER_OWN_CONFIG},
            serving_files={"draft.py": ROPE_LAYER},
            target=ROPE_TARGET,
            draft={**ROPE_DRAFT, "rope_theta": 10000.0},
            why="a trainer that builds its draft from the draft config the user wrote: that config is the record",
        ),
        Example(
            files={"draft.py": ROPE_LAYER, "server_args.py": CONTEXT_FLAG},
            target=ROPE_TARGET,
            draft=DRAFT_2K,
            settings="--max-model-len 2048",
            why="the launch serves no more than the draft's 2,048 positions, whatever the target could serve",
        ),
    )

    def applies_to(self, ctx: SideContext) -> bool:
        return ctx.draft is not None and bool(ctx.draft.architectures)

    def run(self, ctx: SideContext) -> Iterator[Fact | Finding]:
        assert ctx.draft is not None
        if ctx.side == "training":
            yield from self._trained(ctx)
            return
        built = ctx.draft_model()
        if built is None:
            return
        sources = _draft_sources(ctx, built[0])
        rope_read = first_line(
            ctx, sources, _READS_ROPE, "the draft's layer takes its RoPE from the draft config", StepKind.ASSIGN
        )
        theta_read = first_line(
            ctx, sources, _READS_THETA, "the draft's layer takes only rope_theta from the draft config", StepKind.ASSIGN
        )
        positions_read = first_line(
            ctx,
            sources,
            _READS_POSITIONS,
            "the draft's layer takes its maximum positions from the draft config",
            StepKind.ASSIGN,
        )
        served = self._served(ctx, rope_read, theta_read)
        if served is not None:
            yield self.aspect(ctx, served.steps[-1].location, "the RoPE the draft is served with", served)
        if positions_read is not None:
            yield from self._positions(ctx, positions_read)

    def _served(self, ctx: SideContext, rope_read: Step | None, theta_read: Step | None) -> RopeUse | None:
        """The RoPE the engine builds the draft's layer with, and the one its config declares as trained."""
        assert ctx.draft is not None
        declared_config = ctx.as_trained.config
        nest = next((key for key in _LAYER_CONFIGS if isinstance(declared_config.data.get(key), dict)), None)
        declared_path = (nest,) if nest else ()
        declared = _rope(declared_config, declared_path)
        declared_step = declared_config.step(
            _rope_path(declared_config, declared_path),
            f"the draft's RoPE as its trainer wrote it: {_describe(declared)}",
        )
        config = ctx.draft.config
        if nest and isinstance(config.data.get(nest), dict) and not _rope(config, ()):
            ctx.note(
                f"the draft config nests its layer's config under {nest} and {ctx.tree.label}'s reading of that "
                "format was not followed: the RoPE its draft layer is built with is not compared"
            )
            return None  # what the engine builds from the nested config is unread: no comparison, no guess
        if rope_read is not None:
            rope, how = _rope(config, ()), ""
        elif theta_read is not None:
            present, theta = config.lookup(("rope_theta",))
            rope, how = (
                {"rope_type": "default", **({"rope_theta": theta} if present else {})},
                "reading only the draft config's rope_theta",
            )
        else:
            return None
        read = rope_read or theta_read
        assert read is not None
        served_step = config.step(_rope_path(config, ()), f"the draft's RoPE as served: {_describe(rope)}")
        return RopeUse(rope, "the draft config", (served_step, read), declared, (declared_step,), ctx.tree.label, how)

    def _trained(self, ctx: SideContext) -> Iterator[Fact]:
        """Where the trainer's code builds its draft's layer from the target's config: its RoPE is the target's."""
        hits = ctx.tree.grep(list(_FROM_TARGET_NEEDLES))
        for relpath in sorted(set().union(*hits.values())):
            if of_another_family(ctx, relpath):
                continue
            for number, line in enumerate((ctx.tree.read(relpath) or "").splitlines(), start=1):
                if not _FROM_TARGET.search(line):
                    continue
                location = Location(ctx.tree.input, relpath, number, number)
                read = Step(
                    location,
                    "the trainer builds its draft's layer from the target's config",
                    line.strip(),
                    StepKind.ASSIGN,
                )
                config, nest = ctx.target.config, _nest(ctx)
                rope = _rope(config, nest)
                cited = config.step(_rope_path(config, nest), f"the target's RoPE: {_describe(rope)}")
                use = RopeUse(rope, "the target's config", (read, cited))
                yield self.aspect(ctx, location, "the RoPE the draft was trained with", use)
                return

    def across(self, training: Wiring, serving: Wiring) -> Iterator[Finding]:
        served = self.established(serving)
        if not isinstance(served, RopeUse) or served.declared is None:
            return
        trained = self.established(training)
        if isinstance(trained, RopeUse):
            rope, source, steps = trained.rope, trained.source, trained.steps
        else:
            rope, source, steps = served.declared, "the draft config as its trainer wrote it", served.declared_steps
        differing = [key for key in _ROPE_KEYS if rope.get(key) != served.rope.get(key)]
        if not differing or not rope:
            return
        original = rope.get("original_max_position_embeddings") or served.rope.get("original_max_position_embeddings")
        beyond = (
            f": positions past {original} rotate differently" if original else ": every position rotates differently"
        )
        built = (
            f"with {_describe(served.rope)}, {served.how}"
            if served.how
            else f"from the draft config, with {_describe(served.rope)}"
        )
        yield self.finding(
            "serving",
            "draft-rope-differs",
            f"the draft was trained with the RoPE of {source}, {_describe(rope)}; {served.builder} builds its layer "
            f"{built}{beyond}",
            served.steps[0].location,
            likelihood_ratio=5.0,
            steps=(*steps, *served.steps),
            fix=f"give the draft config the RoPE it was trained with ({', '.join(differing)}: {_describe(rope)})",
        )

    def _positions(self, ctx: SideContext, read: Step) -> Iterator[Finding]:
        assert ctx.draft is not None
        recorded = (ctx.recorded or ctx.draft).config  # the positions as trained, where the config was edited since
        present, draft = recorded.lookup(("max_position_embeddings",))
        if not present or not isinstance(draft, int):
            return
        limits: list[tuple[int, Step]] = []  # what is served: the launch's context, else the target's
        for dest in _CONTEXT_SETTINGS:
            setting = ctx.settings.get(dest) if ctx.settings is not None else None
            served = _integer(setting.value) if setting is not None else None
            if setting is not None and served is not None:
                limits.append((served, setting.step))
        target_path = ctx.target.key_path("max_position_embeddings")
        target = ctx.target.config.lookup(target_path)[1] if target_path else None
        if not limits and target_path and isinstance(target, int) and not isinstance(target, bool):
            limits.append((target, ctx.target.config.step(target_path, f"the target's maximum positions: {target}")))
        short = [(limit, step) for limit, step in limits if draft < limit]
        if not short:
            return
        limit, limit_step = max(short, key=lambda item: item[0])
        draft_step = recorded.step(("max_position_embeddings",), f"max_position_embeddings {draft}")
        serves = "the target serves" if limit_step.location.input == "target" else "the launch settings serve"
        adjusted = _adjustments(ctx)
        said = ""
        if adjusted:
            gates = sorted({gate for _, gates in adjusted for gate in gates})
            said = (
                f"; {ctx.tree.label} raises the draft's max_position_embeddings to the served context before building "
                f"it where its tests allow ({', '.join(str(step.location) for step, _ in adjusted)}"
                + (f", with {' or '.join(gates)} set" if gates else "")
                + f"), which sizes its rotary table but does not teach it positions past {draft:,}"
            )
        _, raised = ctx.draft.config.lookup(("max_position_embeddings",))
        if ctx.recorded is not None and isinstance(raised, int) and raised != draft:
            said += (
                f"; its config as served says {raised:,} (edited since training, or overridden at launch), which "
                f"sizes its rotary table but does not teach it positions past {draft:,}"
            )
        built = "the draft was trained for" if ctx.recorded is not None else "the draft's layer is built for"
        yield self.finding(
            ctx,
            "draft-positions-short",
            f"{built} {draft:,} positions (max_position_embeddings), {serves} {limit:,}{said}",
            draft_step.location,
            likelihood_ratio=5.0,
            steps=(draft_step, limit_step, read, *(step for step, _ in adjusted)),
            fix=f"serve with a context of at most {draft:,} tokens, or use a draft trained for {limit:,} positions "
            "(raising the config value alone does not teach the draft longer contexts)",
        )


_SETS_POSITIONS = ".max_position_embeddings = "
_ASSIGNS_POSITIONS = re.compile(
    r"^(?!self\.max_position_embeddings)[\w.]+\.max_position_embeddings\s*=\s*\w"
)  # another object's
_ENVIRONMENT = re.compile(r"\benvs\.([A-Z][A-Z0-9_]+)|getenv\(\s*[\"']([A-Z][A-Z0-9_]+)")


def _adjustments(ctx: SideContext) -> list[tuple[Step, tuple[str, ...]]]:
    """Where the engine sets a draft config's `max_position_embeddings` itself before it builds the
    draft (to the context it serves), each with the environment variables the tests around it read."""
    assert ctx.index is not None
    found: list[tuple[Step, tuple[str, ...]]] = []
    for relpath in ctx.tree.grep([_SETS_POSITIONS])[_SETS_POSITIONS]:
        ctx.index.allow(relpath)
        module = ctx.index.load(relpath)
        if module is None:
            continue
        for function in module.all_functions:
            if "draft" not in function.text or _SETS_POSITIONS not in function.text:
                continue
            for node, text, guards in guarded_statements(function):
                if _ASSIGNS_POSITIONS.match(text):
                    step = module.step(node, function.node, "the engine sets the draft's maximum positions")
                    gates = (match[1] or match[2] for test, _ in guards for match in _ENVIRONMENT.finditer(test))
                    found.append((replace(step, kind=StepKind.ASSIGN), tuple(dict.fromkeys(gates))))
    return found


def _nest(ctx: SideContext) -> tuple[str, ...]:
    path = ctx.target.key_path("num_hidden_layers")
    return tuple(path[:-1]) if path else ()


def _rope(config: ConfigFile, nest: tuple[str, ...]) -> dict[str, Any]:
    """The config's RoPE as one mapping: theta and the scaling parameters, whichever way it spells them."""
    data: Any = config.data
    for key in nest:
        data = data.get(key, {}) if isinstance(data, dict) else {}
    if not isinstance(data, dict):
        return {}
    found: dict[str, Any] = {}
    for key in ("rope_scaling", "rope_parameters"):
        value = data.get(key)
        if isinstance(value, dict):
            found.update(value)
    if "type" in found and "rope_type" not in found:
        found["rope_type"] = found.pop("type")
    if "rope_theta" in data:
        found["rope_theta"] = data["rope_theta"]
    if found and "rope_type" not in found:
        found["rope_type"] = "default"
    return {key: found[key] for key in _ROPE_KEYS if key in found}


def _rope_path(config: ConfigFile, nest: tuple[str, ...]) -> tuple[str, ...]:
    for key in ("rope_scaling", "rope_parameters", "rope_theta"):
        if config.lookup((*nest, key))[0]:
            return (*nest, key)
    return nest


def _describe(rope: Mapping[str, Any]) -> str:
    details = ", ".join(
        f"{'theta' if key == 'rope_theta' else key} {rope[key]}" for key in _ROPE_KEYS[1:] if key in rope
    )
    if "rope_theta" not in rope:
        details += f"{', ' if details else ''}no rope_theta: the engine's default"
    return f"{rope.get('rope_type', 'default')}" + (f" ({details})" if details else "")


def _integer(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return None


def _draft_sources(ctx: SideContext, cls: ClassInfo) -> list[str]:
    """The draft class's file, the files its classes derive from, then the sibling model files it
    imports from (a base chosen under `TYPE_CHECKING` hides the real one)."""
    files = [cls.module.relpath]
    for klass in list(cls.module.classes.values()):
        files += [base.module.relpath for base in ctx.evaluator.mro(klass)]
    assert ctx.index is not None
    folder = cls.module.relpath.rpartition("/")[0]
    for binding in cls.module.imports.values():
        relpath = ctx.index.resolve(binding.module)
        if relpath is not None and relpath.rpartition("/")[0] == folder:
            files.append(relpath)
    return list(dict.fromkeys(files))
