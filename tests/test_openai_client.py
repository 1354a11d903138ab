"""The server against the official `openai` Python client: completions, chat, streaming, errors,
and the extra residual fields (sent through `extra_body`)."""

from __future__ import annotations

import pytest

import rapidmoe_gguf as rm
from test_server import MESSAGES, gguf, running  # noqa: F401  (gguf is a fixture)

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def client(gguf):  # noqa: F811
    with running(rm.Model(gguf, n_ctx=256, n_threads=2), parallel=2, queue=8, api_key="sk-test") as (url, _):
        yield openai.OpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0)


def test_openai_models_and_completion(client):
    models = client.models.list()
    name = models.data[0].id
    r = client.completions.create(model=name, prompt="hello world", max_tokens=8, temperature=0.7, seed=3)
    assert r.object == "text_completion" and r.choices[0].finish_reason in ("stop", "length")
    again = client.completions.create(model=name, prompt="hello world", max_tokens=8, temperature=0.7, seed=3)
    assert r.choices[0].text == again.choices[0].text
    assert 0 < r.usage.completion_tokens <= 8


def test_openai_chat_and_streaming_agree(client):
    name = client.models.list().data[0].id
    whole = client.chat.completions.create(model=name, messages=MESSAGES, max_tokens=12, temperature=0.8,
                                           seed=11)
    assert whole.choices[0].message.role == "assistant"
    stream = client.chat.completions.create(model=name, messages=MESSAGES, max_tokens=12, temperature=0.8,
                                            seed=11, stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == whole.choices[0].message.content


def test_openai_residual_fields_and_errors(client):
    name = client.models.list().data[0].id
    r = client.chat.completions.create(model=name, messages=MESSAGES, max_tokens=4,
                                       extra_body={"residual_policy": "all"})
    assert r.choices[0].message.content is not None
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=name, prompt="hi", max_tokens=-1)
    assert "max_tokens" in str(e.value)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="hi", max_tokens=2)
    bad = openai.OpenAI(base_url=client.base_url, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
