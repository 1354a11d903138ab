"""Soak test of ``rapidmoe serve``: many requests of every kind at once, for a bounded time.

    python tools/soak_server.py [--duration S] [--max-requests N] [--clients C] [--url URL]

Without --url it starts ``rapidmoe serve`` on the bundled model (with its residual sidecar) on a
free port, from the source tree when the tree holds a built library (tools/dev_build.sh), else
from the installed package, and stops it at the end. C client threads then send, until S seconds
or N requests have passed, a random mix of:

  valid      completions and chat completions, plain and streamed (server-sent events read to
             [DONE]), with random prompts, lengths, temperatures and seeds;
  disconnect a stream dropped after a few events, or a request dropped before its answer (the
             socket is reset, as a client that dies does);
  bad        malformed JSON, wrong types, out-of-range values, bodies over the size limit, a wrong
             method or path, a non-JSON content type, a foreign Host header.

Valid requests send ``Content-Type: application/json`` and ``Host: 127.0.0.1:PORT``. A valid
request must get 200 (or 503 "server_busy" when every slot and queue place is taken) and a
complete answer; a bad one must get a 4xx (a non-JSON content type or a foreign Host may also be
served). Afterwards /health must show every slot idle and nothing waiting, and a last request must
still be served. The server's resident memory (RSS) is read after the model is loaded, after a
warm-up, every second of the run (the highest of each quarter is reported: a leak keeps climbing,
an allocator's working set levels off) and at the end; with --rss-every N also after every N
requests answered, as a curve of (requests, MiB); --valid-only sends valid requests alone.

Exit status 1 on any unexpected 5xx, connection reset or truncated answer, a client timeout, a
bad request answered 2xx, a slot not freed, or an error logged by the server (when it was started
here); 0 otherwise. The figures are printed as a table, and as JSON with --json FILE.
"""

from __future__ import annotations

import argparse
import collections
import http.client
import json
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORDS = ("the quick brown fox jumps over a lazy dog while seven small birds sing about rivers, "
         "mountains and old stories of the sea").split()


# ---------------------------------------------------------------------------------------------
# The server
# ---------------------------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_kib(pid: int | None) -> int | None:
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class Started:
    """``rapidmoe serve`` in a child process, its output in a log file."""

    def __init__(self, args: argparse.Namespace):
        self.port = free_port()
        self.log = tempfile.NamedTemporaryFile("w+", prefix="rapidmoe-soak-", suffix=".log", delete=False)
        env = dict(os.environ)
        in_tree = os.path.exists(os.path.join(ROOT, "rapidmoe_gguf", "librapidmoe.so"))
        if in_tree:
            env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
        cmd = [sys.executable, "-m", "rapidmoe_gguf.cli", "serve", "--port", str(self.port),
               "--parallel", str(args.parallel), "--queue", str(args.queue), "--ctx", str(args.ctx),
               "--threads", str(args.threads)]
        if args.model:
            cmd.insert(4, args.model)
        self.where = "the source tree" if in_tree else "the installed package"
        self.cmd = cmd
        # cwd: a neutral folder, so that `-m` finds the package PYTHONPATH names, or the installed one
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                     cwd=tempfile.gettempdir())
        self.pid = self.proc.pid

    def wait_ready(self, timeout: float) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise SystemExit(f"soak: the server exited with status {self.proc.returncode}:\n{self.output()}")
            try:
                status, _, _ = request("127.0.0.1", self.port, "GET", "/health", timeout=2)
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise SystemExit(f"soak: the server did not answer /health within {timeout:.0f} s:\n{self.output()}")

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def output(self) -> str:
        self.log.flush()
        with open(self.log.name, errors="replace") as f:
            return f.read()


# ---------------------------------------------------------------------------------------------
# HTTP, by hand where a client must misbehave
# ---------------------------------------------------------------------------------------------

def request(host: str, port: int, method: str, path: str, body: bytes | None = None,
            headers: dict | None = None, timeout: float = 120) -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, dict(resp.getheaders()), resp.read()
    finally:
        conn.close()


def reset_close(sock: socket.socket) -> None:
    """Closes with a TCP reset (SO_LINGER 0), as a killed client does."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()


class Client:
    """One client thread's requests; outcomes are counted in shared counters."""

    def __init__(self, soak: "Soak", rng: random.Random):
        self.soak, self.rng = soak, rng
        self.host, self.port = soak.host, soak.port
        self.json_headers = {"Content-Type": "application/json", "Host": f"{self.host}:{self.port}"}

    # -- valid requests ---------------------------------------------------------------------------

    def prompt(self) -> str:
        return " ".join(self.rng.choice(WORDS) for _ in range(self.rng.randint(1, 12)))

    def body(self, kind: str, stream: bool) -> dict:
        r = self.rng
        b = {"max_tokens": r.randint(1, 24), "temperature": r.choice([0, 0.7, 1.0]), "seed": r.randint(0, 2**31),
             "stream": stream}
        if r.random() < 0.3:
            b.update(top_k=r.randint(1, 50), top_p=r.uniform(0.5, 1.0), min_p=r.uniform(0, 0.2),
                     repeat_penalty=r.uniform(1.0, 1.3))
        if r.random() < 0.2:
            b["residual_policy"] = r.choice(["none", "all", "umia"])
        if stream and r.random() < 0.5:
            b["stream_options"] = {"include_usage": True}
        if kind == "chat":
            b["messages"] = [{"role": "user", "content": self.prompt()}]
        else:
            b["prompt"] = self.prompt()
        return b

    def valid(self, kind: str, stream: bool) -> None:
        path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
        name = f"{kind}{'-stream' if stream else ''}"
        body = json.dumps(self.body(kind, stream)).encode()
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.soak.timeout)
        try:
            conn.request("POST", path, body=body, headers=self.json_headers)
            resp = conn.getresponse()
            data = resp.read()
        except (ConnectionError, http.client.RemoteDisconnected, http.client.IncompleteRead) as exc:
            return self.soak.fail(name, "reset", f"{type(exc).__name__}: {exc}")
        except socket.timeout:
            return self.soak.fail(name, "timeout", f"no answer in {self.soak.timeout} s")
        finally:
            conn.close()
        if resp.status == 503 and b"server_busy" in data:
            return self.soak.count(name, "busy")
        if resp.status >= 500:
            return self.soak.fail(name, "5xx", f"{resp.status}: {data[:300]!r}")
        if resp.status != 200:
            return self.soak.fail(name, "refused", f"{resp.status}: {data[:300]!r}")
        try:
            if stream:
                events = [line[6:] for line in data.decode().split("\n") if line.startswith("data: ")]
                if not events or events[-1] != "[DONE]":
                    return self.soak.fail(name, "truncated", f"the stream ends with {events[-1:]!r}")
                for e in events[:-1]:
                    if "error" in json.loads(e):
                        return self.soak.fail(name, "error-event", e[:300])
            else:
                choice = json.loads(data)["choices"][0]
                assert "text" in choice or "message" in choice
        except (ValueError, KeyError, AssertionError, IndexError) as exc:
            return self.soak.fail(name, "bad-answer", f"{type(exc).__name__}: {data[:300]!r}")
        self.soak.count(name, "ok")

    # -- clients that leave -----------------------------------------------------------------------

    def disconnect(self) -> None:
        """A stream read for a few events, or a plain request, then the socket reset."""
        r = self.rng
        kind = r.choice(["completion", "chat"])
        stream = r.random() < 0.7
        name = f"disconnect-{'stream' if stream else 'plain'}"
        b = self.body(kind, stream)
        b["max_tokens"] = r.randint(16, 64)
        body = json.dumps(b).encode()
        path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
        head = (f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n").encode()
        sock = socket.create_connection((self.host, self.port), timeout=self.soak.timeout)
        try:
            sock.sendall(head + body)
            if stream:
                want, got = r.randint(1, 6), b""
                while got.count(b"data: ") < want and b"[DONE]" not in got:
                    chunk = sock.recv(4096)
                    if not chunk:
                        break
                    got += chunk
                if got and not got.startswith(b"HTTP/1.1 200") and not got.startswith(b"HTTP/1.1 503"):
                    return self.soak.fail(name, "refused", repr(got[:200]))
            else:
                time.sleep(r.uniform(0, 0.3))
        except (ConnectionError, socket.timeout) as exc:
            return self.soak.fail(name, "reset", f"{type(exc).__name__}: {exc}")
        finally:
            reset_close(sock)
        self.soak.count(name, "ok")

    # -- bad requests -----------------------------------------------------------------------------

    BAD_JSON = [b"", b"{", b'{"prompt": "x",}', b"[1, 2", b'{"prompt": NaN}', b'{"prompt": Infinity}',
                b"\xff\xfe\x00garbage", b"null", b"42", b'"a string"', b"[]", b'{"prompt": "\\ud800"}' + b"\x80"]
    BAD_FIELDS = [
        {"prompt": 5}, {"prompt": None}, {"prompt": []}, {"prompt": [1.5]}, {"prompt": ["a", "b"]},
        {"prompt": [-1]}, {"prompt": [10**12]}, {"prompt": "x", "max_tokens": "ten"},
        {"prompt": "x", "max_tokens": -1}, {"prompt": "x", "max_tokens": 10**9}, {"prompt": "x", "max_tokens": 1.5},
        {"prompt": "x", "stream": "yes"}, {"prompt": "x", "temperature": -1}, {"prompt": "x", "temperature": []},
        {"prompt": "x", "temperature": 1e308}, {"prompt": "x", "top_p": 2}, {"prompt": "x", "top_p": -0.5},
        {"prompt": "x", "top_k": -5}, {"prompt": "x", "top_k": 2**70}, {"prompt": "x", "min_p": 7},
        {"prompt": "x", "repeat_penalty": 0}, {"prompt": "x", "repeat_penalty": -3}, {"prompt": "x", "seed": 2**70},
        {"prompt": "x", "seed": "s"}, {"prompt": "x", "n": 2}, {"prompt": "x", "stop": 7},
        {"prompt": "x", "stop": [""]}, {"prompt": "x", "stop": ["a"] * 100}, {"prompt": "x", "logprobs": 21},
        {"prompt": "x", "residual_policy": "bogus"}, {"prompt": "x", "residual_budget": 3},
        {"prompt": "x", "residual_budget": "half"}, {"prompt": "x", "model": "no-such-model"},
        {"prompt": "x", "stream_options": 1}, {"prompt": "x", "presence_penalty": 1},
        {"prompt": "word " * 5000},
    ]
    BAD_CHAT = [
        {"messages": "hi"}, {"messages": []}, {"messages": [1]}, {"messages": [{"role": "user"}]},
        {"messages": [{"role": "user", "content": 5}]}, {"messages": [{"role": 7, "content": "x"}]},
        {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, {"prompt": "no messages"},
    ]

    def bad(self) -> None:
        r = self.rng
        what = r.choice(["json", "fields", "chat", "huge", "huge-chunked", "method", "path", "content-type", "host"])
        path = "/v1/completions"
        headers = dict(self.json_headers)
        allow_2xx = False
        if what == "json":
            body = r.choice(self.BAD_JSON)
        elif what == "fields":
            body = json.dumps(r.choice(self.BAD_FIELDS)).encode()
        elif what == "chat":
            path, body = "/v1/chat/completions", json.dumps(r.choice(self.BAD_CHAT)).encode()
        elif what in ("huge", "huge-chunked"):
            return self.huge(chunked=what == "huge-chunked")
        elif what == "method":
            return self.expect_4xx(what, "GET", r.choice(["/v1/completions", "/v1/chat/completions"]), None, headers)
        elif what == "path":
            return self.expect_4xx(what, "POST", r.choice(["/v1/nothing", "/v2/completions", "/v1/completions/x"]),
                                   b"{}", headers)
        elif what == "content-type":   # a valid body: served, or refused with 415
            headers["Content-Type"] = r.choice(["text/plain", "application/x-www-form-urlencoded", "image/png"])
            body, allow_2xx = json.dumps({"prompt": self.prompt(), "max_tokens": 2}).encode(), True
        else:                          # a foreign Host (DNS rebinding): served, or refused
            headers["Host"] = r.choice(["evil.example", "evil.example:80", "127.0.0.1.evil.example"])
            body, allow_2xx = json.dumps({"prompt": self.prompt(), "max_tokens": 2}).encode(), True
        self.expect_4xx(what, "POST", path, body, headers, allow_2xx)

    def expect_4xx(self, what: str, method: str, path: str, body: bytes | None, headers: dict,
                   allow_2xx: bool = False) -> None:
        name = f"bad-{what}"
        try:
            status, _, data = request(self.host, self.port, method, path, body, headers, timeout=self.soak.timeout)
        except (ConnectionError, http.client.RemoteDisconnected, http.client.IncompleteRead) as exc:
            return self.soak.fail(name, "reset", f"{type(exc).__name__}: {exc}")
        except socket.timeout:
            return self.soak.fail(name, "timeout", f"no answer in {self.soak.timeout} s")
        if status >= 500 and not (status == 503 and b"server_busy" in data):
            return self.soak.fail(name, "5xx", f"{status} for {body[:80] if body else body!r}: {data[:300]!r}")
        if 200 <= status < 300 and not allow_2xx:
            return self.soak.fail(name, "accepted", f"{status} for {body[:80] if body else body!r}")
        self.soak.count(name, str(status))

    def huge(self, chunked: bool) -> None:
        """A body over the server's limit (1 MiB), declared or chunked; sent until refused."""
        name = f"bad-huge{'-chunked' if chunked else ''}"
        size = self.rng.choice([1 << 20 | 1, 2 << 20, 8 << 20])
        filler = b'{"prompt": "' + b"a" * (size - 14) + b'"}'
        head = f"POST /v1/completions HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
        head += "Transfer-Encoding: chunked\r\n\r\n" if chunked else f"Content-Length: {len(filler)}\r\n\r\n"
        sock = socket.create_connection((self.host, self.port), timeout=self.soak.timeout)
        sent_all = True
        try:
            sock.sendall(head.encode())
            try:
                for i in range(0, len(filler), 65536):
                    piece = filler[i:i + 65536]
                    sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
                if chunked:
                    sock.sendall(b"0\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                sent_all = False       # the server answered and closed before the whole body: allowed
            got = b""
            try:
                while b"\r\n\r\n" not in got:
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    got += chunk
            except ConnectionResetError:
                pass
        except socket.timeout:
            return self.soak.fail(name, "timeout", f"no answer in {self.soak.timeout} s")
        finally:
            sock.close()
        status = int(got.split(b" ", 2)[1]) if got.startswith(b"HTTP/1.1 ") else None
        if status is None:
            if sent_all:
                return self.soak.fail(name, "reset", "no status line after the whole body was sent")
            return self.soak.count(name, "closed-early")
        if status >= 500:
            return self.soak.fail(name, "5xx", repr(got[:300]))
        if status < 400:
            return self.soak.fail(name, "accepted", f"{status} for a body of {size} bytes")
        self.soak.count(name, str(status))


# ---------------------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------------------

class Soak:
    def __init__(self, args: argparse.Namespace, host: str, port: int):
        self.args, self.host, self.port = args, host, port
        self.timeout = args.timeout
        self.lock = threading.Lock()
        self.outcomes: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.failures: list[str] = []
        self.n_sent = 0
        self.stop_at = 0.0
        self.n_done = 0
        self.rss_curve: list[tuple[int, int]] = []   # (requests answered, RSS KiB) every --rss-every
        self.pid: int | None = None

    def _done(self) -> None:
        """Counts an answered request (the lock held); samples RSS every --rss-every of them."""
        self.n_done += 1
        every = self.args.rss_every
        if every and self.n_done % every == 0:
            kib = rss_kib(self.pid)
            if kib is not None:
                self.rss_curve.append((self.n_done, kib))

    def count(self, name: str, outcome: str) -> None:
        with self.lock:
            self.outcomes[name][outcome] += 1
            self._done()

    def fail(self, name: str, outcome: str, detail: str) -> None:
        with self.lock:
            self.outcomes[name][outcome] += 1
            self._done()
            if len(self.failures) < 50:
                self.failures.append(f"{name}: {outcome}: {detail}")

    def take(self) -> bool:
        with self.lock:
            if time.monotonic() >= self.stop_at or self.n_sent >= self.args.max_requests:
                return False
            self.n_sent += 1
            return True

    def client(self, seed: int) -> None:
        c = Client(self, random.Random(seed))
        mix = [("valid", 1.0)] if self.args.valid_only else [("valid", 0.55), ("disconnect", 0.2), ("bad", 0.25)]
        while self.take():
            pick = c.rng.choices([m for m, _ in mix], [w for _, w in mix])[0]
            try:
                if pick == "valid":
                    c.valid(c.rng.choice(["completion", "chat"]), c.rng.random() < 0.5)
                elif pick == "disconnect":
                    c.disconnect()
                else:
                    c.bad()
            except OSError as exc:      # connect refused, ...: the server is gone or not answering
                self.fail(pick, "os-error", f"{type(exc).__name__}: {exc}")

    def run(self, duration: float) -> float:
        self.stop_at = time.monotonic() + duration
        t0 = time.monotonic()
        threads = [threading.Thread(target=self.client, args=(self.args.seed * 1000 + i,), daemon=True)
                   for i in range(self.args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.monotonic() - t0


def quarters(samples: list[int]) -> list[int]:
    """The highest sample of each quarter of the run (fewer with fewer samples)."""
    n = len(samples)
    return [max(samples[i * n // 4:(i + 1) * n // 4]) for i in range(4) if (i + 1) * n // 4 > i * n // 4]


def get_json(host: str, port: int, path: str) -> dict:
    status, _, data = request(host, port, "GET", path, headers={"Host": f"{host}:{port}"}, timeout=30)
    if status != 200:
        raise RuntimeError(f"GET {path}: {status} {data[:200]!r}")
    return json.loads(data)


def wait_idle(host: str, port: int, timeout: float) -> dict:
    """/health once every slot is idle and nothing waits, or the last answer after timeout."""
    end = time.monotonic() + timeout
    while True:
        h = get_json(host, port, "/health")
        if (h.get("slots_processing") == 0 and h.get("requests_waiting") == 0) or time.monotonic() > end:
            return h
        time.sleep(0.25)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--duration", type=float, default=30, help="seconds of load (default: %(default)s)")
    p.add_argument("--max-requests", type=int, default=5000, help="at most this many requests (default: %(default)s)")
    p.add_argument("--clients", type=int, default=6, help="concurrent client threads (default: %(default)s)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--timeout", type=float, default=120, help="seconds a client waits for an answer")
    p.add_argument("--url", help="soak this running server (http://HOST:PORT) instead of starting one")
    p.add_argument("--pid", type=int, help="with --url: the server's process id, for its RSS")
    p.add_argument("--model", help="model to serve (default: the bundled model)")
    p.add_argument("--parallel", type=int, default=2, help="slots of the started server (default: %(default)s)")
    p.add_argument("--queue", type=int, default=16, help="queue of the started server (default: %(default)s)")
    p.add_argument("--ctx", type=int, default=512, help="context of the started server (default: %(default)s)")
    p.add_argument("--threads", type=int, default=1, help="CPU threads of the started server (default: %(default)s)")
    p.add_argument("--valid-only", action="store_true", help="send valid requests only (e.g. to measure RSS)")
    p.add_argument("--rss-every", type=int, default=0, metavar="N",
                   help="also sample the server's RSS after every N requests answered")
    p.add_argument("--json", help="write the figures to this file as JSON")
    args = p.parse_args(argv)

    started = None
    if args.url:
        hostport = args.url.split("://", 1)[-1].rstrip("/")
        host, _, port_s = hostport.rpartition(":")
        host, port, pid = host, int(port_s), args.pid
    else:
        started = Started(args)
        host, port, pid = "127.0.0.1", started.port, started.pid
        print(f"soak: starting the server from {started.where}: {' '.join(started.cmd)}", file=sys.stderr)
        started.wait_ready(timeout=180)
    failures: list[str] = []
    try:
        rss_loaded = rss_kib(pid)
        warm = Soak(args, host, port)                  # a few valid requests, so RSS is measured warm
        warm.args = argparse.Namespace(**{**vars(args), "max_requests": 2 * args.clients})
        c = Client(warm, random.Random(0))
        for kind in ("completion", "chat"):
            for stream in (False, True):
                c.valid(kind, stream)
        failures += [f"warm-up: {f}" for f in warm.failures]
        rss_before = rss_kib(pid)

        soak = Soak(args, host, port)
        soak.pid = pid
        samples: list[int] = []                        # RSS every second of the run, to tell growth from a plateau
        done = threading.Event()

        def sample() -> None:
            while not done.wait(1.0):
                kib = rss_kib(pid)
                if kib is not None:
                    samples.append(kib)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        elapsed = soak.run(args.duration)
        done.set()
        sampler.join()
        health = wait_idle(host, port, timeout=60)
        leaked = health.get("slots_processing") != 0 or health.get("requests_waiting") != 0
        stats = get_json(host, port, "/v1/rapidmoe/stats")
        after = Soak(args, host, port)                 # the server still serves
        Client(after, random.Random(1)).valid("completion", False)
        rss_after = rss_kib(pid)
        failures += soak.failures + [f"after the run: {f}" for f in after.failures]
        if leaked:
            failures.append(f"slots not freed 60 s after the run: /health = {health}")
    finally:
        log = ""
        if started is not None:
            rc = started.stop()
            log = started.output()
            if rc not in (0, -signal.SIGINT):
                failures.append(f"the server exited with status {rc}")
    log_errors = [line for line in log.splitlines() if "Traceback" in line or "ERROR" in line
                  or "Exception in ASGI" in line]
    failures += [f"server log: {line}" for line in log_errors[:20]]

    n = sum(sum(c.values()) for c in soak.outcomes.values())
    report = {
        "requests": n, "seconds": round(elapsed, 1), "clients": args.clients,
        "outcomes": {k: dict(v) for k, v in sorted(soak.outcomes.items())},
        "health_after": health, "slots_leaked": leaked,
        "server_counts": {k: stats.get(k) for k in ("requests", "cancelled", "errors", "prompt_tokens",
                                                      "completion_tokens")},
        "rss_kib": {"loaded": rss_loaded, "warm": rss_before, "after": rss_after,
                    "max_by_quarter": quarters(samples), "by_requests": soak.rss_curve},
        "failures": failures,
    }
    print(f"soak: {n} requests in {elapsed:.1f} s from {args.clients} clients")
    for name, c in sorted(soak.outcomes.items()):
        print(f"  {name:26s} " + ", ".join(f"{k} {v}" for k, v in sorted(c.items())))
    print(f"  server counted: {report['server_counts']}")
    print(f"  /health after: {health}")
    if pid is not None:
        growth = (rss_after - rss_before) / 1024 if rss_after and rss_before else float("nan")
        print(f"  server RSS: {rss_loaded / 1024:.0f} MiB loaded, {rss_before / 1024:.0f} MiB warm, "
              f"{rss_after / 1024:.0f} MiB after ({growth:+.1f} MiB); the highest of each quarter of the run: "
              + ", ".join(f"{q / 1024:.0f}" for q in quarters(samples)) + " MiB")
        if soak.rss_curve:
            print("  server RSS by requests answered: "
                  + ", ".join(f"{n}: {kib / 1024:.1f}" for n, kib in soak.rss_curve) + " MiB")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    if failures:
        print(f"soak: FAILED ({len(failures)} problems):", file=sys.stderr)
        for f in failures[:50]:
            print(f"  {f}", file=sys.stderr)
        return 1
    print("soak: ok (no unexpected 5xx, reset, truncated answer or leaked slot)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
