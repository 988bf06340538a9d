"""The held-out split: which conversations a draft trained on an export never saw.

One split, used by both the exports (``--validation``: the rows they leave out) and
``eagle3-datagen eval`` (the prompts it measures a draft on), so the two always agree.

- **Grouped by conversation**: every turn and sample of one input line (partition +
  ``conversation_id``) is on one side, chosen by a seeded hash of that key, so a conversation
  never changes side as the dataset grows.
- **Clean of repeated content**: inputs repeat prompts under other ids (the demo does), and a
  held-out prompt the draft trained on measures memory, not the draft. A conversation's prompt
  is the ``prompt_ids`` of its first generated turn, with the SHA-256 of each of its images:
  exactly what the target model read. Text normalisation (case, whitespace) would need the
  input text, which the dataset does not keep (and which the exports and eval must not depend
  on); the rendered ids are the text after the chat template, so two inputs that differ in any
  way the model sees are different prompts. Every held-out conversation whose prompt is also a
  training conversation's prompt moves to the training side, and the moves are counted.
- **Fixed once per dataset** (``write/split_file.py`` records it in ``split.json``): a dataset
  that grows keeps its earlier held-out conversations held out (``held_before``) and its moved
  ones in train (``moved_before``); a new conversation is assigned by the same hash, and one
  whose first prompt an earlier held-out conversation has is held out with it (that prompt
  must never reach a training file).
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field

import pyarrow as pa

SPLIT_KEY = "partition + conversation_id"
PROMPT_KEY = "prompt_ids of the conversation's first generated turn, with its images' SHA-256"
TRAIN, VALIDATION = "train", "validation"


def in_validation(partition: str, conversation: str, fraction: float, seed: int) -> bool:
    """Whether a conversation's hash holds it out: a seeded hash, so it never changes side."""
    if fraction <= 0.0:
        return False
    digest = hashlib.sha256(f"{seed}\0{partition}\0{conversation}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


def prompt_keys(prompt_ids: pa.ListArray, images: Sequence[Sequence[str]] | None) -> list[bytes]:
    """One digest per row of a ``prompt_ids`` column: its ids' int32 bytes and its images'
    SHA-256s (read from the Arrow buffer, the ids never become Python objects)."""
    values = prompt_ids.values
    data = memoryview(values.buffers()[1]).cast("B")
    base = values.offset
    offsets = prompt_ids.offsets.to_pylist()
    keys = []
    for i in range(len(prompt_ids)):
        h = hashlib.blake2b(digest_size=16)
        h.update(data[(base + offsets[i]) * 4 : (base + offsets[i + 1]) * 4])
        for digest in (images[i] if images else None) or ():
            h.update(b"\0" + digest.encode())
        keys.append(h.digest())
    return keys


@dataclass(frozen=True, slots=True)
class Conversation:
    """What the split needs of one conversation: its key and its first turn's prompt."""

    partition: str
    conversation: str
    prompt: bytes | None  # None: no first-turn record (it can repeat nothing)


@dataclass(slots=True)
class HeldOut:
    """Each conversation's side, and the held-out ones moved to train for a repeated prompt."""

    fraction: float
    seed: int
    sides: dict[tuple[str, str], str] = field(default_factory=dict)
    moved: list[tuple[str, str]] = field(default_factory=list)
    kept: int = 0  # earlier held-out conversations (split.json) held out again
    joined: list[tuple[str, str]] = field(default_factory=list)  # new, repeating a held-out prompt

    def side(self, partition: str, conversation: str) -> str:
        return self.sides.get((partition, conversation), TRAIN)

    @property
    def conversations(self) -> int:
        return len(self.sides)

    @property
    def validation_conversations(self) -> int:
        return sum(1 for side in self.sides.values() if side == VALIDATION)

    @property
    def duplicates_moved(self) -> int:
        return len(self.moved)

    def summary(self) -> dict[str, object]:
        """The split as the export metadata and eval's JSON record it."""
        return {
            "key": SPLIT_KEY,
            "validation": self.fraction,
            "seed": self.seed,
            "conversations": self.conversations,
            "validation_conversations": self.validation_conversations,
            "duplicates_moved_to_train": self.duplicates_moved,
            "earlier_held_out_kept": self.kept,
            "joined_held_out_prompt": len(self.joined),
            "duplicate_key": PROMPT_KEY,
        }

    def held_out_keys(self) -> list[tuple[str, str]]:
        return sorted(k for k, side in self.sides.items() if side == VALIDATION)


def split(
    conversations: Iterable[Conversation],
    fraction: float,
    seed: int,
    held_before: Collection[tuple[str, str]] = (),
    moved_before: Collection[tuple[str, str]] = (),
) -> HeldOut:
    """Each conversation's side: an earlier recorded side, else its hash; a new conversation
    repeating an earlier held-out prompt is held out with it; then every newly held-out
    conversation whose prompt a training conversation also has moves to train (in the order
    given, so deterministic)."""
    held = HeldOut(fraction, seed)
    before, moved_set = set(held_before), set(moved_before)
    prompts: dict[tuple[str, str], bytes | None] = {}
    for c in conversations:
        key = (c.partition, c.conversation)
        if key in held.sides:
            if prompts[key] is None:
                prompts[key] = c.prompt
            continue
        prompts[key] = c.prompt
        if key in before:
            held.sides[key] = VALIDATION
        elif key in moved_set:
            held.sides[key] = TRAIN
            held.moved.append(key)
        else:
            hashed = in_validation(c.partition, c.conversation, fraction, seed)
            held.sides[key] = VALIDATION if hashed else TRAIN
    held.kept = sum(1 for k in held.sides if k in before)
    fixed = {prompts[k] for k in held.sides if k in before and prompts[k] is not None}
    for key, side in held.sides.items():
        if side == TRAIN and key not in moved_set and prompts[key] in fixed:
            held.sides[key] = VALIDATION
            held.joined.append(key)
    trained = {p for k, p in prompts.items() if p is not None and held.sides[k] == TRAIN}
    for key, side in held.sides.items():
        new = key not in before and key not in held.joined
        if side == VALIDATION and new and prompts[key] is not None and prompts[key] in trained:
            held.sides[key] = TRAIN
            held.moved.append(key)
    return held
