/*
 * Fuzz target for the shim's path normaliser (sc_path.c), libFuzzer entry point.
 *
 * Built with clang -fsanitize=fuzzer,address,undefined where clang exists; otherwise fuzz_driver.c
 * feeds it deterministic random inputs under gcc -fsanitize=address,undefined. The input is
 * "BASE\0REL" (no NUL: REL alone, no base). Besides "no overflow", every answer is checked against
 * a plain reference implementation, and every output buffer is exactly `cap` bytes on the heap, so
 * that one byte written past it is caught.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sc_path.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define REF_MAX 65536

/* The reference: split into segments on a stack of pointers, then join. */
static long reference(const char *base, const char *rel, char *out)
{
	static char work[2 * REF_MAX + 2];
	static const char *segs[REF_MAX];
	static size_t lens[REF_MAX];
	size_t n = 0;
	if (rel[0] != '/') {
		if (!base || base[0] != '/')
			return -1;
		snprintf(work, sizeof(work), "%s/%s", base, rel);
	} else {
		snprintf(work, sizeof(work), "%s", rel);
	}
	for (char *s = work; *s;) {
		while (*s == '/')
			s++;
		char *seg = s;
		while (*s && *s != '/')
			s++;
		size_t len = (size_t)(s - seg);
		if (len == 0 || (len == 1 && seg[0] == '.'))
			continue;
		if (len == 2 && !strncmp(seg, "..", 2)) {
			if (n)
				n--;
			continue;
		}
		segs[n] = seg;
		lens[n++] = len;
	}
	size_t o = 0;
	for (size_t i = 0; i < n; i++) {
		out[o++] = '/';
		memcpy(out + o, segs[i], lens[i]);
		o += lens[i];
	}
	if (!o)
		out[o++] = '/';
	out[o] = '\0';
	return (long)o;
}

static void check_normal_form(const char *p, long len)
{
	if (p[0] != '/' || (long)strlen(p) != len || strstr(p, "//") || strstr(p, "/./") || strstr(p, "/../"))
		abort();
	if (len > 1 && (p[len - 1] == '/' || !strcmp(p + len - 2, "/.") || (len > 2 && !strcmp(p + len - 3, "/.."))))
		abort();
}

static void check_under(const char *p, const char *dir)
{
	size_t n = strlen(dir);
	int want = !strcmp(dir, "/") || (!strncmp(p, dir, n) && (p[n] == '\0' || p[n] == '/'));
	if (sc_path_under(p, dir, n) != want)
		abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size > REF_MAX - 2)
		return 0;
	char *text = malloc(size + 2);
	if (!text)
		return 0;
	memcpy(text, data, size);
	text[size] = text[size + 1] = '\0';
	const char *rel = memchr(text, '\0', size) ? text + strlen(text) + 1 : text;
	const char *base = rel == text ? NULL : text;

	static char want[2 * REF_MAX + 2];
	long wlen = reference(base, rel, want);
	size_t caps[] = {1, 2, 3, 16, (size_t)(wlen > 0 ? wlen : 1), (size_t)(wlen > 0 ? wlen + 1 : 2), 4096, 2 * REF_MAX + 2};
	for (size_t i = 0; i < sizeof(caps) / sizeof(caps[0]); i++) {
		char *out = malloc(caps[i]);
		if (!out)
			break;
		long got = sc_path_resolve(base, rel, out, caps[i]);
		if (got >= 0) {
			/* A shorter buffer may refuse what fits in the end; an answer, though, is the answer. */
			if (wlen < 0 || got != wlen || strcmp(out, want))
				abort();
			check_normal_form(out, got);
			char again[4096];
			if (got < (long)sizeof(again) && (sc_path_resolve(NULL, out, again, sizeof(again)) != got || strcmp(again, out)))
				abort(); /* idempotent */
			check_under(out, "/");
			check_under(out, "/ckpt");
			if (base && base[0] == '/' && strlen(base) < 4096) {
				char dir[4096];
				long dl = sc_path_resolve(NULL, base, dir, sizeof(dir));
				if (dl > 0)
					check_under(out, dir);
			}
			sc_path_strip_deleted(out);
		} else if (caps[i] == 2 * REF_MAX + 2 && wlen >= 0) {
			abort(); /* a buffer big enough for the answer must give it */
		}
		free(out);
	}
	free(text);
	return 0;
}
