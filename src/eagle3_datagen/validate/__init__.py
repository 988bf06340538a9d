"""Stage 5, validate: the token-by-token checks of one output, and of a finished dataset."""
