"""Goal-directed evaluation: run a function only along the path to one statement (or to a call whose
arguments are wanted), binding local names on demand from their reaching definitions. This is how
a field such as `self.eagle_aux_hidden_state_layer_ids` is read out of a 300-line `__init__`
without evaluating the rest of it. Part of `Evaluator` (see interp.py)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import libcst as cst

from rca.model import Location
from rca.static.codeindex import FunctionInfo, parent_map
from rca.static.evaluate.interface import Frame, Parts
from rca.static.evaluate.statements import Break, Continue, Return
from rca.static.evaluate.syntax import arguments_for, block_of, calls_to, final_names, statement_order
from rca.static.evaluate.values import EvalRaise, ObjRef, Opaque, Val


@dataclass
class GoalResult:
    reached: bool
    frame: Frame | None = None
    args: tuple[list[Val], dict[str, Val]] | None = None  # for a call goal
    reason: str = ""
    location: Location | None = None
    followed: bool = True  # False: the analysis could not follow the path (not: the path is not taken)


class _GoalReached(Exception):
    def __init__(self, frame: Frame, call_args: tuple[list[Val], dict[str, Val]] | None) -> None:
        super().__init__()
        self.frame = frame
        self.call_args = call_args


class _GoalBlocked(Exception):
    def __init__(self, reason: str, location: Location | None) -> None:
        self.reason = reason
        self.location = location


def unbound_parameters(result: GoalResult) -> set[str]:
    """Names of the goal call's arguments that are parameters nothing bound."""
    args, kwargs = result.args or ([], {})
    return {
        value.v.hint
        for value in [*args, *kwargs.values()]
        if isinstance(value.v, Opaque) and value.v.reason == "argument not known"
    }


class Goals(Parts):
    """How the evaluator runs toward one statement."""

    def run_to(
        self, func: FunctionInfo, goal: cst.CSTNode, self_val: Val | None = None, bindings: dict[str, Val] | None = None
    ) -> GoalResult:
        """Run `func` only along the path to `goal` (a statement, or a call whose arguments we want)."""
        frame = self._function_frame(func, self_val, lazy=True)
        frame.locals.update(self._bind_unknown_params(func, bindings or {}, self_val))
        path = self._path_to(func, goal)
        if path is None:
            return GoalResult(False, reason="the goal is not inside the function")
        self.depth += 1
        try:
            self._exec_goal(block_of(func.node), frame, path, goal)
        except _GoalReached as reached:
            return GoalResult(True, reached.frame, reached.call_args)
        except _GoalBlocked as blocked:
            return GoalResult(False, reason=blocked.reason, location=blocked.location)
        except EvalRaise as error:
            return GoalResult(
                False,
                reason=f"raises {error.kind} before reaching it: {error.message}",
                location=error.location,
                followed=False,
            )
        except Return:
            return GoalResult(False, reason="returns before reaching it")
        except RecursionError:
            return GoalResult(False, reason="too deeply nested to evaluate", followed=False)
        finally:
            self.depth -= 1
        return GoalResult(False, reason="the path to it was not taken")

    def condition_at(self, func: FunctionInfo, statement: cst.If, self_val: Val | None = None) -> Val:
        """Whether an `if`'s test can be true where `func` reaches it: unknown conditions on the
        way (here and in what the test calls) take the branch that does not return a false
        constant. False when no such path makes it true, unknown when the path cannot be followed."""
        with self.policy.seeking():
            try:
                with self.policy.wanting(final_names([statement.test])):
                    result = self.run_to(func, statement, self_val)
                if not result.reached or result.frame is None:
                    return (
                        Val(False) if result.followed else Val(Opaque("condition", "", f"not reached: {result.reason}"))
                    )
                return self._eval(statement.test, result.frame)
            except EvalRaise as error:
                return Val(Opaque("condition", "", f"raises {error.kind}: {error.message}"))

    def run_to_call(
        self,
        func: FunctionInfo,
        call: cst.Call,
        self_val: Val | None = None,
        depth: int = 2,
        wanted: set[str] | None = None,
    ) -> GoalResult:
        """The arguments of `call` inside `func`. When they depend on parameters of `func` that
        nothing binds here, evaluate them at the callers of `func` (up to `depth` levels)."""
        with self.policy.wanting(wanted if wanted is not None else final_names(arg.value for arg in call.args)):
            result = self.run_to(func, call, self_val)
            unbound = unbound_parameters(result)
            if self.readers_of_settings and result.frame is not None:
                unbound |= result.frame.guards  # with launch settings, a caller may decide the path too
            if not result.reached or depth <= 0 or not unbound:
                return result
            blocked: GoalResult | None = None
            for caller, site in self.callers(func):
                needed = final_names(arguments_for(site, func.node, unbound))
                outer = self.run_to_call(
                    caller, site, Val(ObjRef(caller.owner)) if caller.owner is not None else None, depth - 1, needed
                )
                if not outer.reached or outer.args is None:
                    continue
                receiver = self_val if func.owner is not None else None
                bindings = self._bind(
                    func.node, outer.args[0], outer.args[1], receiver, self._module_frame(func.module, func.node)
                )
                retried = self.run_to(func, call, self_val, bindings)
                if retried.reached and not unbound_parameters(retried):
                    return retried
                if not retried.reached and retried.location is not None:
                    blocked = blocked or retried  # what the caller passes closes the path
            return blocked or result

    def callers(self, func: FunctionInfo) -> Iterator[tuple[FunctionInfo, cst.Call]]:
        """Call sites of `func` by name, in the analyzed files (calls through `self.` for methods)."""
        needle = f"{func.name}("
        for relpath in self.index.tree.grep([needle])[needle]:
            self.index.allow(relpath)  # a call naming the function is reason enough to read the file
            module = self.index.load(relpath)
            if module is None:
                continue
            for caller in module.all_functions:
                if needle not in caller.text or caller.node is func.node:
                    continue
                for site in calls_to(caller.node, func.name):
                    yield caller, site

    def _statement_order(
        self, func: FunctionInfo
    ) -> tuple[dict[cst.CSTNode, int], dict[str, list[tuple[int, cst.CSTNode]]]]:
        return statement_order(func.node)

    def _reaching_definition(self, frame: Frame, name: str) -> Val | None:
        """Bind a local the running path skipped: run the statement that last defined it before
        this point. A definition inside an if/try/with is run with its whole enclosing statement,
        so the branch the code really takes decides; one in a sibling branch cannot reach here."""
        assert frame.func is not None
        order, defs = self._statement_order(frame.func)
        sites = defs.get(name)
        if not sites:
            return None
        current = order.get(frame.current, len(order)) if frame.current is not None else len(order)
        parents = self._parent_map(frame.func)
        around_current = self._ancestors(parents, frame.current) if frame.current is not None else {frame.func.node}
        for position, candidate in reversed(sites):
            if position >= current:
                continue
            enclosing = candidate
            while parents.get(enclosing) is not None and parents[enclosing] not in around_current:
                enclosing = parents[enclosing]
            if (name, id(enclosing)) in frame.resolving:
                continue  # running it is what asked: an earlier definition binds the name inside it
            if isinstance(enclosing, (cst.BaseCompoundStatement, cst.SimpleStatementLine)):
                break
        else:
            return None
        if enclosing is not candidate:
            return self._run_enclosing(frame, enclosing, name)
        statement = candidate
        saved = frame.current
        frame.resolving.add((name, id(statement)))
        with self.isolated():
            try:
                frame.current = statement
                self._exec_definition(statement, frame, name)
            except (EvalRaise, _GoalBlocked):
                pass
            finally:
                frame.resolving.discard((name, id(statement)))
                frame.current = saved
        return frame.locals.get(name)

    @staticmethod
    def _ancestors(parents: dict[cst.CSTNode, cst.CSTNode], node: cst.CSTNode) -> set[cst.CSTNode]:
        found = {node}
        while node in parents:
            node = parents[node]
            found.add(node)
        return found

    def _run_enclosing(self, frame: Frame, statement: cst.CSTNode, name: str) -> Val | None:
        """Run a whole compound statement whose branches define `name`."""
        saved = frame.current
        frame.resolving.add((name, id(statement)))
        with self.isolated():
            try:
                self._exec_stmt(statement, frame)
            except (EvalRaise, _GoalBlocked, Break, Continue, Return):
                pass
            finally:
                frame.resolving.discard((name, id(statement)))
                frame.current = saved
        return frame.locals.get(name)

    def _exec_definition(self, statement: cst.CSTNode, frame: Frame, name: str) -> None:
        """Evaluate just the part of a statement that binds `name`."""
        if isinstance(statement, cst.For):
            iterable = self._eval(statement.iter, frame)
            items = self.iterate(iterable, frame, statement.iter)
            first = next(iter(items), None) if items is not None else None
            self._assign(statement.target, first or Val(Opaque(name, "", "loop variable")), frame, statement)
        elif isinstance(statement, cst.With):
            for item in statement.items:
                if item.asname is not None:
                    self._assign(item.asname.name, self._eval(item.item, frame), frame, statement)
        elif isinstance(statement, (cst.If, cst.While)):
            self._eval(statement.test, frame)  # a walrus in the condition
        elif isinstance(statement, (cst.Try, cst.TryStar)):
            return
        else:
            self._exec_stmt(statement, frame)

    def _parent_map(self, func: FunctionInfo) -> dict[cst.CSTNode, cst.CSTNode]:
        return parent_map(func.node)

    def _path_to(self, func: FunctionInfo, goal: cst.CSTNode) -> set[cst.CSTNode] | None:
        parents = self._parent_map(func)
        path = {goal}
        current = goal
        while current is not func.node:
            parent = parents.get(current)
            if parent is None:
                return None
            path.add(parent)
            current = parent
        return path

    def _exec_goal(
        self, statements: list[cst.CSTNode], frame: Frame, path: set[cst.CSTNode], goal: cst.CSTNode
    ) -> None:
        for statement in statements:
            if statement not in path:
                continue  # off the path: skipped; names it defines resolve on demand
            self._tick()
            frame.current = statement if not isinstance(statement, cst.BaseSmallStatement) else frame.current
            if statement is goal:
                self._exec_stmt(statement, frame)
                raise _GoalReached(frame, None)
            if isinstance(statement, (cst.SimpleStatementLine, cst.BaseSmallStatement)):
                smalls = statement.body if isinstance(statement, cst.SimpleStatementLine) else [statement]
                for small in smalls:
                    if small is goal:
                        self._exec_small(small, frame, statement)
                        raise _GoalReached(frame, None)
                    if small in path:
                        if isinstance(goal, cst.Call):
                            raise _GoalReached(frame, self._call_arguments(goal, frame))
                        self._exec_small(small, frame, statement)
                        raise _GoalReached(frame, None)
            elif isinstance(statement, cst.If):
                self._goal_if(statement, frame, path, goal)
            elif isinstance(statement, (cst.For, cst.While)):
                if isinstance(statement, cst.For):
                    self._exec_definition(statement, frame, "")
                block = block_of(statement)
                if statement.orelse is not None and statement.orelse in path:
                    block = block_of(statement.orelse)
                self._exec_goal(block, frame, path, goal)
            elif isinstance(statement, cst.With):
                for item in statement.items:
                    value = self._eval(item.item, frame)
                    if item.asname is not None:
                        self._assign(item.asname.name, value, frame, statement)
                self._exec_goal(block_of(statement), frame, path, goal)
            elif isinstance(statement, (cst.Try, cst.TryStar)):
                self._goal_try(statement, frame, path, goal)
            return

    def _goal_if(self, statement: cst.If, frame: Frame, path: set[cst.CSTNode], goal: cst.CSTNode) -> None:
        value = self._eval(statement.test, frame)
        into_body = statement.body in path
        if isinstance(value.v, Opaque):
            self.assume(
                frame, statement.test, f"assumed {'true' if into_body else 'false'} on the path to the cited line"
            )
            if value.v.reason == "argument not known":
                frame.guards.add(value.v.hint)
            truth = into_body
        else:
            truth = self.truth(value, frame, statement.test)
            if truth != into_body:
                location = self.loc(frame, statement.test)
                raise _GoalBlocked(f"the condition at {location} is {str(bool(truth)).lower()}", location)
        self.control.append(self._control_entry(statement.test, frame, value, truth))
        try:
            if into_body:
                self._exec_goal(block_of(statement), frame, path, goal)
            elif isinstance(statement.orelse, cst.If):
                self._exec_goal([statement.orelse], frame, path, goal)
            elif statement.orelse is not None:
                self._exec_goal(block_of(statement.orelse), frame, path, goal)
        finally:
            self.control.pop()

    def _goal_try(
        self, statement: cst.Try | cst.TryStar, frame: Frame, path: set[cst.CSTNode], goal: cst.CSTNode
    ) -> None:
        if statement.body in path:
            self._exec_goal(block_of(statement), frame, path, goal)
            return
        handler = next((h for h in statement.handlers if h in path), None)
        try:
            self._exec_block(block_of(statement), frame)
        except EvalRaise as error:
            matched = self._matching_handler(statement, error, frame)
            if handler is None or matched is not handler:
                raise
            self._record_handled(error, handler, frame)
            self._exec_goal(block_of(handler), frame, path, goal)
            return
        if handler is not None:
            location = self.loc(frame, handler)
            raise _GoalBlocked(
                f"the except branch at {location} runs only if the try block raises; it does not", location
            )
        final = statement.orelse if statement.orelse is not None and statement.orelse in path else statement.finalbody
        if final is not None:
            self._exec_goal(block_of(final), frame, path, goal)
