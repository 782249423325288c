#!/bin/sh
# Fail unless the plugin exports exactly the symbols Slurm needs (version script at work).
set -eu
so=${1:?usage: check_exports.sh PLUGIN.so}
bad=$(nm -D --defined-only "$so" | awk '{print $3}' | grep -v -E '^(slurm_spank_[a-z_]+|plugin_name|plugin_type|plugin_version|spank_plugin_version)$' || true)
if [ -n "$bad" ]; then
  echo "check_exports: unexpected exported symbols in $so:" >&2
  echo "$bad" >&2
  exit 1
fi
for sym in slurm_spank_init plugin_name plugin_type plugin_version; do
  nm -D --defined-only "$so" | awk '{print $3}' | grep -qx "$sym" || { echo "check_exports: $sym missing" >&2; exit 1; }
done
echo "check_exports: $(nm -D --defined-only "$so" | wc -l) exported symbols, all expected"
