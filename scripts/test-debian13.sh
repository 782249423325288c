#!/bin/bash
# Run the sandbox integration tests on Debian 13 (trixie, Slurm 24.11) in a Debian root on this machine.
#
#   scripts/test-debian13.sh [--root DIR] [--keep] [--sandbox NAME] [--python auto|system|bind]
#                            [--pytest "ARGS" | --command "CMD" | --no-tests] [--log-dir DIR]
#
# Builds a trixie root with debootstrap from the mirror apt already uses (scripts/lib/debian-root.sh:
# the machine's kernel, so namespaces, cgroups and tc work as on the host; its package sources, pip
# configuration and certificate authorities), clones this repository's committed HEAD into it, and
# inside it, as root:
#   1. installs the project's dependencies with scripts/install-deps.sh (Debian 13's Slurm 24.11,
#      MariaDB, OpenMPI, ...), the Python package and its extras, and builds the SPANK plugin and the
#      preload shim against the root's Slurm headers;
#   2. brings up a sandbox cluster of its own (`slurm-chaos sandbox up --name NAME`, default d13);
#   3. runs `pytest -m sandbox tests/integration` (or --pytest ARGS) on it, and takes it down.
# Then it prints what passed, failed and was skipped in each test file, with durations.
#
# Python: Debian 13's is 3.13. With --python system the package goes into a venv of python3.13, and
# torch comes from pip's configured index; --python bind binds this machine's Python 3.11 (read-only,
# at the same path) into the root and makes the venv from it, with the torch wheel pip's configuration
# offers for 3.11. auto (the default) takes system when the configured index has a CPU build of the
# pinned torch for 3.13, bind otherwise (PyPI's 3.13 wheels are CUDA builds of several GB).
#
#   --root DIR   use (and keep) the root in DIR, building it first if DIR has none; a second run
#                reuses its packages and venv (the repository is cloned again)
#   --keep       keep a root this run built (default: removed afterwards)
#   --no-tests   install, build and bring the sandbox up and down, but run no pytest
#   --command CMD  run CMD (bash, in the clone, .venv/bin first on PATH, SLURM_CONF set) on the
#                sandbox instead of pytest: a look at Slurm 24.11 by hand
#
# It shares the host's network namespace (apt and pip need it): its sandbox's bridge (scb-NAME) is
# visible on the host, so it refuses to start while a sandbox of that name is up here.
# Exit status: 0 when every step passed (pytest: no failure, no error); 1 otherwise; 2 for misuse.
# pytest is stopped after $D13_PYTEST_TIMEOUT seconds (default 5400).
# Logs: $D13_LOG_DIR or --log-dir (default /var/tmp/slurm-chaos-debian13/<time>): one per step,
# pytest's junit XML, and the sandbox's daemon logs.
set -euo pipefail

release=trixie
root_dir=
keep=0
sandbox=d13
python_mode=auto
pytest_args="-m sandbox tests/integration"
run_tests=1
command=
pytest_timeout=${D13_PYTEST_TIMEOUT:-5400}  # seconds
stamp=$(date +%Y%m%d-%H%M%S)
logs=${D13_LOG_DIR:-/var/tmp/slurm-chaos-debian13/$stamp}
while [ $# -gt 0 ]; do
  case "$1" in
    --root) root_dir=$2; keep=1; shift 2 ;;
    --keep) keep=1; shift ;;
    --sandbox) sandbox=$2; shift 2 ;;
    --python) python_mode=$2; shift 2 ;;
    --pytest) pytest_args=$2; shift 2 ;;
    --no-tests) run_tests=0; shift ;;
    --command) command=$2; shift 2 ;;
    --log-dir) logs=$2; shift 2 ;;
    -h|--help) sed -n '2,36p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "test-debian13: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$python_mode" in auto|system|bind) ;; *) echo "test-debian13: --python auto|system|bind" >&2; exit 2 ;; esac
[[ "$sandbox" =~ ^[a-z][a-z0-9-]{0,7}$ ]] || { echo "test-debian13: bad sandbox name $sandbox" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "test-debian13: needs root (debootstrap, chroot, mounts)" >&2; exit 2; }
repo=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=lib/debian-root.sh
. "$repo/scripts/lib/debian-root.sh"
shared=$(cd "$repo/.." && pwd)/shared
work=${root_dir:-${D13_ROOT_DIR:-/var/tmp/slurm-chaos-debian13/root-$stamp}}
mkdir -p "$logs"
logs=$(cd "$logs" && pwd)

if ip link show "scb-$sandbox" >/dev/null 2>&1; then
  echo "test-debian13: a sandbox '$sandbox' is up on this machine (bridge scb-$sandbox); take it down" \
    "first, or pick another name with --sandbox" >&2
  exit 2
fi

debian_root_ensure_debootstrap
mirror=$(debian_root_mirror)
debian_root=$work
built=0
cleanup() {
  debian_root_unmount
  ip link del "scb-$sandbox" 2>/dev/null || true  # a sandbox whose teardown inside did not run
  if [ "$keep" -eq 0 ] && [ "$built" -eq 1 ]; then rm -rf --one-file-system "$work"; fi
}
trap cleanup EXIT

t0=$(date +%s)
if [ -x "$work/usr/bin/apt-get" ] && [ -f "$work/etc/debian_version" ]; then
  echo "test-debian13: reusing the Debian root in $work ($(cat "$work/etc/debian_version"))"
else
  echo "test-debian13: debootstrap $release from $mirror into $work"
  built=1
  debian_root_bootstrap "$release" "$mirror" "$logs/debootstrap.log" \
    || { echo "test-debian13: debootstrap failed (see $logs/debootstrap.log)" >&2; exit 1; }
fi
t_boot=$(($(date +%s) - t0))
debian_root_configure "$release"
debian_root_bind_pip_dirs

# Python for the package: 3.13 of the root, or this machine's 3.11 bound in (see the header).
torch_pin=$(grep -oE 'torch==[0-9][0-9.]*' "$repo/scripts/install-deps.sh" | head -n 1)
host_py=$(command -v python3.11 || true)
if [ "$python_mode" = auto ]; then
  python_mode=bind
  # What pip's configured index would install for 3.13, resolved without downloading the wheel.
  if python3 -m pip install -q --dry-run --ignore-installed --no-deps --only-binary=:all: \
       --python-version 3.13 --target "$logs/.pip-target" --report "$logs/torch-cp313.json" \
       "$torch_pin" >"$logs/torch-cp313.log" 2>&1 \
     && grep -q '+cpu' "$logs/torch-cp313.json"; then
    python_mode=system
  fi
  rm -rf "$logs/.pip-target"
  echo "test-debian13: --python auto: $python_mode ($( [ "$python_mode" = system ] \
    && echo "pip's index has a CPU $torch_pin for 3.13" \
    || echo "no CPU $torch_pin for 3.13 in pip's index; binding this machine's Python 3.11"))"
fi
venv_python=
if [ "$python_mode" = bind ]; then
  [ -n "$host_py" ] || { echo "test-debian13: --python bind needs python3.11 on this machine" >&2; exit 1; }
  py_prefix=$("$host_py" -c 'import sys; print(sys.base_prefix)')
  case "$py_prefix" in
    /usr) echo "test-debian13: this machine's python3.11 lives in /usr, which the root has of its own;" \
            "use --python system" >&2; exit 1 ;;
  esac
  debian_root_bind_ro "$py_prefix"
  venv_python="$py_prefix/bin/$(basename "$(readlink -f "$host_py")")"
fi

# The clone (committed HEAD, as fresh-machine-check makes it) and shared/ beside it; a reused root
# keeps its .venv and the plugin's build outputs are made again.
if [ -d "$work/root/slurm-chaos/.git" ]; then
  git -C "$work/root/slurm-chaos" fetch -q "$repo" HEAD
  git -C "$work/root/slurm-chaos" reset -q --hard FETCH_HEAD
  git -C "$work/root/slurm-chaos" clean -q -fdx -e .venv
else
  git clone -q "$repo" "$work/root/slurm-chaos"
fi
rm -rf "$work/root/shared"
if [ -d "$shared" ]; then cp -r "$shared" "$work/root/shared"; fi
rm -rf "$work/root/d13-logs"; mkdir -p "$work/root/d13-logs"

cat >"$work/root/d13-run.sh" <<EOF
#!/bin/bash
# Inside the Debian 13 root (its /): the machine's mounts, then the steps one by one.
set -u
$(debian_root_inside_prelude)
cd /root/slurm-chaos
L=/root/d13-logs
: >\$L/results.txt
export SLURM_CHAOS_SANDBOX=$sandbox
venv_python=$(printf '%q' "$venv_python")
pytest_args=$(printf '%q' "$pytest_args")
command=$(printf '%q' "$command")
step() {  # NAME COMMAND...: run one step, its output in \$L/NAME.log, and record how it ended
  local name=\$1 start rc; shift
  start=\$(date +%s)
  echo "== \$name" >&2
  "\$@" >"\$L/\$name.log" 2>&1 </dev/null
  rc=\$?
  echo "\$name|\$rc|\$((\$(date +%s) - start))" >>\$L/results.txt
  return \$rc
}
do_install() {
  if [ -n "\$venv_python" ]; then
    # A venv of the bound Python 3.11 where install-deps would make its own (.venv in the clone).
    [ -x .venv/bin/python ] || "\$venv_python" -m venv .venv || return 1
    PYTHON=\$PWD/.venv/bin/python bash scripts/install-deps.sh
  else
    bash scripts/install-deps.sh
  fi
}
do_versions() {
  export PATH=\$PWD/.venv/bin:\$PATH
  cat /etc/debian_version; slurmctld -V; python --version
  python -c 'import torch; print("torch", torch.__version__)'
  local v; v=\$(awk '/define SLURM_VERSION_NUMBER/ {print \$3}' /usr/include/slurm/slurm_version.h)
  echo "slurm headers (/usr/include/slurm): \$((v >> 16)).\$(((v >> 8) & 255)).\$((v & 255))"
  # The SPANK plugin and the preload shim, built by install-deps against the headers above.
  ls -l spank_plugin/build/slurm_chaos.so preload/build/*.so
}
do_up() { PATH=\$PWD/.venv/bin:\$PATH slurm-chaos sandbox up --name "\$SLURM_CHAOS_SANDBOX"; }
do_tests() {
  # Bounded, for a nightly job: a test that hangs ends the run instead of holding the machine.
  PATH=\$PWD/.venv/bin:\$PATH timeout -k 30 $pytest_timeout python -m pytest -v -ra --durations=0 \
    -p no:cacheprovider -o junit_family=xunit1 --junitxml=\$L/junit.xml \$pytest_args
}
do_command() {
  PATH=\$PWD/.venv/bin:\$PATH SLURM_CONF=/var/lib/slurm-chaos/sandboxes/\$SLURM_CHAOS_SANDBOX/etc/slurm.conf \
    bash -c "\$command"
}
do_down() { PATH=\$PWD/.venv/bin:\$PATH slurm-chaos sandbox down --name "\$SLURM_CHAOS_SANDBOX"; }
if step install do_install && step versions do_versions && step sandbox-up do_up; then
  $( if [ -n "$command" ]; then echo 'step command do_command'
     elif [ "$run_tests" -eq 1 ]; then echo 'step pytest do_tests'; else echo ':'; fi )
fi
step sandbox-down do_down
cp -r /var/lib/slurm-chaos/sandboxes/\$SLURM_CHAOS_SANDBOX/log \$L/sandbox-log 2>/dev/null || true
EOF
chmod +x "$work/root/d13-run.sh"

debian_root_mount
echo "test-debian13: running the steps in the Debian 13 root (logs: $logs)"
set +e
debian_root_enter /root/d13-run.sh
set -e
cp -r "$work/root/d13-logs/." "$logs/" 2>/dev/null || true

status=0
echo
echo "test-debian13: Debian $release root in ${t_boot} s; python: $python_mode"
[ -f "$logs/versions.log" ] && sed 's/^/    /' "$logs/versions.log"
while IFS='|' read -r name rc secs; do
  printf '  %-12s exit %s in %dm%02ds\n' "$name" "$rc" $((secs / 60)) $((secs % 60))
  [ "$rc" -eq 0 ] || status=1
done <"$logs/results.txt"
if [ -n "$command" ]; then run_tests=0; fi
for want in install versions sandbox-up $([ "$run_tests" -eq 1 ] && echo pytest) \
    $([ -n "$command" ] && echo command) sandbox-down; do
  grep -q "^$want|" "$logs/results.txt" || { echo "  $want: did not run or never ended"; status=1; }
done
if [ -f "$logs/junit.xml" ] || [ -f "$logs/pytest.log" ]; then
  # Per test file: passed, failed (errors too), skipped, and the time its tests took; from pytest's
  # junit XML, or (a run killed before pytest wrote it) from its -v lines, without times.
  python3 - "$logs/junit.xml" "$logs/pytest.log" <<'PY' | tee "$logs/summary.txt"
import collections, os, re, sys, xml.etree.ElementTree as ET
files = collections.defaultdict(lambda: collections.Counter())
secs = collections.Counter()
if not os.path.exists(sys.argv[1]):
    print("  (no junit XML: pytest did not finish; counts from its -v lines)")
    seen = {}
    for line in open(sys.argv[2], errors="replace"):
        m = re.match(r"^(tests/\S+?\.py)::(\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)", line)
        if m:
            kind = {"PASSED": "passed", "XPASS": "passed", "SKIPPED": "skipped", "XFAIL": "skipped"}
            seen[(m[1], m[2], m[3] == "ERROR")] = kind.get(m[3], "failed")
    for (f, _, _), kind in seen.items():
        files[f][kind] += 1
cases = ET.parse(sys.argv[1]).getroot().iter("testcase") if os.path.exists(sys.argv[1]) else []
for case in cases:
    parts = case.get("classname", "").split(".")
    mod = next((i for i, p in enumerate(parts) if p.startswith("test_")), len(parts) - 1)
    f = case.get("file") or "/".join(parts[: mod + 1]) + ".py"
    kinds = {child.tag for child in case}
    kind = "failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"
    files[f][kind] += 1
    secs[f] += float(case.get("time") or 0)
total = collections.Counter()
print("  %-48s %6s %6s %7s %8s" % ("test file", "passed", "failed", "skipped", "seconds"))
for f in sorted(files):
    c = files[f]
    total.update(c)
    print("  %-48s %6d %6d %7d %8.1f" % (f, c["passed"], c["failed"], c["skipped"], secs[f]))
print("  %-48s %6d %6d %7d %8.1f" % ("all", total["passed"], total["failed"], total["skipped"],
                                     sum(secs.values())))
PY
  grep -E '^(FAILED|ERROR) ' "$logs/pytest.log" 2>/dev/null | sed 's/^/  /' || true
  tail -n 1 "$logs/pytest.log" 2>/dev/null | sed 's/^/  /'
fi
echo "test-debian13: $([ $status -eq 0 ] && echo PASSED || echo FAILED) in $(($(date +%s) - t0)) s; logs in $logs"
exit $status
