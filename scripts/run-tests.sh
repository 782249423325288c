#!/bin/bash
# Lint, type-check and run the whole test suite, on a sandbox cluster of its own that it takes down
# afterwards. pytest's exit code 5 (no tests collected) is a failure here: a suite that ran nothing
# proves nothing.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ -z "${SLURM_CHAOS_SANDBOX:-}" ]; then
  # "ci", unless another test run on this machine holds it (two runs sharing one sandbox see each
  # other's jobs and take it down under each other): then the first of ci2..ci9 that is free.
  SLURM_CHAOS_SANDBOX=$("$PY" -c '
from slurm_chaos.sandbox.layout import Layout
print(next((n for n in ["ci"] + [f"ci{i}" for i in range(2, 10)] if Layout.load(n) is None), "ci"))')
  [ "$SLURM_CHAOS_SANDBOX" = ci ] || echo "slurm-chaos: sandbox 'ci' is in use by another run: testing on '$SLURM_CHAOS_SANDBOX'" >&2
fi
export SLURM_CHAOS_SANDBOX
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
