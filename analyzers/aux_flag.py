"""Whether the serving engine honours a draft that declares it takes no auxiliary hidden states."""

from __future__ import annotations

import re
from collections.abc import Iterator

from rca.analyzers._examples import CAPTURE_BEFORE, LOOP_MODEL, SGLANG_RUNNER, SMALL_TARGET
from rca.analyzers._support import first_line

from rca.model import StepKind
from rca.static.analyzer import Analyzer, Example, Reports
from rca.static.context import SideContext
from rca.static.facts import DraftInput, Fact, Finding

FLAG = "use_aux_hidden_state"
_MODEL = LOOP_MODEL.format(capture_before=CAPTURE_BEFORE, capture_after="pass")
_READ = re.compile(rf"""["']{FLAG}["']""")


class AuxFlag(Analyzer):
    """Reads whether the serving engine reads `use_aux_hidden_state`, when the draft declares it false.

    ## What it reads
    The draft config's `use_aux_hidden_state` (in `eagle_config` or at the top level). When it is
    false, the serving source is searched for code that reads the key; the first line that does is
    cited. Without one, the engine captures its layers and feeds their concatenation through `fc`
    whatever the draft declares.

    ## Why it matters
    Some EAGLE-3 drafts (e.g. heads trained on the target's last hidden state, like EAGLE-1) declare
    `use_aux_hidden_state: false`. An engine that ignores the flag feeds them a concatenation of
    captured layers through an `fc` they never trained: acceptance collapses without an error.
    Where the engine reads the flag, the draft is fed the last hidden state, and the capture shown
    for the wiring is not what it is fed (the side's notes say so).
    """

    code = "RCA-S111"
    name = "aux-flag"
    sides = frozenset({"serving"})
    reports = (Reports("aux-flag-unread", hypothesis="aux-flag-ignored"),)
    INVALID = (
        Example(
            files={"runner.py": SGLANG_RUNNER, "model.py": _MODEL},
            target=SMALL_TARGET,
            draft={"eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 3, 5], FLAG: False}},
            finding="aux-flag-unread",
            path="draft.json",
            line=8,
            message=(
                "the draft declares use_aux_hidden_state false (it takes the target's last hidden state), but "
                "nothing in example reads the key: the captured layers are fed through fc"
            ),
            why="an engine release that predates the flag",
        ),
    )
    VALID = (
        Example(
            files={
                "runner.py": SGLANG_RUNNER.replace(
                    "    def init_aux_hidden_state_capture(self):",
                    "    def init_aux_hidden_state_capture(self):\n"
                    '        if not self.draft_config.eagle_config.get("use_aux_hidden_state", True):\n'
                    "            return",
                ),
                "model.py": _MODEL,
            },
            target=SMALL_TARGET,
            draft={"eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 3, 5], FLAG: False}},
            why="the runner reads the flag and captures nothing for such a draft",
        ),
    )

    def applies_to(self, ctx: SideContext) -> bool:
        return ctx.draft is not None and self._declared(ctx) is not None

    def _declared(self, ctx: SideContext) -> tuple[str, ...] | None:
        assert ctx.draft is not None
        for path in (("eagle_config", FLAG), (FLAG,)):
            present, value = ctx.draft.config.lookup(path)
            if present and value is False:
                return path
        return None

    def run(self, ctx: SideContext) -> Iterator[Fact | Finding]:
        assert ctx.draft is not None
        path = self._declared(ctx)
        assert path is not None
        declared = ctx.draft.config.step(path, f"{'.'.join(path)} = false")
        files = sorted(ctx.anchor_files(f'"{FLAG}"') + ctx.anchor_files(f"'{FLAG}'"))
        read = first_line(ctx, files, _READ, f"reads {FLAG}", StepKind.CONFIG)
        if read is not None:
            ctx.note(
                f"the draft declares {FLAG} false, which {ctx.tree.label} reads ({read.location}): the draft is fed "
                "the target's last hidden state, not the captured layers the wiring shows"
            )
            return
        fed = ctx.fact(DraftInput)
        concatenation = tuple(fed.steps[-1:]) if fed is not None and fed.steps else ()
        yield self.finding(
            ctx,
            "aux-flag-unread",
            f"the draft declares {FLAG} false (it takes the target's last hidden state), but nothing in "
            f"{ctx.tree.label} reads the key: the captured layers are fed through fc",
            declared.location,
            likelihood_ratio=10.0,
            steps=(declared, *concatenation),
            fix=f"serve the draft on an engine release that reads {FLAG}, or with a draft trained on the "
            "captured layers",
        )
