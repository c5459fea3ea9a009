"""Dotted paths into trees of plain dicts (`actor_rollout_ref.actor.engine`): the one lookup every module uses."""
from __future__ import annotations

from typing import Any

# returned (as the default) when a path is absent, where None is a value the tree may hold
MISSING: Any = object()


def get(tree: Any, key: str, default: Any = None) -> Any:
    """The value at `key` in `tree`, or `default` when a part of the path is absent."""
    node: Any = tree
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node
