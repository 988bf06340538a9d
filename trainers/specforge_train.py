"""Train a one-layer EAGLE-3 draft with `specforge train` (offline features) on CPU.

Writes the run config (SpecForge's schema; CPU needs only training.fsdp_sharding NO_SHARD and
training.attention_backend sdpa), derives the draft config with SpecForge's own
``resolve_draft_config`` from the target (one layer; draft_vocab_size 512, since SpecForge's
default 32000 exceeds the tiny target's 688-token vocabulary; a real Kimi-K2.5 vocabulary is
larger than both), then runs specforge_cpu.py (the one CPU patch) and prints each step's loss.

usage: python specforge_train.py TARGET FEATURES_TRAIN FEATURES_VALIDATION MAX_LEN WORK_DIR
"""

import json
import subprocess
import sys
from pathlib import Path

import yaml
from specforge.algorithms.builtin import builtin_algorithm_registry
from specforge.config.schema import load_config
from specforge.training.model_loading import resolve_draft_config

HERE = Path(__file__).resolve().parent
STEPS, EVAL_EVERY = 45, 15  # one record per step; the validation rows scored every 15 steps


def main(target: str, train: str, val: str, max_len: str, work: str) -> None:
    work_dir = Path(work)
    work_dir.mkdir(parents=True, exist_ok=True)
    run = {
        "model": {
            "target_model_path": target,
            "aux_hidden_state_layer_ids": [0, 1, 2],
            "torch_dtype": "bfloat16",
            "draft_num_hidden_layers": 1,
        },
        "data": {
            "hidden_states_path": train,
            "eval_hidden_states_path": val,
            "max_length": int(max_len),
            "dataloader_num_workers": 0,
            "cache_dir": str(work_dir / "cache"),
        },
        "training": {
            "strategy": "eagle3",
            "fsdp_sharding": "NO_SHARD",
            "num_epochs": 1,
            "max_steps": STEPS,
            "batch_size": 1,
            "learning_rate": 1.0e-3,
            "attention_backend": "sdpa",
            "ttt_length": 7,
            "log_interval": 1,
            "eval_interval": EVAL_EVERY,
        },
        "output_dir": str(work_dir / "out"),
    }
    config = work_dir / "run.yaml"
    config.write_text(yaml.safe_dump(run))
    cfg = load_config(str(config))
    provider = builtin_algorithm_registry().resolve("eagle3").providers.model.draft_config
    draft = resolve_draft_config(cfg, provider=provider).to_dict()
    draft["draft_vocab_size"] = 512
    (work_dir / "draft-config.json").write_text(json.dumps(draft, indent=1, default=str))
    run["model"]["draft_model_config"] = str(work_dir / "draft-config.json")
    config.write_text(yaml.safe_dump(run))
    log = work_dir / "train.log"
    with open(log, "w") as fh:
        proc = subprocess.run(
            [sys.executable, str(HERE / "specforge_cpu.py"), "train", "--config", str(config)],
            stdout=fh,
            stderr=subprocess.STDOUT,
        )
    text = log.read_text()
    if proc.returncode:
        print(text[-3000:])
        raise SystemExit(f"specforge train failed (rc {proc.returncode}); log: {log}")
    print(text[-2000:])


if __name__ == "__main__":
    main(*sys.argv[1:6])
