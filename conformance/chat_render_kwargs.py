"""Serving-mode kwargs through SGLang 0.5.23's own chat path: what it renders, and what it refuses.

    .venv-conformance/bin/python -m conformance.chat_render_kwargs [--out DIR] [--asset NAME ...]

Why: a line renders with ``model.chat_template_kwargs``, then its mode's, then its own kwargs,
later keys winning (docs/modes.md), and the pipeline stops a partition's plan on a kwargs set
the template refuses (``generate/kwargs_probe.py``). Both claims are checked here against
SGLang's real ``POST /v1/chat/completions`` (the app of ``conformance/chat_render.py``):

* explicit ``{"thinking": true}`` and ``{"thinking": false}`` (as modes, as a line's own
  kwargs, and a line's own over its mode's), on plain chats, tools, data tool-call histories
  and multi-turn ``all_turns`` histories whose earlier turns carry reasoning;
* model-level kwargs: a second app launched with ``--default-chat-template-kwargs`` (SGLang
  fills each key the request leaves unset, ``serving_chat.py:1805-1809``), the request carrying
  the line's mode and own kwargs; both set ``thinking`` and ``tools_ts_str`` (a variable the
  Kimi-K2.5 template reads in place of the tools' JSON), so which one wins shows in the ids;
* kwargs sets SGLang's chat path may refuse: keys it passes by name, ``chat_template``, keys
  transformers reads, values the template only reads.

Each case records the line as the pipeline sees it (``line``: its mode, its own kwargs), the
server's default kwargs, the request sent (its ``chat_template_kwargs`` are the mode's then the
line's) and SGLang's answer: prompt ids, or status and message. Replayed in CI by
``tests/unit/test_sglang_chat_kwargs.py``; written to
``tests/fixtures/sglang-0.5.23/chat_render/kwargs/<tokenizer>.json``.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import httpx

from conformance.chat_render import FLAGS, OUT, _conversation, ask, record_main
from conformance.process import RealAppProcess, model_dir

SEED = 23
MODES: dict[str, dict[str, Any]] = {"thinking": {"thinking": True}, "instant": {"thinking": False}}
# The model-level kwargs of the second app (--default-chat-template-kwargs).
MODEL_KWARGS: dict[str, Any] = {"thinking": False, "tools_ts_str": "[model-level tools]"}
KWARGS_OUT = OUT / "kwargs"

# (mode, own kwargs) of the lines each conversation is sent as, per server.
LINES: list[tuple[str | None, dict[str, Any]]] = [
    ("thinking", {}),
    ("instant", {}),
    (None, {"thinking": True}),
    (None, {"thinking": False}),
    ("instant", {"thinking": True}),
    ("thinking", {"thinking": False}),
]
MODEL_LINES: list[tuple[str | None, dict[str, Any]]] = [
    (None, {}),
    ("thinking", {}),
    ("instant", {}),
    (None, {"thinking": True, "tools_ts_str": "[line tools]"}),
    ("instant", {"tools_ts_str": "[line tools]"}),
]
# Own kwargs of a line that SGLang's chat path may refuse (a plain chat, mode or not): keys
# it passes by name, a request's own template, arguments transformers reads, odd values.
REFUSAL_CANDIDATES: list[tuple[str | None, dict[str, Any]]] = [
    (None, {"add_generation_prompt": False}),
    ("instant", {"add_generation_prompt": True}),
    (None, {"tools": []}),
    (None, {"tokenize": True}),
    (None, {"return_dict": True}),
    (None, {"return_dict": False}),
    (None, {"conversation": []}),
    (None, {"messages": []}),
    (None, {"chat_template": "{{ 'x' }}"}),
    (None, {"continue_final_message": True}),
    (None, {"truncation": True, "max_length": 4}),
    (None, {"documents": [{"title": "a", "text": "b"}]}),
    (None, {"return_assistant_tokens_mask": True}),
    (None, {"thinking": "false"}),
    (None, {"thinking": None}),
    ("thinking", {"tools_ts_str": 5}),
    (None, {"spaces_between_special_tokens": False}),
]


def _line(
    name: str, request: dict[str, Any], mode: str | None, own: dict[str, Any], server: Any
) -> dict[str, Any]:
    kwargs = {**(MODES[mode] if mode is not None else {}), **own}
    sent = {**request, "chat_template_kwargs": kwargs} if kwargs else dict(request)
    return {
        "name": name,
        "default_chat_template_kwargs": server,
        "line": {"mode": mode, "kwargs": own},
        "request": sent,
    }


def _conversations(rng: random.Random, n: int) -> list[tuple[str, dict[str, Any]]]:
    """Plain multi-turn chats, tool histories as data sets write them, and ``all_turns``
    histories of regenerated turns (reasoning kept); at least two user turns each."""
    kinds = [("chat", False, False), ("tools", True, False), ("all_turns", True, True)]
    out = []
    for i in range(n):
        for kind, tools, regenerated in kinds:
            request = _conversation(
                rng, tools=tools, turns=rng.randrange(2, 4), regenerated=regenerated, system=i == 0
            )
            out.append((f"{kind}_{i}", request))
    return out


def kwargs_corpus(seed: int = SEED) -> list[dict[str, Any]]:
    """Every case (without SGLang's answer), the same for a seed."""
    rng = random.Random(seed)
    cases = []
    for conv, request in _conversations(rng, 4):
        for mode, own in LINES:
            tag = f"{mode or 'custom'}{'_own_' + str(own['thinking']).lower() if own else ''}"
            cases.append(_line(f"{conv}_{tag}", request, mode, own, None))
    for conv, request in _conversations(rng, 2):
        for j, (mode, own) in enumerate(MODEL_LINES):
            cases.append(_line(f"model_{conv}_{j}", request, mode, own, MODEL_KWARGS))
    plain = {"messages": [{"role": "user", "content": "Hi"}]}
    for j, (mode, own) in enumerate(REFUSAL_CANDIDATES):
        cases.append(_line(f"kwargs_set_{j:02d}_{'_'.join(own)}", plain, mode, own, None))
    return cases


def record_asset(asset: str, work: Path) -> dict[str, Any]:
    """SGLang's answer to every case: one app as deployed, one with the model-level kwargs."""
    cases = kwargs_corpus()
    model = model_dir(work, asset)
    for server in (None, MODEL_KWARGS):
        flags = [*FLAGS]
        if server is not None:
            flags += ["--default-chat-template-kwargs", json.dumps(server)]
        app = RealAppProcess(work, *flags, model_path=model)
        with app, httpx.Client() as client:
            for case in cases:
                if case["default_chat_template_kwargs"] == server:
                    case.update(ask(client, app.url, case["request"]))
    return {
        "about": "SGLang 0.5.23's POST /v1/chat/completions over the kwargs corpus of "
        "conformance/chat_render_kwargs.py; prompt_ids as the response's prompt_token_ids",
        "asset": asset,
        "flags": FLAGS,
        "modes": MODES,
        "cases": cases,
    }


def main(argv: list[str] | None = None) -> int:
    return record_main(argv, "conformance.chat_render_kwargs", KWARGS_OUT, record_asset)


if __name__ == "__main__":
    raise SystemExit(main())
