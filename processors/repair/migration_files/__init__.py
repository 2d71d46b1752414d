"""Migration files for the schema changes repairs need: an Alembic revision (:mod:`~.alembic`) for SQLAlchemy code
whose project uses Alembic, a Django migration (:mod:`~.django`) for a Django app with a ``migrations`` package.

Without either, a plan carries the change only as SQL (``RepairPlan.migrations``) and a note. The files are created
through :meth:`processors.repair.patch.Patch.create`, so they are in the plan's diff (``--- /dev/null``), applied and
reverted with the code's edits.
"""
