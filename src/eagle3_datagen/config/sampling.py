"""The sampling parameters every request sends, and each record's own seed."""

from __future__ import annotations

import hashlib
from typing import Any

from pydantic import Field, field_validator

from eagle3_datagen.config.base import StrictModel


class Sampling(StrictModel):
    """Sampling parameters sent explicitly with every request (SGLang's /generate has no model
    defaults: generation_config.json applies only to the OpenAI chat endpoint).

    The ranges are SGLang 0.5.23's own (``SamplingParams.verify``): a value outside them would
    get a 400 for every prompt, so it is refused here, and pre-flight sends these parameters in
    its smoke request."""

    temperature: float = Field(title="Temperature", default=1.0, ge=0.0, allow_inf_nan=False)
    """0 means greedy."""
    top_p: float = Field(title="Top-p", default=0.95, gt=0.0, le=1.0)
    top_k: int = Field(title="Top-k", default=-1)
    """-1 means all tokens."""
    min_p: float = Field(title="Min-p", default=0.0, ge=0.0, le=1.0)
    repetition_penalty: float = Field(title="Repetition penalty", default=1.0, gt=0.0, le=2.0)
    """In (0, 2]; 1.0 means no penalty."""
    seed: int | None = Field(title="Sampling seed", default=None, ge=-(2**63), le=2**63 - 1)
    """Base seed: each request gets its own sampling_seed derived from this and the prompt id, so a
    prompt samples the same way in every run. SGLang honours it only when launched with
    --enable-deterministic-inference (add it to server.extra_args); otherwise it is ignored. None:
    no seed is sent."""

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, v: int) -> int:
        if v == 0 or v < -1:
            raise ValueError("top_k must be -1 (all) or >= 1")
        return v

    def request_seed(self, prompt_id: str) -> int | None:
        """The ``sampling_seed`` of one prompt: a stable hash of the seed and the prompt id.

        One seed for every request would correlate the sampling noise across prompts; per
        prompt, a rerun or resume still draws the same way for the same prompt.
        """
        if self.seed is None:
            return None
        digest = hashlib.sha256(f"{self.seed}:{prompt_id}".encode()).digest()
        return int.from_bytes(digest[:8], "big") >> 1  # 63 bits: within SGLang's int64 range

    def to_sglang(
        self, max_new_tokens: int, stop_token_ids: list[int], prompt_id: str | None = None
    ) -> dict[str, Any]:
        """The ``sampling_params`` dict for /generate; output is never trimmed or re-encoded.

        ``sampling_seed`` is there only for a ``prompt_id`` (see :meth:`request_seed`).
        """
        params: dict[str, Any] = {
            "max_new_tokens": max_new_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "repetition_penalty": self.repetition_penalty,
            "stop_token_ids": stop_token_ids,
            "skip_special_tokens": False,
            "no_stop_trim": True,
        }
        if prompt_id is not None and (seed := self.request_seed(prompt_id)) is not None:
            params["sampling_seed"] = seed
        return params
