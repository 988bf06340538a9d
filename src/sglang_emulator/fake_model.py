"""A deterministic stand-in for a thinking chat model: output ids are a pure function of the prompt.

The "natural" output for (input_ids, seed) is fixed; the rid, timing and sampling params other
than the seed never change it. Every structural decision (lengths, whether to call tools) is drawn
before any token, so a shorter ``limit`` always yields a prefix of a longer one.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import dataclass
from typing import Literal

import orjson

from sglang_emulator.vocab import Vocab, pack_int32

ThinkingMode = Literal["open", "closed", "absent"]

_NAME_RE = re.compile(r'"name"\s*:\s*"([^"]+)"')
# A test's script for the model: ``[[call NAME {json args}]]`` in the message right before the
# generation prompt makes the model call exactly these tools (see FakeModel.scripted_calls); a
# NAME of digits is written as a bare counter header (``3``, no ``functions.NAME:``), and
# ``[[no-think-end]]`` makes the model switch from reasoning to the calls without ``</think>``.
_CALL_RE = re.compile(r"\[\[call (\d+|[A-Za-z_][\w.-]*) (\{.*?\})\]\]", re.DOTALL)
NO_THINK_END = "[[no-think-end]]"
_TS_FUNC_RE = re.compile(r"\bfunction\s+([A-Za-z_][\w.-]*)|\btype\s+([A-Za-z_][\w.-]*)\s*=")
_CACHE_LIMIT = 1024
# Ordinary text is sliced out of one pre-shuffled table of word ids: a slice is C-speed, while
# drawing ids one at a time would cost ~50 ns each. Slices are at most _SEGMENT long.
_TABLE_SIZE = 1 << 18
_SEGMENT = 1 << 14


@dataclass(frozen=True)
class ToolSpec:
    """One declared tool: its name and the argument names the fake calls fill in."""

    name: str
    arg_names: tuple[str, ...]


@dataclass(frozen=True)
class PromptShape:
    """What the tail and the tool section of a prompt ask the model to produce."""

    thinking: ThinkingMode
    tools: tuple[ToolSpec, ...]


def _find_id(packed: bytes, needle: bytes, start: int) -> int:
    """Index of the first id equal to ``needle`` (one packed id) at or after ``start``, or -1."""
    pos = packed.find(needle, 4 * start)
    while pos >= 0 and pos & 3:
        pos = packed.find(needle, pos + 1)
    return pos >> 2 if pos >= 0 else -1


def _rfind_id(packed: bytes, needle: bytes, end: int) -> int:
    """Index of the last id equal to ``needle`` before index ``end``, or -1."""
    pos = packed.rfind(needle, 0, 4 * end)
    while pos >= 0 and pos & 3:
        pos = packed.rfind(needle, 0, pos)
    return pos >> 2 if pos >= 0 else -1


def _tools_from_json(text: str) -> tuple[ToolSpec, ...]:
    """Read an OpenAI-style tool list; fall back to regexes for other declaration formats."""
    specs: list[ToolSpec] = []
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError:
        data = None
    if isinstance(data, dict):
        data = [data]
    if isinstance(data, list):
        for item in data:
            if not isinstance(item, dict):
                continue
            fn = item.get("function", item)
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                continue
            params = fn.get("parameters")
            props = params.get("properties") if isinstance(params, dict) else None
            args = tuple(str(k) for k in props) if isinstance(props, dict) else ()
            specs.append(ToolSpec(fn["name"], args))
    if not specs:
        names = _NAME_RE.findall(text) or [a or b for a, b in _TS_FUNC_RE.findall(text)]
        specs = [ToolSpec(n, ()) for n in dict.fromkeys(names)]
    return tuple(specs) or (ToolSpec("tool", ()),)


class FakeModel:
    """Produces Kimi-K2.5-shaped output ids: reasoning, ``</think>``, answer, tool calls, end."""

    def __init__(
        self,
        vocab: Vocab,
        mean_output_tokens: float = 200.0,
        max_output_tokens: int = 16384,
        sigma: float = 1.0,
        tool_call_rate: float = 0.5,
    ) -> None:
        self.vocab = vocab
        self.sp = vocab.special
        self.table = random.Random(0).choices(vocab.word_pool, k=_TABLE_SIZE)
        self.max_output_tokens = max(1, max_output_tokens)
        self.sigma = sigma
        # Lognormal with the requested mean: E[X] = exp(mu + sigma^2 / 2).
        self.mu = math.log(max(1.0, mean_output_tokens)) - sigma * sigma / 2
        self.tool_call_rate = tool_call_rate
        self._role_cache: dict[tuple[int, ...], str] = {}
        self._tools_cache: dict[bytes, tuple[ToolSpec, ...]] = {}
        self._encode_cache: dict[str, list[int]] = {}
        end = self.sp.get("im_end")
        if end is None and vocab.eos_ids:
            end = min(vocab.eos_ids)
        self.end_id = end

    def shape(self, input_ids: list[int], packed: bytes | None = None) -> PromptShape:
        """Classify the generation prompt's tail and find declared tools.

        ``packed`` is ``pack_int32(input_ids)``; scanning bytes is much faster than the list.
        """
        think = self.sp.get("think")
        think_end = self.sp.get("think_end")
        mode: ThinkingMode
        if think is None or think_end is None:
            mode = "closed"  # the tokenizer has no thinking tokens: answer only
        elif input_ids[-1] == think:
            mode = "open"
        elif len(input_ids) >= 2 and input_ids[-2] == think and input_ids[-1] == think_end:
            mode = "closed"
        else:
            mode = "absent"
        if packed is None:
            packed = pack_int32(input_ids)
        return PromptShape(mode, self._declared_tools(input_ids, packed))

    def _declared_tools(self, ids: list[int], packed: bytes) -> tuple[ToolSpec, ...]:
        """Tools from the ``<|im_system|>tool_declare<|im_middle|>...<|im_end|>`` section."""
        system = self.sp.get("im_system")
        middle = self.sp.get("im_middle")
        end = self.sp.get("im_end")
        if system is None or middle is None or end is None:
            return ()
        system_b = pack_int32([system])
        n = len(ids)
        i = -1
        while True:
            i = _find_id(packed, system_b, i + 1)
            if i < 0:
                return ()
            try:
                j = ids.index(middle, i + 1, min(n, i + 12))
            except ValueError:
                continue
            if self._role(tuple(ids[i + 1 : j])) != "tool_declare":
                continue
            k = _find_id(packed, pack_int32([end]), j + 1)
            k = n if k < 0 else k
            return self._tools(packed[4 * (j + 1) : 4 * k], ids[j + 1 : k])

    def _role(self, key: tuple[int, ...]) -> str:
        role = self._role_cache.get(key)
        if role is None:
            if len(self._role_cache) > _CACHE_LIMIT:
                self._role_cache.clear()
            role = self.vocab.decode(list(key), skip_special_tokens=False).strip()
            self._role_cache[key] = role
        return role

    def _tools(self, key: bytes, ids: list[int]) -> tuple[ToolSpec, ...]:
        tools = self._tools_cache.get(key)
        if tools is None:
            if len(self._tools_cache) > _CACHE_LIMIT:
                self._tools_cache.clear()
            tools = _tools_from_json(self.vocab.decode(ids, skip_special_tokens=False))
            self._tools_cache[key] = tools
        return tools

    def _encode(self, text: str) -> list[int]:
        ids = self._encode_cache.get(text)
        if ids is None:
            if len(self._encode_cache) > _CACHE_LIMIT:
                self._encode_cache.clear()
            ids = self.vocab.encode(text)
            self._encode_cache[text] = ids
        return ids

    def _ordinary(self, rng: random.Random, k: int) -> list[int]:
        """``k`` ordinary text ids; a shorter ``k`` yields a prefix of a longer one."""
        out: list[int] = []
        while k > 0:
            take = min(k, _SEGMENT)
            start = rng.randrange(_TABLE_SIZE - _SEGMENT)
            out += self.table[start : start + take]
            k -= take
        return out

    def generate(
        self,
        input_ids: list[int],
        digest: bytes,
        seed: int,
        limit: int,
        packed: bytes | None = None,
    ) -> list[int]:
        """The first ``limit`` ids of the stream for this prompt (``digest`` = its sha256).

        The stream is the natural output, ending in ``<|im_end|>``, followed (for clients that
        ignore that stop) by more ordinary tokens from the same generator.
        """
        if limit <= 0:
            return []
        rng = random.Random(digest + seed.to_bytes(16, "little", signed=True))
        shape = self.shape(input_ids, packed)
        sp = self.sp
        total = min(
            self.max_output_tokens,
            max(1, round(rng.lognormvariate(self.mu, self.sigma))),
        )
        if shape.thinking == "closed":
            reasoning, answer = 0, total
        else:
            reasoning = max(1, round(total * rng.uniform(0.4, 0.85)))
            answer = max(1, total - reasoning)
        calls = 0
        scripted = self.scripted_calls(input_ids, packed)
        skip_think_end = bool(scripted) and scripted[0] == (NO_THINK_END, "")
        scripted = [c for c in scripted if c[0] != NO_THINK_END]
        if scripted:
            answer = 0 if skip_think_end else rng.randint(0, min(answer, 24))
        elif shape.tools and rng.random() < self.tool_call_rate:
            calls = rng.randint(1, 3)
            answer = rng.randint(0, min(answer, 24))

        out: list[int] = []
        if shape.thinking == "absent":
            out.append(sp["think"])
        if shape.thinking != "closed":
            out += self._ordinary(rng, min(reasoning, limit - len(out)))
            if not skip_think_end:
                out.append(sp["think_end"])
        if len(out) < limit:
            out += self._ordinary(rng, min(answer, limit - len(out)))
        if scripted and len(out) < limit:
            out += self._scripted_section(scripted)
        elif calls and len(out) < limit:
            out += self._tool_section(rng, shape.tools, calls)
        if self.end_id is not None:
            out.append(self.end_id)
        if len(out) < limit:
            out += self._ordinary(rng, limit - len(out))
        return out[:limit]

    def scripted_calls(
        self, input_ids: list[int], packed: bytes | None = None
    ) -> list[tuple[str, str]]:
        """The calls ``[[call NAME {json}]]`` in the last message before the generation prompt
        asks for, as ``(name, arguments)``; none when it has no such text.

        Why: a test of multi-turn regeneration must make the model's tool call agree with the
        data's, or differ from it, at will. Only the message right before the generation prompt
        counts, so an earlier turn's request is not repeated after its tool result.
        """
        sp = self.sp
        keys = ("im_assistant", "im_end", "tool_call_begin")
        if any(k not in sp for k in keys) or not input_ids:
            return []
        if packed is None:
            packed = pack_int32(input_ids)
        gen = _rfind_id(packed, pack_int32([sp["im_assistant"]]), len(input_ids))
        end = _rfind_id(packed, pack_int32([sp["im_end"]]), gen) if gen > 0 else -1
        if end < 0:
            return []
        start = max(
            _rfind_id(packed, pack_int32([sp[k]]), end)
            for k in ("im_user", "im_system", "im_assistant")
            if k in sp
        )
        text = self.vocab.decode(input_ids[start + 1 : end], skip_special_tokens=False)
        if "[[call " not in text:
            return []
        calls = [(name, args) for name, args in _CALL_RE.findall(text)]
        return [(NO_THINK_END, ""), *calls] if calls and NO_THINK_END in text else calls

    def _scripted_section(self, calls: list[tuple[str, str]]) -> list[int]:
        """The tool-call section of :meth:`scripted_calls`: the arguments exactly as written."""
        sp = self.sp
        out = [sp["tool_calls_section_begin"]]
        for idx, (name, args) in enumerate(calls):
            out.append(sp["tool_call_begin"])
            out += self._encode(name if name.isdigit() else f"functions.{name}:{idx}")
            out.append(sp["tool_call_argument_begin"])
            out += self.vocab.encode(args)
            out.append(sp["tool_call_end"])
        out.append(sp["tool_calls_section_end"])
        return out

    def _tool_section(
        self, rng: random.Random, tools: tuple[ToolSpec, ...], calls: int
    ) -> list[int]:
        """``<|tool_calls_section_begin|>`` + 1-3 calls + ``<|tool_calls_section_end|>``."""
        sp = self.sp
        needed = (
            "tool_calls_section_begin",
            "tool_calls_section_end",
            "tool_call_begin",
            "tool_call_argument_begin",
            "tool_call_end",
        )
        if any(k not in sp for k in needed):
            return []
        out = [sp["tool_calls_section_begin"]]
        for idx in range(calls):
            tool = tools[rng.randrange(len(tools))]
            names = tool.arg_names or ("query",)
            args = {
                name: self.vocab.decode(self._ordinary(rng, rng.randint(1, 4))).strip()
                for name in names[: rng.randint(1, min(3, len(names)))]
            }
            out.append(sp["tool_call_begin"])
            out += self._encode(f"functions.{tool.name}:{idx}")
            out.append(sp["tool_call_argument_begin"])
            out += self.vocab.encode(orjson.dumps(args).decode())
            out.append(sp["tool_call_end"])
        out.append(sp["tool_calls_section_end"])
        return out
