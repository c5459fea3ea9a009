"""One bounded reader for every answer from outside: a dashboard's HTTP answer, a command's output (kubectl, squeue).

A request has one deadline for all of it — the connection, the request sent, every byte of the answer — enforced by
a timer that shuts the socket down when the deadline passes (a server dripping a byte every half second cannot hold
it past the deadline); the answer is read up to a size bound; the bytes are parsed and their shape checked before
any caller uses them. Every failure is a RemoteError that says, in words, where it asked and what came back:
refused, silent, slow, unreachable, not HTTP (a Ray GCS port answers an HTTP request with binary), an HTTP status,
malformed, too large. Text quoted from an answer is made terminal-safe (vrun.core.text.visible) and cut.

For any bytes (a command's stdout read by the caller): `decode`, `json_of`, `need`, `shown`. Standard library only.
"""
from __future__ import annotations

import json
import re
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Optional

from vrun.core.text import visible

# an answer larger than this is not read whole (a node summary of thousands of nodes is a few MB)
MAX_BYTES = 64 << 20
KINDS = ("address", "refused", "unreachable", "silent", "slow", "not_http", "http", "malformed", "too_large")


class RemoteError(Exception):
    """What came back from `source` (an address or a command), in words: kind is one of KINDS; status the HTTP
    status where there was one."""

    def __init__(self, source: str, kind: str, detail: str, status: Optional[int] = None):
        self.source, self.kind, self.detail, self.status = shown(source, 200), kind, shown(detail, 300), status
        super().__init__(f"{self.source} {self.detail}")


def shown(text: Any, limit: int = 300) -> str:
    """One terminal-safe line of `text` (controls made visible, newlines included), cut to `limit` characters."""
    s = visible(text if isinstance(text, str) else str(text))
    return s if len(s) <= limit else s[:limit - 1] + "…"


def decode(data: bytes, source: str, limit: int = MAX_BYTES) -> str:
    """Bytes from outside as text: at most `limit` bytes (RemoteError too_large past it), UTF-8 with undecodable
    bytes replaced."""
    if len(data) > limit:
        raise RemoteError(source, "too_large", f"answered more than {limit:,} bytes: not read")
    return data.decode("utf-8", errors="replace")


def json_of(data: bytes, source: str, expect: type = dict, limit: int = MAX_BYTES) -> Any:
    """Bytes from outside as JSON of the type `expect` (dict or list); RemoteError malformed otherwise, quoting the
    start of what came back."""
    text = decode(data, source, limit)
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        raise RemoteError(source, "malformed", f"answered what is not JSON ({shown(text.strip()[:80] or 'empty')!r})") \
            from None
    if not isinstance(value, expect):
        raise RemoteError(source, "malformed", f"answered a JSON {type(value).__name__} where a JSON "
                          f"{'object' if expect is dict else expect.__name__} belongs")
    return value


def need(obj: dict, key: str, types: tuple, source: str, optional: bool = False) -> Any:
    """obj[key] when it is one of `types` (bool is never a number); None when absent and `optional`; RemoteError
    malformed naming the key otherwise."""
    v = obj.get(key) if isinstance(obj, dict) else None
    if v is None and optional:
        return None
    if isinstance(v, bool) and bool not in types or not isinstance(v, types):
        raise RemoteError(source, "malformed", f"answered {key}={shown(v, 60)!r}, not a "
                          f"{'/'.join(t.__name__ for t in types)}")
    return v


# ==================================================================== addresses
HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")
URL = re.compile(r"(https?)://(\[[0-9A-Fa-f:.]{2,45}\]|[^/:\[\]@?#\s]+)(?::([0-9]{1,5}))?/?")


@dataclass(frozen=True)
class Url:
    scheme: str
    host: str      # an IPv6 address without its brackets
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"


def url_of(text: Any) -> Url:
    """`http(s)://host[:port][/]` (host: a name, an IPv4 or a bracketed IPv6 address) as a Url; ValueError saying
    why otherwise (a path, a query, credentials, a port outside 1–65535)."""
    import ipaddress

    m = URL.fullmatch(text) if isinstance(text, str) else None
    if not m:
        raise ValueError("not an http(s)://<host>:<port> address")
    scheme, host, port = m.group(1), m.group(2), m.group(3)
    if host.startswith("["):
        try:
            host = str(ipaddress.IPv6Address(host[1:-1]))
        except ValueError:
            raise ValueError(f"{host} is not an IPv6 address") from None
    elif not HOST.fullmatch(host) or len(host) > 253:
        raise ValueError(f"{shown(host, 60)!r} is not a host name or address")
    n = int(port) if port else (443 if scheme == "https" else 80)
    if not 0 < n < 65536:
        raise ValueError(f"port {n} is outside 1–65535")
    return Url(scheme, host, n)


# ==================================================================== HTTP
@dataclass
class Answer:
    status: int
    body: bytes
    source: str

    def json(self, expect: type = dict) -> Any:
        return json_of(self.body, self.source, expect)

    def text(self) -> str:
        return decode(self.body, self.source)


def request(base: str, path: str, timeout: float, method: str = "GET", body: Optional[bytes] = None,
            headers: Optional[dict] = None, limit: int = MAX_BYTES, ok: tuple = (200,)) -> Answer:
    """One HTTP request to `base` + `path`, all of it within `timeout` seconds; the answer read up to `limit` bytes.
    A status outside `ok` raises RemoteError http quoting the start of the body."""
    import http.client
    import ssl

    try:
        u = url_of(base.rstrip("/") if isinstance(base, str) else base)
    except ValueError as e:
        raise RemoteError(str(base), "address", f"is not a dashboard address: {e}") from None
    source = f"{u}{path.split('?')[0]}"
    deadline = time.monotonic() + timeout
    cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
    kw = {"context": ssl.create_default_context()} if u.scheme == "https" else {}
    conn = cls(u.host, u.port, timeout=timeout, **kw)
    timer = None
    state = {"sent": False, "answering": False, "got": 0, "expired": False}
    try:
        try:
            conn.connect()
        except ConnectionRefusedError:
            raise RemoteError(source, "refused", "refused the connection (nothing listens there)") from None
        except (socket.timeout, TimeoutError):
            raise RemoteError(source, "unreachable", f"did not accept a connection within {timeout:g} s") from None
        except OSError as e:
            raise RemoteError(source, "unreachable", f"cannot be reached ({e.strerror or type(e).__name__})") \
                from None

        def expire() -> None:
            state["expired"] = True
            try:
                conn.sock.shutdown(socket.SHUT_RDWR)
            except (OSError, AttributeError):
                pass

        timer = threading.Timer(max(deadline - time.monotonic(), 0.0), expire)
        timer.daemon = True
        timer.start()
        hdrs = {"Accept": "application/json", "Connection": "close", **(headers or {})}
        conn.request(method, path, body=body, headers=hdrs)
        state["sent"] = True
        resp = conn.getresponse()
        state["answering"] = True
        status = resp.status
        chunks, got = [], 0
        while True:
            chunk = resp.read1(1 << 20)
            if not chunk:
                break
            got += len(chunk)
            state["got"] = got
            if got > limit:
                raise RemoteError(source, "too_large", f"answered more than {limit:,} bytes: not read")
            chunks.append(chunk)
        if state["expired"]:
            raise _late(source, timeout, state)
        data = b"".join(chunks)
    except RemoteError:
        raise
    except http.client.RemoteDisconnected:
        if state["expired"]:
            raise _late(source, timeout, state) from None
        raise RemoteError(source, "not_http", "closed the connection without an HTTP answer") from None
    except http.client.BadStatusLine as e:
        if state["expired"]:
            raise _late(source, timeout, state) from None
        raise RemoteError(source, "not_http", f"answered what is not HTTP ({shown(repr(e.args[0] if e.args else ''), 60)})"
                          ) from None
    except (OSError, http.client.HTTPException, ValueError) as e:
        if state["expired"] or isinstance(e, (socket.timeout, TimeoutError)):
            raise _late(source, timeout, state) from None
        raise RemoteError(source, "slow" if state["sent"] else "unreachable",
                          f"broke off the answer ({type(e).__name__})") from None
    finally:
        if timer is not None:
            timer.cancel()
        conn.close()
    if status not in ok:
        text = data.decode("utf-8", errors="replace").strip()
        raise RemoteError(source, "http", f"answered HTTP {status}" + (f": {shown(text.splitlines()[-1], 160)}"
                                                                       if text else ""), status=status)
    return Answer(status, data, source)


def _late(source: str, timeout: float, state: dict) -> RemoteError:
    if state["answering"]:
        return RemoteError(source, "slow", f"began answering but did not finish within {timeout:g} s "
                           f"({state['got']:,} bytes of its body read)")
    return RemoteError(source, "silent", f"accepted the connection but sent no answer within {timeout:g} s (not even "
                       "its status line)")


# ==================================================================== commands
def command(argv: list, timeout: float, limit: int = MAX_BYTES, env: Optional[dict] = None) -> tuple:
    """(returncode, stdout bytes, stderr bytes) of a command run for at most `timeout` seconds (killed past it:
    RemoteError slow), each stream read up to `limit` bytes (too_large past it, the command killed); a command that
    cannot start: RemoteError unreachable."""
    import selectors
    import subprocess

    source = " ".join(str(a) for a in argv[:3])
    try:
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env=env, start_new_session=True)
    except OSError as e:
        raise RemoteError(source, "unreachable", f"cannot be run here ({e.strerror or type(e).__name__})") from None
    deadline = time.monotonic() + timeout
    out = {p.stdout: [], p.stderr: []}
    sizes = {p.stdout: 0, p.stderr: 0}
    sel = selectors.DefaultSelector()
    for f in out:
        sel.register(f, selectors.EVENT_READ)
    try:
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                raise RemoteError(source, "slow", f"did not finish within {timeout:g} s (stopped)")
            for key, _ in sel.select(min(left, 1.0)):
                chunk = key.fileobj.read1(1 << 16)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                sizes[key.fileobj] += len(chunk)
                if sizes[key.fileobj] > limit:
                    raise RemoteError(source, "too_large", f"printed more than {limit:,} bytes (stopped)")
                out[key.fileobj].append(chunk)
        rc = p.wait(max(deadline - time.monotonic(), 0.1))
    except subprocess.TimeoutExpired:
        raise RemoteError(source, "slow", f"did not finish within {timeout:g} s (stopped)") from None
    finally:
        sel.close()
        if p.poll() is None:
            p.kill()
            p.wait()
        for f in out:
            f.close()
    return rc, b"".join(out[p.stdout]), b"".join(out[p.stderr])
