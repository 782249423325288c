/*
 * chaos-spec: run the C SPEC parser from the command line.
 *
 *   chaos-spec -- SPEC...        print the canonical SPEC, or "error: <message>" (exit 1)
 *   chaos-spec -e -- SPEC...     print the SLURM_CHAOS_* variables the plugin would set
 *   chaos-spec -a -- ARG...      parse plugstack.conf arguments: "ok" or "error: <message>"
 *   chaos-spec -n -- SYSROOT MODE NCPUS CURRENT
 *                                the CPUs numa-mismatch would pick: "cpus=<list> node=<n>"
 *
 * The "--" is required: everything after it is an operand, so a SPEC that starts with '-' (such as
 * "-e") is parsed as a SPEC, never taken for an option. Anything else is a usage error (exit 2).
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
	const char *mode = "";
	int first, nops, env, rc = 0;

	/* At most one option, then "--", then the operands. */
	first = 1;
	if (argc > first && argv[first][0] == '-' && strcmp(argv[first], "--"))
		mode = argv[first++];
	if (argc <= first || strcmp(argv[first], "--") ||
	    (*mode && strcmp(mode, "-e") && strcmp(mode, "-a") && strcmp(mode, "-n"))) {
		fprintf(stderr, "usage: chaos-spec [-e|-a|-n] -- OPERAND...\n");
		return 2;
	}
	first++;
	nops = argc - first;
	env = !strcmp(mode, "-e");
	argv += first - 1; /* argv[1] is the first operand from here on */

	if (!strcmp(mode, "-n")) {
		if (nops != 4) {
			fprintf(stderr, "usage: chaos-spec -n -- SYSROOT MODE NCPUS CURRENT\n");
			return 2;
		}
		uint64_t cur[CHAOS_MASK_WORDS], out_mask[CHAOS_MASK_WORDS];
		char list[4096];
		int node;

		if (chaos_parse_cpulist(argv[4], cur, CHAOS_MASK_WORDS) < 0) {
			printf("error: bad CPU list '%s'\n", argv[4]);
			return 1;
		}
		if (chaos_pick_cpus(argv[1], argv[2], atol(argv[3]), cur, out_mask, &node, err, sizeof(err))) {
			printf("error: %s\n", err);
			return 1;
		}
		chaos_format_cpulist(out_mask, CHAOS_MASK_WORDS, list, sizeof(list));
		printf("cpus=%s node=%d\n", list, node);
		return 0;
	}
	if (!strcmp(mode, "-a")) {
		static struct chaos_config cfg;

		if (chaos_parse_args(nops, argv + 1, &cfg, err, sizeof(err))) {
			printf("error: %s\n", err);
			return 1;
		}
		printf("ok\n");
		return 0;
	}

	for (int i = 1; i <= nops; i++) {
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
