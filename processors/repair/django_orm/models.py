"""Django models as the source declares them: the table each model maps to, its columns and its primary key.

A model is a module-level ``class X(models.Model)`` (or ``Model``); its table is ``Meta.db_table``, else Django's
default ``<app_label>_<model name in lower case>`` (``Meta.app_label``, else the name of the directory that holds
the module, as an app's ``models.py`` is labelled). Its columns are its field assignments (``db_column`` when given;
a ``ForeignKey``'s column ends in ``_id``); its primary key is the field with ``primary_key=True``, else ``id``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import libcst as cst

from processors.repair.source import SourceError, SourceIndex, string_value

_RELATIONS = frozenset({"ForeignKey", "OneToOneField"})


@dataclass(frozen=True, slots=True, eq=False)
class Model:
    """One Django model class and what the SQL Django renders for it names."""

    name: str
    path: Path
    node: cst.ClassDef
    table: str
    pk: str  # the primary key's field name
    columns: dict[str, str]  # field name -> column

    def column(self, lookup: str) -> str | None:
        """The column a keyword of ``filter``/``get`` (``field``, ``field__lookup``, ``pk``) compares."""
        field = lookup.split("__", 1)[0]
        if field == "pk":
            field = self.pk
        return self.columns.get(field) or (field if field in self.columns.values() else None)

    @property
    def meta(self) -> cst.ClassDef | None:
        body = self.node.body.body if isinstance(self.node.body, cst.IndentedBlock) else ()
        return next((s for s in body if isinstance(s, cst.ClassDef) and s.name.value == "Meta"), None)


def models_in(index: SourceIndex, path: Path) -> dict[str, Model]:
    """The models defined in ``path``, by class name (none when it cannot be parsed)."""
    try:
        module = index.module(path)
    except SourceError:
        return {}
    out: dict[str, Model] = {}
    for stmt in module.body:
        if isinstance(stmt, cst.ClassDef) and any(_is_model_base(b.value) for b in stmt.bases):
            out[stmt.name.value] = _model(path, stmt)
    return out


def resolve(index: SourceIndex, path: Path, name: str) -> Model | None:
    """The model a name used in ``path`` stands for: defined there, or imported from a module under the root."""
    here = models_in(index, path).get(name)
    if here is not None:
        return here
    imported = index.imports(path).get(name)
    return models_in(index, imported[0]).get(imported[1]) if imported is not None else None


def _is_model_base(node: cst.BaseExpression) -> bool:
    if isinstance(node, cst.Name):
        return node.value == "Model"
    return isinstance(node, cst.Attribute) and node.attr.value == "Model"


def _model(path: Path, node: cst.ClassDef) -> Model:
    columns: dict[str, str] = {}
    pk = ""
    meta: dict[str, str] = {}
    body = node.body.body if isinstance(node.body, cst.IndentedBlock) else ()
    for stmt in body:
        if isinstance(stmt, cst.ClassDef) and stmt.name.value == "Meta":
            meta = _meta(stmt)
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if not (isinstance(small, cst.Assign) and len(small.targets) == 1):
                continue
            target, value = small.targets[0].target, small.value
            if not (isinstance(target, cst.Name) and isinstance(value, cst.Call)):
                continue
            kind = value.func.attr.value if isinstance(value.func, cst.Attribute) else ""
            kind = value.func.value if isinstance(value.func, cst.Name) else kind
            if not kind.endswith("Field") and kind not in _RELATIONS:
                continue
            keywords = {a.keyword.value: a.value for a in value.args if a.keyword is not None}
            column = string_value(keywords["db_column"]) if "db_column" in keywords else None
            columns[target.value] = column or (f"{target.value}_id" if kind in _RELATIONS else target.value)
            primary = keywords.get("primary_key")
            if isinstance(primary, cst.Name) and primary.value == "True":
                pk = target.value
    if not pk:
        pk = "id"
        columns.setdefault("id", "id")
    label = meta.get("app_label") or path.parent.name
    table = meta.get("db_table") or f"{label}_{node.name.value.lower()}"
    return Model(node.name.value, path, node, table, pk, columns)


def _meta(node: cst.ClassDef) -> dict[str, str]:
    out: dict[str, str] = {}
    body = node.body.body if isinstance(node.body, cst.IndentedBlock) else ()
    for stmt in body:
        for small in stmt.body if isinstance(stmt, cst.SimpleStatementLine) else ():
            if isinstance(small, cst.Assign) and len(small.targets) == 1:
                target = small.targets[0].target
                text = string_value(small.value)
                if isinstance(target, cst.Name) and text is not None:
                    out[target.value] = text
    return out
