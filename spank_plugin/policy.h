/*
 * policy.h - the injection policy file, the decision on a job's facts, the prolog's grant file.
 *
 * No spank.h here: the policy file and the grant file are read as root in slurmstepd, so their
 * readers are unit-tested (test_parse.c) and fuzzed (fuzz_parse.c) on their own, and held to the
 * Python reader (slurm_chaos/faults/policy.py) by the chaos-spec tool.
 *
 * The policy file (slurm-chaos-policy.toml beside slurm.conf, written by `slurm-chaos plugin
 * install`) is a line-oriented subset of TOML; see policy.py for the grammar. A missing,
 * unreadable, malformed, non-root-owned or group/world-writable file refuses every fault.
 *
 * The grant file (<journal_dir>/<node>/<job>.grant, mode 0600, root's) is the prolog's decision
 * for one job on this node, made from what slurmd and slurmctld say about the job: key=value
 * lines (job, uid, user, account, partition, reservation, exclusive, array, het, nodes, spec,
 * submit, until, and refused when it was refused). slurmstepd applies task-level faults only for
 * a grant that has not expired: `until` (epoch seconds) is the job's end by its time limit (or
 * the hooks' bounded default), so a grant left behind (a lost epilog, a job id that slurmctld
 * hands out again after its state was reset) grants nothing past the job it was written for.
 */
#ifndef SLURM_CHAOS_POLICY_H
#define SLURM_CHAOS_POLICY_H

#include <stddef.h>
#include <sys/types.h>

#define CHAOS_POLICY_MAX 16384  /* bytes of the policy file (policy.py MAX_POLICY_BYTES) */
#define CHAOS_LIST_MAX 64       /* entries of one allow_* list */
#define CHAOS_NAME_MAX 128      /* one user/account/partition/reservation name, NUL included */
#define CHAOS_GRANT_MAX 8192    /* bytes of a grant file (authz.py MAX_GRANT_BYTES) */
#define CHAOS_GRANT_SPEC_MAX 4096
#define CHAOS_IFACE_MAX 16      /* a network interface name, NUL included (IFNAMSIZ) */

/* A name in a list: points into the policy's own copy of the file. */
struct chaos_name {
	const char *p;
	size_t len;
};

struct chaos_list {
	int set;                        /* the key was in the file */
	size_t n;
	struct chaos_name item[CHAOS_LIST_MAX];
};

struct chaos_policy {
	struct chaos_list users, accounts, partitions, reservations;
	int require_exclusive, allow_arrays, allow_het_jobs;
	long max_nodes;                 /* -1: no limit */
	char job_interface[CHAOS_IFACE_MAX];    /* "": not set (netem is refused) */
	char store[CHAOS_POLICY_MAX + 1];
};

/* Parse len bytes of policy text; 0, or -1 with the problem in err (policy.py's words). */
int chaos_policy_parse(const char *text, size_t len, struct chaos_policy *p, char *err, size_t errlen);

/* Open path (no symlink), check it is a regular file of root's nobody else may write, parse it. */
int chaos_policy_load(const char *path, struct chaos_policy *p, char *err, size_t errlen);

/* "users=a,b accounts=- ... max_nodes=4": what was parsed, for the Python parity tests. */
int chaos_policy_describe(const struct chaos_policy *p, char *buf, size_t len);

/* 1 if name (or "*") is in the list; an empty or NULL name is in no list. */
int chaos_list_contains(const struct chaos_list *l, const char *name);

/* What is known about the job; NULL strings and -1 numbers mean "not known here". */
struct chaos_job_facts {
	uid_t uid;
	const char *user;
	const char *account;
	const char *partition;
	const char *reservation;
	int exclusive;
	int array;
	int het;
	long nodes;
};

/* May this user inject faults at all? 0, or -1 with the reason in err. Root always may. */
int chaos_user_check(const struct chaos_policy *p, uid_t uid, const char *user, char *err, size_t errlen);

/*
 * May this job inject faults? 0, or -1 with the reason in err (policy.py refusal()'s words).
 * With final = 0 (srun/sbatch, advisory) unknown facts are let through; with final = 1 an
 * unknown fact a rule needs refuses.
 */
int chaos_policy_check(const struct chaos_policy *p, const struct chaos_job_facts *f, int final,
		       char *err, size_t errlen);

struct chaos_grant {
	char job[32];
	long long uid;
	char user[CHAOS_NAME_MAX], account[CHAOS_NAME_MAX], partition[CHAOS_NAME_MAX];
	char reservation[CHAOS_NAME_MAX];
	int exclusive, array, het;      /* -1 unknown */
	long nodes;                     /* -1 unknown */
	char spec[CHAOS_GRANT_SPEC_MAX + 1];
	long long submit, until;        /* epoch seconds; -1 unknown */
	int refused;
	char why[1024];                 /* the prolog's reason when refused */
};

/* Parse a grant file's text; 0, or -1 with the problem in err. */
int chaos_grant_parse(const char *text, size_t len, struct chaos_grant *g, char *err, size_t errlen);

/* Open (no symlink), check root-owned and writable by nobody else, parse. */
int chaos_grant_load(const char *path, struct chaos_grant *g, char *err, size_t errlen);

/* Is the grant still valid at `now`? 0, or -1 with the reason in err (no `until`: refused). */
int chaos_grant_current(const struct chaos_grant *g, long long now, char *err, size_t errlen);

/* The grant's facts, pointing into g. */
void chaos_grant_facts(const struct chaos_grant *g, struct chaos_job_facts *f);

#endif /* SLURM_CHAOS_POLICY_H */
