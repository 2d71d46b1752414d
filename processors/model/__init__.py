"""The vocabulary every layer speaks: input events, published events, anomaly classes, units.

It imports nothing of the project (checked by import-linter); everything else imports it.
"""
