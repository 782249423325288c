/* Unit tests for parse.c (no Slurm needed): make test. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "parse.h"
#include "policy.h"

static int failures, checks;

#define CHECK(cond) do { checks++; if (!(cond)) { failures++; \
	fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); } } while (0)

static struct chaos_spec spec;
static char err[3 * CHAOS_SPEC_MAX], out[2 * CHAOS_SPEC_MAX];

/* SPEC must parse to the canonical text want. */
static void ok(const char *text, const char *want)
{
	checks++;
	if (chaos_parse_spec(text, &spec, err, sizeof(err))) {
		failures++;
		fprintf(stderr, "'%s' refused: %s\n", text, err);
		return;
	}
	chaos_format_spec(&spec, out, sizeof(out));
	if (strcmp(out, want)) {
		failures++;
		fprintf(stderr, "'%s' -> '%s', want '%s'\n", text, out, want);
	}
}

/* SPEC must be refused with a message containing want. */
static void bad(const char *text, const char *want)
{
	checks++;
	if (!chaos_parse_spec(text, &spec, err, sizeof(err))) {
		failures++;
		fprintf(stderr, "'%s' accepted, want error '%s'\n", text, want);
		return;
	}
	if (!strstr(err, want)) {
		failures++;
		fprintf(stderr, "'%s': error '%s' lacks '%s'\n", text, err, want);
	}
}

static void test_catalogue_defaults(void)
{
	size_t n;
	const struct chaos_fault_def *cat = chaos_catalogue(&n);
	char why[256];

	CHECK(n == 17);
	for (size_t i = 0; i < n; i++)
		for (size_t k = 0; k < cat[i].nkeys; k++) {
			const struct chaos_key_def *key = &cat[i].keys[k];
			struct chaos_value v;

			if (key->def)
				CHECK(chaos_parse_value(key, key->def, strlen(key->def), &v, why, sizeof(why)) == 0);
			CHECK(key->type != CHAOS_T_ENUM || key->nchoices > 0);
		}
}

static void test_valid(void)
{
	ok("nccl-degrade:ib=off", "nccl-degrade:ib=off");
	ok("nccl-degrade:channels=4,ib=off", "nccl-degrade:ib=off,channels=4");
	ok("netem:delay=500ms,loss=1.5%,rate=10MiB", "netem:delay=0.5s,loss=1.5,rate=10M");
	ok("node-drain:after=0.03m", "node-drain:after=1.8s");
	ok("netem:delay=0.000001ms", "netem:delay=0.000000001s");
	bad("netem:delay=0.0000001ms", "(finer than 1ns)");
	bad("node-drain:after=999999999999999d", "(duration too large)");
	bad("netem:loss=1.1234567", "expected a percentage");
	ok("netem:jitter=0.001", "netem:jitter=0.001s");
	ok("ckpt-hang:path=/ckpt/run-1,bytes=1073741824", "ckpt-hang:path=/ckpt/run-1,bytes=1G");
	ok("ckpt-eio:bytes=1000,path=/x", "ckpt-eio:path=/x,bytes=1000");
	ok("slow-rank:rank=007", "slow-rank:rank=7");
	ok("numa-mismatch+nccl-degrade:hca=mlx5_0:1/mlx5_1", "numa-mismatch+nccl-degrade:hca=mlx5_0:1/mlx5_1");
	ok("node-drain:after=2m,node=1", "node-drain:after=120s,node=1");
	ok("rack-loss:switch=sw1", "rack-loss:switch=sw1");
}

static void test_values(void)
{
	const struct chaos_request *r;
	const struct chaos_value *v;

	CHECK(chaos_parse_spec("netem:delay=250ms+nccl-degrade:ib=off", &spec, err, sizeof(err)) == 0);
	r = chaos_find(&spec, "netem");
	CHECK(r && (v = chaos_get(r, "delay")) && v->num == 0.25 && v->given);
	CHECK(r && (v = chaos_get(r, "jitter")) && v->num == 0 && !v->given);   /* a default */
	CHECK(r && chaos_get(r, "iface") == NULL);      /* the site names the interface, not the job */
	CHECK(r && chaos_get(r, "rate") == NULL);               /* unset, no default */
	CHECK(r && chaos_get(r, "nope") == NULL);
	r = chaos_find(&spec, "nccl-degrade");
	CHECK(r && (v = chaos_get(r, "ib")) && !strcmp(v->text, "off"));
	CHECK(chaos_find(&spec, "gpu-xid") == NULL);
	CHECK(chaos_parse_spec("ckpt-full:path=/c,leave=3K", &spec, err, sizeof(err)) == 0);
	CHECK((v = chaos_get(&spec.req[0], "leave")) && v->inum == 3072);
}

static void test_errors(void)
{
	bad("", "empty SPEC");
	bad("bogus", "unknown fault 'bogus' (known: numa-mismatch, ");
	bad("netem:bogus=1", "netem: unknown key 'bogus' (keys: delay, jitter, loss, rate, control)");
	bad("netem:iface=lo", "netem: unknown key 'iface' (keys: delay, jitter, loss, rate, control)");
	bad("netem:delay", "netem: 'delay' is not KEY=VALUE");
	bad("netem:", "netem: no KEY=VALUE after ':'");
	bad("netem:delay=1s,", "netem: '' is not KEY=VALUE");
	bad("netem:delay=1s,delay=2s", "netem: key 'delay' given twice");
	bad("netem+netem", "fault 'netem' given twice");
	bad("netem+", "empty fault (stray '+')");
	bad("+netem", "empty fault (stray '+')");
	bad("nccl-degrade:ib=maybe", "nccl-degrade: ib: bad value 'maybe' (expected one of on, off)");
	bad("netem:delay=5x", "netem: delay: bad value '5x' (expected a duration such as 30s, 500ms, 5m, 1h)");
	bad("netem:delay=61s", "netem: delay: bad value '61s' (above the maximum 60s)");
	bad("netem:loss=100.5", "(above the maximum 100)");
	bad("netem:rate=0", "(below the minimum 1)");
	bad("netem:rate=2T", "(above the maximum 1T)");
	bad("netem:rate=9999999P", "(byte count too large)");
	bad("rack-loss:switch=sw 1", "(expected letters, digits or _ . / @ % : -)");
	bad("rack-loss:switch=", "(expected letters, digits or _ . / @ % : -)");
	bad("slow-rank:rank=-1", "(below the minimum 0)");
	bad("slow-rank:rank=1.5", "(expected an integer)");
	bad("slow-rank:rank=1234567890123456789", "(expected an integer)");
	bad("ckpt-eio", "ckpt-eio: key 'path' is required");
	bad("ckpt-eio:after=1s", "ckpt-eio: key 'path' is required");
	bad("netem:delay=1.", "expected a duration");
	bad("netem:delay=.5s", "expected a duration");
	bad("netem:delay=1234567890123456s", "expected a duration");
	bad("a+b+c+d+e+f+g+h+i", "more than 8 faults");
	bad("bogus:x=1", "bad chaos SPEC 'bogus:x=1': unknown fault 'bogus'");
}

static void test_limits(void)
{
	static char big[CHAOS_SPEC_MAX + 2];
	char value[300];
	char text[400];
	char small[16];

	memset(value, 'a', 256);
	value[256] = '\0';
	snprintf(text, sizeof(text), "rack-loss:switch=%s", value);
	bad(text, "(longer than 255 characters)");
	value[255] = '\0';
	snprintf(text, sizeof(text), "rack-loss:switch=%s", value);
	ok(text, text);
	memset(big, 'x', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	bad(big, "longer than 4096 characters");
	big[CHAOS_SPEC_MAX] = '\0';
	bad(big, "unknown fault");
	/* Truncating error buffers stay NUL-terminated. */
	CHECK(chaos_parse_spec("bogus", &spec, small, sizeof(small)) == -1 && strlen(small) == sizeof(small) - 1);
	CHECK(chaos_parse_spec(NULL, &spec, err, sizeof(err)) == -1);
}

static void test_args(void)
{
	struct chaos_config cfg;
	char *good[] = { "policy=/etc/slurm/p.toml", "journal_dir=/tmp/j" };
	char *unknown[] = { "polcy=/x" };
	char *relative[] = { "journal_dir=tmp" };
	char *old[] = { "allow_users=alice" };
	char e[512];

	CHECK(chaos_parse_args(0, NULL, &cfg, e, sizeof(e)) == 0);
	CHECK(!strcmp(cfg.journal_dir, CHAOS_DEFAULT_JOURNAL_DIR) && !strcmp(cfg.policy, CHAOS_DEFAULT_POLICY));
	CHECK(chaos_parse_args(2, good, &cfg, e, sizeof(e)) == 0);
	CHECK(!strcmp(cfg.policy, "/etc/slurm/p.toml") && !strcmp(cfg.journal_dir, "/tmp/j"));
	CHECK(chaos_parse_args(1, unknown, &cfg, e, sizeof(e)) == -1 && strstr(e, "'polcy=/x'"));
	CHECK(chaos_parse_args(1, relative, &cfg, e, sizeof(e)) == -1 && strstr(e, "absolute"));
	/* The rules no longer ride on the plugstack.conf line. */
	CHECK(chaos_parse_args(1, old, &cfg, e, sizeof(e)) == -1 && strstr(e, "policy file"));
}

static struct chaos_policy pol;

static int policy_ok(const char *text)
{
	char e[512];
	int rc = chaos_policy_parse(text, strlen(text), &pol, e, sizeof(e));

	if (rc)
		fprintf(stderr, "policy refused: %s\n", e);
	return rc == 0;
}

static int policy_bad(const char *text, const char *want)
{
	char e[512];

	if (!chaos_policy_parse(text, strlen(text), &pol, e, sizeof(e)))
		return 0;
	if (!strstr(e, want))
		fprintf(stderr, "policy error '%s' lacks '%s'\n", e, want);
	return strstr(e, want) != NULL;
}

static void test_policy_file(void)
{
	char d[4096];

	CHECK(policy_ok("version = 1\n"));
	CHECK(pol.require_exclusive == 1 && !pol.allow_arrays && !pol.users.set && pol.max_nodes == -1);
	CHECK(policy_ok("# c\n  \nversion=1\nallow_users = [\"root\", \"alice\" ,\"1002\"]\n"
			"allow_partitions = []\nrequire_exclusive = false\nallow_arrays = true\nmax_nodes = 4\n"));
	CHECK(pol.users.n == 3 && pol.partitions.set && pol.partitions.n == 0 && !pol.require_exclusive);
	CHECK(chaos_policy_describe(&pol, d, sizeof(d)) == 0);
	CHECK(!strcmp(d, "users=root,alice,1002 accounts=- partitions= reservations=- exclusive=0 arrays=1 "
		      "het=0 max_nodes=4 job_interface=-"));
	CHECK(policy_ok("version = 1\njob_interface = \"bond0.100\"\n") && !strcmp(pol.job_interface, "bond0.100"));
	CHECK(policy_ok("version = 1\njob_interface = \"a23456789012345\"\n"));
	CHECK(policy_bad("version = 1\njob_interface = \"a234567890123456\"\n", "expected a quoted network interface"));
	CHECK(policy_bad("version = 1\njob_interface = \"..\"\n", "expected a quoted network interface"));
	CHECK(policy_bad("version = 1\njob_interface = \"e/0\"\n", "expected a quoted network interface"));
	CHECK(policy_bad("version = 1\njob_interface = eth0\n", "expected a quoted network interface"));
	CHECK(policy_bad("", "'version = 1' missing"));
	CHECK(policy_bad("version = 2\n", "'version = 1' missing"));
	CHECK(policy_bad("version = 1\nmax_nodes = 0\n", "max_nodes: must be 1 or more"));
	CHECK(policy_bad("version = 1\nallow_users = [\"a\",]\n", "policy line 2: allow_users: '' is not a quoted plain name"));
	CHECK(policy_bad("version = 1\nallow_users = [\"a b\"]\n", "is not a quoted plain name"));
	CHECK(policy_bad("version = 1\nallow_users = \"a\"\n", "expected a list of names"));
	CHECK(policy_bad("version = 1\nversion = 1\n", "policy line 2: version: given twice"));
	CHECK(policy_bad("version = 1\nallow_user = []\n", "unknown key 'allow_user'"));
	CHECK(policy_bad("version = 1 # note\n", "version: expected a whole number"));
	CHECK(policy_bad("version = 1\nrequire_exclusive = yes\n", "expected true or false"));
	CHECK(policy_bad("version = 1\r\n", "policy line 1: control or non-ASCII character"));
	CHECK(policy_bad("version = 1\n[x]\n", "policy line 2: expected KEY = VALUE"));
	{
		static char big[CHAOS_POLICY_MAX + 2];

		memset(big, '#', sizeof(big) - 1);
		big[sizeof(big) - 1] = '\0';
		CHECK(policy_bad(big, "larger than"));
	}
	{
		/* 65 entries: too many; a bad 66th entry is named first, as in policy.py. */
		char many[2048] = "version = 1\nallow_users = [";

		for (int i = 0; i < 65; i++)
			snprintf(many + strlen(many), sizeof(many) - strlen(many), "%s\"u%d\"", i ? ", " : "", i);
		strcat(many, "]\n");
		CHECK(policy_bad(many, "more than 64 entries"));
	}
}

static void test_policy_check(void)
{
	struct chaos_job_facts f = { .uid = 1001, .user = "alice", .partition = "debug", .exclusive = 1,
				     .array = 0, .het = 0, .nodes = 2 };
	char e[512];

	CHECK(policy_ok("version = 1\n"));       /* no allow_users: only root */
	CHECK(chaos_policy_check(&pol, &f, 1, e, sizeof(e)) == -1 && strstr(e, "only root"));
	f.uid = 0;
	CHECK(chaos_policy_check(&pol, &f, 1, e, sizeof(e)) == 0);

	CHECK(policy_ok("version = 1\nallow_users = [\"alice\", \"1002\"]\nallow_partitions = [\"debug\"]\n"
			"max_nodes = 2\n"));
	f.uid = 1001;
	CHECK(chaos_policy_check(&pol, &f, 1, e, sizeof(e)) == 0);
	f.user = "bob";
	CHECK(chaos_policy_check(&pol, &f, 1, e, sizeof(e)) == -1 &&
	      !strcmp(e, "user 'bob' (uid 1001) may not inject faults (not in allow_users)"));
	f.uid = 1002;                     /* allowed by uid */
	CHECK(chaos_policy_check(&pol, &f, 1, e, sizeof(e)) == 0);
	f.partition = "gpu";
	CHECK(chaos_policy_check(&pol, &f, 0, e, sizeof(e)) == -1 && !strcmp(e, "partition 'gpu' is not in allow_partitions"));
	f.partition = NULL;               /* unknown: let through at submission, refused on the node */
	CHECK(chaos_policy_check(&pol, &f, 0, e, sizeof(e)) == 0);
	CHECK(chaos_policy_check(&pol, &f, 1, e, sizeof(e)) == -1 && strstr(e, "partition is not known"));
	f.partition = "debug";
	f.exclusive = 0;
	CHECK(chaos_policy_check(&pol, &f, 0, e, sizeof(e)) == -1 && strstr(e, "--exclusive"));
	f.exclusive = -1;
	CHECK(chaos_policy_check(&pol, &f, 0, e, sizeof(e)) == 0);
	CHECK(chaos_policy_check(&pol, &f, 1, e, sizeof(e)) == -1);
	f.exclusive = 1;
	f.array = 1;
	CHECK(chaos_policy_check(&pol, &f, 1, e, sizeof(e)) == -1 && strstr(e, "array jobs"));
	f.array = -1;
	CHECK(chaos_policy_check(&pol, &f, 1, e, sizeof(e)) == -1 && strstr(e, "array jobs"));
	f.array = 0;
	f.het = 1;
	CHECK(chaos_policy_check(&pol, &f, 1, e, sizeof(e)) == -1 && strstr(e, "heterogeneous"));
	f.het = 0;
	f.nodes = 3;
	CHECK(chaos_policy_check(&pol, &f, 1, e, sizeof(e)) == -1 && !strcmp(e, "the job has 3 nodes (max_nodes 2)"));
	f.nodes = 2;
	CHECK(chaos_policy_check(&pol, &f, 1, e, sizeof(e)) == 0);
	CHECK(policy_ok("version = 1\nallow_users = [\"*\"]\nallow_reservations = [\"*\"]\nrequire_exclusive = false\n"));
	f.user = "anyone";
	f.exclusive = 0;
	CHECK(chaos_policy_check(&pol, &f, 1, e, sizeof(e)) == -1 && strstr(e, "reservation is not known"));
	f.reservation = "maint";
	CHECK(chaos_policy_check(&pol, &f, 1, e, sizeof(e)) == 0);
}

static void test_grant(void)
{
	static struct chaos_grant g;
	const char *good = "job=42\nuid=1001\nuser=alice\naccount=\npartition=debug\nreservation=maint\n"
			   "exclusive=1\narray=0\nhet=\nnodes=2\nspec=netem:delay=0.005s\n";
	const char *refused = "job=42\nuid=0\nspec=netem\nrefused=the job does not hold its nodes exclusively\n";
	struct chaos_job_facts f;
	char e[512];

	CHECK(chaos_grant_parse(good, strlen(good), &g, e, sizeof(e)) == 0);
	CHECK(!strcmp(g.job, "42") && g.uid == 1001 && !strcmp(g.spec, "netem:delay=0.005s") && !g.refused);
	chaos_grant_facts(&g, &f);
	CHECK(f.exclusive == 1 && f.array == 0 && f.het == -1 && f.nodes == 2 && !strcmp(f.reservation, "maint"));
	CHECK(chaos_grant_parse(refused, strlen(refused), &g, e, sizeof(e)) == 0 && g.refused &&
	      strstr(g.why, "exclusively"));
	CHECK(chaos_grant_parse("job=1\nspec=x\n", 13, &g, e, sizeof(e)) == -1 && strstr(e, "missing"));
	CHECK(chaos_grant_parse("job=x1\nuid=0\nspec=x\n", 19, &g, e, sizeof(e)) == -1);
	CHECK(chaos_grant_parse("job=1\nuid=0\nspec=x\nbogus=1\n", 27, &g, e, sizeof(e)) == -1 && strstr(e, "line 4"));
	CHECK(chaos_grant_parse("job=1\nuid=0\nspec=x\nexclusive=2\n", 31, &g, e, sizeof(e)) == -1);
	/* A grant holds until its job's end: one left behind grants a reused job id nothing. */
	CHECK(chaos_grant_parse(good, strlen(good), &g, e, sizeof(e)) == 0 && g.submit == -1 && g.until == -1);
	CHECK(chaos_grant_current(&g, 1000, e, sizeof(e)) == -1 && strstr(e, "no end"));
	const char *timed = "job=42\nuid=1001\nspec=netem\nsubmit=1700000000\nuntil=1700003600\n";
	CHECK(chaos_grant_parse(timed, strlen(timed), &g, e, sizeof(e)) == 0 && g.submit == 1700000000 &&
	      g.until == 1700003600);
	CHECK(chaos_grant_current(&g, 1700003600, e, sizeof(e)) == 0);
	CHECK(chaos_grant_current(&g, 1700003601, e, sizeof(e)) == -1 && strstr(e, "expired 1 s ago"));
	const char *negative = "job=1\nuid=0\nspec=x\nuntil=-5\n", *empty = "job=1\nuid=0\nspec=x\nuntil=\n";
	CHECK(chaos_grant_parse(negative, strlen(negative), &g, e, sizeof(e)) == -1);
	CHECK(chaos_grant_parse(empty, strlen(empty), &g, e, sizeof(e)) == 0 && g.until == -1);
}

static void test_root_files(void)
{
	char path[] = "/tmp/test_policy_XXXXXX", e[512];
	const char *text = "version = 1\n";
	int fd = mkstemp(path);

	CHECK(fd >= 0);
	if (fd < 0)
		return;
	CHECK(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
	close(fd);
	chmod(path, 0644);
	if (geteuid() == 0) {
		CHECK(chaos_policy_load(path, &pol, e, sizeof(e)) == 0);
		chmod(path, 0664);
		CHECK(chaos_policy_load(path, &pol, e, sizeof(e)) == -1 && strstr(e, "writable by group or others"));
		chmod(path, 0644);
		CHECK(chown(path, 1000, 1000) == 0);
		CHECK(chaos_policy_load(path, &pol, e, sizeof(e)) == -1 && strstr(e, "owned by uid 1000, not root"));
	} else {
		CHECK(chaos_policy_load(path, &pol, e, sizeof(e)) == -1 && strstr(e, "not root"));
	}
	unlink(path);
	CHECK(chaos_policy_load(path, &pol, e, sizeof(e)) == -1 && strstr(e, "No such file"));
	CHECK(symlink("/etc/hostname", path) == 0);
	CHECK(chaos_policy_load(path, &pol, e, sizeof(e)) == -1);   /* O_NOFOLLOW */
	unlink(path);
}

static void test_helpers(void)
{
	uint64_t mask[CHAOS_MAX_CPUS / 64];
	size_t nw = sizeof(mask) / sizeof(mask[0]);
	char buf[64];

	CHECK(chaos_parse_cpulist("0-3,8,10-11\n", mask, nw) == 7);
	CHECK(chaos_format_cpulist(mask, nw, buf, sizeof(buf)) == 0 && !strcmp(buf, "0-3,8,10-11"));
	CHECK(chaos_parse_cpulist("", mask, nw) == 0);
	CHECK(chaos_parse_cpulist("3-1", mask, nw) == -1);
	CHECK(chaos_parse_cpulist("1,,2", mask, nw) == -1);
	CHECK(chaos_parse_cpulist("4096", mask, nw) == -1);
	CHECK(chaos_parse_cpulist("1-2x", mask, nw) == -1);
	CHECK(chaos_parse_cpulist("0,0,0", mask, nw) == 1);
	CHECK(chaos_format_cpulist(mask, nw, buf, 1) == -1);
	CHECK(chaos_parse_cpulist("0-4095", mask, nw) == 4096);
	CHECK(chaos_format_cpulist(mask, nw, buf, 4) == -1);
	CHECK(chaos_json_string("a\"b\\c\n", buf, sizeof(buf)) == 0 && !strcmp(buf, "\"a\\\"b\\\\c\\u000a\""));
	CHECK(chaos_json_string("abcdef", buf, 4) == -1);
	CHECK(chaos_env_name("nccl-degrade", "ib", buf, sizeof(buf)) == 0 && !strcmp(buf, "SLURM_CHAOS_NCCL_DEGRADE_IB"));
	chaos_format_fixed(0.1, buf, sizeof(buf));
	CHECK(!strcmp(buf, "0.1"));
	chaos_format_fixed(120.0, buf, sizeof(buf));
	CHECK(!strcmp(buf, "120"));
}

int main(void)
{
	test_catalogue_defaults();
	test_valid();
	test_values();
	test_errors();
	test_limits();
	test_args();
	test_policy_file();
	test_policy_check();
	test_grant();
	test_root_files();
	test_helpers();
	printf("test_parse: %d checks, %d failures\n", checks, failures);
	return failures ? 1 : 0;
}
