/*
 * plugin.c - slurm-chaos SPANK plugin: --chaos=SPEC for srun/sbatch/salloc (or env SLURM_CHAOS).
 *
 * Who may inject is decided from facts Slurm sets, against the root-owned policy file named by
 * the plugstack.conf argument policy= (policy.h); the plugstack.conf line carries paths only.
 *
 * Dispatch on spank_context():
 *   local/allocator (srun, sbatch, salloc): validate the SPEC and check the policy for the user
 *     (advisory: this runs in the user's own process, so nothing from its environment decides),
 *     refusing with a clear message before anything is submitted; pass the canonical SPEC as SLURM_CHAOS_SPEC in the job's
 *     SPANK environment, where slurmctld's job_submit.lua decides on it and records it.
 *   remote (slurmstepd, as root): act only on a grant the prolog wrote for this job on this node
 *     (<journal_dir>/<node>/<job>.grant, from slurmd's and slurmctld's facts), for this very SPEC,
 *     re-checked against the policy; journal the planned task-level changes, then apply them:
 *     NCCL and SLURM_CHAOS_* environment in user_init, CPU affinity and memory policy for
 *     numa-mismatch in task_init.
 * Node-level and controller faults (netem, gpu-*, node-drain...) are applied by the prolog
 * hooks; this plugin only describes them to the tasks.
 *
 * Parsing lives in parse.c and policy.c (no spank.h), so it is unit-tested and fuzzed on its own.
 */
#define _GNU_SOURCE
#include <stdint.h>             /* spank.h uses uint32_t but does not include stdint.h */

#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <pwd.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <slurm/spank.h>

#include "affinity.h"
#include "parse.h"
#include "policy.h"

SPANK_PLUGIN(slurm_chaos, 1);

#define PFX "slurm-chaos: "
#define ENV_SPEC "SLURM_CHAOS"          /* env form of --chaos, read by srun/sbatch and stepd */
#define JOBCTL_SPEC "SLURM_CHAOS_SPEC"  /* job_submit.lua reads it from the job's SPANK env */
#define ERR_MAX (3 * CHAOS_SPEC_MAX)
#define MPOL_BIND_MODE 2                /* MPOL_BIND from <numaif.h>, without libnuma */
#define BATCH_STEP 0xfffffffbU
#define EXTERN_STEP 0xfffffffcU
#define INTERACTIVE_STEP 0xfffffffaU
#define JOURNAL_MAX_BYTES (16L << 20)
/* Task-level entries need no undo; a far deadline keeps them from lowering the journal's. */
#define JOURNAL_DEADLINE_S (7LL * 86400)

static struct chaos_config cfg;
static struct chaos_policy policy;      /* loaded only when a SPEC was given */
static struct chaos_grant grant;
static struct chaos_spec spec;
static int have_spec;
static char spec_text[2 * CHAOS_SPEC_MAX];      /* canonical SPEC */
static char err[ERR_MAX];
/*
 * A request refused on the node. Failing init_post_opt would drain the node for a batch
 * step, so the refusal is carried to task_init instead: each task prints it on the job's
 * stderr and exits 1 before exec, so nothing of the job runs and the node stays up.
 */
static int refused;
static char refusal[ERR_MAX];

static int chaos_opt_cb(int val, const char *optarg, int remote);

static struct spank_option chaos_options[] = {
	{ "chaos", "SPEC",
	  "Inject faults (slurm-chaos): SPEC = NAME[:KEY=VALUE[,KEY=VALUE...]] joined by '+'; "
	  "'slurm-chaos faults' lists them. Environment form: SLURM_CHAOS=SPEC.",
	  1, 0, chaos_opt_cb },
	SPANK_OPTIONS_TABLE_END
};

/* --- SPEC intake ------------------------------------------------------------------------- */

/* Set when the node could not parse a SPEC srun/sbatch accepted (catalogue version skew). */
static int remote_parse_failed;
static char remote_parse_err[ERR_MAX];

/* A message quoting what a user typed: one log line, no terminal control sequences. */
static void one_line(char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s < 0x20 || (unsigned char)*s == 0x7f)
			*s = '?';
}

static int accept_spec(const char *text, int remote)
{
	if (chaos_parse_spec(text, &spec, err, sizeof(err))) {
		one_line(err);
		/* In srun/sbatch slurm_error reaches the user's terminal: that is the refusal. */
		slurm_error(PFX "%s", err);
		have_spec = 0;
		if (remote) {
			remote_parse_failed = 1;
			snprintf(remote_parse_err, sizeof(remote_parse_err), "%s", err);
		}
		return -1;
	}
	if (chaos_format_spec(&spec, spec_text, sizeof(spec_text)) < 0) {
		slurm_error(PFX "SPEC too long once canonical");
		return -1;
	}
	have_spec = 1;
	if (remote)
		slurm_debug(PFX "SPEC %s", spec_text);
	return 0;
}

static int chaos_opt_cb(int val, const char *optarg, int remote)
{
	return accept_spec(optarg, remote);
}

/* --- facts about the job ----------------------------------------------------------------- */

static const char *user_name(uid_t uid, char *buf, size_t len)
{
	struct passwd pw, *res = NULL;

	if (getpwuid_r(uid, &pw, buf, len, &res) || !res)
		return NULL;
	return res->pw_name;
}

static const char *remote_env(spank_t sp, const char *name, char *buf, int len)
{
	return spank_getenv(sp, name, buf, len) == ESPANK_SUCCESS && buf[0] ? buf : NULL;
}

static void step_name(uint32_t step, char *buf, size_t len)
{
	if (step == BATCH_STEP)
		snprintf(buf, len, "batch");
	else if (step == EXTERN_STEP)
		snprintf(buf, len, "extern");
	else if (step == INTERACTIVE_STEP)
		snprintf(buf, len, "interactive");
	else
		snprintf(buf, len, "%u", step);
}

struct step_ids {
	uint32_t job;
	char step[32];
};

static void get_ids(spank_t sp, struct step_ids *ids)
{
	uint32_t step = 0;

	ids->job = 0;
	spank_get_item(sp, S_JOB_ID, &ids->job);
	spank_get_item(sp, S_JOB_STEPID, &step);
	step_name(step, ids->step, sizeof(ids->step));
}

/* --- journal ----------------------------------------------------------------------------- */

static int mkdir_p(const char *dir)
{
	char path[CHAOS_PATH_MAX + 300];

	snprintf(path, sizeof(path), "%s", dir);
	for (char *p = path + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdir(path, 0755) && errno != EEXIST)
			return -1;
		*p = '/';
	}
	return (mkdir(path, 0755) && errno != EEXIST) ? -1 : 0;
}

/*
 * This node's name: the short hostname. Not SLURMD_NODENAME from the step's environment: for
 * an srun step that is the value srun inherited (e.g. the batch host's), not this node's.
 * Sites whose NodeName differs from the hostname get the plugin's records in a separate
 * <hostname> directory, which cleanup also walks.
 */
static void node_name(char *buf, size_t len)
{
	char *dot;

	if (gethostname(buf, len - 1))
		snprintf(buf, len, "unknown");
	buf[len - 1] = '\0';
	if ((dot = strchr(buf, '.')))
		*dot = '\0';
}

/* Highest "seq" of the journal's change records, or -1 if it was closed by an undo. */
static long journal_scan(int fd)
{
	struct stat st;
	char *text, *line, *next;
	long seq = 0;
	ssize_t got;

	if (fstat(fd, &st) || st.st_size > JOURNAL_MAX_BYTES)
		return -2;
	text = calloc(1, (size_t)st.st_size + 1);
	if (!text)
		return -2;
	got = pread(fd, text, (size_t)st.st_size, 0);
	if (got < 0) {
		free(text);
		return -2;
	}
	text[got] = '\0';
	for (line = text; line && *line; line = next) {
		char *p;

		next = strchr(line, '\n');
		if (next)
			*next++ = '\0';
		if (strstr(line, "\"kind\": \"closed\"")) {
			seq = -1;
			break;
		}
		if (strstr(line, "\"kind\": \"change\"") && (p = strstr(line, "\"seq\": ")))
			seq = strtol(p + 7, NULL, 10) > seq ? strtol(p + 7, NULL, 10) : seq;
	}
	free(text);
	return seq;
}

/*
 * Record one change in journal_dir/<node>/<jobid>.jsonl before it is made, in the format of
 * slurm_chaos/faults/journal.py (a "change" record, seq under an flock of the file, fsynced),
 * so the epilog, the watchdog and `slurm-chaos cleanup` list it with the node-level changes.
 * What this plugin changes dies with the task: the undo is the named action "none".
 * Returns 0, -1 on I/O errors, -2 if the journal was closed (the job is being undone).
 */
static int journal(spank_t sp, const struct step_ids *ids, const char *fault, const char *action)
{
	char dir[CHAOS_PATH_MAX + 300], path[CHAOS_PATH_MAX + 340], node[256], line[8192];
	char jfault[256], jaction[4096], jnode[600];
	struct timespec ts;
	long seq;
	int fd, n, rc = -1;

	node_name(node, sizeof(node));
	clock_gettime(CLOCK_REALTIME, &ts);
	if (strchr(node, '/') || chaos_json_string(fault, jfault, sizeof(jfault)) ||
	    chaos_json_string(action, jaction, sizeof(jaction)) ||
	    chaos_json_string(node, jnode, sizeof(jnode)))
		return -1;
	snprintf(dir, sizeof(dir), "%s/%s", cfg.journal_dir, node);
	if (mkdir_p(dir))
		return -1;
	snprintf(path, sizeof(path), "%s/%u.jsonl", dir, ids->job);
	fd = open(path, O_RDWR | O_APPEND | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
	if (fd < 0)
		return -1;
	if (flock(fd, LOCK_EX) == 0) {
		seq = journal_scan(fd);
		if (seq == -1) {
			rc = -2;
		} else if (seq >= 0) {
			/* Keys sorted as json.dumps(sort_keys=True) writes them. */
			n = snprintf(line, sizeof(line),
				     "{\"action\": %s, \"deadline\": %lld.%06ld, \"early\": false, \"fault\": %s, "
				     "\"job_id\": \"%u\", \"kind\": \"change\", \"node\": %s, \"pid\": %ld, "
				     "\"seq\": %ld, \"source\": \"spank\", \"step\": \"%s\", \"time\": %lld.%06ld, "
				     "\"undo\": {\"action\": \"none\", \"data\": {\"note\": \"dies with the task: "
				     "nothing to undo\"}}}\n",
				     jaction, (long long)ts.tv_sec + JOURNAL_DEADLINE_S, ts.tv_nsec / 1000, jfault,
				     ids->job, jnode, (long)getpid(), seq + 1, ids->step, (long long)ts.tv_sec,
				     ts.tv_nsec / 1000);
			if (n > 0 && (size_t)n < sizeof(line) && write(fd, line, (size_t)n) == n && !fsync(fd))
				rc = 0;
		}
	}
	close(fd);      /* drops the flock */
	return rc;
}

/* --- what each task-level fault changes ----------------------------------------------------- */

struct env_change {
	const char *name;
	char value[CHAOS_VALUE_MAX];
};

static int is_off(const struct chaos_request *r, const char *key)
{
	const struct chaos_value *v = chaos_get(r, key);

	return v && !strcmp(v->text, "off");
}

/* NCCL variables for nccl-degrade; returns how many were filled in. */
static int nccl_env(const struct chaos_request *r, struct env_change *out)
{
	const struct chaos_value *v;
	int n = 0;

	if (is_off(r, "ib"))
		out[n++] = (struct env_change){ "NCCL_IB_DISABLE", "1" };
	if (is_off(r, "p2p"))
		out[n++] = (struct env_change){ "NCCL_P2P_DISABLE", "1" };
	if (is_off(r, "shm"))
		out[n++] = (struct env_change){ "NCCL_SHM_DISABLE", "1" };
	if (is_off(r, "gdr"))
		out[n++] = (struct env_change){ "NCCL_NET_GDR_LEVEL", "LOC" };
	if ((v = chaos_get(r, "hca"))) {
		out[n] = (struct env_change){ "NCCL_IB_HCA", "" };
		snprintf(out[n].value, sizeof(out[n].value), "%s", v->text);
		for (char *p = out[n].value; *p; p++)
			if (*p == '/')
				*p = ',';   /* '/' separates HCAs in a SPEC, ',' in NCCL */
		n++;
	}
	if ((v = chaos_get(r, "channels"))) {
		out[n] = (struct env_change){ "NCCL_MAX_NCHANNELS", "" };
		snprintf(out[n].value, sizeof(out[n].value), "%s", v->text);
		n++;
	}
	return n;
}

static void describe_nccl(const struct chaos_request *r, char *buf, size_t len)
{
	struct env_change ch[8];
	int n = nccl_env(r, ch);
	size_t used = 0;

	buf[0] = '\0';
	for (int i = 0; i < n; i++) {
		int w = snprintf(buf + used, len - used, "%s%s=%s", i ? " " : "", ch[i].name, ch[i].value);

		if (w < 0 || (size_t)w >= len - used)
			return;         /* truncated text in a log line is harmless */
		used += (size_t)w;
	}
}

/* --- remote (slurmstepd) ---------------------------------------------------------------------- */

static int refuse(const struct step_ids *ids, const char *why)
{
	if (snprintf(refusal, sizeof(refusal), "job %u.%s: refused --chaos%s%s: %s", ids->job, ids->step,
		     have_spec ? "=" : "", have_spec ? spec_text : "", why) >= (int)sizeof(refusal))
		refusal[sizeof(refusal) - 2] = '+';     /* truncated: say so, keep the start */
	one_line(refusal);
	slurm_error(PFX "%s", refusal);
	refused = 1;
	return -1;
}

/*
 * The prolog's grant for this job on this node, for this SPEC, and the policy agreeing with the
 * facts it holds (from slurmd and slurmctld): nothing the job's user can set.
 */
static int remote_policy(spank_t sp, const struct step_ids *ids)
{
	char pwbuf[4096], node[256], path[CHAOS_PATH_MAX + 300], job[32], why[2048];
	struct chaos_job_facts f;
	uid_t uid = (uid_t)-1;
	const char *user;

	if (chaos_policy_load(cfg.policy, &policy, err, sizeof(err)))
		return refuse(ids, err);
	if (spank_get_item(sp, S_JOB_UID, &uid) != ESPANK_SUCCESS)
		return refuse(ids, "the job's uid is not known");
	user = user_name(uid, pwbuf, sizeof(pwbuf));
	if (chaos_user_check(&policy, uid, user, err, sizeof(err)))
		return refuse(ids, err);
	node_name(node, sizeof(node));
	snprintf(job, sizeof(job), "%u", ids->job);
	snprintf(path, sizeof(path), "%s/%s/%s.grant", cfg.journal_dir, node, job);
	if (strchr(node, '/') || chaos_grant_load(path, &grant, why, sizeof(why))) {
		snprintf(err, sizeof(err), "the prolog granted job %s nothing on this node (%s): slurmctld's "
			 "job_submit.lua and the prolog decide who may inject", job, strchr(node, '/') ? path : why);
		return refuse(ids, err);
	}
	if (strcmp(grant.job, job) || grant.uid != (long long)uid)
		return refuse(ids, "the grant on this node is for another job or user");
	if (grant.refused)
		return refuse(ids, grant.why);
	if (chaos_grant_current(&grant, (long long)time(NULL), err, sizeof(err)))
		return refuse(ids, err);
	chaos_grant_facts(&grant, &f);
	if (chaos_policy_check(&policy, &f, 1, err, sizeof(err)))
		return refuse(ids, err);
	if (strcmp(grant.spec, spec_text)) {
		snprintf(err, sizeof(err), "the job was granted --chaos=%s, not this SPEC", grant.spec);
		return refuse(ids, err);
	}
	return 0;
}

static int remote_journal_plan(spank_t sp, const struct step_ids *ids)
{
	char detail[2048], action[2200];
	int rc;

	for (size_t i = 0; i < spec.n; i++) {
		const struct chaos_request *r = &spec.req[i];
		const char *where = r->def->where;

		if (!strcmp(r->def->name, "nccl-degrade")) {
			describe_nccl(r, detail, sizeof(detail));
			snprintf(action, sizeof(action), "task environment of step %s: %s", ids->step, detail);
			if ((rc = journal(sp, ids, r->def->name, action)))
				return rc;
		} else if (!strcmp(r->def->name, "numa-mismatch")) {
			snprintf(action, sizeof(action), "CPU affinity and memory policy of the tasks of step %s",
				 ids->step);
			if ((rc = journal(sp, ids, r->def->name, action)))
				return rc;
		} else {
			slurm_info(PFX "job %u.%s: %s acts on %s: left to the %s", ids->job, ids->step,
				   r->def->name, where,
				   !strcmp(where, "task_env") ? "task-side shim" : "prolog/epilog hooks");
		}
	}
	/* SLURM_CHAOS_* describe the request to the tasks; also dies with the task. */
	snprintf(action, sizeof(action), "task environment of step %s: SLURM_CHAOS_SPEC, SLURM_CHAOS_FAULTS, "
		 "SLURM_CHAOS_<FAULT>_<KEY>", ids->step);
	return journal(sp, ids, "spank", action);
}

static int remote_post_opt(spank_t sp)
{
	struct step_ids ids;
	char buf[CHAOS_SPEC_MAX + 1];

	get_ids(sp, &ids);
	if (remote_parse_failed) {
		/* Never ignore a request silently: a SPEC this node cannot read refuses the step. */
		refuse(&ids, remote_parse_err);
		return 0;
	}
	if (!have_spec && remote_env(sp, ENV_SPEC, buf, sizeof(buf)) && accept_spec(buf, 1)) {
		refuse(&ids, err);
		return 0;
	}
	if (!have_spec)
		return 0;       /* the common case: nothing asked, nothing touched */
	if (remote_policy(sp, &ids))
		return 0;
	slurm_info(PFX "job %u.%s: accepted --chaos=%s", ids.job, ids.step, spec_text);
	switch (remote_journal_plan(sp, &ids)) {
	case 0:
		break;
	case -2:
		refuse(&ids, "the job's journal is closed: its faults are being undone");
		break;
	default:
		snprintf(err, sizeof(err), "cannot write the journal in %s (%s)", cfg.journal_dir,
			 strerror(errno));
		refuse(&ids, err);
	}
	return 0;
}

static int set_env(spank_t sp, const struct step_ids *ids, const char *name, const char *value)
{
	if (spank_setenv(sp, name, value, 1) != ESPANK_SUCCESS) {
		slurm_error(PFX "job %u.%s: cannot set %s", ids->job, ids->step, name);
		return -1;
	}
	slurm_info(PFX "job %u.%s: set %s=%s", ids->job, ids->step, name, value);
	return 0;
}

static int describe_to_tasks(spank_t sp, const struct step_ids *ids)
{
	char names[512] = "", var[256];
	size_t used = 0;

	if (set_env(sp, ids, "SLURM_CHAOS_SPEC", spec_text))
		return -1;
	for (size_t i = 0; i < spec.n; i++) {
		const struct chaos_request *r = &spec.req[i];

		int n = snprintf(names + used, sizeof(names) - used, "%s%s", i ? "," : "", r->def->name);

		if (n < 0 || (size_t)n >= sizeof(names) - used)
			return -1;      /* cannot happen with CHAOS_MAX_FAULTS names; never overrun */
		used += (size_t)n;
		for (size_t k = 0; k < r->def->nkeys; k++) {
			if (!r->values[k].set)
				continue;
			if (chaos_env_name(r->def->name, r->def->keys[k].name, var, sizeof(var)) ||
			    set_env(sp, ids, var, r->values[k].text))
				return -1;
		}
	}
	return set_env(sp, ids, "SLURM_CHAOS_FAULTS", names);
}

/*
 * Checkpoint I/O faults act through the LD_PRELOAD shim installed beside this plugin
 * (preload/, libslurm_chaos_io.so): it fails or hangs I/O under the checkpoint path only.
 */
static int checkpoint_io_env(spank_t sp, const struct step_ids *ids)
{
	static const char *const faults[][2] = {
		{ "ckpt-enospc", "enospc" }, { "ckpt-eio", "eio" }, { "ckpt-hang", "hang" },
	};
	const struct chaos_request *r = NULL;
	const char *kind = NULL;
	char shim[PATH_MAX], preload[2 * PATH_MAX + 2], num[64];
	const struct chaos_value *v;
	Dl_info self;

	for (size_t i = 0; i < sizeof(faults) / sizeof(faults[0]) && !r; i++)
		if ((r = chaos_find(&spec, faults[i][0])))
			kind = faults[i][1];
	if (!r)
		return 0;
	if (!dladdr((void *)checkpoint_io_env, &self) || !self.dli_fname) {
		slurm_error(PFX "job %u.%s: cannot locate the plugin to find its I/O shim", ids->job, ids->step);
		return -1;
	}
	snprintf(shim, sizeof(shim), "%s", self.dli_fname);
	char *slash = strrchr(shim, '/');
	if (!slash || (size_t)(slash - shim) + sizeof("/libslurm_chaos_io.so") > sizeof(shim))
		return -1;
	strcpy(slash, "/libslurm_chaos_io.so");
	if (access(shim, R_OK)) {
		slurm_error(PFX "job %u.%s: %s: %m (install it with the plugin)", ids->job, ids->step, shim);
		return -1;
	}
	const char *old = getenv("LD_PRELOAD");
	snprintf(preload, sizeof(preload), "%s%s%s", shim, old && *old ? ":" : "", old ? old : "");
	if (set_env(sp, ids, "LD_PRELOAD", preload) || set_env(sp, ids, "SLURM_CHAOS_IO_FAULT", kind))
		return -1;
	if ((v = chaos_get(r, "path")) && v->set && set_env(sp, ids, "SLURM_CHAOS_IO_PATH", v->text))
		return -1;
	if ((v = chaos_get(r, "after")) && v->set) {
		snprintf(num, sizeof(num), "%.9g", v->num);
		if (set_env(sp, ids, "SLURM_CHAOS_IO_AFTER_S", num))
			return -1;
	}
	if ((v = chaos_get(r, "bytes")) && v->set) {
		snprintf(num, sizeof(num), "%lld", v->inum);
		if (set_env(sp, ids, "SLURM_CHAOS_IO_AFTER_BYTES", num))
			return -1;
	}
	if ((v = chaos_get(r, "hold")) && v->set) {
		snprintf(num, sizeof(num), "%.9g", v->num);
		if (set_env(sp, ids, "SLURM_CHAOS_IO_HOLD_S", num))
			return -1;
	}
	return 0;
}

/* user_init: once per step, before the tasks fork; the environment goes to every task. */
static int remote_user_init(spank_t sp)
{
	const struct chaos_request *r;
	struct env_change ch[8];
	struct step_ids ids;

	get_ids(sp, &ids);
	if (describe_to_tasks(sp, &ids))
		return -1;
	if ((r = chaos_find(&spec, "nccl-degrade"))) {
		int n = nccl_env(r, ch);

		for (int i = 0; i < n; i++)
			if (set_env(sp, &ids, ch[i].name, ch[i].value))
				return -1;
	}
	return checkpoint_io_env(sp, &ids);
}

static int bind_memory(int node)
{
	unsigned long nodemask[1024 / (8 * sizeof(unsigned long))] = { 0 };

	if (node < 0 || node >= 1024)
		return -1;
	nodemask[node / (8 * sizeof(unsigned long))] |= 1UL << (node % (8 * sizeof(unsigned long)));
	return (int)syscall(SYS_set_mempolicy, MPOL_BIND_MODE, nodemask, 1024UL + 1);
}

static int apply_numa_mismatch(spank_t sp, const struct chaos_request *r)
{
	const struct chaos_value *mode = chaos_get(r, "mode"), *cpus = chaos_get(r, "cpus"),
				 *mem = chaos_get(r, "mem");
	uint64_t cur_mask[CHAOS_MASK_WORDS] = { 0 }, want[CHAOS_MASK_WORDS];
	char before[1024] = "?", after[1024] = "?", why[256];
	struct step_ids ids;
	uint32_t task = 0;
	cpu_set_t cur, set;
	int node;

	get_ids(sp, &ids);
	spank_get_item(sp, S_TASK_GLOBAL_ID, &task);
	if (!mode || !cpus || !mem) {
		slurm_error(PFX "job %u.%s task %u: numa-mismatch: catalogue lacks mode/cpus/mem",
			    ids.job, ids.step, task);
		return -1;
	}
	CPU_ZERO(&cur);
	sched_getaffinity(0, sizeof(cur), &cur);
	for (long c = 0; c < CPU_SETSIZE && c < CHAOS_MAX_CPUS; c++)
		if (CPU_ISSET(c, &cur))
			cur_mask[c / 64] |= 1ULL << (c % 64);
	chaos_format_cpulist(cur_mask, CHAOS_MASK_WORDS, before, sizeof(before));
	if (chaos_pick_cpus("/sys", mode->text, cpus->inum, cur_mask, want, &node, why, sizeof(why))) {
		slurm_error(PFX "job %u.%s task %u: numa-mismatch: %s", ids.job, ids.step, task, why);
		return -1;
	}
	CPU_ZERO(&set);
	for (long c = 0; c < CPU_SETSIZE && c < CHAOS_MAX_CPUS; c++)
		if ((want[c / 64] >> (c % 64)) & 1)
			CPU_SET(c, &set);
	chaos_format_cpulist(want, CHAOS_MASK_WORDS, after, sizeof(after));
	if (sched_setaffinity(0, sizeof(set), &set)) {
		slurm_error(PFX "job %u.%s task %u: numa-mismatch: sched_setaffinity(%s): %m",
			    ids.job, ids.step, task, after);
		return -1;
	}
	slurm_info(PFX "job %u.%s task %u: numa-mismatch: CPUs %s -> %s (%s)", ids.job, ids.step, task,
		   before, after, node >= 0 ? "a remote NUMA node" : "squeezed");
	if (node >= 0 && !strcmp(mem->text, "on")) {
		if (bind_memory(node))
			slurm_error(PFX "job %u.%s task %u: numa-mismatch: set_mempolicy(node %d): %m",
				    ids.job, ids.step, task, node);
		else
			slurm_info(PFX "job %u.%s task %u: numa-mismatch: memory bound to NUMA node %d",
				   ids.job, ids.step, task, node);
	}
	spank_setenv(sp, "SLURM_CHAOS_NUMA_MISMATCH_APPLIED", after, 1);
	return 0;
}

/* --- local (srun) and allocator (sbatch/salloc) ---------------------------------------------- */

static int local_post_opt(spank_t sp)
{
	char pwbuf[4096];
	const char *env = getenv(ENV_SPEC);
	struct chaos_job_facts f = { .exclusive = -1, .array = -1, .het = -1, .nodes = -1 };

	if (!have_spec && env && *env && accept_spec(env, 0))
		return -1;
	if (!have_spec)
		return 0;
	/* A missing or unsafe policy refuses here as it will in slurmctld and on the nodes. */
	if (chaos_policy_load(cfg.policy, &policy, err, sizeof(err))) {
		slurm_error(PFX "refused --chaos=%s: %s", spec_text, err);
		return -1;
	}
	f.uid = getuid();
	f.user = user_name(f.uid, pwbuf, sizeof(pwbuf));
	/*
	 * Only what the user cannot forge decides, even here: account, partition and reservation are
	 * left unknown (never SLURM_JOB_* from the user's environment), so this check only saves a
	 * submission the policy refuses for its user. slurmctld's job_submit.lua decides on the
	 * job's real account, partition and reservation, and in slurmstepd the prolog's grant does.
	 */
	if (chaos_policy_check(&policy, &f, 0, err, sizeof(err))) {
		slurm_error(PFX "refused --chaos=%s: %s", spec_text, err);
		return -1;
	}
	/* job_submit.lua reads it at submission (the prolog reads the job's AdminComment, never this). */
	if (spank_job_control_setenv(sp, JOBCTL_SPEC, spec_text, 1) != ESPANK_SUCCESS)
		slurm_verbose(PFX "could not pass the SPEC to slurmctld (job control env)");
	slurm_verbose(PFX "accepted --chaos=%s", spec_text);
	return 0;
}

/* --- SPANK entry points ---------------------------------------------------------------------- */

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	if (chaos_parse_args(ac, av, &cfg, err, sizeof(err))) {
		slurm_error(PFX "plugstack.conf: %s", err);
		return -1;
	}
	for (size_t i = 0; chaos_options[i].name; i++)
		if (spank_option_register(sp, &chaos_options[i]) != ESPANK_SUCCESS) {
			slurm_error(PFX "cannot register option --%s", chaos_options[i].name);
			return -1;
		}
	return 0;
}

int slurm_spank_init_post_opt(spank_t sp, int ac, char **av)
{
	switch (spank_context()) {
	case S_CTX_LOCAL:
	case S_CTX_ALLOCATOR:
		return local_post_opt(sp);
	case S_CTX_REMOTE:
		return remote_post_opt(sp);
	default:
		return 0;
	}
}

int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
	if (!have_spec || refused || spank_context() != S_CTX_REMOTE)
		return 0;
	return remote_user_init(sp);
}

int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
	const struct chaos_request *r;

	if (spank_context() != S_CTX_REMOTE)
		return 0;
	if (refused) {
		/* In the task, slurm_error reaches the job's stderr (slurmstepd: error: ...). */
		slurm_error(PFX "%s", refusal);
		return -1;
	}
	if (!have_spec)
		return 0;
	if ((r = chaos_find(&spec, "numa-mismatch")))
		return apply_numa_mismatch(sp, r);
	return 0;
}
