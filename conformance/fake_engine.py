"""A CPU fake of SGLang 0.5.23's scheduler and model, behind SGLang's real TokenizerManager code.

`FakeTokenizerManager` subclasses SGLang's own `TokenizerManager` and keeps its request path:
`generate_request` (normalisation by `GenerateReqInput.normalize_batch_and_arguments`, the
duplicate-rid check of `_init_req_state`, `_validate_one_request`, `_create_tokenized_object`
with `SamplingParams(**kw).normalize().verify()`), `_stream_one_response` (disconnect polling,
abort status codes to 400/503) and `_handle_batch_output` (the response body and `meta_info`).
Only what crosses the ZMQ boundary is replaced: `_send_one_request` hands the tokenized request
to `FakeScheduler` instead of the scheduler process, and the fake answers with a real
`BatchStrOutput`, as the detokenizer would.

The scheduler rules our client meets are copied from SGLang's source (paths are inside the
`sglang` wheel, relative to `sglang/srt/`); each method cites its lines. Outputs come from the
emulator's deterministic fake model (`sglang_emulator.fake_model`), so they are shaped like a
thinking model's. Every finished request is appended to a JSONL log (`--fake-log`): what the
fake returned for each rid, token for token, for tests to compare against.

Request triggers (by rid, never used by the pipeline): a rid containing ``conformance:hold``
stays in flight until aborted (abort and duplicate-rid cases); ``conformance:nan`` makes the
last generated id fall outside the vocabulary, which SGLang replaces (see `_nan_substitute`); a
rid that is a key of the ``--fake-outputs`` JSON file gets those output ids instead of the fake
model's (the chat-response cases of `conformance/chat_response.py`).

The text of every answer is made by SGLang's own `DetokenizerManager._decode_batch_token_id_output`,
fed as the scheduler feeds it (`SGLangDetokenizer`).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import threading
import time
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from sglang.srt.managers.io_struct import BatchStrOutput
from sglang.srt.managers.schedule_batch import (
    FINISH_ABORT,
    FINISH_LENGTH,
    FINISH_MATCHED_STR,
    FINISH_MATCHED_TOKEN,
)
from sglang.srt.managers.tokenizer_manager import TokenizerManager
from sglang.srt.managers.utils import validate_input_length
from sglang.srt.runtime_context import get_parallel, get_schedule, get_serving

from conformance.fake_logprobs import OutputLogprobs, output_logprobs
from sglang_emulator.fake_model import FakeModel
from sglang_emulator.vocab import Vocab

logger = logging.getLogger("conformance.fake_engine")

# BatchStrOutput's per-request fields the fake fills only for logprob requests, and the others
# it never fills (None: no request in the batch asked; io_struct.py:1728-1830).
LOGPROB_FIELDS = (
    "input_token_logprobs_val",
    "input_token_logprobs_idx",
    "output_token_logprobs_val",
    "output_token_logprobs_idx",
    "input_top_logprobs_val",
    "input_top_logprobs_idx",
    "output_top_logprobs_val",
    "output_top_logprobs_idx",
    "input_token_ids_logprobs_val",
    "input_token_ids_logprobs_idx",
    "output_token_ids_logprobs_val",
    "output_token_ids_logprobs_idx",
)
OTHER_FIELDS = (
    "output_token_entropy_val",
    "output_token_sampling_mask",
    "output_hidden_states",
    "routed_experts",
    "indexer_topk",
    "placeholder_tokens_idx",
    "placeholder_tokens_val",
)
HOLD_TRIGGER = "conformance:hold"
NAN_TRIGGER = "conformance:nan"


@dataclass
class FakeSettings:
    """Knobs of the fake (``--fake-*`` flags of `conformance.server`)."""

    kv_pool_tokens: int | None = None  # max_total_num_tokens; default 4 x context length
    latency_s: float = 0.0  # per request, before the answer
    log_path: Path | None = None
    mean_output_tokens: float = 120.0
    max_output_tokens: int = 4096
    outputs_path: Path | None = None  # JSON {rid: output ids}: scripted answers


class FakeModelConfig:
    """What TokenizerManager reads from `ModelConfig`, taken from the model dir's config.json.

    SGLang's `ModelConfig.from_server_args` sizes a real model (dtype, quantization, attention
    layout) for a device; the test model dirs hold only a tokenizer and a config, which SGLang's
    own `get_config` loads here. Context length follows SGLang's rule:
    `--context-length` if given, else the config's `max_position_embeddings`
    (`configs/model_config.py`, `get_context_length`).
    """

    def __init__(
        self, model_path: str, context_length: int | None, trust_remote_code: bool
    ) -> None:
        from sglang.srt.utils.hf_transformers.config import get_config

        # SGLang's own config loader (the same call its resolution hooks make).
        self.hf_config = get_config(model_path, trust_remote_code=trust_remote_code)
        self.hf_text_config = getattr(self.hf_config, "text_config", self.hf_config)
        self.vocab_size = int(self.hf_text_config.vocab_size)
        self.context_len = int(context_length or self.hf_text_config.max_position_embeddings)
        self.is_generation = True
        self.is_multimodal = False
        self.is_image_understandable_model = False
        self.is_audio_understandable_model = False
        self.is_embedding_gemma = False
        self.image_token_id = None
        self.dtype = "bfloat16"

    def __getattr__(self, name: str) -> Any:
        # Other ModelConfig fields (decision_config, embedding specs, ...) are read only by the
        # OpenAI/embedding routes' constructors at start-up; None is their "not this model".
        if name.startswith("__"):
            raise AttributeError(name)
        return None

    def get_default_sampling_params(self) -> dict[str, Any]:
        """Used by the OpenAI routes only (`/generate` ignores generation_config.json)."""
        return {}

    @classmethod
    def from_server_args(cls, server_args: Any) -> FakeModelConfig:
        return cls(
            server_args.model_path,
            server_args.context_length,
            bool(server_args.trust_remote_code),
        )


@dataclass
class _Running:
    rid: str
    task: asyncio.Task[None] | None = None
    output_ids: list[int] = field(default_factory=list)
    aborted: bool = False


class FakeScheduler:
    """The scheduler + model + detokenizer, in-process, for single (non-batch) requests."""

    def __init__(self, tm: FakeTokenizerManager, settings: FakeSettings) -> None:
        self.tm = tm
        self.settings = settings
        self.vocab = Vocab(
            Path(tm.server_args.model_path),
            Path(tm.server_args.tokenizer_path or tm.server_args.model_path),
            trust_remote_code=bool(tm.server_args.trust_remote_code),
        )
        self.model = FakeModel(
            self.vocab,
            mean_output_tokens=settings.mean_output_tokens,
            max_output_tokens=settings.max_output_tokens,
        )
        context_len = tm.model_config.context_len
        self.max_total_num_tokens = settings.kv_pool_tokens or 4 * context_len
        # tp_worker.py:568-572: max_req_len = min(context_len - 1, kv_capacity - 1);
        # max_req_input_len = max_req_len - 5.
        self.max_req_len = min(context_len - 1, self.max_total_num_tokens - 1)
        self.max_req_input_len = self.max_req_len - 5
        # The model's EOS set: config.json eos_token_id U generation_config.json eos_token_id
        # (configs/model_config.py `_get_hf_eos_token_id`); the emulator's Vocab reads both.
        self.eos_token_ids = set(self.vocab.eos_ids)
        self.detokenizer = SGLangDetokenizer(tm.server_args)
        # In flight beyond --max-running-requests count as the waiting queue.
        self.running: dict[str, _Running] = {}
        self._log_lock = threading.Lock()

    def scheduler_info(self) -> dict[str, Any]:
        """`Scheduler.get_init_info` (managers/scheduler.py:1937-1960)."""
        from sglang.srt.mem_cache.hicache_storage import disabled_l3_layout

        reason = (
            "HiCache controller is not attached"
            if self.tm.server_args.enable_hierarchical_cache
            else "Hierarchical cache is disabled"
        )
        return {
            "status": "ready",
            "max_total_num_tokens": self.max_total_num_tokens,
            "max_req_input_len": self.max_req_input_len,
            "startup_time": {},
            "hicache_object_layout": disabled_l3_layout(reason, page_size=1),
        }

    def internal_state(self) -> dict[str, Any]:
        """One DP rank's entry of `/server_info` `internal_states` (shape of the scheduler's)."""
        return {
            "last_gen_throughput": 0.0,
            "memory_usage": {"weight": 0.0, "kvcache": 0.0, "token_capacity": 0, "graph": 0.0},
            "effective_max_running_requests_per_dp": get_schedule().max_running_requests,
        }

    # -- admission ----------------------------------------------------------------------------

    def submit(self, req: Any) -> None:
        """Called where TokenizerManager would send the request over ZMQ."""
        rid = req.rid
        run = _Running(rid)
        self.running[rid] = run
        run.task = asyncio.get_running_loop().create_task(self._serve(req, run))

    def abort(self, rid: str, abort_all: bool) -> None:
        """`/abort_request` and disconnects: abort every rid starting with `rid`
        (managers/scheduler.py `abort_request`: `req.rid.startswith(recv_req.rid)`)."""
        for run in list(self.running.values()):
            if abort_all or run.rid.startswith(rid):
                run.aborted = True
                if run.task is not None:
                    run.task.cancel()

    async def _serve(self, req: Any, run: _Running) -> None:
        input_ids = list(req.input_ids)
        sp = req.sampling_params
        finish: Any
        output_ids: list[int] = []
        try:
            # Queue limit: managers/scheduler.py:3552-3595 (`_abort_on_queued_limit`): with
            # --max-queued-requests, a request arriving to a full waiting queue is aborted with
            # status 503 "The request queue is full." (TokenizerManager turns it into HTTP 503).
            max_queued = get_schedule().max_queued_requests
            running_limit = get_schedule().max_running_requests
            others = len(self.running) - 1
            waiting = max(0, others - running_limit) if running_limit is not None else 0
            if max_queued is not None and waiting + 1 > max_queued:
                finish = {
                    "type": "abort",
                    "status_code": 503,
                    "message": "The request queue is full.",
                }
                self._finish(req, run, [], finish)
                return
            # managers/scheduler.py:2693-2716 (`init_req_max_new_tokens`): cap at
            # max_req_len - input_len - 1.
            max_new = sp.max_new_tokens if sp.max_new_tokens is not None else 1 << 30
            max_new = max(0, min(max_new, self.max_req_len - len(input_ids) - 1))
            # managers/scheduler.py:3246-3254 + managers/utils.py:259-288: input at or over
            # max_req_input_len is aborted with 400 (`Req.set_finish_with_abort`,
            # schedule_batch.py:2221-2238).
            holder = SimpleNamespace(origin_input_ids=input_ids)
            error = validate_input_length(
                holder, self.max_req_input_len, get_serving().allow_auto_truncate
            )
            if error:
                self._finish(req, run, [], FINISH_ABORT(error, 400, "BadRequestError").to_json())
                return
            if self.settings.latency_s:
                await asyncio.sleep(self.settings.latency_s)
            if HOLD_TRIGGER in req.rid:
                await asyncio.Event().wait()  # until aborted
            digest = hashlib.sha256(array("i", input_ids).tobytes()).digest()
            stream = self._scripted(req.rid)
            if stream is None:
                stream = self.model.generate(input_ids, digest, 0, max_new)
            stream = stream[:max_new]
            output_ids, finish = self._stop(stream, sp, max_new)
            if NAN_TRIGGER in req.rid and output_ids:
                finish = self._nan_substitute(output_ids, sp)
            self._finish(req, run, output_ids, finish)
        except asyncio.CancelledError:
            # An aborted running request ends with FINISH_ABORT() ("Aborted", no status code):
            # HTTP 200 with finish_reason.type == "abort" (schedule_batch.py:332-345).
            self._finish(req, run, output_ids, FINISH_ABORT().to_json())

    def _scripted(self, rid: str) -> list[int] | None:
        """The output ids ``--fake-outputs`` gives this rid (read per request: the harness may
        add cases while the app runs)."""
        path = self.settings.outputs_path
        if path is None or not path.exists():
            return None
        ids = json.loads(path.read_text()).get(rid)
        return None if ids is None else [int(i) for i in ids]

    def _stop(self, stream: list[int], sp: Any, max_new: int) -> tuple[list[int], Any]:
        """Token stops: `Req._check_token_based_finish` (schedule_batch.py ~1856): the first id in
        stop_token_ids U the model's EOS ids ends the output and is kept in it
        (`finished_len = matched_pos + 1`); `ignore_eos` disables both."""
        stops: set[int] = set()
        if not sp.ignore_eos:
            stops |= set(sp.stop_token_ids or ())
            stops |= self.eos_token_ids
        for i, tok in enumerate(stream):
            if tok in stops:
                return stream[: i + 1], FINISH_MATCHED_TOKEN(matched=tok).to_json()
        return stream, FINISH_LENGTH(length=max_new).to_json()

    def _nan_substitute(self, output_ids: list[int], sp: Any) -> Any:
        """schedule_batch.py:1977-1991 (`_check_vocab_boundary_finish`): an id outside the
        vocabulary (NaN logits) is replaced by next(iter(stop_token_ids)), then by
        next(iter(eos_token_ids)), and the finish is FINISH_MATCHED_STR("NaN happened")."""
        offset = len(output_ids) - 1
        output_ids[offset] = self.tm.model_config.vocab_size  # the bad id the model "sampled"
        if sp.stop_token_ids:
            output_ids[offset] = next(iter(sp.stop_token_ids))
        if self.eos_token_ids:
            output_ids[offset] = next(iter(self.eos_token_ids))
        return FINISH_MATCHED_STR(matched="NaN happened").to_json()

    # -- output -------------------------------------------------------------------------------

    def _finish(self, req: Any, run: _Running, output_ids: list[int], finish: Any) -> None:
        self.running.pop(run.rid, None)
        lp = None
        if req.return_logprob:
            lp = output_logprobs(
                list(req.input_ids),
                output_ids,
                req.sampling_params,
                req.top_logprobs_num,
                self.tm.model_config.vocab_size,
            )
        outs = [
            self._output(req, chunk, text, output_ids[:end], finish if last else None, lp)
            for chunk, text, end, last in self._chunks(req, output_ids, finish)
        ]
        if not req.rid.startswith("HEALTH_CHECK"):
            self._log(req, output_ids, finish, lp)
        self.tm.deliver(*outs)

    def _chunks(
        self, req: Any, output_ids: list[int], finish: Any
    ) -> list[tuple[slice, str, int, bool]]:
        """What the scheduler sends a non-streaming request: with ``return_logprob``, a chunk
        every SGLANG_FORCE_STREAM_INTERVAL output ids, then the finished one
        (output_streamer.py:459-481), each with its slice of the output and of its logprobs
        (output_streamer.py:612-645), which TokenizerManager accumulates
        (tokenizer_manager.py:3009-3096). Other requests come as the finished chunk alone (the
        answer is the same; their text is still made chunk by chunk, `SGLangDetokenizer`)."""
        parts = self.detokenizer.parts(req, output_ids, finish)
        if not req.return_logprob:
            return [(slice(0, len(output_ids)), "".join(parts), len(output_ids), True)]
        ends = chunk_ends(len(output_ids))
        starts = [0, *ends[:-1]]
        return [
            (slice(a, b), text, b, b == ends[-1])
            for a, b, text in zip(starts, ends, parts, strict=True)
        ]

    def _output(
        self,
        req: Any,
        chunk: slice,
        text: str,
        sent_ids: list[int],
        finish: Any,
        lp: OutputLogprobs | None,
    ) -> BatchStrOutput:
        """One `BatchStrOutput` for one request, as the detokenizer forwards the scheduler's
        (detokenizer_manager.py:480-510): the logprob fields are lists (one entry per request)
        when the batch has a ``return_logprob`` request, else None (output_streamer.py:421-436).
        ``logprob_start_len`` -1 scores no prompt token: the input fields are empty
        (logprob_result_processor.py:373-390, output_streamer.py:566-610)."""
        fields: dict[str, Any] = dict.fromkeys(LOGPROB_FIELDS)
        if lp is not None:
            fields.update(
                input_token_logprobs_val=[[]],
                input_token_logprobs_idx=[[]],
                input_top_logprobs_val=[[]],
                input_top_logprobs_idx=[[]],
                output_token_logprobs_val=[lp.token_val[chunk]],
                output_token_logprobs_idx=[lp.token_idx[chunk]],
                output_top_logprobs_val=[lp.top_val[chunk]],
                output_top_logprobs_idx=[lp.top_idx[chunk]],
                input_token_ids_logprobs_val=[[]],
                input_token_ids_logprobs_idx=[[]],
                output_token_ids_logprobs_val=[[]],
                output_token_ids_logprobs_idx=[[]],
            )
        return BatchStrOutput(
            rids=[req.rid],
            finished_reasons=[finish],
            output_strs=[text],
            output_ids=[array("q", sent_ids[chunk])],
            prompt_tokens=[len(req.input_ids)],
            completion_tokens=[len(sent_ids)],
            reasoning_tokens=[0],
            cached_tokens=[0],
            retraction_counts=[0],
            **fields,
            **dict.fromkeys(OTHER_FIELDS),
        )

    def _log(self, req: Any, output_ids: list[int], finish: Any, lp: OutputLogprobs | None) -> None:
        path = self.settings.log_path
        if path is None:
            return
        entry: dict[str, Any] = {
            "rid": req.rid,
            # SGLang's own warm-up sends text; the pipeline sends input_ids.
            "from_text": bool(req.input_text),
            "input_ids": list(req.input_ids),
            "output_ids": output_ids,
            "finish_reason": finish,
            "time": time.time(),
        }
        if lp is not None:  # the scheduler's values, before TokenizerManager shapes them
            entry["logprobs"] = {
                "top_logprobs_num": req.top_logprobs_num,
                "token_val": lp.token_val,
                "token_idx": lp.token_idx,
                "top_val": lp.top_val,
                "top_idx": lp.top_idx,
            }
        line = json.dumps(entry)
        with self._log_lock, path.open("a") as f:
            f.write(line + "\n")


def chunk_ends(n_output: int) -> list[int]:
    """Where a non-streaming request's chunks end: every SGLANG_FORCE_STREAM_INTERVAL output
    ids, then at its end (output_streamer.py:459-481)."""
    from sglang.srt.managers.scheduler_components.output_streamer import (
        DEFAULT_FORCE_STREAM_INTERVAL,
    )

    ends = [k for k in range(1, n_output) if k % DEFAULT_FORCE_STREAM_INTERVAL == 0]
    return [*ends, n_output]


class SGLangDetokenizer:
    """SGLang's `DetokenizerManager` (managers/detokenizer_manager.py) without its process: its
    own `init_tokenizer` and the fields `init_running_status` sets (no watchdog thread), and its
    own `_decode_batch_token_id_output`, fed what the scheduler sends for a non-streaming
    request (managers/scheduler_components/output_streamer.py `accept`: a chunk every
    SGLANG_FORCE_STREAM_INTERVAL output ids, then the finished one; `decode_ids` and
    `read_offset` from `Req.init_incremental_detokenize`, schedule_batch.py:1788-1806: the last
    INIT_INCREMENTAL_DETOKENIZATION_OFFSET prompt ids first). The answer's text is the
    chunks' outputs joined, as TokenizerManager joins them for a non-streaming request."""

    def __init__(self, server_args: Any) -> None:
        from sglang.srt.managers.detokenizer_manager import DetokenizerManager
        from sglang.srt.parser.response_template import tool_close_token_ids

        d = object.__new__(DetokenizerManager)
        d.init_tokenizer(server_args)
        d.decode_status = {}
        d.disable_tokenizer_batch_decode = get_serving().disable_tokenizer_batch_decode
        d.is_tool_call_parser_gpt_oss = get_serving().tool_call_parser == "gpt-oss"
        d.tool_close_token_ids = tool_close_token_ids(get_serving().tool_call_parser, d.tokenizer)
        self.manager = d

    def parts(self, req: Any, output_ids: list[int], finish: Any) -> list[str]:
        """The text of each chunk (`chunk_ends`), as the detokenizer sends them."""
        from sglang.srt.managers.schedule_batch import INIT_INCREMENTAL_DETOKENIZATION_OFFSET

        sp = req.sampling_params
        prompt = list(req.input_ids)
        read_offset = len(prompt)
        surr_offset = max(read_offset - INIT_INCREMENTAL_DETOKENIZATION_OFFSET, 0)
        parts: list[str] = []
        sent = 0
        for k in chunk_ends(len(output_ids)):
            decode_ids = (prompt[surr_offset:] + output_ids[:k])[sent:]
            sent = len(prompt) - surr_offset + k
            batch = SimpleNamespace(
                rids=[req.rid],
                decoded_texts=[""],
                decode_ids=[decode_ids],
                read_offsets=[read_offset - surr_offset],
                finished_reasons=[finish if k == len(output_ids) else None],
                no_stop_trim=[sp.no_stop_trim],
                skip_special_tokens=[sp.skip_special_tokens],
                spaces_between_special_tokens=[sp.spaces_between_special_tokens],
            )
            parts += self.manager._decode_batch_token_id_output(batch)
        return parts


class FakeTokenizerManager(TokenizerManager):
    """SGLang's TokenizerManager with the ZMQ side replaced by `FakeScheduler`.

    `__init__` runs the real initialisers that need no scheduler process or GPU
    (`init_model_config` with `FakeModelConfig`, `init_tokenizer_and_processor`,
    `init_running_status`, `init_request_logging_and_dumping`, `init_weight_update`,
    `init_lora`, `init_disaggregation`) and skips IPC, metrics, watchdogs and CUDA transports.
    """

    model_config_class = FakeModelConfig

    def __init__(self, server_args: Any, settings: FakeSettings) -> None:
        from sglang.srt.managers.tokenizer_manager import SignalHandler
        from sglang.srt.runtime_context import get_observability
        from sglang.srt.sampling.sampling_params import SamplingParams

        self.server_args = server_args
        self.startup_time = None
        self.elastic_worker_count = get_parallel().num_dp_ranks
        self.enable_metrics = get_observability().enable_metrics
        self.incremental_streaming_output = get_serving().incremental_streaming_output
        self.enable_lora = False
        self.enable_trace = False
        self.allow_auto_truncate = get_serving().allow_auto_truncate
        self.skip_tokenizer_init = get_serving().skip_tokenizer_init
        self.preferred_sampling_params = get_serving().preferred_sampling_params
        self.crash_dump_folder = None
        self.init_model_config()
        self.init_tokenizer_and_processor()
        self.tokenizer_ipc_name = None
        self.init_running_status()
        self.init_request_logging_and_dumping()
        self.init_weight_update()
        self.init_lora()
        self.init_disaggregation(start_pd_bootstrap_service=False)
        self.sampling_params_class = SamplingParams
        self.signal_handler_class = SignalHandler
        self.scheduler = FakeScheduler(self, settings)
        self.max_req_input_len = self.scheduler.max_req_input_len

    # The handle loop reads the scheduler's ZMQ socket; here outputs arrive by `deliver`.
    def auto_create_handle_loop(self) -> None:
        self.event_loop = asyncio.get_running_loop()

    async def _send_one_request(self, tokenized_obj: Any) -> None:
        tokenized_obj.time_stats.set_api_server_dispatch_time()
        self.scheduler.submit(tokenized_obj)
        self._mark_state_dispatched(tokenized_obj.rid)
        tokenized_obj.time_stats.set_api_server_dispatch_finish_time()

    def _dispatch_to_scheduler(self, obj: Any) -> None:
        from sglang.srt.managers.io_struct import AbortReq

        if isinstance(obj, AbortReq):
            self.scheduler.abort(obj.rid, obj.abort_all)

    def deliver(self, *outs: BatchStrOutput) -> None:
        """What `handle_loop` does with detokenizer messages, one after another
        (tokenizer_manager.py:2465)."""
        from sglang.srt.managers.tokenizer_manager import real_time

        async def handle() -> None:
            for out in outs:
                self.last_receive_tstamp = real_time()
                await self._handle_batch_output(out)

        asyncio.get_running_loop().create_task(handle())

    async def get_internal_state(self) -> list[dict[str, Any]]:
        return [self.scheduler.internal_state()]

    async def flush_cache(self, timeout_s: float = 0.0) -> Any:
        return SimpleNamespace(success=True, message="")
