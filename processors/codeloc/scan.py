"""One Python module read with libcst: its functions (what they call, the SQL they pass, the names they use), its
ORM models, its routes (Flask / FastAPI decorators, Django ``urlpatterns``) and its imports.

Nothing is executed or imported: a decorator is recognised by its shape (``@<router>.route(path, methods=[...])``,
``@<router>.get(path)``, ``@<router>.api_route(...)``), a router's prefix by its constructor (``Blueprint(...,
url_prefix=)``, ``APIRouter(prefix=)``) or where it is mounted (``register_blueprint(bp, url_prefix=)``,
``include_router(router, prefix=)``), a Django view by ``path()`` / ``re_path()`` entries of ``urlpatterns``
(``include("app.urls")`` mounts another module's). SQL is every string a function passes that reads as a
statement: a literal, a module constant, or a ``+`` of those (a conditional gives both branches' texts).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

_VERBS = frozenset({"get", "post", "put", "patch", "delete", "head", "options"})
_SQL_START = ("select", "insert", "update", "delete", "with")


@dataclass(slots=True)
class FunctionScan:
    """A ``def`` (a method: ``Class.name``), its nested defs folded in."""

    qualname: str  # within the module
    line: int
    end_line: int
    calls: set[str] = field(default_factory=set)  # called names (a.b.c() -> "c")
    names: set[str] = field(default_factory=set)  # identifiers and attribute names it uses
    assigned: set[str] = field(default_factory=set)  # attribute names it assigns (row.balance = ...)
    sql: list[tuple[str, int]] = field(default_factory=list)  # (statement text, line)


@dataclass(frozen=True, slots=True)
class RouteScan:
    """A route as declared: ``router`` is the decorator's object (its prefixes are applied by the index)."""

    router: str
    path: str
    methods: frozenset[str]  # upper case; empty = any
    handler: str  # qualname within the module, or a dotted reference to resolve (Django views)
    include: str = ""  # Django include("module"): routes of that module mounted under ``path``


@dataclass(slots=True)
class ModuleScan:
    functions: list[FunctionScan] = field(default_factory=list)
    routes: list[RouteScan] = field(default_factory=list)
    models: dict[str, str] = field(default_factory=dict)  # class name -> table (__tablename__ / Meta.db_table)
    classes: set[str] = field(default_factory=set)
    built: dict[str, str] = field(default_factory=dict)  # router variable -> the prefix it was built with
    mounts: list[tuple[str, str]] = field(default_factory=list)  # (router variable, prefix it is mounted under)
    imports: dict[str, str] = field(default_factory=dict)  # local name -> dotted target ("." relative kept)


def _text(node: cst.BaseExpression | None, consts: dict[str, list[str]]) -> list[str]:
    """The strings an expression stands for (literal, constant, ``+`` of those, either branch of ``a if c else b``)."""
    if isinstance(node, cst.SimpleString):
        value = node.evaluated_value
        return [value] if isinstance(value, str) else []
    if isinstance(node, cst.ConcatenatedString):
        joined = node.evaluated_value
        return [joined] if isinstance(joined, str) else []
    if isinstance(node, cst.Name):
        return consts.get(node.value, [])
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Add):
        left, right = _text(node.left, consts), _text(node.right, consts)
        return [a + b for a in left for b in right][:8]
    if isinstance(node, cst.IfExp):
        return (_text(node.body, consts) + _text(node.orelse, consts))[:8]
    if isinstance(node, cst.Call) and node.args and _name(node.func).rsplit(".", 1)[-1] == "text":
        return _text(node.args[0].value, consts)  # sqlalchemy.text("...")
    return []


def _name(node: cst.BaseExpression) -> str:
    """Dotted name of a Name / Attribute chain ("" for anything else)."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = _name(node.value)
        return f"{base}.{node.attr.value}" if base else ""
    return ""


def _kwarg(call: cst.Call, name: str) -> cst.BaseExpression | None:
    return next((a.value for a in call.args if a.keyword is not None and a.keyword.value == name), None)


def _methods(node: cst.BaseExpression | None) -> frozenset[str]:
    if isinstance(node, cst.List | cst.Tuple | cst.Set):
        return frozenset(v.upper() for e in node.elements for v in _text(e.value, {}) if isinstance(e, cst.Element))
    return frozenset()


def is_sql(text: str) -> bool:
    return text.lstrip(" \t\r\n(").lower().startswith(_SQL_START)


class _Scanner(cst.CSTVisitor):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, package: str) -> None:
        self.out = ModuleScan()
        self.package = package
        self.consts: dict[str, list[str]] = {}
        self._classes: list[str] = []
        self._functions: list[FunctionScan] = []

    def _line(self, node: cst.CSTNode) -> int:
        return int(self.get_metadata(PositionProvider, node).start.line)

    # -- module level ------------------------------------------------------------------------------------------
    def visit_Assign(self, node: cst.Assign) -> None:
        if self._functions:
            return
        for target in node.targets:
            name = target.target.value if isinstance(target.target, cst.Name) else ""
            if not name:
                continue
            if self._classes and name == "__tablename__":
                for table in _text(node.value, {}):
                    self.out.models[self._classes[-1]] = table
            elif self._classes and name == "db_table" and len(self._classes) > 1 and self._classes[-1] == "Meta":
                for table in _text(node.value, {}):
                    self.out.models[self._classes[-2]] = table
            elif not self._classes:
                values = _text(node.value, self.consts)
                if values:
                    self.consts[name] = values
                if isinstance(node.value, cst.Call):
                    prefix = _kwarg(node.value, "url_prefix") or _kwarg(node.value, "prefix")
                    for p in _text(prefix, self.consts):
                        self.out.built[name] = p
                if name == "urlpatterns":
                    self._urlpatterns(node.value)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        if not self._functions and isinstance(node.target, cst.Name) and node.target.value == "urlpatterns":
            self._urlpatterns(node.value)

    def _urlpatterns(self, value: cst.BaseExpression) -> None:
        if not isinstance(value, cst.List | cst.Tuple):
            return
        for element in value.elements:
            call = element.value
            if not isinstance(call, cst.Call) or _name(call.func).rsplit(".", 1)[-1] not in ("path", "re_path", "url"):
                continue
            if len(call.args) < 2:
                continue
            paths, view = _text(call.args[0].value, self.consts), call.args[1].value
            if not paths:
                continue
            if isinstance(view, cst.Call) and _name(view.func).rsplit(".", 1)[-1] == "include":
                for target in _text(view.args[0].value, {}) if view.args else []:
                    self.out.routes.append(RouteScan("", paths[0], frozenset(), "", include=target))
                continue
            if (
                isinstance(view, cst.Call)
                and isinstance(view.func, cst.Attribute)
                and view.func.attr.value == "as_view"
            ):
                view = view.func.value  # a class-based view: its methods by HTTP verb
            ref = _name(view)
            if ref:
                self.out.routes.append(RouteScan("", paths[0], frozenset(), ref))

    def visit_Expr(self, node: cst.Expr) -> None:
        call = node.value
        if self._functions or not isinstance(call, cst.Call) or not isinstance(call.func, cst.Attribute):
            return
        if call.func.attr.value in ("register_blueprint", "include_router") and call.args:
            router = _name(call.args[0].value).rsplit(".", 1)[-1]
            prefix = _kwarg(call, "url_prefix") or _kwarg(call, "prefix")
            for p in _text(prefix, self.consts):
                self.out.mounts.append((router, p))
        elif call.func.attr.value in ("add_url_rule", "add_api_route") and call.args:
            self._url_rule(call)

    def _url_rule(self, call: cst.Call) -> None:
        """``app.add_url_rule(path, view_func=View.as_view(...), methods=[...])`` (Flask) and
        ``router.add_api_route(path, endpoint, methods=[...])`` (FastAPI)."""
        assert isinstance(call.func, cst.Attribute)
        paths = _text(call.args[0].value, self.consts)
        positional = [a.value for a in call.args if a.keyword is None]
        view = _kwarg(call, "view_func") or _kwarg(call, "endpoint")
        if view is None and call.func.attr.value == "add_api_route" and len(positional) > 1:
            view = positional[1]
        if view is None and len(positional) > 2:
            view = positional[2]  # add_url_rule(rule, endpoint, view_func)
        if isinstance(view, cst.Call) and isinstance(view.func, cst.Attribute) and view.func.attr.value == "as_view":
            view = view.func.value
        ref = _name(view) if view is not None else ""
        if paths and ref:
            methods = _methods(_kwarg(call, "methods"))
            self.out.routes.append(RouteScan(_name(call.func.value), paths[0], methods, ref))

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if isinstance(node.names, cst.ImportStar):
            return
        dots = "." * len(node.relative)
        base = dots + (_name(node.module) if node.module is not None else "")
        for alias in node.names:
            target = _name(alias.name)
            local = alias.evaluated_alias or target
            joined = f"{base}.{target}" if base and not base.endswith(".") else base + target
            self.out.imports[local] = joined

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            target = _name(alias.name)
            self.out.imports[alias.evaluated_alias or target.split(".")[0]] = (
                target if alias.asname else target.split(".")[0]
            )

    # -- classes and functions ---------------------------------------------------------------------------------
    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._classes.append(node.name.value)
        if len(self._classes) == 1 and not self._functions:
            self.out.classes.add(node.name.value)

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self._classes.pop()

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        if self._functions:  # a nested def belongs to its enclosing function
            self._functions.append(self._functions[-1])
            return
        qualname = ".".join([*self._classes, node.name.value])
        pos = self.get_metadata(PositionProvider, node)
        scan = FunctionScan(qualname, int(pos.start.line), int(pos.end.line))
        self._functions.append(scan)
        self.out.functions.append(scan)
        for decorator in node.decorators:
            self._route(decorator.decorator, qualname)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self._functions.pop()

    def _route(self, deco: cst.BaseExpression, handler: str) -> None:
        if not isinstance(deco, cst.Call) or not isinstance(deco.func, cst.Attribute) or not deco.args:
            return
        verb, router = deco.func.attr.value, _name(deco.func.value)
        paths = _text(deco.args[0].value, self.consts) if deco.args[0].keyword is None else []
        if not paths:
            return
        if verb in ("route", "api_route", "websocket"):
            methods = _methods(_kwarg(deco, "methods")) or frozenset({"GET"} if verb == "route" else ())
        elif verb in _VERBS:
            methods = frozenset({verb.upper()})
        else:
            return
        self.out.routes.append(RouteScan(router, paths[0], methods, handler))

    def visit_Call(self, node: cst.Call) -> None:
        if not self._functions:
            return
        fn = self._functions[-1]
        name = _name(node.func)
        verb = name.rsplit(".", 1)[-1]
        if verb:
            fn.calls.add(verb)
        for arg in node.args:
            if arg.keyword is not None:  # Model.objects.filter(id=...).update(balance=...): ORM columns
                fn.names.add(arg.keyword.value)
                if verb in ("update", "update_or_create") or verb in self.out.classes:
                    fn.assigned.add(arg.keyword.value)
            for text in _text(arg.value, self.consts):
                if is_sql(text):
                    fn.sql.append((text, self._line(arg)))

    def visit_Name(self, node: cst.Name) -> None:
        if self._functions:
            self._functions[-1].names.add(node.value)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        if self._functions:
            self._functions[-1].names.add(node.attr.value)

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        if self._functions and isinstance(node.target, cst.Attribute):
            self._functions[-1].assigned.add(node.target.attr.value)

    def leave_AugAssign(self, original_node: cst.AugAssign) -> None:
        if self._functions and isinstance(original_node.target, cst.Attribute):
            self._functions[-1].assigned.add(original_node.target.attr.value)

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        self._literal(node)  # also a literal bound to a local first (an argument's literal is seen twice: harmless)

    def visit_ConcatenatedString(self, node: cst.ConcatenatedString) -> None:
        self._literal(node)

    def _literal(self, node: cst.SimpleString | cst.ConcatenatedString) -> None:
        if self._functions:
            value = node.evaluated_value
            if isinstance(value, str) and is_sql(value):
                self._functions[-1].sql.append((value, self._line(node)))


def scan_module(source: bytes, package: str) -> ModuleScan:
    """The scan of one module's source (``package``: its dotted package, for relative imports); raises
    ``libcst.ParserSyntaxError`` when it is not Python."""
    wrapper = MetadataWrapper(cst.parse_module(source), unsafe_skip_copy=True)  # the tree is not kept: no copy
    scanner = _Scanner(package)
    wrapper.visit(scanner)
    return scanner.out
