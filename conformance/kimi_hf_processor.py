"""The stand-in for the Kimi-K2.5 checkpoint's remote-code processor that SGLang wraps.

SGLang 0.5.23's ``KimiK2_5VLImageProcessor`` (``sglang/srt/multimodal/processors/kimi_k25.py``)
is built on ``_processor``, the object ``AutoProcessor.from_pretrained(..., trust_remote_code)``
returns for the checkpoint (``kimi_k25_processor.py`` / ``kimi_k25_vision_processing.py`` /
``media_utils.py``, shipped with the weights, not on PyPI). What SGLang uses of it:

- ``.tokenizer`` (``MultimodalSpecialTokens.build``), ``.image_processor`` (a transformers
  ``BaseImageProcessor``), ``.media_processor.media_proc_cfg`` (the settings SGLang reads),
- ``.media_processor.media_tokens_calculator({"type": "image", "image": PIL})``: the token
  count of one image on SGLang's CPU path (``KimiGPUProcessorWrapper._cpu_call``),
- ``__call__(text=[...], medias=[{"type": "image", "image": PIL}, ...], return_tensors=...)``
  returning ``input_ids``, ``pixel_values`` and ``grid_thws``.

The image processor here is vLLM 0.33.0's installed CPU port of Moonshot's
(``vllm/transformers_utils/processors/kimi_k25_vision_fused.py``,
``KimiK25FusedVisionProcessor``: ``media_tokens_calculator``, ``navit_resize_image``, bicubic
resize, padding, normalisation and patchify), installed in ``.venv-conformance`` only
(``conformance/requirements.txt``). The ``__call__`` below is the checkpoint processor's
``medias`` + ``text`` branch as ported from Moonshot in paddleformers 1.2.0
(``paddleformers/transformers/kimi_k25/processor.py``): preprocess the medias, tokenize the
text without special tokens, return both (vLLM's own ``KimiK25Processor`` takes
``vision_chunks`` instead, which SGLang does not pass). SGLang replaces the ``input_ids`` it
returns with its own expansion of the request's ids (``_cpu_call``), so this wrapper decides
no token id; the counts come from vLLM's ``media_tokens_calculator``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class KimiK25ProcessorStandIn:
    """What SGLang's Kimi-K2.5 processor needs of the checkpoint's ``KimiK25Processor``."""

    def __init__(self, model_path: Path) -> None:
        from sglang.srt.utils.hf_transformers_utils import get_tokenizer
        from vllm.transformers_utils.processors.kimi_k25_vision_fused import (
            KimiK25FusedVisionProcessor,
        )

        config = json.loads((model_path / "preprocessor_config.json").read_text("utf-8"))
        processor = KimiK25FusedVisionProcessor(media_proc_cfg=config["media_proc_cfg"])
        self.image_processor = self.media_processor = processor
        self.tokenizer = get_tokenizer(str(model_path), trust_remote_code=True)

    def __call__(
        self,
        text: list[str] | str | None = None,
        medias: list[dict[str, Any]] | None = None,
        return_tensors: str | None = "pt",
        **kwargs: Any,
    ) -> Any:
        from transformers import BatchFeature

        data: dict[str, Any] = {}
        if medias:
            data.update(self.media_processor.preprocess(medias, return_tensors=return_tensors))
        if text is not None:
            encoded = self.tokenizer(text, add_special_tokens=False, return_tensors=return_tensors)
            data.update(encoded)
        return BatchFeature(data=data)
