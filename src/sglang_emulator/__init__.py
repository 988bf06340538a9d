"""SGLang emulator: a real HTTP server speaking SGLang 0.5.23's native API with a fake model.

Run it as ``python -m sglang_emulator --model-path DIR --port N [--emu-* ...]``.
"""

from sglang_emulator.run import main

__all__ = ["main"]
