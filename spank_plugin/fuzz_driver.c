/*
 * Fallback fuzz driver when libFuzzer is not available: deterministic pseudo-random inputs
 * (mutations of valid SPECs from the catalogue plus random bytes) into the same
 * LLVMFuzzerTestOneInput, for FUZZ_SECONDS seconds, built with -fsanitize=address,undefined.
 *
 *   fuzz-driver [SECONDS [SEED]]
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "parse.h"

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
	"+", ":", ",", "=", "%", "ms", "s", "m", "h", "K", "Ki", "G", "B", ".", "-", "0", "1", "99",
	"100", "4096", "123456789012345678901", "on", "off", "/ckpt", "*", "\n", "0-3", "1,2",
	"allow_users=", "journal_dir=/x", "require_exclusive=1", " ", "job_interface=\"eth0\"",
	"until=", "submit=",
};

static size_t build_input(uint8_t *buf, size_t cap)
{
	size_t nf, len = 0;
	const struct chaos_fault_def *cat = chaos_catalogue(&nf);
	int parts = 1 + (int)(next() % 12);

	for (int i = 0; i < parts && len + 64 < cap; i++) {
		const char *s;
		switch (next() % 5) {
		case 0:
			s = cat[next() % nf].name;
			break;
		case 1: {
			const struct chaos_fault_def *f = &cat[next() % nf];
			s = f->keys[next() % f->nkeys].name;
			break;
		}
		case 2:
			buf[len++] = (uint8_t)(next() & 0xff);
			continue;
		default:
			s = pieces[next() % (sizeof(pieces) / sizeof(pieces[0]))];
		}
		size_t n = strlen(s);
		memcpy(buf + len, s, n);
		len += n;
	}
	if (next() % 50 == 0) {          /* now and then a long input, to reach the length limits */
		size_t target = 4000 + next() % 200;
		while (len < target && len < cap)
			buf[len++] = "ab+:,="[next() % 6];
	}
	return len;
}

int main(int argc, char **argv)
{
	static uint8_t buf[8192];
	double seconds = argc > 1 ? atof(argv[1]) : 5.0;
	unsigned long long seed = argc > 2 ? strtoull(argv[2], NULL, 10) : 1;
	time_t start = time(NULL);
	unsigned long long runs = 0;

	state = seed ? seed : 1;
	while (difftime(time(NULL), start) < seconds) {
		for (int i = 0; i < 1000; i++, runs++) {
			size_t n = build_input(buf, sizeof(buf));
			LLVMFuzzerTestOneInput(buf, n);
		}
	}
	printf("fuzz-driver: %llu inputs in %.0f s, seed %llu, no failure\n", runs, seconds, seed);
	return 0;
}
