/*
 * Lexical path arithmetic for the I/O shim: pure string functions, free of the wrapped libc calls,
 * so that they are unit-tested and fuzzed on their own (fuzz_path.c).
 */
#ifndef SC_PATH_H
#define SC_PATH_H

#include <stddef.h>

/*
 * Joins `rel` onto `base` and normalises the result: absolute, no "//", "/./" or "/../" left, no
 * trailing '/' (except the root itself). An absolute `rel` ignores `base`. Returns the length written
 * to `out` (NUL-terminated), or -1 when there is no absolute answer that fits in `cap` bytes: `base`
 * is needed but not absolute (an openat base such as "socket:[123]") or the result is too long.
 * Never writes past out[cap - 1]. ".." is taken lexically, as the kernel does not; callers that care
 * about symlinks compare real paths as well.
 */
long sc_path_resolve(const char *base, const char *rel, char *out, size_t cap);

/* Is the normalised `path` the directory `dir` (normalised, `len` bytes) or below it? */
int sc_path_under(const char *path, const char *dir, size_t len);

/* Cuts the " (deleted)" that /proc/self/fd/N adds to an unlinked file's path (O_TMPFILE, unlink). */
void sc_path_strip_deleted(char *path);

#endif
