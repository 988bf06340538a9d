"""Stage 4, generate: one batch end to end, the per-request retry loop, planning, progress."""
