"""An untrained EAGLE-3 draft: speculators' own model class, freshly initialized (seed SEED,
default 0), with the verifier's embedding and lm_head loaded as speculators does before
training, saved as a checkpoint. Verified against the target it should accept about nothing
(accept length ~1): the check that an accept length comes from what a draft learned, not from
the verifier.

usage: python random_draft.py TRAINED_DRAFT_DIR OUT_DIR [SEED]
"""

import sys

import torch
from speculators.models.eagle3 import Eagle3DraftModel


def main(trained: str, out: str, seed: str = "0") -> None:
    config = Eagle3DraftModel.from_pretrained(trained).config
    torch.manual_seed(int(seed))
    model = Eagle3DraftModel(config)
    model.load_verifier_weights()
    model.save_pretrained(out)
    print(f"untrained draft: {out}")


if __name__ == "__main__":
    main(*sys.argv[1:4])
