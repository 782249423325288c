#!/bin/bash
# Install what slurm-chaos needs on a Debian 12/13 machine (as root): Debian packages for the sandbox
# cluster, build tools for the SPANK plugin, Chromium for the report's browser test, and the Python
# package with its probe and development extras.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive

pkgs=(slurm-wlm slurm-client slurmdbd munge libslurm-dev slurm-wlm-basic-plugins-dev openmpi-bin libopenmpi-dev
      mariadb-server iproute2 util-linux procps gcc make clang libc6-dev stress-ng numactl fiu-utils libfiu-dev
      prometheus prometheus-alertmanager chromium)
# Debian 13 renamed or split some packages: take whichever name this release has.
for alt in "libpmix2t64 libpmix2" "hwloc-nox hwloc" "slurm-wlm-mysql-plugin"; do
  for p in $alt; do
    if apt-cache show "$p" >/dev/null 2>&1; then pkgs+=("$p"); break; fi
  done
done
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "slurm-chaos: installing Debian packages: ${missing[*]}"
  apt-get update -qq
  # re-resolve alternatives now that the package lists are fresh
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# clang without its recommends lacks the compiler-rt runtimes (libFuzzer, ASan) that the plugin's
# fuzz harness links: install the ones of the clang this release has (Debian 12: 14, Debian 13: 19).
clang_major=$(clang -dumpversion | cut -d. -f1)
rt="libclang-rt-${clang_major}-dev"
if ! dpkg-query -W -f='${Status}' "$rt" 2>/dev/null | grep -q "install ok installed"; then
  echo "slurm-chaos: installing Debian packages: $rt"
  apt-cache show "$rt" >/dev/null 2>&1 || apt-get update -qq
  apt-get install -y -qq --no-install-recommends "$rt" >/dev/null
fi

PY=${PYTHON:-python3}
# The CPU build of torch: a plain 'torch' requirement would pull a multi-GB CUDA build.
"$PY" -c 'import torch' 2>/dev/null || "$PY" -m pip install -q "torch==2.13.0"
# The gpu extra (nvidia-ml-py) is pure Python: the GPU paths degrade with a message where no GPU is.
"$PY" -m pip install -q -e '.[probe,gpu,dev]'
make -s -C spank_plugin
make -s -C preload
echo "slurm-chaos: dependencies installed"
