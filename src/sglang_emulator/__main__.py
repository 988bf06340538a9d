"""``python -m sglang_emulator``."""

import sys

from sglang_emulator.run import main

if __name__ == "__main__":
    sys.exit(main())
