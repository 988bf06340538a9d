"""``python -m eagle3_datagen.emulator``."""

import sys

from eagle3_datagen.emulator.run import main

if __name__ == "__main__":
    sys.exit(main())
