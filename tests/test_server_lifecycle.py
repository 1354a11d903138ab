"""The server's metrics (GET /metrics, Prometheus text), its drain on SIGTERM (a real signal to a
real `serve` in a child process), and the model names it accepts (--alias, --any-model)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import httpx
import pytest

import rapidmoe_gguf as rm
from rapidmoe_gguf import cli, metrics, server as srv
from test_server import MESSAGES, _error, gguf, running, sse  # noqa: F401  (gguf is a fixture)


def scrape(url: str) -> dict:
    """GET /metrics as {(name, labels...): value}, read by prometheus_client's own parser."""
    from prometheus_client.parser import text_string_to_metric_families

    r = httpx.get(url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out[(s.name, *sorted(s.labels.items()))] = s.value
    return out


def test_server_metrics_count_what_was_served(gguf):
    pytest.importorskip("prometheus_client")
    bodies = [{"prompt": "hello world", "max_tokens": 7, "temperature": 0},
              {"prompt": "experts route", "max_tokens": 5, "temperature": 0, "stream": True},
              {"prompt": "hello world again", "max_tokens": 4, "temperature": 0}]
    with running(rm.Model(gguf, n_ctx=256, n_threads=2, cache_type_k="q8_0", cache_type_v="f16"), parallel=2,
                 queue=4) as (url, state):
        empty = scrape(url)
        assert empty[("rapidmoe_requests_total", ("status", "ok"))] == 0
        assert empty[("rapidmoe_kv_cache_capacity_tokens",)] == 2 * 256
        info = state.slots[0].info          # two slots of 256 positions: K in Q8_0 (34 bytes a block
        row = info["n_head_kv"] * info["head_dim"]   # of 32), V in F16, every layer
        want = 2 * info["n_layer"] * 256 * (row // 32 * 34 + 2 * row)
        assert empty[("rapidmoe_kv_cache_bytes", ("type_k", "q8_0"), ("type_v", "f16"))] == want
        usage = []
        for body in bodies:
            r = httpx.post(url + "/v1/completions", json={**body, "stream_options": {"include_usage": True}},
                           timeout=30)
            assert r.status_code == 200
            usage.append(sse(r.text.splitlines())[-2]["usage"] if body.get("stream") else r.json()["usage"])
        _error(httpx.post(url + "/v1/completions", json={"prompt": "x", "top_p": 0}), 400)
        _error(httpx.post(url + "/v1/completions", json={"prompt": "x", "model": "nope"}), 404)
        got = scrape(url)
        stats = httpx.get(url + "/v1/rapidmoe/stats").json()
    gen = sum(u["completion_tokens"] for u in usage)
    assert got[("rapidmoe_requests_total", ("status", "ok"))] == 3
    assert got[("rapidmoe_requests_total", ("status", "invalid"))] == 2
    assert got[("rapidmoe_requests_total", ("status", "busy"))] == 0
    assert got[("rapidmoe_prompt_tokens_total",)] == sum(u["prompt_tokens"] for u in usage) == stats["prompt_tokens"]
    assert got[("rapidmoe_generated_tokens_total",)] == gen == stats["completion_tokens"]
    assert 0 < got[("rapidmoe_prompt_tokens_evaluated_total",)] <= got[("rapidmoe_prompt_tokens_total",)]
    started = sum(u["completion_tokens"] > 0 for u in usage)
    assert got[("rapidmoe_time_to_first_token_seconds_count",)] == started
    assert got[("rapidmoe_inter_token_latency_seconds_count",)] == gen - started
    assert got[("rapidmoe_inter_token_latency_seconds_bucket", ("le", "+Inf"))] == gen - started
    assert got[("rapidmoe_queue_depth",)] == 0 and got[("rapidmoe_running_sequences",)] == 0
    assert 0 < got[("rapidmoe_kv_cache_tokens",)] <= 2 * 256
    assert got[("rapidmoe_residual_rate",)] == pytest.approx(stats["residual_rate"])
    layers = stats["layers"]
    assert got[("rapidmoe_expert_activations_total",)] == sum(sum(x["activations"]) for x in layers)
    assert got[("rapidmoe_residual_applications_total",)] == sum(sum(x["residual"]) for x in layers)
    assert got[("rapidmoe_draining",)] == 0


def test_server_metrics_count_a_streamed_models_expert_cache(gguf):
    """A model streamed from its file (ram_budget) adds its expert cache's counters; one wholly in
    memory has none of them."""
    pytest.importorskip("prometheus_client")
    with running(rm.Model(gguf, n_ctx=128, n_threads=2, residual=None, ram_budget="6MiB"), parallel=1,
                 queue=2) as (url, state):
        before = scrape(url)
        r = httpx.post(url + "/v1/completions", json={"prompt": "hello world", "max_tokens": 6, "temperature": 0},
                       timeout=30)
        assert r.status_code == 200
        got = scrape(url)
        cache = state.model.expert_cache
    assert got[("rapidmoe_expert_cache_bytes",)] == cache["cache_bytes"] > 0
    assert got[("rapidmoe_expert_cache_resident_bytes",)] == cache["resident_bytes"] > 0
    assert got[("rapidmoe_expert_cache_misses_total",)] == cache["misses"] > before[("rapidmoe_expert_cache_misses_total",)]
    assert got[("rapidmoe_expert_cache_hits_total",)] == cache["hits"] + cache["prefetch_used"]
    assert got[("rapidmoe_expert_cache_read_bytes_total",)] == cache["bytes_read"] > 0
    with running(rm.Model(gguf, n_ctx=128, n_threads=2, residual=None), parallel=1, queue=2) as (url, _):
        assert not any(k[0].startswith("rapidmoe_expert_cache") for k in scrape(url))


def test_server_metrics_without_prometheus_client(gguf, monkeypatch):
    monkeypatch.setattr(metrics, "prom", None)
    with running(rm.Model(gguf, n_ctx=128, n_threads=2)) as (url, _):
        err = _error(httpx.get(url + "/metrics"), 501)
        assert "prometheus_client" in err["message"]
        assert httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code == 200


def test_server_aliases_and_any_model(gguf):
    with running(rm.Model(gguf, n_ctx=128, n_threads=2), aliases=["gpt-4o", "local"]) as (url, _):
        assert [d["id"] for d in httpx.get(url + "/v1/models").json()["data"]] == ["m", "gpt-4o", "local"]
        assert httpx.get(url + "/v1/models/local").json()["id"] == "local"
        for name in ("m", "m.gguf", "gpt-4o", "local"):
            r = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 2, "model": name})
            assert r.status_code == 200, name
        assert _error(httpx.post(url + "/v1/completions", json={"prompt": "x", "model": "gpt-5"}), 404)["param"] == \
            "model"
        _error(httpx.get(url + "/v1/models/gpt-5"), 404)
    with running(rm.Model(gguf, n_ctx=128, n_threads=2), any_model=True) as (url, _):
        r = httpx.post(url + "/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 2, "model": "gpt-5"})
        assert r.status_code == 200
        assert httpx.get(url + "/v1/models/gpt-5").json()["id"] == "gpt-5"


def test_server_cli_scheduler_and_name_options(gguf, monkeypatch):
    seen = {}
    monkeypatch.setattr(srv, "serve", lambda model, config, log_level: seen.update(config=config))
    monkeypatch.delenv("RAPIDMOE_API_KEY", raising=False)
    assert cli.main(["serve", str(gguf), "--ctx", "128", "--alias", "a", "--alias", "b", "--any-model",
                     "--prefill-chunk", "32"]) == 0
    c = seen["config"]
    assert (c.aliases, c.any_model, c.prefill_chunk) == (["a", "b"], True, 32)
    assert cli.main(["serve", str(gguf), "--ctx", "128"]) == 0
    c = seen["config"]
    assert (c.aliases, c.any_model, c.prefill_chunk) == ([], False, srv.ServerConfig().prefill_chunk)
    assert cli.main(["serve", str(gguf), "--prefill-chunk", "0"]) == 1


def test_server_cli_step_latency_option(gguf, monkeypatch):
    """--step-latency F bounds a step with prompt tokens (default 2.5), 0 turns it off, and a value
    in (0, 1] is refused; the server refuses a bad one before it forks its slots."""
    seen = {}
    monkeypatch.setattr(srv, "serve", lambda model, config, log_level: seen.update(config=config))
    monkeypatch.delenv("RAPIDMOE_API_KEY", raising=False)
    assert cli.main(["serve", str(gguf), "--ctx", "128"]) == 0
    assert seen["config"].step_latency == srv.ServerConfig().step_latency == 2.5
    assert cli.main(["serve", str(gguf), "--ctx", "128", "--step-latency", "4"]) == 0
    assert seen["config"].step_latency == 4.0
    assert cli.main(["serve", str(gguf), "--ctx", "128", "--step-latency", "0"]) == 0
    assert seen["config"].step_latency is None
    seen.clear()
    assert cli.main(["serve", str(gguf), "--ctx", "128", "--step-latency", "0.5"]) == 1
    assert not seen
    with rm.Model(gguf, n_ctx=64) as m:
        with pytest.raises(rm.RapidMoEError, match="step_latency"):
            srv.Server(m, srv.ServerConfig(step_latency=1.0))


CHILD = textwrap.dedent("""
    import sys, time
    import rapidmoe_gguf as rm
    from rapidmoe_gguf import server as srv

    m = rm.Model(sys.argv[1], n_ctx=1024, n_threads=1)
    m.tokenizer.eog_ids = frozenset()       # replies run to max_tokens
    evaluate = m.eval

    def slow(toks):                         # 10 ms a step: a reply of 150 tokens takes over a second
        time.sleep(0.01)
        return evaluate(toks)

    m.eval = slow
    srv.serve(m, srv.ServerConfig(port=int(sys.argv[2]), parallel=1, queue=2), log_level="warning")
    m.close()
    print("served and closed")
""")


def start_child(gguf, tmp_path):
    """CHILD serving gguf on a free port, once it answers /health; returns (process, url)."""
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.Popen([sys.executable, str(script), str(gguf), str(port)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the server did not start: {proc.communicate()[1][-2000:]}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.1)


def test_server_ctrl_c_stops_with_status_0(gguf, tmp_path):
    proc, url = start_child(gguf, tmp_path)
    try:
        assert httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code == 200
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(30)
        out, err = proc.communicate()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc == 0 and "served and closed" in out, err[-2000:]


def test_server_sigterm_drains_then_exits(gguf, tmp_path):
    """SIGTERM while one request streams and another waits: both finish whole, a new request
    gets 503 (and /health 503 "draining") meanwhile, then the process exits by itself with 0."""
    proc, url = start_child(gguf, tmp_path)
    try:
        events, waited = [], {}
        first = threading.Event()

        def stream():
            body = {"prompt": "hello", "max_tokens": 150, "stream": True, "stream_options": {"include_usage": True}}
            with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        events.append(line[len("data: "):])
                        first.set()

        def queued():
            waited["r"] = httpx.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 5}, timeout=60)

        threads = [threading.Thread(target=stream), threading.Thread(target=queued)]
        threads[0].start()
        assert first.wait(30)
        threads[1].start()
        while httpx.get(url + "/health").json()["requests_waiting"] < 1:
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        while httpx.get(url + "/health").status_code != 503:
            time.sleep(0.01)
        assert httpx.get(url + "/health").json()["status"] == "draining"
        late = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert _error(late, 503)["code"] == "server_shutting_down"
        metrics_text = httpx.get(url + "/metrics").text
        for t in threads:
            t.join(60)
        rc = proc.wait(30)
        out, err = proc.communicate()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert events[-1] == "[DONE]" and json.loads(events[-2])["usage"]["completion_tokens"] == 150
    assert waited["r"].status_code == 200 and waited["r"].json()["usage"]["completion_tokens"] == 5
    assert rc == 0 and "served and closed" in out, err[-2000:]
    if metrics.prom is not None:
        assert "rapidmoe_draining 1.0" in metrics_text
        assert 'rapidmoe_requests_total{status="draining"} 1.0' in metrics_text
