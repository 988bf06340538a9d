"""The config's special tokens resolved to ids through the run's tokenizer.

One resolution serves every stage that reads tokens: the validator's rules, the conversation's
turn boundaries, the plan, and reading a finished dataset back (export).
"""

from __future__ import annotations

from dataclasses import dataclass

from eagle3_datagen.config import SpecialTokens
from eagle3_datagen.render.chat_tokenizer import ChatTokenizer


@dataclass(frozen=True, slots=True)
class ToolIds:
    section_begin: int
    section_end: int
    call_begin: int
    argument_begin: int
    call_end: int

    @property
    def all(self) -> frozenset[int]:
        return frozenset(
            {
                self.section_begin,
                self.section_end,
                self.call_begin,
                self.argument_begin,
                self.call_end,
            }
        )


@dataclass(frozen=True, slots=True)
class TokenIds:
    """The special tokens of the config, resolved to ids through the run's tokenizer."""

    think_start: int
    think_end: int
    end_of_turn: int
    stop_ids: tuple[int, ...]
    role_ids: frozenset[int]
    tools: ToolIds | None
    thinking: str  # "prompt" | "output" | "none"

    @classmethod
    def resolve(cls, tokenizer: ChatTokenizer, spec: SpecialTokens) -> TokenIds:
        """Resolve every configured token string; raises TokenizerError if one is not one token."""
        tid = tokenizer.token_id
        eot = tid(spec.end_of_turn)
        stops = tuple(dict.fromkeys([eot, *(tid(s) for s in spec.extra_stop)]))
        tools = None
        if spec.tool_calls is not None:
            t = spec.tool_calls
            tools = ToolIds(
                tid(t.section_begin),
                tid(t.section_end),
                tid(t.call_begin),
                tid(t.argument_begin),
                tid(t.call_end),
            )
        return cls(
            think_start=tid(spec.think_start),
            think_end=tid(spec.think_end),
            end_of_turn=eot,
            stop_ids=stops,
            role_ids=frozenset(tid(s) for s in spec.role_tokens),
            tools=tools,
            thinking=spec.thinking,
        )
