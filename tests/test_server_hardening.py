"""The server against hostile input: every bad request answered 4xx on a connection that stays
open, admission before any work, bounded chat templates, requests from other web pages refused,
and API keys that cannot be mistaken. The servers are real (uvicorn on a local port)."""

from __future__ import annotations

import http.client
import json
import os
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
