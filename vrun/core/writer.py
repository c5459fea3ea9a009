"""The one writer: every file the project writes and every line it prints goes through here, masked.

Masking (`mask`): every occurrence (a substring, not only an equal value) of the value of an environment variable
whose name looks secret (`is_secret_name`: a broad, case-insensitive rule on the name's segments, with an
allow-list of known non-secrets) becomes <hidden>, as does the userinfo of any URL (`https://user:pass@host`).
Values shorter than MIN_SECRET characters cannot be masked without masking ordinary words: the plan refuses to
use them (vrun.checks.secret). A value typed on the command line for a secret key is as secret (`hide`: the entry
points register them, vrun.config.overrides.typed_secrets). Each value is masked in every encoding the project prints
or writes (`forms`: JSON escapes, Python's repr, YAML's quoting, control characters shown as escapes).

Files (`write_text`, `append_line`): never through a link — a symlink in place of the file is refused, the file
is replaced by a rename (a hard link planted there is not written through), and with `root` (the run or sweep
dir) the file's real directory must be inside the root's real path. `verbatim=True` (verl_config.yaml: verl must
run what the plan says) refuses text that would need masking instead of rewriting it.

Printing (`install`): sys.stdout and sys.stderr replaced by masking streams, once, by each entry point.
Standard library only: the SLURM job imports this on every node.
"""
from __future__ import annotations

import functools
import io
import json
import os
import re
import stat
import sys
from typing import Iterable, Optional

HIDDEN = "<hidden>"
MIN_SECRET = 8
# name segments that make a variable a secret: equal to one of WORDS, or containing one of PARTS
WORDS = frozenset({"token", "tokens", "secret", "secrets", "password", "passwords", "passwd", "pass", "pwd",
                   "passphrase", "key", "keys", "apikey", "credential", "credentials", "cred", "creds", "auth",
                   "authorization", "bearer", "cookie", "private", "privatekey", "jwt", "sas", "otp"})
PARTS = ("token", "secret", "passw", "apikey", "credential", "privatekey", "accesskey", "authkey")
# names that look secret by the rule and are known not to be
ALLOW = frozenset({"TOKENIZERS_PARALLELISM", "SSH_AUTH_SOCK", "KEYTIMEOUT", "GPG_AGENT_INFO", "PWD", "OLDPWD",
                   "XAUTHORITY", "KRB5CCNAME", "PASSWORD_STORE_DIR", "SSH_ASKPASS", "SUDO_ASKPASS", "GIT_ASKPASS",
                   "RAY_AUTH_MODE"})
TRIVIAL = frozenset({"", "0", "1", "true", "false", "none", "null", "yes", "no", "on", "off", "enabled", "disabled",
                     "required", "optional", "auto"})
URL_USERINFO = re.compile(r"(?i)([a-z][a-z0-9+.-]*://)([^/@\s'\"]+)@")
_SEGMENTS = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|[0-9]+")


class SecretRefused(ValueError):
    """Text that would need masking where it must be written verbatim."""


class UnsafePath(OSError):
    """A file the writer will not write: a link, or outside its root."""


@functools.lru_cache(maxsize=4096)
def is_secret_name(name: str) -> bool:
    """WANDB_API_KEY, HF_TOKEN, DB_PASS, OPENAI_KEY, Slack_Token, wandb_token, hfToken: yes.
    TOKENIZERS_PARALLELISM, PATH, CUDA_VISIBLE_DEVICES, RAY_AUTH_MODE: no."""
    if name.upper() in ALLOW:
        return False
    for seg in _SEGMENTS.findall(name):
        s = seg.lower()
        if s in WORDS or (any(p in s for p in PARTS) and not s.startswith("tokeniz")):
            return True
    return False


def secret_values(environ: Optional[dict] = None, extra_names: Iterable[str] = ()) -> dict:
    """value → the variable it comes from, for each secret variable (or one of extra_names) whose value can be
    masked (non-trivial, at least MIN_SECRET characters)."""
    environ = os.environ if environ is None else environ
    extra = set(extra_names)
    out = {}
    for name, v in environ.items():
        if v and len(v) >= MIN_SECRET and (name in extra or is_secret_name(name)) and v.strip().lower() not in TRIVIAL:
            out[v] = name
    return out


def short_secrets(environ: Optional[dict], names: Iterable[str]) -> list:
    """The variables among `names` set to a value too short to be masked (but not a trivial one)."""
    environ = os.environ if environ is None else environ
    return [n for n in names if environ.get(n) and len(environ[n]) < MIN_SECRET
            and environ[n].strip().lower() not in TRIVIAL]


# values typed on the command line for secret keys (hide): masked like the environment's
_TYPED: set = set()


def hide(values: Iterable[str]) -> None:
    """Mask these values too, from now on in this process (and the processes it forks): values given for secret
    keys on the command line. Those shorter than MIN_SECRET are hidden where their key is shown, not as text."""
    for v in values:
        if isinstance(v, str) and len(v) >= MIN_SECRET and v.strip().lower() not in TRIVIAL:
            _TYPED.add(v)


_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f\x80-\x9f]")


@functools.lru_cache(maxsize=1024)
def forms(value: str) -> tuple:
    """The value as each encoding the project writes or prints spells it: raw, JSON (ASCII or not), Python's repr
    (either quote), YAML's single and double quoting, and control characters shown as escapes (vrun.core.text,
    vrun.core.problems.show)."""
    out = {value, json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1], repr(value)[1:-1],
           value.replace("\\", "\\\\").replace("'", "\\'"), value.replace("\\", "\\\\").replace('"', '\\"'),
           value.replace("'", "''"), value.encode("unicode_escape").decode("ascii"),
           _CONTROL.sub(lambda m: m.group(0).encode("unicode_escape").decode("ascii"), value),
           _CONTROL.sub(lambda m: repr(m.group(0))[1:-1], value)}
    return tuple(sorted(out, key=len, reverse=True))


def mask(text: str, environ: Optional[dict] = None) -> str:
    """The text with every secret value (longest first, in each of its forms) and every URL's userinfo replaced
    by <hidden>."""
    if not text:
        return text
    values = set(secret_values(environ)) | _TYPED
    for f in sorted({f for v in values for f in forms(v)}, key=len, reverse=True):
        if f in text:
            text = text.replace(f, HIDDEN)
    if "://" in text:
        text = URL_USERINFO.sub(lambda m: m.group(1) + HIDDEN + "@", text)
    return text


def contained(path: str, root: str) -> bool:
    """Whether `path`'s directory is inside `root` on real paths, reached without a link below the root."""
    parent = os.path.dirname(os.path.abspath(path))
    real_root, real_parent = os.path.realpath(root), os.path.realpath(parent)
    if not (real_parent == real_root or real_parent.startswith(real_root.rstrip("/") + "/")):
        return False
    return os.path.relpath(parent, os.path.abspath(root)) == os.path.relpath(real_parent, real_root)


def _check(path: str, root: Optional[str]) -> None:
    if os.path.islink(path):
        raise UnsafePath(f"{path} is a symbolic link: refused (a run dir's files are never written through a link)")
    if root is not None and os.path.islink(root.rstrip("/") or "/"):
        raise UnsafePath(f"{root} is a symbolic link: refused (a run dir is a plain directory)")
    if root is not None and not contained(path, root):
        raise UnsafePath(f"{path} is outside {root} on its real path (a link in between): refused")


def write_text(path, text: str, *, root=None, verbatim: bool = False, mode: int = 0o644) -> None:
    """Write the file whole: masked (or refused when `verbatim` and it would need masking), never through a link."""
    path, root = os.fspath(path), (None if root is None else os.fspath(root))
    masked = mask(text)
    if verbatim and masked != text:
        raise SecretRefused(f"{os.path.basename(path)} would hold the value of a secret variable")
    _check(path, root)
    d = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(d, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), mode)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(masked)
        os.chmod(tmp, mode)
        os.replace(tmp, path)  # replaces a hard link's name, never writes through it
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def append_line(path, line: str, *, root=None) -> None:
    """Append one masked line (progress lines, the runs index); a link in the file's place is refused, and so is
    anything but a regular file (a FIFO is never waited on: UnsafePath, or the OS's ENXIO without a reader)."""
    path, root = os.fspath(path), (None if root is None else os.fspath(root))
    _check(path, root)
    # without blocking: a FIFO in the file's place with no reader fails to open (ENXIO) instead of waiting for one
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK, 0o644)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafePath(f"{path} is not a regular file: refused (a FIFO or a device is never written to)")
    with os.fdopen(fd, "a", encoding="utf-8") as f:
        f.write(mask(line.rstrip("\n")) + "\n")


class MaskingStream(io.TextIOBase):
    """A text stream that masks what is written to it before passing it on."""

    def __init__(self, inner):
        self._inner = inner

    def write(self, s: str) -> int:
        self._inner.write(mask(s))
        return len(s)

    def flush(self) -> None:
        self._inner.flush()

    def isatty(self) -> bool:
        return self._inner.isatty()

    def fileno(self) -> int:
        return self._inner.fileno()

    @property
    def encoding(self):
        return getattr(self._inner, "encoding", "utf-8")

    def __getattr__(self, name):
        return getattr(self._inner, name)


def install() -> None:
    """Every line this process prints on stdout and stderr, masked (idempotent)."""
    for name in ("stdout", "stderr"):
        s = getattr(sys, name)
        if not isinstance(s, MaskingStream):
            setattr(sys, name, MaskingStream(s))
