"""The code shape of a recorded function, read statically (:mod:`ast`): how a repro can call it, or why it cannot.

A recorded ``code.function.name`` ends with the function's qualified name in its module: ``charge`` (a module-level
function) or ``Ledger.post`` (a method). Each shape is told apart here, nothing of the service is imported:

- a module-level ``def`` or ``async def`` (a coroutine function: the generated test runs it with ``asyncio.run`` in
  the session's thread), undecorated;
- a method of a module-level class: ``@staticmethod`` and ``@classmethod`` ones are called on the class; a plain
  method on an instance the test builds, which needs a constructor it can call: none of its own and no base class
  (``Class()``), an ``__init__`` whose parameters all have defaults (``Class()``), or one whose only required
  parameter is the connection (``Class(conn)``: the method then takes no connection of its own);
- a Flask view (one ``@app.route``/``@bp.post(rule)`` on a module-level ``Flask``/``Blueprint``) whose parameters
  are all the rule's variables and which reads no request body: requested through ``app.test_client()`` (the
  decorators, hooks and error handlers run as in production) on the app a module-level factory (``create_app``,
  ...) builds from the engine or the DSN of the scratch database; the rule's variables take recorded values by name;
- any other route handler (a Flask view reading its body or without a factory, FastAPI's ``@router.get``, a Django
  view, whose first parameter or whose wrapper's is the ``request``): not called directly (the decorators must run),
  and not through FastAPI's or Django's test client yet: the reason names the route, where its arguments would come
  from (the recorded URL's path parameters), and what the telemetry does not carry (a request body the view reads,
  a session FastAPI's ``Depends`` injects);
- any other decorator: its wrapper's signature is not known statically.

A function whose module imports ``asyncpg`` talks to PostgreSQL through a driver the application-level gate does not
patch (it patches psycopg 3's cursor, which SQLAlchemy's psycopg dialect and Django's backend also go through): its
statements could not be scheduled, so it is refused with that reason.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

MAX_SOURCE: Final = 2_000_000  # bytes of a source file parsed to find a function
_ROUTES: Final = frozenset({"route", "get", "post", "put", "patch", "delete", "api_route", "websocket"})
_CONNECTION: Final = frozenset({"conn", "connection", "db", "session", "cursor", "cur"})
_FACTORIES: Final = frozenset({"create_app", "make_app", "app_factory", "build_app"})
_FACTORY_TAKES: Final = {"engine": "engine", "dsn": "dsn", "conninfo": "dsn", "database_url": "dsn"}
_BODY: Final = frozenset({"get_json", "json", "form", "data", "body", "POST", "values"})


class Underivable(Exception):
    """Why one function has no derived spec."""


@dataclass(frozen=True, slots=True)
class Callee:
    """A recorded function as the repro calls it: ``qualname`` in its module, its ``def``, the parameters that take
    recorded values (the connection excluded), and how it is reached."""

    qualname: str
    fn: ast.FunctionDef | ast.AsyncFunctionDef
    params: list[ast.arg]  # positional parameters after the connection (and ``self``/``cls``)
    connection: str  # the name of the parameter (or constructor parameter) that receives the connection
    receiver: str = ""  # "" | "new" (``Class()``) | "connection" (``Class(conn)``)
    coroutine: bool = False
    positional_only: int = 0  # how many of ``params`` are positional-only
    route: tuple[str, str, str, str] | None = None  # Flask: (method, rule, app factory, what it takes)


def parse(path: Path) -> ast.Module:
    """The module's syntax tree."""
    try:
        if path.stat().st_size > MAX_SOURCE:
            raise Underivable(f"{path} is larger than {MAX_SOURCE} bytes")
        return ast.parse(path.read_bytes(), filename=str(path))
    except (OSError, SyntaxError, ValueError) as exc:
        raise Underivable(f"{path} cannot be parsed: {exc}") from None


def callee(tree: ast.Module, recorded: str, file_name: str) -> Callee:
    """The shape of ``recorded`` (a dotted name ending with the qualified name) in ``tree``."""
    if _imports(tree, "asyncpg"):
        raise Underivable(f"{file_name} uses asyncpg: the application-level repro schedules psycopg 3 statements "
                          "only (its cursor is what it patches); the SQL-level repro replays them")  # fmt: skip
    parts = recorded.split(".")
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    if len(parts) >= 2 and parts[-2] in classes:
        return _method(classes[parts[-2]], parts[-1], tree, file_name)
    name = parts[-1]
    found = [n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == name]
    if not found:
        raise Underivable(f"no module-level function {name}() in {file_name}")
    fn = found[-1]  # the binding that wins at import
    if fn.decorator_list:
        routed = _flask_route(fn, tree)
        if routed is None:
            raise Underivable(_decorated(fn, tree))
        return routed
    positional = [*fn.args.posonlyargs, *fn.args.args]
    if positional and positional[0].arg == "request":
        raise Underivable(_view(fn, tree, "a Django view (its first parameter is the request)"))
    if not positional:
        raise Underivable(f"{name}() takes no connection as its first parameter")
    return Callee(name, fn, positional[1:], positional[0].arg, coroutine=isinstance(fn, ast.AsyncFunctionDef),
                  positional_only=max(len(fn.args.posonlyargs) - 1, 0))  # fmt: skip


def _method(cls: ast.ClassDef, name: str, tree: ast.Module, file_name: str) -> Callee:
    qualname = f"{cls.name}.{name}"
    found = [n for n in cls.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == name]
    if not found:
        raise Underivable(f"no method {qualname}() in {file_name}")
    fn = found[-1]
    coroutine = isinstance(fn, ast.AsyncFunctionDef)
    decorators = [_name(d) for d in fn.decorator_list]
    if any(d not in ("staticmethod", "classmethod") for d in decorators) or len(decorators) > 1:
        raise Underivable(_decorated(fn, tree, qualname))
    positional = [*fn.args.posonlyargs, *fn.args.args]
    skip = 0 if decorators == ["staticmethod"] else 1  # self / cls
    if decorators or (len(positional) > skip and positional[skip].arg in _CONNECTION):
        if len(positional) <= skip:
            raise Underivable(f"{qualname}() takes no connection as its first parameter")
        receiver = "" if decorators else _constructor(cls, qualname)
        return Callee(qualname, fn, positional[skip + 1 :], positional[skip].arg, receiver, coroutine,
                      max(len(fn.args.posonlyargs) - skip - 1, 0))  # fmt: skip
    connection = _constructor_connection(cls, qualname)
    return Callee(qualname, fn, positional[skip:], connection, "connection", coroutine,
                  max(len(fn.args.posonlyargs) - skip, 0))  # fmt: skip


def _init(cls: ast.ClassDef) -> ast.FunctionDef | None:
    found = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"]
    return found[-1] if found else None


def _constructor(cls: ast.ClassDef, qualname: str) -> str:
    """ "new" when ``Class()`` builds an instance, else Underivable."""
    init = _init(cls)
    if init is None:
        if cls.bases or cls.keywords or cls.decorator_list:
            raise Underivable(f"{qualname}(): {cls.name} has a base class or decorator and no __init__ of its own: "
                              "how to build an instance is not known statically")  # fmt: skip
        return "new"
    params = [*init.args.posonlyargs, *init.args.args][1:]
    required = params[: len(params) - len(init.args.defaults)]
    kw_required = [a.arg for a, d in zip(init.args.kwonlyargs, init.args.kw_defaults, strict=True) if d is None]
    if not required and not kw_required:
        return "new"
    raise Underivable(f"{qualname}(): {cls.name}() needs {', '.join([a.arg for a in required] + kw_required)}: an "
                      "instance can be built with no arguments or with the connection only")  # fmt: skip


def _constructor_connection(cls: ast.ClassDef, qualname: str) -> str:
    """The ``__init__`` parameter that takes the connection, when it is the constructor's only required one."""
    init = _init(cls)
    if init is not None:
        params = [*init.args.posonlyargs, *init.args.args][1:]
        required = params[: len(params) - len(init.args.defaults)]
        keyword_only = any(d is None for d in init.args.kw_defaults)
        if len(required) == 1 and not keyword_only and required[0].arg in _CONNECTION:
            return required[0].arg
    raise Underivable(f"{qualname}(): neither its first parameter nor {cls.name}()'s only required one is a "
                      f"connection ({', '.join(sorted(_CONNECTION))})")  # fmt: skip


def _name(node: ast.expr) -> str:
    """``a.b.c`` of a decorator (its call's function when it is called)."""
    if isinstance(node, ast.Call):
        return _name(node.func)
    if isinstance(node, ast.Attribute):
        return f"{_name(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else ast.unparse(node)


def _decorated(fn: ast.FunctionDef | ast.AsyncFunctionDef, tree: ast.Module, qualname: str = "") -> str:
    qualname = qualname or fn.name
    wrappers = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    for d in fn.decorator_list:
        if isinstance(d, ast.Call) and _name(d).rsplit(".", 1)[-1] in _ROUTES:
            rule = d.args[0].value if d.args and isinstance(d.args[0], ast.Constant) else ""
            return _view(fn, tree, f"a route handler (@{_name(d)}({ast.unparse(d.args[0]) if d.args else ''}))",
                         qualname, str(rule))  # fmt: skip
        wrapper = wrappers.get(_name(d))
        inner = [n for n in ast.walk(wrapper) if isinstance(n, ast.FunctionDef) and n is not wrapper] if wrapper else []
        if any(a.arg == "request" for n in inner for a in n.args.args):  # a view wrapper (Django's shape)
            return _view(fn, tree, f"wrapped by @{_name(d)} into a view taking the request", qualname,
                         wrapped=True, body=_reads_body(wrapper, tree))  # fmt: skip
    return (
        f"{qualname}() is decorated (@{_name(fn.decorator_list[0])}): its wrapper's signature is not known statically"
    )


def _flask_route(fn: ast.FunctionDef | ast.AsyncFunctionDef, tree: ast.Module) -> Callee | None:
    """A Flask view the test can request through ``app.test_client()``: one ``@<Blueprint or Flask>.<method>(rule)``,
    every parameter a variable of the rule, no body read, and a module-level app factory taking the engine or the
    DSN (the test points it at the scratch database); None when it is not one (Underivable without a factory)."""
    apps = {t.id for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
            and _name(n.value).rsplit(".", 1)[-1] in ("Blueprint", "Flask") for t in n.targets
            if isinstance(t, ast.Name)}  # fmt: skip
    [d] = fn.decorator_list if len(fn.decorator_list) == 1 else [None]
    if not isinstance(d, ast.Call) or not isinstance(d.func, ast.Attribute) or _name(d.func.value) not in apps:
        return None
    verb, rule = d.func.attr, d.args[0].value if d.args and isinstance(d.args[0], ast.Constant) else None
    methods = [k.value for k in d.keywords if k.arg == "methods"]
    listed = methods[0].elts if methods and isinstance(methods[0], ast.List | ast.Tuple) else []
    method = (
        verb if verb != "route" else str(listed[0].value) if listed and isinstance(listed[0], ast.Constant) else "get"
    )
    params = [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]
    variables = set(re.findall(r"<(?:[^:<>]+:)?([^<>]+)>", rule)) if isinstance(rule, str) else set()
    if verb not in _ROUTES - {"api_route", "websocket"} or not isinstance(rule, str) or _reads_body(fn, tree) \
            or any(a.arg not in variables for a in params) or isinstance(fn, ast.AsyncFunctionDef):  # fmt: skip
        return None
    for factory in (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in _FACTORIES):
        args = [*factory.args.posonlyargs, *factory.args.args]
        if args and args[0].arg in _FACTORY_TAKES:
            return Callee(fn.name, fn, params, "", route=(method.upper(), rule, factory.name,
                                                          _FACTORY_TAKES[args[0].arg]))  # fmt: skip
    raise Underivable(f"{fn.name}() is a Flask view (@{_name(d)}({rule!r})): no app factory in its module "
                      f"({', '.join(sorted(_FACTORIES))}) takes the engine or the DSN first, so the test cannot point "
                      "the app at the scratch database")  # fmt: skip


def _injected(param: ast.arg, default: ast.expr | None, aliases: dict[str, ast.expr]) -> str:
    """``name = Depends(...)`` when the parameter is injected (its default, or its ``Annotated`` type, directly or
    through a module-level alias), else ""."""
    for node in (default, param.annotation, aliases.get(_name(param.annotation)) if param.annotation else None):
        found = [n for n in ast.walk(node) if isinstance(n, ast.Call) and _name(n).endswith("Depends")] if node else []
        if found:
            return f"{param.arg} = {ast.unparse(found[0])}"
    return ""


def _view(fn: ast.FunctionDef | ast.AsyncFunctionDef, tree: ast.Module, what: str, qualname: str = "",
          rule: str = "", *, wrapped: bool = False, body: bool = False) -> str:  # fmt: skip
    """Why a web view is not called, and what a call through the framework's test client would still miss: the
    rule's variables from the recorded URL, the injected dependencies pointed at the scratch database, and the
    arguments that come from the request body (a parameter not in the rule, a body the view reads)."""
    aliases = {t.id: n.value for n in tree.body if isinstance(n, ast.Assign) for t in n.targets
               if isinstance(t, ast.Name)}  # fmt: skip
    positional = [*fn.args.posonlyargs, *fn.args.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(fn.args.defaults))
    pairs = zip([*positional, *fn.args.kwonlyargs], [*defaults, *fn.args.defaults, *fn.args.kw_defaults], strict=True)
    injected: list[str] = []
    path: list[str] = []
    other: list[str] = []
    for param, default in pairs:
        if param.arg == "request":
            continue
        if dependency := _injected(param, default, aliases):
            injected.append(dependency)
        elif (not rule and not (wrapped and path)) or f"{param.arg}}}" in rule or f"{param.arg}>" in rule:
            path.append(param.arg)  # (a wrapped view's first argument is its URL's key, the rest its body's)
        else:
            other.append(param.arg)
    missing = []
    if path:
        missing.append(f"{', '.join(path)} from the recorded URL's path parameters (url.path against http.route)")
    if injected:
        missing.append(f"the injected {', '.join(injected)} pointed at the scratch database")
    if other:
        missing.append(f"{', '.join(other)} from the request body, which the telemetry does not carry")
    elif body or _reads_body(fn, tree):
        missing.append("the request body it reads, which the telemetry does not carry")
    if other or body or _reads_body(fn, tree):
        missing[-1] += " (record it on the request's span, or write a call spec: [repro] call_specs)"
    return (f"{qualname or fn.name}() is {what}: it runs behind the framework (its decorators, middleware and "
            f"dependencies), so it is not called directly, and calls through the framework's test client are not "
            f"derived; such a call needs {'; '.join(missing) or 'no argument'}")  # fmt: skip


def _reads_body(fn: ast.FunctionDef | ast.AsyncFunctionDef | None, tree: ast.Module) -> bool:
    """Whether the view (or a module-level helper it calls) reads ``request.<body>``."""
    helpers = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    seen: set[str] = set()
    todo: list[ast.AST] = [fn] if fn is not None else []
    while todo:
        for node in ast.walk(todo.pop()):
            if isinstance(node, ast.Attribute) and node.attr in _BODY and _name(node.value) == "request":
                return True
            called = node.func.id if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) else ""
            if called in helpers and called not in seen:
                seen.add(called)
                todo.append(helpers[called])
    return False


def _imports(tree: ast.Module, module: str) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == module for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == module:
            return True
    return False


__all__ = ["MAX_SOURCE", "Callee", "Underivable", "callee", "parse"]
