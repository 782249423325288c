/*
 * Unit test of the fd mark table (sc_fdmark.c) under ASan+UBSan: every fd number up to INT_MAX,
 * range clears across pages, and threads racing to allocate the same pages.
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>

#include "sc_fdmark.h"

static int failures;

#define EXPECT(cond, ...)                                                                          \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                       \
			fprintf(stderr, __VA_ARGS__);                                              \
			fprintf(stderr, "\n");                                                     \
			failures++;                                                                \
		}                                                                                  \
	} while (0)

static const int fds[] = {0, 1, 1023, 1024, 65535, 65536, 70000, 1 << 20, (1 << 20) + 1, INT_MAX - 1, INT_MAX};
#define NFDS (sizeof(fds) / sizeof(fds[0]))

static int marked(int fd, dev_t dev, ino_t ino)
{
	dev_t d;
	ino_t i;
	return sc_mark_get(fd, &d, &i) && d == dev && i == ino;
}

static void every_fd_number(void)
{
	dev_t d;
	ino_t i;
	for (size_t k = 0; k < NFDS; k++) {
		EXPECT(!sc_mark_get(fds[k], &d, &i), "fd %d unmarked at first", fds[k]);
		EXPECT(sc_mark_set(fds[k], 7, (ino_t)fds[k] + 1) == 0, "mark fd %d", fds[k]);
	}
	for (size_t k = 0; k < NFDS; k++)
		EXPECT(marked(fds[k], 7, (ino_t)fds[k] + 1), "fd %d keeps its own identity", fds[k]);
	EXPECT(sc_mark_set(-1, 1, 1) == -1 && !sc_mark_get(-1, &d, &i), "no mark for a negative fd");
	sc_mark_clear(-5);
	sc_mark_clear(65536);
	EXPECT(!sc_mark_get(65536, &d, &i) && marked(65535, 7, 65536) && marked(70000, 7, 70001), "clear one");
}

static void range_clears(void)
{
	for (size_t k = 0; k < NFDS; k++)
		sc_mark_set(fds[k], 1, 1);
	sc_mark_clear_range(1024, 70000); /* across leaves */
	EXPECT(marked(1023, 1, 1) && marked(1 << 20, 1, 1), "outside the range kept");
	EXPECT(!marked(1024, 1, 1) && !marked(65535, 1, 1) && !marked(65536, 1, 1) && !marked(70000, 1, 1),
	       "inside the range cleared");
	sc_mark_clear_range(1 << 20, 1 << 20); /* one fd */
	EXPECT(!marked(1 << 20, 1, 1) && marked((1 << 20) + 1, 1, 1), "a range of one");
	sc_mark_clear_range(5, 2); /* empty */
	EXPECT(marked(1, 1, 1), "an empty range clears nothing");
	sc_mark_clear_range(2, ~0U); /* closefrom(2) */
	EXPECT(marked(0, 1, 1) && marked(1, 1, 1), "below closefrom kept");
	EXPECT(!marked(1023, 1, 1) && !marked(INT_MAX, 1, 1) && !marked(INT_MAX - 1, 1, 1), "closefrom to the end");
	sc_mark_clear_range((unsigned)INT_MAX + 1, ~0U); /* no fd there: nothing to do, no overrun */
	sc_mark_clear_range(0, ~0U);
	EXPECT(!marked(0, 1, 1) && !marked(1, 1, 1), "everything");
}

static void *racer(void *arg)
{
	int base = *(int *)arg;
	for (int round = 0; round < 50; round++)
		for (int fd = base; fd < base + 3000; fd += 7) {
			sc_mark_set(fd, (dev_t)round, (ino_t)fd);
			if (!marked(fd, (dev_t)round, (ino_t)fd))
				return (void *)1;
		}
	return NULL;
}

static void racing_threads(void)
{
	/* Four threads over the same fresh pages (the 3 << 20 block), each on its own fds. */
	int bases[4] = {3 << 20, (3 << 20) + 1, (3 << 20) + 2, (3 << 20) + 3};
	pthread_t t[4];
	for (int k = 0; k < 4; k++)
		pthread_create(&t[k], NULL, racer, &bases[k]);
	for (int k = 0; k < 4; k++) {
		void *r;
		pthread_join(t[k], &r);
		EXPECT(r == NULL, "thread %d saw its own marks", k);
	}
}

int main(void)
{
	errno = 1234;
	every_fd_number();
	range_clears();
	EXPECT(errno == 1234, "errno untouched by the table (%d)", errno);
	racing_threads();
	printf("fdmark: %d failures\n", failures);
	return failures != 0;
}
