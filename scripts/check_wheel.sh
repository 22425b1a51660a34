#!/usr/bin/env bash
# The installed package is the product: build the wheel, install it into a fresh venv, and from
# outside the checkout list the impls and run a smoke sweep with the built-ins.
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
listing=$("$work/venv/bin/attnbench" list)
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
