/*
 * chaos-spec: run the C SPEC parser from the command line.
 *
 *   chaos-spec -- SPEC...        print the canonical SPEC, or "error: <message>" (exit 1)
 *   chaos-spec -e -- SPEC...     print the SLURM_CHAOS_* variables the plugin would set
 *   chaos-spec -a -- ARG...      parse plugstack.conf arguments: "ok" or "error: <message>"
 *   chaos-spec -n -- SYSROOT MODE NCPUS CURRENT
 *                                the CPUs numa-mismatch would pick: "cpus=<list> node=<n>"
 *   chaos-spec -p -- FILE...     parse each file as policy text: its description, or "error: ..."
 *   chaos-spec -P -- FILE        load a policy file as the plugin does (owner and mode checked)
 *   chaos-spec -c -- FILE UID USER ACCOUNT PARTITION RESERVATION EXCLUSIVE ARRAY HET NODES
 *                                the plugin's decision on these facts under the policy FILE
 *                                ("-" for an unknown name, -1 for an unknown number): "ok" or
 *                                "refused: <reason>"
 *   chaos-spec -g -- FILE        load a grant file: its fields, or "error: ..."
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
#include "policy.h"

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

static int read_text(const char *path, char *buf, size_t max, size_t *len)
{
	FILE *fp = fopen(path, "rb");

	if (!fp)
		return -1;
	*len = fread(buf, 1, max, fp);
	fclose(fp);
	return 0;
}

static const char *name_arg(const char *a)
{
	return strcmp(a, "-") ? a : NULL;
}

static int policy_modes(const char *mode, int nops, char **ops)
{
	static struct chaos_policy pol;
	static struct chaos_grant g;
	static char text[CHAOS_POLICY_MAX + 2], err[2 * CHAOS_POLICY_MAX], out[4 * CHAOS_POLICY_MAX];
	size_t len;
	int rc = 0;

	if (!strcmp(mode, "-p")) {
		for (int i = 0; i < nops; i++) {
			if (read_text(ops[i], text, sizeof(text) - 1, &len)) {
				printf("error: cannot read %s\n", ops[i]);
				rc = 1;
			} else if (chaos_policy_parse(text, len, &pol, err, sizeof(err))) {
				printf("error: %s\n", err);
				rc = 1;
			} else {
				chaos_policy_describe(&pol, out, sizeof(out));
				printf("%s\n", out);
			}
		}
		return rc;
	}
	if (!strcmp(mode, "-P") || !strcmp(mode, "-g")) {
		if (nops != 1)
			return 2;
		if (!strcmp(mode, "-P") ? chaos_policy_load(ops[0], &pol, err, sizeof(err))
					: chaos_grant_load(ops[0], &g, err, sizeof(err))) {
			printf("error: %s\n", err);
			return 1;
		}
		if (!strcmp(mode, "-P")) {
			chaos_policy_describe(&pol, out, sizeof(out));
			printf("%s\n", out);
		} else {
			printf("job=%s uid=%lld user=%s account=%s partition=%s reservation=%s exclusive=%d "
			       "array=%d het=%d nodes=%ld spec=%s submit=%lld until=%lld refused=%s\n", g.job, g.uid,
			       g.user, g.account, g.partition, g.reservation, g.exclusive, g.array, g.het, g.nodes,
			       g.spec, g.submit, g.until, g.refused ? g.why : "-");
		}
		return 0;
	}
	/* -c */
	if (nops != 10)
		return 2;
	if (read_text(ops[0], text, sizeof(text) - 1, &len) ||
	    chaos_policy_parse(text, len, &pol, err, sizeof(err))) {
		printf("error: policy\n");
		return 1;
	}
	struct chaos_job_facts f = {
		.uid = (uid_t)atol(ops[1]), .user = name_arg(ops[2]), .account = name_arg(ops[3]),
		.partition = name_arg(ops[4]), .reservation = name_arg(ops[5]), .exclusive = atoi(ops[6]),
		.array = atoi(ops[7]), .het = atoi(ops[8]), .nodes = atol(ops[9]),
	};
	if (chaos_policy_check(&pol, &f, 1, err, sizeof(err))) {
		printf("refused: %s\n", err);
		return 1;
	}
	printf("ok\n");
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
	    (*mode && strcmp(mode, "-e") && strcmp(mode, "-a") && strcmp(mode, "-n") && strcmp(mode, "-p") &&
	     strcmp(mode, "-P") && strcmp(mode, "-c") && strcmp(mode, "-g"))) {
		fprintf(stderr, "usage: chaos-spec [-e|-a|-n|-p|-P|-c|-g] -- OPERAND...\n");
		return 2;
	}
	first++;
	nops = argc - first;
	env = !strcmp(mode, "-e");
	argv += first - 1; /* argv[1] is the first operand from here on */

	if (!strcmp(mode, "-p") || !strcmp(mode, "-P") || !strcmp(mode, "-c") || !strcmp(mode, "-g")) {
		rc = policy_modes(mode, nops, argv + 1);

		if (rc == 2)
			fprintf(stderr, "usage: chaos-spec %s -- OPERAND... (see spec_tool.c)\n", mode);
		return rc;
	}
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
