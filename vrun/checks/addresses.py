"""Addresses and ports as their readers take them: `[scheme://]host:port` (a host name or an IP address, IPv6 in
brackets), a TCP port in 1..65535, and cluster.ray.address on each cluster (cluster=ray: the dashboard's Job
Submission API; elsewhere ray.init's address), a Ray head's default port given for another of its services a
warning.
"""
from __future__ import annotations

import re
from typing import Optional

from vrun.checks.paths import short as _short
from vrun.core.problems import Problem


# host:port as Ray and its dashboard take it: a host name (letters, digits, . _ -, not starting with -) or an IP
# address, IPv6 in brackets ([::1], [fe80::1%eth0]); the port is checked apart (1..65535)
HOST_PORT = re.compile(r"^(?:(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://)?(?P<host>\[[^\]/\s]+\]|[A-Za-z0-9_][A-Za-z0-9._-]*)"
                       r":(?P<port>[0-9]{1,5})(?P<slash>/?)$")


# the ports a Ray head listens on by default (ray start --head): its GCS, its Ray client server, its dashboard
RAY_GCS_PORT, RAY_CLIENT_PORT, RAY_DASHBOARD_PORT = 6379, 10001, 8265


MAX_PORT = 65535


def host_port(text, schemes: tuple) -> tuple[Optional[tuple], str]:
    """((scheme, host, port), "") for `[scheme://]host:port` with a scheme among `schemes` ("" for none), or
    (None, why not): a host that is neither a name nor an IP address, a port outside 1..65535."""
    import ipaddress

    m = HOST_PORT.match(text) if isinstance(text, str) else None
    if m is None:
        return None, "not [scheme://]host:port"
    scheme, host, port = (m.group("scheme") or "").lower(), m.group("host"), int(m.group("port"))
    if scheme not in schemes:
        return None, f"the scheme {scheme or '(none)'} is not one of {', '.join(s or '(none)' for s in schemes)}"
    if m.group("slash") and scheme not in ("http", "https"):
        return None, "a trailing / after the port"
    if host.startswith("["):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return None, f"{host} is not an IPv6 address"
    if not 1 <= port <= MAX_PORT:
        return None, f"port {port} is not a TCP port (1..{MAX_PORT})"
    return (scheme, host, port), ""


def port_problems(key: str, v) -> list[Problem]:
    """A TCP port: an integer in 1..65535 (0 asks the OS for any port: nothing could be told where to reach it)."""
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_PORT:
        return [Problem(key, v, f"not a TCP port (an integer in 1..{MAX_PORT})", f"{key}=29500")]
    return []


def address_problems(c, slurm: bool, sft: bool) -> list[Problem]:
    """cluster.ray.address as the cluster's reader takes it: cluster=ray the dashboard ([http[s]://]host:port or
    auto); elsewhere ray.init's address (local, auto or [ray://]host:port). A port Ray uses by default for
    something else is a warning: the GCS's (6379) or the client's (10001) given as the dashboard, the dashboard's
    (8265) given to ray.init."""
    key, a = "cluster.ray.address", c.ray.address
    if str(c.name) == "ray":
        parsed, why = (None, "") if a == "auto" else host_port(a, ("", "http", "https"))
        if a != "auto" and parsed is None:
            return [Problem(key, _short(a), f"cluster=ray submits to a running cluster's dashboard ('auto': "
                            f"RAY_ADDRESS): {why}", "cluster.ray.address=http://<head>:8265 (or auto with RAY_ADDRESS "
                            "set)")]
        if parsed is not None and parsed[2] in (RAY_GCS_PORT, RAY_CLIENT_PORT):
            return [Problem(key, _short(a), f"port {parsed[2]} is where a Ray head's "
                            f"{'GCS' if parsed[2] == RAY_GCS_PORT else 'client server'} listens by default; its Job "
                            f"Submission API is the dashboard's, {RAY_DASHBOARD_PORT} by default",
                            f"cluster.ray.address=http://{parsed[1]}:{RAY_DASHBOARD_PORT}", warning=True)]
        return []
    if a in ("local", "auto"):
        if slurm and a == "local" and not sft:  # SFT: warned as unread
            return [Problem(key, "local", "cluster=slurm brings up one Ray cluster over the job's nodes; 'local' "
                            "would start a separate one-node instance on the head",
                            "cluster.ray.address=auto (the default for cluster=slurm)")]
        return []
    parsed, why = host_port(a, ("", "ray"))
    if parsed is None:
        return [Problem(key, _short(a), f"Ray joins 'local' (a fresh instance), 'auto' (the running one) or "
                        f"host:port: {why}", "cluster.ray.address=local|auto|<host>:<port>")]
    if parsed[2] == RAY_DASHBOARD_PORT and parsed[0] != "ray":
        return [Problem(key, _short(a), f"port {RAY_DASHBOARD_PORT} is a Ray head's dashboard by default; ray.init "
                        f"joins its GCS ({RAY_GCS_PORT} by default)", f"cluster.ray.address={parsed[1]}:{RAY_GCS_PORT}",
                        warning=True)]
    return []
