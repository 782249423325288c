/*
 * affinity.h - which CPUs a numa-mismatch task is bound to (no spank.h, testable on fake sysfs).
 */
#ifndef SLURM_CHAOS_AFFINITY_H
#define SLURM_CHAOS_AFFINITY_H

#include <stddef.h>
#include <stdint.h>

#include "parse.h"

#define CHAOS_MASK_WORDS (CHAOS_MAX_CPUS / 64)

/*
 * Choose the wrong CPU set for a task whose current affinity is `current`.
 *   mode "remote": the CPUs of a NUMA node other than the one holding the task's first CPU
 *                  (*node = that node, for set_mempolicy); needs 2+ NUMA nodes with CPUs.
 *   mode "squeeze": the last `ncpus` online CPUs (*node = -1): all local ranks on a few cores.
 *   mode "auto": remote where possible, else squeeze.
 * sysroot is "/sys" on a real node. Returns 0, or -1 with the reason in why.
 */
int chaos_pick_cpus(const char *sysroot, const char *mode, long ncpus, const uint64_t *current,
		    uint64_t *out, int *node, char *why, size_t whylen);

#endif
