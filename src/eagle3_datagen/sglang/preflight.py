"""Check a healthy server before the first prompt: wrong settings fail here, not 100k prompts in.

What is checked, and why:

- ``/server_info`` answers with the configured API key (``/health*`` needs none, so this is
  where a wrong key shows).
- ``reasoning_parser`` must be unset: the contract is raw ``output_ids`` from a server launched
  without it (docs/contract.md), so a server with one is refused even though ``/generate``
  ignores it.
- A speculating server must be lossless, and its draft (where readable here) must fit the
  model (``spec_preflight.py``).
- ``tp_size`` and the model/tokenizer paths are compared with the config (warnings only: an
  attached server may legitimately differ, e.g. a hub id versus a local snapshot).
- One smoke ``/generate`` with ``input_ids`` and the run's own sampling parameters, under the
  run's retry policy (a busy server's 503 is not a failed pre-flight): a 400 for those
  parameters fails here with SGLang's reason instead of rejecting every prompt, and the server
  must count exactly the ids we sent (``prompt_tokens``), or token-exact data is impossible.
- Warnings for settings that silently undo a config promise: ``sampling.seed`` on a server
  without deterministic inference (SGLang then ignores ``sampling_seed``), and an API key on a
  server with several tokenizer workers (SGLang then does not check it).
- The context length is learnt so that prompts that cannot fit are rejected locally
  (:meth:`ServerFacts.fits`) instead of costing a round trip each.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eagle3_datagen.config import ModelSpec, RetryPolicy, Sampling, ServerSpec
from eagle3_datagen.errors import PreflightError, RejectedRequestError, RequestError
from eagle3_datagen.sglang.client import SGLangClient
from eagle3_datagen.sglang.health import LogSink
from eagle3_datagen.sglang.redact import is_secret_name, redact_text
from eagle3_datagen.sglang.requests import generate_with_retries
from eagle3_datagen.sglang.spec_preflight import (
    check_attached_draft,
    refuse_lossy,
    speculation_line,
)

_default_log = logging.getLogger(__name__)

SMOKE_INPUT_IDS = [1, 2, 3, 4]
SMOKE_MAX_NEW_TOKENS = 1
# SGLang derives max_req_input_len = min(context_len - 1, pool - 1) - 5 (scheduler.py;
# docs/sglang-api.md section 4).
_REQ_INPUT_MARGIN = 6


def sanitize(value: Any, secrets: tuple[str, ...] = ()) -> Any:
    """A deep copy of ``value`` without secret-named keys and with secret strings hidden.

    Recurses because ``internal_states`` repeats the server args (api_key included) once per
    data-parallel rank, and ``launch_command`` (v0.5.23) is the whole command line as a string.
    """
    if isinstance(value, dict):
        return {
            k: sanitize(v, secrets)
            for k, v in value.items()
            if not (isinstance(k, str) and is_secret_name(k))
        }
    if isinstance(value, list | tuple):
        return [sanitize(v, secrets) for v in value]
    if isinstance(value, str):
        return redact_text(value, secrets)
    return value


@dataclass(frozen=True, slots=True)
class ServerFacts:
    """What the run learnt about the server: the context length, and args for the manifest.

    ``server_args`` and ``model_info`` hold no secrets (see :func:`sanitize`), so they can go
    into the run fingerprint and Prefect artifacts as they are.
    """

    context_length: int
    context_length_source: str
    version: str | None
    server_args: dict[str, Any]
    model_info: dict[str, Any]
    max_req_input_len: int | None = None
    warnings: list[str] = field(default_factory=list)

    def fits(self, prompt_len: int, max_new_tokens: int) -> str | None:
        """Why SGLang would reject this request for its length, or None if it fits."""
        return length_rejection(
            prompt_len, max_new_tokens, self.context_length, self.max_req_input_len
        )


def length_rejection(
    prompt_len: int, max_new_tokens: int, context_length: int, max_req_input_len: int | None
) -> str | None:
    """Why SGLang would reject a request for its length (``prompt_too_long: ...``), or None.

    SGLang's rules (docs/sglang-api.md, section 4): the prompt alone must be shorter than the
    context, prompt + max_new_tokens must not exceed it, and the scheduler aborts prompts of
    ``max_req_input_len`` tokens or more (a smaller KV pool can make that bind first).
    """
    ctx = context_length
    if prompt_len >= ctx:
        return (
            f"prompt_too_long: the prompt ({prompt_len} tokens) is not shorter than the "
            f"context length ({ctx} tokens)"
        )
    if prompt_len + max_new_tokens > ctx:
        return (
            f"prompt_too_long: prompt ({prompt_len} tokens) + max_new_tokens "
            f"({max_new_tokens}) = {prompt_len + max_new_tokens} exceeds the context length "
            f"({ctx} tokens)"
        )
    if max_req_input_len is not None and prompt_len >= max_req_input_len:
        return (
            f"prompt_too_long: the prompt ({prompt_len} tokens) reaches the server's "
            f"max_req_input_len ({max_req_input_len} tokens)"
        )
    return None


def _positive_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float) and value > 0:
        return int(value)
    return None


def _config_context_length(model_dir: str | None) -> int | None:
    """``max_position_embeddings`` from a local ``config.json`` (also inside ``text_config``,
    as multimodal configs such as Kimi-K2.5's nest it)."""
    if not model_dir:
        return None
    path = Path(model_dir) / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    for section in (config, config.get("text_config") or {}):
        if isinstance(section, dict):
            for key in ("max_position_embeddings", "max_sequence_length", "seq_length"):
                if (n := _positive_int(section.get(key))) is not None:
                    return n
    return None


async def _served_max_model_len(client: SGLangClient) -> int | None:
    """``max_model_len`` from ``/v1/models`` (SGLang's resolved context length), if served."""
    try:
        data = await client.get_json("/v1/models")
    except (RequestError, ValueError):
        return None
    items = data.get("data") if isinstance(data, dict) else None
    if isinstance(items, list) and items and isinstance(items[0], dict):
        return _positive_int(items[0].get("max_model_len"))
    return None


async def resolve_context_length(
    client: SGLangClient, server_info: dict[str, Any], model_info: dict[str, Any]
) -> tuple[int, str]:
    """The server's context length and where it came from, most to least authoritative.

    1. ``/server_info`` ``context_length``: set when the server was launched with
       ``--context-length`` (null otherwise);
    2. ``/v1/models`` ``max_model_len``: the server's resolved value;
    3. ``max_position_embeddings`` in the served model's ``config.json``, when it is a local
       directory (what SGLang itself reads);
    4. ``max_req_input_len + 6``, SGLang's own derivation reversed (a lower bound when the KV
       pool is the binding limit);
    5. ``max_total_num_tokens`` (the KV pool; an upper bound on any request).
    """
    if (n := _positive_int(server_info.get("context_length"))) is not None:
        return n, "server_info.context_length"
    if (n := await _served_max_model_len(client)) is not None:
        return n, "/v1/models max_model_len"
    model_path = model_info.get("model_path") or server_info.get("model_path")
    if (n := _config_context_length(model_path)) is not None:
        return n, f"{model_path}/config.json"
    if (n := _positive_int(server_info.get("max_req_input_len"))) is not None:
        return n + _REQ_INPUT_MARGIN, "server_info.max_req_input_len + 6"
    if (n := _positive_int(server_info.get("max_total_num_tokens"))) is not None:
        return n, "server_info.max_total_num_tokens"
    raise PreflightError(
        "cannot determine the server's context length: /server_info has no context_length, "
        "max_req_input_len or max_total_num_tokens; launch it with --context-length"
    )


def _same_location(served: str, configured: str) -> bool:
    """Equal paths, or equal last components (hub id ``org/Name`` vs a local ``.../Name``)."""
    a, b = served.rstrip("/"), configured.rstrip("/")
    if a == b:
        return True
    pa, pb = Path(a).expanduser(), Path(b).expanduser()
    if pa.exists() and pb.exists():
        try:
            return pa.resolve() == pb.resolve()
        except OSError:
            return False
    return pa.name == pb.name


def promise_warnings(
    server_info: dict[str, Any], *, sampling: Sampling, api_key: str | None
) -> list[str]:
    """Server settings under which a config promise silently does not hold."""
    warnings = []
    if sampling.seed is not None and server_info.get("enable_deterministic_inference") is not True:
        warnings.append(
            "sampling.seed is set, but the server does not report enable_deterministic_inference: "
            "SGLang then ignores sampling_seed, so outputs are not reproducible (launch it with "
            "--enable-deterministic-inference in server.extra_args)"
        )
    workers = _positive_int(server_info.get("tokenizer_worker_num"))
    if api_key and workers is not None and workers > 1:
        warnings.append(
            f"the server runs {workers} tokenizer workers (--tokenizer-worker-num): SGLang does "
            "not check the API key then, so anyone who can reach it can use it"
        )
    return warnings


async def preflight(
    client: SGLangClient,
    *,
    server: ServerSpec,
    model: ModelSpec,
    sampling: Sampling | None = None,
    retries: RetryPolicy | None = None,
    logger: LogSink | None = None,
    api_key: str | None = None,
    temperatures: Sequence[float] = (),
) -> ServerFacts:
    """Check the server against the config and learn its context length; see module doc.

    Raises :class:`PreflightError` when the server cannot be queried (a refused API key
    included), when a reasoning parser is set, when the server refuses the run's ``sampling``
    or the smoke request runs out of ``retries``, or when its token counts are off.
    ``sampling`` and ``retries`` are the run's (the config's defaults when not given).
    ``api_key`` is the key ``client`` sends; it is scrubbed from the returned facts.
    ``temperatures``: the partitions' sample temperatures (for the speculation check).
    The checks run in the order the module doc gives them.
    """
    sampling = sampling or Sampling()
    retries = retries or RetryPolicy()
    log = logger or _default_log
    warnings: list[str] = []

    def warn(msg: str) -> None:
        warnings.append(msg)
        log.warning("preflight: %s", msg)

    server_info, model_info = await _query(client, api_key)
    _refuse_reasoning_parser(client, server_info, model_info)
    refuse_lossy(client.base_url, server_info, server, sampling, temperatures)  # spec_preflight
    check_attached_draft(server_info, model)
    if (speculating := speculation_line(server_info)) is not None:
        log.info("preflight: %s", speculating)
    for message in _mismatches(server_info, model_info, server=server, model=model):
        warn(message)
    context_length, source = await resolve_context_length(client, server_info, model_info)
    if server.context_length is not None and server.context_length != context_length:
        warn(
            f"server context length is {context_length} ({source}), the config says "
            f"{server.context_length}"
        )
    for message in promise_warnings(server_info, sampling=sampling, api_key=api_key):
        warn(message)
    await _smoke(client, sampling, retries)
    secrets = (api_key,) if api_key else ()
    server_args = {k: v for k, v in server_info.items() if k != "internal_states"}
    facts = ServerFacts(
        context_length=context_length,
        context_length_source=source,
        version=str(server_info["version"]) if server_info.get("version") else None,
        server_args=sanitize(server_args, secrets),
        model_info=sanitize(model_info, secrets),
        max_req_input_len=_positive_int(server_info.get("max_req_input_len")),
        warnings=warnings,
    )
    log.info(
        "preflight ok: %s version %s, context length %d (%s), tp_size %s",
        client.base_url,
        facts.version or "?",
        context_length,
        source,
        server_info.get("tp_size"),
    )
    return facts


async def _query(
    client: SGLangClient, api_key: str | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``/server_info`` and ``/model_info``; a refused API key is named as such."""
    try:
        server_info = await client.server_info()
        model_info = await client.model_info()
    except RequestError as err:
        if err.status in (401, 403):
            sent = "the configured API key" if api_key else "no API key"
            raise PreflightError(
                f"the server at {client.base_url} refused {sent} (HTTP {err.status} on "
                "/server_info): set server.api_key_env or server.api_key_secret to the key it "
                "was launched with (--api-key)"
            ) from None
        raise PreflightError(f"cannot query {client.base_url}: {err}") from None
    return server_info, model_info


def _refuse_reasoning_parser(
    client: SGLangClient, server_info: dict[str, Any], model_info: dict[str, Any]
) -> None:
    """A server with a reasoning parser is refused (the contract is raw output_ids)."""
    for source, info in (("/server_info", server_info), ("/model_info", model_info)):
        parser = info.get("reasoning_parser")
        if parser:
            raise PreflightError(
                f"the server at {client.base_url} runs with --reasoning-parser {parser} "
                f"(reported by {source}); relaunch it without --reasoning-parser: this "
                "pipeline stores the raw output_ids of a server launched without one, so "
                "training data matches the target model exactly (docs/contract.md)"
            )


def _mismatches(
    server_info: dict[str, Any],
    model_info: dict[str, Any],
    *,
    server: ServerSpec,
    model: ModelSpec,
) -> list[str]:
    """Where the served tp_size, model or tokenizer differ from the config (warnings only:
    an attached server may legitimately differ, e.g. a hub id versus a local snapshot)."""
    found = []
    served_tp = server_info.get("tp_size")
    claimed = server.launch.tp_size  # unset: a launch default, not a claim about the server
    if served_tp is not None and claimed is not None and served_tp != claimed:
        found.append(f"server tp_size is {served_tp}, the config says {server.launch.tp_size}")
    served_model = model_info.get("model_path") or server_info.get("model_path")
    if isinstance(served_model, str) and not _same_location(served_model, model.path):
        found.append(f"server serves model {served_model!r}, the config names {model.path!r}")
    served_tok = model_info.get("tokenizer_path") or server_info.get("tokenizer_path")
    if isinstance(served_tok, str) and not _same_location(served_tok, model.tokenizer_dir):
        found.append(
            f"server uses tokenizer {served_tok!r}, prompts are rendered with "
            f"{model.tokenizer_dir!r}"
        )
    return found


async def _smoke(client: SGLangClient, sampling: Sampling, retries: RetryPolicy) -> None:
    """One smoke /generate with the run's own sampling (a 400 for it would reject every
    prompt), with a seed as the run's requests carry one; the server must count exactly the
    ids sent and return every output id. The rid prefix tells the emulator not to inject
    faults."""
    smoke_sampling = sampling.to_sglang(SMOKE_MAX_NEW_TOKENS, [], prompt_id="preflight")
    rid = f"preflight-{uuid.uuid4().hex[:12]}"
    try:
        result = await generate_with_retries(
            client, list(SMOKE_INPUT_IDS), smoke_sampling, rid=rid, policy=retries
        )
    except RejectedRequestError as err:
        raise PreflightError(
            f"the server refuses the run's sampling parameters {smoke_sampling}: {err}"
        ) from None
    except RequestError as err:  # retries exhausted
        raise PreflightError(f"smoke /generate (rid {rid}) failed: {err}") from None
    if result.finish_type == "abort":
        raise PreflightError(
            f"smoke /generate (rid {rid}) was aborted on every try: {result.finish_message}"
        )
    if result.prompt_tokens != len(SMOKE_INPUT_IDS):
        raise PreflightError(
            f"smoke /generate sent {len(SMOKE_INPUT_IDS)} input_ids but the server counted "
            f"prompt_tokens={result.prompt_tokens}: it does not take input_ids verbatim "
            "(a chat template or BOS being added?), so token-exact records are impossible"
        )
    if len(result.output_ids) != result.completion_tokens:
        raise PreflightError(
            f"smoke /generate returned {len(result.output_ids)} output_ids but "
            f"completion_tokens={result.completion_tokens}: output_ids are not complete"
        )
