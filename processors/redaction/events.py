"""Redaction of a published event, once, before it leaves the daemon (see ``processors.redaction.policy``).

An incident carries production values in three forms: structured (the commits' row images, each access's
``set_values`` and ``params``), as text the detector wrote around them (the summary, the damage, the evidence lines,
a predicate, a statement with literals) and as entity keys. The structured values are redacted by their column's
action (a parameter by the column the statement binds it to, :mod:`processors.redaction.params`; a parameter bound
to no known column by ``unknown_parameters``, unless it equals a value redacted elsewhere in the event); then every
text of the event has each redacted value's text replaced by its marker, so no value redacted in a field is left in
prose. Entity keys are identifiers, kept unless ``keys = "hash"``.

Regressions, verdicts and contracts carry no row values (statistics, signatures, builds) and pass unchanged; a
repro is compiled from an incident that was redacted already (the repro worker reads the incidents topic).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import SecretStr

from processors.api.telemetry import Telemetry
from processors.model.base import Published
from processors.model.graph import GraphBatch
from processors.model.incident import AccessInfo, CommitInfo, IncidentEvent
from processors.redaction.config import Action, RedactionConfig
from processors.redaction.graph import redact_batch
from processors.redaction.literals import Literals
from processors.redaction.params import ParameterColumns
from processors.redaction.policy import Policy, canonical, is_marker

P = TypeVar("P", bound=Published)
MIN_TEXT = 4  # a redacted value shorter than this as text is not searched for in prose (it would match anywhere)


class Redactor:
    """The policy applied to whole events; call it on every event before it is published."""

    __slots__ = ("literals", "params", "policy")

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.params = ParameterColumns(policy.telemetry)
        self.literals = Literals(policy)

    def graph(self, batch: GraphBatch) -> None:
        """Redact a stage's graph rows in place before they are written (``processors.redaction.graph``)."""
        redact_batch(batch, self.policy, self.params, self.literals)

    @classmethod
    def of(cls, config: RedactionConfig, key: SecretStr | None, telemetry: Telemetry | None = None) -> Redactor:
        """The redactor of a ``[redaction]`` section and the ``redaction_key`` secret."""
        secret = key.get_secret_value().encode() if key is not None else None
        return cls(Policy(config, secret, telemetry))

    def __call__(self, event: P) -> P:
        if not self.policy.enabled or not isinstance(event, IncidentEvent):
            return event
        redacted: P = _Incident(self, event).event()  # type: ignore[assignment]  # same class in, same class out
        return redacted


class _Incident:
    """One incident being redacted: the values redacted so far (canonical text -> (action, marker))."""

    def __init__(self, redactor: Redactor, event: IncidentEvent) -> None:
        self.r, self.policy, self.e = redactor, redactor.policy, event
        self.seen: dict[str, tuple[Action, Any, Any]] = {}  # canonical text -> (action, value, marker)
        self.keys: dict[str, str] = {}

    def event(self) -> IncidentEvent:
        e = self.e
        commits = [self._commit(c) for c in e.commits]
        sets = {id(a): self._set_values(a) for a in self._accesses()}
        params = {id(a): self._params(a) for a in self._accesses()}  # every value first, then the texts
        accesses = {id(a): self._access(a, sets[id(a)], params[id(a)]) for a in self._accesses()}
        update: dict[str, Any] = {
            "commits": commits,
            "culprit": accesses[id(e.culprit)],
            "victim": accesses[id(e.victim)],
            "writers": [accesses[id(a)] for a in e.writers],
            "accesses": [accesses[id(a)] for a in e.accesses],
            "entity": self._key(e.entity),
            "entities": [self._key(x) for x in e.entities],
        }
        update.update(summary=self._text(e.summary), damage=self._text(e.damage),
                      evidence=[self._text(x) for x in e.evidence])  # fmt: skip
        return e.model_copy(update=update)

    def _accesses(self) -> list[AccessInfo]:
        e = self.e
        return [e.culprit, e.victim, *e.writers, *e.accesses]

    def _table(self, entity: str) -> str:
        return entity.split(":", 1)[0] if ":" in entity else self.e.table

    def _value(self, action: Action, value: Any) -> Any:
        out = self.policy.apply(action, value)
        if out is not value and out != value:
            self.seen.setdefault(canonical(value), (action, value, out))
        return out

    def _image(self, image: Mapping[str, Any] | None) -> dict[str, Any] | None:
        if image is None:
            return None
        return {col: self._value(self.policy.action(self.e.table, col), v) for col, v in image.items()}

    def _commit(self, c: CommitInfo) -> CommitInfo:
        return c.model_copy(update={"before": self._image(c.before), "after": self._image(c.after)})

    def _set_values(self, a: AccessInfo) -> dict[str, Any]:
        table = self._table(a.entity)
        return {col: self._value(self.policy.action(table, col), v) for col, v in a.set_values.items()}

    def _param(self, table: str, column: str | None, value: Any) -> Any:
        action = self.policy.action(table, column) if column else self.policy.config.unknown_parameters
        known = self.seen.get(canonical(value)) if not is_marker(value) else None
        if action == "keep" and known is not None and len(str(value)) >= MIN_TEXT:
            action = known[0]  # the same value was redacted in a field: it is redacted here too
        return self._value(action, value)

    def _params(self, a: AccessInfo) -> list[Any]:
        table, bound = self._table(a.entity), self.r.params.of(a.statement)
        return [self._param(table, bound.get(i), p) for i, p in enumerate(a.params)]

    def _access(self, a: AccessInfo, sets: dict[str, Any], params: list[Any]) -> AccessInfo:
        return a.model_copy(update={
            "set_values": sets, "params": params, "entity": self._key(a.entity),
            "statement": self._sql(a.statement), "predicate": self._text(a.predicate),
        })  # fmt: skip

    def _key(self, entity: str) -> str:
        if self.policy.config.keys == "keep" or ":" not in entity:
            return entity
        table, key = entity.split(":", 1)
        if key == "*" or is_marker(key):
            return entity
        hashed = f"{table}:{self.policy.apply('hash', key)}"
        self.keys[entity] = hashed
        return hashed

    def _sql(self, statement: str) -> str:
        """A statement with each redacted value's literal (``'a@b.c'``, ``4111``) replaced: only whole literals, so
        that a value that is also a word of the SQL (a table's name) leaves the SQL as it is."""
        for _action, value, marker in self.seen.values():
            if isinstance(value, str) and len(value) >= MIN_TEXT:
                quoted = value.replace("'", "''")
                statement = statement.replace(f"'{quoted}'", f"'{marker}'")
            elif isinstance(value, int | float) and not isinstance(value, bool) and len(str(value)) >= MIN_TEXT:
                statement = re.sub(rf"(?<![\w.]){re.escape(str(value))}(?![\w.])", f"'{marker}'", statement)
        return self.r.literals(statement, self.e.table)

    def _text(self, text: str) -> str:
        """``text`` with every value redacted in this event (and every hashed key) replaced by its marker."""
        if not text:
            return text
        for _action, value, marker in self.seen.values():
            shown = str(value)
            if len(shown) < MIN_TEXT or shown not in text:
                continue
            text = text.replace(repr(value), repr(marker)).replace(shown, str(marker))
        for entity, hashed in self.keys.items():
            text = text.replace(entity, hashed)
        return text


def redacted(incident: IncidentEvent) -> bool:
    """Whether some value of ``incident`` is a redaction marker (a repro built from it replays placeholders)."""
    images = [v for c in incident.commits for image in (c.before, c.after) if image for v in image.values()]
    accesses = [incident.culprit, incident.victim, *incident.writers, *incident.accesses]
    values = [*images, *(p for a in accesses for p in a.params), *(v for a in accesses for v in a.set_values.values())]
    return any(is_marker(v) for v in values)


__all__ = ["Redactor", "redacted"]
