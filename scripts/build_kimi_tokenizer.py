"""Build the small Kimi-K2.5-style tokenizer in ``src/eagle3_datagen/assets/kimi-k2.5-mini``.

Why: tests and the demo need a tokenizer that behaves like Kimi-K2.5's (same special tokens, same
chat-template shape, generation prompt ending in ``<think>``) without downloading a 1T model.
The files are committed; rerun this script only to change them:

    uv run python scripts/build_kimi_tokenizer.py

Special tokens keep Kimi's *relative* layout (``[BOS]`` first, ``<think>``/``</think>`` 22 and
23 places later) but start right after the small BPE vocabulary, so their ids differ from the
real model's. The pipeline resolves every special token by its string, never by id.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

OUT_DIR = (
    Path(__file__).resolve().parents[1] / "src" / "eagle3_datagen" / "assets" / "kimi-k2.5-mini"
)
VOCAB_SIZE = 2048  # BPE ranks, before the special tokens

# Kimi-K2's special-token block, in id order from 163584 ("reserved" fills the gaps).
SPECIAL_TOKENS = [
    "[BOS]",
    "[EOS]",
    "<|im_end|>",
    "<|im_user|>",
    "<|im_assistant|>",
    "<|reserved_token_0|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|reserved_token_1|>",
    "[EOT]",
    "<|im_system|>",
    "<|tool_calls_section_begin|>",
    "<|tool_calls_section_end|>",
    "<|tool_call_begin|>",
    "<|tool_call_argument_begin|>",
    "<|tool_call_end|>",
    "<|reserved_token_2|>",
    "<|im_middle|>",
    "<|media_begin|>",
    "<|media_content|>",
    "<|media_end|>",
    "<|media_pad|>",
    "<think>",
    "</think>",
    "[UNK]",
    "[PAD]",
]

# Kimi-K2.5's chat template, structure for structure (its tokenizer_config.json / chat_template.jinja):
# - tool declarations first: ``tools_ts_str`` when the tokenizer supplies one (the real remote-code
#   tokenizer computes a TypeScript-style declaration), else ``tools`` as compact JSON;
# - the default system prompt when the conversation does not start with a system message;
# - the role name is the message's ``name`` or its role; tool results are system-side turns;
# - history split at the last assistant message without tool calls: up to it, assistant turns
#   render ``<think></think>`` (reasoning dropped); after it (the current tool loop), they keep
#   ``<think>{reasoning_content}</think>``;
# - tool calls after the content, each ``<|tool_call_begin|>{id}<|tool_call_argument_begin|>``
#   with the call's own ``id`` and its arguments printed as given (a string) or ``tojson`` (an
#   object); tool results are addressed by their ``tool_call_id`` (``## Return of {id}``);
# - the generation prompt ends in ``<think>`` (``<think></think>`` with ``thinking=False``).
CHAT_TEMPLATE = (
    "{%- macro render_content(msg) -%}"
    "{%- set c = msg.get('content') -%}"
    "{%- if c is string -%}{{ c }}"
    "{%- elif c is not none -%}{%- for content in c -%}"
    "{%- if content['type'] == 'image' or content['type'] == 'image_url' -%}"
    "<|media_begin|>image<|media_content|><|media_pad|><|media_end|>"
    "{%- else -%}{{ content['text'] }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
    "{%- macro set_roles(message) -%}"
    "{%- set role_name = message.get('name') or message['role'] -%}"
    "{%- if message['role'] == 'user' -%}<|im_user|>{{ role_name }}<|im_middle|>"
    "{%- elif message['role'] == 'assistant' -%}<|im_assistant|>{{ role_name }}<|im_middle|>"
    "{%- else -%}<|im_system|>{{ role_name }}<|im_middle|>{%- endif -%}"
    "{%- endmacro -%}"
    "{%- macro render_toolcalls(message) -%}"
    "<|tool_calls_section_begin|>"
    "{%- for tool_call in message['tool_calls'] -%}"
    "{%- set formatted_id = tool_call['id'] -%}"
    "<|tool_call_begin|>{{ formatted_id }}<|tool_call_argument_begin|>"
    "{%- if tool_call['function']['arguments'] is string -%}"
    "{{ tool_call['function']['arguments'] }}"
    "{%- else -%}{{ tool_call['function']['arguments'] | tojson }}{%- endif -%}"
    "<|tool_call_end|>"
    "{%- endfor -%}"
    "<|tool_calls_section_end|>"
    "{%- endmacro -%}"
    "{%- set ns = namespace(last_non_tool_call_assistant_msg=-1) -%}"
    "{%- for idx in range(messages|length-1, -1, -1) -%}"
    "{%- if messages[idx]['role'] == 'assistant' and not messages[idx].get('tool_calls') -%}"
    "{%- set ns.last_non_tool_call_assistant_msg = idx -%}{%- break -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- set hist_msgs = messages[:ns.last_non_tool_call_assistant_msg+1] -%}"
    "{%- set suffix_msgs = messages[ns.last_non_tool_call_assistant_msg+1:] -%}"
    "{%- if tools -%}"
    "{%- if tools_ts_str -%}<|im_system|>tool_declare<|im_middle|>{{ tools_ts_str }}<|im_end|>"
    "{%- else -%}<|im_system|>tool_declare<|im_middle|>{{ tools | tojson(separators=(',', ':')) }}"
    "<|im_end|>{%- endif -%}"
    "{%- endif -%}"
    "{%- if messages|length == 0 or messages[0]['role'] != 'system' -%}"
    "<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI."
    "<|im_end|>"
    "{%- endif -%}"
    "{%- for message in hist_msgs -%}"
    "{{ set_roles(message) }}"
    "{%- if message['role'] == 'assistant' -%}"
    "<think></think>{{ render_content(message) }}"
    "{%- if message.get('tool_calls') -%}{{ render_toolcalls(message) }}{%- endif -%}"
    "{%- elif message['role'] == 'tool' -%}"
    "{%- set tool_call_id = message.tool_call_id -%}"
    "## Return of {{ tool_call_id }}\n{{ render_content(message) }}"
    "{%- elif message['content'] is not none -%}{{ render_content(message) }}"
    "{%- endif -%}"
    "<|im_end|>"
    "{%- endfor -%}"
    "{%- for message in suffix_msgs -%}"
    "{{ set_roles(message) }}"
    "{%- if message['role'] == 'assistant' -%}"
    "{%- if thinking is defined and thinking is false -%}"
    "<think></think>{{ render_content(message) }}"
    "{%- else -%}"
    "{%- set rc = message.get('reasoning_content', '') -%}"
    "<think>{{ rc }}</think>{{ render_content(message) }}"
    "{%- endif -%}"
    "{%- if message.get('tool_calls') -%}{{ render_toolcalls(message) }}{%- endif -%}"
    "{%- elif message['role'] == 'tool' -%}"
    "{%- set tool_call_id = message.tool_call_id -%}"
    "## Return of {{ tool_call_id }}\n{{ render_content(message) }}"
    "{%- elif message['content'] is not none -%}{{ render_content(message) }}"
    "{%- endif -%}"
    "<|im_end|>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>"
    "{%- if thinking is defined and thinking is false -%}<think></think>"
    "{%- else -%}<think>{%- endif -%}"
    "{%- endif -%}"
)

CORPUS = """
The quick brown fox jumps over the lazy dog. What is 1+1? The answer is 2.
Let me think about this step by step. First, I need to understand the question.
You are a helpful assistant. Please write a Python function that returns the sum of a list.
def add(a, b):\n    return a + b\n\nclass Solver:\n    def solve(self, x: int) -> int:\n        return x * 2
{"name": "get_weather", "description": "Get the current weather", "parameters": {"type": "object",
"properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}}}}
The weather in Paris is sunny and 21 degrees. Tokyo, London, Berlin, New York, Beijing.
Speculative decoding uses a small draft model to propose tokens that the target model verifies.
Training data for the draft model must hold exactly the tokens that the target model produces.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 3.14159 2.71828 42. Punctuation: , . ; : ! ? ( ) [ ] { }
Mathematics: let x = 3, then x^2 = 9 and sqrt(16) = 4. Therefore the result follows.
Hmm, wait. Actually, let me reconsider. So the final answer is: yes. I think that is correct.
"""


# The image processor's settings (docs/images.md), small enough for the stand-in's context.
PROCESSOR_CONFIG = {
    "_comment": "Kimi-K2.5's image processor settings, shrunk for the stand-in (the real "
    "model's media_proc_cfg has larger limits); SGLang reads patch_size, merge_kernel_size, "
    "in_patch_limit, patch_limit_on_one_side, fixed_output_tokens. See docs/images.md.",
    "media_proc_cfg": {
        "patch_size": 14,
        "merge_kernel_size": 2,
        "in_patch_limit": 256,
        "patch_limit_on_one_side": 24,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
    },
}


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


def added_tokens_decoder(specials: dict[int, str]) -> dict[str, dict[str, Any]]:
    """``tokenizer_config.json``'s entry for each special token, as Kimi-K2.5's lists them."""
    return {
        str(i): {
            "content": t,
            "special": True,
            "normalized": False,
            "lstrip": False,
            "rstrip": False,
            "single_word": False,
        }
        for i, t in specials.items()
    }


def write_model_files(out_dir: Path, ids: dict[str, int], vocab_size: int, comment: str) -> None:
    """The model directory's other files, shared by both stand-ins: ``config.json`` (the ids
    SGLang and the client read from it), the image processor's settings and the stop ids."""
    model_config = {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "bos_token_id": ids["[BOS]"],
        "eos_token_id": ids["[EOS]"],
        "pad_token_id": ids["[PAD]"],
        "media_placeholder_token_id": ids["<|media_pad|>"],
        "vocab_size": vocab_size,
        "max_position_embeddings": 262144,
        "_comment": comment,
    }
    write_json(out_dir / "config.json", model_config)
    write_json(out_dir / "preprocessor_config.json", PROCESSOR_CONFIG)
    write_json(
        out_dir / "generation_config.json", {"eos_token_id": [ids["<|im_end|>"], ids["[EOS]"]]}
    )


def build() -> None:
    tokenizer = Tokenizer(models.BPE(unk_token=None, byte_fallback=False))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=1,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tokenizer.train_from_iterator([CORPUS] * 4, trainer=trainer)
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS]
    )

    OUT_DIR.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(OUT_DIR / "tokenizer.json"))
    ids = {t: tokenizer.token_to_id(t) for t in SPECIAL_TOKENS}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "[BOS]",
        "eos_token": "[EOS]",
        "unk_token": "[UNK]",
        "pad_token": "[PAD]",
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 262144,
        "added_tokens_decoder": added_tokens_decoder({i: t for t, i in ids.items()}),
        "chat_template": CHAT_TEMPLATE,
    }
    write_json(OUT_DIR / "tokenizer_config.json", config)
    comment = (
        "Tiny stand-in for Kimi-K2.5's tokenizer; no weights. See scripts/build_kimi_tokenizer.py."
    )
    write_model_files(OUT_DIR, ids, tokenizer.get_vocab_size(), comment)
    print(f"wrote {OUT_DIR} (vocab {tokenizer.get_vocab_size()}, <think>={ids['<think>']})")


if __name__ == "__main__":
    build()
