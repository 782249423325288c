/*
 * libslurm_chaos_io.so: checkpoint storage faults for any program, through LD_PRELOAD.
 *
 * Only I/O on paths under the checkpoint directory is touched; everything else (the probe's HDF5
 * output, Python's imports) goes straight to libc. Configuration, read once from the environment:
 *
 *   SLURM_CHAOS_IO_PATH or SLURM_CHAOS_CKPT_DIR   the checkpoint directory (the first one set wins)
 *   SLURM_CHAOS_IO_FAULT        enospc | eio | hang (anything else: the shim stays passive)
 *   SLURM_CHAOS_IO_AFTER_BYTES  the fault starts once this process wrote this many bytes there
 *   SLURM_CHAOS_IO_AFTER_S      ... and once this many seconds passed since the process started
 *   SLURM_CHAOS_IO_HOLD_S       hang: how long each call blocks, then proceeds (0: until killed)
 *
 * Once active, these fail with ENOSPC (enospc) or EIO (eio; reads and read-only opens too), or
 * block (hang; reads too), on a file in the directory:
 *   opening for writing (creat, O_CREAT/O_TRUNC/O_APPEND/O_WRONLY/O_RDWR, O_TMPFILE there);
 *   write, pwrite, writev, pwritev, pwritev2, copy_file_range and sendfile into it (each write
 *   is counted; the one that crosses the byte threshold is cut short, as on a volume that fills
 *   up); fsync, fdatasync, ftruncate, truncate, fallocate, posix_fallocate (returns the error);
 *   mmap PROT_WRITE with MAP_SHARED (refused; stores through a mapping made before the fault
 *   starts are neither counted nor stopped);
 *   rename, renameat, renameat2, link and linkat with either end in the directory, and mkdir;
 *   eio and hang: read, pread, readv, preadv, preadv2, mmap to read, and copies out of it.
 * fopen()ed streams are covered through fopencookie(), since glibc's stdio does not call the
 * public write(). Opening the directory itself (O_DIRECTORY, to list it or as an openat base)
 * is left alone. A call the shim lets through keeps errno as it was.
 *
 * A file counts as in the directory by its path (lexically, then by real path: a symlinked
 * parent, and a final symlink where the call follows it); an open fd by a mark taken at open,
 * carried by dup, dup2, dup3 and fcntl(F_DUPFD*), dropped by close, close_range and closefrom,
 * and trusted only while fstat shows the same file (st_dev, st_ino). Not covered: I/O through
 * io_uring or raw syscall(), fds inherited across exec, splice and vmsplice, stdio streams from
 * fdopen() or freopen(), and _FORTIFY_SOURCE's __read_chk/__pread_chk (fixed-size read buffers).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "sc_fdmark.h"
#include "sc_path.h"

/* glibc < 2.34 declares neither; a program built there cannot call them, the shim still builds. */
int close_range(unsigned int first, unsigned int last, int flags);
void closefrom(int lowfd);
#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

/* test_io_san links the shim in with -DSC_EXPORT= (hidden): its own calls take the wrappers, the
 * sanitizer runtime's go straight to libc. */
#ifndef SC_EXPORT
#define SC_EXPORT __attribute__((visibility("default")))
#endif

enum sc_fault { SC_NONE, SC_ENOSPC, SC_EIO, SC_HANG };

struct sc_config {
	enum sc_fault fault;
	char dir[PATH_MAX];
	size_t dir_len;
	char real_dir[PATH_MAX];
	size_t real_len;
	unsigned long long after_bytes;
	double after_s;
	double hold_s;
	struct timespec t0;
};

/* All zero (SC_NONE: every call passes through) until the initialisation publishes it whole. */
static struct sc_config cfg;
static _Atomic unsigned long long bytes_written;
static atomic_int announced;

/*
 * The next definition of each function we wrap (libc's), found with dlsym(RTLD_NEXT). Until then,
 * and wherever dlsym finds none (close_range before glibc 2.34), each pointer holds a stand-in
 * that makes the system call itself: a call that re-enters the shim while it initialises (from
 * dlsym, a preloaded allocator or getenv) or comes before libc is set up still works.
 */
_Static_assert(sizeof(long) == 8 && sizeof(off_t) == 8, "64-bit Linux: an offset is one syscall argument");
#define REAL(name) real_##name
#define DEFINE_REAL(ret, name, params, ...)                                                  \
	static ret sys_##name params                                                         \
	{                                                                                    \
		return (ret)syscall(__VA_ARGS__);                                            \
	}                                                                                    \
	static __typeof__(sys_##name) *real_##name = sys_##name

#define OPEN_MODE(flags, mode)                                                               \
	do {                                                                                 \
		va_list ap;                                                                  \
		va_start(ap, flags);                                                         \
		mode = (flags) & (O_CREAT | O_TMPFILE) ? (mode_t)va_arg(ap, int) : 0;        \
		va_end(ap);                                                                  \
	} while (0)

static int sys_open(const char *path, int flags, ...)
{
	mode_t mode;
	OPEN_MODE(flags, mode);
	return (int)syscall(SYS_openat, AT_FDCWD, path, flags, mode);
}

static int sys_openat(int dirfd, const char *path, int flags, ...)
{
	mode_t mode;
	OPEN_MODE(flags, mode);
	return (int)syscall(SYS_openat, dirfd, path, flags, mode);
}

static int sys_fcntl(int fd, int cmd, ...)
{
	va_list ap;
	va_start(ap, cmd);
	void *arg = va_arg(ap, void *);
	va_end(ap);
	return (int)syscall(SYS_fcntl, fd, cmd, arg);
}

static int (*real_open)(const char *, int, ...) = sys_open;
static int (*real_open64)(const char *, int, ...) = sys_open;
static int (*real_openat)(int, const char *, int, ...) = sys_openat;
static int (*real_openat64)(int, const char *, int, ...) = sys_openat;
static int (*real_fcntl)(int, int, ...) = sys_fcntl;
static int (*real_fcntl64)(int, int, ...) = sys_fcntl;
DEFINE_REAL(ssize_t, write, (int fd, const void *b, size_t n), SYS_write, fd, b, n);
DEFINE_REAL(ssize_t, pwrite, (int fd, const void *b, size_t n, off_t o), SYS_pwrite64, fd, b, n, o);
DEFINE_REAL(ssize_t, pwrite64, (int fd, const void *b, size_t n, off64_t o), SYS_pwrite64, fd, b, n, o);
DEFINE_REAL(ssize_t, writev, (int fd, const struct iovec *v, int c), SYS_writev, fd, v, c);
/* pwritev/preadv take the offset as low and high words; the high one is ignored on 64-bit. */
DEFINE_REAL(ssize_t, pwritev, (int fd, const struct iovec *v, int c, off_t o), SYS_pwritev, fd, v, c, o, 0);
DEFINE_REAL(ssize_t, pwritev64, (int fd, const struct iovec *v, int c, off64_t o), SYS_pwritev, fd, v, c, o, 0);
DEFINE_REAL(ssize_t, pwritev2, (int fd, const struct iovec *v, int c, off_t o, int f), SYS_pwritev2, fd, v, c, o, 0,
	    f);
DEFINE_REAL(ssize_t, pwritev64v2, (int fd, const struct iovec *v, int c, off64_t o, int f), SYS_pwritev2, fd, v, c,
	    o, 0, f);
DEFINE_REAL(ssize_t, copy_file_range, (int in, off64_t *io, int out, off64_t *oo, size_t n, unsigned int f),
	    SYS_copy_file_range, in, io, out, oo, n, f);
DEFINE_REAL(ssize_t, sendfile, (int out, int in, off_t *o, size_t n), SYS_sendfile, out, in, o, n);
DEFINE_REAL(ssize_t, sendfile64, (int out, int in, off64_t *o, size_t n), SYS_sendfile, out, in, o, n);
DEFINE_REAL(int, ftruncate, (int fd, off_t n), SYS_ftruncate, fd, n);
DEFINE_REAL(int, ftruncate64, (int fd, off64_t n), SYS_ftruncate, fd, n);
DEFINE_REAL(int, truncate, (const char *p, off_t n), SYS_truncate, p, n);
DEFINE_REAL(int, truncate64, (const char *p, off64_t n), SYS_truncate, p, n);
DEFINE_REAL(int, fallocate, (int fd, int m, off_t o, off_t n), SYS_fallocate, fd, m, o, n);
DEFINE_REAL(int, fallocate64, (int fd, int m, off64_t o, off64_t n), SYS_fallocate, fd, m, o, n);
DEFINE_REAL(void *, mmap, (void *a, size_t n, int p, int f, int fd, off_t o), SYS_mmap, a, n, p, f, fd, o);
DEFINE_REAL(void *, mmap64, (void *a, size_t n, int p, int f, int fd, off64_t o), SYS_mmap, a, n, p, f, fd, o);
DEFINE_REAL(ssize_t, read, (int fd, void *b, size_t n), SYS_read, fd, b, n);
DEFINE_REAL(ssize_t, pread, (int fd, void *b, size_t n, off_t o), SYS_pread64, fd, b, n, o);
DEFINE_REAL(ssize_t, pread64, (int fd, void *b, size_t n, off64_t o), SYS_pread64, fd, b, n, o);
DEFINE_REAL(ssize_t, readv, (int fd, const struct iovec *v, int c), SYS_readv, fd, v, c);
DEFINE_REAL(ssize_t, preadv, (int fd, const struct iovec *v, int c, off_t o), SYS_preadv, fd, v, c, o, 0);
DEFINE_REAL(ssize_t, preadv64, (int fd, const struct iovec *v, int c, off64_t o), SYS_preadv, fd, v, c, o, 0);
DEFINE_REAL(ssize_t, preadv2, (int fd, const struct iovec *v, int c, off_t o, int f), SYS_preadv2, fd, v, c, o, 0, f);
DEFINE_REAL(ssize_t, preadv64v2, (int fd, const struct iovec *v, int c, off64_t o, int f), SYS_preadv2, fd, v, c, o,
	    0, f);
DEFINE_REAL(int, fsync, (int fd), SYS_fsync, fd);
DEFINE_REAL(int, fdatasync, (int fd), SYS_fdatasync, fd);
DEFINE_REAL(int, close, (int fd), SYS_close, fd);
DEFINE_REAL(int, dup, (int fd), SYS_dup, fd);
DEFINE_REAL(int, dup3, (int fd, int nfd, int f), SYS_dup3, fd, nfd, f);
DEFINE_REAL(int, renameat2, (int od, const char *o, int nd, const char *n, unsigned int f), SYS_renameat2, od, o,
	    nd, n, f);
DEFINE_REAL(int, rename, (const char *o, const char *n), SYS_renameat2, AT_FDCWD, o, AT_FDCWD, n, 0);
DEFINE_REAL(int, renameat, (int od, const char *o, int nd, const char *n), SYS_renameat2, od, o, nd, n, 0);
DEFINE_REAL(int, linkat, (int od, const char *o, int nd, const char *n, int f), SYS_linkat, od, o, nd, n, f);
DEFINE_REAL(int, link, (const char *o, const char *n), SYS_linkat, AT_FDCWD, o, AT_FDCWD, n, 0);
DEFINE_REAL(int, mkdirat, (int d, const char *p, mode_t m), SYS_mkdirat, d, p, m);
DEFINE_REAL(int, mkdir, (const char *p, mode_t m), SYS_mkdirat, AT_FDCWD, p, m);
DEFINE_REAL(off64_t, lseek64, (int fd, off64_t o, int w), SYS_lseek, fd, o, w);
#ifdef SYS_close_range
DEFINE_REAL(int, close_range, (unsigned int lo, unsigned int hi, int f), SYS_close_range, lo, hi, f);
#else
DEFINE_REAL(int, close_range, (unsigned int lo, unsigned int hi, int f), -1L, lo, hi, f); /* ENOSYS */
#endif

static int sys_dup2(int fd, int nfd)
{
	if (fd == nfd) /* dup3 refuses this one; dup2 checks fd and returns it */
		return sys_fcntl(fd, F_GETFD) < 0 ? -1 : fd;
	return (int)syscall(SYS_dup3, fd, nfd, 0);
}

static void sys_closefrom(int lowfd)
{
	(void)real_close_range((unsigned int)lowfd, ~0U, 0);
}

/* posix_fallocate returns the error; errno stays as it was. */
static int sys_posix_fallocate(int fd, off_t off, off_t len)
{
	int saved = errno;
	int e = syscall(SYS_fallocate, fd, 0, off, len) ? errno : 0;
	errno = saved;
	return e;
}

static int mode_flags(const char *mode);

static FILE *sys_fopen(const char *path, const char *mode)
{
	int flags = mode_flags(mode);
	int fd = flags < 0 ? -1 : sys_open(path, flags, 0666);
	FILE *f = fd < 0 ? NULL : fdopen(fd, mode);
	if (!f && fd >= 0)
		syscall(SYS_close, fd);
	return f;
}

static int (*real_dup2)(int, int) = sys_dup2;
static void (*real_closefrom)(int) = sys_closefrom;
static int (*real_posix_fallocate)(int, off_t, off_t) = sys_posix_fallocate;
static int (*real_posix_fallocate64)(int, off64_t, off64_t) = sys_posix_fallocate;
static FILE *(*real_fopen)(const char *, const char *) = sys_fopen;
static FILE *(*real_fopen64)(const char *, const char *) = sys_fopen;

/* Keeps the stand-in where dlsym finds nothing. */
#define RESOLVE(name)                                                                        \
	do {                                                                                 \
		void *p = dlsym(RTLD_NEXT, #name);                                           \
		if (p)                                                                       \
			real_##name = (__typeof__(real_##name))p;                            \
	} while (0)

static void resolve_all(void)
{
	RESOLVE(open); RESOLVE(open64); RESOLVE(openat); RESOLVE(openat64);
	RESOLVE(write); RESOLVE(pwrite); RESOLVE(pwrite64); RESOLVE(writev); RESOLVE(pwritev);
	RESOLVE(pwritev64); RESOLVE(pwritev2); RESOLVE(pwritev64v2); RESOLVE(copy_file_range);
	RESOLVE(sendfile); RESOLVE(sendfile64); RESOLVE(ftruncate); RESOLVE(ftruncate64); RESOLVE(truncate);
	RESOLVE(truncate64); RESOLVE(fallocate); RESOLVE(fallocate64); RESOLVE(posix_fallocate);
	RESOLVE(posix_fallocate64); RESOLVE(mmap); RESOLVE(mmap64);
	RESOLVE(read); RESOLVE(pread); RESOLVE(pread64); RESOLVE(readv);
	RESOLVE(preadv); RESOLVE(preadv64); RESOLVE(preadv2); RESOLVE(preadv64v2);
	RESOLVE(fsync); RESOLVE(fdatasync); RESOLVE(close); RESOLVE(dup); RESOLVE(dup2); RESOLVE(dup3);
	RESOLVE(fcntl); RESOLVE(fcntl64); RESOLVE(close_range); RESOLVE(closefrom);
	RESOLVE(rename); RESOLVE(renameat); RESOLVE(renameat2); RESOLVE(link); RESOLVE(linkat);
	RESOLVE(mkdir); RESOLVE(mkdirat); RESOLVE(fopen); RESOLVE(fopen64); RESOLVE(lseek64);
}

/* The configuration from the environment; c->fault stays SC_NONE when it is absent or unusable. */
static void read_config(struct sc_config *c)
{
	clock_gettime(CLOCK_MONOTONIC, &c->t0);
	const char *fault = getenv("SLURM_CHAOS_IO_FAULT");
	const char *dir = getenv("SLURM_CHAOS_IO_PATH");
	if (!dir || !*dir)
		dir = getenv("SLURM_CHAOS_CKPT_DIR");
	if (!fault || !dir || !*dir)
		return;
	enum sc_fault f = !strcmp(fault, "enospc") ? SC_ENOSPC
			  : !strcmp(fault, "eio")  ? SC_EIO
			  : !strcmp(fault, "hang") ? SC_HANG
						   : SC_NONE;
	char cwd[PATH_MAX];
	if (f == SC_NONE || (dir[0] != '/' && !getcwd(cwd, sizeof(cwd))))
		return;
	long len = sc_path_resolve(cwd, dir, c->dir, sizeof(c->dir));
	if (len < 0)
		return; /* no real directory has such a path */
	c->dir_len = (size_t)len;
	char real[PATH_MAX];
	if (realpath(c->dir, real) && strcmp(real, c->dir)) {
		snprintf(c->real_dir, sizeof(c->real_dir), "%s", real);
		c->real_len = strlen(c->real_dir);
	}
	const char *v;
	if ((v = getenv("SLURM_CHAOS_IO_AFTER_BYTES")))
		c->after_bytes = strtoull(v, NULL, 10);
	if ((v = getenv("SLURM_CHAOS_IO_AFTER_S")))
		c->after_s = strtod(v, NULL);
	if ((v = getenv("SLURM_CHAOS_IO_HOLD_S")))
		c->hold_s = strtod(v, NULL);
	c->fault = f;
}

enum { INIT_NONE, INIT_DONE };
static atomic_int init_state;
static atomic_long init_owner; /* the thread inside the initialisation, 0 if none */
static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_int libc_ready;

/* Our constructor runs after libc's (a dependency), so from here on an empty environ is real. */
__attribute__((constructor)) static void sc_loaded(void)
{
	atomic_store(&libc_ready, 1);
}

/*
 * Reads the configuration once, at the first wrapped call that can, and publishes it whole.
 * Other threads wait for it on the lock. A call that re-enters from inside it (this thread already
 * holds the lock) passes through: the configuration is not published yet, so every check says
 * "not ours", and the real functions are the syscall stand-ins until resolve_all. So does a call
 * made before libc set up environ (a preinit function), which leaves the reading for later.
 */
static void ensure_init(void)
{
	if (atomic_load_explicit(&init_state, memory_order_acquire) == INIT_DONE)
		return;
	int saved = errno; /* getcwd(), realpath() and dlsym() set it on their way */
	long self = syscall(SYS_gettid);
	if (atomic_load(&init_owner) != self && (environ || atomic_load(&libc_ready))) {
		pthread_mutex_lock(&init_lock);
		if (atomic_load(&init_state) != INIT_DONE) {
			atomic_store(&init_owner, self);
			struct sc_config c = {0};
			read_config(&c);
			resolve_all();
			cfg = c;
			atomic_store_explicit(&init_state, INIT_DONE, memory_order_release);
			atomic_store(&init_owner, 0);
		}
		pthread_mutex_unlock(&init_lock);
	}
	errno = saved;
}

static double elapsed_s(void)
{
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	return (double)(now.tv_sec - cfg.t0.tv_sec) + (double)(now.tv_nsec - cfg.t0.tv_nsec) / 1e9;
}

static int in_ckpt(const char *abs)
{
	return sc_path_under(abs, cfg.dir, cfg.dir_len) || sc_path_under(abs, cfg.real_dir, cfg.real_len);
}

/*
 * The absolute path an *at() call takes `dirfd` for; 0 when it names no directory path (a socket or
 * a pipe reads "socket:[...]"): the kernel then fails the call with ENOTDIR, and it is none of ours.
 */
static int dirfd_path(int dirfd, char *base, size_t cap)
{
	if (dirfd == AT_FDCWD)
		return getcwd(base, cap) && base[0] == '/';
	char link[32];
	snprintf(link, sizeof(link), "/proc/self/fd/%d", dirfd);
	ssize_t n = readlink(link, base, cap - 1);
	if (n <= 0 || (size_t)n >= cap - 1)
		return 0; /* unreadable, or perhaps cut short */
	base[n] = '\0';
	return base[0] == '/';
}

enum { NOFOLLOW, FOLLOW };
#define MAX_SYMLINKS 8

/*
 * Does `path` (relative to `dirfd`) name the checkpoint directory or a file under it? Lexically
 * first; then by the real directory the name lands in (a symlinked parent) and, for a call that
 * follows a final symlink (`follow`: open without O_NOFOLLOW, linkat AT_SYMLINK_FOLLOW), by where
 * the symlink leads: a symlink to the directory, or /proc/self/fd/N of an O_TMPFILE file there.
 */
static int under_dir(int dirfd, const char *path, int follow)
{
	/* A path the kernel refuses as too long (ENAMETOOLONG) is none of ours either. */
	if (cfg.fault == SC_NONE || !path || !*path || strnlen(path, PATH_MAX) >= PATH_MAX)
		return 0;
	int saved = errno, found = 0;
	char cur[2 * PATH_MAX], real[PATH_MAX], name[PATH_MAX];
	if (path[0] != '/' && !dirfd_path(dirfd, real, sizeof(real)))
		goto out;
	if (sc_path_resolve(real, path, cur, sizeof(cur)) < 0)
		goto out;
	for (int links = 0;; links++) {
		if ((found = in_ckpt(cur)))
			break;
		char *slash = strrchr(cur, '/');
		size_t len = strlen(slash + 1);
		if (!len || len >= sizeof(name))
			break; /* the root itself */
		memcpy(name, slash + 1, len + 1);
		*slash = '\0';
		if (!realpath(slash == cur ? "/" : cur, real) || sc_path_resolve(real, name, cur, sizeof(cur)) < 0)
			break;
		if ((found = in_ckpt(cur)) || !follow || links == MAX_SYMLINKS)
			break;
		ssize_t n = readlink(cur, name, sizeof(name) - 1);
		if (n <= 0 || (size_t)n >= sizeof(name) - 1)
			break; /* no symlink (EINVAL): the name is what it is */
		name[n] = '\0';
		if (sc_path_resolve(real, name, cur, sizeof(cur)) < 0)
			break;
	}
out:
	errno = saved;
	return found;
}

/* Bytes still allowed before the fault starts (0: it is active now). */
static unsigned long long bytes_left(void)
{
	if (cfg.fault == SC_NONE || (cfg.after_s > 0 && elapsed_s() < cfg.after_s))
		return ULLONG_MAX;
	unsigned long long done = atomic_load(&bytes_written);
	return done >= cfg.after_bytes ? 0 : cfg.after_bytes - done;
}

static void announce(void)
{
	if (atomic_exchange(&announced, 1))
		return;
	static const char *names[] = {"none", "enospc", "eio", "hang"};
	char msg[PATH_MAX + 160];
	int n = snprintf(msg, sizeof(msg), "slurm-chaos: checkpoint I/O fault '%s' now active under %s (pid %d)\n",
			 names[cfg.fault], cfg.dir, (int)getpid());
	int saved = errno; /* stderr may be closed: the call that goes ahead keeps its errno */
	if (n > 0)
		(void)!real_write(2, msg, (size_t)(n < (int)sizeof(msg) ? n : (int)sizeof(msg) - 1));
	errno = saved;
}

static int active(void)
{
	if (bytes_left() != 0)
		return 0;
	announce();
	return 1;
}

static void hang(void)
{
	int saved = errno; /* a signal's EINTR inside the hold is not the held call's */
	double left = cfg.hold_s;
	for (;;) {
		double step = (cfg.hold_s <= 0 || left > 1.0) ? 1.0 : left;
		struct timespec ts = {(time_t)step, (long)((step - (double)(time_t)step) * 1e9)};
		while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
			;
		if (cfg.hold_s > 0 && (left -= step) <= 0)
			break;
	}
	errno = saved;
}

/* The fault's effect on one call: an errno to fail with, or 0 to go ahead (after a hang). */
static int inject(int is_read)
{
	switch (cfg.fault) {
	case SC_ENOSPC:
		return is_read ? 0 : ENOSPC;
	case SC_EIO:
		return EIO;
	case SC_HANG:
		hang();
		return 0;
	default:
		return 0;
	}
}

/*
 * Is `fd` open on a checkpoint file? Its mark counts only while fstat still shows the file it was
 * taken for: an fd closed behind the wrappers' back (syscall(SYS_close), libc's own fclose) and
 * reused for a file elsewhere is not faulted.
 */
static int is_tracked(int fd)
{
	dev_t dev;
	ino_t ino;
	if (!sc_mark_get(fd, &dev, &ino))
		return 0;
	int saved = errno;
	struct stat st;
	int same = fstat(fd, &st) == 0 && st.st_dev == dev && st.st_ino == ino;
	errno = saved;
	if (!same)
		sc_mark_clear(fd);
	return same;
}

/* After an open: mark the fd with its file's identity, or drop a stale mark. */
static void track(int fd, int mine)
{
	int saved = errno;
	struct stat st;
	/* No page for the mark (mmap failed): the file goes untracked, its I/O unfaulted. */
	if (mine && fstat(fd, &st) == 0)
		sc_mark_set(fd, st.st_dev, st.st_ino);
	else
		sc_mark_clear(fd);
	errno = saved;
}

/* After a dup of `from` onto `to`: the copy is a checkpoint file exactly when the original is. */
static void track_dup(int from, int to)
{
	dev_t dev;
	ino_t ino;
	if (from == to)
		return;
	if (is_tracked(from) && sc_mark_get(from, &dev, &ino))
		sc_mark_set(to, dev, ino);
	else
		sc_mark_clear(to);
}

static int wants_write(int flags)
{
	return (flags & (O_WRONLY | O_RDWR | O_CREAT | O_TRUNC | O_APPEND)) != 0;
}

/* Common part of every open: fail or hang first if active, then open and track. */
#define OPEN_BODY(call, dirfd, path, flags)                                                  \
	do {                                                                                 \
		ensure_init();                                                               \
		mode_t mode;                                                                 \
		OPEN_MODE(flags, mode);                                                      \
		/* O_TMPFILE includes O_DIRECTORY: its path is the directory, the file ours. */ \
		int mine = (((flags) & O_TMPFILE) == O_TMPFILE || !((flags) & O_DIRECTORY)) &&  \
			   under_dir(dirfd, path, !((flags) & O_NOFOLLOW));                  \
		if (mine && active()) {                                                      \
			int e = inject(!wants_write(flags));                                 \
			if (e) {                                                             \
				errno = e;                                                   \
				return -1;                                                   \
			}                                                                    \
		}                                                                            \
		int fd = call;                                                               \
		if (fd >= 0)                                                                 \
			track(fd, mine);                                                     \
		return fd;                                                                   \
	} while (0)

SC_EXPORT int open(const char *path, int flags, ...)
{
	OPEN_BODY(REAL(open)(path, flags, mode), AT_FDCWD, path, flags);
}

SC_EXPORT int open64(const char *path, int flags, ...)
{
	OPEN_BODY(REAL(open64)(path, flags, mode), AT_FDCWD, path, flags);
}

SC_EXPORT int openat(int dirfd, const char *path, int flags, ...)
{
	OPEN_BODY(REAL(openat)(dirfd, path, flags, mode), dirfd, path, flags);
}

SC_EXPORT int openat64(int dirfd, const char *path, int flags, ...)
{
	OPEN_BODY(REAL(openat64)(dirfd, path, flags, mode), dirfd, path, flags);
}

/* _FORTIFY_SOURCE builds call these when the flags are not a compile-time constant. */
SC_EXPORT int __open_2(const char *path, int flags)
{
	return open(path, flags);
}

SC_EXPORT int __open64_2(const char *path, int flags)
{
	return open64(path, flags);
}

SC_EXPORT int __openat_2(int dirfd, const char *path, int flags)
{
	return openat(dirfd, path, flags);
}

SC_EXPORT int __openat64_2(int dirfd, const char *path, int flags)
{
	return openat64(dirfd, path, flags);
}

SC_EXPORT int creat(const char *path, mode_t mode)
{
	return open(path, O_CREAT | O_WRONLY | O_TRUNC, mode);
}

SC_EXPORT int creat64(const char *path, mode_t mode)
{
	return open64(path, O_CREAT | O_WRONLY | O_TRUNC, mode);
}

/* Fails the call with the fault's errno, if `e` is one. */
#define RETURN_IF_FAULT(e, failed)                                                           \
	do {                                                                                 \
		int e_ = (e);                                                                \
		if (e_) {                                                                    \
			errno = e_;                                                          \
			return failed;                                                       \
		}                                                                            \
	} while (0)

/* Writes: count the bytes, cut the one that crosses the threshold short, then fail or hang. */
#define WRITE_BODY(fd, n, call_with_len)                                                     \
	do {                                                                                 \
		ensure_init();                                                               \
		if (!is_tracked(fd))                                                         \
			return call_with_len(n);                                             \
		unsigned long long left = bytes_left();                                      \
		size_t len = (n);                                                            \
		if (left == 0) {                                                             \
			announce();                                                          \
			int e = inject(0);                                                   \
			if (e) {                                                             \
				errno = e;                                                   \
				return -1;                                                   \
			}                                                                    \
		} else if (left < len) {                                                     \
			len = (size_t)left;                                                  \
		}                                                                            \
		ssize_t r = call_with_len(len);                                              \
		if (r > 0)                                                                   \
			atomic_fetch_add(&bytes_written, (unsigned long long)r);             \
		return r;                                                                    \
	} while (0)

SC_EXPORT ssize_t write(int fd, const void *buf, size_t n)
{
#define CALL(len) REAL(write)(fd, buf, len)
	WRITE_BODY(fd, n, CALL);
#undef CALL
}

SC_EXPORT ssize_t pwrite(int fd, const void *buf, size_t n, off_t off)
{
#define CALL(len) REAL(pwrite)(fd, buf, len, off)
	WRITE_BODY(fd, n, CALL);
#undef CALL
}

SC_EXPORT ssize_t pwrite64(int fd, const void *buf, size_t n, off64_t off)
{
#define CALL(len) REAL(pwrite64)(fd, buf, len, off)
	WRITE_BODY(fd, n, CALL);
#undef CALL
}

/* Bytes written to a tracked file count toward the threshold. */
static void count_written(int fd, ssize_t r)
{
	if (r > 0 && is_tracked(fd))
		atomic_fetch_add(&bytes_written, (unsigned long long)r);
}

/* Vectored writes, syncs, resizes: no length to cut at the threshold, so they fail or go through whole. */
static int write_fault(int fd)
{
	if (!is_tracked(fd) || !active())
		return 0;
	return inject(0);
}

/* Reads fail (eio) or hang (hang) once active; ENOSPC leaves them alone. */
static int read_fault(int fd)
{
	if (!is_tracked(fd) || cfg.fault == SC_ENOSPC || !active())
		return 0;
	return inject(1);
}

#define VECTOR_WRITE(fd, call)                                                               \
	do {                                                                                 \
		ensure_init();                                                               \
		RETURN_IF_FAULT(write_fault(fd), -1);                                        \
		ssize_t r = call;                                                            \
		count_written(fd, r);                                                        \
		return r;                                                                    \
	} while (0)

SC_EXPORT ssize_t writev(int fd, const struct iovec *iov, int cnt)
{
	VECTOR_WRITE(fd, REAL(writev)(fd, iov, cnt));
}

SC_EXPORT ssize_t pwritev(int fd, const struct iovec *iov, int cnt, off_t off)
{
	VECTOR_WRITE(fd, REAL(pwritev)(fd, iov, cnt, off));
}

SC_EXPORT ssize_t pwritev64(int fd, const struct iovec *iov, int cnt, off64_t off)
{
	VECTOR_WRITE(fd, REAL(pwritev64)(fd, iov, cnt, off));
}

SC_EXPORT ssize_t pwritev2(int fd, const struct iovec *iov, int cnt, off_t off, int flags)
{
	VECTOR_WRITE(fd, REAL(pwritev2)(fd, iov, cnt, off, flags));
}

SC_EXPORT ssize_t pwritev64v2(int fd, const struct iovec *iov, int cnt, off64_t off, int flags)
{
	VECTOR_WRITE(fd, REAL(pwritev64v2)(fd, iov, cnt, off, flags));
}

/* In-kernel copies: a read of `in`, a write of `out` counted and cut at the threshold like write(). */
SC_EXPORT ssize_t copy_file_range(int in, off64_t *in_off, int out, off64_t *out_off, size_t n, unsigned int flags)
{
	ensure_init();
	RETURN_IF_FAULT(read_fault(in), -1);
#define CALL(len) REAL(copy_file_range)(in, in_off, out, out_off, len, flags)
	WRITE_BODY(out, n, CALL);
#undef CALL
}

SC_EXPORT ssize_t sendfile(int out, int in, off_t *off, size_t n)
{
	ensure_init();
	RETURN_IF_FAULT(read_fault(in), -1);
#define CALL(len) REAL(sendfile)(out, in, off, len)
	WRITE_BODY(out, n, CALL);
#undef CALL
}

SC_EXPORT ssize_t sendfile64(int out, int in, off64_t *off, size_t n)
{
	ensure_init();
	RETURN_IF_FAULT(read_fault(in), -1);
#define CALL(len) REAL(sendfile64)(out, in, off, len)
	WRITE_BODY(out, n, CALL);
#undef CALL
}

#define FD_WRITE(fd, call)                                                                   \
	do {                                                                                 \
		ensure_init();                                                               \
		RETURN_IF_FAULT(write_fault(fd), -1);                                        \
		return call;                                                                 \
	} while (0)

SC_EXPORT int fsync(int fd)
{
	FD_WRITE(fd, REAL(fsync)(fd));
}

SC_EXPORT int fdatasync(int fd)
{
	FD_WRITE(fd, REAL(fdatasync)(fd));
}

SC_EXPORT int ftruncate(int fd, off_t len)
{
	FD_WRITE(fd, REAL(ftruncate)(fd, len));
}

SC_EXPORT int ftruncate64(int fd, off64_t len)
{
	FD_WRITE(fd, REAL(ftruncate64)(fd, len));
}

SC_EXPORT int fallocate(int fd, int mode, off_t off, off_t len)
{
	FD_WRITE(fd, REAL(fallocate)(fd, mode, off, len));
}

SC_EXPORT int fallocate64(int fd, int mode, off64_t off, off64_t len)
{
	FD_WRITE(fd, REAL(fallocate64)(fd, mode, off, len));
}

/* posix_fallocate returns its error and leaves errno alone. */
SC_EXPORT int posix_fallocate(int fd, off_t off, off_t len)
{
	ensure_init();
	int e = write_fault(fd);
	return e ? e : REAL(posix_fallocate)(fd, off, len);
}

SC_EXPORT int posix_fallocate64(int fd, off64_t off, off64_t len)
{
	ensure_init();
	int e = write_fault(fd);
	return e ? e : REAL(posix_fallocate64)(fd, off, len);
}

/*
 * A shared writable mapping writes the file behind every wrapper: once the fault is active it is
 * refused with the fault's errno (hang: held, then made). Stores through a mapping made before are
 * neither counted nor stopped. A mapping of a checkpoint file to read fails or hangs like read().
 */
static int map_fault(int fd, int prot, int flags)
{
	if (fd < 0 || (flags & MAP_ANONYMOUS) || !is_tracked(fd))
		return 0;
	if ((prot & PROT_WRITE) && (flags & MAP_SHARED)) /* MAP_SHARED_VALIDATE has the bit too */
		return write_fault(fd);
	return read_fault(fd);
}

SC_EXPORT void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	ensure_init();
	RETURN_IF_FAULT(map_fault(fd, prot, flags), MAP_FAILED);
	return REAL(mmap)(addr, len, prot, flags, fd, off);
}

SC_EXPORT void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off64_t off)
{
	ensure_init();
	RETURN_IF_FAULT(map_fault(fd, prot, flags), MAP_FAILED);
	return REAL(mmap64)(addr, len, prot, flags, fd, off);
}

#define FD_READ(fd, call)                                                                    \
	do {                                                                                 \
		ensure_init();                                                               \
		RETURN_IF_FAULT(read_fault(fd), -1);                                         \
		return call;                                                                 \
	} while (0)

/*
 * _FORTIFY_SOURCE declares read, pread and pread64 as inline functions, and clang then takes a
 * definition of the same name for that inline one and exports nothing. Defined under another C
 * name with the symbol's name, they are the same functions to the linker and none to clang.
 */
SC_EXPORT ssize_t sc_read(int fd, void *buf, size_t n) __asm__("read");
SC_EXPORT ssize_t sc_pread(int fd, void *buf, size_t n, off_t off) __asm__("pread");
SC_EXPORT ssize_t sc_pread64(int fd, void *buf, size_t n, off64_t off) __asm__("pread64");

ssize_t sc_read(int fd, void *buf, size_t n)
{
	FD_READ(fd, REAL(read)(fd, buf, n));
}

ssize_t sc_pread(int fd, void *buf, size_t n, off_t off)
{
	FD_READ(fd, REAL(pread)(fd, buf, n, off));
}

ssize_t sc_pread64(int fd, void *buf, size_t n, off64_t off)
{
	FD_READ(fd, REAL(pread64)(fd, buf, n, off));
}

SC_EXPORT ssize_t readv(int fd, const struct iovec *iov, int cnt)
{
	FD_READ(fd, REAL(readv)(fd, iov, cnt));
}

SC_EXPORT ssize_t preadv(int fd, const struct iovec *iov, int cnt, off_t off)
{
	FD_READ(fd, REAL(preadv)(fd, iov, cnt, off));
}

SC_EXPORT ssize_t preadv64(int fd, const struct iovec *iov, int cnt, off64_t off)
{
	FD_READ(fd, REAL(preadv64)(fd, iov, cnt, off));
}

SC_EXPORT ssize_t preadv2(int fd, const struct iovec *iov, int cnt, off_t off, int flags)
{
	FD_READ(fd, REAL(preadv2)(fd, iov, cnt, off, flags));
}

SC_EXPORT ssize_t preadv64v2(int fd, const struct iovec *iov, int cnt, off64_t off, int flags)
{
	FD_READ(fd, REAL(preadv64v2)(fd, iov, cnt, off, flags));
}

SC_EXPORT int close(int fd)
{
	ensure_init();
	sc_mark_clear(fd);
	return REAL(close)(fd);
}

SC_EXPORT int close_range(unsigned int first, unsigned int last, int flags)
{
	ensure_init();
	if (!(flags & CLOSE_RANGE_CLOEXEC))
		sc_mark_clear_range(first, last);
	return REAL(close_range)(first, last, flags);
}

SC_EXPORT void closefrom(int lowfd)
{
	ensure_init();
	if (lowfd >= 0)
		sc_mark_clear_range((unsigned)lowfd, ~0U);
	REAL(closefrom)(lowfd);
}

SC_EXPORT int dup(int fd)
{
	ensure_init();
	int nfd = REAL(dup)(fd);
	if (nfd >= 0)
		track_dup(fd, nfd);
	return nfd;
}

SC_EXPORT int dup2(int fd, int nfd)
{
	ensure_init();
	int r = REAL(dup2)(fd, nfd);
	if (r >= 0)
		track_dup(fd, r);
	return r;
}

SC_EXPORT int dup3(int fd, int nfd, int flags)
{
	ensure_init();
	int r = REAL(dup3)(fd, nfd, flags);
	if (r >= 0)
		track_dup(fd, r);
	return r;
}

/* The third argument is read as glibc's own fcntl reads it: one pointer-sized word, or nothing. */
#define FCNTL_BODY(real, fd, cmd)                                                            \
	do {                                                                                 \
		ensure_init();                                                               \
		va_list ap;                                                                  \
		va_start(ap, cmd);                                                           \
		void *arg = va_arg(ap, void *);                                              \
		va_end(ap);                                                                  \
		int r = real(fd, cmd, arg);                                                  \
		if (r >= 0 && ((cmd) == F_DUPFD || (cmd) == F_DUPFD_CLOEXEC))                \
			track_dup(fd, r);                                                    \
		return r;                                                                    \
	} while (0)

SC_EXPORT int fcntl(int fd, int cmd, ...)
{
	FCNTL_BODY(REAL(fcntl), fd, cmd);
}

SC_EXPORT int fcntl64(int fd, int cmd, ...)
{
	FCNTL_BODY(REAL(fcntl64), fd, cmd);
}


/* Is the file open on `fd` in the directory: tracked, or (opened before the shim saw it) named there? */
static int fd_under_dir(int fd)
{
	if (cfg.fault == SC_NONE)
		return 0;
	if (is_tracked(fd))
		return 1;
	int saved = errno;
	char link[32], target[PATH_MAX];
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	ssize_t n = readlink(link, target, sizeof(target) - 1);
	errno = saved;
	if (n <= 0 || (size_t)n >= sizeof(target) - 1)
		return 0;
	target[n] = '\0';
	sc_path_strip_deleted(target); /* an O_TMPFILE file reads "/ckpt/#1234 (deleted)" */
	return target[0] == '/' && under_dir(AT_FDCWD, target, NOFOLLOW);
}

/* linkat's old file: an fd (AT_EMPTY_PATH), or a path, followed if AT_SYMLINK_FOLLOW says so. */
static int link_source_under_dir(int dirfd, const char *path, int flags)
{
	if ((flags & AT_EMPTY_PATH) && path && !*path)
		return fd_under_dir(dirfd);
	return under_dir(dirfd, path, (flags & AT_SYMLINK_FOLLOW) ? FOLLOW : NOFOLLOW);
}

/* Namespace changes into, out of or inside the directory: either end in it counts. */
static int namespace_fault(int in_dir)
{
	if (!in_dir || !active())
		return 0;
	return inject(0);
}

/* rename and link: the old name and the new one (neither followed if a symlink). */
static int two_path_fault(int olddirfd, const char *oldpath, int newdirfd, const char *newpath)
{
	return namespace_fault(under_dir(olddirfd, oldpath, NOFOLLOW) || under_dir(newdirfd, newpath, NOFOLLOW));
}

SC_EXPORT int rename(const char *oldpath, const char *newpath)
{
	ensure_init();
	RETURN_IF_FAULT(two_path_fault(AT_FDCWD, oldpath, AT_FDCWD, newpath), -1);
	return REAL(rename)(oldpath, newpath);
}

SC_EXPORT int renameat(int olddirfd, const char *oldpath, int newdirfd, const char *newpath)
{
	ensure_init();
	RETURN_IF_FAULT(two_path_fault(olddirfd, oldpath, newdirfd, newpath), -1);
	return REAL(renameat)(olddirfd, oldpath, newdirfd, newpath);
}

SC_EXPORT int renameat2(int olddirfd, const char *oldpath, int newdirfd, const char *newpath, unsigned int flags)
{
	ensure_init();
	RETURN_IF_FAULT(two_path_fault(olddirfd, oldpath, newdirfd, newpath), -1);
	return REAL(renameat2)(olddirfd, oldpath, newdirfd, newpath, flags);
}

SC_EXPORT int link(const char *oldpath, const char *newpath)
{
	ensure_init();
	RETURN_IF_FAULT(two_path_fault(AT_FDCWD, oldpath, AT_FDCWD, newpath), -1);
	return REAL(link)(oldpath, newpath);
}

SC_EXPORT int linkat(int olddirfd, const char *oldpath, int newdirfd, const char *newpath, int flags)
{
	ensure_init();
	int in_dir = link_source_under_dir(olddirfd, oldpath, flags) || under_dir(newdirfd, newpath, NOFOLLOW);
	RETURN_IF_FAULT(namespace_fault(in_dir), -1);
	return REAL(linkat)(olddirfd, oldpath, newdirfd, newpath, flags);
}

/* truncate(2) follows a final symlink, as open does. */
SC_EXPORT int truncate(const char *path, off_t len)
{
	ensure_init();
	RETURN_IF_FAULT(namespace_fault(under_dir(AT_FDCWD, path, FOLLOW)), -1);
	return REAL(truncate)(path, len);
}

SC_EXPORT int truncate64(const char *path, off64_t len)
{
	ensure_init();
	RETURN_IF_FAULT(namespace_fault(under_dir(AT_FDCWD, path, FOLLOW)), -1);
	return REAL(truncate64)(path, len);
}

SC_EXPORT int mkdir(const char *path, mode_t mode)
{
	ensure_init();
	RETURN_IF_FAULT(namespace_fault(under_dir(AT_FDCWD, path, NOFOLLOW)), -1);
	return REAL(mkdir)(path, mode);
}

SC_EXPORT int mkdirat(int dirfd, const char *path, mode_t mode)
{
	ensure_init();
	RETURN_IF_FAULT(namespace_fault(under_dir(dirfd, path, NOFOLLOW)), -1);
	return REAL(mkdirat)(dirfd, path, mode);
}

/* stdio on the directory: a cookie stream whose I/O goes through the wrappers above. */
static ssize_t cookie_read(void *c, char *buf, size_t n)
{
	return read((int)(intptr_t)c, buf, n);
}

static ssize_t cookie_write(void *c, const char *buf, size_t n)
{
	/* Loop over short writes as glibc does for files, so that the error (and errno) surfaces. */
	size_t done = 0;
	while (done < n) {
		ssize_t r = write((int)(intptr_t)c, buf + done, n - done);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		done += (size_t)r;
	}
	return (ssize_t)done; /* short: stdio marks the stream in error, errno stays set */
}

static int cookie_seek(void *c, off64_t *off, int whence)
{
	off64_t r = REAL(lseek64)((int)(intptr_t)c, *off, whence);
	if (r < 0)
		return -1;
	*off = r;
	return 0;
}

static int cookie_close(void *c)
{
	return close((int)(intptr_t)c);
}

static int mode_flags(const char *mode)
{
	int flags;
	switch (mode[0]) {
	case 'r': flags = 0; break;
	case 'w': flags = O_CREAT | O_TRUNC; break;
	case 'a': flags = O_CREAT | O_APPEND; break;
	default: return -1;
	}
	int plus = strchr(mode, '+') != NULL;
	flags |= plus ? O_RDWR : (mode[0] == 'r' ? O_RDONLY : O_WRONLY);
	if (strchr(mode, 'x'))
		flags |= O_EXCL;
	if (strchr(mode, 'e'))
		flags |= O_CLOEXEC;
	return flags;
}

static FILE *fopen_common(const char *path, const char *mode, FILE *(*real)(const char *, const char *))
{
	ensure_init();
	if (!under_dir(AT_FDCWD, path, FOLLOW))
		return real(path, mode);
	int flags = mode_flags(mode);
	if (flags < 0) {
		errno = EINVAL;
		return NULL;
	}
	int fd = open(path, flags, 0666);
	if (fd < 0)
		return NULL;
	cookie_io_functions_t io = {cookie_read, cookie_write, cookie_seek, cookie_close};
	char cmode[8];
	snprintf(cmode, sizeof(cmode), "%c%s", mode[0], strchr(mode, '+') ? "+" : "");
	FILE *f = fopencookie((void *)(intptr_t)fd, cmode, io);
	if (!f) {
		int saved = errno;
		close(fd);
		errno = saved;
		return NULL;
	}
#ifdef __GLIBC__
	/*
	 * fileno() of a cookie stream is -1, but libstdc++'s filebuf (std::ofstream, torch.save to a
	 * path) opens with fopen and then calls write()/read()/lseek() on fileno(): give it the real,
	 * tracked fd. glibc does its own I/O on a cookie stream through the cookie, never through
	 * _fileno, which it only compares with -1 ("open") and resets at fclose.
	 */
	f->_fileno = fd;
#endif
	return f;
}

SC_EXPORT FILE *fopen(const char *path, const char *mode)
{
	ensure_init();
	return fopen_common(path, mode, REAL(fopen));
}

SC_EXPORT FILE *fopen64(const char *path, const char *mode)
{
	ensure_init();
	return fopen_common(path, mode, REAL(fopen64));
}
