"""What a check reports: one line with the key, the value, why, and a fix."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# names of secrets (WANDB_API_KEY, HF_TOKEN, GITHUB_TOKEN_RO, hf_token, …), not of knobs that merely mention
# tokens (max_token_len, experts_per_token): TOKEN anywhere in an upper-case (variable) name, a lower-case key only
# when it is a token itself
SECRETISH = re.compile(r"(?i:api_?key|secret|passw(?:or)?d|access_key|private_key|credential)|TOKEN|"
                       r"(?i:^(?:\w+_)?(?:hf|auth|access|api|bearer|github|hub)_?token$)")


CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# keys whose children are environment variable names (the broad name rule applies to them)
ENV_MAPS = re.compile(r"(^|\.)(env|env_vars|env_set)$")


def names_secret(key: str) -> bool:
    """A config key whose value would be a secret: a variable name under an env map (`env`, `env_vars`,
    `hydra.job.env_set`; the writer's broad rule), else a key that is a secret's name (the narrow rule:
    max_token_len and experts_per_token are knobs)."""
    from vrun.core.writer import is_secret_name

    parent, _, last = key.rpartition(".")
    if "[" in last:
        return False
    return is_secret_name(last) if ENV_MAPS.search(parent) else bool(SECRETISH.search(last))


@dataclass(frozen=True)
class Problem:
    key: str
    value: Any
    why: str
    fix: str
    warning: bool = False

    def line(self) -> str:
        kind = "warning" if self.warning else "error"
        why, fix = self.why, self.fix
        if (SECRETISH.search(self.key) or names_secret(self.key)) and self.value not in (None, ""):
            value = "<hidden>"
            shown = show(self.value)
            if len(shown) >= 3:  # never repeated further on the line either
                why, fix = why.replace(shown, "<hidden>"), fix.replace(shown, "<hidden>")
        else:
            value = show(self.value)
        return f"{kind}: {self.key}={value}: {why}; fix: {fix}"


class PlanError(Exception):
    """Raised with every error a plan found; the runner prints one line each and exits non-zero."""

    def __init__(self, problems: list[Problem], hints: list[str] | None = None):
        self.problems = [p for p in problems if not p.warning]
        # lines printed after the errors (e.g. valid neighbouring meshes to paste)
        self.hints = list(hints or [])
        super().__init__("\n".join([p.line() for p in self.problems] + self.hints))


def show(value: Any) -> str:
    """The value as it goes on the one line: control characters (a newline) shown escaped, never raw."""
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(show(v) for v in value) + "]"
    if value is None:
        return "null"
    return CONTROL.sub(lambda m: repr(m.group(0))[1:-1], str(value))
