"""logprobs / top_logprobs and logit_bias: the server (chat and legacy completions, streamed and
not, through httpx and the official `openai` client), the Python API, and the batched scheduler.

Oracle: the bundled model's logits for the same prefix (Model.eval_logits on a Model of its own,
which the runtime computes bit for bit as generation does) and numpy's log-softmax in float64,
plus the bias where the request gave one. The generated token ids come from the same Model
(generate_tokens with the request's sampling and seed): the text and the reported token bytes
must be theirs."""

from __future__ import annotations

import httpx
import numpy as np
import pytest

import rapidmoe_gguf as rm
from rapidmoe_gguf import chat, server as srv
from rapidmoe_gguf.bundled import bundled_model_path
from rapidmoe_gguf.model import TextStream
from rapidmoe_gguf.sampling import TokenLogprob
from test_server import _error, running, sse
from test_server_scheduler import serve_jobs

PROMPT = "The meaning of the word"
MESSAGES = [{"role": "user", "content": "What is a dictionary?"}]
GREEDY = rm.SamplingParams(temperature=0)
TOL = 1e-5


@pytest.fixture(scope="module")
def oracle():
    with rm.Model(bundled_model_path(), n_ctx=256, n_threads=2) as m:
        yield m


@pytest.fixture(scope="module")
def base():
    with running(rm.Model(bundled_model_path(), n_ctx=256, n_threads=2), parallel=2, queue=8) as (url, _):
        yield url


def log_softmax(logits: np.ndarray, bias: dict | None = None) -> np.ndarray:
    """The oracle: rows of float32 logits as float64 log-probabilities, the bias added first."""
    x = np.array(logits, dtype=np.float64)
    for token, b in (bias or {}).items():
        x[..., int(token)] += b
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def expected(oracle, prompt_ids, n, sampling=GREEDY, bias=None):
    """The generated ids (as the request generates them) and the log-probabilities at each."""
    gen = list(oracle.generate_tokens(prompt_ids, n, sampling, logit_bias=bias))
    logits = oracle.eval_logits(list(prompt_ids) + gen)[len(prompt_ids) - 1:len(prompt_ids) - 1 + len(gen)]
    return gen, log_softmax(logits, bias)


def ids_of(oracle, piece: bytes) -> list[int]:
    table = getattr(oracle, "_test_pieces", None)
    if table is None:
        table = {}
        for i in range(oracle.n_vocab):
            table.setdefault(oracle.tokenizer.token_to_piece(i), []).append(i)
        oracle._test_pieces = table
    return table[piece]


def check_chat_content(oracle, content, gen, rows, k):
    """Chat-shaped logprobs against the oracle: each token's bytes, logprob, and its k top ones,
    the k largest of the row in order."""
    tok = oracle.tokenizer
    assert len(content) == len(gen)
    for e, t, row in zip(content, gen, rows):
        assert bytes(e["bytes"]) == tok.token_to_piece(t)
        assert e["token"] == tok.token_to_piece(t).decode("utf-8", "replace")
        assert abs(e["logprob"] - row[t]) < TOL
        top = e["top_logprobs"]
        assert len(top) == k
        assert np.allclose([x["logprob"] for x in top], np.sort(row)[::-1][:k], rtol=0, atol=TOL)
        for x in top:     # each is the logprob of a token with those bytes
            assert any(abs(row[i] - x["logprob"]) < TOL for i in ids_of(oracle, bytes(x["bytes"])))


def check_completion_logprobs(oracle, lp, text, gen, rows, k, offset):
    """Legacy-shaped logprobs against the oracle; text_offset counts from the prompt's start."""
    tok = oracle.tokenizer
    pieces = [tok.token_to_piece(t).decode("utf-8", "replace") for t in gen]
    assert lp["tokens"] == pieces and "".join(pieces) == text
    assert np.allclose(lp["token_logprobs"], [row[t] for t, row in zip(gen, rows)], rtol=0, atol=TOL)
    for top, t, row in zip(lp["top_logprobs"], gen, rows):
        best = np.sort(row)[::-1][:k]
        assert len(top) in (k, k + 1)            # the k most likely, and the sampled token
        assert np.allclose(sorted(top.values(), reverse=True)[:k], best, rtol=0, atol=TOL)
        assert abs(top[tok.token_to_piece(t).decode("utf-8", "replace")] - row[t]) < TOL
    assert lp["text_offset"] == [offset + len("".join(pieces[:i])) for i in range(len(pieces))]


# ---------------------------------------------------------------------------------------------
# The server
# ---------------------------------------------------------------------------------------------

def test_chat_logprobs_equal_the_oracle_and_greedy_takes_the_top(base, oracle):
    prompt = chat.chat_prompt(oracle, MESSAGES)
    gen, rows = expected(oracle, prompt, 12)
    body = {"messages": MESSAGES, "max_tokens": 12, "temperature": 0, "logprobs": True, "top_logprobs": 4}
    r = httpx.post(base + "/v1/chat/completions", json=body, timeout=60).json()
    content = r["choices"][0]["logprobs"]["content"]
    check_chat_content(oracle, content, gen, rows, 4)
    for e in content:                            # greedy: the sampled token is the most likely one
        assert e["logprob"] == e["top_logprobs"][0]["logprob"] and e["bytes"] == e["top_logprobs"][0]["bytes"]
    assert r["choices"][0]["message"]["content"] == oracle.detokenize(gen)


def test_chat_logprobs_of_a_sampled_reply(base, oracle):
    sampling = rm.SamplingParams(temperature=1.0, seed=9)
    prompt = chat.chat_prompt(oracle, MESSAGES)
    gen, rows = expected(oracle, prompt, 16, sampling)
    body = {"messages": MESSAGES, "max_tokens": 16, "temperature": 1.0, "seed": 9, "logprobs": True}
    r = httpx.post(base + "/v1/chat/completions", json=body, timeout=60).json()
    check_chat_content(oracle, r["choices"][0]["logprobs"]["content"], gen, rows, 0)


def test_openai_client_chat_logprobs_streamed_and_not(base, oracle):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0)
    kw = dict(model="tiny-moe", messages=MESSAGES, max_tokens=16, temperature=0.7, seed=5, logprobs=True,
              top_logprobs=3)
    whole = client.chat.completions.create(**kw)
    content = [e.model_dump() for e in whole.choices[0].logprobs.content]
    gen, rows = expected(oracle, chat.chat_prompt(oracle, MESSAGES), 16, rm.SamplingParams(temperature=0.7, seed=5))
    check_chat_content(oracle, content, gen, rows, 3)
    streamed, text = [], ""
    for c in client.chat.completions.create(stream=True, **kw):
        if not c.choices:
            continue
        got = [e.model_dump() for e in c.choices[0].logprobs.content] if c.choices[0].logprobs else []
        piece = c.choices[0].delta.content or ""
        # each chunk carries the logprobs of the tokens whose text it carries
        assert b"".join(bytes(e["bytes"]) for e in got).decode("utf-8", "replace") == piece
        streamed += got
        text += piece
    assert streamed == content and text == whole.choices[0].message.content


def test_completion_logprobs_streamed_and_not(base, oracle):
    prompt_ids = oracle.tokenize(PROMPT)
    gen, rows = expected(oracle, prompt_ids, 10)
    body = {"prompt": PROMPT, "max_tokens": 10, "temperature": 0, "logprobs": 5}
    r = httpx.post(base + "/v1/completions", json=body, timeout=60).json()
    choice = r["choices"][0]
    check_completion_logprobs(oracle, choice["logprobs"], choice["text"], gen, rows, 5, len(PROMPT))
    with httpx.stream("POST", base + "/v1/completions", json={**body, "stream": True}, timeout=60) as s:
        events = sse(s.iter_lines())
    merged = {k: [] for k in choice["logprobs"]}
    for e in events[:-1]:
        c = e["choices"][0]
        if c["logprobs"] is None:
            assert c["text"] == ""
            continue
        assert "".join(c["logprobs"]["tokens"]) == c["text"]
        for k in merged:
            merged[k] += c["logprobs"][k]
    assert merged == choice["logprobs"]


def test_openai_client_completion_logprobs(base, oracle):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0)
    r = client.completions.create(model="tiny-moe", prompt=PROMPT, max_tokens=8, temperature=0, logprobs=2)
    gen, rows = expected(oracle, oracle.tokenize(PROMPT), 8)
    lp = r.choices[0].logprobs
    check_completion_logprobs(oracle, {"tokens": lp.tokens, "token_logprobs": lp.token_logprobs,
                                       "top_logprobs": lp.top_logprobs, "text_offset": lp.text_offset},
                              r.choices[0].text, gen, rows, 2, len(PROMPT))


def test_logprobs_stop_at_a_stop_string(base, oracle):
    """The stop string's own tokens are not reported; a token that begins before it is."""
    gen, _ = expected(oracle, oracle.tokenize(PROMPT), 10)
    pieces = [oracle.tokenizer.token_to_piece(t).decode() for t in gen]
    stop = pieces[3][1:] + pieces[4]             # from inside the 4th token
    body = {"prompt": PROMPT, "max_tokens": 10, "temperature": 0, "logprobs": 0, "stop": [stop]}
    for stream in (False, True):
        if stream:
            with httpx.stream("POST", base + "/v1/completions", json={**body, "stream": True}, timeout=60) as s:
                chunks = [e["choices"][0] for e in sse(s.iter_lines())[:-1]]
            tokens = [t for c in chunks if c["logprobs"] for t in c["logprobs"]["tokens"]]
            text = "".join(c["text"] for c in chunks)
        else:
            c = httpx.post(base + "/v1/completions", json=body, timeout=60).json()["choices"][0]
            tokens, text = c["logprobs"]["tokens"], c["text"]
        assert text == "".join(pieces[:3]) + pieces[3][:1]
        assert tokens == pieces[:4]


def test_requests_without_logprobs_get_none(base):
    r = httpx.post(base + "/v1/chat/completions", json={"messages": MESSAGES, "max_tokens": 3}, timeout=60).json()
    assert r["choices"][0]["logprobs"] is None
    r = httpx.post(base + "/v1/completions", json={"prompt": PROMPT, "max_tokens": 3, "logprobs": False,
                                                   "logit_bias": {}}, timeout=60).json()
    assert r["choices"][0]["logprobs"] is None


def test_logit_bias_bans_and_forces_tokens(base, oracle):
    prompt_ids = oracle.tokenize(PROMPT)
    (greedy, *_), _ = expected(oracle, prompt_ids, 1)
    ban = {str(greedy): -100}
    body = {"prompt": PROMPT, "max_tokens": 4, "temperature": 0, "logprobs": 3}
    r = httpx.post(base + "/v1/completions", json={**body, "logit_bias": ban}, timeout=60).json()
    gen, rows = expected(oracle, prompt_ids, 4, bias={greedy: -100})
    assert gen[0] != greedy
    check_completion_logprobs(oracle, r["choices"][0]["logprobs"], r["choices"][0]["text"], gen, rows, 3,
                              len(PROMPT))
    # +100 forces a token the model finds unlikely, sampled or not; its logprob (bias included) ~ 0
    first = oracle.eval_logits(prompt_ids)[-1]
    forced = int(np.argsort(first)[len(first) // 2])
    for temperature in (0, 1.0):
        r = httpx.post(base + "/v1/chat/completions", timeout=60, json={
            "messages": MESSAGES, "max_tokens": 2, "temperature": temperature, "seed": 1, "logprobs": True,
            "logit_bias": {str(forced): 100}}).json()
        e = r["choices"][0]["logprobs"]["content"][0]
        assert bytes(e["bytes"]) == oracle.tokenizer.token_to_piece(forced)
        prompt = chat.chat_prompt(oracle, MESSAGES)
        want = log_softmax(oracle.eval_logits(prompt)[-1], {forced: 100})[forced]
        assert abs(e["logprob"] - want) < TOL and e["logprob"] > -1e-3


BAD = [
    ("/v1/chat/completions", {"logprobs": 3}, "logprobs"),
    ("/v1/chat/completions", {"logprobs": "yes"}, "logprobs"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 2.5}, "top_logprobs"),
    ("/v1/chat/completions", {"top_logprobs": 2}, "top_logprobs"),
    ("/v1/completions", {"logprobs": 21}, "logprobs"),
    ("/v1/completions", {"logprobs": -1}, "logprobs"),
    ("/v1/completions", {"logprobs": True}, "logprobs"),
    ("/v1/completions", {"logprobs": "3"}, "logprobs"),
    ("/v1/completions", {"top_logprobs": 3}, "top_logprobs"),
    ("/v1/completions", {"logprobs": 2, "echo": True}, "echo"),
    ("/v1/completions", {"logit_bias": {"abc": 1}}, "logit_bias"),
    ("/v1/completions", {"logit_bias": {"8192": 1}}, "logit_bias"),
    ("/v1/completions", {"logit_bias": {"-1": 1}}, "logit_bias"),
    ("/v1/completions", {"logit_bias": {"1.5": 1}}, "logit_bias"),
    ("/v1/chat/completions", {"logit_bias": {"5": 100.5}}, "logit_bias"),
    ("/v1/chat/completions", {"logit_bias": {"5": -101}}, "logit_bias"),
    ("/v1/chat/completions", {"logit_bias": {"5": 10**400}}, "logit_bias"),
    ("/v1/chat/completions", {"logit_bias": {"5": "1"}}, "logit_bias"),
    ("/v1/chat/completions", {"logit_bias": {"5": True}}, "logit_bias"),
    ("/v1/chat/completions", {"logit_bias": {"5": None}}, "logit_bias"),
    ("/v1/chat/completions", {"logit_bias": [5]}, "logit_bias"),
]


@pytest.mark.parametrize("path, fields, param", BAD)
def test_bad_logprobs_and_logit_bias_are_400_naming_the_field(base, path, fields, param):
    body = {"messages": MESSAGES} if "chat" in path else {"prompt": PROMPT}
    err = _error(httpx.post(base + path, json={**body, "max_tokens": 2, **fields}, timeout=60), 400)
    assert err["param"] == param and param in err["message"]


def test_an_infinite_bias_is_400_naming_logit_bias(base):
    body = b'{"prompt": "x", "max_tokens": 1, "logit_bias": {"5": 1e400}}'   # json.loads: inf
    r = httpx.post(base + "/v1/completions", content=body, headers={"content-type": "application/json"})
    assert _error(r, 400)["param"] == "logit_bias"


def test_fields_that_ask_for_nothing_are_accepted(base):
    for path, body in [("/v1/chat/completions", {"messages": MESSAGES, "logprobs": False, "top_logprobs": 0}),
                       ("/v1/completions", {"prompt": PROMPT, "logprobs": None, "top_logprobs": 0,
                                            "logit_bias": {}})]:
        assert httpx.post(base + path, json={**body, "max_tokens": 2}, timeout=60).status_code == 200


# ---------------------------------------------------------------------------------------------
# The Python API
# ---------------------------------------------------------------------------------------------

def test_python_api_completion_and_chat_logprobs(oracle):
    with rm.Model(bundled_model_path(), n_ctx=256, n_threads=2) as m:
        kw = dict(max_tokens=10, temperature=0.8, seed=3)
        r = m.create_completion(PROMPT, logprobs=4, **kw)
        gen, rows = expected(oracle, oracle.tokenize(PROMPT), 10, rm.SamplingParams(temperature=0.8, seed=3))
        check_completion_logprobs(oracle, r["choices"][0]["logprobs"], r["choices"][0]["text"], gen, rows, 4,
                                  len(PROMPT))
        chunks = list(m.create_completion(PROMPT, logprobs=4, stream=True, **kw))
        assert [t for c in chunks if c["choices"][0]["logprobs"] for t in c["choices"][0]["logprobs"]["tokens"]] \
            == r["choices"][0]["logprobs"]["tokens"]

        bias = {"16": -100, 298: 5.5}
        c = m.create_chat_completion(MESSAGES, logprobs=True, top_logprobs=2, logit_bias=bias, **kw)
        gen, rows = expected(oracle, chat.chat_prompt(oracle, MESSAGES), 10,
                             rm.SamplingParams(temperature=0.8, seed=3), {16: -100, 298: 5.5})
        content = c["choices"][0]["logprobs"]["content"]
        check_chat_content(oracle, content, gen, rows, 2)
        assert 16 not in gen
        streamed = [e for ch in m.create_chat_completion(MESSAGES, logprobs=True, top_logprobs=2, logit_bias=bias,
                                                         stream=True, **kw)
                    if ch["choices"][0]["logprobs"] for e in ch["choices"][0]["logprobs"]["content"]]
        assert streamed == content
        assert m.create_chat_completion(MESSAGES, max_tokens=2)["choices"][0]["logprobs"] is None


@pytest.mark.parametrize("call, match", [
    (lambda m: m.create_completion(PROMPT, logprobs=21), "logprobs must be an integer in"),
    (lambda m: m.create_completion(PROMPT, logprobs=True), "logprobs must be an integer in"),
    (lambda m: m.create_chat_completion(MESSAGES, top_logprobs=3), "top_logprobs needs logprobs"),
    (lambda m: m.create_chat_completion(MESSAGES, logprobs=True, top_logprobs=30), "top_logprobs must be"),
    (lambda m: m.create_completion(PROMPT, logit_bias={"x": 1}), "logit_bias: the key"),
    (lambda m: m.create_completion(PROMPT, logit_bias={5: float("nan")}), "logit_bias: the bias of token 5"),
    (lambda m: m.create_completion(PROMPT, logit_bias={5: 1, "5": 2}), "given twice"),
    (lambda m: list(m.generate_tokens([1, 2], 2, GREEDY, logit_bias={99999: 1})), "outside the vocabulary"),
])
def test_python_api_bad_values(oracle, call, match):
    with pytest.raises(rm.InvalidArgumentError, match=match):
        call(oracle)


# ---------------------------------------------------------------------------------------------
# The scheduler: requests with and without logprobs / logit_bias in one step
# ---------------------------------------------------------------------------------------------

def test_scheduler_mixed_requests_equal_each_alone(oracle):
    """Four requests in the same steps: logprobs, logit_bias, both (sampled), neither. Each gets
    exactly the text, finish reason and logprobs it gets alone through the Python API."""
    prompts = [oracle.tokenize(p) for p in (PROMPT, "A dictionary is", "Once upon a time there", "The")]
    sampled = rm.SamplingParams(temperature=0.9, seed=7)
    cases = [(GREEDY, 3, None), (GREEDY, None, {prompts[1][-1]: -100, 16: 20}), (sampled, 2, {16: -100}),
             (GREEDY, None, None)]
    reqs = []
    for p, (sp, n_top, bias) in zip(prompts, cases):
        reqs.append(srv.GenRequest("completion", p, 12, sp, [], False, False, None, None, logprobs=n_top,
                                   logit_bias=rm.sampling.LogitBias.check(bias, oracle.n_vocab),
                                   text_offset=len(oracle.detokenize(p))))
    with rm.Model(bundled_model_path(), n_ctx=256, n_threads=2) as m:
        jobs, obs, sched = serve_jobs(m, 4, reqs, prefill_chunk=64)
        assert sched.batched and max(n for _, n in obs.steps) == 4
    for (sp, n_top, bias), p, job in zip(cases, prompts, jobs):
        chunks = job.items[:-1]
        lps = [c["choices"][0]["logprobs"] for c in chunks if c["choices"][0]["logprobs"]]
        got = (''.join(c["choices"][0]["text"] for c in chunks), chunks[-1]["choices"][0]["finish_reason"],
               rm.sampling.merge_logprobs("completion", lps) if n_top is not None else None)
        want = oracle.create_completion(p, max_tokens=12, temperature=sp.temperature, seed=sp.seed,
                                        logprobs=n_top, logit_bias=bias)["choices"][0]
        assert got == (want["text"], want["finish_reason"], want["logprobs"])
        assert n_top is not None or not lps


# ---------------------------------------------------------------------------------------------
# Which chunk carries which token's logprobs
# ---------------------------------------------------------------------------------------------

def test_text_stream_releases_a_token_with_its_text(oracle):
    tok = oracle.tokenizer
    ids = tok.encode("café ok")                  # c, af, \xc3, \xa9 (é in two byte tokens), ...
    assert tok.token_to_piece(ids[2]) == b"\xc3" and tok.token_to_piece(ids[3]) == b"\xa9"
    ts = TextStream(tok)
    out = []
    for i, t in enumerate(ids):
        piece = ts.feed(t, i)
        out.append((piece, ts.released()))
    assert out[:4] == [("c", [(0, 0)]), ("af", [(1, 1)]), (None, []), ("é", [(2, 3), (3, 3)])]
    assert ts.flush() == "" and ts.released() == []

    ts = TextStream(tok, stop=["é"])             # the stop string's tokens are not released
    pieces = [ts.feed(t, i) for i, t in enumerate(ids[:4])]
    assert ts.stopped and "".join(p for p in pieces if p) == "caf" and ts.released() == [(0, 0), (1, 1)]

    ts = TextStream(tok)                         # untagged tokens cost nothing and are not released
    assert [ts.feed(t) for t in ids[:2]] == ["c", "af"] and ts.released() == []


def test_chat_chunks_pass_hidden_text_logprobs_on():
    """A harmony reply whose analysis channel is not shown: its tokens' logprobs go with the
    first content chunk; a finish with tokens left over carries them."""
    a, b, c = ({"token": x, "logprob": -1.0, "bytes": [], "top_logprobs": []} for x in "abc")

    def chunk(text, tokens, finish=None):
        return {"id": "x", "created": 0, "model": "m",
                "choices": [{"text": text, "logprobs": {"content": tokens} if tokens else None,
                             "finish_reason": finish}]}

    cc = chat.ChatChunks(chat.HarmonyChannels())
    out = cc.feed(chunk("<|channel|>analysis<|message|>think", [a]))
    out += cc.feed(chunk("<|end|><|start|>assistant<|channel|>final<|message|>Hi", [b]))
    out += cc.feed(chunk("", [c]))
    out += cc.feed(chunk("", None, "stop"))
    got = [(ch["choices"][0]["delta"], ch["choices"][0]["logprobs"]) for ch in out]
    assert got == [({"role": "assistant"}, None), ({"content": "Hi"}, {"content": [a, b]}),
                   ({}, {"content": [c]})]


def test_token_logprob_is_a_log_softmax():
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal(1000) * 5).astype(np.float32)
    want = log_softmax(logits, {3: 7.5})
    lp = rm.sampling.token_logprob(logits, 3, 5, rm.sampling.LogitBias.check({"3": 7.5}, 1000))
    assert isinstance(lp, TokenLogprob) and abs(lp.logprob - want[3]) < 1e-12
    assert [t for t, _ in lp.top] == list(np.argsort(-want)[:5])
    assert np.allclose([v for _, v in lp.top], np.sort(want)[::-1][:5], rtol=0, atol=1e-12)
