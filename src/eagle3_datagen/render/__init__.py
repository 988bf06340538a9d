"""Stage 2, render: prompts to token ids with the model's own tokenizer and chat template."""
