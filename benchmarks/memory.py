"""(c) Peak memory of one partition's planning + batch processing: 10k prompts against 1M.

Why: partitions of a million prompts must not need a machine sized for them. Input is planned
as byte ranges and read one batch at a time, so memory should not grow with the input.

Each size runs in a fresh child process (RSS high-water mark = ``ru_maxrss``) that does what
the partition subflow does, at library level:

1. load the tokenizer, build the runner (the baseline RSS is taken here);
2. plan the batches (``plan_batches``, streaming the whole file) and scan it for repeated ids
   and repeated prompts (``scan_input`` with the default ``near_duplicates`` policy, which
   parses every line and MinHashes its text); the scan is also timed on its own, with and
   without the near-duplicate search (policy ``off``), for its rate;
3. run batches through ``PartitionRunner.run_batch`` + ``run_windowed`` against the
   zero-latency emulator.

For 10k prompts step 3 runs every batch. For 1M prompts it runs the same number of batches
(~10k prompts), spread evenly over the file, first and last included: running all 1M
generations would take ~20 minutes on 2 cores and processes batches one window at a time
anyway (each batch is written to Parquet and dropped). What scales with the input, and is
measured in full, is the planning and the duplicate scan over all lines.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import Emulator, emit, make_config, peak_rss_mb, run_child

_TEXT = (
    "alpha beta gamma delta token draft model exact server batch prompt window slot "
    "decode prefill cache parquet stream answer reason think tool call"
)
_VOCAB = _TEXT.split(" ")


def write_big(path: Path, n: int, words: int = 30) -> int:
    """``n`` prompt lines written in chunks (fast enough for 1M lines); returns the file size."""
    rng = random.Random(0)
    with path.open("w") as fh:
        chunk: list[str] = []
        for i in range(n):
            text = " ".join(rng.choices(_VOCAB, k=words))
            chunk.append(
                json.dumps({"id": f"m{i:08d}", "messages": [{"role": "user", "content": text}]})
            )
            if len(chunk) == 10_000:
                fh.write("\n".join(chunk) + "\n")
                chunk.clear()
        if chunk:
            fh.write("\n".join(chunk) + "\n")
    return path.stat().st_size


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def _child(url: str, prompts: Path, out: Path, max_batches: int) -> dict[str, Any]:
    from benchmarks.common import partition_runner
    from eagle3_datagen.config import NearDuplicates
    from eagle3_datagen.generate.windowed import run_windowed
    from eagle3_datagen.inputs.prompts import find_duplicate_ids
    from eagle3_datagen.inputs.scan import scan_input
    from eagle3_datagen.render.chat_tokenizer import ChatTokenizer

    config = make_config([("mem", prompts, "SHORT")], out)
    ChatTokenizer(config.model.tokenizer_dir).render([])  # imports and tokenizer in the baseline
    # Warm the code paths on a 1-line file so their imports are in the baseline too.
    tiny = out.parent / "tiny.jsonl"
    tiny.write_text(prompts.open().readline())
    find_duplicate_ids("mem", tiny)
    scan_input("mem", tiny, 512, NearDuplicates())  # datasketch's imports too
    baseline = _rss_mb()

    # The input scan alone, with the near-duplicate search (the default, policy keep) and
    # without (policy off): its rate, and the memory it needs (the peak below includes it).
    t0 = time.monotonic()
    near = scan_input("mem", prompts, 512, NearDuplicates())
    near_s = time.monotonic() - t0
    after_near_scan = _rss_mb()
    similar = len(near.similar)
    del near
    t0 = time.monotonic()
    scan_input("mem", prompts, 512, NearDuplicates(policy="off"))
    plain_s = time.monotonic() - t0

    t0 = time.monotonic()
    async with partition_runner(config, "mem", url) as (runner, batches, window):
        scan_s = time.monotonic() - t0  # plan + duplicate scan, streaming the whole file
        after_scan = _rss_mb()
        step = max(1, (len(batches) - 1) // max(1, max_batches - 1))
        chosen = [*batches[::step][: max_batches - 1], batches[-1]]
        chosen = list({b.index: b for b in chosen}.values())
        t1 = time.monotonic()
        results = await run_windowed(iter(chosen), runner.run_batch, window)
        run_s = time.monotonic() - t1
    failed = [r for r in results if isinstance(r, BaseException)]
    if failed:
        raise RuntimeError(f"{len(failed)} batches failed: {failed[0]!r}")
    records = sum(r.accepted + r.rejected for r in results if not isinstance(r, BaseException))
    return {
        "lines": sum(b.count for b in batches),
        "batches": len(batches),
        "batches_run": len(chosen),
        "records": records,
        "baseline_rss_mb": baseline,
        "after_scan_rss_mb": after_scan,
        "peak_rss_mb": peak_rss_mb(),
        "scan_s": scan_s,
        "run_s": run_s,
        "near_scan_s": near_s,
        "plain_scan_s": plain_s,
        "near_scan_rss_mb": after_near_scan,
        "similar": similar,
    }


def measure(small: int, big: int) -> dict[str, Any]:
    """Peak RSS for ``small`` and ``big`` prompts, same number of batches generated."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-c-"))
    try:
        rows: dict[str, dict[str, Any]] = {}
        sizes: dict[str, int] = {}
        max_batches = -(-small // 512)  # the small case runs all its batches
        with Emulator("--emu-mean-output-tokens", "200", "--emu-output-sigma", "0") as emu:
            for label, n in (("small", small), ("big", big)):
                path = tmp / f"{label}.jsonl"
                sizes[label] = write_big(path, n)
                out = tmp / f"out-{label}"
                out.mkdir()
                rows[label] = run_child(
                    "memory", ["child", emu.url, str(path), str(out), str(max_batches)]
                )
                path.unlink()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    s, b = rows["small"], rows["big"]
    return {
        "small_prompts": small,
        "big_prompts": big,
        "small_peak_mb": s["peak_rss_mb"],
        "big_peak_mb": b["peak_rss_mb"],
        "peak_ratio": b["peak_rss_mb"] / s["peak_rss_mb"],
        "baseline_mb": b["baseline_rss_mb"],
        "big_file_mb": sizes["big"] / 2**20,
        "big_scan_s": b["scan_s"],
        "big_near_scan_s": b["near_scan_s"],
        "big_plain_scan_s": b["plain_scan_s"],
        "big_near_scan_rss_mb": b["near_scan_rss_mb"],
        "big_similar": b["similar"],
        "big_batches": b["batches"],
        "records_generated": {"small": s["records"], "big": b["records"]},
        "batches_run": {"small": s["batches_run"], "big": b["batches_run"]},
    }


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["child"])
    p.add_argument("url")
    p.add_argument("prompts", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("max_batches", type=int)
    args = p.parse_args(argv)
    emit(asyncio.run(_child(args.url, args.prompts, args.out, args.max_batches)))


if __name__ == "__main__":
    main(sys.argv[1:])
