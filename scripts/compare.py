"""Compare two runs, with an optional regression gate: see docs/reports.md or --help."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from attnbench.report_cli import compare_main  # noqa: E402

sys.exit(compare_main())
