"""Repair planner: from an incident to code repairs of every unprotected writer, as a diff that applies and reverts.

``plan_repairs`` (see :mod:`processors.repair.planner`) picks the strategy by anomaly class, locates the code with
libcst, rewrites the statements (sqlglot checks every rewrite) and renders a unified diff; ``apply`` and ``revert``
write the repaired files and restore the originals byte for byte.
"""

from processors.repair.patch import FilePatch, PatchError
from processors.repair.planner import RepairPlan, apply, local_path, plan_repairs, revert

__all__ = ["FilePatch", "PatchError", "RepairPlan", "apply", "local_path", "plan_repairs", "revert"]
