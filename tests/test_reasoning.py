"""A thinking model's <think> block as reasoning_content (chat.Thinking, chat.thinking_mode):
split in every way a stream may cut it, through the Python API and the server, and left in the
content with reasoning_format "none"."""

from __future__ import annotations

import pytest

import rapidmoe_gguf as rm
from rapidmoe_gguf import chat, tool_calls
from rapidmoe_gguf.bundled import bundled_model_path
from rapidmoe_gguf.errors import InvalidArgumentError
from conftest import write_gguf_like
from test_server import running

# ChatML whose generation prompt opens the reply's thinking, as DeepSeek-R1's and Qwen3.5's do
# (with enable_thinking false it writes an empty block, as Qwen3's does).
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}"
    "{% endif %}")

CASES = [  # (inside, reply, reasoning, content)
    (False, "<think>\nLet me see.\nIt is 4.\n</think>\n\nThe answer is 4.", "Let me see.\nIt is 4.", "The answer is 4."),
    (False, "  <think>a</think>b", "a", "b"),
    (True, "Hmm, so.\n</think>\n\nYes.", "Hmm, so.", "Yes."),
    (True, "Still thinking <th", "Still thinking <th", ""),
    (False, "Hello <think>not a block</think>", "", "Hello <think>not a block</think>"),
    (False, "  plain text", "", "  plain text"),
    (False, "<thi", "", "<thi"),
    (False, "<think>unfinished", "unfinished", ""),
    (True, "</think>only content", "", "only content"),
    # Gemma 4's thought channel
    (False, "<|channel>thought\nFour, since 2 + 2.\n<channel|>The answer is 4.", "Four, since 2 + 2.",
     "The answer is 4."),
    (False, "<|channel>thought\n<channel|>Plain.", "", "Plain."),
    (False, "<|chan", "", "<|chan"),
    (False, "<|channel>thought\nunfinished <chan", "unfinished <chan", ""),
]


def _split(inside: bool, pieces: list[str]) -> tuple[str, str]:
    t = chat.Thinking(inside)
    out = [p for piece in pieces for p in t.read(piece)] + t.read_rest()
    return ("".join(x for k, x in out if k == "reasoning"), "".join(x for k, x in out if k == "content"))


@pytest.mark.parametrize("inside, reply, reasoning, content", CASES)
def test_reasoning_thinking_splits_the_same_however_the_stream_is_cut(inside, reply, reasoning, content):
    assert _split(inside, [reply]) == (reasoning, content)
    assert _split(inside, list(reply)) == (reasoning, content)
    for cut in range(len(reply) + 1):
        for cut2 in range(cut, len(reply) + 1, 3):
            assert _split(inside, [reply[:cut], reply[cut:cut2], reply[cut2:]]) == (reasoning, content), (cut, cut2)


def test_reasoning_gemma4_template_thinks_in_its_channel():
    """Gemma 4's template: its thought channel is the thinking block read (thinking off writes an
    empty one into the prompt, which the reply then does not open)."""
    import llamacpp_oracle as llamacpp
    from pathlib import Path

    if llamacpp.src() is None:
        pytest.skip("llama.cpp's source, which ships the templates, is not at hand (LLAMA_CPP_SRC)")
    template = (Path(llamacpp.src()) / "models" / "templates" / "google-gemma-4-31B-it.jinja").read_text()
    assert chat.think_tags(template) == ("<|channel>thought", "<channel|>")
    assert chat.think_tags(THINKING_TEMPLATE) == ("<think>", "</think>")
    reply = chat.Reply(thinking=False)
    message = chat.fold_message(reply.feed("<|channel>thought\nCall it.<channel|>Done.") + reply.flush())
    assert message["reasoning_content"] == "Call it." and message["content"] == "Done."


def test_reasoning_reply_deltas_carry_tool_calls_after_the_block():
    """The content after a think block is read for calls, as any content is."""
    use = tool_calls.tool_use("{{ tools }}<tool_call>", [{"type": "function", "function": {"name": "f"}}],
                                 "auto", None)
    reply = chat.Reply(tools=use, thinking=False)
    deltas = reply.feed('<think>I should call f.</think>\n<tool_call>{"name": "f", "arguments": {}}</tool_call>')
    message = chat.fold_message(deltas + reply.flush())
    assert message["reasoning_content"] == "I should call f."
    assert message["tool_calls"][0]["function"]["name"] == "f" and message["content"] is None


@pytest.fixture(scope="module")
def thinking_model(tmp_path_factory):
    path = tmp_path_factory.mktemp("think") / "tiny-think.gguf"
    write_gguf_like(bundled_model_path(), path, kv={"tokenizer.chat_template": THINKING_TEMPLATE})
    with rm.Model(str(path), n_ctx=512, n_threads=2) as m:
        yield m


ASK = [{"role": "user", "content": "What is two plus two?"}]


def test_reasoning_python_api_thinking_model(thinking_model):
    """The prompt opens the thinking: the reply (which never closes it) is reasoning_content, equal
    to the text reasoning_format "none" leaves in content; streamed the same; with thinking off
    (chat_template_kwargs) it is content."""
    m = thinking_model
    raw = m.create_chat_completion(ASK, max_tokens=24, temperature=0, reasoning_format="none")["choices"][0]["message"]
    assert "reasoning_content" not in raw and raw["content"].strip()
    r = m.create_chat_completion(ASK, max_tokens=24, temperature=0)["choices"][0]["message"]
    assert r["reasoning_content"] == raw["content"].strip() and r["content"] == ""
    chunks = list(m.create_chat_completion(ASK, max_tokens=24, temperature=0, stream=True))
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == r["reasoning_content"]
    assert not "".join(d.get("content") or "" for d in deltas)
    off = m.create_chat_completion(ASK, max_tokens=24, temperature=0,
                                   chat_template_kwargs={"enable_thinking": False})["choices"][0]["message"]
    assert "reasoning_content" not in off and off["content"]
    with pytest.raises(InvalidArgumentError, match="reasoning_format"):
        m.create_chat_completion(ASK, max_tokens=2, reasoning_format="hidden")


def test_reasoning_bundled_model_has_no_thinking():
    with rm.Model(bundled_model_path(), n_ctx=256, n_threads=2) as m:
        assert chat.thinking_mode(m.tokenizer, m.tokenize("hi")) is None


def test_reasoning_server(thinking_model, tmp_path):
    """Through the server with the openai client: reasoning_content beside content, streamed too;
    a request's reasoning_format "none", and the server's --reasoning-format none, leave it in content."""
    openai = pytest.importorskip("openai")
    want = thinking_model.create_chat_completion(ASK, max_tokens=24, temperature=0)["choices"][0]["message"]
    path = tmp_path / "tiny-think.gguf"
    write_gguf_like(bundled_model_path(), path, kv={"tokenizer.chat_template": THINKING_TEMPLATE})
    with running(rm.Model(str(path), n_ctx=512, n_threads=2), parallel=2) as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        r = client.chat.completions.create(model="tiny-think", messages=ASK, max_tokens=24, temperature=0)
        assert r.choices[0].message.model_extra["reasoning_content"] == want["reasoning_content"]
        assert r.choices[0].message.content == ""
        stream = client.chat.completions.create(model="tiny-think", messages=ASK, max_tokens=24, temperature=0,
                                                stream=True)
        assert "".join((c.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
                       for c in stream if c.choices) == want["reasoning_content"]
        raw = client.chat.completions.create(model="tiny-think", messages=ASK, max_tokens=24, temperature=0,
                                             extra_body={"reasoning_format": "none"})
        assert raw.choices[0].message.content.strip() == want["reasoning_content"]
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="tiny-think", messages=ASK, max_tokens=2,
                                           extra_body={"reasoning_format": "hidden"})
        assert e.value.body["param"] == "reasoning_format"
        resp = client.responses.create(model="tiny-think", input=ASK[0]["content"], max_output_tokens=24,
                                       temperature=0)
        assert resp.output[0].type == "reasoning" and resp.output[0].content[0].text == want["reasoning_content"]
        anthropic = pytest.importorskip("anthropic")
        claude = anthropic.Anthropic(base_url=url, api_key="none", max_retries=0)
        m = claude.messages.create(model="tiny-think", max_tokens=24, messages=ASK, extra_body={"temperature": 0})
        assert m.content[0].type == "thinking" and m.content[0].thinking == want["reasoning_content"]
    with running(rm.Model(str(path), n_ctx=512, n_threads=2), reasoning_format="none") as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        r = client.chat.completions.create(model="tiny-think", messages=ASK, max_tokens=24, temperature=0)
        assert r.choices[0].message.content.strip() == want["reasoning_content"]
