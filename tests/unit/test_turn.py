"""A turn and a conversation with a scripted sender in place of the server: what is sent, what
a turn makes of the answer (record, reject, a turn reused from the journal), and how a
conversation goes on from the model's own turns or stops. No server process: the sender is
the boundary (generate/send.py), the tokenizer, validation and journal are the real ones."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from eagle3_datagen.config import PipelineConfig, parse_config
from eagle3_datagen.generate.context import PartitionJob
from eagle3_datagen.generate.conversation import STOP_TRUNCATED, TurnAt
from eagle3_datagen.generate.converse import run_conversation, run_conversations
from eagle3_datagen.generate.earlier import Earlier
from eagle3_datagen.generate.media import TurnImages
from eagle3_datagen.generate.partition_context import PartitionContext
from eagle3_datagen.generate.plan import load_tokenizer
from eagle3_datagen.generate.prepare import Job
from eagle3_datagen.generate.summary import Outcome
from eagle3_datagen.generate.turn import run_turn
from eagle3_datagen.inputs.prompts import Prompt, parse_prompt
from eagle3_datagen.render.chat_tokenizer import ChatTokenizer
from eagle3_datagen.render.token_ids import TokenIds
from eagle3_datagen.sglang.client import GenerateResult
from eagle3_datagen.write.journal import BatchJournal
from eagle3_datagen.write.resume import ReusePool
from tests.support import TOKENIZER_DIR
from tests.support.dataset import Tok
from tests.support.prompts import WEATHER_TOOL


@pytest.fixture(scope="module")
def tok() -> ChatTokenizer:
    return ChatTokenizer(str(TOKENIZER_DIR))


END = ChatTokenizer(str(TOKENIZER_DIR)).token_id("<|im_end|>")


class ScriptedSender:
    """A sender (``send``: generate/send.py's ``Send``) whose answers come from
    ``answer(prompt_ids)``: output ids (a turn that ends at its stop token, or at max_tokens
    without one), or a str (the server refuses the request with that reason). Every request
    is kept in ``sent``."""

    def __init__(self, answer: Callable[[list[int]], list[int] | str], end: int) -> None:
        self.answer = answer
        self.end = end
        self.sent: list[tuple[int, list[int], dict[str, Any]]] = []

    async def send(
        self,
        index: int,
        line: int,
        prompt_ids: list[int],
        sampling: dict[str, Any],
        suffix: str = "",
        media: TurnImages | None = None,
    ) -> tuple[GenerateResult | None, str | None]:
        self.sent.append((line, prompt_ids, sampling))
        await asyncio.sleep(0)  # a real send yields to the other conversations
        out = self.answer(prompt_ids)
        if isinstance(out, str):
            return None, out
        stopped = bool(out) and out[-1] == self.end
        result = GenerateResult(
            rid=f"r{len(self.sent)}",
            output_ids=out,
            finish_type="stop" if stopped else "length",
            finish_matched=self.end if stopped else None,
            finish_message=None,
            prompt_tokens=len(prompt_ids),
            completion_tokens=len(out),
            cached_tokens=0,
            e2e_latency=0.01,
        )
        return result, None


def _config(tmp_path: Path, **partition: Any) -> PipelineConfig:
    return parse_config(
        {
            "model": {"path": str(TOKENIZER_DIR), "chat_template_kwargs": {"thinking": True}},
            "tiers": [{"name": "SHORT", "concurrency": 4, "max_tokens": 64}],
            "partitions": [{"name": "p", "input": "p.jsonl", "tier": "SHORT", **partition}],
            "output_dir": str(tmp_path / "out"),
        }
    )


def _context(tmp_path: Path, **partition: Any) -> PartitionContext:
    """Partition ``p``'s context, its tokenizer as the config makes it (chat_template_kwargs)."""
    config = _config(tmp_path, **partition)
    tok = load_tokenizer(config)
    ids = TokenIds.resolve(tok, config.special_tokens)
    return PartitionContext.build(PartitionJob(config, "p", ""), tok, ids)


def _earlier(ctx: PartitionContext) -> Earlier:
    return Earlier(BatchJournal(ctx.output.journal_path(0)), ReusePool(), [])


def _prompt(messages: list[dict[str, Any]], line: int = 1, pid: str = "a", **more: Any) -> Prompt:
    parsed = parse_prompt({"id": pid, "messages": messages, **more}, line)
    assert isinstance(parsed, Prompt)
    return parsed


ASK = [{"role": "user", "content": "What is the capital of France?"}]


async def _one_turn(
    ctx: PartitionContext, sender: ScriptedSender, prompt: Prompt, earlier: Earlier
) -> tuple[Any, Outcome]:
    ids = ctx.tokenizer.render([prompt])[0]
    assert isinstance(ids, list)
    at = TurnAt(ctx.record_id(prompt, 0, 0), 0, 0)
    sampling = ctx.turn_sampling(at.id, ctx.temperature(0))
    out = Outcome()
    record = await run_turn(ctx, sender.send, 0, prompt, ids, sampling, earlier, out, at)
    await earlier.writer.drain()
    return record, out


async def test_a_turn_sent_and_valid_is_a_record_of_the_ids_as_sent_and_returned(tmp_path, tok):
    ctx = _context(tmp_path)
    answer = Tok(tok).output()
    sender = ScriptedSender(lambda ids: answer, END)
    prompt = _prompt(ASK, line=7)
    earlier = _earlier(ctx)
    record, out = await _one_turn(ctx, sender, prompt, earlier)
    await earlier.writer.close()
    assert out.rejects == [] and out.sent == 1
    ((line, sent_ids, sampling),) = sender.sent
    assert line == 7 and sampling["max_new_tokens"] == 64
    assert record.prompt_ids == sent_ids == ctx.tokenizer.render([prompt])[0]
    assert record.output_ids == answer and record.finish_reason == "stop"
    assert record.source_line == 7 and record.partition == "p" and not record.truncated
    assert record.sampling["max_new_tokens"] == 64
    # The answer is in the batch's journal: a retry of the batch finds it and sends nothing.
    again = ScriptedSender(lambda ids: "must not be sent", END)
    earlier = _earlier(ctx)
    reused, out = await _one_turn(ctx, again, prompt, earlier)
    await earlier.writer.close()
    assert again.sent == [] and out.sent == 0
    assert reused.output_ids == answer and reused.source_line == 7


async def test_a_request_the_server_refuses_is_the_turns_reject(tmp_path, tok):
    ctx = _context(tmp_path)
    sender = ScriptedSender(lambda ids: "400: the prompt is too long", END)
    earlier = _earlier(ctx)
    record, out = await _one_turn(ctx, sender, _prompt(ASK, line=3), earlier)
    await earlier.writer.close()
    assert record is None and out.sent == 1
    (reject,) = out.rejects
    assert reject.reason_code == "server_rejected" and reject.source_line == 3
    assert "too long" in reject.reason


async def test_an_answer_that_fails_validation_is_rejected_not_recorded(tmp_path, tok):
    ctx = _context(tmp_path)
    t = Tok(tok)
    bad = [*range(100, 103), t.id["<|im_user|>"], t.id["<|im_end|>"]]  # a role token inside
    sender = ScriptedSender(lambda ids: bad, END)
    earlier = _earlier(ctx)
    record, out = await _one_turn(ctx, sender, _prompt(ASK), earlier)
    await earlier.writer.close()
    assert record is None
    (reject,) = out.rejects
    assert reject.stage == "validation", reject


TWO_TURNS = [
    {"role": "user", "content": "Name a colour."},
    {"role": "assistant", "content": "DATA-REPLY-ONE"},
    {"role": "user", "content": "Another one."},
]


async def test_a_conversation_goes_on_from_the_models_own_turn(tmp_path, tok):
    ctx = _context(tmp_path, regenerate="all_turns")
    t = Tok(tok)
    words = list(tok.tok.encode("MODEL-SAYS-TEAL", add_special_tokens=False))
    answer = [*range(100, 103), t.id["</think>"], *words, t.id["<|im_end|>"]]
    sender = ScriptedSender(lambda ids: answer, END)
    # With tools, SGLang's chat path keeps </think> and splits the answer from the reasoning
    # (without, the whole turn is reasoning, which the template drops from the history).
    prompt = _prompt(TWO_TURNS, tools=[WEATHER_TOOL])
    earlier = _earlier(ctx)
    jobs = _jobs(ctx, [prompt])
    out = await run_conversation(ctx, sender.send, 0, prompt, jobs[0].ids, 0, earlier)
    await earlier.writer.close()
    assert [r.turn for r in out.records] == [0, 1] and out.stop is None and out.sent == 2
    second = tok.decode(sender.sent[1][1])
    assert "DATA-REPLY-ONE" not in second  # the data's reply is replaced by the model's
    assert "MODEL-SAYS-TEAL" in second
    assert out.records[1].prompt_ids == sender.sent[1][1]


async def test_a_turn_cut_at_max_tokens_ends_its_conversation(tmp_path, tok):
    ctx = _context(tmp_path, regenerate="all_turns")
    cut = Tok(tok).truncated_output(8)
    sender = ScriptedSender(lambda ids: cut, END)
    prompt = _prompt(TWO_TURNS)
    earlier = _earlier(ctx)
    out = await run_conversation(
        ctx, sender.send, 0, prompt, _jobs(ctx, [prompt])[0].ids, 0, earlier
    )
    await earlier.writer.close()
    assert len(sender.sent) == 1 and out.stop == STOP_TRUNCATED
    (record,) = out.records
    assert record.truncated and (record.stop_reason or "").startswith(STOP_TRUNCATED)


async def test_a_batchs_conversations_are_sent_longest_first_and_come_back_in_line_order(
    tmp_path, tok
):
    ctx = _context(tmp_path, samples=2)
    answer = Tok(tok).output()
    sender = ScriptedSender(lambda ids: answer, END)
    words = {1: 3, 2: 40, 3: 12}
    prompts = [
        _prompt([{"role": "user", "content": "word " * n}], line=line, pid=f"id{line}")
        for line, n in words.items()
    ]
    earlier = _earlier(ctx)
    outcomes = await run_conversations(ctx, sender.send, 0, _jobs(ctx, prompts), earlier)
    await earlier.writer.close()
    assert [line for line, _, _ in sender.sent] == [2, 2, 3, 3, 1, 1]
    assert [o.records[0].source_line for o in outcomes] == [1, 1, 2, 2, 3, 3]
    assert [o.records[0].sample for o in outcomes] == [0, 1] * 3
    assert ctx.progress.done == 3  # every line counted once, when all its samples are done


def _jobs(ctx: PartitionContext, prompts: list[Prompt]) -> list[Job]:
    """Each prompt's first turn rendered, as prepare_batch makes a job of it."""
    jobs = []
    for prompt, ids in zip(prompts, ctx.tokenizer.render(prompts), strict=True):
        assert isinstance(ids, list)
        jobs.append(Job(prompt, ids, len(ids)))
    return jobs
