"""Which model renders the prompts, and its special tokens by their strings."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from eagle3_datagen.config.base import StrictModel


class ModelSpec(StrictModel):
    """Which model's tokenizer and chat template render the prompts."""

    path: str = Field(title="Model path")
    """Model directory (or hub id) served by SGLang; its tokenizer renders prompts."""
    tokenizer_path: str | None = Field(default=None, title="Tokenizer path")
    """Tokenizer directory if different from the model path."""
    trust_remote_code: bool = Field(default=True, title="Trust remote code")
    """Passed to AutoTokenizer and to SGLang (Kimi-K2.5 needs it)."""
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict, title="Chat template kwargs")
    """Extra variables for the chat template, e.g. {"thinking": true}."""
    modes: dict[str, dict[str, Any]] = Field(default_factory=dict, title="Serving modes")
    """Named sets of chat-template kwargs, e.g. {thinking: {}, instant: {thinking: false}}, each
    merged over chat_template_kwargs. A partition mixes them (partitions[].modes), a line names one
    ("mode"); see docs/modes.md. 'default' and 'custom' are reserved."""
    render: Literal["sglang_chat", "template"] = Field(
        default="sglang_chat", title="Render reference"
    )
    """sglang_chat: the prompt ids SGLang 0.5.23's /v1/chat/completions builds for the same request
    (tool-call arguments parsed, tools as SGLang dumps them, ...); template: the data through the
    chat template as it is. See docs/render.md."""

    @field_validator("modes")
    @classmethod
    def _mode_names(cls, v: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        reserved = sorted({"default", "custom"} & set(v))
        if reserved:
            raise ValueError(f"mode names {reserved} are reserved (docs/modes.md)")
        return v

    @property
    def tokenizer_dir(self) -> str:
        return self.tokenizer_path or self.path


class ToolCallTokens(StrictModel):
    """Kimi-style tool-call markers; a section holds one or more begin/argument/end calls."""

    section_begin: str = Field(title="Section begin", default="<|tool_calls_section_begin|>")
    section_end: str = Field(title="Section end", default="<|tool_calls_section_end|>")
    call_begin: str = Field(title="Call begin", default="<|tool_call_begin|>")
    argument_begin: str = Field(title="Argument begin", default="<|tool_call_argument_begin|>")
    call_end: str = Field(title="Call end", default="<|tool_call_end|>")


class SpecialTokens(StrictModel):
    """Special tokens by their *strings*; ids are resolved through the tokenizer at start-up."""

    think_start: str = Field(title="Think start", default="<think>")
    """Opens the reasoning block."""
    think_end: str = Field(title="Think end", default="</think>")
    """Closes the reasoning block."""
    end_of_turn: str = Field(title="End of turn", default="<|im_end|>")
    """Ends the assistant turn; the expected last output token."""
    extra_stop: list[str] = Field(title="Extra stop tokens", default_factory=lambda: ["[EOS]"])
    """Other tokens that stop generation (sent as stop_token_ids too)."""
    role_tokens: list[str] = Field(
        title="Role tokens",
        default_factory=lambda: [
            "<|im_user|>",
            "<|im_system|>",
            "<|im_assistant|>",
            "<|im_middle|>",
        ],
    )
    """Turn and role tokens that must never appear inside an output."""
    tool_calls: ToolCallTokens | None = Field(
        title="Tool-call tokens", default_factory=lambda: ToolCallTokens()
    )
    """Tool-call tokens whose structure is checked; null for models without tools."""
    thinking: Literal["prompt", "output", "none"] = Field(
        default="prompt", title="Thinking block placement"
    )
    """Where <think> opens: 'prompt' (the chat template ends in it, as Kimi-K2.5), 'output' (the
    model emits it, as DeepSeek-R1), or 'none' (no thinking)."""
