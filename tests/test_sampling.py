"""The native sampler: greedy, temperature, top-k, top-p, min-p, repetition penalty, seeds."""

from __future__ import annotations

import numpy as np
import pytest

import rapidmoe_gguf as rm
from rapidmoe_gguf.sampling import Sampler

LOGITS = np.log(np.array([0.4, 0.25, 0.15, 0.1, 0.05, 0.03, 0.02], np.float32))


def _draws(n=4000, **kw):
    s = Sampler(rm.SamplingParams(**dict(dict(top_k=0, top_p=1.0, min_p=0.0, seed=3), **kw)))
    return np.bincount([s.sample(LOGITS) for _ in range(n)], minlength=LOGITS.size) / n


def test_sampling_greedy_takes_the_argmax():
    rng = np.random.default_rng(0)
    for _ in range(20):
        x = rng.normal(size=300).astype(np.float32)
        assert Sampler(rm.SamplingParams(temperature=0.0)).sample(x) == int(x.argmax())


def test_sampling_temperature_one_follows_softmax():
    freq = _draws(temperature=1.0)
    p = np.exp(LOGITS) / np.exp(LOGITS).sum()
    assert np.abs(freq - p).max() < 0.03, (freq, p)


def test_sampling_low_temperature_sharpens():
    assert _draws(temperature=0.3)[0] > _draws(temperature=1.0)[0] + 0.2


def test_sampling_top_k_top_p_min_p_cut_the_tail():
    assert np.all(_draws(temperature=1.0, top_k=2)[2:] == 0)
    # the nucleus of 0.7 is the first two tokens (0.4 + 0.25 = 0.65 < 0.7 <= 0.8)
    assert np.all(_draws(temperature=1.0, top_p=0.7)[3:] == 0)
    # min_p 0.3: keep p >= 0.12, i.e. the first three
    assert np.all(_draws(temperature=1.0, min_p=0.3)[3:] == 0)
    assert _draws(temperature=1.0, min_p=0.3)[2] > 0


def test_sampling_repeat_penalty_lowers_recent_tokens():
    s = Sampler(rm.SamplingParams(temperature=0.0, repeat_penalty=2.0))
    assert s.sample(LOGITS, recent=[]) == 0
    x = np.array([1.0, 0.8, 0.1], np.float32)   # 1.0 / 2 = 0.5 < 0.8
    assert s.sample(x, recent=[0]) == 1


def test_sampling_same_seed_same_draws():
    a = Sampler(rm.SamplingParams(temperature=1.0, seed=42))
    b = Sampler(rm.SamplingParams(temperature=1.0, seed=42))
    c = Sampler(rm.SamplingParams(temperature=1.0, seed=43))
    da = [a.sample(LOGITS) for _ in range(64)]
    assert da == [b.sample(LOGITS) for _ in range(64)]
    assert da != [c.sample(LOGITS) for _ in range(64)]


@pytest.mark.parametrize("bad", [dict(temperature=-1.0), dict(top_p=0.0), dict(top_p=1.5), dict(min_p=-0.1),
                                 dict(repeat_penalty=0.0), dict(top_k=-1)])
def test_sampling_invalid_values_are_refused(bad):
    with pytest.raises(rm.InvalidArgumentError):
        Sampler(rm.SamplingParams(**bad))


def test_sampling_params_hold_every_entry_points_defaults():
    """SamplingParams is the one source of the sampling defaults: the CLI's flags, the server's
    request fields and the API's keyword arguments all take theirs from it (the CLI's repeat
    penalty was 1.1 before; it is now 1.0, off, as everywhere else and as llama.cpp defaults)."""
    import inspect

    from rapidmoe_gguf import chat, cli, server
    from rapidmoe_gguf.sampling import SAMPLING_DEFAULTS

    d = rm.SamplingParams()
    assert dict(SAMPLING_DEFAULTS) == {k: getattr(d, k) for k in SAMPLING_DEFAULTS}
    assert d.repeat_penalty == 1.0
    flags = {"temp": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
             "repeat_penalty": "repeat_penalty", "seed": "seed"}
    for command in (["run"], ["chat", "m.gguf"]):
        args = cli.build_parser().parse_args(command)
        assert {f: getattr(args, f) for f in flags} == {f: SAMPLING_DEFAULTS[k] for f, k in flags.items()}
    for name in set(flags.values()):
        assert server.COMMON_FIELDS[name][1] == SAMPLING_DEFAULTS[name]
        for fn in (rm.Model.create_completion, rm.Model.create_chat_completion, chat.create_chat_completion):
            assert inspect.signature(fn).parameters[name].default == SAMPLING_DEFAULTS[name], (fn, name)
