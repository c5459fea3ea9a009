"""Units shared by every figure the project prints or records."""

GIB = 1024 ** 3


def clock(s: float) -> str:
    """Seconds as the watch says them: `90 s`, `5 min`, `2.5 h`."""
    s = float(s)
    if s < 120:
        return f"{s:g} s"
    if s < 7200:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def elapsed(s: float) -> str:
    """A run's elapsed or remaining time, as its table shows it: `5m03s`, `2h05m`, `3d04h` (nothing below 0)."""
    s = int(max(s, 0))
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"
