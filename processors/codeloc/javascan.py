"""One Java source file read for the locator: its methods (the SQL strings they hold, what they call), and the
routes Spring (``@RequestMapping`` / ``@GetMapping`` ... on the class and the method) or JAX-RS (``@Path`` with
``@GET`` ...) declare for them.

Java is not parsed here, only tokenised: comments dropped, string literals (and text blocks) kept whole, and the
braces followed to tell a class body from a method body. That is enough for what the locator asks (which method
holds this SQL text, which method serves this route); a method is found as ``name(...) [throws ...] {`` directly in
a class body, so lambdas and anonymous classes fold into the method that holds them.
"""

from __future__ import annotations

import re
from typing import Final

from processors.codeloc.scan import FunctionScan, ModuleScan, RouteScan, is_sql

_TOKEN: Final = re.compile(
    r'(?P<text>"""[\s\S]*?""")|(?P<str>"(?:\\.|[^"\\\n])*")|(?P<chr>\'(?:\\.|[^\'\\\n])*\')'
    r"|(?P<comment>//[^\n]*|/\*[\s\S]*?\*/)|(?P<id>[A-Za-z_$][\w$]*)|(?P<nl>\n)|(?P<p>[{}();@=,.+])"
)
_TYPES: Final = frozenset({"class", "interface", "enum", "record"})
_SPRING: Final = {"GetMapping": "GET", "PostMapping": "POST", "PutMapping": "PUT", "DeleteMapping": "DELETE",
                  "PatchMapping": "PATCH", "RequestMapping": ""}  # fmt: skip
_JAXRS: Final = frozenset({"GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS"})
_NOT_METHODS: Final = frozenset({"if", "for", "while", "switch", "catch", "synchronized", "return", "new", "try"})

Token = tuple[str, str, int]  # (kind, text, line)


def _tokens(source: str) -> list[Token]:
    out: list[Token] = []
    line = 1
    for m in _TOKEN.finditer(source):
        kind, text = m.lastgroup or "", m.group()
        if kind == "nl":
            line += 1
            continue
        if kind in ("text", "str"):
            body = text[3:-3] if kind == "text" else text[1:-1]
            out.append(("str", body.replace('\\"', '"').replace("\\n", "\n"), line))
        elif kind in ("id", "p"):
            out.append((kind, text, line))
        line += text.count("\n")
    return out


def _annotation(tokens: list[Token], i: int) -> tuple[str, list[Token], int]:
    """The annotation at ``tokens[i]`` (the token after ``@``): its name, its argument tokens, the index after it."""
    name = tokens[i][1]
    j = i + 1
    while j + 1 < len(tokens) and tokens[j][1] == "." and tokens[j + 1][0] == "id":  # @org.x.GetMapping
        name, j = tokens[j + 1][1], j + 2
    args: list[Token] = []
    if j < len(tokens) and tokens[j][1] == "(":
        depth, j = 1, j + 1
        while j < len(tokens) and depth:
            depth += {"(": 1, ")": -1}.get(tokens[j][1], 0) if tokens[j][0] == "p" else 0
            if depth:
                args.append(tokens[j])
            j += 1
    return name, args, j


def _route(annotations: list[tuple[str, list[Token]]]) -> tuple[str, frozenset[str]] | None:
    """(path, methods) a method's or class's annotations declare, None when they declare none."""
    path: str | None = None
    methods: set[str] = set()
    for name, args in annotations:
        strings = [t[1] for t in args if t[0] == "str"]
        if name in _SPRING:
            path = strings[0] if strings else ""
            methods |= {_SPRING[name]} - {""}
            methods |= {t[1] for t in args if t[0] == "id" and t[1] in _JAXRS}  # method = RequestMethod.POST
        elif name == "Path":
            path = strings[0] if strings else ""
        elif name in _JAXRS:
            methods.add(name)
    if path is None:
        return None
    return path, frozenset(methods)


def scan_java(source: str) -> tuple[str, ModuleScan]:
    """(package, scan) of one Java source file."""
    tokens = _tokens(source)
    out = ModuleScan()
    package = ""
    stack: list[tuple[str, str]] = []  # ("class", name) | ("method", "") | ("block", "") per open brace
    pending: list[tuple[str, list[Token]]] = []  # annotations since the last declaration
    current: FunctionScan | None = None
    consts: dict[str, str] = {}  # the class's String constants
    i = 0
    while i < len(tokens):
        kind, text, line = tokens[i]
        in_class = bool(stack) and stack[-1][0] == "class"
        if kind == "id" and text == "package" and not stack:
            j = i + 1
            while j < len(tokens) and tokens[j][1] != ";":
                j += 1
            package = "".join(t[1] for t in tokens[i + 1 : j])
            i = j
        elif kind == "p" and text == "@" and i + 1 < len(tokens) and tokens[i + 1][0] == "id":
            name, args, i = _annotation(tokens, i + 1)
            if current is None:
                pending.append((name, args))
            continue
        elif kind == "id" and text in _TYPES and i + 1 < len(tokens) and tokens[i + 1][0] == "id" and current is None:
            name = tokens[i + 1][1]
            owner = ".".join(n for k, n in stack if k == "class")
            qual = f"{owner}.{name}" if owner else name
            declared = _route(pending)
            if declared is not None:
                out.built[qual] = declared[0]
            out.classes.add(name)
            pending = []
            while i < len(tokens) and tokens[i][1] != "{":
                i += 1
            stack.append(("class", qual))
        elif in_class and kind == "id" and text not in _NOT_METHODS and i + 1 < len(tokens) and tokens[i + 1][1] == "(":
            j, depth = i + 2, 1
            while j < len(tokens) and depth:
                if tokens[j][0] == "p" and tokens[j][1] in "()":
                    depth += 1 if tokens[j][1] == "(" else -1
                j += 1
            while j < len(tokens) and (tokens[j][0] == "id" or tokens[j][1] in (",", ".")):
                j += 1  # throws A, B
            if j < len(tokens) and tokens[j][1] == "{":
                owner = stack[-1][1]
                current = FunctionScan(f"{owner}.{text}", line, line)
                out.functions.append(current)
                declared = _route(pending)
                if declared is not None:
                    out.routes.append(RouteScan(owner, declared[0], declared[1], current.qualname))
                stack.append(("method", ""))
                i = j + 1
                pending = []
                continue
            pending = []
            i = j
            continue
        elif kind == "p" and text == "{":
            stack.append(("block", ""))
        elif kind == "p" and text == "}":
            if stack:
                closed = stack.pop()
                if closed[0] == "method" and current is not None:
                    current.end_line = line
                    current = None
        elif kind == "p" and text == ";" and in_class:
            pending = []
        elif in_class and kind == "p" and text == "=" and i + 1 < len(tokens) and tokens[i + 1][0] == "str":
            consts[tokens[i - 1][1]] = _joined(tokens, i + 1)  # static final String READ = "SELECT ..." + "...";
        elif current is not None:
            _body_token(current, tokens, i, consts)
        i += 1
    return package, out


def _joined(tokens: list[Token], i: int) -> str:
    """The string literal at ``tokens[i]`` and the literals ``+``-ed to it."""
    joined, j = tokens[i][1], i
    while j + 2 < len(tokens) and tokens[j + 1][1] == "+" and tokens[j + 2][0] == "str":
        joined += tokens[j + 2][1]
        j += 2
    return joined


def _body_token(fn: FunctionScan, tokens: list[Token], i: int, consts: dict[str, str]) -> None:
    kind, text, line = tokens[i]
    if kind == "id":
        fn.names.add(text)
        if i + 1 < len(tokens) and tokens[i + 1][1] == "(":
            fn.calls.add(text)
        elif text in consts and is_sql(consts[text]):
            fn.sql.append((consts[text], line))
    elif kind == "str":
        for candidate in {text, _joined(tokens, i)}:
            if is_sql(candidate):
                fn.sql.append((candidate, line))
