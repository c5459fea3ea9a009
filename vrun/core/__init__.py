"""Vocabulary every layer shares: `Problem` and `PlanError` (what a check reports, one line each) and the
dotted-path lookup into nested dicts.

Imports nothing from the project. Everything else may import it.
"""
