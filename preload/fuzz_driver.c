/*
 * Fallback fuzz driver when libFuzzer is not available: deterministic pseudo-random inputs (paths
 * built from the pieces below plus random bytes) into the same LLVMFuzzerTestOneInput, for SECONDS
 * seconds, built with -fsanitize=address,undefined.
 *
 *   fuzz_path [SECONDS [SEED]]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uint64_t state;

static uint64_t next(void)
{
	/* xorshift64*: reproducible from the seed alone */
	state ^= state >> 12;
	state ^= state << 25;
	state ^= state >> 27;
	return state * 2685821657736338717ULL;
}

static const char *const pieces[] = {
	"/", "//", ".", "..", "./", "../", "a", "ckpt", "/ckpt", "socket:[12345]", "pipe:[7]",
	"anon_inode:[eventfd]", " (deleted)", "x.pt", "/proc/self/fd/3", "\0",
};

static size_t build_input(uint8_t *buf, size_t cap)
{
	size_t len = 0;
	int parts = 1 + (int)(next() % 24);
	for (int i = 0; i < parts && len + 32 < cap; i++) {
		if (next() % 6 == 0) {
			buf[len++] = (uint8_t)(next() & 0xff);
			continue;
		}
		size_t k = next() % (sizeof(pieces) / sizeof(pieces[0]));
		size_t n = k == sizeof(pieces) / sizeof(pieces[0]) - 1 ? 1 : strlen(pieces[k]);
		memcpy(buf + len, pieces[k], n);
		len += n;
	}
	if (next() % 40 == 0) { /* now and then a long one, to reach the buffer limits */
		size_t target = 3000 + next() % 6000;
		while (len < target && len < cap)
			buf[len++] = (uint8_t)"a/.."[next() % 4];
	}
	return len;
}

int main(int argc, char **argv)
{
	static uint8_t buf[16384];
	double seconds = argc > 1 ? atof(argv[1]) : 5.0;
	unsigned long long seed = argc > 2 ? strtoull(argv[2], NULL, 10) : 1;
	time_t start = time(NULL);
	unsigned long long runs = 0;

	state = seed ? seed : 1;
	while (difftime(time(NULL), start) < seconds) {
		for (int i = 0; i < 1000; i++, runs++)
			LLVMFuzzerTestOneInput(buf, build_input(buf, sizeof(buf)));
	}
	printf("fuzz-driver: %llu inputs in %.0f s, seed %llu, no failure\n", runs, seconds, seed);
	return 0;
}
