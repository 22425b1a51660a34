#!/usr/bin/env bash
# The installed package is the product: build the wheel, install it into a fresh venv, and from
# outside the checkout list the impls and run a smoke sweep with the built-ins. The working
# folder holds an impls/ folder of another project: it is imported only with --plugin.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m build -q --wheel --outdir "$work/dist" "$root" >/dev/null
python3 -m venv --system-site-packages "$work/venv"  # torch from this machine, not a download
"$work/venv/bin/python" -m pip install -q --no-deps "$work"/dist/attnbench-*.whl
cd "$work"
"$work/venv/bin/python" -c "import attnbench, sys; f = attnbench.__file__; \
assert f.startswith('$work/venv'), f'imported {f}, not the installed wheel'"
mkdir "$work/impls"
cat >"$work/impls/theirs.py" <<PY
open("$work/imported", "w").write("imported")
from attnbench import register
register("theirs")(lambda q, k, v, *, causal, scale: q)
PY
"$work/venv/bin/attnbench" --version | grep -q "^attnbench [0-9]" || { echo "wheel: no --version"; exit 1; }
listing=$("$work/venv/bin/attnbench" list)
[ ! -e "$work/imported" ] || { echo "wheel: imported ./impls without being asked"; exit 1; }
"$work/venv/bin/attnbench" list --plugin impls | grep -q "^theirs .*--plugin$" \
    || { echo "wheel: --plugin impls did not load the folder"; exit 1; }
echo "$listing"
for impl in naive sdpa sdpa_flash sdpa_math tiled flex xformers triton_flash; do
    grep -q "^ *$impl " <<<"$listing" || { echo "wheel: impl $impl missing from attnbench list"; exit 1; }
done
"$work/venv/bin/attnbench" sweep --preset smoke --impls naive,sdpa,tiled --seq-len 32 \
    --no-progress --run-id wheel-smoke >/dev/null
python3 - "$work/results/wheel-smoke/results.csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert len(rows) == 12 and all(r["status"] == "ok" and r["agrees"] == "True" for r in rows), rows
print(f"wheel: {len(rows)} ok rows from an installed attnbench outside the checkout")
PY
# the report is the installed package's too (its step folders are in the wheel); installed, it
# has no git history to measure its staleness against, and says so
report="$work/reports/wheel-smoke/report.md"
grep -q "^Measured by attnbench " "$report" && grep -q "^## Plots" "$report" \
    || { echo "wheel: the smoke sweep wrote no whole report ($report)"; exit 1; }
echo "wheel: report.md and $(ls "$work"/reports/wheel-smoke/*.png | wc -l) figures written"
python3 - "$work/results/wheel-smoke/env.json" <<'PY'
import json, sys
env = json.load(open(sys.argv[1]))
assert env["git_sha"] is None and env["checkout"] is False and env["attnbench"], env
print(f"wheel: env.json says attnbench {env['attnbench']}, installed, no git commit")
PY
