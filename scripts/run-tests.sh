#!/bin/bash
# Lint, type-check and run the whole test suite, on a sandbox cluster of its own that it takes down
# afterwards. pytest's exit code 5 (no tests collected) is a failure here: a suite that ran nothing
# proves nothing.
set -uo pipefail
cd "$(dirname "$0")/.."
export SLURM_CHAOS_SANDBOX=${SLURM_CHAOS_SANDBOX:-ci}
PY=${PYTHON:-python3}
status=0
trap '"$PY" -m slurm_chaos sandbox down --name "$SLURM_CHAOS_SANDBOX" >/dev/null 2>&1' EXIT

echo "== ruff"; ruff check slurm_chaos tests bench || status=1
echo "== mypy"; mypy || status=1
echo "== pytest"
"$PY" -m pytest -ra --durations=25 -p no:cacheprovider "$@"
rc=$?
if [ $rc -eq 5 ]; then
  echo "slurm-chaos: pytest collected no tests" >&2
  rc=1
fi
[ $rc -ne 0 ] && status=$rc
exit $status
