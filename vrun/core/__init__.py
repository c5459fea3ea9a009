"""Vocabulary every layer shares: `Problem` and `PlanError` (what a check reports, one line each), the dotted-path
lookup into nested dicts, units (`GIB`), and the one writer every file and printed line goes through
(`writer.py`: masks secret values, refuses symlinks, keeps writes inside their root).

Imports nothing from the project. Everything else may import it.
"""
