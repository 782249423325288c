/* affinity.c - CPU choice for numa-mismatch, from sysfs (see affinity.h). */
#include "affinity.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_NODES 64

static int read_cpulist(const char *path, uint64_t *mask)
{
	char buf[4096];
	FILE *fp = fopen(path, "re");
	int n = -1;

	if (!fp)
		return -1;
	if (fgets(buf, sizeof(buf), fp))
		n = chaos_parse_cpulist(buf, mask, CHAOS_MASK_WORDS);
	else
		n = chaos_parse_cpulist("", mask, CHAOS_MASK_WORDS);     /* empty file: no CPUs */
	fclose(fp);
	return n;
}

static int has(const uint64_t *m, long cpu)
{
	return (int)((m[cpu / 64] >> (cpu % 64)) & 1);
}

struct numa {
	int n;
	int id[MAX_NODES];
	uint64_t cpus[MAX_NODES][CHAOS_MASK_WORDS];
};

static int cmp_int(const void *a, const void *b)
{
	return *(const int *)a - *(const int *)b;
}

/* NUMA nodes that have CPUs, in id order. */
static void numa_nodes(const char *sysroot, struct numa *numa)
{
	char path[CHAOS_PATH_MAX + 64];
	int ids[MAX_NODES], n = 0;
	struct dirent *e;
	DIR *d;

	numa->n = 0;
	snprintf(path, sizeof(path), "%s/devices/system/node", sysroot);
	if (!(d = opendir(path)))
		return;
	while ((e = readdir(d)) && n < MAX_NODES) {
		int id;
		char tail;

		if (sscanf(e->d_name, "node%d%c", &id, &tail) == 1 && id >= 0)
			ids[n++] = id;
	}
	closedir(d);
	qsort(ids, (size_t)n, sizeof(ids[0]), cmp_int);
	for (int i = 0; i < n; i++) {
		snprintf(path, sizeof(path), "%s/devices/system/node/node%d/cpulist", sysroot, ids[i]);
		if (read_cpulist(path, numa->cpus[numa->n]) > 0)
			numa->id[numa->n++] = ids[i];
	}
}

static int pick_remote(const char *sysroot, const uint64_t *current, uint64_t *out, int *node)
{
	static struct numa numa;        /* 64 nodes x 512 bytes: off the stack */
	long first = -1;
	int local = 0;

	numa_nodes(sysroot, &numa);
	if (numa.n < 2)
		return -1;
	for (long c = 0; c < CHAOS_MAX_CPUS && first < 0; c++)
		if (has(current, c))
			first = c;
	for (int i = 0; i < numa.n; i++)
		if (first >= 0 && has(numa.cpus[i], first))
			local = i;
	memcpy(out, numa.cpus[(local + 1) % numa.n], sizeof(numa.cpus[0]));
	*node = numa.id[(local + 1) % numa.n];
	return 0;
}

static int pick_squeeze(const char *sysroot, long ncpus, uint64_t *out)
{
	uint64_t online[CHAOS_MASK_WORDS];
	char path[CHAOS_PATH_MAX + 64];

	snprintf(path, sizeof(path), "%s/devices/system/cpu/online", sysroot);
	if (read_cpulist(path, online) <= 0)
		return -1;
	memset(out, 0, sizeof(online));
	for (long c = CHAOS_MAX_CPUS - 1; c >= 0 && ncpus > 0; c--)
		if (has(online, c)) {
			out[c / 64] |= 1ULL << (c % 64);
			ncpus--;
		}
	return 0;
}

int chaos_pick_cpus(const char *sysroot, const char *mode, long ncpus, const uint64_t *current,
		    uint64_t *out, int *node, char *why, size_t whylen)
{
	*node = -1;
	if (strcmp(mode, "squeeze") && pick_remote(sysroot, current, out, node) == 0)
		return 0;
	if (!strcmp(mode, "remote")) {
		snprintf(why, whylen, "mode=remote needs 2 or more NUMA nodes with CPUs");
		return -1;
	}
	if (pick_squeeze(sysroot, ncpus, out)) {
		snprintf(why, whylen, "cannot read %s/devices/system/cpu/online", sysroot);
		return -1;
	}
	return 0;
}
