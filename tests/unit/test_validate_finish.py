"""What a ``stop`` finish must carry to count as a clean end of turn.

SGLang 0.5.23 replaces an out-of-vocabulary sample (NaN logits) with a stop or EOS id and reports
``{"type": "stop", "matched": "NaN happened"}`` (``managers/schedule_batch.py``,
``_check_vocab_boundary_finish``). The pipeline sends no stop strings, so a string there means
the last id was invented by the server, even when it is the end-of-turn token.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from eagle3_datagen.config import SpecialTokens, ValidationPolicy
from eagle3_datagen.render.token_ids import TokenIds
from eagle3_datagen.validate.tokens import Verdict, validate_output

if TYPE_CHECKING:
    from eagle3_datagen.render.chat_tokenizer import ChatTokenizer


@pytest.fixture(scope="module")
def ids(chat_tokenizer: ChatTokenizer) -> TokenIds:
    return TokenIds.resolve(chat_tokenizer, SpecialTokens())


def _validate(ids: TokenIds, matched: int | str | None) -> Verdict:
    prompt = [5, 6, 7, ids.think_start]
    out = [10, 11, ids.think_end, 12, 13, ids.end_of_turn]
    return validate_output(
        prompt,
        out,
        finish_type="stop",
        finish_matched=matched,
        prompt_tokens=len(prompt),
        completion_tokens=len(out),
        ids=ids,
        policy=ValidationPolicy(),
    )


def test_nan_substitution_ending_in_end_of_turn_is_rejected(ids: TokenIds) -> None:
    verdict = _validate(ids, "NaN happened")
    assert not verdict.accepted
    assert [code for code, _ in verdict.reasons] == ["stop_not_a_token"]
    assert "NaN happened" in verdict.reason_text


def test_any_string_matched_is_not_a_clean_stop(ids: TokenIds) -> None:
    assert not _validate(ids, "</answer>").accepted


def test_matched_end_of_turn_id_is_a_clean_stop(ids: TokenIds) -> None:
    assert _validate(ids, ids.end_of_turn).accepted


def test_unknown_matched_offline_still_checks_the_last_id(ids: TokenIds) -> None:
    # Stored records keep no finish_matched; the last-token rules alone decide.
    assert _validate(ids, None).accepted
