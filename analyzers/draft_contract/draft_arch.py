"""Whether the serving engine builds a draft class for the architecture the draft config names."""

from __future__ import annotations

import re
from collections.abc import Iterator

from rca.sdk import Analyzer, Compares, Example, Fact, Finding, Location, Reports, SideContext, Step, StepKind
from rca.sdk.engines import declaration_for, served_architectures
from rca.sdk.examples import DRAFT_LOADER, SMALL_VOCAB_TARGET

_DEFINED = re.compile(r"^class\s+(\w+)\s*[(:]", re.MULTILINE)
_REGISTERED = re.compile(r"""^\s*["'](\w*Eagle3\w*)["']\s*:""", re.MULTILINE)


class DraftArch(Analyzer):
    """Reads whether the serving engine has a class for the draft's `architectures`, and which EAGLE-3 classes it has.

    ## What it reads
    The draft config's `architectures`, looked up as a class definition or a model-registry entry
    in the serving source (as the other draft checks do); when none is found, the EAGLE-3 draft
    classes the source does define (`class ...Eagle3...` in its `*eagle3*` modules) and the
    EAGLE-3 names its registries list.

    ## Why it matters
    A draft config named the way another engine or trainer names it (`LlamaForCausalLMEagle3` for
    an engine that builds `Eagle3LlamaForCausalLM`, a checkpoint of another draft family) is not
    built as the draft it is: the engine refuses it, or builds another class whose loader and
    layers do not match the checkpoint.
    """

    code = "RCA-D104"
    name = "draft-arch"
    formerly = ("RCA-S112",)
    sides = frozenset({"serving"})
    compares = Compares(
        training="the architecture the draft config names",
        serving=(
            "the class the engine builds for it, after its own renames (lmdeploy's config builders, vLLM's "
            "EAGLEConfig) and registries"
        ),
    )
    reports = (Reports("draft-arch-unknown", hypothesis="draft-arch-unsupported"),)
    INVALID = (
        Example(
            files={"models/draft_eagle3.py": DRAFT_LOADER},
            target=SMALL_VOCAB_TARGET,
            draft={"architectures": ["Eagle3DraftForCausalLM"]},
            finding="draft-arch-unknown",
            path="draft.json",
            key=("architectures",),
            message=(
                "the draft config names Eagle3DraftForCausalLM, which example does not build: its EAGLE-3 draft "
                "classes are DraftForCausalLM"
            ),
            why="a draft config named for another engine's class",
        ),
    )
    VALID = (
        Example(
            files={"models/draft_eagle3.py": DRAFT_LOADER},
            target=SMALL_VOCAB_TARGET,
            draft={"architectures": ["DraftForCausalLM"]},
            why="the engine defines the class the draft names",
        ),
    )

    def applies_to(self, ctx: SideContext) -> bool:
        return ctx.draft is not None and bool(ctx.draft.architectures)

    def run(self, ctx: SideContext) -> Iterator[Fact | Finding]:
        assert ctx.draft is not None
        if ctx.draft_model() is not None:
            return
        known = _eagle3_classes(ctx)
        names = ", ".join(ctx.draft.architectures)
        if not known:
            ctx.note(f"no EAGLE-3 draft class was found in {ctx.tree.label}, nor one named {names}")
            return
        declared = ctx.draft.config.step(("architectures",), f"architectures {list(ctx.draft.architectures)}")
        classes = list(dict.fromkeys(name for name, _ in known))
        shown = ", ".join(classes)
        served, renamed = served_architectures(ctx)
        if renamed is not None:  # the engine's config builder renames the declared architecture first
            prefix = (
                served[0][: -len(ctx.draft.architectures[0])] if served[0].endswith(ctx.draft.architectures[0]) else ""
            )
            wanted = [name.removeprefix(prefix) for name in classes if prefix and name.startswith(prefix)]
            said = f"which {ctx.tree.label}'s config builder renames to {', '.join(served)} ({renamed.location}), "
            said += "a class it does not build"
            fix = (
                f"declare {' or '.join(wanted)} in the draft config ({declared.location}): the builder prefixes "
                f"{prefix} to it"
                if wanted
                else f"serve the draft on an engine that builds {names}"
            )
        elif made := {name: declared_as for name in classes if (declared_as := declaration_for(ctx, name))}:
            said = f"which {ctx.tree.label} does not build"
            fix = " or ".join(
                f"declare {declared_as} in the draft config ({declared.location}): the engine's config builder "
                f"makes it {name}"
                for name, declared_as in made.items()
            )
        elif set(ctx.draft.architectures) & set(ctx.target.architectures):
            said = (
                f"the target's own architecture, which {ctx.tree.label} builds as a target model, not an EAGLE-3 draft"
            )
            fix = ""
        else:
            said = f"which {ctx.tree.label} does not build"
            fix = ""
        yield self.finding(
            ctx,
            "draft-arch-unknown",
            f"the draft config names {names}, {said}: its EAGLE-3 draft classes are {shown}",
            declared.location,
            likelihood_ratio=10.0,
            steps=(declared, *((renamed,) if renamed is not None else ()), *(step for _, step in known[:2])),
            fix=fix
            or f"name the architecture the engine builds for this draft family ({shown}) in the draft config "
            f"({declared.location}), or serve it on an engine that builds {names}",
        )


def _eagle3_classes(ctx: SideContext) -> list[tuple[str, Step]]:
    """EAGLE-3 draft classes the serving source defines in its eagle3 modules, and the EAGLE-3
    names its registries list, each with where it is."""
    found: list[tuple[str, Step]] = []
    for relpath in ctx.tree.files():
        name = relpath.rsplit("/", 1)[-1].lower()
        pattern = _DEFINED if "eagle3" in name else _REGISTERED if "registry" in name else None
        if pattern is None:
            continue
        text = ctx.tree.read(relpath) or ""
        for match in pattern.finditer(text):
            if "ForCausalLM" not in match[1]:
                continue  # a layer, a proposer or a helper of the module, not a model
            number = text.count("\n", 0, match.start(1)) + 1
            line = text.splitlines()[number - 1].strip()
            location = Location(ctx.tree.input, relpath, number, number)
            found.append((match[1], Step(location, f"{match[1]} is an EAGLE-3 draft class", line, StepKind.ASSIGN)))
    return found
