"""Several sequences in one evaluation (rm_batch_eval, eval_batch, Model.generate_many) and
prompt-prefix reuse (rm_session_truncate, Model.generate).

Oracle: the same sequence run alone on its own session (rm_session_eval), which the forward tests
hold to transformers. A sequence's logits in a mixed batch must equal its logits alone within 1e-5
relative (max |diff| over the position's max |logit|); the runtime keeps a token's arithmetic
independent of the batch it is in, so the measured difference is 0. Each session keeps its own
residual policy (all, none and a budgeted gate policy side by side) and its own counters.
"""

from __future__ import annotations

import numpy as np
import pytest

import rapidmoe_gguf as rm
from rapidmoe_gguf import evaluate
from rapidmoe_gguf._native import ffi, lib
from conftest import _CORPUS, VOCAB

REL = 1e-5
POLICIES = (("all", None), ("none", None), ("gate", 0.3))


def rel_err(a, ref):
    a, ref = np.atleast_2d(a), np.atleast_2d(ref)
    return float((np.abs(a - ref).max(-1) / np.abs(ref).max(-1)).max())


@pytest.fixture(scope="module")
def pair(tiny_hf, tmp_path_factory):
    """A calibrated q2k-q4 RESplit pair of the tiny Qwen2-MoE (routed experts and a gated shared
    expert)."""
    out = tmp_path_factory.mktemp("batch") / "m.gguf"
    rm.convert(tiny_hf("qwen2_moe"), out, recipe="q2k-q4", progress=False)
    evaluate.calibrate(str(out), " ".join(_CORPUS), n_ctx=64, max_tokens=128, n_threads=2)
    return out


def prompts(lengths, seed=3):
    rng = np.random.default_rng(seed)
    return [rng.integers(3, VOCAB, n).tolist() for n in lengths]


def alone(path, policy, budget, prompt, decode, **kw):
    """All logits of prompt, then of each decode token, on a session of its own; and its stats."""
    with rm.Model(path, n_ctx=96, n_threads=2, residual_policy=policy, residual_budget=budget or 0.1, **kw) as m:
        rows = list(m.eval_logits(prompt)) + [m.eval([t]) for t in decode]
        return np.stack(rows), m.stats()


def sessions(m, n):
    forks = [m.fork_session() for _ in range(n - 1)]
    for f, (policy, budget) in zip([m] + forks, POLICIES):
        f.set_residual(policy, budget or 0.1)
    return [m] + forks


@pytest.mark.parametrize("n_batch", [256, 8])
def test_batch_sequences_match_each_alone(pair, n_batch):
    """Three prompts of 7, 19 and 1 tokens in one evaluation (in several steps with n_batch 8),
    then three decode steps of one token each, each session with another residual policy."""
    ps, decode = prompts((7, 19, 1)), prompts((3, 3, 3), seed=4)
    with rm.Model(pair, n_ctx=96, n_threads=2, n_batch=n_batch) as m:
        seqs = sessions(m, 3)
        got = [list(x) for x in rm.eval_batch(list(zip(seqs, ps)), all_logits=True)]
        for step in range(3):
            for g, x in zip(got, rm.eval_batch([(s, [d[step]]) for s, d in zip(seqs, decode)])):
                g.append(x)
        stats = [s.stats() for s in seqs]
        assert [s.n_past for s in seqs] == [10, 22, 4]
    for (policy, budget), p, d, g, st in zip(POLICIES, ps, decode, got, stats):
        ref, ref_stats = alone(pair, policy, budget, p, d, n_batch=n_batch)
        err = rel_err(np.stack(g), ref)
        assert err <= REL, f"{policy}: rel err {err:.2e}"
        np.testing.assert_array_equal(st["active"], ref_stats["active"])
        np.testing.assert_array_equal(st["residual"], ref_stats["residual"])
    assert stats[0]["residual_rate"] == 1.0 and stats[1]["residual_rate"] == 0.0
    assert 0.0 < stats[2]["residual_rate"] < 1.0


def raw_batch(seqs, tokens, seq, pos=None, want=None, out_rows=None):
    """rm_batch_eval through the binding, tokens in the order given (the library groups them)."""
    n_vocab = seqs[0].n_vocab
    keep = [np.asarray(tokens, np.int32), np.asarray(seq, np.int32)]
    b = ffi.new("rm_batch *")
    b.struct_size = ffi.sizeof("rm_batch")
    b.n_tokens, b.n_sessions = len(tokens), len(seqs)
    b.tokens, b.seq = ffi.from_buffer("int32_t[]", keep[0]), ffi.from_buffer("int32_t[]", keep[1])
    if pos is not None:
        keep.append(np.asarray(pos, np.int32))
        b.pos = ffi.from_buffer("int32_t[]", keep[-1])
    out = np.zeros((out_rows if out_rows is not None else int(np.sum(want or 0)), n_vocab), np.float32)
    if want is not None:
        keep.append(np.asarray(want, np.int8))
        b.logits = ffi.from_buffer("int8_t[]", keep[-1])
        b.out, b.out_cap = ffi.from_buffer("float[]", out), out.size
    handles = ffi.new("rm_session *[]", [s._live() for s in seqs])
    b.sessions = handles
    rm._native.check(lib.rm_batch_eval(b))
    return out


def test_batch_interleaved_tokens_and_chosen_logits(pair):
    """Tokens of two sequences interleaved in the batch, with positions, and logits for some."""
    a, b = prompts((6, 9), seed=5)
    order = [(0, 0), (1, 0), (1, 1), (0, 1), (1, 2), (0, 2), (0, 3), (1, 3), (1, 4), (1, 5), (0, 4), (0, 5),
             (1, 6), (1, 7), (1, 8)]
    tokens = [(a, b)[j][i] for j, i in order]
    want = [int((j, i) in ((1, 2), (0, 5), (1, 8), (0, 0))) for j, i in order]
    with rm.Model(pair, n_ctx=64, n_threads=2, residual_policy="none") as m:
        f = m.fork_session()
        out = raw_batch([m, f], tokens, [j for j, _ in order], [i for _, i in order], want)
    ref_a, _ = alone(pair, "none", None, a, [])
    ref_b, _ = alone(pair, "none", None, b, [])
    expect = np.stack([ref_a[0], ref_b[2], ref_a[5], ref_b[8]])   # batch order
    assert rel_err(out, expect) <= REL


def test_batch_bad_input_is_refused_and_leaves_caches(pair):
    with rm.Model(pair, n_ctx=16, n_threads=2, residual_policy="none") as m:
        f = m.fork_session()
        m.eval([5, 6])
        with pytest.raises(rm.InvalidArgumentError, match="position 0; its next position is 2"):
            raw_batch([m, f], [7, 8], [0, 1], pos=[0, 0])
        with pytest.raises(rm.InvalidArgumentError, match="the same session"):
            raw_batch([m, m], [7, 8], [0, 1])
        with pytest.raises(rm.InvalidArgumentError, match="seq 2 outside"):
            raw_batch([m, f], [7, 8], [0, 2])
        with pytest.raises(rm.InvalidArgumentError, match="outside the vocabulary"):
            raw_batch([m, f], [7, VOCAB], [0, 1])
        with pytest.raises(rm.InvalidArgumentError, match="out holds"):
            raw_batch([m, f], [7, 8], [0, 1], want=[1, 1], out_rows=1)
        with pytest.raises(rm.ContextFullError, match="context of 16"):
            raw_batch([m, f], [7] * 15, [0] * 15)
        assert (m.n_past, f.n_past) == (2, 0)
        big = m.fork_session(n_ctx=64)   # the batch runs on sessions[0]'s scratch, sized for its context
        with pytest.raises(rm.InvalidArgumentError, match="context of 64, above sessions\\[0\\]'s 16"):
            raw_batch([m, big], [7, 8], [0, 1])
        assert (m.n_past, big.n_past) == (2, 0)
        with pytest.raises(rm.InvalidArgumentError, match="appears twice"):
            rm.eval_batch([(m, [1]), (m, [2])])
        m.set_calibration(True)
        with pytest.raises(rm.StateError, match="calibrating"):
            rm.eval_batch([(m, [1]), (f, [2])])


def test_batch_generate_many_equals_generate(pair):
    texts = ["the quick brown", "a b c d e f g h", "once"]
    with rm.Model(pair, n_ctx=96, n_threads=2, residual_policy="all") as m:
        many = m.generate_many(texts, 12, temperature=0)
        again = m.generate_many(texts[::-1], 12, temperature=0)   # sessions reused, prefixes kept
        each = [m.generate(t, 12, temperature=0) for t in texts]
    assert many == each and again == each[::-1]
    assert any(len(t) > 0 for t in many)
    stop = max(each, key=len)[3:5]   # a stop string that ends at least one reply early
    with rm.Model(pair, n_ctx=96, n_threads=2, residual_policy="all") as m:
        cut = m.generate_many(texts, 12, temperature=0, stop=[stop])
        assert cut == [m.generate(t, 12, temperature=0, stop=[stop]) for t in texts]
    assert cut != each


def test_batch_sliding_window_and_sinks(tmp_path):
    """gpt-oss: a sliding layer's ring (n_batch 5 over a window of 8) and sinks per sequence."""
    from test_arch_gpt_oss import make_tiny_gpt_oss

    out = tmp_path / "g.gguf"
    rm.convert(make_tiny_gpt_oss(tmp_path / "hf"), out, recipe="f32", progress=False)
    ps, decode = prompts((23, 11), seed=6), prompts((4, 4), seed=7)
    with rm.Model(out, n_ctx=64, n_threads=2, n_batch=5) as m:
        seqs = [m, m.fork_session()]
        got = [list(x) for x in rm.eval_batch(list(zip(seqs, ps)), all_logits=True)]
        for step in range(4):
            for g, x in zip(got, rm.eval_batch([(s, [d[step]]) for s, d in zip(seqs, decode)])):
                g.append(x)
    for p, d, g in zip(ps, decode, got):
        ref, _ = alone(out, "none", None, p, d, n_batch=5, residual=None)
        assert rel_err(np.stack(g), ref) <= REL


# -- prompt-prefix reuse -------------------------------------------------------------------------

def test_prefix_reuse_gives_the_logits_of_a_cold_prefill(pair):
    first, tail = prompts((30, 12), seed=8)
    second = first[:21] + tail
    with rm.Model(pair, n_ctx=96, n_threads=2, n_batch=16, residual_policy="all") as m:
        m.eval(first)
        keep = m._keep_prefix(second)
        assert keep == 21 and m.n_past == 21
        warm = m.eval(second[keep:])
        m.reset()
        cold = m.eval(second)
    np.testing.assert_array_equal(warm, cold)


def test_prefix_reuse_not_across_a_fork_or_a_new_policy(pair):
    """A fork's fresh cache holds nothing of its parent's, and a cache computed under another
    residual policy is not reused: both evaluate as a cold prefill does."""
    first, = prompts((20,), seed=9)
    with rm.Model(pair, n_ctx=64, n_threads=2, residual_policy="all") as m:
        m.eval(first)
        f = m.fork_session()
        f.eval([first[0] % (VOCAB - 1) + 1])   # another token at position 0 of the fork's cache
        assert f._keep_prefix(first) == 0
        m.set_residual("none")
        assert m._keep_prefix(first) == 0 and m.n_past == 0
        warm = m.eval(first)
        m.reset()
        np.testing.assert_array_equal(warm, m.eval(first))


def test_prefix_reuse_in_generate(pair):
    with rm.Model(pair, n_ctx=96, n_threads=2, residual_policy="all") as m:
        a = m.generate("the quick brown fox", 8, temperature=0)
        n_first = m.n_past
        b = m.generate("the quick brown fox jumps", 8, temperature=0)
        assert 0 < m.last_timings["prompt_reused"] < n_first
        m.reuse_prefix = False
        c = m.generate("the quick brown fox jumps", 8, temperature=0)
        assert m.last_timings["prompt_reused"] == 0
        assert b == c
        assert a == m.generate("the quick brown fox", 8, temperature=0)


def test_prefix_truncate_limits(pair, tmp_path):
    with rm.Model(pair, n_ctx=32, n_threads=2, residual_policy="none") as m:
        m.eval([5, 6, 7])
        with pytest.raises(rm.InvalidArgumentError, match="outside \\[0, 3\\]"):
            m.truncate(4)
        m.truncate(1)
        assert m.n_past == 1
    from test_arch_gpt_oss import make_tiny_gpt_oss

    out = tmp_path / "g.gguf"
    rm.convert(make_tiny_gpt_oss(tmp_path / "hf"), out, recipe="f32", progress=False)
    with rm.Model(out, n_ctx=64, n_threads=2, n_batch=4) as m:
        ids = prompts((40,), seed=9)[0]
        m.eval(ids)
        m.truncate(37)   # back n_batch positions: the ring still holds the window
        warm = m.eval(ids[37:])
        m.reset()
        np.testing.assert_array_equal(warm, m.eval(ids))
        with pytest.raises(rm.StateError, match="sliding window ring"):
            m.truncate(20)
        assert m._keep_prefix(ids[:20] + [3, 4]) == 0 and m.n_past == 0


def test_prefix_server_picks_the_slot_with_the_longest_prefix(pair):
    from rapidmoe_gguf import server

    a, b, c = prompts((12, 9, 5), seed=10)
    with rm.Model(pair, n_ctx=64, n_threads=2, residual_policy="none") as m:
        srv = server.Server(m, server.ServerConfig(parallel=3))
        try:
            srv.slots[1].eval(a)
            srv.slots[2].eval(b)
            assert srv._pick_slot(b[:7] + c, srv._free.get_nowait()) == 2
            assert srv._pick_slot(a + c, srv._free.get_nowait()) == 1
            assert srv._pick_slot(c, srv._free.get_nowait()) == 0
            assert srv._free.empty()
        finally:
            srv.close()


@pytest.fixture(scope="module")
def hybrid_pair(tmp_path_factory):
    """A Qwen3.5-MoE RESplit pair (Gated DeltaNet layers beside gated attention), calibrated."""
    from test_arch_qwen35 import make_tiny_hybrid

    d = tmp_path_factory.mktemp("hybrid-prefix")
    make_tiny_hybrid(d / "hf", "qwen3_5_moe")
    out = d / "h.gguf"
    rm.convert(d / "hf", out, recipe="q4_0-q4_0", progress=False)
    evaluate.calibrate(str(out), " ".join(_CORPUS), n_ctx=64, max_tokens=128, n_threads=2)
    return out


def test_prefix_hybrid_goes_back_to_a_checkpoint(hybrid_pair):
    """The linear layers' recurrent state describes the whole cache: truncation goes back only to a
    position whose states were kept (rm_session_checkpoint, the last two), and what follows is bit
    for bit a cold prefill's (the delta rule's chunks are aligned to positions)."""
    first, second, tail = prompts((90, 40, 30), seed=11)
    with rm.Model(hybrid_pair, n_ctx=256, n_threads=2, n_batch=32) as m:
        m.eval(first)
        with pytest.raises(rm.StateError, match="no checkpoint was taken at 50"):
            m.truncate(50)
        assert m._keep_prefix(first[:50] + [3]) == 0 and m.n_past == 0   # nothing kept: from the start
        m.eval(first)
        m._checkpoint()                                 # at 90
        m.eval(second)
        m._checkpoint()                                 # at 130
        m.eval(tail)
        assert lib.rm_session_reusable(m._live(), 129) == 90 and lib.rm_session_reusable(m._live(), 89) == 0
        warm_at = m._keep_prefix(first + second + [7, 8])
        assert warm_at == 130 and m.n_past == 130
        warm = m.eval([7, 8])
        assert m._keep_prefix(first + [5, 6]) == 90   # the checkpoint at 130 is gone with its tokens
        warm2 = m.eval([5, 6])
        m.reset()
        cold = m.eval(first + second + [7, 8])
        m.reset()
        cold2 = m.eval(first + [5, 6])
    np.testing.assert_array_equal(warm, cold)
    np.testing.assert_array_equal(warm2, cold2)


def test_prefix_hybrid_next_chat_turn_evaluates_only_the_new_tokens(hybrid_pair):
    """generate keeps the prompt's end, so a second prompt that repeats the first and adds to it
    evaluates only what is new, and answers (greedy and seeded, the default UMIA policy) exactly as
    on a fresh model."""
    turn1 = " ".join(_CORPUS)[:200]
    turn2 = turn1 + " and then some more words about experts"
    with rm.Model(hybrid_pair, n_ctx=512, n_threads=2, n_batch=32) as m:
        assert m.residual_policy == "umia"
        m.generate(turn1, 10, temperature=0)
        n1 = len(m.tokenize(turn1))
        got = m.generate(turn2, 12, temperature=0)
        assert m.last_timings["prompt_reused"] > 0.9 * n1
        got_seeded = m.generate(turn2 + " again", 12, temperature=0.9, seed=3)
        assert m.last_timings["prompt_reused"] >= len(m.tokenize(turn2)) - 2
    with rm.Model(hybrid_pair, n_ctx=512, n_threads=2, n_batch=32) as m:
        assert got == m.generate(turn2, 12, temperature=0)
        m.reset()
        assert got_seeded == m.generate(turn2 + " again", 12, temperature=0.9, seed=3)


def test_prefix_hybrid_checkpoints_at_chunks_and_the_tail(hybrid_pair):
    """A hybrid model reading a prompt keeps its states at every multiple of n_batch and 4 tokens
    before the end, besides the end (Model._prompt_marks), four at most, dropping the one in the
    densest place but the earliest and the latest: a later prompt that differs inside the first goes
    back to within a step of where it differs, one that differs in its last few tokens (a template
    re-rendering the last turn's end) to the tail; and answers exactly as a fresh model does."""
    first = prompts((100,), seed=12)[0]
    edited = first[:98] + [5, 6, 7, 8, 9, 10, 11, 12]   # 106 tokens, differs at 98
    trimmed = first[:70] + [13, 14, 15]                  # differs at 70
    with rm.Model(hybrid_pair, n_ctx=256, n_threads=2, n_batch=32) as m:
        a = m.create_completion(first, max_tokens=4, temperature=0)["choices"][0]["text"]
        live = m._live()
        assert [lib.rm_session_reusable(live, n) for n in (31, 32, 63, 64, 95, 96, 99, 100)] == \
            [0, 32, 32, 64, 64, 96, 96, 100]
        b = m.create_completion(edited, max_tokens=4, temperature=0)["choices"][0]["text"]
        assert m.last_timings["prompt_reused"] == 96                # the tail
        # 100 went with its tokens; the tail (102) and end (106) of this prompt came in and 96
        # left for them: the earliest (32) and the latest stay
        live = m._live()
        assert [lib.rm_session_reusable(live, n) for n in (40, 70, 101, 102, 106)] == [32, 64, 64, 102, 106]
        c = m.create_completion(trimmed, max_tokens=4, temperature=0)["choices"][0]["text"]
        assert m.last_timings["prompt_reused"] == 64
    with rm.Model(hybrid_pair, n_ctx=256, n_threads=2, n_batch=32) as m:
        m.reuse_prefix = False
        assert [m.create_completion(p, max_tokens=4, temperature=0)["choices"][0]["text"]
                for p in (first, edited, trimmed)] == [a, b, c]


# -- multi-head latent attention and linear-attention layers ---------------------------------------

@pytest.fixture(scope="module")
def other_arch(tmp_path_factory):
    """name -> an f32 file: DeepSeek-V3 with YaRN (deepseek2: multi-head latent attention, a
    low-rank q, leading dense layer, shared experts) or Qwen3.5-MoE (qwen35moe: Gated DeltaNet
    layers beside gated attention)."""
    from test_arch_deepseek import make_checkpoint
    from test_arch_qwen35 import make_tiny_hybrid

    cache = {}

    def get(name):
        if name not in cache:
            d = tmp_path_factory.mktemp(name)
            if name == "qwen3_5_moe":
                make_tiny_hybrid(d / "hf", name)
            else:
                make_checkpoint(d / "hf", name)
            cache[name] = d / "m.gguf"
            rm.convert(d / "hf", cache[name], recipe="f32", progress=False)
        return cache[name]

    return get


OTHER_ARCHS = ("deepseek_v3_yarn", "qwen3_5_moe")


def eval_all(m, ids):
    """Every position's logits of ids fed after m's cache (rm_session_eval, all logits)."""
    toks = np.asarray(ids, np.int32)
    out = np.empty((toks.size, m.n_vocab), np.float32)
    rm._native.check(lib.rm_session_eval(m._live(), ffi.from_buffer("int32_t[]", toks), int(toks.size), 1,
                                         ffi.from_buffer("float[]", out), out.size))
    return out


def mixed_step(seqs, chunks):
    """One rm_batch_eval of chunks[j] (maybe empty) for seqs[j], the tokens interleaved round-robin
    (the library groups them by session) with their positions; every row's logits, per sequence."""
    order = [(j, i) for i in range(max(map(len, chunks))) for j in range(len(seqs)) if i < len(chunks[j])]
    n_past = [s.n_past for s in seqs]
    out = raw_batch(seqs, [chunks[j][i] for j, i in order], [j for j, _ in order],
                    [n_past[j] + i for j, i in order], [1] * len(order))
    return [out[[k for k, (j, _) in enumerate(order) if j == jj]] for jj in range(len(seqs))]


# Three sequences at different positions: per step, the tokens each evaluates (prompt chunks and
# single decode tokens mixed; adjacent single tokens share MLA's absorbed form)
HEAD = (9, 3, 0)                    # evaluated alone before the batches
STEPS = ((1, 7, 12), (4, 1, 1), (1, 1, 1), (0, 5, 1), (1, 1, 20))


@pytest.mark.parametrize("n_batch", [64, 8])
@pytest.mark.parametrize("name", OTHER_ARCHS)
def test_batch_mla_and_linear_layers_match_each_alone(other_arch, name, n_batch):
    """Each sequence's logits in the mixed batches equal it run alone with the same chunks (with
    n_batch 8 the steps cut the sequences' chunks elsewhere than alone: the linear layers' chunked
    form then sums in another order), and after the batches each session goes on alone as one that
    never was in a batch."""
    path = other_arch(name)
    rng = np.random.default_rng(21)
    ids = [rng.integers(3, VOCAB, h + sum(st[j] for st in STEPS) + 2).tolist() for j, h in enumerate(HEAD)]
    with rm.Model(path, n_ctx=64, n_threads=2, n_batch=n_batch) as m:
        seqs = [m, m.fork_session(), m.fork_session(n_ctx=48)]
        for s, h, t in zip(seqs, HEAD, ids):
            if h:
                s.eval(t[:h])
        at = list(HEAD)
        got = [[] for _ in seqs]
        for st in STEPS:
            for j, rows in enumerate(mixed_step(seqs, [t[a:a + c] for t, a, c in zip(ids, at, st)])):
                got[j].append(rows)
            at = [a + c for a, c in zip(at, st)]
        assert [s.n_past for s in seqs] == at
        after = [np.stack([s.eval([t[a]]), s.eval([t[a + 1]])]) for s, t, a in zip(seqs, ids, at)]
    for j, t in enumerate(ids):
        with rm.Model(path, n_ctx=64, n_threads=2, n_batch=n_batch) as ref:
            if HEAD[j]:
                ref.eval(t[:HEAD[j]])
            a, want = HEAD[j], []
            for st in STEPS:
                if st[j]:
                    want.append(eval_all(ref, t[a:a + st[j]]))
                a += st[j]
            alone_after = np.stack([ref.eval([t[a]]), ref.eval([t[a + 1]])])
        err = rel_err(np.concatenate([g for g in got[j] if len(g)]), np.concatenate(want))
        assert err <= REL, f"{name} sequence {j}: rel err {err:.2e}"
        err = rel_err(after[j], alone_after)
        assert err <= REL, f"{name} sequence {j} after the batches: rel err {err:.2e}"


@pytest.mark.parametrize("name", OTHER_ARCHS)
def test_batch_mla_and_linear_layers_refused_batch_leaves_every_session(other_arch, name):
    """A batch refused for its last token leaves every session's n_past, KV cache and (Qwen3.5)
    recurrent states as they were: each then goes on as one that never saw the batch."""
    path = other_arch(name)
    a, b = prompts((12, 5), seed=22)
    with rm.Model(path, n_ctx=32, n_threads=2) as m:
        f = m.fork_session()
        m.eval(a[:10])
        f.eval(b[:3])
        with pytest.raises(rm.InvalidArgumentError, match="outside the vocabulary"):
            raw_batch([m, f], [a[10], b[3], m.n_vocab], [0, 1, 1])
        with pytest.raises(rm.ContextFullError, match="context of 32"):
            raw_batch([m, f], [a[10]] + [b[3]] * 30, [0] + [1] * 30)
        assert (m.n_past, f.n_past) == (10, 3)
        got = [m.eval(a[10:12]), f.eval(b[3:5])]
    for ids, g in zip((a, b), got):
        with rm.Model(path, n_ctx=32, n_threads=2) as ref:
            n = 10 if ids is a else 3
            ref.eval(ids[:n])
            assert rel_err(g, ref.eval(ids[n:n + 2])) <= REL


def test_batch_one_forward_pass_per_step(pair):
    """A decode step of three sequences is one forward pass of three rows on the first session
    (its profile counts one batch of 3 tokens; the others run none of their own), so each
    matrix, and each routed expert for all the rows routed to it, is read once per step; every
    session still counts its own token's expert activations."""
    ps = prompts((4, 5, 6), seed=12)
    with rm.Model(pair, n_ctx=32, n_threads=2, residual_policy="none") as m:
        seqs = sessions(m, 3)
        rm.eval_batch(list(zip(seqs, ps)))
        for s in seqs:
            s.clear_stats()
        rm.eval_batch([(s, [7]) for s in seqs])
        tokens = [s.profile()["tokens"] for s in seqs]
        assert tokens == [{"decode": 0, "prefill": 3}, {"decode": 0, "prefill": 0}, {"decode": 0, "prefill": 0}]
        k = m.info["n_expert_used"]
        assert all(int(s.stats()["active"].sum(axis=1).max()) == k for s in seqs)


def test_prefix_second_chat_turn_evaluates_only_the_new_tokens(pair):
    """Chat (create_chat_completion, as `rapidmoe chat` calls it): the second turn keeps the first
    turn's prompt in the cache and replies as a cold prefill does."""
    turn1 = [{"role": "user", "content": "the quick brown fox"}]
    with rm.Model(pair, n_ctx=192, n_threads=2, residual_policy="all") as m:
        r1 = m.create_chat_completion(turn1, max_tokens=6, temperature=0)["choices"][0]["message"]["content"]
        n1 = m.last_timings["prompt_tokens"]
        turn2 = turn1 + [{"role": "assistant", "content": r1}, {"role": "user", "content": "and then?"}]
        warm = m.create_chat_completion(turn2, max_tokens=6, temperature=0)["choices"][0]["message"]["content"]
        assert m.last_timings["prompt_reused"] >= n1 - 1
        m.reuse_prefix = False
        cold = m.create_chat_completion(turn2, max_tokens=6, temperature=0)["choices"][0]["message"]["content"]
        assert m.last_timings["prompt_reused"] == 0
    assert warm == cold


class _SetAfter:
    """A cancel flag that reads unset n times, then set."""

    def __init__(self, n):
        self.n = n

    def is_set(self):
        self.n -= 1
        return self.n < 0


def test_prefill_stops_between_steps_when_cancelled(pair):
    """A 30-token prompt in steps of 8: cancelled after the first step, generation yields nothing
    and the cache holds that step, which the next generation of the prompt keeps."""
    ids = prompts((30,), seed=13)[0]
    greedy = rm.SamplingParams(temperature=0)
    with rm.Model(pair, n_ctx=96, n_threads=2, n_batch=8, residual_policy="all") as m:
        m.cancel = _SetAfter(1)
        assert list(m.generate_tokens(ids, 5, greedy)) == [] and m.n_past == 8
        m.cancel = None
        warm = list(m.generate_tokens(ids, 5, greedy))
        assert m.last_timings["prompt_reused"] == 8
        m.reuse_prefix = False
        assert list(m.generate_tokens(ids, 5, greedy)) == warm and len(warm) > 0
