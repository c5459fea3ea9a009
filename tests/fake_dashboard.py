"""A tiny dashboard for the tests of what the project does with a dashboard's answers: it speaks the Job routes Ray's
dashboard serves (the installed Ray's dashboard/modules/job/job_head.py: version, packages, jobs, a job, its logs,
stop) and the shape routes (cluster metadata, node summary, cluster status), from a dict the test fills, and it can
misbehave on cue: drip its answer a byte every half second, accept and say nothing, answer malformed JSON, a body
past the reader's bound, or binary (as a Ray GCS port answers HTTP). Every request is recorded (method, path, body)."""
from __future__ import annotations

import json
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Dashboard:
    def __init__(self, host: str = "127.0.0.1", gpus_per_node: int = 8, nodes: int = 1):
        import ray

        self.jobs: dict = {}          # submission id -> job (status, message, metadata, start_time, end_time)
        self.logs: dict = {}          # submission id -> log text
        self.requests: list = []      # (method, path, body bytes)
        self.uploads: dict = {}       # package path -> bytes
        self.mode = "ok"              # ok | drip | silent | binary | huge | malformed:<kind> | http:<status>
        self.ray_version = ray.__version__
        self.nodes = [{"raylet": {"state": "ALIVE", "nodeId": f"n{i}", "nodeManagerAddress": "10.0.0.1",
                                  "resourcesTotal": {"GPU": gpus_per_node, "CPU": 8},
                                  "resourcesAvailable": {"GPU": gpus_per_node}}} for i in range(nodes)]
        dash = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _serve(self, method: str) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                dash.requests.append((method, self.path, body))
                dash.answer(self, method, self.path, body)

            def do_GET(self):
                self._serve("GET")

            def do_POST(self):
                self._serve("POST")

            def do_PUT(self):
                self._serve("PUT")

        family = socket.AF_INET6 if ":" in host else socket.AF_INET

        class Server(ThreadingHTTPServer):
            address_family = family
            daemon_threads = True

        self.server = Server((host, 0), Handler)
        port = self.server.server_address[1]
        self.url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    # ---------------------------------------------------------------- answers
    def routes(self, method: str, path: str, body: bytes):
        """(status, JSON-able answer or bytes) of the Job and shape routes."""
        p = path.split("?")[0]
        if p == "/api/version":
            return 200, {"version": "4", "ray_version": self.ray_version, "ray_commit": "0", "session_name": "s"}
        if p == "/api/v0/cluster_metadata":
            import platform

            return 200, {"data": {"rayVersion": self.ray_version, "pythonVersion": platform.python_version()}}
        if p == "/nodes":
            return 200, {"data": {"summary": self.nodes}}
        if p == "/api/cluster_status":
            return 404, b"no"
        if p.startswith("/api/packages/"):
            if method == "PUT":
                self.uploads[p] = body
                return 200, b""
            return (200, b"") if p in self.uploads else (404, b"Package does not exist")
        if p == "/api/jobs/" and method == "POST":
            req = json.loads(body)
            sid = req["submission_id"]
            self.jobs[sid] = {"submission_id": sid, "status": "PENDING", "message": "", "metadata": req["metadata"],
                              "entrypoint": req["entrypoint"], "runtime_env": req["runtime_env"],
                              "start_time": int(time.time() * 1000), "end_time": None}
            return 200, {"job_id": None, "submission_id": sid}
        if p == "/api/jobs/":
            return 200, list(self.jobs.values())
        m = re.fullmatch(r"/api/jobs/([^/]+)(/logs|/stop)?", p)
        if m:
            job = self.jobs.get(m.group(1))
            if job is None:
                return 404, f"Job {m.group(1)} does not exist".encode()
            if m.group(2) == "/logs":
                return 200, {"logs": self.logs.get(m.group(1), "")}
            if m.group(2) == "/stop":
                job["status"] = "STOPPED"
                return 200, {"stopped": True}
            return 200, job
        return 404, b"not found"

    def answer(self, h, method: str, path: str, body: bytes) -> None:
        mode = self.mode
        if mode == "silent":
            time.sleep(60)
            return
        if mode == "binary":
            h.wfile.write(b"\x00\x00\x18\x04\x00\x00\x00\x00\x00\x00\x04\x00\x40\x00\x00\x00\x05\x00\x40\x00")
            h.close_connection = True
            return
        status, data = self.routes(method, path, body)
        if mode.startswith("malformed:"):
            data = {"list": [1, 2], "text": b"<html>not json\x1b]52;c;aGk=\x07", "deep": b"[" * 100000,
                    "types": self._bad_types(data)}[mode.split(":", 1)[1]]
        elif mode.startswith("http:"):
            status, data = int(mode.split(":")[1]), b"Traceback ...\nValueError: boom \x1b[2J"
        raw = data if isinstance(data, bytes) else json.dumps(data).encode()
        if mode == "huge":  # 65 MiB of JSON: the status line at once, then the body a MiB at a time
            self._huge(h, status)
            return
        head = (f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {len(raw)}\r\n"
                "Connection: close\r\n\r\n").encode()
        if mode == "drip":
            for i in range(len(head + raw)):
                try:
                    h.wfile.write((head + raw)[i:i + 1])
                    h.wfile.flush()
                except OSError:
                    return
                time.sleep(0.5)
            return
        try:
            h.wfile.write(head + raw)
        except OSError:
            pass
        h.close_connection = True

    @staticmethod
    def _huge(h, status: int, mib: int = 65) -> None:
        chunk = b" " * (1 << 20)
        try:
            h.wfile.write((f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: "
                           f"{2 + mib * len(chunk)}\r\nConnection: close\r\n\r\n[").encode())
            h.wfile.flush()
            for _ in range(mib):
                h.wfile.write(chunk)
            h.wfile.write(b"]")
        except OSError:
            pass
        h.close_connection = True

    @staticmethod
    def _bad_types(data):
        if isinstance(data, list):
            return [{"submission_id": j.get("submission_id"), "status": 5, "metadata": "x"} for j in data] or ["x"]
        if isinstance(data, dict):
            return {k: [v] for k, v in data.items()}
        return data
