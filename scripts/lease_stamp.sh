#!/usr/bin/env bash
# Before each GPU call: write .lease/source, the checkout's commit and whether its tracked files
# have uncommitted changes. The GPU machine gets a copy of the working tree without .git;
# scripts/gpu_check.sh reads this file there (carry .lease with the call), so env.json still
# says which code measured the rows.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .lease
sha=$(git rev-parse HEAD)
dirty=0
[[ -n $(git status --porcelain --untracked-files=no) ]] && dirty=1
printf 'sha=%s\ndirty=%s\nstamped_utc=%s\n' "$sha" "$dirty" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
    >.lease/source
echo "lease_stamp.sh: .lease/source: $sha$([[ $dirty == 1 ]] && echo ' (uncommitted changes)')"
