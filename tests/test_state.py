"""A sequence saved to a file and taken back (Model.save_state / load_state, and the server's
/slots/{id}?action=save|restore): the loaded session continues bit for bit as the saved one would
have, and a file of another model, of other cache types, too long for the context or damaged is
refused with the session unchanged. The families with caches of their own shape (the hybrids'
recurrent states, sliding-window rings, MLA's latents) are checked in their arch tests."""

from __future__ import annotations

import os

import httpx
import numpy as np
import pytest

import rapidmoe_gguf as rm
from rapidmoe_gguf.bundled import bundled_model_path
from rapidmoe_gguf.errors import FormatError, StateError

from test_server import running

TEXT = "The quick brown fox jumps over the lazy dog. " * 4


def continued(m: rm.Model, ids) -> np.ndarray:
    """The logits of feeding ids one at a time after what the cache holds."""
    return np.stack([m.eval([t]) for t in ids])


@pytest.mark.parametrize("cache", ["f32", "f16", "q8_0"])
def test_state_round_trip_continues_bit_for_bit(tmp_path, cache):
    """Saved after a prompt (the bundled model runs its UMIA residual policy, whose controllers are
    part of the state), loaded into a fresh Model: the next tokens' logits are the saved session's
    bit for bit, the last logits come back, and the tokens let a prompt that repeats them reuse
    the cache."""
    path = tmp_path / "s.state"
    kw = dict(n_ctx=256, n_threads=2, cache_type_k=cache, cache_type_v=cache)
    with rm.Model(bundled_model_path(), **kw) as m:
        ids = m.tokenize(TEXT)
        last = m.eval(ids)
        n = m.save_state(path)
        assert n == os.path.getsize(path) and m.n_past == len(ids)
        more = m.tokenize(" and runs away")
        want = continued(m, more)
    with rm.Model(bundled_model_path(), **kw) as m2:
        m2.eval(m2.tokenize("something else entirely"))       # replaced by the state
        assert m2.load_state(path) == len(ids) and m2.n_past == len(ids)
        assert np.array_equal(m2._logits, last)
        assert m2._reusable(ids + more) == len(ids)
        assert np.array_equal(continued(m2, more), want)


def test_state_generation_after_restore_equals_uninterrupted(tmp_path):
    """Greedy text generated after a restore is the text generated without the interruption, and
    evaluates only the tokens after the saved prompt."""
    path = tmp_path / "s.state"
    with rm.Model(bundled_model_path(), n_ctx=256, n_threads=2) as m:
        ids = m.tokenize(TEXT)
        want = m.generate(TEXT, max_tokens=12, temperature=0)
        m.reset()
        m.eval(ids[:-1])
        m.save_state(path)
    with rm.Model(bundled_model_path(), n_ctx=256, n_threads=2) as m2:
        m2.load_state(path)
        assert m2.generate(TEXT, max_tokens=12, temperature=0) == want
        assert m2.last_timings["prompt_reused"] == len(ids) - 1


def test_state_refusals_leave_the_session_unchanged(tmp_path, tiny_hf):
    """Another model's file, other cache types, a context too small, a damaged or foreign file:
    each refused naming the problem, and the session keeps its sequence."""
    path = tmp_path / "s.state"
    with rm.Model(bundled_model_path(), n_ctx=256, n_threads=2) as m:
        ids = m.tokenize(TEXT)
        m.eval(ids)
        m.save_state(path)
    data = path.read_bytes()

    other = tmp_path / "other.gguf"
    rm.convert(tiny_hf("qwen3_moe"), other, recipe="f32", progress=False)
    with rm.Model(other, n_ctx=256, n_threads=2) as t:
        t.eval([5, 6, 7])
        with pytest.raises(StateError, match="another model"):
            t.load_state(path)
        assert t.n_past == 3

    def refused(error, match, **kw):
        with rm.Model(bundled_model_path(), n_threads=2, **{"n_ctx": 256, **kw}) as m2:
            m2.eval([1, 2, 3, 4])
            m2.eval([5])
            with pytest.raises(error, match=match):
                m2.load_state(path)
            assert m2.n_past == 5 and np.array_equal(m2.eval([6]), continued_ref(kw))

    def continued_ref(kw):
        with rm.Model(bundled_model_path(), n_threads=2, **{"n_ctx": 256, **kw}) as r:
            r.eval([1, 2, 3, 4, 5])
            return r.eval([6])

    refused(StateError, "cache types", cache_type_k="f16", cache_type_v="f16")
    refused(StateError, "context", n_ctx=len(ids) - 1)
    for bad, what in [(data[:-100], "damaged or truncated"), (data[:20], "damaged|truncated|not a"),
                      (b"GGUF" + data[4:], "not a rapidmoe state file"), (b"", "not a rapidmoe state file")]:
        path.write_bytes(bad)
        refused(FormatError, what)
    path.write_bytes(data[:30] + bytes([data[30] ^ 0xFF]) + data[31:])   # inside the JSON header
    refused(FormatError, "damaged")
    import json
    import struct
    n_head = struct.unpack_from("<Q", data, 8)[0]
    head = json.loads(data[16:16 + n_head])
    for key, bad in [("tokens", 7), ("tokens", [0] * head["n_past"]  + [1]), ("tokens", [10 ** 9] * head["n_past"]),
                     ("state_bytes", -5), ("n_past", "many")]:
        forged = json.dumps({**head, key: bad}).encode()
        path.write_bytes(data[:8] + struct.pack("<Q", len(forged)) + forged + data[16 + n_head:])
        refused(FormatError, "damaged|truncated")


def test_state_save_leaves_no_partial_file(tmp_path, monkeypatch):
    """A save that fails while writing leaves the earlier file as it was and no temporary."""
    path = tmp_path / "s.state"
    with rm.Model(bundled_model_path(), n_ctx=256, n_threads=2) as m:
        m.eval(m.tokenize(TEXT))
        m.save_state(path)
        good = path.read_bytes()
        m.eval([9, 10])

        def broken(f):
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(rm.model.atomic, "fsync_file", broken)
        with pytest.raises(OSError, match="cannot write"):
            m.save_state(path)
    assert path.read_bytes() == good and os.listdir(tmp_path) == ["s.state"]


def test_server_slot_save_restore_erase(tmp_path):
    """llama-server's slot actions: save writes the slot's sequence into --slot-save-path, erase
    empties the slot, restore takes it back so that a request repeating the prompt evaluates only
    the rest, with the same reply; names that leave the folder, unknown actions and slots, and a
    server without a save path are refused."""
    saves = tmp_path / "slots"
    saves.mkdir()
    msgs = [{"role": "user", "content": TEXT}]
    with running(rm.Model(bundled_model_path(), n_ctx=512, n_threads=2), parallel=1,
                 slot_save_path=str(saves)) as (url, state):
        with httpx.Client(base_url=url, timeout=60) as c:
            first = c.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 8, "temperature": 0}).json()
            n_prompt = first["usage"]["prompt_tokens"]
            r = c.post("/slots/0?action=save", json={"filename": "agent.state"})
            assert r.status_code == 200, r.text
            saved = r.json()
            assert saved["id_slot"] == 0 and saved["n_saved"] >= n_prompt
            assert saved["n_written"] == os.path.getsize(saves / "agent.state") and "save_ms" in saved["timings"]
            assert c.post("/slots/0?action=erase", json={}).json() == {"id_slot": 0, "n_erased": saved["n_saved"]}
            assert state.slots[0].n_past == 0
            r = c.post("/slots/0?action=restore", json={"filename": "agent.state"})
            assert r.status_code == 200, r.text
            assert r.json()["n_restored"] == saved["n_saved"]
            again = c.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 8, "temperature": 0}).json()
            assert again["choices"][0]["message"] == first["choices"][0]["message"]
            assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
            assert again["usage"]["prompt_tokens_details"] == {"cached_tokens": n_prompt - 1}
            for body, query, status in [({"filename": "../x"}, "save", 400), ({"filename": ".hidden"}, "save", 400),
                                        ({"filename": "a/b"}, "restore", 400), ({}, "save", 400),
                                        ({"filename": "missing"}, "restore", 404), ({}, "launch", 400)]:
                r = c.post(f"/slots/0?action={query}", json=body)
                assert r.status_code == status, (body, query, r.text)
                assert str(saves) not in r.text
            assert c.post("/slots/7?action=erase", json={}).status_code == 400
            (saves / "junk").write_bytes(b"not a state")
            r = c.post("/slots/0?action=restore", json={"filename": "junk"})
            assert r.status_code == 400 and "not a rapidmoe state file" in r.text
        assert sorted(os.listdir(saves)) == ["agent.state", "junk"]
    with running(rm.Model(bundled_model_path(), n_ctx=256, n_threads=2)) as (url, _):
        r = httpx.post(f"{url}/slots/0?action=save", json={"filename": "x"})
        assert r.status_code == 501 and "--slot-save-path" in r.text
