"""Runs the analyzers of one side in dependency order over a shared context."""

from __future__ import annotations

import traceback

import networkx as nx

from rca.errors import RcaError
from rca.static.analyzer import Analyzer, registry
from rca.static.context import SideContext
from rca.static.evaluate.interface import BudgetExceeded


def ordered(analyzers: list[type[Analyzer]]) -> list[type[Analyzer]]:
    """Analyzers sorted so that every fact type is produced before it is required, and an analyzer
    that takes precedence for a fact runs before those it competes with."""
    graph = nx.DiGraph()
    for analyzer in analyzers:
        graph.add_node(analyzer)
        for other in analyzers:
            if other is analyzer:
                continue
            if set(other.provides) & set(analyzer.requires):
                graph.add_edge(other, analyzer)
            if set(other.provides) & set(analyzer.provides) and other.precedence < analyzer.precedence:
                graph.add_edge(other, analyzer)  # competing for a fact: the one that takes precedence runs first
    return list(nx.lexicographical_topological_sort(graph, key=lambda analyzer: analyzer.code))


def run_side(ctx: SideContext, only: set[str] | None = None) -> None:
    """Run every applicable analyzer of the side; one failing analyzer never stops the others."""
    analyzers = [a for a in ordered(registry().for_side(ctx.side)) if only is None or a.name in only]
    ctx.prepare(registry().anchors(ctx.side), ctx.index)
    if ctx.side == "serving":
        ctx.convert_draft()
    for analyzer_type in analyzers:
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
