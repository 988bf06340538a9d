"""Rendering prompts to token ids with the model's own tokenizer and chat template.

Why on the client: the server never sees text, so the prompt ids we store are exactly the ids the
model was conditioned on. ``render`` equals ``apply_chat_template(..., tokenize=True)``; it renders
each prompt's template to text and encodes the whole batch in one call, which is what
``apply_chat_template`` does internally, one prompt at a time. With a fast tokenizer that call
goes straight to Rust; a Python tokenizer (Kimi-K2.5's remote-code tiktoken one) takes the
tokenizer's own ``__call__``, which encodes the texts one by one.

What reaches the template depends on the render reference (docs/render.md): ``sglang_chat`` (the
default) first reshapes messages and tools as SGLang 0.5.23's ``/v1/chat/completions`` does
(:mod:`eagle3_datagen.render.sglang_chat`); ``template`` hands the data to the template as it is.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from eagle3_datagen.errors import TokenizerError
from eagle3_datagen.inputs.images import image_refs
from eagle3_datagen.inputs.prompts import Prompt
from eagle3_datagen.render import sglang_chat
from eagle3_datagen.render.sglang_chat import RENDER_REFERENCES, RenderReference, SglangChatError

log = logging.getLogger(__name__)

# SGLang 0.5.23 refuses a request's own template unless launched to trust it
# (serving_chat.py:1108-1116, 400); the server's default kwargs may hold one.
REQUEST_TEMPLATE_REFUSED = (
    "Request-supplied chat_template is not allowed. Start the server with "
    "--trust-request-chat-template to permit it."
)

# The arguments SGLang's chat path passes to apply_chat_template by name beside
# **chat_template_kwargs (serving_chat.py:2323-2330) and the template's own (jinja's messages):
# kwargs repeating one fail the request (SGLang answers 500).
NAMED_ARGUMENTS = (
    "add_generation_prompt",
    "conversation",
    "messages",
    "return_dict",
    "tokenize",
    "tools",
)


def named_argument_refusal(kwargs: dict[str, Any]) -> str | None:
    """Why kwargs that repeat an argument SGLang passes by name fail, or None."""
    clash = sorted(set(kwargs) & set(NAMED_ARGUMENTS))
    if not clash:
        return None
    keys = ", ".join(repr(k) for k in clash)
    return (
        f"chat_template_kwargs sets {keys}, which SGLang's chat path passes to the chat template "
        "itself, so SGLang fails the request (500 Internal server error, 400 for "
        "'conversation'); remove it from the kwargs"
    )


@dataclass(slots=True)
class RenderError:
    """The chat template failed for one prompt (e.g. it raised on an unexpected message)."""

    reason: str


def _remote_code_classes(path: str) -> list[str]:
    """The classes ``auto_map`` names for AutoTokenizer in a local tokenizer_config.json."""
    try:
        config = orjson.loads((Path(path) / "tokenizer_config.json").read_bytes())
        names = config["auto_map"]["AutoTokenizer"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return [n for n in (names if isinstance(names, list) else [names]) if isinstance(n, str)]


@functools.cache
def _load(path: str, trust_remote_code: bool) -> Any:
    remote = _remote_code_classes(path)
    if remote and not trust_remote_code:
        # transformers 5 would quietly build another tokenizer (a fast one converted from the
        # vocabulary file) whose ids need not be the model's: refuse instead.
        raise TokenizerError(
            f"the tokenizer at {path!r} is remote code ({remote[0]}); "
            "set model.trust_remote_code: true to load it"
        )
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.getLogger("transformers").setLevel(logging.ERROR)
        from transformers import AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
        except Exception as err:  # transformers raises OSError, ValueError, ...
            raise TokenizerError(f"cannot load tokenizer from {path!r}: {err}") from None
    if remote and type(tok).__name__ not in {n.rsplit(".", 1)[-1] for n in remote}:
        # Some transformers releases forced Kimi-K2.5 onto a converted fast tokenizer despite
        # auto_map, giving wrong ids from 163589 up (</think> included).
        raise TokenizerError(
            f"transformers loaded {type(tok).__name__} for {path!r}, not the remote code "
            f"{remote[0]} its tokenizer_config.json names; its ids need not be the model's"
        )
    return tok


class ChatTokenizer:
    """A loaded tokenizer plus the chat-template kwargs and render reference of the run."""

    def __init__(
        self,
        path: str,
        *,
        trust_remote_code: bool = True,
        chat_template_kwargs: dict[str, Any] | None = None,
        render: RenderReference = "sglang_chat",
    ) -> None:
        if render not in RENDER_REFERENCES:
            raise TokenizerError(f"render must be one of {RENDER_REFERENCES}, not {render!r}")
        self.path = path
        self.reference: RenderReference = render
        self.tok = _load(path, trust_remote_code)
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        if not getattr(self.tok, "chat_template", None):
            raise TokenizerError(f"tokenizer at {path!r} has no chat template")

    def token_id(self, token: str) -> int:
        """The id of a special token given by its string; it must be exactly one token."""
        ids = self.tok.encode(token, add_special_tokens=False)
        if len(ids) != 1:
            raise TokenizerError(
                f"{token!r} is not a single token in {self.path!r} (encodes to {ids}); "
                "check special_tokens in the config"
            )
        return int(ids[0])

    def render_text(self, prompt: Prompt) -> str:
        """The prompt's text: the template over the data (``template``) or over the request as
        SGLang's chat path hands it to the template (``sglang_chat``)."""
        if "chat_template" in prompt.kwargs:  # the line's or its mode's, as a request's
            raise SglangChatError(REQUEST_TEMPLATE_REFUSED)
        clash = named_argument_refusal({**self.chat_template_kwargs, **prompt.kwargs})
        if clash is not None:  # said here: the retry with flat tools below would hide it
            raise SglangChatError(clash)
        if self.reference == "template":
            return self._apply_template(prompt.messages, prompt.tools, prompt.kwargs)
        template = self._template_text()
        fmt = sglang_chat.content_format(template)
        messages, tools = sglang_chat.prepare(prompt.messages, prompt.tools, fmt, template)
        try:
            return self._apply_template(messages, tools, prompt.kwargs)
        except Exception:  # SGLang renders once more with unwrapped tools (serving_chat.py:2205)
            return self._apply_template(messages, sglang_chat.flat_tools(tools), prompt.kwargs)

    def _template_text(self) -> str:
        template = self.tok.chat_template
        return template if isinstance(template, str) else str(template)

    def image_order(self, prompt: Prompt) -> list[str]:
        """The line's image references in the order the rendered prompt holds their
        placeholders: message order, except that SGLang's chat path puts a run of tool results
        holding images in the order of their calls (``sglang_chat.canonical_tool_order``)."""
        if not prompt.images:
            return []
        messages = prompt.messages
        if self.reference == "sglang_chat":
            template = self._template_text()
            if sglang_chat.content_format(template) != "openai":
                return []  # SGLang's string format drops image parts
            if sglang_chat.tool_results_by_call(template):
                messages = sglang_chat.canonical_tool_order(messages)
        return image_refs(messages)

    def kwargs_for(self, prompt: Prompt) -> dict[str, Any]:
        """The request's chat_template_kwargs for a line: the run's, then its mode's and its
        own (``Prompt.kwargs``, inputs/modes.py), later keys winning."""
        return {**self.chat_template_kwargs, **prompt.kwargs}

    def _apply_template(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        line_kwargs: dict[str, Any],
    ) -> str:
        # As SGLang's chat path (serving_chat.py:2323-2330): **request.chat_template_kwargs
        # beside the named arguments, so a line that repeats one (tools, add_generation_prompt,
        # tokenize, return_dict) fails as SGLang's request would.
        text = self.tok.apply_chat_template(
            messages,
            tools=tools,
            add_generation_prompt=True,
            tokenize=False,
            return_dict=False,
            **{**self.chat_template_kwargs, **line_kwargs},
        )
        return str(text)

    def render(self, prompts: Sequence[Prompt]) -> list[list[int] | RenderError]:
        """Token ids for each prompt, or why its template failed; the batch encoded in one call."""
        texts: list[str] = []
        slots: list[int] = []
        out: list[list[int] | RenderError] = []
        for prompt in prompts:
            try:
                texts.append(self.render_text(prompt))
                slots.append(len(out))
                out.append(RenderError("unrendered"))
            except SglangChatError as err:
                out.append(RenderError(f"SGLang's chat path refuses the request: {err}"))
            except Exception as err:  # jinja2 raises TemplateError, transformers ValueError, ...
                out.append(RenderError(f"chat template failed: {err}"))
        if texts:
            backend = self._rust_backend()
            if backend is not None:
                encoded = [
                    e.ids for e in backend.encode_batch_fast(texts, add_special_tokens=False)
                ]
            else:
                encoded = self.tok(texts, add_special_tokens=False)["input_ids"]
            for slot, ids in zip(slots, encoded, strict=True):
                out[slot] = list(ids)
        return out

    def _rust_backend(self) -> Any | None:
        """The Rust tokenizer, when calling it directly gives exactly what ``self.tok(...)`` does.

        Why: ``self.tok(texts)`` runs the same ``encode_batch`` but also computes offsets and
        converts every encoding to dicts: ~40% of the encode CPU (benchmarks, part d). Only
        when nothing would differ: no truncation or padding configured on the backend, special
        tokens not split. Slow (Python) tokenizers have no backend and take ``self.tok``.
        """
        backend = getattr(self.tok, "_tokenizer", None)
        if backend is None or not hasattr(backend, "encode_batch_fast"):
            return None
        if backend.truncation is not None or backend.padding is not None:
            return None
        if getattr(self.tok, "split_special_tokens", False) or backend.encode_special_tokens:
            return None
        return backend

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tok.decode(list(ids), skip_special_tokens=False))

    def fingerprint(self) -> dict[str, Any]:
        """Identifies the vocabulary, special tokens and chat template (for provenance)."""
        vocab = self.tok.get_vocab()
        vocab_blob = orjson.dumps(sorted(vocab.items(), key=lambda kv: kv[1]))
        added = {str(i): t.content for i, t in self.tok.added_tokens_decoder.items()}
        template = self.tok.chat_template
        if isinstance(template, dict):
            template = orjson.dumps(template, option=orjson.OPT_SORT_KEYS).decode()
        return {
            "tokenizer_path": self.path,
            "vocab_size": len(vocab),
            "vocab_sha256": hashlib.sha256(vocab_blob).hexdigest(),
            "special_tokens_sha256": hashlib.sha256(
                orjson.dumps(added, option=orjson.OPT_SORT_KEYS)
            ).hexdigest(),
            "chat_template_sha256": hashlib.sha256(str(template).encode()).hexdigest(),
        }
