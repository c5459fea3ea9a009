"""Text from a job's output or a run dir's files, made safe for a terminal: every control character and escape
sequence shown as visible text (`\\x1b]52;…` — a clipboard write, a cursor move, a screen clear — prints as the
characters it is made of, never acts), except colours (SGR `ESC[…m`), which may stay on a terminal and are dropped
elsewhere. Tabs stay. `install`: every line `python -m vrun` prints passes through it. Standard library only."""
from __future__ import annotations

import re

SGR = re.compile(r"\x1b\[[0-9;]*m")
# C0 controls but tab, DEL, and C1 controls (U+0080–U+009F: CSI, OSC, ... in their 8-bit forms)
CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f\x80-\x9f]")


def _shown(m: re.Match) -> str:
    return m.group(0).encode("unicode_escape").decode("ascii")


def visible(text: str, colours: bool = False) -> str:
    """`text` with controls made visible; colours kept when `colours` (a terminal), else removed."""
    if not isinstance(text, str):
        text = str(text)
    if colours:
        parts = SGR.split(text)
        codes = SGR.findall(text)
        out = [CONTROL.sub(_shown, parts[0])]
        for code, part in zip(codes, parts[1:]):
            out.append(code + CONTROL.sub(_shown, part))
        return "".join(out)
    return CONTROL.sub(_shown, SGR.sub("", text))


def visible_lines(text: str, colours: bool = False) -> str:
    """visible() line by line: newlines stay newlines."""
    return "\n".join(visible(line, colours) for line in str(text).split("\n"))


class VisibleStream:
    """A text stream that passes on only visible text (visible_lines; colours kept on a terminal): every line a
    `python -m vrun` verb prints, whatever file or job output it quotes (vrun/__main__.py installs it)."""

    def __init__(self, inner):
        self._inner = inner
        self._colours = bool(getattr(inner, "isatty", lambda: False)())

    def write(self, s: str) -> int:
        self._inner.write(visible_lines(s, self._colours))
        return len(s)

    def __getattr__(self, name):
        return getattr(self._inner, name)


def install() -> None:
    """sys.stdout and sys.stderr pass on only visible text (idempotent; before vrun.core.writer.install, so that
    secrets are masked in the raw text first)."""
    import sys

    for name in ("stdout", "stderr"):
        s = getattr(sys, name)
        if not isinstance(s, VisibleStream):
            setattr(sys, name, VisibleStream(s))


# how many items of a list read back (a dir's entries, a remote answer) a line or an event names before it counts
SHOWN_ITEMS = 5
# each named item is cut to this many characters (a name read back can be as long as a path)
ITEM_CHARS = 80


def _item(x, shown) -> str:
    s = visible(shown(x))
    return s if len(s) <= ITEM_CHARS else s[:ITEM_CHARS - 1] + "…"


def summarised(items, limit: int = SHOWN_ITEMS, shown=str, sep: str = ", ") -> str:
    """A list read from disk or a remote answer as one bounded piece of a line: every item when there are at most
    `limit`, else the first `limit` and `… and K more` (20,000 step dirs are five names and a count, not 1.4 MB).
    Each item is made terminal-safe (visible) and cut to ITEM_CHARS."""
    items = list(items)
    head = sep.join(_item(x, shown) for x in items[:limit])
    rest = len(items) - min(len(items), limit)
    return head + (f" … and {rest:,} more" if rest else "")


def summarised_list(items, limit: int = SHOWN_ITEMS) -> list:
    """The same for a JSON event's field: the first `limit` items as they are, then one `… and K more` string."""
    items = list(items)
    if len(items) <= limit:
        return items
    return items[:limit] + [f"… and {len(items) - limit:,} more"]
