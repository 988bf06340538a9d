"""What earlier attempts and runs left for a batch's requests: its journal, then the results
of superseded batches, so a retried or resumed batch sends only what it has no answer for."""

from __future__ import annotations

from eagle3_datagen.generate.offload import JournalWriter
from eagle3_datagen.sglang.client import GenerateResult
from eagle3_datagen.write.journal import BatchJournal
from eagle3_datagen.write.resume import Prior, ReusePool


class Earlier:
    """What earlier attempts and runs left for this batch's requests, by prompt key (the
    record's id and its prompt ids; nothing is matched by line number, the input may have
    changed since): this batch's journal, then the results of superseded batches. First turns
    are looked up together (one file read per superseded shard); a later turn's prompt is only
    known once the turn before it is, so it is looked up alone. A result found in another
    batch's journal is copied into this one's, so it outlives that journal."""

    def __init__(self, journal: BatchJournal, reuse: ReusePool, first_keys: list[int]) -> None:
        self.journal = journal
        self.writer = JournalWriter(journal)
        self.journaled = journal.load()
        self.reuse = reuse
        missing = [k for k in first_keys if k not in self.journaled]
        self.prefetched = reuse.take(missing) if missing and len(reuse) else {}

    def find(self, key: int) -> Prior | None:
        found: Prior | None = self.journaled.get(key)
        if found is not None:
            return found
        if key in self.prefetched:
            found = self.prefetched[key]
        elif len(self.reuse):
            found = self.reuse.take([key]).get(key)
        if isinstance(found, GenerateResult):
            self.add(key, found)
        return found

    def add(self, key: int, result: GenerateResult) -> None:
        """Journal a finished result: written by a worker thread; a write that failed (a full
        disk) raises OutputWriteError here or when the batch drains its journal."""
        self.writer.add(key, result)
        self.journaled[key] = result
