"""CPU shim for `speculators train` 0.9.0 (patch 1 of 2 in docs/exports.md,
"From dataset to drafter").

speculators moves the model and every batch to ``local_rank`` (the int 0, i.e. a GPU) and calls
``torch.accelerator.synchronize()`` on every logged step; both fail without an accelerator.
This runs speculators' own ``train`` entry point with two changes (and, for the lab only, the
opt-in third below): the Trainer's device is "cpu", and synchronize is a no-op when there is
no accelerator. Everything else
(data loading, shift, model, loss, optimizer) is speculators' code, selected by its own flags
``--draft-attn-impl sdpa --loss-implementation eager`` (flex attention has no CPU backward;
the fused losses need Triton on a GPU).

With LAB_SKIP_VALIDATION=1 (the real-model lab, trainers/lab/real_train.sh) the trainer also
gets no validation loader, so it runs no validation epochs. Validation changes no weight and the
lab takes each draft's last checkpoint and measures it on the held-out prompts itself; on a
quarter of the real lab's records the validation epochs were about 40 % of a draft's time.

usage: python speculators_cpu.py <speculators train arguments>
"""

import os

import torch
from speculators.train import cli
from speculators.train.config import TrainConfig
from speculators.train.trainer import Trainer


class CpuTrainer(Trainer):
    def __init__(self, model, config, train_loader, val_loader=None):  # type: ignore[no-untyped-def]
        if os.environ.get("LAB_SKIP_VALIDATION") == "1":
            val_loader = None
        super().__init__(model, config, train_loader, val_loader)

    def setup_model(self):  # type: ignore[no-untyped-def]
        self.local_rank = "cpu"
        self.device_type = "cpu"
        return super().setup_model()


if __name__ == "__main__":
    if torch.accelerator.current_accelerator() is None:
        torch.accelerator.synchronize = lambda *args, **kwargs: None
    cli.Trainer = CpuTrainer  # type: ignore[misc]
    cli.main(TrainConfig.resolve())
