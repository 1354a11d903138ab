"""Chat: a conversation rendered with the model's own chat template, and chat completions in
llama-cpp-python's dict shapes.

The template (``tokenizer.chat_template`` in the GGUF, copied from the checkpoint's
tokenizer_config.json) is rendered the way transformers' ``apply_chat_template`` renders it: a
sandboxed, immutable Jinja environment with ``trim_blocks`` and ``lstrip_blocks``, the
``loopcontrols`` extension, a ``tojson`` that leaves non-ASCII and HTML characters alone, and the
globals ``raise_exception`` and ``strftime_now``. Templates come from model files, so they are
untrusted code: the sandbox refuses attribute access to Python internals.

A model without a template cannot chat: there is no fallback format, because guessing one (ChatML,
say) for a model trained on another gives fluent-looking nonsense. Such a model raises
UnsupportedError; use ``create_completion`` with a prompt written in the model's own format.
"""

from __future__ import annotations

import contextlib
import functools
import json
import time
import uuid
from datetime import datetime
from typing import Iterator, Sequence

from .errors import InvalidArgumentError, UnsupportedError

ROLES = ("system", "user", "assistant", "tool", "developer")


@functools.lru_cache(maxsize=8)
def _compile(template: str):
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    try:
        return env.from_string(template)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise UnsupportedError(f"the model's chat template does not parse (line {exc.lineno}): {exc.message}") from exc


def _plain_messages(messages: Sequence[dict]) -> list[dict]:
    """Checked copies of the messages: a role from ROLES, content a string (a list of OpenAI text
    parts is joined; an assistant message with tool calls may have no content)."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise InvalidArgumentError("messages must be a list of {'role': ..., 'content': ...} objects")
    if not messages:
        raise InvalidArgumentError("messages is empty: give at least one message")
    out = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise InvalidArgumentError(
                f"messages[{i}] must be an object with 'role' and 'content', got {type(msg).__name__}")
        role, content = msg.get("role"), msg.get("content")
        if role not in ROLES:
            raise InvalidArgumentError(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r}")
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise InvalidArgumentError(
                        f"messages[{i}].content[{j}]: only text parts ({{'type': 'text', 'text': ...}}) are supported")
                texts.append(part["text"])
            content = "".join(texts)
        elif content is None and role == "assistant" and msg.get("tool_calls"):
            content = ""
        elif not isinstance(content, str):
            raise InvalidArgumentError(f"messages[{i}].content must be a string, got {type(content).__name__}")
        out.append(dict(msg, role=role, content=content))
    return out


def render(template: str, messages: Sequence[dict], add_generation_prompt: bool = True,
           bos_token: str = "", eos_token: str = "", **variables) -> str:
    """The conversation as the template writes it (what transformers' apply_chat_template returns
    with tokenize=False). ``variables`` are further template variables (e.g. tools)."""
    import jinja2

    compiled = _compile(template)
    variables.setdefault("tools", None)
    variables.setdefault("documents", None)
    try:
        return compiled.render(messages=_plain_messages(messages), add_generation_prompt=add_generation_prompt,
                               bos_token=bos_token, eos_token=eos_token, **variables)
    except jinja2.exceptions.TemplateError as exc:   # raise_exception, and the sandbox's refusals
        raise InvalidArgumentError(f"the chat template rejected the messages: {exc}") from exc


def _token_text(tokenizer, token_id: int | None) -> str:
    if token_id is None or not 0 <= token_id < tokenizer.n_vocab:
        return ""
    return tokenizer.token_to_piece(token_id).decode("utf-8", "replace")


def chat_prompt(model, messages: Sequence[dict], add_generation_prompt: bool = True) -> list[int]:
    """Token ids of the conversation rendered with ``model``'s template. BOS is added when the
    model wants one and the template did not write it already."""
    tok = model.tokenizer
    if not tok.chat_template:
        raise UnsupportedError(
            f"{model.path}: the model has no chat template (tokenizer.chat_template is not in its GGUF "
            "metadata); use create_completion with a prompt in the model's own format")
    bos, eos = _token_text(tok, tok.bos_id), _token_text(tok, tok.eos_id)
    text = render(tok.chat_template, messages, add_generation_prompt, bos_token=bos, eos_token=eos)
    ids = tok.encode(text, add_special=False)
    if tok.add_bos and tok.bos_id is not None and (not ids or ids[0] != tok.bos_id):
        ids.insert(0, tok.bos_id)
    return ids


def create_chat_completion(llm, messages: Sequence[dict], max_tokens: int | None = None,
                           temperature: float = 0.8, top_p: float = 0.95, top_k: int = 40,
                           min_p: float = 0.05, repeat_penalty: float = 1.0, seed: int | None = None,
                           stop: str | Sequence[str] | None = None, stream: bool = False,
                           model: str | None = None):
    """``llm.create_chat_completion`` (see Model): ``llm`` is the Model, ``model`` the name the
    result reports (default: the file's name)."""
    prompt = chat_prompt(llm, messages)
    if max_tokens is None:
        max_tokens = max(llm.n_ctx - len(prompt), 0)
    completion = llm.create_completion(
        prompt, max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
        repeat_penalty=repeat_penalty, seed=seed, stop=stop, stream=stream, model=model)
    if stream:
        return as_chat_chunks(completion)
    choice = completion["choices"][0]
    return {"id": "chat" + completion["id"], "object": "chat.completion", "created": completion["created"],
            "model": completion["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": choice["text"]},
                         "logprobs": None, "finish_reason": choice["finish_reason"]}],
            "usage": completion["usage"]}


def as_chat_chunks(completion: Iterator[dict]) -> Iterator[dict]:
    """Text-completion chunks (a generator) as chat chunks: the role first, then content, then an
    empty delta with the finish reason. Closing this closes ``completion``, stopping generation."""
    head = None
    with contextlib.closing(completion):
        for c in completion:
            if head is None:
                head = {"id": "chat" + c["id"], "object": "chat.completion.chunk", "created": c["created"],
                        "model": c["model"]}
                yield dict(head, choices=[{"index": 0, "delta": {"role": "assistant"}, "logprobs": None,
                                           "finish_reason": None}])
            choice = c["choices"][0]
            if choice["finish_reason"] is not None:
                yield dict(head, choices=[{"index": 0, "delta": {}, "logprobs": None,
                                           "finish_reason": choice["finish_reason"]}])
            elif choice["text"]:
                yield dict(head, choices=[{"index": 0, "delta": {"content": choice["text"]}, "logprobs": None,
                                           "finish_reason": None}])
