#define _GNU_SOURCE
#include "sc_fdmark.h"

#include <errno.h>
#include <limits.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define LEAF_BITS 10
#define MID_BITS 10
#define LEAF_SIZE (1u << LEAF_BITS)
#define MID_SIZE (1u << MID_BITS)
#define TOP_SIZE (((unsigned)INT_MAX >> (LEAF_BITS + MID_BITS)) + 1)

struct mark {
	atomic_int on;
	_Atomic dev_t dev;
	_Atomic ino_t ino;
};

struct leaf {
	struct mark m[LEAF_SIZE];
};

struct mid {
	_Atomic(struct leaf *) leaf[MID_SIZE];
};

static _Atomic(struct mid *) top[TOP_SIZE];

/* Zeroed pages straight from the kernel: no allocator, async-signal-safe; errno left as it was. */
static void *pages(size_t size)
{
	int saved = errno;
	void *p = (void *)syscall(SYS_mmap, NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	errno = saved;
	return p == MAP_FAILED ? NULL : p;
}

static void unpages(void *p, size_t size)
{
	int saved = errno;
	syscall(SYS_munmap, p, size);
	errno = saved;
}

static struct mid *mid_of(unsigned fd, int create)
{
	_Atomic(struct mid *) *slot = &top[fd >> (LEAF_BITS + MID_BITS)];
	struct mid *p = atomic_load_explicit(slot, memory_order_acquire);
	if (p || !create)
		return p;
	struct mid *fresh = pages(sizeof(*fresh));
	if (!fresh)
		return NULL;
	if (atomic_compare_exchange_strong(slot, &p, fresh))
		return fresh;
	unpages(fresh, sizeof(*fresh)); /* another thread was first: p is its page */
	return p;
}

static struct leaf *leaf_of(struct mid *mid, unsigned fd, int create)
{
	_Atomic(struct leaf *) *slot = &mid->leaf[(fd >> LEAF_BITS) & (MID_SIZE - 1)];
	struct leaf *p = atomic_load_explicit(slot, memory_order_acquire);
	if (p || !create)
		return p;
	struct leaf *fresh = pages(sizeof(*fresh));
	if (!fresh)
		return NULL;
	if (atomic_compare_exchange_strong(slot, &p, fresh))
		return fresh;
	unpages(fresh, sizeof(*fresh));
	return p;
}

static struct mark *mark_of(int fd, int create)
{
	if (fd < 0)
		return NULL;
	struct mid *mid = mid_of((unsigned)fd, create);
	struct leaf *leaf = mid ? leaf_of(mid, (unsigned)fd, create) : NULL;
	return leaf ? &leaf->m[(unsigned)fd & (LEAF_SIZE - 1)] : NULL;
}

int sc_mark_set(int fd, dev_t dev, ino_t ino)
{
	struct mark *m = mark_of(fd, 1);
	if (!m)
		return -1;
	atomic_store_explicit(&m->on, 0, memory_order_relaxed);
	atomic_store_explicit(&m->dev, dev, memory_order_relaxed);
	atomic_store_explicit(&m->ino, ino, memory_order_relaxed);
	atomic_store_explicit(&m->on, 1, memory_order_release);
	return 0;
}

int sc_mark_get(int fd, dev_t *dev, ino_t *ino)
{
	struct mark *m = mark_of(fd, 0);
	if (!m || !atomic_load_explicit(&m->on, memory_order_acquire))
		return 0;
	*dev = atomic_load_explicit(&m->dev, memory_order_relaxed);
	*ino = atomic_load_explicit(&m->ino, memory_order_relaxed);
	return 1;
}

void sc_mark_clear(int fd)
{
	struct mark *m = mark_of(fd, 0);
	if (m)
		atomic_store_explicit(&m->on, 0, memory_order_release);
}

void sc_mark_clear_range(unsigned int lo, unsigned int hi)
{
	if (lo > (unsigned)INT_MAX)
		return;
	if (hi > (unsigned)INT_MAX)
		hi = (unsigned)INT_MAX;
	/* Only the pages that exist: a closefrom(3) walks what was ever marked, not 2^31 fds. */
	for (unsigned t = lo >> (LEAF_BITS + MID_BITS); t <= hi >> (LEAF_BITS + MID_BITS); t++) {
		struct mid *mid = atomic_load_explicit(&top[t], memory_order_acquire);
		if (!mid)
			continue;
		for (unsigned l = 0; l < MID_SIZE; l++) {
			unsigned first = (t << (LEAF_BITS + MID_BITS)) | (l << LEAF_BITS);
			unsigned last = first + (LEAF_SIZE - 1);
			struct leaf *leaf = atomic_load_explicit(&mid->leaf[l], memory_order_acquire);
			if (!leaf || last < lo || first > hi)
				continue;
			for (unsigned fd = first > lo ? first : lo; fd <= last && fd <= hi; fd++)
				atomic_store_explicit(&leaf->m[fd & (LEAF_SIZE - 1)].on, 0, memory_order_release);
		}
	}
}
