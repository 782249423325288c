/*
 * Checks libslurm_chaos_io.so from the outside: run under LD_PRELOAD with the SLURM_CHAOS_IO_*
 * variables that run_tests.sh sets, one scenario per run: test_io SCENARIO CKPT_DIR OTHER_DIR.
 * Exits 0 when every expectation of the scenario held; prints each failed one.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <pthread.h>
#include <time.h>
#include <unistd.h>

static int failures, skipped;
static char buf[8192];

#define EXPECT(cond, ...)                                                                          \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                       \
			fprintf(stderr, __VA_ARGS__);                                              \
			fprintf(stderr, " (errno %d %s)\n", errno, strerror(errno));               \
			failures++;                                                                \
		}                                                                                  \
	} while (0)

/* A write on `fd` fails with ENOSPC: it is a tracked checkpoint file and the fault is active. */
#define EXPECT_FAULTED(fd, what)                                                                   \
	do {                                                                                       \
		errno = 0;                                                                         \
		EXPECT(write(fd, buf, 1) == -1 && errno == ENOSPC, "%s: write fails (ENOSPC)", what); \
	} while (0)

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static char *join(const char *dir, const char *name)
{
	static char paths[8][4096];
	static int next;
	char *p = paths[next++ % 8];
	snprintf(p, 4096, "%s/%s", dir, name);
	return p;
}

/* Writes elsewhere always work, whatever the fault. */
static void other_dir_untouched(const char *other)
{
	int fd = open(join(other, "out.h5"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
	EXPECT(fd >= 0, "open outside the checkpoint dir");
	EXPECT(write(fd, buf, sizeof(buf)) == (ssize_t)sizeof(buf), "write outside the checkpoint dir");
	EXPECT(fsync(fd) == 0, "fsync outside the checkpoint dir");
	EXPECT(close(fd) == 0, "close");
	FILE *f = fopen(join(other, "out.txt"), "w");
	EXPECT(f && fwrite(buf, 1, 100, f) == 100 && fclose(f) == 0, "stdio outside the checkpoint dir");
}

static void enospc(const char *ckpt, const char *other)
{
	/* SLURM_CHAOS_IO_AFTER_BYTES=1000 */
	int fd = open(join(ckpt, "a.pt"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
	EXPECT(fd >= 0, "open before the threshold");
	EXPECT(write(fd, buf, 600) == 600, "first 600 bytes");
	EXPECT(write(fd, buf, 600) == 400, "the write crossing 1000 bytes is cut short");
	errno = 0;
	EXPECT(write(fd, buf, 1) == -1 && errno == ENOSPC, "write after the threshold: ENOSPC");
	errno = 0;
	EXPECT(pwrite(fd, buf, 10, 0) == -1 && errno == ENOSPC, "pwrite: ENOSPC");
	struct iovec iov = {buf, 10};
	errno = 0;
	EXPECT(writev(fd, &iov, 1) == -1 && errno == ENOSPC, "writev: ENOSPC");
	errno = 0;
	EXPECT(fsync(fd) == -1 && errno == ENOSPC, "fsync: ENOSPC");
	close(fd);
	errno = 0;
	EXPECT(open(join(ckpt, "b.pt"), O_WRONLY | O_CREAT, 0644) == -1 && errno == ENOSPC, "open for write: ENOSPC");
	errno = 0;
	EXPECT(creat(join(ckpt, "c.pt"), 0644) == -1 && errno == ENOSPC, "creat: ENOSPC");
	errno = 0;
	EXPECT(fopen(join(ckpt, "d.pt"), "w") == NULL && errno == ENOSPC, "fopen w: ENOSPC");
	int rfd = open(join(ckpt, "a.pt"), O_RDONLY);
	EXPECT(rfd >= 0 && read(rfd, buf, 100) == 100, "reads still work under enospc");
	close(rfd);
	int ofd = open(join(other, "tmp"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
	close(ofd);
	errno = 0;
	EXPECT(rename(join(other, "tmp"), join(ckpt, "e.pt")) == -1 && errno == ENOSPC, "rename into: ENOSPC");
	errno = 0;
	EXPECT(mkdir(join(ckpt, "sub"), 0755) == -1 && errno == ENOSPC, "mkdir: ENOSPC");
	other_dir_untouched(other);
}

static void eio(const char *ckpt, const char *other)
{
	/* SLURM_CHAOS_IO_AFTER_BYTES=0, a file a.pt written beforehand by the script */
	errno = 0;
	EXPECT(open(join(ckpt, "new.pt"), O_WRONLY | O_CREAT, 0644) == -1 && errno == EIO, "open for write: EIO");
	errno = 0;
	EXPECT(open(join(ckpt, "a.pt"), O_RDONLY) == -1 && errno == EIO, "open for read: EIO");
	int dirfd = open(ckpt, O_RDONLY | O_DIRECTORY);
	errno = 0;
	EXPECT(openat(dirfd, "rel.pt", O_WRONLY | O_CREAT, 0644) == -1 && errno == EIO, "openat relative: EIO");
	close(dirfd);
	errno = 0;
	EXPECT(open(ckpt, O_TMPFILE | O_RDWR, 0600) == -1 && errno == EIO, "O_TMPFILE in the directory: EIO");
	dirfd = open(ckpt, O_RDONLY | O_DIRECTORY);
	EXPECT(dirfd >= 0, "the directory itself still opens (to list it, or as an openat base)");
	close(dirfd);
	/* Symlinks from elsewhere: to a checkpoint file (followed unless O_NOFOLLOW), to the directory. */
	EXPECT(symlink(join(ckpt, "a.pt"), join(other, "to-file")) == 0, "symlink");
	EXPECT(symlink(ckpt, join(other, "to-dir")) == 0, "symlink");
	errno = 0;
	EXPECT(open(join(other, "to-file"), O_RDONLY) == -1 && errno == EIO, "open through a symlink: EIO");
	errno = 0;
	EXPECT(open(join(other, "to-file"), O_RDONLY | O_NOFOLLOW) == -1 && errno == ELOOP, "O_NOFOLLOW: ELOOP");
	errno = 0;
	EXPECT(open(join(other, "to-dir/new.pt"), O_WRONLY | O_CREAT, 0644) == -1 && errno == EIO,
	       "open under a symlinked directory: EIO");
	errno = 0;
	EXPECT(open(join(other, "to-dir"), O_TMPFILE | O_RDWR, 0600) == -1 && errno == EIO,
	       "O_TMPFILE through a symlink to the directory: EIO");
	char cwd[4096];
	EXPECT(getcwd(cwd, sizeof(cwd)) != NULL, "getcwd");
	EXPECT(chdir(ckpt) == 0, "chdir");
	errno = 0;
	EXPECT(open("./x/../rel2.pt", O_WRONLY | O_CREAT, 0644) == -1 && errno == EIO, "relative path: EIO");
	EXPECT(chdir(cwd) == 0, "chdir back");
	other_dir_untouched(other);
}

static void hang(const char *ckpt, const char *other)
{
	/* SLURM_CHAOS_IO_HOLD_S=1, AFTER_BYTES=100 */
	int fd = open(join(ckpt, "h.pt"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
	EXPECT(fd >= 0, "open before the threshold");
	double t = now();
	EXPECT(write(fd, buf, 100) == 100, "100 bytes before the hang");
	EXPECT(now() - t < 0.5, "no hang before the threshold");
	t = now();
	EXPECT(write(fd, buf, 10) == 10, "write after the hold proceeds");
	double held = now() - t;
	EXPECT(held >= 0.9 && held < 3.0, "write held about 1 s (held %.2f s)", held);
	close(fd);
	t = now();
	other_dir_untouched(other);
	EXPECT(now() - t < 0.5, "no hang outside the checkpoint dir");
}

static void stdio_enospc(const char *ckpt, const char *other)
{
	/* SLURM_CHAOS_IO_AFTER_BYTES=100 */
	FILE *f = fopen(join(ckpt, "s.pt"), "w");
	EXPECT(f != NULL, "fopen before the threshold");
	if (!f)
		return;
	EXPECT(fwrite(buf, 1, 300, f) == 300, "fwrite buffers");
	errno = 0;
	EXPECT(fflush(f) == EOF && errno == ENOSPC, "fflush: ENOSPC");
	fclose(f);
	struct stat st;
	EXPECT(stat(join(ckpt, "s.pt"), &st) == 0 && st.st_size == 100, "exactly 100 bytes landed (%ld)",
	       (long)st.st_size);
	other_dir_untouched(other);
}

/*
 * libstdc++'s std::ofstream (torch.save to a path) opens with fopen and then writes with write() on
 * fileno(): a stream of ours must have the real fd behind it, and that fd is tracked.
 */
static void stdio_fileno(const char *ckpt, const char *other)
{
	/* SLURM_CHAOS_IO_AFTER_BYTES=100 */
	FILE *f = fopen(join(ckpt, "cxx.pt"), "wb");
	int fd = f ? fileno(f) : -1;
	EXPECT(fd >= 0, "fileno of a checkpoint stream");
	EXPECT(write(fd, buf, 60) == 60 && lseek(fd, 0, SEEK_END) == 60, "write and lseek on its fd");
	EXPECT(write(fd, buf, 60) == 40, "cut short at the threshold");
	EXPECT_FAULTED(fd, "the stream's fd");
	EXPECT(f && fclose(f) == 0, "fclose");
	errno = 0;
	EXPECT(fcntl(fd, F_GETFD) == -1 && errno == EBADF, "fclose closed the fd");
	f = fopen(join(ckpt, "a.pt"), "r");
	char c[4];
	EXPECT(f && read(fileno(f), c, 4) == 4, "read on a reading stream's fd (enospc leaves reads)");
	if (f)
		fclose(f);
	other_dir_untouched(other);
}

static void after_seconds(const char *ckpt, const char *other)
{
	/* SLURM_CHAOS_IO_AFTER_S=1 */
	int fd = open(join(ckpt, "t.pt"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
	EXPECT(fd >= 0 && write(fd, buf, 100) == 100, "writes work before the delay");
	usleep(1200 * 1000);
	errno = 0;
	EXPECT(write(fd, buf, 100) == -1 && errno == ENOSPC, "write after the delay: ENOSPC");
	close(fd);
	other_dir_untouched(other);
}

static void passive(const char *ckpt, const char *other)
{
	/* No SLURM_CHAOS_IO_FAULT: the shim only forwards. */
	int fd = open(join(ckpt, "p.pt"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
	EXPECT(fd >= 0 && write(fd, buf, sizeof(buf)) == (ssize_t)sizeof(buf) && fsync(fd) == 0, "passive");
	close(fd);
	EXPECT(rename(join(ckpt, "p.pt"), join(ckpt, "q.pt")) == 0, "rename");
	other_dir_untouched(other);
}

/* An openat base that is no directory: /proc/self/fd/N names "socket:[...]" or "pipe:[...]". */
static void socket_dirfd(const char *ckpt, const char *other)
{
	/* SLURM_CHAOS_IO_FAULT=eio, AFTER_BYTES=0 */
	int sv[2], pv[2];
	EXPECT(socketpair(AF_UNIX, SOCK_STREAM, 0, sv) == 0 && pipe(pv) == 0, "socketpair, pipe");
	static char longrel[3000];
	for (size_t i = 0; i + 2 < sizeof(longrel); i += 2)
		memcpy(longrel + i, "a/", 2);
	const char *rels[] = {"x.pt", "a/b/c/d/e/f/g/h/i/j/k/l/m/n/o/p/q/r/s/t/u/v/w/x/y/z", longrel, "..", "../../..", ""};
	for (size_t i = 0; i < sizeof(rels) / sizeof(rels[0]); i++) {
		int bases[] = {sv[0], pv[0], pv[1]};
		for (size_t j = 0; j < 3; j++) {
			errno = 0;
			int fd = openat(bases[j], rels[i], O_WRONLY | O_CREAT, 0644);
			EXPECT(fd == -1 && (errno == ENOTDIR || errno == ENOENT), "openat on a non-directory base: ENOTDIR");
			errno = 0;
			EXPECT(mkdirat(bases[j], rels[i], 0755) == -1 && errno != EIO, "mkdirat on a non-directory base");
		}
	}
	close(sv[0]);
	close(sv[1]);
	close(pv[0]);
	close(pv[1]);
	int dirfd = open(ckpt, O_RDONLY | O_DIRECTORY);
	errno = 0;
	EXPECT(openat(dirfd, "rel.pt", O_WRONLY | O_CREAT, 0644) == -1 && errno == EIO, "a real base still counts");
	close(dirfd);
	other_dir_untouched(other);
}

static int open_ckpt(const char *ckpt, const char *name)
{
	int fd = open(join(ckpt, name), O_WRONLY | O_CREAT | O_TRUNC, 0644);
	EXPECT(fd >= 0, "open %s before the threshold", name);
	return fd;
}


/* The fd number of a checkpoint file closed behind close()'s back, reused for a file elsewhere. */
static FILE *reused_fd_untouched(const char *other, int fd, const char *how)
{
	FILE *f = fopen(join(other, how), "w"); /* not ours: libc's own open, no wrapper sees it */
	EXPECT(f && fileno(f) == fd, "%s: fd %d reused by the next open (got %d)", how, fd, f ? fileno(f) : -1);
	if (!f)
		return NULL;
	errno = 0;
	EXPECT(write(fileno(f), buf, 5) == 5, "%s: the reused fd %d is no checkpoint file", how, fd);
	return f; /* kept open, so that the next close frees the lowest fd */
}

/* Closes that bypass close(): the mark must not outlive the file. */
static void fd_reuse(const char *ckpt, const char *other)
{
	/* SLURM_CHAOS_IO_FAULT=enospc, AFTER_BYTES=10 */
	int fd1 = open_ckpt(ckpt, "r1.pt"), fd2 = open_ckpt(ckpt, "r2.pt"), fd3 = open_ckpt(ckpt, "r3.pt");
	int fd4 = open_ckpt(ckpt, "r4.pt"), fd5 = open_ckpt(ckpt, "r5.pt");
	EXPECT(write(fd5, buf, 10) == 10, "10 bytes: the fault starts");
	EXPECT_FAULTED(fd5, "before any close");

	EXPECT(syscall(SYS_close, fd1) == 0, "raw close");
	FILE *f1 = reused_fd_untouched(other, fd1, "syscall(SYS_close)");
	EXPECT(close_range((unsigned)fd2, (unsigned)fd2, 0) == 0, "close_range");
	FILE *f2 = reused_fd_untouched(other, fd2, "close_range");
	EXPECT(close_range((unsigned)fd3, (unsigned)fd3, CLOSE_RANGE_CLOEXEC) == 0, "close_range CLOEXEC");
	EXPECT_FAULTED(fd3, "close_range(CLOSE_RANGE_CLOEXEC) leaves it open");
	closefrom(fd4);
	FILE *f4 = reused_fd_untouched(other, fd4, "closefrom");
	FILE *fs[] = {f1, f2, f4};
	for (size_t i = 0; i < 3; i++)
		if (fs[i])
			fclose(fs[i]);
	close(fd3);
	other_dir_untouched(other);
}

/* Every way of duplicating an fd carries its mark; duplicating another file over it drops it. */
static void dup_fds(const char *ckpt, const char *other)
{
	/* SLURM_CHAOS_IO_FAULT=enospc, AFTER_BYTES=10 */
	int fd = open_ckpt(ckpt, "d.pt");
	EXPECT(write(fd, buf, 10) == 10, "10 bytes: the fault starts");
	int d[] = {dup(fd), dup2(fd, 300), dup3(fd, 301, O_CLOEXEC), fcntl(fd, F_DUPFD, 310),
		   fcntl(fd, F_DUPFD_CLOEXEC, 320), fcntl64(fd, F_DUPFD, 330)};
	const char *how[] = {"dup", "dup2", "dup3", "fcntl F_DUPFD", "fcntl F_DUPFD_CLOEXEC", "fcntl64 F_DUPFD"};
	for (size_t i = 0; i < sizeof(d) / sizeof(d[0]); i++) {
		EXPECT(d[i] >= 0, "%s", how[i]);
		EXPECT_FAULTED(d[i], how[i]);
	}
	int ofd = open(join(other, "o.txt"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
	EXPECT(dup2(ofd, 300) == 300 && write(300, buf, 3) == 3, "dup2 of another file over a marked fd");
	EXPECT(dup3(ofd, 301, 0) == 301 && write(301, buf, 3) == 3, "dup3 of another file over a marked fd");
	for (size_t i = 0; i < sizeof(d) / sizeof(d[0]); i++)
		close(d[i]);
	close(ofd);
	close(fd);
	other_dir_untouched(other);
}

/* fds past 65536 (a rank with many shards, or a raised RLIMIT_NOFILE) are tracked as well. */
static void high_fds(const char *ckpt, const char *other)
{
	/* SLURM_CHAOS_IO_FAULT=enospc, AFTER_BYTES=10 */
	struct rlimit rl = {1 << 20, 1 << 20};
	if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
		getrlimit(RLIMIT_NOFILE, &rl);
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	getrlimit(RLIMIT_NOFILE, &rl);
	if (rl.rlim_cur <= 200000) {
		printf("high_fds: skipped (RLIMIT_NOFILE %lu, cannot raise it)\n", (unsigned long)rl.rlim_cur);
		skipped = 1;
		return;
	}
	int fd = open_ckpt(ckpt, "h.pt");
	EXPECT(write(fd, buf, 10) == 10, "10 bytes: the fault starts");
	EXPECT(dup2(fd, 70000) == 70000, "dup2 to 70000");
	EXPECT_FAULTED(70000, "fd 70000");
	EXPECT(fcntl(fd, F_DUPFD, 199999) == 199999, "F_DUPFD to 199999");
	EXPECT_FAULTED(199999, "fd 199999");
	int ofd = open(join(other, "o.txt"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
	EXPECT(dup2(ofd, 70000) == 70000 && write(70000, buf, 3) == 3, "another file over fd 70000");
	EXPECT(syscall(SYS_close, 199999) == 0 && syscall(SYS_dup3, ofd, 199999, 0) == 199999, "raw close, raw dup3");
	EXPECT(write(199999, buf, 3) == 3, "fd 199999 reused behind the shim's back");
	close(70000);
	close(199999);
	close(ofd);
	close(fd);
	other_dir_untouched(other);
}

/* An unnamed file in the directory (O_TMPFILE), then linked in: the write-then-link pattern. */
static void tmpfile_and_links(const char *ckpt, const char *other)
{
	/* SLURM_CHAOS_IO_FAULT=enospc, AFTER_BYTES=100 */
	int fd = open(ckpt, O_TMPFILE | O_WRONLY, 0600);
	if (fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR)) {
		printf("tmpfile: skipped (no O_TMPFILE on this file system)\n");
		skipped = 1;
		return;
	}
	EXPECT(fd >= 0, "O_TMPFILE in the checkpoint directory, before the threshold");
	EXPECT(write(fd, buf, 100) == 100, "100 bytes to the unnamed file");
	EXPECT_FAULTED(fd, "O_TMPFILE file after the threshold");
	int dirfd = open(ckpt, O_RDONLY | O_DIRECTORY);
	errno = 0;
	EXPECT(openat(dirfd, ".", O_TMPFILE | O_RDWR, 0600) == -1 && errno == ENOSPC, "openat O_TMPFILE: ENOSPC");
	int ofd = open(other, O_TMPFILE | O_WRONLY, 0600);
	EXPECT(ofd >= 0 && write(ofd, buf, 10) == 10, "O_TMPFILE elsewhere is left alone");

	char self[64];
	snprintf(self, sizeof(self), "/proc/self/fd/%d", fd);
	errno = 0;
	EXPECT(linkat(AT_FDCWD, self, AT_FDCWD, join(ckpt, "final.pt"), AT_SYMLINK_FOLLOW) == -1 && errno == ENOSPC,
	       "linkat of the unnamed file into the directory: ENOSPC");
	errno = 0;
	EXPECT(linkat(AT_FDCWD, self, AT_FDCWD, join(other, "escaped.pt"), AT_SYMLINK_FOLLOW) == -1 && errno == ENOSPC,
	       "linkat of the unnamed file out of the directory (old path checked): ENOSPC");
	errno = 0;
	EXPECT(linkat(fd, "", AT_FDCWD, join(other, "escaped2.pt"), AT_EMPTY_PATH) == -1 && errno == ENOSPC,
	       "linkat AT_EMPTY_PATH of a checkpoint fd: ENOSPC");
	errno = 0;
	EXPECT(linkat(dirfd, "a.pt", AT_FDCWD, join(other, "a-link"), 0) == -1 && errno == ENOSPC,
	       "linkat out of the directory, relative to a dirfd: ENOSPC");
	errno = 0;
	EXPECT(link(join(ckpt, "a.pt"), join(other, "a-link")) == -1 && errno == ENOSPC, "link out: ENOSPC");
	int tmp = open(join(other, "in"), O_WRONLY | O_CREAT, 0644);
	close(tmp);
	errno = 0;
	EXPECT(link(join(other, "in"), join(ckpt, "in")) == -1 && errno == ENOSPC, "link in: ENOSPC");

	errno = 0;
	EXPECT(rename(join(ckpt, "a.pt"), join(other, "moved")) == -1 && errno == ENOSPC, "rename out: ENOSPC");
	errno = 0;
	EXPECT(renameat(dirfd, "a.pt", AT_FDCWD, join(other, "moved")) == -1 && errno == ENOSPC, "renameat out: ENOSPC");
	errno = 0;
	EXPECT(renameat2(dirfd, "a.pt", AT_FDCWD, join(other, "moved"), RENAME_NOREPLACE) == -1 && errno == ENOSPC,
	       "renameat2 out: ENOSPC");
	errno = 0;
	EXPECT(renameat2(AT_FDCWD, join(other, "in"), dirfd, "in", 0) == -1 && errno == ENOSPC, "renameat2 in: ENOSPC");
	struct stat st;
	EXPECT(stat(join(ckpt, "a.pt"), &st) == 0, "the checkpoint stayed where it was");
	EXPECT(link(join(other, "in"), join(other, "in2")) == 0 && rename(join(other, "in2"), join(other, "in3")) == 0,
	       "link and rename elsewhere work");
	close(dirfd);
	close(ofd);
	close(fd);
	other_dir_untouched(other);
}

static long try_map(int fd, int prot, int flags)
{
	void *map = mmap(NULL, 4096, prot, flags, fd, 0);
	if (map == MAP_FAILED)
		return -1;
	munmap(map, 4096);
	return 0;
}

/* Every other call that writes to an open file: cut at the threshold (copies), then failed. */
static void write_calls(const char *ckpt, const char *other)
{
	/* SLURM_CHAOS_IO_FAULT=enospc, AFTER_BYTES=100 */
	int fd = open(join(ckpt, "m.pt"), O_RDWR | O_CREAT | O_TRUNC, 0644);
	int src = open(join(other, "src"), O_RDWR | O_CREAT | O_TRUNC, 0644);
	int ofd = open(join(other, "dst"), O_RDWR | O_CREAT | O_TRUNC, 0644);
	EXPECT(fd >= 0 && src >= 0 && ofd >= 0 && write(src, buf, sizeof(buf)) == (ssize_t)sizeof(buf), "setup");
	loff_t off = 0;
	EXPECT(copy_file_range(src, &off, fd, NULL, 300, 0) == 100, "copy_file_range crossing 100 bytes is cut short");
	int fds[] = {fd, ofd};
	for (int k = 0; k < 2; k++) {
		int f = fds[k];
		const char *where = k ? "elsewhere" : "checkpoint";
		int want = k ? 0 : ENOSPC;
		struct iovec iov = {buf, 10};
#define CHECK(call, what)                                                                                  \
	do {                                                                                               \
		errno = 0;                                                                                 \
		long r_ = (long)(call);                                                                    \
		EXPECT(want ? r_ == -1 && errno == want : r_ >= 0, "%s %s: %s", what, where,                \
		       want ? "ENOSPC" : "works");                                                         \
	} while (0)
		CHECK(ftruncate(f, 10), "ftruncate");
		CHECK(ftruncate64(f, 10), "ftruncate64");
		CHECK(truncate(join(k ? other : ckpt, k ? "dst" : "m.pt"), 20), "truncate");
		CHECK(fallocate(f, 0, 0, 4096), "fallocate");
		CHECK(fallocate64(f, 0, 0, 4096), "fallocate64");
		CHECK(pwritev2(f, &iov, 1, 0, 0), "pwritev2");
		CHECK(pwritev2(f, &iov, 1, -1, 0), "pwritev2 at the file offset");
		CHECK(pwritev64v2(f, &iov, 1, 0, 0), "pwritev64v2");
		CHECK(pwritev64(f, &iov, 1, 0), "pwritev64");
		CHECK(pwrite64(f, buf, 10, 0), "pwrite64");
		CHECK(fdatasync(f), "fdatasync");
		off = 0;
		CHECK(copy_file_range(src, &off, f, NULL, 10, 0), "copy_file_range");
		off = 0;
		CHECK(sendfile(f, src, &off, 10), "sendfile");
		CHECK(sendfile64(f, src, NULL, 10), "sendfile64");
		CHECK(try_map(f, PROT_READ | PROT_WRITE, MAP_SHARED), "mmap PROT_WRITE MAP_SHARED");
		CHECK(try_map(f, PROT_WRITE, MAP_SHARED_VALIDATE), "mmap PROT_WRITE MAP_SHARED_VALIDATE");
		errno = 0;
		void *map = mmap64(NULL, 4096, PROT_WRITE, MAP_SHARED, f, 0);
		EXPECT(want ? map == MAP_FAILED && errno == want : map != MAP_FAILED, "mmap64 %s", where);
		if (map != MAP_FAILED)
			munmap(map, 4096);
		errno = 0;
		int e = posix_fallocate(f, 0, 8192);
		EXPECT(e == want && errno == 0, "posix_fallocate %s returns %s, errno untouched (%d)", where,
		       want ? "ENOSPC" : "0", e);
		e = posix_fallocate64(f, 0, 8192);
		EXPECT(e == want, "posix_fallocate64 %s returns %s (%d)", where, want ? "ENOSPC" : "0", e);
		/* Reads stay: enospc fails writes only; a private mapping writes nothing back. */
		EXPECT(try_map(f, PROT_READ, MAP_SHARED) == 0, "mmap PROT_READ MAP_SHARED %s", where);
		EXPECT(try_map(f, PROT_READ | PROT_WRITE, MAP_PRIVATE) == 0, "mmap MAP_PRIVATE %s", where);
		off = 0;
		EXPECT(sendfile(ofd, f, &off, 5) >= 0, "sendfile from %s (a read)", where);
#undef CHECK
	}
	close(src);
	close(ofd);
	close(fd);
	other_dir_untouched(other);
}

/* The same calls reading from a checkpoint file: eio fails them. */
static void read_calls(const char *ckpt, const char *other)
{
	/* SLURM_CHAOS_IO_FAULT=eio, AFTER_BYTES=10 */
	int fd = open(join(ckpt, "a.pt"), O_RDWR);
	int ofd = open(join(other, "dst"), O_RDWR | O_CREAT | O_TRUNC, 0644);
	EXPECT(fd >= 0 && ofd >= 0 && write(fd, buf, 10) == 10, "10 bytes: the fault starts");
	struct iovec iov = {buf, 10};
	off_t off = 0;
	errno = 0;
	EXPECT(sendfile(ofd, fd, &off, 5) == -1 && errno == EIO, "sendfile from a checkpoint: EIO");
	errno = 0;
	EXPECT(copy_file_range(fd, NULL, ofd, NULL, 5, 0) == -1 && errno == EIO, "copy_file_range from: EIO");
	errno = 0;
	EXPECT(mmap(NULL, 4096, PROT_READ, MAP_PRIVATE, fd, 0) == MAP_FAILED && errno == EIO, "mmap to read: EIO");
	errno = 0;
	EXPECT(preadv(fd, &iov, 1, 0) == -1 && errno == EIO, "preadv: EIO");
	errno = 0;
	EXPECT(preadv2(fd, &iov, 1, 0, 0) == -1 && errno == EIO, "preadv2: EIO");
	EXPECT(pwrite(ofd, buf, 10, 0) == 10 && sendfile(ofd, ofd, &off, 0) >= 0, "elsewhere works");
	close(ofd);
	close(fd);
	other_dir_untouched(other);
}

#define SENTINEL 4242 /* no errno libc sets: a call that succeeds must leave it as it was */
#define KEEPS_ERRNO(call, what)                                                                    \
	do {                                                                                       \
		errno = SENTINEL;                                                                  \
		long r_ = (long)(call);                                                            \
		EXPECT(r_ >= 0 && errno == SENTINEL, "%s succeeds and keeps errno (got %ld, errno %d)", \
		       what, r_, errno);                                                           \
	} while (0)

/* The wrappers' own lookups (realpath, readlink, fstat) must not show through on success. */
static void errno_kept(const char *ckpt, const char *other)
{
	/* SLURM_CHAOS_IO_FAULT=enospc, AFTER_BYTES=1000000: configured, not yet active */
	int fd, ofd, dirfd;
	KEEPS_ERRNO(fd = open(join(ckpt, "e.pt"), O_WRONLY | O_CREAT | O_TRUNC, 0644), "open in the directory");
	KEEPS_ERRNO(ofd = open(join(other, "new.txt"), O_RDWR | O_CREAT | O_TRUNC, 0644), "open elsewhere");
	KEEPS_ERRNO(dirfd = open(other, O_RDONLY | O_DIRECTORY), "open a directory");
	KEEPS_ERRNO(close(openat(dirfd, "rel.txt", O_WRONLY | O_CREAT, 0644)), "openat elsewhere");
	KEEPS_ERRNO(write(fd, buf, 10), "write");
	KEEPS_ERRNO(pwrite(fd, buf, 10, 0), "pwrite");
	struct iovec iov = {buf, 10};
	KEEPS_ERRNO(writev(fd, &iov, 1), "writev");
	KEEPS_ERRNO(fsync(fd), "fsync");
	KEEPS_ERRNO(ftruncate(fd, 5), "ftruncate");
	KEEPS_ERRNO(write(ofd, buf, 10), "write elsewhere");
	KEEPS_ERRNO(mmap(NULL, 10, PROT_READ, MAP_SHARED, ofd, 0) == MAP_FAILED ? -1 : 0, "mmap elsewhere");
	int d;
	KEEPS_ERRNO(d = dup(fd), "dup");
	KEEPS_ERRNO(close(d), "close a dup");
	KEEPS_ERRNO(d = fcntl(fd, F_DUPFD_CLOEXEC, 0), "fcntl F_DUPFD_CLOEXEC");
	KEEPS_ERRNO(close(d), "close");
	KEEPS_ERRNO(rename(join(other, "new.txt"), join(other, "renamed.txt")), "rename elsewhere");
	KEEPS_ERRNO(rename(join(ckpt, "e.pt"), join(ckpt, "f.pt")), "rename in the directory");
	KEEPS_ERRNO(link(join(other, "renamed.txt"), join(other, "linked.txt")), "link elsewhere");
	KEEPS_ERRNO(mkdir(join(other, "sub"), 0755), "mkdir elsewhere");
	KEEPS_ERRNO(mkdir(join(ckpt, "sub"), 0755), "mkdir in the directory");
	FILE *f;
	KEEPS_ERRNO((f = fopen(join(other, "s.txt"), "w")) ? 0 : -1, "fopen elsewhere");
	if (f)
		fclose(f);
	KEEPS_ERRNO((f = fopen(join(ckpt, "s.pt"), "w")) ? 0 : -1, "fopen in the directory");
	if (f)
		fclose(f);
	KEEPS_ERRNO(close(fd), "close");
	KEEPS_ERRNO(close(ofd), "close elsewhere");
	close(dirfd);
	other_dir_untouched(other);
}

static void on_alarm(int sig)
{
	(void)sig;
}

/* A held write that a signal interrupts, then proceeds: EINTR inside the hold is not the call's. */
static void errno_hang(const char *ckpt, const char *other)
{
	/* SLURM_CHAOS_IO_FAULT=hang, AFTER_BYTES=10, HOLD_S=1 */
	struct sigaction sa = {.sa_handler = on_alarm}; /* no SA_RESTART: nanosleep sees EINTR */
	sigaction(SIGALRM, &sa, NULL);
	int fd = open_ckpt(ckpt, "h.pt");
	EXPECT(write(fd, buf, 10) == 10, "10 bytes: the fault starts");
	int err = dup(2);
	close(2); /* the shim's notice to stderr fails (EBADF) on the call that starts the hold */
	ualarm(300 * 1000, 0);
	errno = SENTINEL;
	ssize_t r = write(fd, buf, 5);
	int e = errno;
	dup2(err, 2);
	close(err);
	EXPECT(r == 5 && e == SENTINEL, "a held write proceeds and keeps errno (got %zd, errno %d)", r, e);
	close(fd);
	other_dir_untouched(other);
}

/*
 * A preinit function runs before libc is set up (environ is still NULL there): a wrapped call made
 * there must work, and must not leave the shim configured from an empty environment.
 */
static void early_io(int argc, char **argv, char **envp)
{
	(void)envp;
	if (argc > 1 && !strcmp(argv[1], "preinit")) {
		int fd = open("/dev/null", O_WRONLY);
		if (fd < 0 || write(fd, "x", 1) != 1 || close(fd) != 0)
			_exit(98);
	}
}
__attribute__((section(".preinit_array"), used)) static void (*const preinit)(int, char **, char **) = early_io;

/* First calls from many threads at once: one initialisation, every thread sees the fault. */
#define THREADS 8
static pthread_barrier_t start;
static const char *thread_ckpt;

static void *first_calls(void *arg)
{
	char name[32];
	snprintf(name, sizeof(name), "t%ld.pt", (long)(intptr_t)arg);
	pthread_barrier_wait(&start);
	int fd = open(join(thread_ckpt, name), O_WRONLY | O_CREAT | O_TRUNC, 0644);
	long ok = fd >= 0 && write(fd, buf, 100) == 100;
	close(fd);
	return (void *)ok;
}

static void threads(const char *ckpt, const char *other)
{
	/* SLURM_CHAOS_IO_FAULT=enospc, AFTER_BYTES=1000 */
	pthread_t t[THREADS];
	thread_ckpt = ckpt;
	pthread_barrier_init(&start, NULL, THREADS);
	for (long k = 0; k < THREADS; k++)
		pthread_create(&t[k], NULL, first_calls, (void *)(intptr_t)k);
	for (int k = 0; k < THREADS; k++) {
		void *ok;
		pthread_join(t[k], &ok);
		EXPECT(ok, "thread %d: open and 100 bytes before the threshold", k);
	}
	int fd = open_ckpt(ckpt, "last.pt");
	EXPECT(write(fd, buf, 300) == 200, "800 bytes from the threads counted: 200 left");
	EXPECT_FAULTED(fd, "after the threads");
	close(fd);
	other_dir_untouched(other);
}

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: test_io SCENARIO CKPT_DIR OTHER_DIR\n");
		return 2;
	}
	memset(buf, 'x', sizeof(buf));
	const char *s = argv[1];
	if (!strcmp(s, "enospc") || !strcmp(s, "reenter") || !strcmp(s, "preinit"))
		enospc(argv[2], argv[3]);
	else if (!strcmp(s, "stdio_fileno"))
		stdio_fileno(argv[2], argv[3]);
	else if (!strcmp(s, "threads"))
		threads(argv[2], argv[3]);
	else if (!strcmp(s, "eio"))
		eio(argv[2], argv[3]);
	else if (!strcmp(s, "hang"))
		hang(argv[2], argv[3]);
	else if (!strcmp(s, "stdio"))
		stdio_enospc(argv[2], argv[3]);
	else if (!strcmp(s, "after"))
		after_seconds(argv[2], argv[3]);
	else if (!strcmp(s, "passive"))
		passive(argv[2], argv[3]);
	else if (!strcmp(s, "socket_dirfd"))
		socket_dirfd(argv[2], argv[3]);
	else if (!strcmp(s, "fd_reuse"))
		fd_reuse(argv[2], argv[3]);
	else if (!strcmp(s, "dup_fds"))
		dup_fds(argv[2], argv[3]);
	else if (!strcmp(s, "tmpfile"))
		tmpfile_and_links(argv[2], argv[3]);
	else if (!strcmp(s, "write_calls"))
		write_calls(argv[2], argv[3]);
	else if (!strcmp(s, "read_calls"))
		read_calls(argv[2], argv[3]);
	else if (!strcmp(s, "errno_kept"))
		errno_kept(argv[2], argv[3]);
	else if (!strcmp(s, "errno_hang"))
		errno_hang(argv[2], argv[3]);
	else if (!strcmp(s, "high_fds"))
		high_fds(argv[2], argv[3]);
	else
		return 2;
	if (skipped && !failures)
		return 0;
#ifdef __SANITIZE_ADDRESS__
	printf("san %s: %s\n", s, failures ? "FAILED" : "ok"); /* the shim linked in, under ASan+UBSan */
#else
	printf("%s: %s\n", s, failures ? "FAILED" : "ok");
#endif
	return failures ? 1 : 0;
}
