"""Eval: a draft's accept length on the dataset's held-out split, measured by a speculating
server (docs/eval.md)."""
