#!/bin/sh
# Runs each scenario of test_io twice, one process each: the plain program under LD_PRELOAD of the
# hardened shim, and test_io_san (the shim linked in, ASan+UBSan); then a Python program under the shim.
set -eu
B=${1:-build}
LIB=$(cd "$B" && pwd)/libslurm_chaos_io.so
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
# The shim exports exactly the functions it wraps; its helpers stay hidden.
want=$(sed -n -e 's/^SC_EXPORT .*__asm__("\([a-z_0-9]*\)").*/\1/p' -e t \
	-e 's/^SC_EXPORT [^(]*[ *]\([a-z_0-9]*\)(.*/\1/p' "$(dirname "$0")/slurm_chaos_io.c" | sort)
got=$(nm -D --defined-only "$LIB" | awk '$2 == "T" {print $3}' | sort)
if [ "$want" != "$got" ]; then
	echo "exports differ from the SC_EXPORT functions:"; echo "$want" > "$T/want"; echo "$got" | diff "$T/want" -
	exit 1
fi
echo "exports: $(echo "$got" | wc -l) wrapped functions, nothing else"
export ASAN_OPTIONS=abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
fresh() {
	rm -rf "$T/ckpt" "$T/other"; mkdir -p "$T/ckpt" "$T/other"
	echo data > "$T/ckpt/a.pt"
}
run() {
	scenario=$1; shift
	fresh
	env "$@" SLURM_CHAOS_CKPT_DIR="$T/ckpt" LD_PRELOAD="$LIB" timeout 30 "$B/test_io" "$scenario" "$T/ckpt" "$T/other"
	fresh
	env "$@" SLURM_CHAOS_CKPT_DIR="$T/ckpt" timeout 30 "$B/test_io_san" "$scenario" "$T/ckpt" "$T/other"
}
run enospc SLURM_CHAOS_IO_FAULT=enospc SLURM_CHAOS_IO_AFTER_BYTES=1000
run eio SLURM_CHAOS_IO_FAULT=eio SLURM_CHAOS_IO_AFTER_BYTES=0
run hang SLURM_CHAOS_IO_FAULT=hang SLURM_CHAOS_IO_AFTER_BYTES=100 SLURM_CHAOS_IO_HOLD_S=1
run stdio SLURM_CHAOS_IO_FAULT=enospc SLURM_CHAOS_IO_AFTER_BYTES=100
run stdio_fileno SLURM_CHAOS_IO_FAULT=enospc SLURM_CHAOS_IO_AFTER_BYTES=100
run after SLURM_CHAOS_IO_FAULT=enospc SLURM_CHAOS_IO_AFTER_S=1
run passive SLURM_CHAOS_IO_AFTER_BYTES=0
run socket_dirfd SLURM_CHAOS_IO_FAULT=eio SLURM_CHAOS_IO_AFTER_BYTES=0
run fd_reuse SLURM_CHAOS_IO_FAULT=enospc SLURM_CHAOS_IO_AFTER_BYTES=10
run dup_fds SLURM_CHAOS_IO_FAULT=enospc SLURM_CHAOS_IO_AFTER_BYTES=10
run tmpfile SLURM_CHAOS_IO_FAULT=enospc SLURM_CHAOS_IO_AFTER_BYTES=100
run write_calls SLURM_CHAOS_IO_FAULT=enospc SLURM_CHAOS_IO_AFTER_BYTES=100
run read_calls SLURM_CHAOS_IO_FAULT=eio SLURM_CHAOS_IO_AFTER_BYTES=10
run errno_kept SLURM_CHAOS_IO_FAULT=enospc SLURM_CHAOS_IO_AFTER_BYTES=1000000
run errno_hang SLURM_CHAOS_IO_FAULT=hang SLURM_CHAOS_IO_AFTER_BYTES=10 SLURM_CHAOS_IO_HOLD_S=1
run threads SLURM_CHAOS_IO_FAULT=enospc SLURM_CHAOS_IO_AFTER_BYTES=1000
run preinit SLURM_CHAOS_IO_FAULT=enospc SLURM_CHAOS_IO_AFTER_BYTES=1000
# Re-entry while the shim initialises: a deadlock would hang, hence the short timeout.
fresh
env SLURM_CHAOS_IO_FAULT=enospc SLURM_CHAOS_IO_AFTER_BYTES=1000 SLURM_CHAOS_CKPT_DIR="$T/ckpt" \
	LD_PRELOAD="$(cd "$B" && pwd)/reenter.so $LIB" timeout 10 "$B/test_io" reenter "$T/ckpt" "$T/other"
fresh
env SLURM_CHAOS_IO_FAULT=enospc SLURM_CHAOS_IO_AFTER_BYTES=1000 SLURM_CHAOS_CKPT_DIR="$T/ckpt" \
	timeout 10 "$B/test_io_reenter_san" reenter "$T/ckpt" "$T/other"
run high_fds SLURM_CHAOS_IO_FAULT=enospc SLURM_CHAOS_IO_AFTER_BYTES=10
# A symlinked checkpoint path is recognised by where it leads.
for bin in "env LD_PRELOAD=$LIB $B/test_io" "$B/test_io_san"; do
	rm -rf "$T/ckpt" "$T/other" "$T/real"; mkdir -p "$T/real" "$T/other"; ln -s "$T/real" "$T/ckpt"
	env SLURM_CHAOS_IO_FAULT=eio SLURM_CHAOS_IO_PATH="$T/real" $bin eio "$T/ckpt" "$T/other"
done
if command -v "${PYTHON:-python3}" >/dev/null 2>&1; then
	rm -rf "$T/ckpt" "$T/other"; mkdir -p "$T/ckpt" "$T/other"
	env SLURM_CHAOS_IO_FAULT=enospc SLURM_CHAOS_IO_AFTER_BYTES=4096 SLURM_CHAOS_CKPT_DIR="$T/ckpt" LD_PRELOAD="$LIB" \
		"${PYTHON:-python3}" - "$T/ckpt" "$T/other" <<'PY'
import errno, os, sys
ckpt, other = sys.argv[1:]
with open(os.path.join(other, "probe.h5"), "wb") as f:
    f.write(b"x" * 100000)
try:
    with open(os.path.join(ckpt, "ckpt.pt"), "wb", buffering=0) as f:
        f.write(b"x" * 4096)
        f.write(b"x")
    sys.exit("python: no ENOSPC")
except OSError as e:
    assert e.errno == errno.ENOSPC, e
assert os.path.getsize(os.path.join(ckpt, "ckpt.pt")) == 4096
assert os.path.getsize(os.path.join(other, "probe.h5")) == 100000
print("python: ok")
PY
fi
# std::ofstream writes through fileno() of an fopen()ed stream (torch.save to a path does this).
if command -v "${CXX:-c++}" >/dev/null 2>&1; then
	cat > "$T/ofstream.cc" <<'CXX'
#include <cerrno>
#include <cstdio>
#include <fstream>
#include <string>
int main(int argc, char **argv)
{
	std::ofstream f(argv[1], std::ios::binary | std::ios::trunc);
	f << std::string(4096, 'x') << std::flush;
	if (!f.good())
		return std::puts("c++ ofstream: FAILED before the threshold"), 1;
	f << std::string(10, 'x') << std::flush;
	if (f.good() || errno != ENOSPC)
		return std::puts("c++ ofstream: FAILED, no ENOSPC"), 1;
	std::puts("c++ ofstream: ok");
}
CXX
	"${CXX:-c++}" -O1 -o "$T/ofstream" "$T/ofstream.cc"
	fresh
	env SLURM_CHAOS_IO_FAULT=enospc SLURM_CHAOS_IO_AFTER_BYTES=4096 SLURM_CHAOS_CKPT_DIR="$T/ckpt" LD_PRELOAD="$LIB" \
		"$T/ofstream" "$T/ckpt/model.pt"
	test "$(stat -c %s "$T/ckpt/model.pt")" = 4096
fi
echo "preload: all scenarios ok"
