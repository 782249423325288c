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

command -v debootstrap >/dev/null || {
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
}
# The mirror apt already uses (deb822 sources or a classic sources.list).
mirror=$( { cat /etc/apt/sources.list.d/*.sources 2>/dev/null || true; } | awk '/^URIs:/ {print $2; exit}')
[ -n "$mirror" ] || mirror=$(awk '/^deb / && $0 !~ /security/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null)
[ -n "$mirror" ] || mirror=http://deb.debian.org/debian

mounted=()
cleanup() {
  # Leave nothing running or mounted: the PID namespace took its processes with it; unmount in reverse.
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[i]}" 2>/dev/null || true; done
  for name in chaos ci; do  # a sandbox whose teardown inside the root did not run
    ip link del "scb-$name" 2>/dev/null || true
  done
  if [ "$keep" -eq 0 ]; then rm -rf --one-file-system "$work"; fi
}
trap cleanup EXIT

t0=$(date +%s)
echo "fresh-machine-check: debootstrap $release from $mirror into $work"
# A machine as a new user gets it: Debian's minimal base with the tools the README takes for granted
# (git to clone, make, python3 of the release, certificates).
debootstrap --variant=minbase --include=ca-certificates,git,make,python3 \
  "$release" "$work" "$mirror" >"$logs/debootstrap.log" 2>&1 \
  || { echo "fresh-machine-check: debootstrap failed (see $logs/debootstrap.log)" >&2; exit 1; }
t_boot=$(($(date +%s) - t0))

# Package sources as apt on this machine has them; the release's own suites.
rm -f "$work/etc/apt/sources.list"
mkdir -p "$work/etc/apt/sources.list.d"
for f in /etc/apt/sources.list.d/*.sources /etc/apt/sources.list; do
  [ -f "$f" ] || continue
  name=$(basename "$f"); [ "$name" = sources.list ] && name=host.list
  sed "s/\bbookworm\b/$release/g" "$f" >"$work/etc/apt/sources.list.d/$name"
done
cp /etc/hosts /etc/resolv.conf "$work/etc/"
# The machine's certificate authorities (its network may intercept TLS with a CA of its own), kept
# where update-ca-certificates finds them again when a package in the root re-runs it.
if [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  mkdir -p "$work/usr/local/share/ca-certificates"
  cp /etc/ssl/certs/ca-certificates.crt "$work/usr/local/share/ca-certificates/machine.crt"
  cp /etc/ssl/certs/ca-certificates.crt "$work/etc/ssl/certs/ca-certificates.crt"
fi
# pip's configuration: its files and its PIP_* environment, as the machine has them.
pip_confs=(/etc/pip.conf /etc/xdg/pip/pip.conf /etc/xdg/pip/constraints.txt "$HOME/.config/pip/pip.conf"
           "$HOME/.pip/pip.conf")
for f in "${pip_confs[@]}"; do
  [ -f "$f" ] || continue
  dest="$work${f/#$HOME//root}"
  mkdir -p "$(dirname "$dest")" && cp "$f" "$dest"
done
machine_env=()
while IFS= read -r line; do machine_env+=("$line"); done < <(env | grep -E '^(PIP_[A-Z_]+|SSL_CERT_(FILE|DIR)|REQUESTS_CA_BUNDLE|CURL_CA_BUNDLE)=' || true)

bind_ro() {  # bind a host directory read-only at the same path inside the root
  mkdir -p "$work$1"
  mount --bind "$1" "$work$1" && mounted+=("$work$1")
  mount -o remount,bind,ro "$work$1"
}
# Local package directories that pip's configuration names (find-links, file:// indexes).
for d in $( { cat "${pip_confs[@]}" 2>/dev/null || true; printf '%s\n' "${machine_env[@]}"; } \
    | grep -oE '(file://)?/[A-Za-z0-9_./-]+' | sed 's#^file://##; s#/simple/*$##' | sort -u); do
  [ -d "$d" ] && case "$d" in /opt/*|/srv/*|/var/cache/*) bind_ro "$d" ;; esac
done

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
mount -t proc proc /proc
mount -t tmpfs -o mode=755 tmpfs /run
mount -t tmpfs -o mode=1777 tmpfs /tmp
mkdir -p /run/lock
export HOME=/root LANG=C.UTF-8 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
$(for e in "${machine_env[@]}"; do printf 'export %q\n' "$e"; done)
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

# The root is a mount point, as / is on a machine (`ip -n` remounts / as a slave); /dev and /sys as
# the machine has them; /proc, /run and /tmp are the root's own (set up inside).
mount --rbind "$work" "$work" && mounted+=("$work")
for d in dev sys; do
  mount --rbind "/$d" "$work/$d" && mounted+=("$work/$d")
  mount --make-rslave "$work/$d"
done

echo "fresh-machine-check: running '$commands' in the fresh root (logs: $logs)"
set +e
# Signals at their defaults, as in a login shell: a background job (this script started with '&')
# inherits SIGINT and SIGQUIT ignored, and Ctrl-C tests would then test nothing.
# The root becomes / of a mount namespace of its own by pivot_root, not chroot: a namespace entered
# later from inside (nsenter -m into a sandbox node) takes its namespace's root, which must be it.
env --default-signal unshare --pid --fork --mount --propagation private --uts --ipc \
  /bin/bash -c 'set -e; cd "$1"; mkdir -p .oldroot; pivot_root . .oldroot; cd /
                mount -t proc proc /proc; umount -l /.oldroot; rmdir /.oldroot; umount /proc
                exec /root/fresh-run.sh' _ "$work"
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
