"""jinja2's immutable sandbox, bounded in the size of what a template builds.

jinja2's sandbox keeps a chat template from reaching outside, not from building values of any size:
`'x'.center(10**10)`, a string doubled forty times, one long string joined a thousand times. Every
step of a template that builds a value is measured before it builds: the operators `+ * % **` and
`~`, every call (methods, filters, globals), each `{{ value }}` written, and the text a block or the
template renders. A step's inputs are measured by what they could build from: strings by their
characters times the widest width their format fields write (`%10s`, `{:>10}`), containers by the
items they hold (one string held a thousand times counts a thousand times), integers as the counts
and widths they are. Their product, an upper bound of what a call builds, may not exceed MAX_VALUE.
rca renders a short exchange: a template that needs more is building, not formatting.
"""

from __future__ import annotations

import inspect
import re
import types
from collections.abc import Callable, ItemsView, Iterable, Iterator, KeysView, Mapping, ValuesView
from typing import Any

from jinja2.compiler import CodeGenerator
from jinja2.exceptions import SecurityError
from jinja2.runtime import Macro, markup_join, str_join
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

MAX_VALUE = 1_000_000  # characters or items a template may build in one value, or render in all
MAX_POWER = 64  # the largest exponent of `**`: the number of digits it builds grows with it

_PERCENT_FIELD = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\d*)(?:\.(\d*))?[a-zA-Z]")  # also strftime's `%10Y`
_BRACE_FIELD = re.compile(r"\{[\w.\[\]]*(?:![rsa])?:(?:.?[<>=^])?[-+ ]?z?#?0?(\d*)[,_]?(?:\.(\d*))?[a-zA-Z%]?\}")


class TooLarge(SecurityError):
    """A step of a template that would build more than MAX_VALUE."""


def held(value: Any, budget: int = MAX_VALUE) -> int:
    """The characters or items `value` holds, nested ones counted each time they are held; the
    count stops once past `budget`, so that it ends on any value."""
    total, pending = 0, [value]
    while pending and total <= budget:
        item = pending.pop()
        if isinstance(item, (str, bytes, range)):
            total += len(item)
            continue
        total += 1
        if isinstance(item, Namespace):  # `namespace(...)`: its attributes, which its repr writes
            item = object.__getattribute__(item, "_Namespace__attrs")
        if isinstance(item, dict):  # not any mapping: jinja2's context, handed to some filters, is one
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, (list, tuple, set, frozenset, KeysView, ValuesView, ItemsView)):
            pending.extend(item)
    return total


def _weight(operand: Any) -> int:
    """How much a step can build from one of its inputs (at least 1)."""
    if isinstance(operand, bool):
        return 1
    if isinstance(operand, int):
        return max(1, abs(operand))
    if isinstance(operand, str):
        widths = [int(width) for field in (_PERCENT_FIELD, _BRACE_FIELD) for width in _widths(field, operand)]
        return max(1, len(operand)) * max([1, *widths])
    return max(1, held(operand))


def _widths(field: re.Pattern[str], text: str) -> Iterator[str]:
    for match in field.finditer(text):
        yield from (group for group in match.groups() if group)


def _check(step: str, operands: list[Any]) -> None:
    """Refuse `step` when what it can build from `operands` exceeds MAX_VALUE."""
    bound = 1
    for operand in operands:
        bound *= _weight(operand)
        if bound > MAX_VALUE:
            raise TooLarge(f"{step} could build more than {MAX_VALUE:,} characters or items")


def _holds(step: str, value: Any, verb: str = "could build") -> Any:
    """`value`, when it holds no more than MAX_VALUE (else `step` `verb` too much)."""
    if held(value) > MAX_VALUE:
        raise TooLarge(f"{step} {verb} more than {MAX_VALUE:,} characters or items")
    return value


def _inputs(step: str, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """A call's arguments, generators drawn, once what the call can build from them fits."""
    args = tuple(_drawn(arg) for arg in args)
    kwargs = {key: _drawn(value) for key, value in kwargs.items()}
    _check(step, [*args, *kwargs.values()])
    return args, kwargs


def _bounded(name: str, function: Any) -> Any:
    """A filter that measures its inputs before it runs and its result after."""

    def bounded(*args: Any, **kwargs: Any) -> Any:
        args, kwargs = _inputs(f"the filter {name}", args, kwargs)
        return _holds(f"the filter {name}", function(*args, **kwargs), "built")

    bounded.__dict__.update(getattr(function, "__dict__", {}))  # jinja2's marks: pass the context, ...
    return bounded


def _drawn(value: Any) -> Any:
    """A generator (what `map` and `select` return) as the list it yields, drawn within MAX_VALUE:
    a call builds from what it draws, which its size does not show."""
    if not isinstance(value, types.GeneratorType):
        return value
    return _within(value, held, f"a sequence holds more than {MAX_VALUE:,} characters or items")


def _within(items: Iterable[Any], measure: Callable[[Any], int], refusal: str) -> list[Any]:
    """`items` drawn into a list, refused (`refusal` says why) once their measures add up past MAX_VALUE."""
    drawn, total = [], 0
    for item in items:
        total += measure(item)
        if total > MAX_VALUE:
            raise TooLarge(refusal)
        drawn.append(item)
    return drawn


def _name(function: Any) -> str:
    """A callable as an error line names it."""
    return getattr(function, "__name__", type(function).__name__)


class _Written(list):
    """The text a block (`{% set %}`, a macro, a filter block) writes, refused once past MAX_VALUE:
    jinja2 collects it in a list before it joins it."""

    def __init__(self) -> None:
        super().__init__()
        self.characters = 0

    def append(self, piece: str) -> None:
        self.extend((piece,))

    def extend(self, pieces: Any) -> None:
        pieces = tuple(pieces)
        self.characters += sum(len(piece) for piece in pieces)
        if self.characters > MAX_VALUE:
            raise TooLarge(f"a block renders more than {MAX_VALUE:,} characters")
        super().extend(pieces)


class _BoundedCodeGenerator(CodeGenerator):
    """jinja2's code generator, with blocks written to a `_Written` and `a ~ b` joined by the
    environment, which measures it first."""

    def buffer(self, frame: Any) -> None:
        frame.buffer = self.temporary_identifier()
        self.writeline(f"{frame.buffer} = environment.written()")

    def visit_Concat(self, node: Any, frame: Any) -> None:
        self.write("environment.joined(context, (")
        for part in node.nodes:
            self.visit(part, frame)
            self.write(", ")
        self.write("))")


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox, measuring each step that builds a value (see the module)."""

    intercepted_binops = frozenset({"+", "*", "%", "**"})
    code_generator_class = _BoundedCodeGenerator

    def __init__(self, filters: Mapping[str, Any], **options: Any) -> None:
        """The sandbox with jinja2's filters and `filters`, each bounded."""
        super().__init__(finalize=self._written, **options)
        self.filters = {name: _bounded(name, function) for name, function in {**self.filters, **filters}.items()}

    def _written(self, value: Any) -> Any:
        """A `{{ value }}` about to be written as text."""
        return _holds("a value to write", value, "holds")

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "**" and isinstance(right, int) and abs(right) > MAX_POWER:
            raise SecurityError(f"the power {right} is too large")
        if operator == "+":
            _holds("adding two values", (left, right))
        elif operator in ("*", "%") and not all(isinstance(side, (int, float)) for side in (left, right)):
            _check(f"the operator {operator}", [left, right])  # a repeat, a format; not arithmetic
        return super().call_binop(context, operator, left, right)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        """A call, measured; named as jinja2 names it, so that any keyword passes through."""
        step = f"the call {_name(__obj)}"
        if not isinstance(__obj, Macro):  # a macro builds with these same steps
            owner = getattr(inspect.unwrap(__obj), "__self__", None)  # the string of `'x'.center`
            args, kwargs = _inputs(step, (owner, *args), kwargs)
            args = args[1:]
        return _holds(step, super().call(__context, __obj, *args, **kwargs), "built")

    def written(self) -> _Written:
        """Where a block's text is collected, as jinja2's generated code asks for it."""
        return _Written()

    def joined(self, context: Any, parts: tuple) -> str:
        """`a ~ b ~ ...` as jinja2 joins it, once its parts are known to fit."""
        _holds("joining with ~", parts)
        return (markup_join if context.eval_ctx.autoescape else str_join)(parts)

    def concat(self, pieces: Any) -> str:  # type: ignore[override]  # jinja2's `"".join`, bounded
        """The text a block or the whole template renders, refused once past MAX_VALUE."""
        return "".join(_within(pieces, len, f"the template renders more than {MAX_VALUE:,} characters"))
