"""ORM-level repairs of the Django stack (``bench/corpus/stacks/django_orm/app.py``), planned from its incidents.

Each bug view's incident is built from the statements the view really sent (``fixtures/django_statements.json``,
as Django rendered them: quoted, ``LIMIT 21``, no parameters). The raw-SQL strategies cannot find those statements
in the code; the Django strategies find the queryset call that issued each one and edit it. The diff is checked
line by line, applies, compiles and reverts byte for byte. Every control view is left alone: planned as if it had
been reported, its plan edits nothing and its notes say why.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from processors.model.incident import CommitInfo
from processors.repair import django_orm
from processors.repair.file_patch import FilePatch, unified_diff
from processors.repair.patch import Patch
from processors.repair.planner import RepairPlan, apply, plan_repairs, revert
from processors.repair.source import SourceIndex
from processors.repair.strategies import (
    ATOMIC_UPDATE,
    ROW_LOCK,
    STRATEGIES,
    STRICTER_ISOLATION,
    UNIQUE_INSERT,
    Context,
    NotApplicable,
    Outcome,
    Writer,
)
from tests.repair.django_cases import VIEWS, accesses, copy_stack, recorded, round_incident

# scenario -> (the strategy chosen, the lines the diff adds, the lines it removes)
EXPECTED = {
    "lost_update": (ROW_LOCK, [
        "        account = Account.objects.select_for_update().get(pk=account_no)",
    ], ["        account = Account.objects.get(pk=account_no)"]),
    "write_skew": (ROW_LOCK, [
        '    on_call = len(doctors.filter(shift=shift, on_call=True).select_for_update().values_list("pk"))',
        "    doctor = doctors.select_for_update().get(pk=name)",
    ], ["    on_call = doctors.filter(shift=shift, on_call=True).count()", "    doctor = doctors.get(pk=name)"]),
    "phantom": (UNIQUE_INSERT, [
        '        constraints = [models.UniqueConstraint(fields=["room", "day"], name="corpus_bookings_room_day_key")]',
        "        try:",
        "            with transaction.atomic():",
        "                booking = Booking.objects.create(room=room, day=day, guest=guest)",
        "        except IntegrityError:",
        '            raise RoomTaken(f"room {room} is booked on {day}")',
    ], ["        booking = Booking.objects.create(room=room, day=day, guest=guest)"]),
}  # fmt: skip


def _changed(diff: str, sign: str) -> list[str]:
    """The lines the diff adds (``+``) or removes (``-``), comments left out."""
    lines = [line[1:] for line in diff.splitlines() if line.startswith(sign) and not line.startswith(sign * 3)]
    return [line for line in lines if not line.lstrip().startswith("#")]


Planned = Callable[[str], tuple[Path, RepairPlan]]


@pytest.fixture(scope="module")
def planned(tmp_path_factory: pytest.TempPathFactory) -> Planned:
    """Each bug round's plan, made once for the module on a copy of the stack (a test that applies it reverts it)."""
    plans: dict[str, tuple[Path, RepairPlan]] = {}

    def plan(scenario: str) -> tuple[Path, RepairPlan]:
        if scenario not in plans:
            root = copy_stack(tmp_path_factory.mktemp(scenario))
            plans[scenario] = (root, plan_repairs(round_incident(scenario), root=root))
        return plans[scenario]

    return plan


@pytest.mark.parametrize("scenario", sorted(EXPECTED))
def test_each_bug_view_is_repaired_at_the_orm_level(planned: Planned, scenario: str) -> None:
    root, plan = planned(scenario)
    original = (root / "app.py").read_bytes()
    strategy, added, removed = EXPECTED[scenario]
    assert plan.strategy == strategy, plan.notes
    assert {r.function for r in plan.repairs} == {f"app.{VIEWS[scenario]['bug']}"}
    assert _changed(plan.diff, "+") == added, plan.diff
    assert _changed(plan.diff, "-") == removed, plan.diff
    assert f"repair({strategy})" in plan.diff  # the edit says what it does
    assert any("is Django's, from `" in n for n in plan.notes), plan.notes  # why: the queryset call it edits
    assert plan.edits and all(e.before in {a.statement for a in round_incident(scenario).accesses} for e in plan.edits)
    assert STRICTER_ISOLATION in [a.strategy for a in plan.alternatives]
    apply(plan, root)
    repaired = (root / "app.py").read_bytes()
    assert repaired == plan.files[0].after != original
    compile(repaired, "app.py", "exec")
    revert(plan, root)
    assert (root / "app.py").read_bytes() == original


@pytest.mark.parametrize("scenario", sorted(EXPECTED))
def test_the_raw_sql_form_of_the_strategy_finds_no_statement(tmp_path: Path, scenario: str) -> None:
    """What the planner tries first: the recorded statement as a string in the code. Django's is not there."""
    root = copy_stack(tmp_path / "stack")
    found = accesses(recorded()[scenario]["bug"], VIEWS[scenario]["bug"])
    w = Writer(
        f"app.{VIEWS[scenario]['bug']}",
        "app.py",
        root / "app.py",
        "app.py",
        tuple(a for a in found if a.operation != "read"),
        tuple(a for a in found if a.operation == "read"),
    )
    with pytest.raises(NotApplicable, match=r"statement .* not found in app\."):
        STRATEGIES[EXPECTED[scenario][0]](Context(SourceIndex(root)), w)


def test_the_sql_level_forms(planned: Planned) -> None:
    """What a SQL-level repro replays: the recorded statements locked, the INSERT on conflict, and its index."""
    lost = planned("lost_update")[1]
    assert [e.after for e in lost.edits] == [recorded()["lost_update"]["bug"]["leader"][0] + " FOR UPDATE"]
    skew = planned("write_skew")[1]
    assert 'FROM (SELECT * FROM "corpus_doctors" WHERE' in skew.edits[0].after
    assert skew.edits[0].after.endswith('FOR UPDATE) AS "corpus_doctors"')
    phantom = planned("phantom")[1]
    assert "ON CONFLICT(room, day) DO NOTHING" in phantom.sql_rewrites[0]["after"]
    assert phantom.migrations == ['CREATE UNIQUE INDEX IF NOT EXISTS corpus_bookings_room_day_key ON "corpus_bookings"'
                                  "(room, day)"]  # fmt: skip


@pytest.mark.parametrize("scenario", sorted(EXPECTED))
def test_serializable_alternative_wraps_the_atomic_block_in_a_bounded_retry(planned: Planned, scenario: str) -> None:
    root, plan = planned(scenario)
    original = (root / "app.py").read_bytes()
    alt = next(a for a in plan.alternatives if a.strategy == STRICTER_ISOLATION)
    added = _changed(alt.diff, "+")
    assert added[:5] == [
        "    for attempt in range(3):",
        "        try:",
        "            with transaction.atomic():",
        "                with transaction.get_connection().cursor() as cursor:",
        '                    cursor.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")',
    ]
    assert added[-4:] == ["            break", "        except OperationalError as exc:",
                          "            if attempt == 2 or not isinstance(exc.__cause__, SerializationFailure):",
                          "                raise"]  # fmt: skip
    assert alt.isolation == {f"app.{VIEWS[scenario]['bug']}": "serializable"}
    apply(alt, root)
    compile((root / "app.py").read_bytes(), "app.py", "exec")
    revert(alt, root)
    assert (root / "app.py").read_bytes() == original


CONTROLS = [(s, k) for s, kinds in VIEWS.items() for k in kinds if k != "bug"]


@pytest.mark.parametrize(("scenario", "kind"), CONTROLS, ids=[f"{s}-{k}" for s, k in CONTROLS])
def test_every_control_view_is_left_alone(tmp_path: Path, scenario: str, kind: str) -> None:
    """Planned as if its round had been reported, a control's plan edits nothing (no strategy or alternative)."""
    root = copy_stack(tmp_path / "stack")
    plan = plan_repairs(round_incident(scenario, kind), root=root)
    assert not plan.diff and not plan.repairs, plan.diff
    assert not plan.alternatives
    assert plan.notes, "a control left alone says why"


def test_controls_among_the_graphs_sites_are_left_alone(tmp_path: Path) -> None:
    """The bug's plan with every control of its table known to the graph repairs the bug view only."""
    root = copy_stack(tmp_path / "stack")
    for scenario in ("lost_update", "write_skew"):
        sites = [a for kind in VIEWS[scenario] if kind != "bug"
                 for a in accesses(recorded()[scenario][kind], VIEWS[scenario][kind])]  # fmt: skip
        plan = plan_repairs(round_incident(scenario), root=root, sites=sites)
        assert {r.function for r in plan.repairs} == {f"app.{VIEWS[scenario]['bug']}"}, plan.notes
        for alt in plan.alternatives:
            assert {r.function for r in alt.repairs} == {f"app.{VIEWS[scenario]['bug']}"}, alt.notes


def test_a_statement_no_queryset_issues_is_reported_not_guessed(tmp_path: Path) -> None:
    root = copy_stack(tmp_path / "stack")
    statements = recorded()["lost_update"]["bug"]
    other = statements["leader"][0].replace('"account_no" = %s', '"balance" = %s')  # a filter the code has not
    w = Writer("app.deposit", "app.py", root / "app.py", "app.py", tuple(a for a in accesses(statements, "deposit")
               if a.operation == "write")[:1], tuple(a for a in accesses({"leader": [other], "follower": []},
                                                                          "deposit")))  # fmt: skip
    with pytest.raises(NotApplicable, match=r"no queryset call in app\.deposit"):
        django_orm.STRATEGIES[ROW_LOCK](Context(SourceIndex(root)), w)


def _render(root: Path, outcome_of: Callable[[Context, Writer], Outcome], w: Writer) -> str:
    index = SourceIndex(root)
    outcome = outcome_of(Context(index), w)
    patch = Patch(index)
    for op in outcome.ops:
        op(patch)
    return unified_diff([FilePatch(p.name, before, after) for p, before, after in patch.render()])


def _writer(root: Path, scenario: str, view: str, statements: dict[str, list[str]] | None = None) -> Writer:
    found = [a for a in accesses(statements or recorded()[scenario]["bug"], view) if a.trace_id.startswith("a")]
    return Writer(
        f"app.{view}",
        "app.py",
        root / "app.py",
        "app.py",
        tuple(a for a in found if a.operation != "read"),
        tuple(a for a in found if a.operation == "read"),
    )


def test_atomic_update_lets_the_database_add_the_deposit(tmp_path: Path) -> None:
    """``account.balance += amount; account.save()`` → one relative UPDATE, and the instance refreshed."""
    root = copy_stack(tmp_path / "stack")
    diff = _render(root, django_orm.STRATEGIES[ATOMIC_UPDATE], _writer(root, "lost_update", "deposit"))
    assert _changed(diff, "+") == [
        '        Account.objects.filter(pk=account.pk).update(balance=F("balance") + amount)',
        '        account.refresh_from_db(fields=["balance"])',
    ]
    assert _changed(diff, "-") == ["        account.balance += amount", "        account.save()"]


def test_atomic_update_refuses_a_save_of_a_field_set_in_python(tmp_path: Path) -> None:
    root = copy_stack(tmp_path / "stack")
    with pytest.raises(NotApplicable, match=r"save\(\) also writes doctor\.on_call"):
        _render(root, django_orm.STRATEGIES[ATOMIC_UPDATE], _writer(root, "write_skew", "go_off_call"))


TAKE = """\
from django.db import models, transaction


class Item(models.Model):
    sku = models.TextField(primary_key=True)
    stock = models.IntegerField()

    class Meta:
        db_table = "inventory"


class OutOfStock(Exception):
    pass


def take(sku, qty):
    with transaction.atomic():
        item = Item.objects.get(pk=sku)
        if item.stock < qty:
            raise OutOfStock(sku)
        item.stock -= qty
        item.save()
    return item.stock
"""


def test_atomic_update_guards_a_decrement_and_handles_no_row_like_its_check(tmp_path: Path) -> None:
    """A decrement keeps the invariant in the UPDATE's filter; no row updated raises what the check raises. (The
    statements are the stack's recorded ones with its table and columns renamed to this module's.)"""
    root = tmp_path / "shop"
    root.mkdir()
    (root / "app.py").write_text(TAKE)
    lost = recorded()["lost_update"]["bug"]["leader"]
    renamed = [s.replace("corpus_accounts", "inventory").replace("account_no", "sku").replace("balance", "stock")
               for s in lost]  # fmt: skip
    w = _writer(root, "lost_update", "take", {"leader": renamed, "follower": []})
    diff = _render(root, django_orm.STRATEGIES[ATOMIC_UPDATE], w)
    assert _changed(diff, "+") == [
        "from django.db.models import F",
        '        if not Item.objects.filter(pk=item.pk, stock__gte=qty).update(stock=F("stock") - qty):',
        "            raise OutOfStock(sku)",
        '        item.refresh_from_db(fields=["stock"])',
    ], diff
    index = SourceIndex(root)
    configured = django_orm.STRATEGIES[ATOMIC_UPDATE](Context(index, invariants=("stock >= 2",)), w)
    patch = Patch(index)
    for op in configured.ops:
        op(patch)
    assert b"stock__gte=qty + 2" in patch.render()[0][2]


def test_write_skew_with_its_commits_but_no_parameters_locks_the_rows_it_counts(tmp_path: Path) -> None:
    """With the row changes the daemon attaches and no statement parameters (the stock instrumentation sends none),
    the planner cannot tell whether a lock on the count covers the other doctor's row; it takes the lock (the GREEN
    run decides) and offers the SERIALIZABLE retry of the view's atomic block as the alternative."""
    root = copy_stack(tmp_path / "stack")
    rows = [("a", "alice-204"), ("b", "bob-204")]
    commits = [
        CommitInfo(lsn=n, tx_id=str(n), commit_unix_ms=0, offset_ms=0, op="u", trace_id=t * 32, span_id=t * 16,
                   before={"name": name, "shift": 204, "on_call": True}, correlation="tx_id", skew_ms=None,
                   after={"name": name, "shift": 204, "on_call": False})
        for n, (t, name) in enumerate(rows, 1)
    ]  # fmt: skip
    event = round_incident("write_skew").model_copy(update={"commits": commits})
    plan = plan_repairs(event, root=root)
    assert plan.strategy == ROW_LOCK, plan.notes
    assert ".select_for_update()" in plan.diff
    [serializable] = plan.alternatives
    assert serializable.strategy == STRICTER_ISOLATION
    assert "with transaction.get_connection().cursor() as cursor:" in serializable.diff
    assert serializable.isolation == {"app.go_off_call": "serializable"}


NO_TRANSACTION = """\
from django.db import models


class Account(models.Model):
    account_no = models.TextField(primary_key=True)
    balance = models.IntegerField()

    class Meta:
        app_label = "corpus"
        db_table = "corpus_accounts"


def deposit(account_no, amount):
    account = Account.objects.get(pk=account_no)
    account.balance += amount
    account.save()
    return account.balance
"""


def test_a_lock_outside_a_transaction_gets_one(tmp_path: Path) -> None:
    """``select_for_update()`` outside a transaction raises: the function is made atomic (and the name imported).
    (The model is the stack's Account: the recorded statements are what Django renders for it.)"""
    root = tmp_path / "svc"
    root.mkdir()
    (root / "app.py").write_text(NO_TRANSACTION)
    plan = plan_repairs(round_incident("lost_update"), root=root)  # app.deposit, as the stack's
    assert _changed(plan.diff, "+") == [
        "from django.db import models, transaction",
        "@transaction.atomic",
        "    account = Account.objects.select_for_update().get(pk=account_no)",
    ], plan.diff
    assert any("now runs in transaction.atomic" in n for n in plan.notes), plan.notes
