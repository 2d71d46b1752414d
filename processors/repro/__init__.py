"""Deterministic repros of incidents: the compiler, the runner, and the first-divergence check.

``compile_repro(incident)`` → a standalone pytest file replaying the recorded interleaving (SQL or application
level), RED when production's failure happens again: the anomaly in the final rows (lost update, a configured
invariant, a duplicate), the victim's recorded failure, or, for write skew, phantoms, read skew and an invariant
violation that names no invariant, a stale read that took effect (no serial order of the two sessions, each run on
a fresh scratch database, explains what committed); ``run_repro(test, dsn=..., workdir=...)`` → its RunInfo and
executed statements;
``first_divergence(test.production_sequence, executed)`` → whether the repro did what production did;
``write_repro_files(out, incident, test, runs)`` → the test, its JUnit XML and a Code Quality report for CI.
"""

from typing import TYPE_CHECKING

from processors.api.lazy import exports

if TYPE_CHECKING:
    from processors.repro.app_level import CallSpec, Const, Format, Param, PerSession
    from processors.repro.ci_files import ReproFiles, code_quality, junit_xml, write_repro_files
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
    "ReproFiles",
    "SqlRewrite",
    "apply_rewrites",
    "code_quality",
    "compile_repro",
    "first_divergence",
    "junit_xml",
    "load_trace",
    "lock_waits",
    "run_repro",
    "write_repro_files",
]

# Imported on first use (libcst): a daemon without the repro worker never loads it.
__getattr__ = exports(
    __name__,
    {
        "processors.repro.app_level": ("CallSpec", "Const", "Format", "Param", "PerSession"),
        "processors.repro.ci_files": ("ReproFiles", "code_quality", "junit_xml", "write_repro_files"),
        "processors.repro.compiler": ("GeneratedTest", "compile_repro"),
        "processors.repro.divergence": ("ExecutedStatement", "first_divergence", "load_trace", "lock_waits"),
        "processors.repro.rewrite": ("Copy", "SqlRewrite", "apply_rewrites"),
        "processors.repro.runner": ("run_repro",),
        "processors.repro.statements": ("ReproError",),
    },
)
