/*
 * policy.c - the policy file, the decision on a job's facts and the grant file (no spank.h).
 *
 * Both files are read as root in slurmstepd. Every read is bounded, every copy has an explicit
 * size, and every message uses the words of slurm_chaos/faults/policy.py, which reads the same
 * policy file in the prolog hooks (tests/unit/test_spank_parser.py holds the two together).
 */
#include "policy.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void fmt(char *buf, size_t len, const char *format, ...) __attribute__((format(printf, 3, 4)));

static void fmt(char *buf, size_t len, const char *format, ...)
{
	va_list ap;

	if (!buf || !len)
		return;
	va_start(ap, format);
	vsnprintf(buf, len, format, ap);
	va_end(ap);
}

/* --- reading a root-owned file ------------------------------------------------------------ */

/*
 * Read at most max bytes of path into buf (NUL-terminated, buf holds max + 2): no symlink, a
 * regular file of root's that neither group nor others may write. Returns the length read (max
 * + 1 if the file is larger), or -1 with the reason in err.
 */
static long read_root_file(const char *what, const char *path, char *buf, size_t max, char *err,
			   size_t errlen)
{
	struct stat st;
	size_t used = 0;
	int fd;

	fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
	if (fd < 0) {
		fmt(err, errlen, "%s %s: %s", what, path, strerror(errno));
		return -1;
	}
	if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
		fmt(err, errlen, "%s %s: not a regular file", what, path);
		close(fd);
		return -1;
	}
	if (st.st_uid != 0) {
		fmt(err, errlen, "%s %s: owned by uid %lu, not root", what, path, (unsigned long)st.st_uid);
		close(fd);
		return -1;
	}
	if (st.st_mode & 022) {
		fmt(err, errlen, "%s %s: writable by group or others (mode %o)", what, path,
		    (unsigned)(st.st_mode & 0777));
		close(fd);
		return -1;
	}
	while (used < max + 1) {
		ssize_t got = read(fd, buf + used, max + 1 - used);

		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0) {
			fmt(err, errlen, "%s %s: %s", what, path, strerror(errno));
			close(fd);
			return -1;
		}
		if (got == 0)
			break;
		used += (size_t)got;
	}
	close(fd);
	buf[used] = '\0';
	return (long)used;
}

/* --- the policy file ------------------------------------------------------------------------ */

enum kind { K_LIST, K_BOOL, K_INT, K_STR };

static const struct {
	const char *name;
	enum kind kind;
} keys[] = {
	{ "allow_users", K_LIST },       { "allow_accounts", K_LIST },   { "allow_partitions", K_LIST },
	{ "allow_reservations", K_LIST }, { "require_exclusive", K_BOOL }, { "allow_arrays", K_BOOL },
	{ "allow_het_jobs", K_BOOL },     { "version", K_INT },          { "max_nodes", K_INT },
	{ "job_interface", K_STR },
};
#define NKEYS (sizeof(keys) / sizeof(keys[0]))

static int is_ws(char c)
{
	return c == ' ' || c == '\t';
}

static int name_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
	       c == '.' || c == '@' || c == '*' || c == '+' || c == '-';
}

static void trim(const char **s, const char **e)
{
	while (*s < *e && is_ws(**s))
		(*s)++;
	while (*e > *s && is_ws((*e)[-1]))
		(*e)--;
}

static int parse_list(const char *key, const char *s, const char *e, struct chaos_list *l, char *why,
		      size_t whylen)
{
	size_t count = 0;

	if (e - s < 2 || *s != '[' || e[-1] != ']') {
		fmt(why, whylen, "%s: expected a list of names on one line", key);
		return -1;
	}
	s++;
	e--;
	trim(&s, &e);
	l->set = 1;
	l->n = 0;
	if (s == e)
		return 0;
	for (;;) {
		const char *comma = memchr(s, ',', (size_t)(e - s));
		const char *is = s, *ie = comma ? comma : e, *ns, *ne;
		int good;

		trim(&is, &ie);
		ns = is + 1;
		ne = ie - 1;
		good = ie - is >= 2 && *is == '"' && ie[-1] == '"' && ne > ns && ne - ns < CHAOS_NAME_MAX;
		for (const char *c = ns; good && c < ne; c++)
			good = name_char(*c);
		if (!good) {
			fmt(why, whylen, "%s: '%.*s' is not a quoted plain name", key, (int)(ie - is), is);
			return -1;
		}
		if (count < CHAOS_LIST_MAX) {
			l->item[count].p = ns;
			l->item[count].len = (size_t)(ne - ns);
		}
		count++;
		if (!comma)
			break;
		s = comma + 1;
	}
	if (count > CHAOS_LIST_MAX) {
		fmt(why, whylen, "%s: more than %d entries", key, CHAOS_LIST_MAX);
		return -1;
	}
	l->n = count;
	return 0;
}

static int parse_number(const char *key, const char *s, const char *e, long *out, char *why, size_t whylen)
{
	long v = 0;

	if (e == s || e - s > 9) {
		fmt(why, whylen, "%s: expected a whole number", key);
		return -1;
	}
	for (const char *c = s; c < e; c++) {
		if (*c < '0' || *c > '9') {
			fmt(why, whylen, "%s: expected a whole number", key);
			return -1;
		}
		v = v * 10 + (*c - '0');
	}
	*out = v;
	return 0;
}

static int parse_flag(const char *key, const char *s, const char *e, int *out, char *why, size_t whylen)
{
	size_t n = (size_t)(e - s);

	if (n == 4 && !memcmp(s, "true", 4))
		*out = 1;
	else if (n == 5 && !memcmp(s, "false", 5))
		*out = 0;
	else {
		fmt(why, whylen, "%s: expected true or false", key);
		return -1;
	}
	return 0;
}

static int iface_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
	       c == '.' || c == '-';
}

/* A quoted network interface name (policy.py IFACE_RE): 1 to 15 characters, not "." or "..". */
static int parse_iface(const char *key, const char *s, const char *e, char *out, char *why, size_t whylen)
{
	size_t n = (size_t)(e - s);
	int good = n >= 3 && *s == '"' && e[-1] == '"' && n - 2 < CHAOS_IFACE_MAX;

	for (const char *c = s + 1; good && c < e - 1; c++)
		good = iface_char(*c);
	if (good && ((n == 3 && s[1] == '.') || (n == 4 && s[1] == '.' && s[2] == '.')))
		good = 0;
	if (!good) {
		fmt(why, whylen, "%s: expected a quoted network interface name", key);
		return -1;
	}
	memcpy(out, s + 1, n - 2);
	out[n - 2] = '\0';
	return 0;
}

static struct chaos_list *list_of(struct chaos_policy *p, const char *key)
{
	if (!strcmp(key, "allow_users"))
		return &p->users;
	if (!strcmp(key, "allow_accounts"))
		return &p->accounts;
	if (!strcmp(key, "allow_partitions"))
		return &p->partitions;
	return &p->reservations;
}

static int *flag_of(struct chaos_policy *p, const char *key)
{
	if (!strcmp(key, "require_exclusive"))
		return &p->require_exclusive;
	if (!strcmp(key, "allow_arrays"))
		return &p->allow_arrays;
	return &p->allow_het_jobs;
}

/* One non-blank, non-comment line; returns 0 or -1 with the problem (without "policy line N"). */
static int parse_line(struct chaos_policy *p, const char *s, const char *e, unsigned *seen, long *version,
		      char *why, size_t whylen)
{
	const char *ks = s, *ke, *vs, *ve = e;
	char key[32];
	size_t k;

	while (ks < e && is_ws(*ks))
		ks++;
	ke = ks;
	while (ke < e && ((*ke >= 'a' && *ke <= 'z') || *ke == '_'))
		ke++;
	vs = ke;
	while (vs < e && is_ws(*vs))
		vs++;
	if (ke == ks || vs == e || *vs != '=') {
		fmt(why, whylen, "expected KEY = VALUE");
		return -1;
	}
	vs++;
	trim(&vs, &ve);
	for (k = 0; k < NKEYS; k++)
		if (strlen(keys[k].name) == (size_t)(ke - ks) && !memcmp(keys[k].name, ks, (size_t)(ke - ks)))
			break;
	if (k == NKEYS) {
		fmt(why, whylen, "unknown key '%.*s'", (int)(ke - ks), ks);
		return -1;
	}
	snprintf(key, sizeof(key), "%s", keys[k].name);
	if (*seen & (1u << k)) {
		fmt(why, whylen, "%s: given twice", key);
		return -1;
	}
	*seen |= 1u << k;
	switch (keys[k].kind) {
	case K_LIST:
		return parse_list(key, vs, ve, list_of(p, key), why, whylen);
	case K_BOOL:
		return parse_flag(key, vs, ve, flag_of(p, key), why, whylen);
	case K_STR:
		return parse_iface(key, vs, ve, p->job_interface, why, whylen);
	default:
		return parse_number(key, vs, ve, !strcmp(key, "version") ? version : &p->max_nodes, why, whylen);
	}
}

int chaos_policy_parse(const char *text, size_t len, struct chaos_policy *p, char *err, size_t errlen)
{
	char why[CHAOS_POLICY_MAX + 256];
	unsigned seen = 0, number = 0;
	long version = -1;
	const char *s, *end;

	memset(p, 0, sizeof(*p));
	p->require_exclusive = 1;
	p->max_nodes = -1;
	if (!text || len > CHAOS_POLICY_MAX) {
		fmt(err, errlen, "policy: larger than %d bytes", CHAOS_POLICY_MAX);
		return -1;
	}
	memcpy(p->store, text, len);
	p->store[len] = '\0';
	end = p->store + len;
	for (s = p->store; s <= end; number++) {
		const char *e = memchr(s, '\n', (size_t)(end - s)), *c;

		if (!e)
			e = end;
		for (c = s; c < e; c++)
			if (((unsigned char)*c < 0x20 && *c != '\t') || (unsigned char)*c >= 0x7f)
				break;
		if (c < e) {
			fmt(err, errlen, "policy line %u: control or non-ASCII character", number + 1);
			return -1;
		}
		for (c = s; c < e && is_ws(*c); c++)
			;
		if (c < e && *c != '#' && parse_line(p, s, e, &seen, &version, why, sizeof(why))) {
			fmt(err, errlen, "policy line %u: %s", number + 1, why);
			return -1;
		}
		s = e + 1;
	}
	if (version != 1) {
		fmt(err, errlen, "policy: 'version = 1' missing or another version");
		return -1;
	}
	if (p->max_nodes == 0) {
		fmt(err, errlen, "policy: max_nodes: must be 1 or more");
		return -1;
	}
	return 0;
}

int chaos_policy_load(const char *path, struct chaos_policy *p, char *err, size_t errlen)
{
	static char buf[CHAOS_POLICY_MAX + 2];
	long n = read_root_file("policy", path, buf, CHAOS_POLICY_MAX, err, errlen);

	if (n < 0) {
		memset(p, 0, sizeof(*p));
		return -1;
	}
	return chaos_policy_parse(buf, (size_t)n, p, err, errlen);
}

static int describe_list(const struct chaos_list *l, char *buf, size_t len)
{
	size_t used = 0;
	int n;

	if (!l->set)
		return snprintf(buf, len, "-") >= (int)len ? -1 : 0;
	buf[0] = '\0';
	for (size_t i = 0; i < l->n; i++) {
		n = snprintf(buf + used, len - used, "%s%.*s", i ? "," : "", (int)l->item[i].len, l->item[i].p);
		if (n < 0 || (size_t)n >= len - used)
			return -1;
		used += (size_t)n;
	}
	return 0;
}

int chaos_policy_describe(const struct chaos_policy *p, char *buf, size_t len)
{
	static char lists[4][CHAOS_LIST_MAX * CHAOS_NAME_MAX + 2];
	const struct chaos_list *ls[4] = { &p->users, &p->accounts, &p->partitions, &p->reservations };
	int n;

	for (int i = 0; i < 4; i++)
		if (describe_list(ls[i], lists[i], sizeof(lists[i])))
			return -1;
	n = snprintf(buf, len, "users=%s accounts=%s partitions=%s reservations=%s exclusive=%d arrays=%d "
		     "het=%d max_nodes=%ld job_interface=%s", lists[0], lists[1], lists[2], lists[3],
		     p->require_exclusive, p->allow_arrays, p->allow_het_jobs, p->max_nodes,
		     p->job_interface[0] ? p->job_interface : "-");
	return n < 0 || (size_t)n >= len ? -1 : 0;
}

/* --- the decision ------------------------------------------------------------------------- */

static int name_is(const struct chaos_name *item, const char *name)
{
	return strlen(name) == item->len && !memcmp(item->p, name, item->len);
}

int chaos_list_contains(const struct chaos_list *l, const char *name)
{
	if (!name || !*name)
		return 0;
	for (size_t i = 0; i < l->n; i++)
		if (name_is(&l->item[i], "*") || name_is(&l->item[i], name))
			return 1;
	return 0;
}

int chaos_user_check(const struct chaos_policy *p, uid_t uid, const char *user, char *err, size_t errlen)
{
	char num[32];

	snprintf(num, sizeof(num), "%lu", (unsigned long)uid);
	if (uid == 0 || chaos_list_contains(&p->users, user) || chaos_list_contains(&p->users, num))
		return 0;
	fmt(err, errlen, "user '%s' (uid %lu) may not inject faults (%s)", user && *user ? user : "?",
	    (unsigned long)uid, p->users.set ? "not in allow_users" : "only root: allow_users is not set");
	return -1;
}

/* One allow_* rule on a fact that may be unknown (NULL or empty). */
static int check_rule(const struct chaos_list *l, const char *key, const char *what, const char *value,
		      int final, char *err, size_t errlen)
{
	if (!l->set || chaos_list_contains(l, value))
		return 0;
	if (!value || !*value) {
		if (!final)
			return 0;
		fmt(err, errlen, "the job's %s is not known but %s is set in the policy", what, key);
		return -1;
	}
	fmt(err, errlen, "%s '%s' is not in %s", what, value, key);
	return -1;
}

/* A yes/no rule: fact must be `want`; -1 (unknown) passes only when not final. */
static int check_flag(int fact, int want, int final)
{
	return fact == want || (fact < 0 && !final);
}

int chaos_policy_check(const struct chaos_policy *p, const struct chaos_job_facts *f, int final,
		       char *err, size_t errlen)
{
	if (chaos_user_check(p, f->uid, f->user, err, errlen))
		return -1;
	if (check_rule(&p->accounts, "allow_accounts", "account", f->account, final, err, errlen) ||
	    check_rule(&p->partitions, "allow_partitions", "partition", f->partition, final, err, errlen) ||
	    check_rule(&p->reservations, "allow_reservations", "reservation", f->reservation, final, err,
		       errlen))
		return -1;
	if (p->require_exclusive && !check_flag(f->exclusive, 1, final)) {
		fmt(err, errlen, "the job does not hold its nodes exclusively (require_exclusive: submit with "
		    "--exclusive)");
		return -1;
	}
	if (!p->allow_arrays && !check_flag(f->array, 0, final)) {
		fmt(err, errlen, "array jobs may not inject faults (allow_arrays is not set)");
		return -1;
	}
	if (!p->allow_het_jobs && !check_flag(f->het, 0, final)) {
		fmt(err, errlen, "heterogeneous jobs may not inject faults (allow_het_jobs is not set)");
		return -1;
	}
	if (p->max_nodes >= 0 && (f->nodes > p->max_nodes || (f->nodes < 0 && final))) {
		if (f->nodes < 0)
			fmt(err, errlen, "the job has an unknown number of nodes (max_nodes %ld)", p->max_nodes);
		else
			fmt(err, errlen, "the job has %ld nodes (max_nodes %ld)", f->nodes, p->max_nodes);
		return -1;
	}
	return 0;
}

/* --- the grant file -------------------------------------------------------------------------- */

static int copy_value(char *dst, size_t len, const char *s, const char *e)
{
	if ((size_t)(e - s) >= len)
		return -1;
	memcpy(dst, s, (size_t)(e - s));
	dst[e - s] = '\0';
	return 0;
}

static int tristate(const char *s, const char *e, int *out)
{
	if (s == e)
		*out = -1;
	else if (e - s == 1 && (*s == '0' || *s == '1'))
		*out = *s - '0';
	else
		return -1;
	return 0;
}

static int digits(const char *s, const char *e, long long *out)
{
	long long v = 0;

	if (s == e || e - s > 12)
		return -1;
	for (const char *c = s; c < e; c++) {
		if (*c < '0' || *c > '9')
			return -1;
		v = v * 10 + (*c - '0');
	}
	*out = v;
	return 0;
}

static int grant_field(struct chaos_grant *g, const char *k, size_t klen, const char *s, const char *e)
{
	long long n;

#define KEY(name) (klen == strlen(name) && !memcmp(k, name, klen))
	if (KEY("job"))
		return digits(s, e, &n) || copy_value(g->job, sizeof(g->job), s, e);
	if (KEY("uid"))
		return digits(s, e, &g->uid);
	if (KEY("user"))
		return copy_value(g->user, sizeof(g->user), s, e);
	if (KEY("account"))
		return copy_value(g->account, sizeof(g->account), s, e);
	if (KEY("partition"))
		return copy_value(g->partition, sizeof(g->partition), s, e);
	if (KEY("reservation"))
		return copy_value(g->reservation, sizeof(g->reservation), s, e);
	if (KEY("exclusive"))
		return tristate(s, e, &g->exclusive);
	if (KEY("array"))
		return tristate(s, e, &g->array);
	if (KEY("het"))
		return tristate(s, e, &g->het);
	if (KEY("nodes")) {
		if (s == e) {
			g->nodes = -1;
			return 0;
		}
		if (digits(s, e, &n) || n > 1000000000LL)
			return -1;
		g->nodes = (long)n;
		return 0;
	}
	if (KEY("spec"))
		return copy_value(g->spec, sizeof(g->spec), s, e);
	if (KEY("submit") || KEY("until")) {
		long long *out = KEY("submit") ? &g->submit : &g->until;

		if (s == e) {
			*out = -1;
			return 0;
		}
		return digits(s, e, out);
	}
	if (KEY("refused")) {
		g->refused = 1;
		return copy_value(g->why, sizeof(g->why), s, e);
	}
#undef KEY
	return -1;
}

int chaos_grant_parse(const char *text, size_t len, struct chaos_grant *g, char *err, size_t errlen)
{
	const char *s = text, *end = text + len;
	unsigned line = 0;

	memset(g, 0, sizeof(*g));
	g->uid = -1;
	g->exclusive = g->array = g->het = -1;
	g->nodes = -1;
	g->submit = g->until = -1;
	if (!text || len > CHAOS_GRANT_MAX) {
		fmt(err, errlen, "grant: larger than %d bytes", CHAOS_GRANT_MAX);
		return -1;
	}
	while (s < end) {
		const char *e = memchr(s, '\n', (size_t)(end - s)), *eq;

		line++;
		if (!e)
			e = end;
		eq = memchr(s, '=', (size_t)(e - s));
		if (!eq || memchr(s, '\0', (size_t)(e - s)) || grant_field(g, s, (size_t)(eq - s), eq + 1, e)) {
			fmt(err, errlen, "grant line %u: not a known KEY=VALUE", line);
			return -1;
		}
		s = e + 1;
	}
	if (!g->job[0] || g->uid < 0 || !g->spec[0]) {
		fmt(err, errlen, "grant: job, uid or spec missing");
		return -1;
	}
	return 0;
}

int chaos_grant_load(const char *path, struct chaos_grant *g, char *err, size_t errlen)
{
	static char buf[CHAOS_GRANT_MAX + 2];
	long n = read_root_file("grant", path, buf, CHAOS_GRANT_MAX, err, errlen);

	if (n < 0) {
		memset(g, 0, sizeof(*g));
		return -1;
	}
	return chaos_grant_parse(buf, (size_t)n, g, err, errlen);
}

int chaos_grant_current(const struct chaos_grant *g, long long now, char *err, size_t errlen)
{
	if (g->until < 0) {
		fmt(err, errlen, "the grant has no end (until=): written by an older prolog; the job's next "
		    "run decides again");
		return -1;
	}
	if (now > g->until) {
		fmt(err, errlen, "the grant expired %lld s ago (until=%lld): it was written for an earlier run "
		    "of this job id", now - g->until, g->until);
		return -1;
	}
	return 0;
}

void chaos_grant_facts(const struct chaos_grant *g, struct chaos_job_facts *f)
{
	f->uid = (uid_t)g->uid;
	f->user = g->user;
	f->account = g->account;
	f->partition = g->partition;
	f->reservation = g->reservation;
	f->exclusive = g->exclusive;
	f->array = g->array;
	f->het = g->het;
	f->nodes = g->nodes;
}
