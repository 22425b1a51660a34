"""``python -m attnbench COMMAND ...``, the same as the ``attnbench`` command."""

import sys

from attnbench.cli import main

if __name__ == "__main__":
    sys.exit(main())
