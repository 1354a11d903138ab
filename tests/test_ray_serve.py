"""Scale-out on Ray Serve (rapidmoe_gguf.ray_serve): a local Ray with two replicas of the server on
the bundled model, behind Ray's HTTP proxy. Skips when ray[serve] is not installed."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys

import httpx
import pytest

import rapidmoe_gguf as rm
from rapidmoe_gguf import cli
from rapidmoe_gguf.bundled import bundled_model_path
from rapidmoe_gguf.errors import RapidMoEError
from rapidmoe_gguf.server import ServerConfig

N_CTX = 256
# UMIA's per-layer thresholds are controllers that move after every token of a session and keep
# their state across requests (native/src/policy/policy.c), so under it a greedy answer depends on what the
# slot served before, which Ray's routing decides. Policy "all" has no state: every answer is then
# a function of its request alone.
MODEL = {"n_ctx": N_CTX, "residual_policy": "all"}
PROMPTS = ["hello", "The quick brown", "experts route", "0123"]
MESSAGES = [{"role": "user", "content": "hello experts"}]


def test_missing_ray_names_the_extra(monkeypatch, capsys):
    """Without ray the command says which extra to install, before it opens anything."""
    from rapidmoe_gguf import ray_serve

    monkeypatch.setitem(sys.modules, "ray", None)     # import ray now raises ImportError
    with pytest.raises(RapidMoEError, match=r"rapidmoe-gguf\[ray\]"):
        ray_serve.deployment(bundled_model_path(), replicas=2)
    assert cli.main(["serve", "--ray-replicas", "2"]) != 0
    assert "rapidmoe-gguf[ray]" in capsys.readouterr().err


def test_replica_threads_share_the_cores():
    from rapidmoe_gguf.ray_serve import replica_threads

    assert [replica_threads(n, cores=16) for n in (1, 2, 3, 4, 32)] == [16, 8, 5, 4, 1]
    with pytest.raises(RapidMoEError, match="replicas"):
        replica_threads(0)


@pytest.fixture(scope="module")
def ray_url(tmp_path_factory):
    """Ray on two CPUs, Serve's proxy on a free port, two replicas of one thread each, each with
    one slot and a queue of three, deployed as ``rapidmoe serve --ray-replicas`` deploys them.

    Ray's workers start in the driver's working folder and put it first on sys.path. Started from
    a source checkout whose package is installed rather than built in place (as CI runs the
    tests), the replicas would import the checkout's unbuilt package: so Ray starts elsewhere."""
    pytest.importorskip("ray.serve")
    import ray
    from ray import serve

    from rapidmoe_gguf import ray_serve

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # the workers import the package this process imports (installed, or a built tree on PYTHONPATH)
    pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(rm.__file__)))
    here = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("ray"))
    try:
        ray.init(num_cpus=2, include_dashboard=False, logging_level="warning", log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": pkg_root}})
    finally:
        os.chdir(here)
    try:                                           # run's own ray.init finds this one
        ray_serve.run(bundled_model_path(), replicas=2, port=port, model_kwargs={**MODEL, "n_threads": 1},
                      config=ServerConfig(parallel=1, queue=3), block=False)
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


def _sse(lines) -> list:
    events = [line[len("data: "):] for line in lines if line.startswith("data: ")]
    assert events and events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def test_two_replicas_share_concurrent_requests_and_stream_them(ray_url):
    """Eight concurrent greedy requests, streamed and not, completions and chat: each answer is the
    Model's own, and both replicas answered some."""
    with rm.Model(bundled_model_path(), n_threads=1, **MODEL) as m:
        assert m.residual_path is not None                 # the residual sidecar is in use
        want = [m.create_completion(p, max_tokens=12, temperature=0)["choices"][0]["text"] for p in PROMPTS]
        want_chat = m.create_chat_completion(MESSAGES, max_tokens=12, temperature=0)["choices"][0]["message"]["content"]

    async def completion(client, prompt, stream):
        body = {"prompt": prompt, "max_tokens": 12, "temperature": 0, "stream": stream}
        if not stream:
            r = await client.post("/v1/completions", json=body)
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["text"], r.headers["x-rapidmoe-replica"]
        async with client.stream("POST", "/v1/completions", json=body) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            events = _sse([line async for line in r.aiter_lines()])
            return "".join(e["choices"][0]["text"] for e in events), r.headers["x-rapidmoe-replica"]

    async def chat(client):
        body = {"messages": MESSAGES, "max_tokens": 12, "temperature": 0, "stream": True}
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            events = _sse([line async for line in r.aiter_lines()])
            return "".join(e["choices"][0]["delta"].get("content", "") for e in events), r.headers["x-rapidmoe-replica"]

    async def main():
        async with httpx.AsyncClient(base_url=ray_url, timeout=120) as client:
            jobs = [completion(client, PROMPTS[i % 4], stream=i % 2 == 1) for i in range(8)]
            return await asyncio.gather(*jobs, chat(client), chat(client))

    answers = asyncio.run(main())
    assert [text for text, _ in answers[:8]] == [want[i % 4] for i in range(8)]
    assert [text for text, _ in answers[8:]] == [want_chat, want_chat]
    replicas = {replica for _, replica in answers}
    assert len(replicas) == 2, f"all requests went to {replicas}"


def test_every_route_of_the_server_through_the_proxy(ray_url):
    models = httpx.get(ray_url + "/v1/models").json()
    assert models["data"][0]["id"] == "tiny-moe"
    h = httpx.get(ray_url + "/health")
    assert h.status_code == 200 and h.json()["status"] == "ok" and h.headers["x-rapidmoe-replica"]
    assert "rapidmoe_requests" in httpx.get(ray_url + "/metrics").text
    r = httpx.post(ray_url + "/v1/completions", json={"prompt": "x", "max_tokens": -1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
