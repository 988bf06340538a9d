"""The run fingerprint holds what changes the tokens, and nothing a relaunch changes by itself."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from eagle3_datagen.config import parse_config
from eagle3_datagen.provenance import (
    CONTENT_SERVER_ARGS,
    RUN_ONLY_SERVER_ARGS,
    build_fingerprint,
    diff_content,
)

if TYPE_CHECKING:
    from eagle3_datagen.render.chat_tokenizer import ChatTokenizer

REPO = Path(__file__).resolve().parents[2]
TOKENIZER = REPO / "src" / "eagle3_datagen" / "assets" / "kimi-k2.5-mini"

# What /server_info reports for one launch (a subset of SGLang 0.5.23's flat field list).
SERVER_INFO: dict[str, Any] = {
    "model_path": "/shared/kimi-k2.5-int4",
    "revision": None,
    "dtype": "auto",
    "quantization": None,
    "kv_cache_dtype": "auto",
    "context_length": None,
    "preferred_sampling_params": None,
    "enable_deterministic_inference": False,
    "speculative_algorithm": None,
    "random_seed": 247846063,
    "tp_size": 8,
    "dp_size": 1,
    "mem_fraction_static": 0.88,
    "num_continuous_decode_steps": 4,
    "host": "127.0.0.1",
    "port": 8000,
    "reasoning_parser": None,
}


def _fingerprint(tok: ChatTokenizer, tokenizer_dir: Path, **changes: Any) -> dict[str, Any]:
    config = parse_config(
        {
            "model": {"path": str(tokenizer_dir)},
            "partitions": [{"name": "p", "input": "p.jsonl", "tier": "SHORT"}],
        }
    )
    return build_fingerprint(config, tok, {**SERVER_INFO, **changes}, "0.5.23")


def test_a_relaunched_server_keeps_the_fingerprint(
    chat_tokenizer: ChatTokenizer, tokenizer_dir: Path
) -> None:
    first = _fingerprint(chat_tokenizer, tokenizer_dir)
    # SGLang draws random_seed per launch; the other node of a fan-out has its own port, and
    # a resume may run on a differently sized or tuned server.
    again = _fingerprint(
        chat_tokenizer,
        tokenizer_dir,
        random_seed=864264807,
        port=30000,
        tp_size=4,
        mem_fraction_static=0.8,
        num_continuous_decode_steps=1,
    )
    assert diff_content(first["content"], again["content"]) == []
    assert first["content_sha256"] == again["content_sha256"]
    assert again["run"]["server_args"]["random_seed"] == 864264807  # still recorded


def test_lossless_speculation_keeps_the_fingerprint(
    chat_tokenizer: ChatTokenizer, tokenizer_dir: Path
) -> None:
    """Speculation the pre-flight lets through leaves the distribution: same content, and the
    settings are in the run's record."""
    first = _fingerprint(chat_tokenizer, tokenizer_dir)
    spec = {
        "speculative_algorithm": "EAGLE3",
        "speculative_draft_model_path": "/drafts/k25-eagle3",
        "speculative_num_steps": 3,
        "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 4,
    }
    speculating = _fingerprint(chat_tokenizer, tokenizer_dir, **spec)
    assert speculating["content_sha256"] == first["content_sha256"]
    assert speculating["content"]["server"]["speculative_algorithm"] is None  # as before
    assert speculating["run"]["server_args"]["speculative_num_steps"] == 3


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("dtype", "bfloat16"),
        ("kv_cache_dtype", "fp8_e5m2"),
        ("enable_deterministic_inference", True),
        ("preferred_sampling_params", '{"temperature": 0.6}'),
        ("context_length", 8192),
    ],
)
def test_what_changes_the_tokens_changes_the_fingerprint(
    chat_tokenizer: ChatTokenizer, tokenizer_dir: Path, field: str, value: Any
) -> None:
    first = _fingerprint(chat_tokenizer, tokenizer_dir)
    other = _fingerprint(chat_tokenizer, tokenizer_dir, **{field: value})
    assert first["content_sha256"] != other["content_sha256"]
    assert diff_content(first["content"], other["content"]) == [
        f"server.{field}: {SERVER_INFO[field]!r} -> {value!r}"
    ]


def test_every_decision_is_written_down() -> None:
    assert not set(CONTENT_SERVER_ARGS) & set(RUN_ONLY_SERVER_ARGS)
    doc = (REPO / "docs" / "fingerprint.md").read_text(encoding="utf-8")
    for name in [*CONTENT_SERVER_ARGS, *RUN_ONLY_SERVER_ARGS]:
        assert f"`{name}`" in doc, f"docs/fingerprint.md does not say why {name} is decided so"


def test_switching_the_render_reference_is_a_named_refusal(tmp_path: Path) -> None:
    """``model.render`` decides the prompt ids, so data of the other reference is refused."""
    from eagle3_datagen.errors import OutputConflictError
    from eagle3_datagen.render.chat_tokenizer import ChatTokenizer
    from eagle3_datagen.write.guard import guard_output
    from eagle3_datagen.write.manifest import write_manifest

    def fingerprint(render: str) -> dict[str, Any]:
        config = parse_config(
            {
                "model": {"path": str(TOKENIZER), "render": render},
                "partitions": [{"name": "p", "input": "p.jsonl", "tier": "SHORT"}],
            }
        )
        tok = ChatTokenizer(str(TOKENIZER), render=config.model.render)
        return build_fingerprint(config, tok, SERVER_INFO, "0.5.23")

    assert (
        parse_config(
            {"model": {"path": "m"}, "partitions": [{"name": "p", "input": "p", "tier": "SHORT"}]}
        ).model.render
        == "sglang_chat"
    )
    chat, template = fingerprint("sglang_chat"), fingerprint("template")
    assert diff_content(template["content"], chat["content"]) == [
        "render: 'template' -> 'sglang_chat'"
    ]
    write_manifest(tmp_path, {"fingerprint": template, "partitions": {}})
    with pytest.raises(OutputConflictError, match="render: 'template' -> 'sglang_chat'"):
        guard_output(tmp_path, chat, ["p"])


def test_asking_for_logprobs_refuses_records_made_without(
    chat_tokenizer: ChatTokenizer, tokenizer_dir: Path
) -> None:
    """Logprobs draw the same tokens, but records committed without the columns must not count
    as done; off, the fingerprint is the one written before the option existed."""

    def fingerprint(**partition: Any) -> dict[str, Any]:
        config = parse_config(
            {
                "model": {"path": str(tokenizer_dir)},
                "partitions": [{"name": "p", "input": "p.jsonl", "tier": "SHORT", **partition}],
            }
        )
        return build_fingerprint(config, chat_tokenizer, SERVER_INFO, "0.5.23")

    off = fingerprint()
    assert off["content"]["generation"]["p"] == {
        "regenerate": "last",
        "samples": 1,
        "temperatures": None,
    }
    on = fingerprint(logprobs={"top_k": 20})
    assert diff_content(off["content"], on["content"]) == [
        "generation.p.logprobs: None -> {'top_k': 20}"
    ]


def test_changing_the_mode_mixture_is_a_named_refusal(
    tmp_path: Path, chat_tokenizer: ChatTokenizer, tokenizer_dir: Path
) -> None:
    """A line's mode decides its prompt ids: a mode's kwargs or the shares changed refuse the
    data written before; without modes the fingerprint is the one from before modes existed."""
    from eagle3_datagen.errors import OutputConflictError
    from eagle3_datagen.write.guard import guard_output
    from eagle3_datagen.write.manifest import write_manifest

    def fingerprint(modes: dict[str, Any] | None, shares: dict[str, float] | None) -> Any:
        part: dict[str, Any] = {"name": "p", "input": "p.jsonl", "tier": "SHORT"}
        model: dict[str, Any] = {"path": str(tokenizer_dir)}
        if modes is not None:
            model["modes"] = modes
        if shares is not None:
            part["modes"] = shares
        config = parse_config({"model": model, "partitions": [part]})
        return build_fingerprint(config, chat_tokenizer, SERVER_INFO, "0.5.23")

    plain = fingerprint(None, None)
    assert "modes" not in plain["content"] and "modes" not in plain["content"]["generation"]["p"]
    modes = {"thinking": {}, "instant": {"thinking": False}}
    mixed = fingerprint(modes, {"thinking": 0.5, "instant": 0.5})
    shifted = fingerprint(modes, {"thinking": 0.6, "instant": 0.4})
    assert diff_content(mixed["content"], shifted["content"]) == [
        "generation.p.modes.instant: 0.5 -> 0.4",
        "generation.p.modes.thinking: 0.5 -> 0.6",
    ]
    other = fingerprint({**modes, "instant": {"thinking": True}}, {"thinking": 0.5, "instant": 0.5})
    assert diff_content(mixed["content"], other["content"]) == [
        "modes.instant.thinking: False -> True"
    ]
    write_manifest(tmp_path, {"fingerprint": mixed, "partitions": {}})
    with pytest.raises(OutputConflictError, match=r"generation\.p\.modes"):
        guard_output(tmp_path, shifted, ["p"])
