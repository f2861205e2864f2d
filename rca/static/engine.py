"""Runs the analyzers of one side in dependency order over a shared context."""

from __future__ import annotations

import heapq
import traceback

from rca.errors import RcaError
from rca.static.analyzer import FAMILIES, Analyzer, registry
from rca.static.context import SideContext
from rca.static.evaluate.interface import BudgetExceeded

PREFIXES = tuple(FAMILIES.values())


def _rank(analyzer: type[Analyzer]) -> tuple[int, str]:
    """Where an analyzer free to run runs: by its family (its code's prefix letter), then its code."""
    prefix = analyzer.code[:5]
    return (PREFIXES.index(prefix) if prefix in PREFIXES else len(PREFIXES), analyzer.code)


def ordered(analyzers: list[type[Analyzer]]) -> list[type[Analyzer]]:
    """Analyzers sorted so that every fact type is produced before it is required, and an analyzer
    that takes precedence for a fact runs before those it competes with; among those free to run,
    by family (what a side captures before the draft's contract, the contract before what compares
    the sides) and then by code (a lexicographical topological sort)."""
    after: dict[type[Analyzer], set[type[Analyzer]]] = {analyzer: set() for analyzer in analyzers}
    for analyzer in analyzers:
        for other in analyzers:
            if other is analyzer:
                continue
            if set(other.provides) & set(analyzer.requires):
                after[other].add(analyzer)
            if set(other.provides) & set(analyzer.provides) and other.precedence < analyzer.precedence:
                after[other].add(analyzer)  # competing for a fact: the one that takes precedence runs first
    waiting = dict.fromkeys(analyzers, 0)
    for followers in after.values():
        for follower in followers:
            waiting[follower] += 1
    position = {analyzer: number for number, analyzer in enumerate(analyzers)}
    ready = [(_rank(analyzer), position[analyzer], analyzer) for analyzer, count in waiting.items() if count == 0]
    heapq.heapify(ready)
    result: list[type[Analyzer]] = []
    while ready:
        _, _, analyzer = heapq.heappop(ready)
        result.append(analyzer)
        for follower in after[analyzer]:
            waiting[follower] -= 1
            if waiting[follower] == 0:
                heapq.heappush(ready, (_rank(follower), position[follower], follower))
    if len(result) != len(analyzers):
        raise RuntimeError("the analyzers' facts depend on each other in a cycle")
    return result


# Runs of a side at most: each rerun starts with more modules allowed, so this bounds a chain of
# analyzers each allowing what an earlier one was refused (none seen beyond one rerun).
_RUNS = 3


def run_side(ctx: SideContext, only: set[str] | None = None) -> None:
    """Run every applicable analyzer of the side; one failing analyzer never stops the others.

    Analyzers widen the code evaluation may read as they go (the class a draft is built as, the
    modules its builder imports); where one was refused a module that a later one allowed, the
    side runs again with the wider set, so that no result depends on the order analyzers ran in."""
    analyzers = [a for a in ordered(registry().for_side(ctx.side)) if only is None or a.name in only]
    for run in range(_RUNS):
        if run:
            ctx.restart()
        ctx.prepare(registry().anchors(ctx.side), ctx.index)
        if ctx.side == "serving":
            ctx.convert_draft()
        _run_analyzers(ctx, analyzers)
        if ctx.index is None or not ctx.index.allowed_since_denied():
            return


def _run_analyzers(ctx: SideContext, analyzers: list[type[Analyzer]]) -> None:
    drafting = ctx.drafting
    for analyzer_type in analyzers:
        if drafting not in analyzer_type.drafting:
            continue
        if any(ctx.fact(kind) is None for kind in analyzer_type.requires):
            continue
        if any(ctx.fact(kind) is not None for kind in analyzer_type.provides):
            continue  # a more specific analyzer already established it
        analyzer = analyzer_type()
        try:
            if not analyzer.applies_to(ctx):
                continue
            for item in analyzer.run(ctx):
                ctx.add(item)
        except RcaError:
            raise
        except BudgetExceeded as error:
            ctx.note(f"{analyzer_type.name} stopped: {error}")
        except Exception as error:
            ctx.note(
                f"analyzer {analyzer_type.name} failed: {type(error).__name__}: {error} (rerun with --debug for the "
                f"traceback)"
            )
            ctx.debug.append(traceback.format_exc())
