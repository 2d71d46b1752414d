"""The repaired code emits the proof contract's must-start event, so production can show the fix running.

The proof judge counts a must-start event when a log record carries it as ``event.name`` or when a *span is named
after it* (:mod:`processors.connectors.proofs.judge`); span events are not counted. The services trace-repro watches
export spans already (it reads them), and not necessarily logs, so the repair emits a span: one line added after the
repaired statement of the repaired function,

    opentelemetry.trace.get_tracer("trace_repro").start_span("<event>").end()

a zero-length child of the request's span, named after the event (``import opentelemetry.trace`` is added to the
module when missing; the fully qualified name cannot collide with the module's own names). It is added with libcst,
so the file keeps its formatting; the *repaired statement* is the first statement of the function that the repair
changed (the lines of ``before`` and ``after`` compared), or the function's first statement when the repair changed
none of its own (a decorator, a migration). A function that already emits the event is left as it is, so applying
this twice changes nothing.
"""

from __future__ import annotations

import difflib

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor
from libcst.metadata import MetadataWrapper, PositionProvider

from processors.model.contract import EVENT_NAME, promised_event

TRACER = "trace_repro"


class EmitError(ValueError):
    """The event cannot be emitted in this source (no such function, an unsafe event name, unparsable code)."""


def emit_line(event: str) -> str:
    """The statement that emits ``event`` (see the module docstring)."""
    return f'opentelemetry.trace.get_tracer("{TRACER}").start_span("{event}").end()'


def _changed_lines(before: str | None, after: str) -> set[int]:
    """1-based line numbers of ``after`` that are not in ``before`` (every line when there is no ``before``)."""
    new = after.splitlines()
    if before is None:
        return set(range(1, len(new) + 1))
    changed: set[int] = set()
    matcher = difflib.SequenceMatcher(a=before.splitlines(), b=new, autojunk=False)
    for tag, _i1, _i2, j1, j2 in matcher.get_opcodes():
        if tag in ("replace", "insert"):
            changed.update(range(j1 + 1, j2 + 1))
    return changed


class _Finder(cst.CSTVisitor):
    """The function named by the dotted ``path`` (``Class.method``, ``function``; the last part is enough)."""

    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, name: str) -> None:
        self.name = name
        self.stack: list[str] = []
        self.found: cst.FunctionDef | None = None

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.stack.append(node.name.value)

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self.stack.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        qualified = ".".join([*self.stack, node.name.value])
        if self.found is None and (qualified == self.name or qualified.endswith("." + self.name)
                                   or node.name.value == self.name.rsplit(".", 1)[-1]):  # fmt: skip
            self.found = node
        self.stack.append(node.name.value)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self.stack.pop()


class _Inserter(cst.CSTTransformer):
    """Adds the emit line just after ``target`` (a simple statement line), or just before it with ``before``."""

    def __init__(self, target: cst.CSTNode, line: cst.SimpleStatementLine, *, before: bool) -> None:
        self.target = target
        self.line = line
        self.at = 0 if before else 1

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock
                            ) -> cst.IndentedBlock:  # fmt: skip
        for i, stmt in enumerate(original_node.body):
            if stmt is self.target:
                body = list(updated_node.body)
                return updated_node.with_changes(body=[*body[: i + self.at], self.line, *body[i + self.at :]])
        return updated_node


def _statements(function: cst.FunctionDef) -> list[cst.SimpleStatementLine]:
    found: list[cst.SimpleStatementLine] = []

    class _Walk(cst.CSTVisitor):
        def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> bool:
            found.append(node)
            return False

        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return node is function  # not into nested functions

        def visit_ClassDef(self, node: cst.ClassDef) -> bool:
            return False

    function.visit(_Walk())
    return found


def _is_docstring(stmt: cst.SimpleStatementLine) -> bool:
    first = stmt.body[0]
    strings = cst.SimpleString | cst.ConcatenatedString
    return len(stmt.body) == 1 and isinstance(first, cst.Expr) and isinstance(first.value, strings)


def emit_after_repair(after: str, function: str, event: str, *, before: str | None = None) -> str:
    """``after`` (a repaired module's source) with ``function`` emitting ``event`` after its repaired statement;
    ``before`` is the module before the repair. Raises :class:`EmitError` when it cannot be done."""
    if not EVENT_NAME.match(event):
        raise EmitError(f"not an event name this can emit safely: {event!r}")
    try:
        module = cst.parse_module(after)
    except cst.ParserSyntaxError as exc:
        raise EmitError(f"the repaired source does not parse: {exc}") from exc
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    finder = _Finder(function)
    wrapper.visit(finder)
    if finder.found is None:
        raise EmitError(f"no function {function!r} in the repaired source")
    line = emit_line(event)
    if line in module.code_for_node(finder.found):
        return after  # emitted already
    positions = wrapper.resolve(PositionProvider)
    changed = _changed_lines(before, after)
    statements = [s for s in _statements(finder.found) if not _is_docstring(s)]
    if not statements:
        raise EmitError(f"{function!r} has no statement to emit after")
    target = next((s for s in statements if positions[s].start.line in changed), None)
    emit = cst.parse_statement(line + "\n")
    assert isinstance(emit, cst.SimpleStatementLine)
    # After the repaired statement; before it when nothing runs after it (return, raise), and first thing in the
    # function when the repair changed none of its statements.
    before_it = target is None or isinstance(target.body[0], cst.Return | cst.Raise | cst.Continue | cst.Break)
    updated = module.visit(_Inserter(target or statements[0], emit, before=before_it))
    context = CodemodContext()
    AddImportsVisitor.add_needed_import(context, "opentelemetry.trace")
    return str(AddImportsVisitor(context).transform_module(updated).code)


__all__ = ["EVENT_NAME", "TRACER", "EmitError", "emit_after_repair", "emit_line", "promised_event"]
