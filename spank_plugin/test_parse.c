/* Unit tests for parse.c (no Slurm needed): make test. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parse.h"

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
	CHECK(r && (v = chaos_get(r, "iface")) && !strcmp(v->text, "eth0") && !v->given);
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
	bad("netem:bogus=1", "netem: unknown key 'bogus' (keys: iface, delay, jitter, loss, rate)");
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
	bad("netem:iface=eth 0", "(expected letters, digits or _ . / @ % : -)");
	bad("netem:iface=", "(expected letters, digits or _ . / @ % : -)");
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

static void test_args_and_policy(void)
{
	struct chaos_config cfg;
	char *good[] = { "allow_users=alice,1002", "allow_partitions=debug", "require_exclusive=1",
			 "journal_dir=/tmp/j" };
	char *unknown[] = { "allow_user=alice" };
	char *relative[] = { "journal_dir=tmp" };
	char *empty[] = { "allow_users=a,,b" };
	char *twice[] = { "allow_users=a", "allow_users=b" };
	struct chaos_job_facts f = { 1001, "alice", NULL, "debug", NULL, 1 };
	char e[512];

	CHECK(chaos_parse_args(0, NULL, &cfg, e, sizeof(e)) == 0);
	CHECK(!strcmp(cfg.journal_dir, CHAOS_DEFAULT_JOURNAL_DIR) && !cfg.users.set);
	/* Default policy: only root. */
	CHECK(chaos_policy_check(&cfg, &f, 1, e, sizeof(e)) == -1 && strstr(e, "only root"));
	f.uid = 0;
	CHECK(chaos_policy_check(&cfg, &f, 1, e, sizeof(e)) == 0);

	CHECK(chaos_parse_args(4, good, &cfg, e, sizeof(e)) == 0);
	CHECK(cfg.users.n == 2 && cfg.require_exclusive == 1 && !strcmp(cfg.journal_dir, "/tmp/j"));
	f.uid = 1001;
	CHECK(chaos_policy_check(&cfg, &f, 1, e, sizeof(e)) == 0);
	f.user = "bob";
	CHECK(chaos_policy_check(&cfg, &f, 1, e, sizeof(e)) == -1 && strstr(e, "user 'bob' (uid 1001)"));
	f.uid = 1002;                     /* allowed by uid */
	CHECK(chaos_policy_check(&cfg, &f, 1, e, sizeof(e)) == 0);
	f.partition = "gpu";
	CHECK(chaos_policy_check(&cfg, &f, 0, e, sizeof(e)) == -1 && strstr(e, "partition 'gpu' is not in allow_partitions"));
	f.partition = NULL;               /* unknown: let through at submission, refuse on the node */
	CHECK(chaos_policy_check(&cfg, &f, 0, e, sizeof(e)) == 0);
	CHECK(chaos_policy_check(&cfg, &f, 1, e, sizeof(e)) == -1 && strstr(e, "partition is not known"));
	f.partition = "debug";
	f.exclusive = 0;
	CHECK(chaos_policy_check(&cfg, &f, 0, e, sizeof(e)) == -1 && strstr(e, "--exclusive"));
	f.exclusive = -1;
	CHECK(chaos_policy_check(&cfg, &f, 0, e, sizeof(e)) == 0);
	CHECK(chaos_policy_check(&cfg, &f, 1, e, sizeof(e)) == -1);

	CHECK(chaos_parse_args(1, unknown, &cfg, e, sizeof(e)) == -1 && strstr(e, "'allow_user=alice'"));
	CHECK(chaos_parse_args(1, relative, &cfg, e, sizeof(e)) == -1 && strstr(e, "absolute"));
	CHECK(chaos_parse_args(1, empty, &cfg, e, sizeof(e)) == -1 && strstr(e, "empty"));
	CHECK(chaos_parse_args(2, twice, &cfg, e, sizeof(e)) == -1 && strstr(e, "twice"));
	{
		char *star[] = { "allow_users=*" };
		CHECK(chaos_parse_args(1, star, &cfg, e, sizeof(e)) == 0);
		f.user = "anyone";
		CHECK(chaos_policy_check(&cfg, &f, 1, e, sizeof(e)) == 0);
	}
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
	test_args_and_policy();
	test_helpers();
	printf("test_parse: %d checks, %d failures\n", checks, failures);
	return failures ? 1 : 0;
}
