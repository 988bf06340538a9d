"""Image messages through SGLang 0.5.23's own chat path: the prompt ids and the images' order.

    .venv-conformance/bin/python -m conformance.chat_images [--out FILE]

Why: ``render: sglang_chat`` claims the prompt ids ``POST /v1/chat/completions`` builds for a
request with image parts (one ``<|media_pad|>`` per image) and ``ChatTokenizer.image_order``
the order in which the chat path hands the images on (``image_data``), which is the order the
server pairs them with the placeholders. The oracle is SGLang's own
``OpenAIServingChat._apply_jinja_template`` (``serving_chat.py:2011-2257``) with
``is_multimodal=True``, called in process on SGLang's request model
(``ChatCompletionRequest``), its ``TemplateManager`` and the harness's tokenizer manager
(``conformance/fake_engine.py``), set up as ``conformance/server.py`` sets up the HTTP app for
Kimi-K2.5 (``--tool-call-parser kimi_k2 --reasoning-parser kimi_k2``). Not through HTTP: the
harness's fake engine is not multimodal, so the HTTP route would stop before the images are
processed. A request SGLang refuses (request model or template) is recorded with the error.

The corpus: one and several images, image-only content, images in multi-turn histories, in
tool results (in and out of the calls' order, mixed with text results), in an assistant
message, beside declared tools, and part shapes SGLang refuses. The recording
(``tests/fixtures/kimi-images/chat-path-sglang-0.5.23.json``) is replayed in CI by
``tests/unit/test_image_render.py``, without SGLang.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from conformance.process import REPO, model_dir

OUT = REPO / "tests" / "fixtures" / "kimi-images" / "chat-path-sglang-0.5.23.json"
ASSETS = ("kimi-k2.5-mini", "kimi-k2.5-tiktoken")
FLAGS = [
    "--tool-call-parser",
    "kimi_k2",
    "--reasoning-parser",
    "kimi_k2",
    "--trust-remote-code",
    "--random-seed",
    "1",
]


def _img(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _calls(*ids: str) -> list[dict[str, Any]]:
    return [
        {"id": i, "type": "function", "function": {"name": "look", "arguments": '{"n": 1}'}}
        for i in ids
    ]


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "look",
            "description": "Look.",
            "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}},
        },
    }
]


def corpus() -> list[dict[str, Any]]:
    """The requests, each ``{"name", "request"}``.

    Long because it is a table of cases: one entry per request, read best side by side.
    """
    ask = {"role": "assistant", "content": "", "tool_calls": _calls("c1", "c2")}
    cases: dict[str, dict[str, Any]] = {
        "one_image": {
            "messages": [{"role": "user", "content": [_text("What is it?"), _img("a.png")]}]
        },
        "image_first": {
            "messages": [{"role": "user", "content": [_img("a.png"), _text("Describe.")]}]
        },
        "image_only": {"messages": [{"role": "user", "content": [_img("b.png")]}]},
        "three_images": {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        _img("a.png"),
                        _text("versus"),
                        _img("b.png"),
                        _img("c.png"),
                        _text("?"),
                    ],
                }
            ]
        },
        "system_then_image": {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": [_img("a.png")]},
            ]
        },
        "multi_turn": {
            "messages": [
                {"role": "user", "content": [_text("First:"), _img("a.png")]},
                {"role": "assistant", "content": "A cat."},
                {"role": "user", "content": [_text("And this one?"), _img("b.png")]},
            ]
        },
        "multi_turn_reasoning": {
            "messages": [
                {"role": "user", "content": [_img("a.png")]},
                {"role": "assistant", "content": "A cat.", "reasoning_content": "Looks feline."},
                {"role": "user", "content": "Sure?"},
            ]
        },
        "tools_declared": {
            "tools": TOOLS,
            "messages": [{"role": "user", "content": [_text("Count."), _img("a.png")]}],
        },
        "tool_results_in_order": {
            "tools": TOOLS,
            "messages": [
                {"role": "user", "content": "Look at both."},
                ask,
                {"role": "tool", "tool_call_id": "c1", "content": [_img("a.png")]},
                {"role": "tool", "tool_call_id": "c2", "content": [_img("b.png")]},
            ],
        },
        "tool_results_reversed": {
            "tools": TOOLS,
            "messages": [
                {"role": "user", "content": "Look at both."},
                ask,
                {"role": "tool", "tool_call_id": "c2", "content": [_img("b.png")]},
                {"role": "tool", "tool_call_id": "c1", "content": [_text("here"), _img("a.png")]},
            ],
        },
        "tool_results_reversed_text_only": {
            "tools": TOOLS,
            "messages": [
                {"role": "user", "content": [_img("c.png")]},
                ask,
                {"role": "tool", "tool_call_id": "c2", "content": "two"},
                {"role": "tool", "tool_call_id": "c1", "content": "one"},
            ],
        },
        "tool_results_reversed_mixed": {
            "tools": TOOLS,
            "messages": [
                {"role": "user", "content": "Look."},
                ask,
                {"role": "tool", "tool_call_id": "c2", "content": [_img("b.png")]},
                {"role": "tool", "tool_call_id": "c1", "content": "plain text"},
            ],
        },
        "tool_results_unknown_id": {
            "tools": TOOLS,
            "messages": [
                {"role": "user", "content": "Look."},
                ask,
                {"role": "tool", "tool_call_id": "c9", "content": [_img("b.png")]},
                {"role": "tool", "tool_call_id": "c1", "content": [_img("a.png")]},
            ],
        },
        "tool_run_then_follow_up": {
            "tools": TOOLS,
            "messages": [
                {"role": "user", "content": [_img("c.png")]},
                ask,
                {"role": "tool", "tool_call_id": "c2", "content": [_img("b.png")]},
                {"role": "tool", "tool_call_id": "c1", "content": [_img("a.png")]},
                {"role": "assistant", "content": "Both seen."},
                {"role": "user", "content": [_text("Again"), _img("d.png")]},
            ],
        },
        "image_in_assistant_history": {
            "messages": [
                {"role": "user", "content": "Draw."},
                {"role": "assistant", "content": [_text("Here:"), _img("a.png")]},
                {"role": "user", "content": "Thanks."},
            ]
        },
        "data_uri": {
            "messages": [
                {
                    "role": "user",
                    "content": [_img("data:image/png;base64,iVBORw0KGgo="), _text("?")],
                }
            ]
        },
        "same_image_twice": {
            "messages": [{"role": "user", "content": [_img("a.png"), _img("a.png")]}]
        },
        "kimi_image_part": {
            "messages": [{"role": "user", "content": [{"type": "image", "image": "a.png"}]}]
        },
        "image_url_as_string": {
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "a.png"}]}]
        },
        "image_url_without_url": {
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]
        },
    }
    return [{"name": name, "request": {"model": "m", **req}} for name, req in cases.items()]


def _serving_chat(asset: str, work: Path) -> Any:
    """SGLang's OpenAIServingChat over the harness's tokenizer manager, set up as the HTTP app
    is (conformance/server.py)."""
    from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
    from sglang.srt.parser.template_detection import resolve_auto_parsers
    from sglang.srt.parser.template_manager import TemplateManager
    from sglang.srt.runtime_context import publish
    from sglang.srt.server_args import prepare_server_args

    from conformance.fake_engine import FakeSettings, FakeTokenizerManager

    path = model_dir(work, asset)
    args = prepare_server_args(["--model-path", str(path), *FLAGS])
    args.device = "cpu"
    args.resolve_once()
    args.check_server_args()
    resolve_auto_parsers(args)
    publish(args, role="tokenizer")
    settings = FakeSettings(
        kv_pool_tokens=None,
        latency_s=0.0,
        log_path=None,
        mean_output_tokens=8.0,
        max_output_tokens=8,
        outputs_path=None,
    )
    manager = FakeTokenizerManager(args, settings)
    templates = TemplateManager()
    templates.initialize_templates(
        tokenizer_manager=manager,
        model_path=str(path),
        chat_template=None,
        completion_template=None,
    )
    return OpenAIServingChat(manager, templates)


def _answer(chat: Any, request: dict[str, Any]) -> dict[str, Any]:
    from pydantic import ValidationError
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest

    try:
        parsed = ChatCompletionRequest(**request)
        tools = [t.model_dump() for t in parsed.tools] if parsed.tools else None
        result = chat._apply_jinja_template(parsed, tools, True)
    except (ValidationError, ValueError) as err:
        return {"status": 400, "error": f"{type(err).__name__}: {str(err)[:300]}"}
    urls = [getattr(item, "url", item) for item in result.image_data or []]
    return {"status": 200, "prompt_ids": list(result.prompt_ids), "image_urls": urls}


def record(assets: tuple[str, ...] = ASSETS) -> dict[str, Any]:
    """Every case of the corpus through SGLang's chat path, per bundled tokenizer."""
    from conformance.stubs import install

    install()  # torchvision cannot load on a CPU box (conformance/stubs.py)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="chat-images-") as work:
        for asset in assets:
            chat = _serving_chat(asset, Path(work))
            out[asset] = [{**case, **_answer(chat, case["request"])} for case in corpus()]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    args.out.write_text(json.dumps(record(), indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
