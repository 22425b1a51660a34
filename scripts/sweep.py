"""`attnbench sweep` from a checkout: see README.md or --help."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from attnbench.cli import main  # noqa: E402

if __name__ == "__main__":  # worker processes import this file too
    sys.exit(main(["sweep", *sys.argv[1:]]))
