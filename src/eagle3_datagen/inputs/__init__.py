"""Stage 1, input: plan a partition file into batches, parse its lines, find repeated ids."""
