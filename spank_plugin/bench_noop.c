/*
 * bench-noop: the plugin's own cost on the no-op path (no --chaos), outside Slurm.
 *
 * Loads a SPANK plugin with dlopen and runs the callbacks a step runs (init, init_post_opt,
 * user_init, task_init), against stub spank_* functions, then unloads it; N times. Printed
 * per round in microseconds, for build/slurm_chaos.so and for a do-nothing plugin, so the
 * step-launch benchmark's A/B difference can be attributed.
 *
 *   bench-noop PLUGIN.so [ROUNDS] [ARGS...]
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include <slurm/spank.h>

/* --- stubs for what slurmstepd/srun provide ------------------------------------------------ */
static spank_context_t ctx = S_CTX_REMOTE;
spank_context_t spank_context(void) { return ctx; }
spank_err_t spank_option_register(spank_t sp, struct spank_option *opt) { return ESPANK_SUCCESS; }
spank_err_t spank_getenv(spank_t sp, const char *var, char *buf, int len) { return ESPANK_ENV_NOEXIST; }
spank_err_t spank_setenv(spank_t sp, const char *var, const char *val, int ow) { return ESPANK_SUCCESS; }
spank_err_t spank_job_control_setenv(spank_t sp, const char *n, const char *v, int ow) { return ESPANK_SUCCESS; }
spank_err_t spank_get_item(spank_t sp, spank_item_t item, ...) { return ESPANK_SUCCESS; }
int spank_remote(spank_t sp) { return ctx == S_CTX_REMOTE; }
void slurm_info(const char *f, ...) { (void)f; }
void slurm_error(const char *f, ...) { (void)f; }
void slurm_verbose(const char *f, ...) { (void)f; }
void slurm_debug(const char *f, ...) { (void)f; }

typedef int (*spank_fn)(spank_t, int, char **);

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static void call(void *h, const char *name, int ac, char **av)
{
	spank_fn fn = (spank_fn)dlsym(h, name);

	if (fn && fn(NULL, ac, av) < 0) {
		fprintf(stderr, "%s failed\n", name);
		exit(1);
	}
}

int main(int argc, char **argv)
{
	const char *steps[] = { "slurm_spank_init", "slurm_spank_init_post_opt", "slurm_spank_user_init",
				"slurm_spank_task_init" };
	int rounds = argc > 2 ? atoi(argv[2]) : 2000;
	double start, total_load = 0, total_calls = 0;

	if (argc < 2) {
		fprintf(stderr, "usage: bench-noop PLUGIN.so [ROUNDS] [ARGS...]\n");
		return 2;
	}
	for (int i = 0; i < rounds; i++) {
		void *h;
		double t;

		start = now_us();
		h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
		if (!h) {
			fprintf(stderr, "dlopen: %s\n", dlerror());
			return 1;
		}
		t = now_us();
		total_load += t - start;
		for (size_t s = 0; s < sizeof(steps) / sizeof(steps[0]); s++)
			call(h, steps[s], argc > 3 ? argc - 3 : 0, argv + 3);
		total_calls += now_us() - t;
		dlclose(h);
	}
	printf("%s: dlopen %.1f us, callbacks %.2f us per step (%d rounds)\n", argv[1], total_load / rounds,
	       total_calls / rounds, rounds);
	return 0;
}
