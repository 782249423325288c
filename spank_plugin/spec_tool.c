/*
 * chaos-spec: run the C SPEC parser from the command line.
 *
 *   chaos-spec SPEC...        print the canonical SPEC, or "error: <message>" (exit 1)
 *   chaos-spec -e SPEC        print the SLURM_CHAOS_* variables the plugin would set
 *   chaos-spec -a ARG...      parse plugstack.conf arguments: "ok" or "error: <message>"
 *   chaos-spec -n SYSROOT MODE NCPUS CURRENT
 *                             the CPUs numa-mismatch would pick: "cpus=<list> node=<n>"
 *
 * Used by the Python tests to hold parse.c and spec.py to the same grammar.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "affinity.h"
#include "parse.h"

#define ERR_MAX (3 * CHAOS_SPEC_MAX)

static int print_env(const struct chaos_spec *spec)
{
	char name[256];

	for (size_t i = 0; i < spec->n; i++) {
		const struct chaos_request *r = &spec->req[i];

		for (size_t k = 0; k < r->def->nkeys; k++) {
			if (!r->values[k].set)
				continue;
			if (chaos_env_name(r->def->name, r->def->keys[k].name, name, sizeof(name)))
				return 1;
			printf("%s=%s\n", name, r->values[k].text);
		}
	}
	return 0;
}

int main(int argc, char **argv)
{
	static struct chaos_spec spec;
	static char err[ERR_MAX], out[2 * CHAOS_SPEC_MAX];
	int env = argc > 1 && !strcmp(argv[1], "-e");
	int rc = 0;

	if (argc == 6 && !strcmp(argv[1], "-n")) {
		uint64_t cur[CHAOS_MASK_WORDS], out_mask[CHAOS_MASK_WORDS];
		char list[4096];
		int node;

		if (chaos_parse_cpulist(argv[5], cur, CHAOS_MASK_WORDS) < 0) {
			printf("error: bad CPU list '%s'\n", argv[5]);
			return 1;
		}
		if (chaos_pick_cpus(argv[2], argv[3], atol(argv[4]), cur, out_mask, &node, err, sizeof(err))) {
			printf("error: %s\n", err);
			return 1;
		}
		chaos_format_cpulist(out_mask, CHAOS_MASK_WORDS, list, sizeof(list));
		printf("cpus=%s node=%d\n", list, node);
		return 0;
	}
	if (argc > 1 && !strcmp(argv[1], "-a")) {
		static struct chaos_config cfg;

		if (chaos_parse_args(argc - 2, argv + 2, &cfg, err, sizeof(err))) {
			printf("error: %s\n", err);
			return 1;
		}
		printf("ok\n");
		return 0;
	}

	for (int i = 1 + env; i < argc; i++) {
		if (chaos_parse_spec(argv[i], &spec, err, sizeof(err))) {
			printf("error: %s\n", err);
			rc = 1;
			continue;
		}
		if (env) {
			rc |= print_env(&spec);
			continue;
		}
		if (chaos_format_spec(&spec, out, sizeof(out)) < 0) {
			printf("error: canonical form too long\n");
			rc = 1;
			continue;
		}
		printf("%s\n", out);
	}
	return rc;
}
