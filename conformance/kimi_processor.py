"""Real image bytes through SGLang 0.5.23's Kimi-K2.5 multimodal processor, end to end.

    .venv-conformance/bin/python -m conformance.kimi_processor [--out FILE] [--make-images]

Why: for an image prompt the pipeline sends ``input_ids`` with one ``<|media_pad|>`` per image
and the images as data URIs in ``image_data``, and stores the ids the model saw
(``model_prompt_ids``) and each image's token count, computed on the client
(``generate/media.py``). The oracle is what SGLang's server does with that request: its
``KimiK2_5VLImageProcessor.process_mm_data_async`` (``multimodal/processors/kimi_k25.py``,
``kimi_common.py``, ``base_processor.py``), found by SGLang's own registry
(``get_mm_processor``) for the model's ``hf_config`` loaded by SGLang's ``ModelConfig``, on a
``GenerateReqInput`` built from the client's request: SGLang decodes the data URIs
(``load_image``, ``_load_single_item``), checks the pairing, counts each image with the
checkpoint processor's ``media_tokens_calculator`` (its CPU path, ``_cpu_call``), expands the
ids (``_expand_image_token_ids``), preprocesses the pixels and splits them per image.

What is SGLang's and what is not: every step above is SGLang 0.5.23's code. The checkpoint's
remote-code processor it delegates to (counting, resizing, patchifying) is not on PyPI; in its
place runs vLLM 0.33.0's installed CPU port of it (``conformance/kimi_hf_processor.py`` says
which parts), so the checkpoint's own ``media_utils.py`` stays unproven (docs/images.md).

The corpus: the images in ``tests/fixtures/kimi-images/corpus/`` (made by ``--make-images``:
PNG, JPEG, WEBP, GIF; tiny, at and over every limit of the fixture config
``tests/fixtures/kimi-images/preprocessor_config.json``; an EXIF-rotated JPEG, palette, RGBA,
LA, grayscale, CMYK, an animated GIF), each alone in a prompt, and conversations with several
images, repeated images, images in multi-turn histories, in tool results out of the calls'
order and in an assistant message, plus a prompt whose placeholders and images do not pair.
Every case is rendered by the pipeline's own parser and renderer (``render: sglang_chat``) for
both bundled tokenizers. The recording (``tests/fixtures/kimi-images/processor-sglang-0.5.23.json``)
is replayed in CI by ``tests/unit/test_kimi_processor_replay.py``, without SGLang.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from conformance.process import REPO, model_dir

FIXTURES = REPO / "tests" / "fixtures" / "kimi-images"
CORPUS = FIXTURES / "corpus"
CONFIG = FIXTURES / "preprocessor_config.json"
OUT = FIXTURES / "processor-sglang-0.5.23.json"
ASSETS = ("kimi-k2.5-mini", "kimi-k2.5-tiktoken")
FLAGS = ["--trust-remote-code", "--random-seed", "1"]

# name -> (size, format, Pillow mode, extra): at and around the fixture config's limits
# (patch 14 px, merge factor 28 px, 256 patches in all, 24 patches on a side = 336 px).
IMAGES: dict[str, tuple[tuple[int, int], str, str, str]] = {
    "tiny-1x1.png": ((1, 1), "PNG", "RGB", ""),
    "under-patch-13x9.png": ((13, 9), "PNG", "RGB", ""),
    "one-patch-14x14.png": ((14, 14), "PNG", "RGB", ""),
    "merge-28x28.png": ((28, 28), "PNG", "RGB", ""),
    "odd-29x57.jpg": ((29, 57), "JPEG", "RGB", ""),
    "budget-224x224.png": ((224, 224), "PNG", "RGB", ""),
    "over-budget-225x225.png": ((225, 225), "PNG", "RGB", ""),
    "side-336x28.png": ((336, 28), "PNG", "RGB", ""),
    "over-side-337x20.png": ((337, 20), "PNG", "RGB", ""),
    "tall-20x4000.png": ((20, 4000), "PNG", "RGB", ""),
    "wide-4000x20.webp": ((4000, 20), "WEBP", "RGB", ""),
    "large-1000x700.jpg": ((1000, 700), "JPEG", "RGB", ""),
    "exif-rotated-60x30.jpg": ((60, 30), "JPEG", "RGB", "exif-orientation-6"),
    "palette-40x30.png": ((40, 30), "PNG", "P", "transparency"),
    "rgba-50x50.png": ((50, 50), "PNG", "RGBA", ""),
    "la-16x44.png": ((16, 44), "PNG", "LA", ""),
    "gray-31x70.jpg": ((31, 70), "JPEG", "L", ""),
    "cmyk-30x30.jpg": ((30, 30), "JPEG", "CMYK", ""),
    "animated-45x45.gif": ((45, 45), "GIF", "P", "two-frames"),
}


def _draw(size: tuple[int, int], mode: str, shift: int = 0) -> Any:
    """A deterministic picture: a colour field with a few shapes (so a resize has work)."""
    from PIL import Image, ImageDraw

    w, h = size
    image = Image.new("RGB", size, ((40 + shift) % 256, (90 * w) % 256, (30 * h) % 256))
    draw = ImageDraw.Draw(image)
    draw.rectangle(
        [w // 4, h // 4, max(w // 4, w * 3 // 4), max(h // 4, h // 2)], fill=(250, 20, 20)
    )
    draw.ellipse([0, h // 2, max(0, w // 2), max(h // 2, h - 1)], fill=(20, 20, 240))
    if mode == "RGBA":
        image.putalpha(Image.new("L", size, 128))
        return image
    if mode == "P":
        return image.convert("P", palette=Image.Palette.ADAPTIVE)
    return image.convert(mode)


def make_images(directory: Path = CORPUS) -> None:
    """Writes the corpus images (committed; rerun only to change the corpus)."""
    from PIL import Image

    directory.mkdir(parents=True, exist_ok=True)
    for name, (size, fmt, mode, extra) in IMAGES.items():
        image = _draw(size, mode)
        path = directory / name
        if extra == "exif-orientation-6":
            exif = Image.Exif()
            exif[0x0112] = 6  # rotate 90 degrees on display; the stored pixels are 60x30
            image.save(path, format=fmt, exif=exif.tobytes())
        elif extra == "transparency":
            image.save(path, format=fmt, transparency=0)
        elif extra == "two-frames":
            frames = [image, _draw(size, mode, shift=120)]
            frames[0].save(path, format=fmt, save_all=True, append_images=frames[1:], duration=50)
        else:
            image.save(path, format=fmt)


def _img(ref: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": ref}}


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _user(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": list(parts)}


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
_CALLS = [
    {"id": i, "type": "function", "function": {"name": "look", "arguments": '{"n": 1}'}}
    for i in ("c1", "c2")
]


def lines() -> list[dict[str, Any]]:
    """The input lines (JSONL objects, image paths relative to the corpus folder)."""
    single = [
        {"id": f"single:{name}", "messages": [_user(_text("What is this?"), _img(name))]}
        for name in IMAGES
    ]
    ask = {"role": "assistant", "content": "", "tool_calls": _CALLS}
    convs: list[dict[str, Any]] = [
        {
            "id": "several_at_the_limits",
            "messages": [
                _user(
                    _img("budget-224x224.png"),
                    _text("versus"),
                    _img("over-side-337x20.png"),
                    _img("tall-20x4000.png"),
                    _img("large-1000x700.jpg"),
                    _text("?"),
                )
            ],
        },
        {
            "id": "same_image_twice",
            "messages": [_user(_img("rgba-50x50.png"), _img("rgba-50x50.png"))],
        },
        {"id": "image_only", "messages": [_user(_img("odd-29x57.jpg"))]},
        {
            "id": "multi_turn",
            "messages": [
                {"role": "system", "content": "Be brief."},
                _user(_text("First:"), _img("large-1000x700.jpg")),
                {"role": "assistant", "content": "A box."},
                _user(_text("And this one?"), _img("exif-rotated-60x30.jpg")),
            ],
        },
        {
            "id": "tool_results_out_of_call_order",
            "tools": TOOLS,
            "messages": [
                _user(_text("Look at both."), _img("tiny-1x1.png")),
                ask,
                {"role": "tool", "tool_call_id": "c2", "content": [_img("wide-4000x20.webp")]},
                {
                    "role": "tool",
                    "tool_call_id": "c1",
                    "content": [_text("here"), _img("palette-40x30.png")],
                },
            ],
        },
        {
            "id": "tool_results_then_follow_up",
            "tools": TOOLS,
            "messages": [
                _user(_img("merge-28x28.png")),
                ask,
                {
                    "role": "tool",
                    "tool_call_id": "c1",
                    "content": [_img("over-budget-225x225.png")],
                },
                {"role": "tool", "tool_call_id": "c2", "content": "nothing"},
                {"role": "assistant", "content": "Seen."},
                _user(_text("Again"), _img("animated-45x45.gif")),
            ],
        },
        {
            "id": "image_in_assistant_history",
            "messages": [
                _user(_text("Draw."), _img("gray-31x70.jpg")),
                {"role": "assistant", "content": [_text("Here:"), _img("cmyk-30x30.jpg")]},
                _user(_text("Thanks.")),
            ],
        },
        {
            # The text names the placeholder token: the rendered prompt holds two for one image.
            "id": "text_holds_a_placeholder",
            "messages": [_user(_text("a <|media_pad|> b"), _img("side-336x28.png"))],
        },
    ]
    return single + convs


def client_model_dir(work: Path, asset: str) -> Path:
    """The bundled asset in Kimi-K2.5's layout with the fixture processor config."""
    path = model_dir(work, asset)
    shutil.copyfile(CONFIG, path / "preprocessor_config.json")
    return path


def client_request(path: Path, line: dict[str, Any]) -> dict[str, Any]:
    """What the pipeline sends for the line's (last) turn: its ids, its images in placeholder
    order as data URIs, and what it stores (the expanded ids, each image's tokens), or the
    reason it refuses the line."""
    from eagle3_datagen.generate.media import TurnImages, turn_images
    from eagle3_datagen.inputs.prompts import Prompt, parse_prompt
    from eagle3_datagen.render.chat_tokenizer import ChatTokenizer

    tokenizer = ChatTokenizer(str(path))
    prompt = parse_prompt(json.dumps(line).encode(), 1, CORPUS)
    assert isinstance(prompt, Prompt), prompt
    ids = tokenizer.render([prompt])[0]
    assert isinstance(ids, list), ids
    refs = tokenizer.image_order(prompt)
    sent = TurnImages(refs, [prompt.images[r] for r in refs], [], [])
    media = turn_images(tokenizer, prompt, ids)
    out: dict[str, Any] = {"prompt_ids": ids, "refs": refs, "image_data": sent.image_data()}
    if media is None or isinstance(media, str):
        return {**out, "client_error": media or "no images"}
    sizes = [(image.width, image.height) for image in media.images]
    return {**out, "expanded_ids": media.expanded, "counts": media.counts, "sizes": sizes}


def _sglang_processor(path: Path) -> Any:
    """SGLang's multimodal processor for the model at ``path``, as its tokenizer manager
    builds it (``TokenizerManager.init_tokenizer_and_processor``), on the stand-in."""
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.managers.multimodal_processor import get_mm_processor, import_processors
    from sglang.srt.multimodal.transport import determine_tensor_transport_mode
    from sglang.srt.runtime_context import publish
    from sglang.srt.server_args import prepare_server_args

    from conformance.kimi_hf_processor import KimiK25ProcessorStandIn

    args = prepare_server_args(["--model-path", str(path), *FLAGS])
    args.device = "cpu"
    args.resolve_once()
    args.check_server_args()
    publish(args, role="tokenizer")
    config = ModelConfig.from_server_args(args)
    import_processors("sglang.srt.multimodal.processors")
    return get_mm_processor(
        config.hf_config,
        args,
        KimiK25ProcessorStandIn(path),
        determine_tensor_transport_mode(),
        model_config=config,
    )


def sglang_answer(processor: Any, prompt_ids: list[int], image_data: list[str]) -> dict[str, Any]:
    """What SGLang's processor makes of one ``/generate`` request: the ids the model sees and,
    per image, its span and grid; or the error the request fails with."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    req = GenerateReqInput(input_ids=prompt_ids, image_data=image_data)
    try:
        out = asyncio.run(
            processor.process_mm_data_async(
                image_data=req.image_data, input_text=prompt_ids, request_obj=req
            )
        )
    except ValueError as err:
        return {"error": str(err)}
    images = []
    for item in out.mm_items:
        grids = item.model_specific_data["image_grid_thw"]
        grids = grids.reshape(-1, 3).tolist() if hasattr(grids, "reshape") else grids
        for (start, end), grid in zip(item.offsets, grids, strict=True):
            images.append({"start": start, "tokens": end - start + 1, "grid_thw": list(grid)})
    return {"expanded_ids": list(out.input_ids), "images": images}


def record(assets: tuple[str, ...] = ASSETS) -> dict[str, Any]:
    """Every line through the client and through SGLang's processor, per bundled tokenizer."""
    from conformance.stubs import install

    install()  # torchvision cannot load on a CPU box (conformance/stubs.py)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="kimi-processor-") as work:
        for asset in assets:
            path = client_model_dir(Path(work), asset)
            processor = _sglang_processor(path)
            cases = []
            for line in lines():
                sent = client_request(path, line)
                answer = sglang_answer(processor, sent["prompt_ids"], sent["image_data"])
                cases.append(
                    {
                        "line": line,
                        "prompt_ids": sent["prompt_ids"],
                        "refs": sent["refs"],
                        "sglang": answer,
                    }
                )
            out[asset] = cases
    return out


def write(data: dict[str, Any], path: Path = OUT) -> None:
    """One case a line: the file stays small enough to read and to diff."""
    rows = []
    for asset, cases in data.items():
        body = ",\n".join(json.dumps(case, separators=(",", ":")) for case in cases)
        rows.append(f"{json.dumps(asset)}: [\n{body}\n]")
    path.write_text("{\n" + ",\n".join(rows) + "\n}\n", encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--make-images", action="store_true", help="rewrite the corpus images")
    args = parser.parse_args()
    if args.make_images:
        make_images()
    write(record(), args.out)


if __name__ == "__main__":
    main()
