/*
 * A getenv() that does I/O, as a preloaded library (an allocator, a profiler) may: the shim reads
 * its configuration with getenv, so each wrapped call below re-enters the shim while it
 * initialises. Preloaded before the shim (reenter.so) or linked into test_io_reenter_san.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef REENTER_EXPORT
#define REENTER_EXPORT __attribute__((visibility("default")))
#endif

static int depth;

static void some_io(void)
{
	char c = 'x';
	int fd = open("/dev/null", O_RDWR);
	if (fd < 0 || write(fd, &c, 1) != 1 || read(fd, &c, 1) != 0 || pwrite(fd, &c, 1, 0) != 1)
		_exit(97);
	int d = fcntl(fd, F_DUPFD_CLOEXEC, 0);
	if (d < 0 || dup2(fd, d) != d || close(d) != 0 || fsync(fd) == 0 /* EINVAL on /dev/null */)
		_exit(97);
	void *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (m == MAP_FAILED || munmap(m, 4096) != 0 || close(fd) != 0)
		_exit(97);
	FILE *f = fopen("/dev/null", "r");
	if (!f || fclose(f) != 0)
		_exit(97);
}

REENTER_EXPORT char *getenv(const char *name)
{
	if (!depth++)
		some_io();
	depth--;
	size_t n = strlen(name);
	for (char **e = environ; e && *e; e++)
		if (!strncmp(*e, name, n) && (*e)[n] == '=')
			return *e + n + 1;
	return NULL;
}
