"""CPU shim for `specforge train` 0.2.0 (patch 2 of 2 in docs/exports.md,
"From dataset to drafter").

SpecForge's EAGLE-3 KL loss exists only as a Triton kernel (``specforge.core.loss.
LogSoftmaxLoss``), which needs a GPU driver ("0 active drivers"). This replaces it, in the
EAGLE-3 model module only, with the kernel's own torch reference in the same file,
``specforge.core.loss._compute_loss`` (-sum(position_mask * target_p * log_softmax(logits))
per position, mean over B*T), differentiated by autograd. Everything else is SpecForge's code,
run by its own ``specforge`` CLI; the rest of the CPU setup is config
(training.fsdp_sharding NO_SHARD, training.attention_backend sdpa).

usage: python specforge_cpu.py train --config RUN.yaml
"""

import sys

from specforge import cli
from specforge.algorithms.eagle3 import model as eagle3_model
from specforge.core.loss import _compute_loss


class TorchLogSoftmaxLoss:
    @staticmethod
    def apply(logits, target_p, position_mask):  # type: ignore[no-untyped-def]
        return _compute_loss(logits, target_p, position_mask)


if __name__ == "__main__":
    eagle3_model.LogSoftmaxLoss = TorchLogSoftmaxLoss  # type: ignore[attr-defined]
    sys.exit(cli.main(sys.argv[1:]))
