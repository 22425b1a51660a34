"""Regenerate a run's report: see docs/reports.md or --help."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from attnbench.report_cli import report_main  # noqa: E402

sys.exit(report_main())
