"""Image parts through ``render: sglang_chat`` and ``render: template`` with the bundled Kimi
template: one ``<|media_pad|>`` per image, and the images' order as the prompt holds them.

The oracle for ``sglang_chat`` is SGLang's own chat path, recorded by
``conformance/chat_images.py`` (``tests/fixtures/kimi-images/chat-path-sglang-0.5.23.json``)
and replayed here; the tests above the replay state the same rules by hand, readable on their
own.

What SGLang's chat path does with image parts (``process_content_for_template_format``,
parser/jinja_template_utils.py:215-338: an ``image_url`` part becomes ``{"type": "image"}``) and
with a run of tool results holding images (``_canonicalize_tool_message_order``,
serving_chat.py:851-917: ordered as the calls, for a template that reads ``tool_call_id``) is
written out here by hand and rendered with transformers' ``apply_chat_template``.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from eagle3_datagen.inputs.images import LoadedImage, image_refs
from eagle3_datagen.inputs.prompts import Prompt, parse_prompt
from eagle3_datagen.render.chat_tokenizer import ChatTokenizer, RenderError
from eagle3_datagen.render.sglang_chat import tool_results_by_call
from tests.support import REPO, TOKENIZER_DIR

ASSETS = REPO / "src" / "eagle3_datagen" / "assets"
# The render needs only the references; the bytes matter to the request, not to the ids.
_ANY_IMAGE = LoadedImage(b"", "", 1, 1, "PNG")


@pytest.fixture(scope="module")
def hf() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(TOKENIZER_DIR))


def _prompt(tmp_path: Path, messages: list[dict[str, Any]]) -> Prompt:
    for name, size in (("a.png", (30, 30)), ("b.png", (60, 20))):
        out = io.BytesIO()
        Image.new("RGB", size).save(out, format="PNG")
        (tmp_path / name).write_bytes(out.getvalue())
    got = parse_prompt(json.dumps({"id": "x", "messages": messages}).encode(), 1, tmp_path)
    assert isinstance(got, Prompt)
    return got


def _img(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


CALLS = [
    {"id": f"c{i}", "type": "function", "function": {"name": "look", "arguments": "{}"}}
    for i in (1, 2)
]


def tool_run_messages() -> list[dict[str, Any]]:
    """Two tool results, each an image, given in the reverse of their calls' order."""
    return [
        {"role": "user", "content": "Look at both."},
        {"role": "assistant", "content": "", "tool_calls": CALLS},
        {"role": "tool", "tool_call_id": "c2", "content": [_img("b.png")]},
        {"role": "tool", "tool_call_id": "c1", "content": [_img("a.png")]},
    ]


def test_the_kimi_template_pairs_tool_results_by_call_id(hf: Any) -> None:
    assert tool_results_by_call(hf.chat_template)
    assert not tool_results_by_call("{% for m in messages %}{{ m.content }}{% endfor %}")


def test_sglang_chat_puts_image_tool_results_in_call_order(tmp_path: Path, hf: Any) -> None:
    prompt = _prompt(tmp_path, tool_run_messages())
    tok = ChatTokenizer(str(TOKENIZER_DIR), render="sglang_chat")
    assert tok.image_order(prompt) == ["a.png", "b.png"]
    as_sglang = [
        {"role": "user", "content": "Look at both."},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": c["id"], "type": "function", "function": {"name": "look", "arguments": {}}}
                for c in CALLS
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "image"}]},
        {"role": "tool", "tool_call_id": "c2", "content": [{"type": "image"}]},
    ]
    want = hf.apply_chat_template(as_sglang, add_generation_prompt=True, tokenize=False)
    assert tok.render_text(prompt) == want
    pad = hf.convert_tokens_to_ids("<|media_pad|>")
    assert tok.render([prompt])[0].count(pad) == 2  # type: ignore[union-attr]


def test_template_render_keeps_the_data_order(tmp_path: Path, hf: Any) -> None:
    prompt = _prompt(tmp_path, tool_run_messages())
    tok = ChatTokenizer(str(TOKENIZER_DIR), render="template")
    assert tok.image_order(prompt) == ["b.png", "a.png"]
    want = hf.apply_chat_template(prompt.messages, add_generation_prompt=True, tokenize=False)
    assert tok.render_text(prompt) == want


def test_kimi_image_parts_render_with_template_and_are_refused_by_sglang_chat(
    tmp_path: Path, hf: Any
) -> None:
    """``{"type": "image"}`` is what Kimi's template tests for, not a part SGLang's chat path
    accepts (recorded below: ``kimi_image_part``)."""
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Compare"},
                _img("a.png"),
                {"type": "image", "image": "b.png"},
            ],
        }
    ]
    prompt = _prompt(tmp_path, messages)
    tok = ChatTokenizer(str(TOKENIZER_DIR), render="template")
    assert tok.render_text(prompt) == hf.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )
    assert tok.image_order(prompt) == ["a.png", "b.png"]
    refused = ChatTokenizer(str(TOKENIZER_DIR), render="sglang_chat").render([prompt])[0]
    assert isinstance(refused, RenderError) and "image_url" in refused.reason


RECORDED = REPO / "tests" / "fixtures" / "kimi-images" / "chat-path-sglang-0.5.23.json"


@pytest.mark.parametrize("asset", ["kimi-k2.5-mini", "kimi-k2.5-tiktoken"])
def test_recorded_sglang_chat_path_on_image_messages(asset: str) -> None:
    """Each request of ``conformance/chat_images.py`` renders to the prompt ids SGLang's own
    ``_apply_jinja_template`` built, its images in the order SGLang handed them on; a request
    SGLang refused is a reject here."""
    cases = json.loads(RECORDED.read_text(encoding="utf-8"))[asset]
    assert len(cases) >= 20 and any(c["status"] != 200 for c in cases)
    tok = ChatTokenizer(str(ASSETS / asset), render="sglang_chat")
    prompts = []
    for i, case in enumerate(cases):
        messages, tools = case["request"]["messages"], case["request"].get("tools")
        images = {url: _ANY_IMAGE for url in image_refs(messages)}
        prompts.append(Prompt(case["name"], i, messages, tools, images))
    rendered = tok.render(prompts)
    wrong = []
    for case, prompt, got in zip(cases, prompts, rendered, strict=True):
        if case["status"] != 200:
            if not isinstance(got, RenderError):
                wrong.append(f"{case['name']}: SGLang refused it, we rendered it")
        elif got != case["prompt_ids"]:
            wrong.append(f"{case['name']}: ids differ")
        elif tok.image_order(prompt) != case["image_urls"]:
            wrong.append(f"{case['name']}: image order {tok.image_order(prompt)}")
    assert not wrong, wrong
