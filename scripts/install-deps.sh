#!/bin/bash
# Install what slurm-chaos needs on a Debian 12/13 machine (as root): Debian packages for the sandbox
# cluster, build tools for the SPANK plugin, Chromium for the report's browser test, and the Python
# package with its probe and development extras.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive

pkgs=(slurm-wlm slurm-client slurmdbd munge libslurm-dev slurm-wlm-basic-plugins-dev openmpi-bin libopenmpi-dev
      mariadb-server iproute2 util-linux procps gcc make clang libc6-dev stress-ng numactl fiu-utils libfiu-dev
      prometheus prometheus-alertmanager prometheus-node-exporter chromium fuse3 squashfuse squashfs-tools)
PY=${PYTHON:-python3}
# Debian's own python3 is externally managed (PEP 668): the package then goes into a virtual
# environment beside the checkout (.venv), which needs python3-venv.
externally_managed() {
  "$PY" -c 'import os, sys, sysconfig
sys.exit(0 if sys.prefix == sys.base_prefix and
         os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")) else 1)'
}
if externally_managed; then pkgs+=(python3-venv python3-dev); fi

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
missing=()
for p in "${pkgs[@]}"; do installed "$p" || missing+=("$p"); done
# A fresh machine's package lists may be missing or older than its sources: refresh them before
# resolving the names below.
if [ ${#missing[@]} -gt 0 ] || [ -z "$(ls /var/lib/apt/lists/ 2>/dev/null | grep -v -e lock -e partial -e auxfiles)" ]; then
  apt-get update -qq
fi
# Debian 13 renamed or split some packages: take whichever name this release has. clang without its
# recommends lacks the compiler-rt runtimes (libFuzzer, ASan) that the fuzz harnesses link: take the
# ones of the clang this release has (Debian 12: 14, Debian 13: 19).
clang_rt="libclang-rt-dev"  # llvm-defaults: the runtimes of the release's default clang
# lua5.1: the interpreter of the Lua that Slurm's job_submit/lua links, to test job_submit.lua with.
for alt in "libpmix2t64 libpmix2" "hwloc-nox hwloc" "slurm-wlm-mysql-plugin" "$clang_rt" "lua5.1"; do
  for p in $alt; do
    if apt-cache show "$p" >/dev/null 2>&1; then installed "$p" || missing+=("$p"); break; fi
  done
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "slurm-chaos: installing Debian packages: ${missing[*]}"
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if externally_managed; then
  [ -x .venv/bin/python ] || "$PY" -m venv .venv
  PY=$PWD/.venv/bin/python
fi
# torch pinned: the probe's tests are recorded against it. PyPI serves its CUDA build (large, and it
# runs on CPUs too); a machine whose pip sources carry the +cpu build gets that one.
"$PY" -c 'import torch' 2>/dev/null || "$PY" -m pip install -q "torch==2.13.0"
# The gpu extra (nvidia-ml-py) is pure Python: the GPU paths degrade with a message where no GPU is.
"$PY" -m pip install -q -e '.[probe,gpu,dev]'
if [ "$PY" = "$PWD/.venv/bin/python" ]; then
  # The Makefile puts .venv/bin first on PATH; an administrator's shell finds the commands here.
  ln -sf "$PWD/.venv/bin/slurm-chaos" "$PWD/.venv/bin/slurm-chaos-healthcheck" /usr/local/bin/
fi
make -s -C spank_plugin
make -s -C preload
echo "slurm-chaos: dependencies installed"
