"""`attnbench race` from a checkout: triton_flash against SDPA's backends and xFormers at fixed
tokens and hidden size (the race preset). See README.md or --help."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from attnbench.cli import main  # noqa: E402

if __name__ == "__main__":  # worker processes import this file too
    sys.exit(main(["race", *sys.argv[1:]]))
