"""The server against hostile input: every bad request answered 4xx on a connection that stays
open, admission before any work, bounded chat templates, requests from other web pages refused,
and API keys that cannot be mistaken. The servers are real (uvicorn on a local port)."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import threading
import time

import httpx
import pytest

import rapidmoe_gguf as rm
from rapidmoe_gguf import chat, cli, server as srv
from test_server import BAD, MESSAGES, _error, gguf, running  # noqa: F401  (gguf is a fixture)

# Templates from a hostile model file. Each must end in a 400 within the render limits, never a
# 500, a hung thread or gigabytes of memory.
HOSTILE_TEMPLATES = {
    "range": "{% for i in range(10**6) %}{% endfor %}",
    "repeat": "{{ 'a' * 10**9 }}",
    "list repeat": "{{ ([1] * 10**9)|length }}",
    "power": "{{ 10 ** (10 ** 8) }}",
    "doubling": "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "adding": "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "replace": "{{ ('a' * 3000)|replace('a', 'b' * 3000) }}",
    "str replace": "{{ ('a' * 3000).replace('a', 'b' * 3000) }}",
    "join": "{{ ('b' * 3000).join(range(3000)|map('string')) }}",
    "center": "{{ 'a'|center(10**9) }}",
    "ljust": "{{ 'a'.ljust(10**9) }}",
    "percent": "{{ '%0999999999d' % 1 }}",
    "format": "{{ '{:>999999999}'.format(1) }}",
    "batch": "{{ [1]|batch(10**9, 0)|list|length }}",
    "indent": "{{ ('a\n' * 2000)|indent(2000) }}",
    "nested loops": "{% for i in range(4000) %}{% for j in range(4000) %}{% endfor %}{% endfor %}",
    "recursion": "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60) }}",
    "zero division": "{{ 1 / 0 }}",
    "not a string": 5,
}
LIMITS = dict(max_chars=4096, timeout=0.3)


@pytest.mark.parametrize("name", [k for k, v in HOSTILE_TEMPLATES.items() if isinstance(v, str)])
def test_chat_template_limits_stop_hostile_templates(name):
    t0 = time.monotonic()
    with pytest.raises(rm.InvalidArgumentError, match="chat template"):
        chat.render(HOSTILE_TEMPLATES[name], MESSAGES, **LIMITS)
    assert time.monotonic() - t0 < 3


def test_chat_template_limits_leave_real_templates_alone(gguf):
    with rm.Model(gguf, n_ctx=256, n_threads=2) as m:
        template = m.tokenizer.chat_template
    want = chat.render(template, MESSAGES)
    assert chat.render(template, MESSAGES, **LIMITS) == want
    with pytest.raises(rm.InvalidArgumentError, match="4096"):
        chat.render(template, [{"role": "user", "content": "x" * 5000}], **LIMITS)


@pytest.fixture(scope="module")
def hardened(gguf):
    """Two slots, a queue of two, small prompt and template limits; yields (url, model)."""
    m = rm.Model(gguf, n_ctx=256, n_threads=2)
    with running(m, parallel=2, queue=2, max_prompt_chars=4096, template_timeout=0.3) as (url, _):
        yield url, m


def _deep(n: int) -> bytes:
    return b'{"prompt": ' + b"[" * n + b"]" * n + b"}"


# (method, path, body (dict: JSON; bytes: raw), extra headers, the status wanted)
MORE_BAD = [
    ("POST", "/v1/completions", _deep(20000), {}, 400),
    ("POST", "/v1/chat/completions", b'{"messages": ' + b"{\"a\": " * 5000 + b"1" + b"}" * 5000 + b"}", {}, 400),
    ("POST", "/v1/completions", b'{"prompt": "x", "max_tokens": ' + b"[" * 990 + b"]" * 990 + b"}", {}, 400),
    ("POST", "/v1/completions", {"prompt": "x", "top_k": 2**40}, {}, 400),
    ("POST", "/v1/completions", {"prompt": "x", "top_k": -2**40}, {}, 400),
    ("POST", "/v1/completions", b'{"prompt": "x", "temperature": 1e999}', {}, 400),
    ("POST", "/v1/completions", b'{"prompt": "x", "repeat_penalty": 1e300}', {}, 400),
    ("POST", "/v1/completions", {"prompt": "x", "max_tokens": 2**70}, {}, 400),
    ("POST", "/v1/completions", {"prompt": "x" * 5000}, {}, 400),
    ("POST", "/v1/completions", {"prompt": [1] * 300}, {}, 400),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 5000}]}, {}, 400),
    ("POST", "/v1/completions", b'{"prompt": "x"}', {"Content-Type": "text/plain"}, 415),
    ("POST", "/v1/completions", b'{"prompt": "x"}', {"Content-Type": "application/x-www-form-urlencoded"}, 415),
    ("POST", "/v1/completions", {"prompt": "x"}, {"Host": "rebound.example"}, 421),
    ("GET", "/v1/models", None, {"Host": "rebound.example:8080"}, 421),
    ("GET", "/v1/completions", None, {}, 405),
]


def _request(conn: http.client.HTTPConnection, method, path, body, headers):
    headers = dict(headers)
    if isinstance(body, dict):
        body = json.dumps(body).encode()
    if body is not None:
        headers.setdefault("Content-Type", "application/json")
    conn.request(method, path, body=body, headers=headers)
    r = conn.getresponse()
    return r.status, r.read(), r


def test_server_bad_requests_keep_the_connection(hardened):
    """Every bad kind, the hostile templates, and an internal error, over one keep-alive
    connection; then a good request on the same connection."""
    url, model = hardened
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.connect()
    sock = conn.sock

    def check(method, path, body, headers, status, what):
        got, data, r = _request(conn, method, path, body, headers)
        assert got == status, (what, got, data[:300])
        err = json.loads(data)["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["message"]
        assert conn.sock is sock and r.getheader("connection") != "close", f"{what}: the connection was dropped"
        return err

    for path, body, headers, status, param in BAD:
        err = check("POST", path, body, headers, status, (path, str(body)[:60]))
        if param is not None:
            assert err["param"] == param
    for method, path, body, headers, status in MORE_BAD:
        check(method, path, body, headers, status, (method, path, str(body)[:60], headers))

    template = model.tokenizer.chat_template
    try:
        for name, hostile in HOSTILE_TEMPLATES.items():
            model.tokenizer.chat_template = hostile
            t0 = time.monotonic()
            err = check("POST", "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2}, {}, 400, name)
            assert "chat template" in err["message"] and time.monotonic() - t0 < 5, name
    finally:
        model.tokenizer.chat_template = template

    # an internal error is a 500 that says nothing about its cause
    secret = os.path.dirname(model.path) + ": secret detail"

    def broken(*args, **kwargs):
        raise RuntimeError(secret)

    model.tokenize = broken
    try:
        err = check("POST", "/v1/completions", {"prompt": "hello"}, {}, 500, "internal error")
    finally:
        del model.tokenize
    assert "secret" not in json.dumps(err) and "RuntimeError" not in json.dumps(err)
    assert err["type"] == "server_error"

    # greedy: a sampled reply of the tiny random model ends at once (0 tokens) in about 2% of draws
    status, data, _ = _request(conn, "POST", "/v1/chat/completions",
                               {"messages": MESSAGES, "max_tokens": 3, "temperature": 0}, {})
    assert status == 200 and json.loads(data)["usage"]["completion_tokens"] >= 1
    assert conn.sock is sock
    conn.close()


def test_server_admission_before_work(gguf):
    """A request the queue cannot take is refused before its prompt is tokenized or rendered;
    an oversized prompt is refused before it is tokenized."""
    m = rm.Model(gguf, n_ctx=2048, n_threads=2)
    m.tokenizer.eog_ids = frozenset()                  # generations run to max_tokens
    calls = []
    tokenize = m.tokenize

    def counted(*args, **kwargs):
        calls.append(1)
        return tokenize(*args, **kwargs)

    m.tokenize = counted
    with running(m, parallel=1, queue=0, max_prompt_chars=1000) as (url, _):
        with httpx.Client(base_url=url, timeout=30) as client:
            n = len(calls)
            _error(client.post("/v1/completions", json={"prompt": "y" * 1001}), 400)
            _error(client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "y" * 1001}]}),
                   400)
            assert len(calls) == n
            with client.stream("POST", "/v1/completions",
                               json={"prompt": "hello", "max_tokens": 1500, "stream": True}) as r:
                lines = r.iter_lines()
                while not next(lines).startswith("data: "):
                    pass                               # the one slot is busy, and there is no queue
                n = len(calls)
                assert _error(client.post("/v1/completions", json={"prompt": "hello there"}), 503)["code"] == \
                    "server_busy"
                _error(client.post("/v1/chat/completions", json={"messages": MESSAGES}), 503)
                assert len(calls) == n


def test_server_refuses_requests_from_other_pages(hardened):
    url, _ = hardened
    port = url.rsplit(":", 1)[1]
    before = httpx.get(url + "/v1/rapidmoe/stats").json()["requests"]
    # a "simple" cross-origin POST, which a browser sends without asking
    r = httpx.post(url + "/v1/completions", content=b'{"prompt": "x", "max_tokens": 2}',
                   headers={"Content-Type": "text/plain", "Origin": "http://evil.example"})
    assert _error(r, 415)["code"] == "unsupported_media_type"
    assert "access-control-allow-origin" not in r.headers
    assert httpx.get(url + "/v1/rapidmoe/stats").json()["requests"] == before       # nothing generated
    # DNS rebinding: the right address under another name
    for path in ("/v1/models", "/health", "/"):
        assert _error(httpx.get(url + path, headers={"Host": f"evil.example:{port}"}), 421)["code"] == "invalid_host"
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", "localhost", f"[::1]:{port}", f"LOCALHOST:{port}"):
        assert httpx.get(url + "/v1/models", headers={"Host": host}).status_code == 200, host
    # CORS is off: no preflight succeeds, no answer is shared
    pre = httpx.options(url + "/v1/completions", headers={"Origin": "http://evil.example",
                                                           "Access-Control-Request-Method": "POST"})
    assert pre.status_code >= 400 and "access-control-allow-origin" not in pre.headers
    got = httpx.get(url + "/v1/models", headers={"Origin": "http://evil.example"})
    assert got.status_code == 200 and "access-control-allow-origin" not in got.headers


def test_server_allowed_hosts_and_cors_origins(gguf):
    app_origin = "http://app.example:3000"
    with running(rm.Model(gguf, n_ctx=128, n_threads=2), allowed_hosts=["box.lan"],
                 cors_origins=[app_origin]) as (url, _):
        port = url.rsplit(":", 1)[1]
        assert httpx.get(url + "/v1/models", headers={"Host": f"box.lan:{port}"}).status_code == 200
        _error(httpx.get(url + "/v1/models", headers={"Host": f"other.lan:{port}"}), 421)
        pre = httpx.options(url + "/v1/chat/completions",
                            headers={"Origin": app_origin, "Access-Control-Request-Method": "POST",
                                     "Access-Control-Request-Headers": "authorization, content-type"})
        assert pre.status_code == 200 and pre.headers["access-control-allow-origin"] == app_origin
        r = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}, headers={"Origin": app_origin})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == app_origin
        other = httpx.options(url + "/v1/chat/completions",
                              headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})
        assert other.status_code >= 400 and "access-control-allow-origin" not in other.headers


@pytest.mark.parametrize("key", ["", " ", " key", "key ", "k\tey", "kéy", "key\n"])
def test_server_api_key_must_be_plain_ascii(gguf, key):
    with rm.Model(gguf, n_ctx=128, n_threads=2) as m:
        with pytest.raises(rm.InvalidArgumentError, match="API key"):
            srv.create_app(m, srv.ServerConfig(api_key=key))


def test_server_cli_refuses_an_empty_api_key(gguf, monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(srv, "serve", lambda *args, **kwargs: seen.append(args))
    monkeypatch.setenv("RAPIDMOE_API_KEY", "")
    assert cli.main(["serve", str(gguf)]) == 1
    assert "RAPIDMOE_API_KEY" in capsys.readouterr().err and not seen
    monkeypatch.setenv("RAPIDMOE_API_KEY", "s3cret ")
    assert cli.main(["serve", str(gguf)]) == 1 and not seen


def test_server_cli_hardening_options(gguf, monkeypatch):
    seen = {}
    monkeypatch.setattr(srv, "serve", lambda model, config, log_level: seen.update(config=config))
    monkeypatch.delenv("RAPIDMOE_API_KEY", raising=False)
    assert cli.main(["serve", str(gguf), "--ctx", "128", "--allowed-host", "box.lan", "--allowed-host", "me.lan",
                     "--cors-origin", "http://app.example", "--max-prompt-chars", "5000",
                     "--template-timeout", "0.5"]) == 0
    c = seen["config"]
    assert c.allowed_hosts == ["box.lan", "me.lan"] and c.cors_origins == ["http://app.example"]
    assert (c.max_prompt_chars, c.template_timeout, c.api_key) == (5000, 0.5, None)
    assert cli.main(["serve", str(gguf), "--ctx", "128"]) == 0
    c = seen["config"]
    assert c.allowed_hosts == [] and c.cors_origins == [] and c.max_prompt_chars is None


def test_web_page_keeps_the_key_for_the_session_only():
    from importlib import resources

    page = resources.files("rapidmoe_gguf").joinpath("web_chat.html").read_text(encoding="utf-8")
    assert "localStorage" not in page and "sessionStorage" in page


def test_server_stats_reveal_no_paths(hardened):
    url, model = hardened
    folder = os.path.dirname(os.path.abspath(model.path))
    for path in ("/v1/rapidmoe/stats", "/v1/models", "/health"):
        text = httpx.get(url + path).text
        assert folder not in text and folder.replace("/", "\\/") not in text, path
    st = httpx.get(url + "/v1/rapidmoe/stats").json()
    assert st["residual_sidecar"] in (None, os.path.basename(model.residual_path or ""))


# ---------------------------------------------------------------------------------------------
# Lone surrogates: legal JSON escapes ("\ud800") that are not Unicode text

# (path, raw body, the param the 400 must name)
SURROGATES = [
    ("/v1/completions", rb'{"model": "x", "prompt": "a\ud800b"}', "prompt"),
    ("/v1/completions", rb'{"prompt": "\udfff"}', "prompt"),
    ("/v1/completions", rb'{"prompt": ["ok", "a\udc00"]}', "prompt[1]"),
    ("/v1/completions", rb'{"model": "\ud800", "prompt": "x"}', "model"),
    ("/v1/completions", rb'{"prompt": "x", "stop": ["\n", "\udbff"]}', "stop[1]"),
    ("/v1/completions", rb'{"prompt": "x", "user": "\ud800"}', "user"),               # a field not used
    ("/v1/completions", rb'{"prompt": "x", "a\ud800": 1}', "a\\ud800"),             # in a key
    ("/v1/chat/completions", rb'{"messages": [{"role": "user", "content": "a\ud800"}]}', "messages[0].content"),
    ("/v1/chat/completions", rb'{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": '
                             rb'[{"type": "text", "text": "\udfff"}]}]}', "messages[1].content[0].text"),
    ("/v1/chat/completions", rb'{"model": "\udfff", "messages": [{"role": "user", "content": "x"}]}', "model"),
]


def test_server_lone_surrogates_are_400(hardened):
    """Each answered 400 naming the field, on the same connection; a surrogate pair (an emoji
    escaped as JSON escapes it) is text and is served."""
    url, _ = hardened
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.connect()
    sock = conn.sock
    for path, body, param in SURROGATES:
        status, data, r = _request(conn, "POST", path, body, {})
        assert status == 400, (body, status, data[:300])
        err = json.loads(data)["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["code"] == "invalid_unicode", body
        assert err["param"] == param and "surrogate" in err["message"], (body, err)
        assert conn.sock is sock and r.getheader("connection") != "close", body
    status, data, _ = _request(conn, "POST", "/v1/completions", rb'{"prompt": "\ud83d\ude00", "max_tokens": 1}', {})
    assert status == 200, data[:300]
    conn.close()


def test_api_error_with_a_surrogate_still_renders():
    """An error that echoes a user string cannot fail while it is encoded (it was a second error, a 500)."""
    err = srv.ApiError(404, "the model 'a\ud800' does not exist", param="m\udfff")
    body = json.loads(err.response().body)["error"]
    assert body["message"] == "the model 'a\\ud800' does not exist" and body["param"] == "m\\udfff"


def test_parse_request_refuses_lone_surrogates(gguf):
    with rm.Model(gguf, n_ctx=128, n_threads=2) as m:
        with pytest.raises(srv.ApiError) as e:
            srv.parse_request("chat", {"messages": [{"role": "user", "content": "\ud800"}]}, m, None)
        assert (e.value.status, e.value.param) == (400, "messages[0].content")
        assert srv.parse_request("completion", {"prompt": "\U0001F600 ok"}, m, None).prompt_ids


# ---------------------------------------------------------------------------------------------
# Slow clients: the head and the body of a request must arrive in time

@contextlib.contextmanager
def serving(model, keep_alive: float = 5, **config):
    """test_server.running (the uvicorn configuration ``rapidmoe serve`` uses) with ``keep_alive``
    seconds for an idle connection; yields (host, port)."""
    with running(model, keep_alive=keep_alive, **config) as (url, _):
        host, port = url.removeprefix("http://").rsplit(":", 1)
        yield host, int(port)


def _closed_within(sock: socket.socket, seconds: float, trickle: bytes = b"") -> tuple[float, bytes] | None:
    """Waits for the server to close ``sock``, sending one byte of ``trickle`` every 0.25 s
    meanwhile (a slowloris); returns (seconds it took, what the server sent), or None if the
    connection is still open after ``seconds``."""
    t0, got = time.monotonic(), b""
    sock.settimeout(0.25)
    while time.monotonic() - t0 < seconds:
        try:
            data = sock.recv(65536)
        except socket.timeout:
            if trickle:
                try:
                    sock.sendall(trickle[:1])
                except (BrokenPipeError, ConnectionResetError):
                    return time.monotonic() - t0, got
                trickle = trickle[1:]
            continue
        except ConnectionResetError:
            return time.monotonic() - t0, got
        if not data:
            return time.monotonic() - t0, got
        got += data
    return None


def _connect(addr) -> socket.socket:
    return socket.create_connection(addr, timeout=5)


def test_server_closes_slow_request_heads(gguf):
    """A head that trickles in, one that stops midway, a connection that sends nothing and a second
    request on a kept-alive connection that trickles: each closed after the header time limit
    (408 where part of a head came), while other connections are served meanwhile."""
    with serving(rm.Model(gguf, n_ctx=128, n_threads=2), header_timeout=1, body_timeout=1) as addr:
        slow_head = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 200
        trickling, stopped, silent, kept = (_connect(addr) for _ in range(4))
        trickling.sendall(slow_head[:10])
        stopped.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        kept.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        kept.settimeout(5)
        assert kept.recv(65536).startswith(b"HTTP/1.1 200")
        kept.sendall(slow_head[:10])
        # served meanwhile, on a new connection
        assert httpx.get(f"http://{addr[0]}:{addr[1]}/health").status_code == 200
        for name, sock, trickle in [("trickling", trickling, slow_head[10:]), ("stopped", stopped, b""),
                                    ("silent", silent, b""), ("kept alive", kept, slow_head[10:])]:
            closed = _closed_within(sock, 6, trickle)
            assert closed is not None, f"{name}: the connection is still open"
            seconds, got = closed
            assert seconds < 5, (name, seconds)
            if name == "silent":
                assert got == b"", got                  # nothing to answer: it asked nothing
            else:
                head, _, body = got.partition(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 408"), (name, got[:300])
                assert json.loads(body)["error"]["code"] == "request_timeout", (name, body)
            sock.close()
        assert httpx.get(f"http://{addr[0]}:{addr[1]}/health").status_code == 200


def test_server_times_out_slow_request_bodies(gguf):
    """A body that stops midway gets 408 (OpenAI's error object) and the connection is closed; a
    body nobody reads (sent to a route that answers without it) is cut off after the time limit,
    and one that ends after its answer leaves an idle connection, closed after the keep-alive
    time (uvicorn's own protocols keep that one for ever); a body that comes in time is served."""
    with serving(rm.Model(gguf, n_ctx=128, n_threads=2), keep_alive=1, header_timeout=1, body_timeout=1) as addr:
        head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                f"Content-Length: 100\r\n\r\n").encode()
        stopped, unread = _connect(addr), _connect(addr)
        stopped.sendall(head + b'{"prompt": "he')
        unread.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n\r\n{")
        t0 = time.monotonic()
        closed = _closed_within(stopped, 6, b"llo world" * 10)
        assert closed is not None, "the connection is still open"
        seconds, got = closed
        head_got, _, body = got.partition(b"\r\n\r\n")
        assert head_got.startswith(b"HTTP/1.1 408") and b"connection: close" in head_got.lower(), got[:300]
        err = json.loads(body)["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["code"] == "request_timeout", err
        assert seconds < 4, seconds
        closed = _closed_within(unread, 6 - (time.monotonic() - t0), b"x" * 99)
        assert closed is not None and closed[1].startswith(b"HTTP/1.1 200"), closed
        r = httpx.post(f"http://{addr[0]}:{addr[1]}/v1/completions", json={"prompt": "hello", "max_tokens": 2})
        assert r.status_code == 200, r.text
        ended = _connect(addr)
        ended.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 3\r\n\r\n{")
        assert ended.recv(65536).startswith(b"HTTP/1.1 200")
        ended.sendall(b"}}")              # the body ends after its answer, within the keep-alive time
        closed = _closed_within(ended, 4)
        assert closed is not None and closed[1] == b"", closed


def test_server_time_limits_can_be_off(gguf):
    with rm.Model(gguf, n_ctx=128, n_threads=2) as m:
        for bad in ({"header_timeout": 0}, {"body_timeout": -1}, {"header_timeout": float("nan")}):
            with pytest.raises(rm.InvalidArgumentError, match="timeout"):
                srv.create_app(m, srv.ServerConfig(**bad))
    with serving(rm.Model(gguf, n_ctx=128, n_threads=2), header_timeout=None, body_timeout=None) as addr:
        sock = _connect(addr)
        sock.sendall(b"GET /health HTTP/1.1\r\n")
        assert _closed_within(sock, 2) is None           # no limit: still open
        sock.sendall(b"Host: 127.0.0.1\r\n\r\n")
        sock.settimeout(5)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        sock.close()


def test_server_cli_time_limit_options(gguf, monkeypatch):
    seen = {}
    monkeypatch.setattr(srv, "serve", lambda model, config, log_level: seen.update(config=config))
    monkeypatch.delenv("RAPIDMOE_API_KEY", raising=False)
    assert cli.main(["serve", str(gguf), "--ctx", "128"]) == 0
    assert (seen["config"].header_timeout, seen["config"].body_timeout) == (10.0, 30.0)
    assert cli.main(["serve", str(gguf), "--ctx", "128", "--header-timeout", "2.5", "--body-timeout", "0"]) == 0
    assert (seen["config"].header_timeout, seen["config"].body_timeout) == (2.5, None)
    assert cli.main(["serve", str(gguf), "--ctx", "128", "--body-timeout", "-1"]) == 1


@pytest.mark.parametrize("status, cls, http", [
    ("RM_E_INTERNAL", "InternalError", 500), ("RM_E_CUDA", "DeviceError", 500), ("RM_E_OOM", "OutOfMemoryError", 500),
    ("RM_E_STATE", "StateError", 500), ("RM_E_INVALID_ARG", "InvalidArgumentError", 400),
    ("RM_E_FORMAT", "FormatError", 400), ("RM_E_CONTEXT_FULL", "ContextFullError", 400)])
def test_server_native_errors_answer_by_whose_fault(status, cls, http):
    """A native status becomes its exception in the package's tree (RM_E_OOM a MemoryError too),
    and the server answers a fault of its own, its device or its memory with a 500, the
    caller's with a 400."""
    from rapidmoe_gguf import _native, errors
    from rapidmoe_gguf.server import api_error

    with pytest.raises(errors.RapidMoEError) as e:
        _native.check(getattr(_native.lib, status))
    assert type(e.value) is getattr(errors, cls) and e.value.status == status
    assert isinstance(e.value, MemoryError) == (status == "RM_E_OOM")
    assert api_error(e.value).status == http


def test_server_scheduler_faults_and_shutdown_are_not_the_callers(gguf):
    """A failed scheduler step is a 500 (InternalError), a request met by shutdown a 503, a slot
    that does not exist a 400."""
    from rapidmoe_gguf import errors
    from rapidmoe_gguf.scheduler import Scheduler
    from rapidmoe_gguf.server import api_error

    assert api_error(errors.InternalError("internal error in the scheduler")).status == 500
    assert api_error(errors.UnavailableError("the server is shutting down")).status == 503
    with rm.Model(gguf, n_ctx=128, n_threads=1) as m:
        s = Scheduler([m], "tiny")
        try:
            with pytest.raises(errors.InvalidArgumentError, match="no slot 3"):
                s.slot_task(3, lambda model: None).result(timeout=5)
        finally:
            s.close()
