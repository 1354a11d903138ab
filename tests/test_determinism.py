"""The same request gives the same answer: whatever shares its batch, however the scheduler cut its
prompt into steps, and whatever the session generated before.

Oracle: the request alone, on a fresh Model. Equality is exact (token ids, and logits bit for bit):
a near-tie on a real model turns any difference into another greedy token. The models are the
bundled one with its calibrated UMIA policy (the default), and every architecture the engine runs,
quantized and calibrated, with long prompts that the batch cuts at other places than the sequence
alone (a step of n_batch tokens spans several prompts). The residual policy's controllers step per
position of each sequence (policy.h) and the Gated DeltaNet's chunks are aligned to positions
(cpu/gdn.h), which is what makes this hold.
"""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest

import rapidmoe_gguf as rm
from rapidmoe_gguf import evaluate
from rapidmoe_gguf.bundled import bundled_model_path
from conftest import _CORPUS, VOCAB
from test_server import running

TEXT = " ".join(_CORPUS)


def random_ids(lengths, seed):
    rng = np.random.default_rng(seed)
    return [rng.integers(3, VOCAB, n).tolist() for n in lengths]


# -- one session, one request after another -----------------------------------------------------------

def test_determinism_umia_answer_does_not_depend_on_earlier_requests():
    """The bundled model under its default policy (UMIA, budget 0.25): a prompt's greedy and seeded
    answers after other generations on the same session equal its answers on a fresh one, with the
    cache's prefix reused or not."""
    path = bundled_model_path()
    prompts = ["The meaning of the word", "A river is", "Once upon a time there was a"]
    seeded = dict(temperature=0.9, seed=1234)
    with rm.Model(path, n_ctx=512, n_threads=2) as fresh:
        assert fresh.residual_policy == "umia"
        want = [fresh.generate(p, 48, temperature=0) for p in prompts]
        fresh.reset()
        want_seeded = fresh.generate(prompts[0], 48, **seeded)
    with rm.Model(path, n_ctx=512, n_threads=2) as m:
        for _ in range(2):
            for p, w in zip(prompts[::-1], want[::-1]):
                assert m.generate(p, 48, temperature=0) == w
            assert m.generate(prompts[0], 48, **seeded) == want_seeded
        m.generate(prompts[0] + " of", 8, temperature=0)   # a shared prefix, then the prompt again
        assert m.last_timings["prompt_reused"] > 0
        assert m.generate(prompts[0], 48, temperature=0) == want[0]
        m.reuse_prefix = False
        assert m.generate(prompts[1], 48, temperature=0) == want[1]
        stats = m.stats()
    assert 0.0 < stats["residual_rate"] < 1.0   # the policy selected some slots and not others


# -- every architecture: a batch of long prompts against each alone -----------------------------------

def _hf(tmp_path, tiny_hf, kind):
    if kind in ("mixtral", "qwen2_moe", "qwen3_moe", "olmoe"):
        return tiny_hf(kind)
    if kind in ("qwen3_next", "qwen3_5_moe"):
        from test_arch_qwen35 import make_tiny_hybrid

        make_tiny_hybrid(tmp_path / "hf", kind)
    elif kind == "gpt_oss":
        from test_arch_gpt_oss import make_tiny_gpt_oss

        return make_tiny_gpt_oss(tmp_path / "hf")
    else:
        from test_arch_deepseek import make_checkpoint

        make_checkpoint(tmp_path / "hf", kind)
    return tmp_path / "hf"


# (architecture, recipe): a RESplit pair each, calibrated so that the default policy is UMIA
ARCHS = [("qwen3_moe", "q4k-q8"), ("qwen2_moe", "q2k-q4"), ("mixtral", "q4_0-q4_0"), ("olmoe", "q3k-q8"),
         ("deepseek_v2", "q4k-q8"), ("deepseek_v3", "q4_0-q4_0"), ("glm4_moe", "q4k-q8"),
         ("glm4_moe_lite", "q4k-q8"), ("qwen3_next", "q4_0-q4_0"), ("qwen3_5_moe", "q4_0-q4_0"),
         ("gpt_oss", "mxfp4-q8")]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory, tiny_hf):
    cache = {}

    def get(kind, recipe):
        if kind not in cache:
            d = tmp_path_factory.mktemp(f"det-{kind}")
            out = d / "m.gguf"
            rm.convert(_hf(d, tiny_hf, kind), out, recipe=recipe, progress=False)
            evaluate.calibrate(str(out), TEXT, n_ctx=64, max_tokens=128, n_threads=2)
            cache[kind] = out
        return cache[kind]

    return get


def _alone(path, prompt, n_decode, policy, n_batch):
    """The last prompt position's logits, then each greedy token's, on a fresh Model."""
    with rm.Model(path, n_ctx=512, n_threads=2, n_batch=n_batch, residual_policy=policy) as m:
        rows = [m.eval(prompt) if len(prompt) <= n_batch else m.eval_logits(prompt)[-1]]
        for _ in range(n_decode):
            rows.append(m.eval([int(np.argmax(rows[-1]))]))
    return np.stack(rows)


@pytest.mark.parametrize("kind,recipe", ARCHS, ids=[k for k, _ in ARCHS])
def test_determinism_batch_of_long_prompts_equals_each_alone(pairs, kind, recipe):
    """Four prompts of 150, 37, 300 and 5 tokens in one evaluation, in steps of 64 tokens that cut
    them at other places than each alone, then 6 greedy tokens each, batched: every logit equal to
    the sequence's alone, under UMIA and base only."""
    path = pairs(kind, recipe)
    prompts = random_ids((150, 37, 300, 5), seed=11)
    for policy in ("umia", "none"):
        with rm.Model(path, n_ctx=512, n_threads=2, n_batch=64, residual_policy=policy) as m:
            assert m.residual_policy == policy
            seqs = [m] + [m.fork_session() for _ in prompts[1:]]
            got = [[x] for x in rm.eval_batch(list(zip(seqs, prompts)))]
            for _ in range(6):
                nxt = [int(np.argmax(g[-1])) for g in got]
                for g, x in zip(got, rm.eval_batch([(s, [t]) for s, t in zip(seqs, nxt)])):
                    g.append(x)
        for p, g in zip(prompts, got):
            np.testing.assert_array_equal(np.stack(g), _alone(path, p, 6, policy, 64), err_msg=f"{kind} {policy}")


@pytest.mark.parametrize("kind,recipe", ARCHS, ids=[k for k, _ in ARCHS])
def test_determinism_generate_many_equals_generate(pairs, kind, recipe):
    """Long text prompts (hundreds of tokens, several steps): generate_many's greedy and seeded
    answers are generate's, on the default policy."""
    path = pairs(kind, recipe)
    texts = [TEXT[:300], TEXT[100:160], TEXT[300:750]]
    seeded = rm.SamplingParams(temperature=0.9, seed=77)
    with rm.Model(path, n_ctx=512, n_threads=2, n_batch=48) as m:
        assert m.residual_policy == "umia"
        assert len(m.tokenize(texts[2])) > 2 * m.n_batch
        many = m.generate_many(texts, 12, temperature=0)
        many_seeded = m.generate_many(texts, 12, sampling=seeded)
    with rm.Model(path, n_ctx=512, n_threads=2, n_batch=48) as m:
        each = [m.generate(t, 12, temperature=0) for t in texts]
        each_seeded = [m.generate(t, 12, sampling=seeded) for t in texts]
    assert many == each and many_seeded == each_seeded
    assert any(len(t) > 0 for t in many)


# -- through the server, under load -------------------------------------------------------------------

REQUESTS = [
    ("/v1/completions", {"prompt": TEXT[:700], "max_tokens": 16, "temperature": 0}),
    ("/v1/completions", {"prompt": "The meaning of the word", "max_tokens": 24, "temperature": 0}),
    ("/v1/completions", {"prompt": TEXT[200:500], "max_tokens": 16, "temperature": 0.8, "seed": 5}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": TEXT[:300]}], "max_tokens": 12,
                              "temperature": 0}),
]


def _answer(path, r):
    assert r.status_code == 200, r.text
    c = r.json()["choices"][0]
    return c["message"]["content"] if "chat" in path else c["text"]


@pytest.mark.parametrize("which", ["bundled", "qwen3_5_moe"])
def test_determinism_server_answers_alone_equal_amid_load(pairs, which):
    """The default policy (UMIA) on four slots: each request sent alone to an idle server, then all
    of them twice over amid other requests (long and short prompts, streamed, some disconnected
    early): the same answers."""
    path = bundled_model_path() if which == "bundled" else pairs("qwen3_5_moe", "q4_0-q4_0")
    chat = which == "bundled"   # the tiny hybrid's tokenizer has no chat template
    reqs = [r for r in REQUESTS if chat or "chat" not in r[0]]
    with running(rm.Model(path, n_ctx=512, n_threads=2, n_batch=64), parallel=4, queue=32,
                 prefill_chunk=24) as (url, _):
        with httpx.Client(base_url=url, timeout=120) as client:
            alone = [_answer(p, client.post(p, json=b)) for p, b in reqs]

        async def load(client, i):
            body = {"prompt": TEXT[i * 37 % 900:][:150 + 40 * (i % 5)], "max_tokens": 5 + i % 7,
                    "temperature": 0.7, "stream": i % 2 == 0}
            try:
                await client.post("/v1/completions", json=body, timeout=120 if i % 3 else 0.3)
            except httpx.TimeoutException:
                pass   # a client that hangs up early

        async def main():
            async with httpx.AsyncClient(base_url=url, timeout=120) as client:
                tasks = [client.post(p, json=b) for p, b in reqs * 2] + [load(client, i) for i in range(10)]
                return await asyncio.gather(*tasks)

        results = asyncio.run(main())
    got = [_answer(p, r) for (p, _), r in zip(reqs * 2, results)]
    assert got == alone * 2
