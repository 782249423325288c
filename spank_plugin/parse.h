/*
 * parse.h - the --chaos=SPEC grammar, the plugstack.conf arguments and small helpers.
 *
 * Nothing here includes spank.h: this is the part of the plugin that reads untrusted input,
 * so it is unit-tested (test_parse.c) and fuzzed (fuzz_parse.c) on its own.
 * The grammar and the error messages mirror slurm_chaos/faults/spec.py exactly; the Python
 * test suite runs both on the same inputs through the chaos-spec tool (spec_tool.c).
 */
#ifndef SLURM_CHAOS_PARSE_H
#define SLURM_CHAOS_PARSE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define CHAOS_MAX_FAULTS 8      /* faults in one SPEC (spec.py MAX_FAULTS) */
#define CHAOS_MAX_KEYS 8        /* keys of one fault (checked by the generated catalogue) */
#define CHAOS_VALUE_MAX 256     /* value text, NUL included (catalogue.py MAX_VALUE_LEN + 1) */
#define CHAOS_SPEC_MAX 4096     /* SPEC length, NUL excluded (spec.py MAX_SPEC_LEN) */
#define CHAOS_PATH_MAX 1024
#define CHAOS_MAX_CPUS 4096

enum chaos_type {
	CHAOS_T_INT,
	CHAOS_T_FLOAT,
	CHAOS_T_DURATION,
	CHAOS_T_PERCENT,
	CHAOS_T_STR,
	CHAOS_T_ENUM,
	CHAOS_T_BYTES,
};

struct chaos_key_def {
	const char *name;
	enum chaos_type type;
	const char *help;
	const char *def;                /* default as written in a SPEC, NULL = unset */
	int required;
	int has_min, has_max;
	double min, max;                /* canonical units: seconds, bytes, percent */
	const char *const *choices;     /* enum only */
	size_t nchoices;
};

struct chaos_fault_def {
	const char *name;
	const char *description;
	const char *where;              /* task_env, task_affinity, node, controller */
	const struct chaos_key_def *keys;
	size_t nkeys;
};

/* One parsed value: numbers in canonical units, text in canonical form. */
struct chaos_value {
	int set;                        /* has a value (given or default) */
	int given;                      /* written in the SPEC */
	long long inum;                 /* int, bytes */
	double num;                     /* float, duration, percent (and int/bytes as double) */
	char text[CHAOS_VALUE_MAX];     /* canonical text, as format_spec prints it */
};

struct chaos_request {
	const struct chaos_fault_def *def;
	struct chaos_value values[CHAOS_MAX_KEYS];      /* parallel to def->keys */
};

struct chaos_spec {
	size_t n;
	struct chaos_request req[CHAOS_MAX_FAULTS];
};

/* The catalogue compiled from catalogue.json (catalogue.h, generated). */
const struct chaos_fault_def *chaos_catalogue(size_t *n);
const struct chaos_fault_def *chaos_fault_lookup(const char *name, size_t len);

/*
 * Parse a whole SPEC. Returns 0, or -1 with "bad chaos SPEC '<spec>': <problem>" in err
 * (the same text spec.py raises; truncated to errlen).
 */
int chaos_parse_spec(const char *text, struct chaos_spec *out, char *err, size_t errlen);

/* Canonical SPEC text (given keys only). Returns its length, or -1 if buf is too small. */
int chaos_format_spec(const struct chaos_spec *spec, char *buf, size_t len);

/* Parse one value for key k; on error returns -1 and says what was expected in why. */
int chaos_parse_value(const struct chaos_key_def *k, const char *text, size_t len,
		      struct chaos_value *v, char *why, size_t whylen);

/* The value of key (given, else default), or NULL when unset or unknown. */
const struct chaos_value *chaos_get(const struct chaos_request *r, const char *key);

/* The request for fault name in spec, or NULL. */
const struct chaos_request *chaos_find(const struct chaos_spec *spec, const char *name);

/* Shortest fixed-point text reading back as v (catalogue.py format_fixed). */
void chaos_format_fixed(double v, char *buf, size_t len);

/* --- plugstack.conf arguments -------------------------------------------------------- */

/*
 * Paths only: who may inject is in the root-owned policy file (policy.h), never on the
 * plugstack.conf line, so a user's own plugstack.conf grants nothing.
 */
struct chaos_config {
	char policy[CHAOS_PATH_MAX];
	char journal_dir[CHAOS_PATH_MAX];
};

#define CHAOS_DEFAULT_JOURNAL_DIR "/var/lib/slurm-chaos/journal"
#define CHAOS_DEFAULT_POLICY "/etc/slurm/slurm-chaos-policy.toml"

/* Parse "policy=/path" and "journal_dir=/path"; returns 0 or -1 with the bad argument named in err. */
int chaos_parse_args(int ac, char *const *av, struct chaos_config *cfg, char *err, size_t errlen);

/* --- small helpers the plugin needs, kept here so they are tested ------------------- */

/* CPU list "0-3,8,10-11" into a bitmask of CHAOS_MAX_CPUS bits; returns the count or -1. */
int chaos_parse_cpulist(const char *text, uint64_t *mask, size_t nwords);

/* Bitmask back to list form; returns 0 or -1 if buf is too small. */
int chaos_format_cpulist(const uint64_t *mask, size_t nwords, char *buf, size_t len);

/* JSON string escaping (quotes included); returns 0 or -1 if buf is too small. */
int chaos_json_string(const char *s, char *buf, size_t len);

/* "nccl-degrade" + "ib" -> "SLURM_CHAOS_NCCL_DEGRADE_IB". */
int chaos_env_name(const char *fault, const char *key, char *buf, size_t len);

#endif /* SLURM_CHAOS_PARSE_H */
