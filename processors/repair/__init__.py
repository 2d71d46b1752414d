"""Repair planner: from an incident to code repairs of every unprotected writer, as a diff that applies and reverts.

``plan_repairs`` (see :mod:`processors.repair.planner`) picks the strategy by anomaly class
(:mod:`processors.repair.strategies`), locates the code with libcst (:mod:`~processors.repair.source` reads it,
:mod:`~processors.repair.locate` finds the calls that run a statement), rewrites the statements
(:mod:`~processors.repair.sql_rewrite`; sqlglot checks every rewrite) and renders a unified diff
(:mod:`~processors.repair.patch`); ``apply`` and ``revert`` write the repaired files and restore the originals
byte for byte (:mod:`~processors.repair.file_patch`).
"""

from processors.repair.file_patch import FilePatch, PatchError
from processors.repair.planner import RepairPlan, apply, local_path, plan_repairs, revert

__all__ = ["FilePatch", "PatchError", "RepairPlan", "apply", "local_path", "plan_repairs", "revert"]
