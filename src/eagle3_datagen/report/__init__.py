"""Stage 7, report: what the run shows while and after it runs (summary, alarm, messages)."""
