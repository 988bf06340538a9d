"""The emulator's ``/metrics`` replays SGLang 0.5.23's recorded exposition
(``tests/fixtures/sglang-0.5.23/metrics.txt``, recorded from SGLang's own collectors by
``conformance/metrics.py``): the same families, types, label names, HELP texts and histogram
buckets, before any request and after some; values are the emulator's. SGLang's retraction
counters have no series before the first retraction (the recording has none); after one they
appear with the scheduler's labels, on SGLang and on the emulator alike."""

from __future__ import annotations

import asyncio

import httpx

from benchmarks.emulator_ceiling import make_prompt
from sglang_emulator.vocab import Vocab
from tests.support import TOKENIZER_DIR
from tests.support.emulator import KV_POOR_RETRACTING, EmulatorFactory
from tests.support.exposition import SGLANG, buckets, families, helps

RETRACTION_COUNTERS = (
    "sglang:num_retracted_requests_total",
    "sglang:num_retracted_input_tokens_total",
    "sglang:num_retracted_output_tokens_total",
)


def _differ(served: str, recorded: str) -> dict[str, object]:
    """Every family whose type, labels, HELP or buckets differ: name -> (emulator, SGLang)."""
    out: dict[str, object] = {}
    for read in (families, helps, buckets):
        a, b = read(served), read(recorded)
        out |= {
            f"{read.__name__}:{n}": (a.get(n), b.get(n))
            for n in a.keys() | b.keys()
            if a.get(n) != b.get(n)
        }
    return out


async def _generate(url: str, n: int) -> list[int]:
    vocab = Vocab(TOKENIZER_DIR)
    async with httpx.AsyncClient(timeout=120) as client:
        bodies = [
            {"input_ids": make_prompt(vocab, 200, i), "sampling_params": {"max_new_tokens": 4000}}
            for i in range(n)
        ]
        out = await asyncio.gather(*(client.post(f"{url}/generate", json=b) for b in bodies))
    return [r.json()["meta_info"]["num_retractions"] for r in out]


def test_the_emulators_metrics_replay_sglangs_recorded_exposition(
    emu_factory: EmulatorFactory,
) -> None:
    emu = emu_factory.start(
        *KV_POOR_RETRACTING,
        "--enable-metrics",
        "--served-model-name",
        "moonshotai/Kimi-K2.5",
    )
    recorded = SGLANG.read_text()
    fresh = emu.client.get("/metrics").text
    assert len(families(recorded)) == 66
    assert not _differ(fresh, recorded), _differ(fresh, recorded)

    retractions = asyncio.run(_generate(emu.url, 20))
    assert sum(retractions) > 0
    after = emu.client.get("/metrics").text
    extra = {n: families(after)[n] for n in RETRACTION_COUNTERS}
    scheduler = families(recorded)["sglang:num_running_reqs"][1]
    assert extra == dict.fromkeys(RETRACTION_COUNTERS, ("counter", scheduler))
    without = "\n".join(
        line for line in after.splitlines() if not any(n in line for n in RETRACTION_COUNTERS)
    )
    assert not _differ(without, recorded), _differ(without, recorded)
    # The values are the emulator's: its 20 requests in the tokenizer manager's counter and
    # latency histogram, and the HTTP counters of what it served.
    assert _value(after, "sglang:num_requests_total") == 20
    assert _value(after, "sglang:e2e_request_latency_seconds_count") == 20
    assert _value(after, 'sglang:http_requests_total{endpoint="/generate"') == 20
    assert _value(after, "sglang:num_retracted_requests_total") >= max(retractions)


def _value(text: str, prefix: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix)
    )
