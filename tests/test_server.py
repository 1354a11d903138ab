"""The OpenAI-compatible server, run for real: uvicorn on 127.0.0.1 with a free port, in a thread,
serving the tiny Qwen3-MoE. Clients are httpx."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time

import httpx
import pytest

import rapidmoe_gguf as rm
from rapidmoe_gguf import cli, server as srv

MESSAGES = [{"role": "user", "content": "hello experts"}]


@pytest.fixture(scope="module")
def gguf(tiny_hf, tmp_path_factory):
    out = tmp_path_factory.mktemp("srv") / "m.gguf"
    rm.convert(tiny_hf("qwen3_moe"), out, recipe="q4k-q8", progress=False)
    return out


@contextlib.contextmanager
def running(model, keep_alive: float | None = None, **config):
    """Serves model in a thread with the uvicorn configuration ``rapidmoe serve`` uses (its protocol
    with the header and body time limits); ``keep_alive``: seconds an idle connection is kept
    (uvicorn's timeout_keep_alive; None: uvicorn's default). Yields the base URL and the server's
    state. Stops the server, then closes the model."""
    import uvicorn

    cfg = srv.ServerConfig(**config)
    app = srv.create_app(model, cfg)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    uconfig = srv.uvicorn_config(app, cfg, log_level="warning")
    uconfig.timeout_graceful_shutdown = 2
    if keep_alive is not None:
        uconfig.timeout_keep_alive = keep_alive
    server = uvicorn.Server(uconfig)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}", app.state.server
    finally:
        server.should_exit = True
        thread.join(10)
        model.close()


@pytest.fixture(scope="module")
def base(gguf):
    """Four slots, a queue of 16."""
    with running(rm.Model(gguf, n_ctx=256, n_threads=2), parallel=4, queue=16) as (url, _):
        yield url


@pytest.fixture
def endless(gguf):
    """One slot, a queue of one, and a model that never ends a reply by itself (no end-of-generation
    token), so a generation runs to max_tokens unless cancelled."""
    m = rm.Model(gguf, n_ctx=2048, n_threads=2)
    m.tokenizer.eog_ids = frozenset()
    with running(m, parallel=1, queue=1) as (url, state):
        yield url, state


def sse(lines) -> list:
    """The events of a server-sent stream: decoded JSON objects, and "[DONE]"."""
    events = []
    for line in lines:
        if line.startswith("data: "):
            data = line[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
        else:
            assert line == "", f"unexpected line {line!r}"
    return events


def _error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    return err


# ---------------------------------------------------------------------------------------------

def test_server_models_health_page(base):
    models = httpx.get(base + "/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == "m"
    assert httpx.get(base + "/v1/models/m").json()["id"] == "m"
    h = httpx.get(base + "/health").json()
    assert h["status"] == "ok" and h["slots_idle"] == 4
    page = httpx.get(base + "/")
    assert page.status_code == 200 and "/v1/chat/completions" in page.text
    assert page.headers["content-type"].startswith("text/html")


def test_server_completion_equals_python_api(base, gguf):
    kw = dict(max_tokens=12, temperature=0.9, seed=11, stop=["\n\n"])
    r = httpx.post(base + "/v1/completions", json={"prompt": "hello world", **kw}).json()
    with rm.Model(gguf, n_ctx=256, n_threads=2) as m:
        want = m.create_completion("hello world", **kw)
    assert r["object"] == "text_completion" and r["model"] == "m"
    assert r["choices"][0]["text"] == want["choices"][0]["text"]
    assert r["choices"][0]["finish_reason"] == want["choices"][0]["finish_reason"]
    assert r["usage"] == want["usage"]


def test_server_chat_stream_joins_to_the_whole_reply(base):
    body = {"model": "m", "messages": MESSAGES, "max_tokens": 16, "temperature": 1.0, "seed": 4}
    whole = httpx.post(base + "/v1/chat/completions", json=body).json()
    assert whole["object"] == "chat.completion" and whole["choices"][0]["message"]["role"] == "assistant"
    with httpx.stream("POST", base + "/v1/chat/completions",
                      json={**body, "stream": True, "stream_options": {"include_usage": True}}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        events = sse(r.iter_lines())
    assert events[-1] == "[DONE]"
    chunks, usage = events[:-2], events[-2]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == whole["choices"][0]["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == whole["choices"][0]["finish_reason"]
    details = usage["usage"].pop("prompt_tokens_details")
    whole["usage"].pop("prompt_tokens_details")
    assert usage["choices"] == [] and usage["usage"] == whole["usage"]
    # the same prompt again: the slot that read it keeps all of it but the last token
    assert details == {"cached_tokens": whole["usage"]["prompt_tokens"] - 1}


def test_server_concurrent_streams_match_single_runs(base):
    """16 streaming clients on 4 slots: each gets the text it gets alone, and /health answers
    throughout."""
    cases = [{"prompt": p, "seed": s, "max_tokens": 12, "temperature": 0.9}
             for p, s in [("hello", 1), ("The quick brown", 2), ("experts route", 3), ("0123", 4)]]
    alone = [httpx.post(base + "/v1/completions", json=c).json()["choices"][0]["text"] for c in cases]

    async def stream(client, case):
        async with client.stream("POST", "/v1/completions", json={**case, "stream": True}) as r:
            assert r.status_code == 200
            events = sse([line async for line in r.aiter_lines()])
        assert events[-1] == "[DONE]"
        return "".join(e["choices"][0]["text"] for e in events[:-1])

    async def main():
        async with httpx.AsyncClient(base_url=base, timeout=60) as client:
            jobs = asyncio.gather(*(stream(client, cases[i % 4]) for i in range(16)))
            healthy = []
            while not jobs.done():
                healthy.append((await client.get("/health")).json()["status"] == "ok")
                await asyncio.sleep(0.05)
            return await jobs, healthy

    texts, healthy = asyncio.run(main())
    assert texts == [alone[i % 4] for i in range(16)]
    assert healthy and all(healthy)
    assert httpx.get(base + "/health").json()["slots_idle"] == 4


def test_server_per_request_residual_policy(base):
    def residual_and_active():
        st = httpx.get(base + "/v1/rapidmoe/stats").json()
        return (sum(sum(layer["residual"]) for layer in st["layers"]),
                sum(sum(layer["activations"]) for layer in st["layers"]), st)

    r0, a0, st = residual_and_active()
    assert st["policy"] == "all" and st["n_layer"] == len(st["layers"]) == 2
    body = {"prompt": "hello", "max_tokens": 6, "temperature": 0}
    assert httpx.post(base + "/v1/completions", json={**body, "residual_policy": "none"}).status_code == 200
    r1, a1, _ = residual_and_active()
    assert a1 > a0 and r1 == r0                  # policy none: no residual anywhere
    assert httpx.post(base + "/v1/completions", json=body).status_code == 200
    r2, a2, st = residual_and_active()
    assert r2 - r1 == a2 - a1 > 0                # back to the server's policy, all
    assert 0 < st["residual_rate"] < 1 and st["requests"] >= 2
    err = _error(httpx.post(base + "/v1/completions", json={**body, "residual_policy": "umia"}), 400)
    assert "calibrat" in err["message"]          # the sidecar has no UMIA tables


BAD = [
    ("/v1/completions", b"{not json", {}, 400, None),
    ("/v1/completions", b"[1, 2]", {}, 400, None),
    ("/v1/completions", b'{"prompt": "x", "temperature": NaN}', {}, 400, None),
    ("/v1/completions", {"max_tokens": 4}, {}, 400, "prompt"),
    ("/v1/completions", {"prompt": 5}, {}, 400, "prompt"),
    ("/v1/completions", {"prompt": [1, "a"]}, {}, 400, "prompt"),
    ("/v1/completions", {"prompt": [99999]}, {}, 400, "prompt"),
    ("/v1/completions", {"prompt": ""}, {}, 400, "prompt"),
    ("/v1/completions", {"prompt": "x", "max_tokens": "4"}, {}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "max_tokens": -1}, {}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 10_000}, {}, 400, "prompt"),
    ("/v1/completions", {"prompt": "hello " * 400}, {}, 400, "prompt"),
    ("/v1/completions", {"prompt": "x", "n": 2}, {}, 400, "n"),
    ("/v1/completions", {"prompt": "x", "logprobs": 21}, {}, 400, "logprobs"),
    ("/v1/chat/completions", {"messages": MESSAGES, "tools": [{"type": "function"}]}, {}, 400, "tools"),
    ("/v1/completions", {"prompt": "x", "temperature": -1}, {}, 400, "temperature"),
    ("/v1/completions", {"prompt": "x", "top_p": 0}, {}, 400, "top_p"),
    ("/v1/completions", {"prompt": "x", "stream": "yes"}, {}, 400, "stream"),
    ("/v1/completions", {"prompt": "x", "stop": [1]}, {}, 400, "stop"),
    ("/v1/completions", {"prompt": "x", "seed": 2**70}, {}, 400, "seed"),
    ("/v1/completions", {"prompt": "x", "top_k": 2**70}, {}, 400, "top_k"),   # was a 500 (tools/soak_server.py)
    ("/v1/completions", {"prompt": "x", "model": "gpt-4"}, {}, 404, "model"),
    ("/v1/completions", {"prompt": "x", "residual_policy": "most"}, {}, 400, "residual_policy"),
    ("/v1/completions", {"prompt": "x", "residual_budget": 2}, {}, 400, "residual_budget"),
    ("/v1/chat/completions", {"messages": "hi"}, {}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]}, {}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x" * 2000}]}, {}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "stream": True, "n": 3}, {}, 400, "n"),
    ("/v1/completions", b'{"prompt": "' + b"a" * (1 << 20) + b'"}', {}, 413, None),
    ("/v1/nothing", {}, {}, 404, None),
]


def test_server_bad_requests_are_4xx_and_leak_nothing(base):
    with httpx.Client(base_url=base, timeout=30) as client:
        for path, body, headers, status, param in BAD:
            if isinstance(body, bytes):
                r = client.post(path, content=body, headers={"content-type": "application/json", **headers})
            else:
                r = client.post(path, json=body, headers=headers)
            err = _error(r, status)
            if param is not None:
                assert err["param"] == param, (path, body, err)
        assert _error(client.get("/v1/completions"), 405)["type"] == "invalid_request_error"
        # a body sent in chunks, without a length, is cut off at the limit too
        big = iter([b'{"prompt": "', b"a" * (1 << 20), b'"}'])
        _error(client.post("/v1/completions", content=big, headers={"content-type": "application/json"}), 413)

    async def good(client, i):
        r = await client.post("/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 4, "seed": i})
        return r.status_code

    async def main():
        async with httpx.AsyncClient(base_url=base, timeout=60) as client:
            return await asyncio.gather(*(good(client, i) for i in range(8)))

    assert asyncio.run(main()) == [200] * 8
    h = httpx.get(base + "/health").json()
    assert h["status"] == "ok" and h["slots_idle"] == 4 and h["requests_waiting"] == 0


def test_server_disconnect_frees_the_slot(endless):
    url, state = endless
    before = state.stats()
    with httpx.Client(base_url=url, timeout=30) as client:
        with client.stream("POST", "/v1/completions",
                           json={"prompt": "hello", "max_tokens": 2000, "stream": True, "temperature": 0.8}) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    break                        # one chunk, then hang up
    t0 = time.monotonic()
    r = httpx.post(url + "/v1/completions", json={"prompt": "hello", "max_tokens": 4}, timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
    assert time.monotonic() - t0 < 20
    after = state.stats()
    assert after["cancelled"] == before["cancelled"] + 1
    assert after["completion_tokens"] - before["completion_tokens"] - 4 < 2000   # stopped early


def test_server_full_queue_is_503_and_queued_clients_may_leave(endless):
    url, state = endless
    before = state.stats()
    body = {"prompt": "hello", "max_tokens": 2000, "temperature": 0.8}

    async def main():
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as running_:
                lines = running_.aiter_lines()  # held, not closed: closing it would hang up
                while not (await anext(lines)).startswith("data: "):
                    pass                         # the one slot is busy ...
                waiting = asyncio.create_task(client.post("/v1/completions", json=body))
                while (await client.get("/health")).json()["requests_waiting"] < 1:
                    await asyncio.sleep(0.02)    # ... and the one queue place taken
                full = await client.post("/v1/completions", json=body)
                waiting.cancel()                 # the queued client leaves ...
                with contextlib.suppress(asyncio.CancelledError):
                    await waiting
                while (await client.get("/health")).json()["requests_waiting"] > 0:
                    await asyncio.sleep(0.02)    # ... and its place in the queue is given up
            return full

    full = asyncio.run(main())
    err = _error(full, 503)
    assert err["type"] == "server_error" and err["code"] == "server_busy"
    deadline = time.monotonic() + 20
    while httpx.get(url + "/health").json()["slots_idle"] != 1:
        assert time.monotonic() < deadline, "the slot was not handed back"
        time.sleep(0.05)
    r = httpx.post(url + "/v1/completions", json={"prompt": "hello", "max_tokens": 3}, timeout=30)
    assert r.status_code == 200
    after = state.stats()     # the running stream stopped early, the queued one never ran
    assert after["completion_tokens"] - before["completion_tokens"] - 3 < 2000
    assert after["requests"] - before["requests"] == 2


def test_server_api_key(gguf):
    with running(rm.Model(gguf, n_ctx=128, n_threads=2), api_key="s3cret") as (url, _):
        assert _error(httpx.get(url + "/v1/models"), 401)["code"] == "invalid_api_key"
        _error(httpx.get(url + "/v1/models", headers={"Authorization": "Bearer wrong"}), 401)
        _error(httpx.post(url + "/v1/completions", json={"prompt": "x"}), 401)
        assert httpx.get(url + "/v1/models", headers={"Authorization": "Bearer s3cret"}).status_code == 200
        r = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 2},
                       headers={"Authorization": "Bearer s3cret"})
        assert r.status_code == 200
        assert httpx.get(url + "/health").status_code == 200          # open, by design


def test_server_cli_serve_arguments(gguf, monkeypatch, caplog):
    seen = {}
    monkeypatch.setattr(srv, "serve", lambda model, config, log_level: seen.update(config=config, ctx=model.n_ctx))
    rc = cli.main(["serve", str(gguf), "--port", "9999", "--parallel", "3", "--queue", "5", "--ctx", "128",
                   "--api-key", "k", "--gpu-mem", "8G", "--policy", "none"])
    assert rc == 0
    c = seen["config"]
    assert (c.host, c.port, c.parallel, c.queue, c.api_key, seen["ctx"]) == ("127.0.0.1", 9999, 3, 5, "k", 128)
    # --gpu-mem asks for the GPU; without one usable, the model says why and serves from the CPU
    assert any("running on the CPU" in r.message for r in caplog.records)
    assert cli.main(["serve", str(gguf), "--parallel", "0"]) == 1


def test_server_accepts_fields_that_ask_for_nothing(base):
    body = {"prompt": "x", "max_tokens": 2, "logprobs": None, "echo": False, "best_of": 1, "logit_bias": {},
            "presence_penalty": 0, "user": "someone", "stop": None, "seed": None}
    assert httpx.post(base + "/v1/completions", json=body).status_code == 200


def test_chat_template_kwargs_reach_the_template(gguf, tmp_path):
    """chat_template_kwargs are template variables (Qwen3's enable_thinking here): the Python API and
    the server render the template with them; a variable the renderer gives itself, a name that is
    not an identifier, or a value that is not an object is refused, naming chat_template_kwargs."""
    from rapidmoe_gguf import chat
    from conftest import CHAT_TEMPLATE, write_gguf_like

    template = CHAT_TEMPLATE + "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}"
    path = tmp_path / "t.gguf"
    write_gguf_like(gguf, path, kv={"tokenizer.chat_template": template})
    with rm.Model(path, n_ctx=256, n_threads=2) as m:
        plain = chat.chat_prompt(m, MESSAGES)
        off = chat.chat_prompt(m, MESSAGES, **chat.template_kwargs({"enable_thinking": False}))
        assert off[:len(plain)] == plain and m.detokenize(off[len(plain):]) == "<think>\n\n</think>\n\n"
        assert chat.chat_prompt(m, MESSAGES, **chat.template_kwargs({"enable_thinking": True})) == plain
        r = m.create_chat_completion(MESSAGES, max_tokens=2, temperature=0, chat_template_kwargs={"enable_thinking": False})
        assert r["usage"]["prompt_tokens"] == len(off)
        with pytest.raises(rm.InvalidArgumentError, match="given by the renderer itself"):
            m.create_chat_completion(MESSAGES, max_tokens=2, chat_template_kwargs={"messages": []})
    with running(rm.Model(path, n_ctx=256, n_threads=2), parallel=1) as (url, _):
        body = {"messages": MESSAGES, "max_tokens": 2, "temperature": 0}
        r = httpx.post(url + "/v1/chat/completions", json={**body, "chat_template_kwargs": {"enable_thinking": False}})
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == len(off)
        for bad in ({"1x": 1}, {"add_generation_prompt": False}, ["enable_thinking"]):
            r = httpx.post(url + "/v1/chat/completions", json={**body, "chat_template_kwargs": bad})
            assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template_kwargs", r.text
