"""Deterministic repros of incidents: the compiler, the runner, and the first-divergence check.

``compile_repro(incident)`` → a standalone pytest file replaying the recorded interleaving (SQL or application
level); ``run_repro(test, dsn=..., workdir=...)`` → its RunInfo and executed statements;
``first_divergence(test.production_sequence, executed)`` → whether the repro did what production did.
"""

from processors.repro.app_level import CallSpec, Const, Format, Param, PerSession
from processors.repro.compiler import GeneratedTest, compile_repro
from processors.repro.divergence import ExecutedStatement, first_divergence, load_trace, lock_waits
from processors.repro.rewrite import Copy, SqlRewrite, apply_rewrites
from processors.repro.runner import run_repro
from processors.repro.statements import ReproError

__all__ = [
    "CallSpec",
    "Const",
    "Copy",
    "ExecutedStatement",
    "Format",
    "GeneratedTest",
    "Param",
    "PerSession",
    "ReproError",
    "SqlRewrite",
    "apply_rewrites",
    "compile_repro",
    "first_divergence",
    "load_trace",
    "lock_waits",
    "run_repro",
]
