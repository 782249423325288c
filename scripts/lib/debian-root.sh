# shellcheck shell=bash
# A clean Debian root built with debootstrap from the mirror apt already uses, with this machine's
# package sources, network set-up and certificate authorities, and a way to run a script inside it
# as / of namespaces of its own. Sourced by scripts/fresh-machine-check.sh and
# scripts/test-debian13.sh; it defines functions and the arrays below, and runs nothing itself.
#
# What the root gets from this machine, and nothing else:
#   - the kernel (same namespaces, cgroups and tc as the host), /dev, /sys (with its cgroup mounts),
#     a /proc of its own (a PID namespace of its own) and an empty /run and /tmp;
#   - the package sources: apt's mirror, and pip's configuration (files and PIP_* environment) and the
#     local package directories it names, if any (this machine's registries; read-only);
#   - /etc/hosts, /etc/resolv.conf and the certificate authorities, as a machine's network set-up would.
# It shares the host's network namespace (apt and pip need it).
#
# Usage: set debian_root (the root's directory) and call, in order,
#   debian_root_mirror; debian_root_bootstrap RELEASE LOG; debian_root_configure RELEASE;
#   debian_root_mount; debian_root_enter SCRIPT; and debian_root_unmount when done (an EXIT trap).

debian_root=${debian_root:-}
# Every mount made on the host for the root, in order (debian_root_unmount undoes them in reverse).
debian_root_mounts=()
# The machine's PIP_* and CA environment, one NAME=value a line, for the script run inside.
debian_root_env=()
# pip's configuration files, as the machine may have them.
debian_root_pip_confs=(/etc/pip.conf /etc/xdg/pip/pip.conf /etc/xdg/pip/constraints.txt
                       "$HOME/.config/pip/pip.conf" "$HOME/.pip/pip.conf")

debian_root_mirror() {  # print the mirror apt already uses (deb822 sources or a classic sources.list)
  local mirror
  mirror=$( { cat /etc/apt/sources.list.d/*.sources 2>/dev/null || true; } | awk '/^URIs:/ {print $2; exit}')
  [ -n "$mirror" ] || mirror=$(awk '/^deb / && $0 !~ /security/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null)
  [ -n "$mirror" ] || mirror=http://deb.debian.org/debian
  echo "$mirror"
}

debian_root_ensure_debootstrap() {
  command -v debootstrap >/dev/null || {
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
  }
}

debian_root_bootstrap() {  # RELEASE MIRROR LOG: Debian's minimal base with git, make, python3, certificates
  # A machine as a new user gets it: Debian's minimal base with the tools the README takes for granted
  # (git to clone, make, python3 of the release, certificates).
  debootstrap --variant=minbase --include=ca-certificates,git,make,python3 \
    "$1" "$debian_root" "$2" >"$3" 2>&1
}

debian_root_configure() {  # RELEASE: the machine's package sources, network set-up, CAs and pip set-up
  local release=$1 work=$debian_root f name dest line
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
  for f in "${debian_root_pip_confs[@]}"; do
    [ -f "$f" ] || continue
    dest="$work${f/#$HOME//root}"
    mkdir -p "$(dirname "$dest")" && cp "$f" "$dest"
  done
  debian_root_env=()
  while IFS= read -r line; do debian_root_env+=("$line"); done < <(env | grep -E '^(PIP_[A-Z_]+|SSL_CERT_(FILE|DIR)|REQUESTS_CA_BUNDLE|CURL_CA_BUNDLE)=' || true)
}

debian_root_bind_ro() {  # DIR: bind a host directory read-only at the same path inside the root
  mkdir -p "$debian_root$1"
  mount --bind "$1" "$debian_root$1" && debian_root_mounts+=("$debian_root$1")
  mount -o remount,bind,ro "$debian_root$1"
}

debian_root_bind_pip_dirs() {  # the local package directories that pip's configuration names
  local d
  # (find-links, file:// indexes)
  for d in $( { cat "${debian_root_pip_confs[@]}" 2>/dev/null || true; printf '%s\n' "${debian_root_env[@]}"; } \
      | grep -oE '(file://)?/[A-Za-z0-9_./-]+' | sed 's#^file://##; s#/simple/*$##' | sort -u); do
    [ -d "$d" ] && case "$d" in /opt/*|/srv/*|/var/cache/*) debian_root_bind_ro "$d" ;; esac
  done
}

debian_root_env_exports() {  # the machine's environment as export lines for a script run inside
  local e
  for e in "${debian_root_env[@]}"; do printf 'export %q\n' "$e"; done
}

debian_root_mount() {
  # The root is a mount point, as / is on a machine (`ip -n` remounts / as a slave); /dev and /sys as
  # the machine has them; /proc, /run and /tmp are the root's own (set up inside).
  local work=$debian_root d
  mount --rbind "$work" "$work" && debian_root_mounts+=("$work")
  for d in dev sys; do
    mount --rbind "/$d" "$work/$d" && debian_root_mounts+=("$work/$d")
    mount --make-rslave "$work/$d"
  done
}

debian_root_enter() {  # SCRIPT (a path inside the root): run it as / of namespaces of its own
  # Signals at their defaults, as in a login shell: a background job (a script started with '&')
  # inherits SIGINT and SIGQUIT ignored, and Ctrl-C tests would then test nothing.
  # The root becomes / of a mount namespace of its own by pivot_root, not chroot: a namespace entered
  # later from inside (nsenter -m into a sandbox node) takes its namespace's root, which must be it.
  env --default-signal unshare --pid --fork --mount --propagation private --uts --ipc \
    /bin/bash -c 'set -e; cd "$1"; mkdir -p .oldroot; pivot_root . .oldroot; cd /
                  mount -t proc proc /proc; umount -l /.oldroot; rmdir /.oldroot; umount /proc
                  exec "$2"' _ "$debian_root" "$1"
}

debian_root_unmount() {
  # Leave nothing mounted: the PID namespace took its processes with it; unmount in reverse.
  local i
  for ((i = ${#debian_root_mounts[@]} - 1; i >= 0; i--)); do
    umount -l "${debian_root_mounts[i]}" 2>/dev/null || true
  done
  debian_root_mounts=()
}

debian_root_inside_prelude() {  # the first lines of a script run inside: its mounts and environment
  cat <<EOF
mount -t proc proc /proc
mount -t tmpfs -o mode=755 tmpfs /run
mount -t tmpfs -o mode=1777 tmpfs /tmp
mkdir -p /run/lock
export HOME=/root LANG=C.UTF-8 PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
$(debian_root_env_exports)
EOF
}
