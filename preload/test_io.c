/*
 * Checks libslurm_chaos_io.so from the outside: run under LD_PRELOAD with the SLURM_CHAOS_IO_*
 * variables that run_tests.sh sets, one scenario per run: test_io SCENARIO CKPT_DIR OTHER_DIR.
 * Exits 0 when every expectation of the scenario held; prints each failed one.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

static int failures;
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

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: test_io SCENARIO CKPT_DIR OTHER_DIR\n");
		return 2;
	}
	memset(buf, 'x', sizeof(buf));
	const char *s = argv[1];
	if (!strcmp(s, "enospc"))
		enospc(argv[2], argv[3]);
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
	else
		return 2;
#ifdef __SANITIZE_ADDRESS__
	printf("san %s: %s\n", s, failures ? "FAILED" : "ok"); /* the shim linked in, under ASan+UBSan */
#else
	printf("%s: %s\n", s, failures ? "FAILED" : "ok");
#endif
	return failures ? 1 : 0;
}
