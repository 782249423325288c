/*
 * Which fds are open on checkpoint files: a mark per fd number, holding the file's identity
 * (st_dev, st_ino) taken when the shim saw it opened. Covers every fd number (0..INT_MAX) in a
 * three-level table whose pages are allocated on first use with mmap(2) (no malloc: the wrappers
 * run in signal handlers and under preloaded allocators). Lock-free; a mark is one fd's, so races
 * on the same fd number are the program's own (it reuses an fd another thread still uses).
 */
#ifndef SC_FDMARK_H
#define SC_FDMARK_H

#include <sys/types.h>

/* Marks `fd` as the file (dev, ino). 0, or -1 when the table's page could not be allocated. */
int sc_mark_set(int fd, dev_t dev, ino_t ino);

/* 1 and the identity when `fd` is marked, else 0. */
int sc_mark_get(int fd, dev_t *dev, ino_t *ino);

void sc_mark_clear(int fd);

/* Clears every mark in [lo, hi] (close_range, closefrom); hi may exceed INT_MAX. */
void sc_mark_clear_range(unsigned int lo, unsigned int hi);

#endif
