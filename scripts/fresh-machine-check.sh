#!/bin/bash
# Run the README's two set-up commands, exactly as written, on a fresh Debian root.
#
#   scripts/fresh-machine-check.sh [--release bookworm|trixie] [--keep] [--commands "make demo;make test"]
#
# Builds a clean Debian root with debootstrap from the mirror that apt already uses, clones this
# repository's committed HEAD into it (and ../shared beside it, as CI has it), and runs
# `make demo` and then `make test` inside it, as root, as a new user on a new machine would. It is how
# a missing install step or an unstable test is caught before a user finds it: run it twice in a row.
#
# What the root gets from this machine, and nothing else:
#   - the kernel (same namespaces, cgroups and tc as the host), /dev, /sys (with its cgroup mounts),
#     a /proc of its own (a PID namespace of its own) and an empty /run and /tmp;
#   - the package sources: apt's mirror, and pip's configuration (files and PIP_* environment) and the
#     local package directories it names, if any (this machine's registries; read-only);
#   - /etc/hosts, /etc/resolv.conf and the certificate authorities, as a machine's network set-up would.
# It shares the host's network namespace (apt and pip need it), so its sandboxes' bridges are
# visible on the host: it refuses to start while a sandbox of the same name (chaos, ci) is up here.
#
# Exit status: 0 when `make test` passed and `make demo` wrote its report (the campaign's own verdicts
# are findings about the sandbox, printed, not a failure of the set-up); 1 otherwise.
# Output: a summary on stdout; full logs under $FRESH_LOG_DIR (default /var/tmp/slurm-chaos-fresh/<time>).
set -euo pipefail

release=bookworm
keep=0
commands="make demo;make test"
while [ $# -gt 0 ]; do
  case "$1" in
    --release) release=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    --commands) commands=$2; shift 2 ;;
    -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "fresh-machine-check: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" -eq 0 ] || { echo "fresh-machine-check: needs root (debootstrap, chroot, mounts)" >&2; exit 2; }
repo=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=lib/debian-root.sh
. "$repo/scripts/lib/debian-root.sh"
shared=$(cd "$repo/.." && pwd)/shared
stamp=$(date +%Y%m%d-%H%M%S)
logs=${FRESH_LOG_DIR:-/var/tmp/slurm-chaos-fresh/$stamp}
work=${FRESH_ROOT_DIR:-/var/tmp/slurm-chaos-fresh/root-$stamp}
mkdir -p "$logs"

for name in chaos ci; do
  if ip link show "scb-$name" >/dev/null 2>&1; then
    echo "fresh-machine-check: a sandbox '$name' is up on this machine (bridge scb-$name);" \
      "take it down first (slurm-chaos sandbox down --name $name)" >&2
    exit 2
  fi
done

debian_root_ensure_debootstrap
# The mirror apt already uses (deb822 sources or a classic sources.list).
mirror=$(debian_root_mirror)
debian_root=$work

cleanup() {
  # Leave nothing running or mounted: the PID namespace took its processes with it; unmount in reverse.
  debian_root_unmount
  for name in chaos ci; do  # a sandbox whose teardown inside the root did not run
    ip link del "scb-$name" 2>/dev/null || true
  done
  if [ "$keep" -eq 0 ]; then rm -rf --one-file-system "$work"; fi
}
trap cleanup EXIT

t0=$(date +%s)
echo "fresh-machine-check: debootstrap $release from $mirror into $work"
debian_root_bootstrap "$release" "$mirror" "$logs/debootstrap.log" \
  || { echo "fresh-machine-check: debootstrap failed (see $logs/debootstrap.log)" >&2; exit 1; }
t_boot=$(($(date +%s) - t0))

# Package sources, network set-up, certificate authorities and pip's configuration as this machine
# has them (scripts/lib/debian-root.sh), and the local package directories pip names, read-only.
debian_root_configure "$release"
debian_root_bind_pip_dirs

# The clone a new user makes, and shared/ beside it as CI lays it.
git clone -q "$repo" "$work/root/slurm-chaos"
if [ -d "$shared" ]; then cp -r "$shared" "$work/root/shared"; fi

summary() {  # pytest's closing line of a log, if any
  grep -E '^=+ .*[0-9]+ (passed|failed).* in [0-9.]+s' "$1" | tail -n 1 | tr -d '='
}

cat >"$work/root/fresh-run.sh" <<EOF
#!/bin/bash
# Inside the fresh root (its /): the machine's mounts, then the README's commands one by one.
set -u
$(debian_root_inside_prelude)
cd /root/slurm-chaos
commands=$(printf '%q' "$commands")
IFS=';' read -ra cmds <<<"\$commands"
for c in "\${cmds[@]}"; do
  log=/root/log-\$(echo "\$c" | tr -c 'a-z0-9\n' '-').txt
  start=\$(date +%s)
  echo "== \$c" >&2
  bash -c "\$c" >"\$log" 2>&1 </dev/null
  rc=\$?
  echo "\$c|\$rc|\$((\$(date +%s) - start))" >>/root/results.txt
done
EOF
chmod +x "$work/root/fresh-run.sh"

debian_root_mount

echo "fresh-machine-check: running '$commands' in the fresh root (logs: $logs)"
set +e
debian_root_enter /root/fresh-run.sh
set -e
cp "$work"/root/log-*.txt "$logs/" 2>/dev/null || true
cp -r "$work"/root/slurm-chaos/runs "$logs/" 2>/dev/null || true

status=0
echo
echo "fresh-machine-check: Debian $release root in ${t_boot} s"
while IFS='|' read -r c rc secs; do
  log="$logs/log-$(echo "$c" | tr -c 'a-z0-9\n' '-').txt"
  printf '  %-10s exit %s in %dm%02ds: %s\n' "$c" "$rc" $((secs / 60)) $((secs % 60)) "$(summary "$log")"
  case "$c" in
    "make demo")
      # The campaign's verdicts are its findings (exit 1 from the campaign, 'Error 1' from make);
      # the set-up worked when it wrote its report.
      report=$(ls "$logs"/runs/maintenance-*/report.json 2>/dev/null | grep -v -- '-aa/' | head -n 1)
      if [ -z "$report" ]; then
        echo "    no campaign report: the set-up failed (see $log)"; status=1
      else
        python3 -c 'import json, sys
for e in json.load(open(sys.argv[1]))["experiments"]:
    print("    %-24s %s" % (e["name"], e["verdict"]))' "$report"
      fi ;;
    *) [ "$rc" -eq 0 ] || status=1 ;;
  esac
done <"$work/root/results.txt"
# A command that never ended (the root killed, the machine out of memory) left no line: that is a failure.
IFS=';' read -ra wanted <<<"$commands"
ran=$(wc -l <"$work/root/results.txt" 2>/dev/null || echo 0)
if [ "$ran" -lt "${#wanted[@]}" ]; then
  echo "  only $ran of ${#wanted[@]} commands ended (see $logs)"; status=1
fi
echo "fresh-machine-check: $([ $status -eq 0 ] && echo PASSED || echo FAILED) in $(($(date +%s) - t0)) s; logs in $logs"
exit $status
