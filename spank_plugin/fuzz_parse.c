/*
 * Fuzz target for every parser in parse.c and policy.c (libFuzzer entry point).
 *
 * Built with clang -fsanitize=fuzzer,address where clang exists; otherwise fuzz_driver.c
 * feeds it deterministic random inputs under gcc -fsanitize=address,undefined.
 * Besides "no crash", it checks the round trip: a SPEC that parses formats to a canonical
 * text that parses again to the same canonical text.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parse.h"
#include "policy.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_round_trip(const struct chaos_spec *spec)
{
	static struct chaos_spec again;
	static char canon[2 * CHAOS_SPEC_MAX], canon2[2 * CHAOS_SPEC_MAX], err[3 * CHAOS_SPEC_MAX];

	if (chaos_format_spec(spec, canon, sizeof(canon)) < 0)
		abort();
	if (chaos_parse_spec(canon, &again, err, sizeof(err))) {
		fprintf(stderr, "canonical form does not parse: %s\n", err);
		abort();
	}
	if (chaos_format_spec(&again, canon2, sizeof(canon2)) < 0 || strcmp(canon, canon2)) {
		fprintf(stderr, "round trip differs: '%s' vs '%s'\n", canon, canon2);
		abort();
	}
}

static void fuzz_args(char *text)
{
	static struct chaos_config cfg;
	char *av[16];
	int ac = 0;
	char err[256];

	for (char *tok = strtok(text, " "); tok && ac < 16; tok = strtok(NULL, " "))
		av[ac++] = tok;
	chaos_parse_args(ac, av, &cfg, err, sizeof(err));
}

/* The policy and grant readers on the raw bytes (NULs included), then a decision. */
static void fuzz_policy(const uint8_t *data, size_t size)
{
	static struct chaos_policy pol;
	static struct chaos_grant g;
	static char desc[4 * CHAOS_POLICY_MAX];
	char err[256];

	if (chaos_policy_parse((const char *)data, size, &pol, err, sizeof(err)) == 0) {
		struct chaos_job_facts f = { .uid = 1000, .user = "alice", .account = "acct", .partition = "debug",
					     .exclusive = -1, .array = 0, .het = -1, .nodes = 3 };

		if (chaos_policy_describe(&pol, desc, sizeof(desc)))
			abort();
		chaos_policy_check(&pol, &f, 1, err, sizeof(err));
		chaos_policy_check(&pol, &f, 0, err, sizeof(err));
	}
	if (chaos_grant_parse((const char *)data, size, &g, err, sizeof(err)) == 0) {
		struct chaos_job_facts f;

		chaos_grant_facts(&g, &f);
		if (strlen(g.spec) > CHAOS_GRANT_SPEC_MAX)
			abort();
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct chaos_spec spec;
	static uint64_t mask[CHAOS_MAX_CPUS / 64];
	char err[512], list[512], json[64];
	char *text = malloc(size + 1);

	if (!text)
		return 0;
	memcpy(text, data, size);
	text[size] = '\0';
	/* A short error buffer on purpose: truncation must be safe too. */
	if (chaos_parse_spec(text, &spec, err, sizeof(err)) == 0)
		check_round_trip(&spec);
	if (chaos_parse_cpulist(text, mask, sizeof(mask) / sizeof(mask[0])) >= 0)
		chaos_format_cpulist(mask, sizeof(mask) / sizeof(mask[0]), list, sizeof(list));
	chaos_json_string(text, json, sizeof(json));
	fuzz_args(text);
	fuzz_policy(data, size);
	free(text);
	return 0;
}
