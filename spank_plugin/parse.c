/*
 * parse.c - SPEC grammar, plugstack.conf arguments and small helpers (no spank.h).
 *
 * Everything works on (pointer, length) views of the caller's text and writes only into
 * fixed-size buffers with explicit bounds: this code reads whatever a user types after
 * --chaos= and runs inside srun, sbatch and slurmstepd (as root).
 */
#define _GNU_SOURCE             /* newlocale/uselocale */
#include "parse.h"

#include <ctype.h>
#include <locale.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "catalogue.h"

/* Problem text can quote a whole value or SPEC, so it gets room for one. */
#define PROBLEM_MAX (CHAOS_SPEC_MAX + 1024)

static const char *const type_expect[] = {
	[CHAOS_T_INT] = "expected an integer",
	[CHAOS_T_FLOAT] = "expected a number such as 1.5",
	[CHAOS_T_DURATION] = "expected a duration such as 30s, 500ms, 5m, 1h",
	[CHAOS_T_PERCENT] = "expected a percentage such as 50 or 12.5%",
	[CHAOS_T_STR] = "expected letters, digits or _ . / @ % : -",
	[CHAOS_T_ENUM] = NULL,          /* built from the choices */
	[CHAOS_T_BYTES] = "expected a byte count such as 4096, 512K, 1G",
};

static void fmt(char *buf, size_t len, const char *format, ...)
	__attribute__((format(printf, 3, 4)));

static void fmt(char *buf, size_t len, const char *format, ...)
{
	va_list ap;

	if (!buf || !len)
		return;
	va_start(ap, format);
	vsnprintf(buf, len, format, ap);
	va_end(ap);
}

/* --- catalogue ----------------------------------------------------------------------- */

const struct chaos_fault_def *chaos_catalogue(size_t *n)
{
	*n = CHAOS_NFAULTS;
	return chaos_faults;
}

const struct chaos_fault_def *chaos_fault_lookup(const char *name, size_t len)
{
	for (size_t i = 0; i < CHAOS_NFAULTS; i++)
		if (strlen(chaos_faults[i].name) == len && !memcmp(chaos_faults[i].name, name, len))
			return &chaos_faults[i];
	return NULL;
}

static int key_index(const struct chaos_fault_def *f, const char *name, size_t len)
{
	for (size_t i = 0; i < f->nkeys; i++)
		if (strlen(f->keys[i].name) == len && !memcmp(f->keys[i].name, name, len))
			return (int)i;
	return -1;
}

/* --- value grammar (catalogue.py regexes, one function per type) -------------------- */

static size_t count_digits(const char *s, size_t len, size_t pos)
{
	size_t n = 0;

	while (pos + n < len && s[pos + n] >= '0' && s[pos + n] <= '9')
		n++;
	return n;
}

/* [0-9]{1,maxi}(\.[0-9]{1,maxf})? at *pos; advances *pos. */
static int match_decimal(const char *s, size_t len, size_t *pos, size_t maxi, size_t maxf)
{
	size_t n = count_digits(s, len, *pos);

	if (n < 1 || n > maxi)
		return 0;
	*pos += n;
	if (*pos < len && s[*pos] == '.') {
		n = count_digits(s, len, *pos + 1);
		if (n < 1 || n > maxf)
			return 0;
		*pos += 1 + n;
	}
	return 1;
}

/* strtod on a validated, bounded slice (never reads past len). */
static double slice_double(const char *s, size_t len)
{
	char tmp[64];

	if (len >= sizeof(tmp))
		len = sizeof(tmp) - 1;
	memcpy(tmp, s, len);
	tmp[len] = '\0';
	return strtod(tmp, NULL);
}

static long long slice_ll(const char *s, size_t len)
{
	char tmp[32];

	if (len >= sizeof(tmp))
		len = sizeof(tmp) - 1;
	memcpy(tmp, s, len);
	tmp[len] = '\0';
	return strtoll(tmp, NULL, 10);
}

static int parse_int(const char *s, size_t len, struct chaos_value *v)
{
	size_t pos = (len && s[0] == '-') ? 1 : 0;
	size_t n = count_digits(s, len, pos);

	if (n < 1 || n > 18 || pos + n != len)
		return -1;
	v->inum = slice_ll(s, len);
	v->num = (double)v->inum;
	return 0;
}

static int parse_float(const char *s, size_t len, struct chaos_value *v)
{
	size_t pos = (len && s[0] == '-') ? 1 : 0;

	if (!match_decimal(s, len, &pos, 9, 6) || pos != len)
		return -1;
	v->num = slice_double(s, len);
	return 0;
}

#define NS_PER_S 1000000000LL

/*
 * Durations are whole nanoseconds computed with integers (catalogue.py duration_ns), so C and
 * Python agree to the last digit. Returns -1 bad syntax, -3 finer than 1ns, -4 too large.
 */
static int parse_duration(const char *s, size_t len, struct chaos_value *v)
{
	static const struct { const char *unit; long long ns; } units[] = {
		{ "ms", 1000000LL }, { "s", NS_PER_S }, { "m", 60 * NS_PER_S }, { "h", 3600 * NS_PER_S },
		{ "d", 86400 * NS_PER_S }, { "", NS_PER_S },
	};
	size_t nw = count_digits(s, len, 0), nf = 0, pos;
	__int128 scaled, pow10 = 1;
	long long whole, frac = 0;

	if (nw < 1 || nw > 15)
		return -1;
	pos = nw;
	whole = slice_ll(s, nw);
	if (pos < len && s[pos] == '.') {
		nf = count_digits(s, len, pos + 1);
		if (nf < 1 || nf > 9)
			return -1;
		frac = slice_ll(s + pos + 1, nf);
		pos += 1 + nf;
	}
	for (size_t i = 0; i < nf; i++)
		pow10 *= 10;
	for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
		size_t ulen = strlen(units[i].unit);

		if (len - pos != ulen || memcmp(s + pos, units[i].unit, ulen))
			continue;
		scaled = ((__int128)whole * pow10 + frac) * units[i].ns;
		if (scaled % pow10)
			return -3;
		if (scaled / pow10 > (__int128)0x7fffffffffffffffLL)
			return -4;
		v->inum = (long long)(scaled / pow10);
		v->num = (double)v->inum / (double)NS_PER_S;
		return 0;
	}
	return -1;
}

static int parse_percent(const char *s, size_t len, struct chaos_value *v)
{
	size_t pos = 0;

	if (!match_decimal(s, len, &pos, 9, 6))
		return -1;
	v->num = slice_double(s, pos);
	if (pos < len && s[pos] == '%')
		pos++;
	return pos == len ? 0 : -1;
}

/* Returns -1 for bad syntax, -2 for a count that does not fit 63 bits. */
static int parse_bytes(const char *s, size_t len, struct chaos_value *v)
{
	static const char suffixes[] = "KMGTP";
	size_t n = count_digits(s, len, 0), pos;
	int shift = 0;
	long long number;

	if (n < 1 || n > 18)
		return -1;
	pos = n;
	if (pos < len) {
		const char *hit = memchr(suffixes, toupper((unsigned char)s[pos]), 5);

		if (hit && s[pos] != '\0') {
			shift = 10 * (int)(hit - suffixes + 1);
			pos++;
			if (pos < len && s[pos] == 'i')
				pos++;
		}
	}
	if (pos < len && (s[pos] == 'b' || s[pos] == 'B'))
		pos++;
	if (pos != len)
		return -1;
	number = slice_ll(s, n);
	if (number > (0x7fffffffffffffffLL >> shift))
		return -2;
	v->inum = number << shift;
	v->num = (double)v->inum;
	return 0;
}

static int str_char_ok(unsigned char c)
{
	return isalnum(c) ? (c < 128) : (strchr("_./@%:-", c) != NULL && c != '\0');
}

static int parse_str(const char *s, size_t len)
{
	if (len < 1)
		return -1;
	for (size_t i = 0; i < len; i++)
		if (!str_char_ok((unsigned char)s[i]))
			return -1;
	return 0;
}

static int parse_enum(const struct chaos_key_def *k, const char *s, size_t len)
{
	for (size_t i = 0; i < k->nchoices; i++)
		if (strlen(k->choices[i]) == len && !memcmp(k->choices[i], s, len))
			return 0;
	return -1;
}

static void format_bytes(long long value, char *buf, size_t len)
{
	static const char suffixes[] = "KMGTP";

	for (int i = 5; i > 0; i--) {
		long long unit = 1LL << (10 * i);

		if (value && value % unit == 0) {
			fmt(buf, len, "%lld%c", value / unit, suffixes[i - 1]);
			return;
		}
	}
	fmt(buf, len, "%lld", value);
}

/* Seconds with only the digits needed: 0.5s, 120s (catalogue.py format_ns). */
static void format_ns(long long ns, char *buf, size_t len)
{
	long long whole = ns / NS_PER_S, frac = ns % NS_PER_S;
	size_t n;

	if (!frac) {
		fmt(buf, len, "%llds", whole);
		return;
	}
	fmt(buf, len, "%lld.%09lld", whole, frac);
	n = strlen(buf);
	while (n > 0 && buf[n - 1] == '0')
		buf[--n] = '\0';
	if (n + 1 < len) {
		buf[n] = 's';
		buf[n + 1] = '\0';
	}
}

void chaos_format_fixed(double v, char *buf, size_t len)
{
	for (int digits = 0; digits < 18; digits++) {
		fmt(buf, len, "%.*f", digits, v);
		if (strtod(buf, NULL) == v)
			return;
	}
	fmt(buf, len, "%.17f", v);
}

static void format_value(const struct chaos_key_def *k, const struct chaos_value *v,
			 char *buf, size_t len)
{
	switch (k->type) {
	case CHAOS_T_INT:
		fmt(buf, len, "%lld", v->inum);
		break;
	case CHAOS_T_BYTES:
		format_bytes(v->inum, buf, len);
		break;
	case CHAOS_T_DURATION:
		format_ns(v->inum, buf, len);
		break;
	case CHAOS_T_FLOAT:
	case CHAOS_T_PERCENT:
		chaos_format_fixed(v->num, buf, len);
		break;
	default:
		break;          /* str and enum keep their text */
	}
}

static long long bound_ll(const struct chaos_key_def *k, double bound)
{
	/* Durations compare in ns, like catalogue.py: exact for every bound the catalogue has. */
	return k->type == CHAOS_T_DURATION ? (long long)(bound * (double)NS_PER_S + 0.5) : (long long)bound;
}

static void bound_text(const struct chaos_key_def *k, double bound, char *buf, size_t len)
{
	struct chaos_value tmp = { .inum = bound_ll(k, bound), .num = bound };

	format_value(k, &tmp, buf, len);
}

/* Bounds as catalogue.py checks them; integer types compare as integers (exact). */
static int check_bounds(const struct chaos_key_def *k, const struct chaos_value *v,
			char *why, size_t whylen)
{
	int integral = k->type == CHAOS_T_INT || k->type == CHAOS_T_BYTES || k->type == CHAOS_T_DURATION;
	char b[64];

	if (k->has_min && (integral ? v->inum < bound_ll(k, k->min) : v->num < k->min)) {
		bound_text(k, k->min, b, sizeof(b));
		fmt(why, whylen, "below the minimum %s", b);
		return -1;
	}
	if (k->has_max && (integral ? v->inum > bound_ll(k, k->max) : v->num > k->max)) {
		bound_text(k, k->max, b, sizeof(b));
		fmt(why, whylen, "above the maximum %s", b);
		return -1;
	}
	return 0;
}

static void enum_expect(const struct chaos_key_def *k, char *why, size_t whylen)
{
	size_t used;

	fmt(why, whylen, "expected one of ");
	for (size_t i = 0; i < k->nchoices; i++) {
		used = strlen(why);
		fmt(why + used, whylen - used, "%s%s", i ? ", " : "", k->choices[i]);
	}
}

static int parse_typed(const struct chaos_key_def *k, const char *s, size_t len,
		       struct chaos_value *v)
{
	switch (k->type) {
	case CHAOS_T_INT:
		return parse_int(s, len, v);
	case CHAOS_T_FLOAT:
		return parse_float(s, len, v);
	case CHAOS_T_DURATION:
		return parse_duration(s, len, v);
	case CHAOS_T_PERCENT:
		return parse_percent(s, len, v);
	case CHAOS_T_BYTES:
		return parse_bytes(s, len, v);
	case CHAOS_T_ENUM:
		return parse_enum(k, s, len);
	case CHAOS_T_STR:
		return parse_str(s, len);
	}
	return -1;
}

int chaos_parse_value(const struct chaos_key_def *k, const char *text, size_t len,
		      struct chaos_value *v, char *why, size_t whylen)
{
	int rc;

	memset(v, 0, sizeof(*v));
	if (len > CHAOS_VALUE_MAX - 1) {
		fmt(why, whylen, "longer than %d characters", CHAOS_VALUE_MAX - 1);
		return -1;
	}
	rc = parse_typed(k, text, len, v);
	if (rc == -2 || rc == -3 || rc == -4) {
		fmt(why, whylen, "%s", rc == -2 ? "byte count too large" :
		    rc == -3 ? "finer than 1ns" : "duration too large");
		return -1;
	}
	if (rc < 0) {
		if (k->type == CHAOS_T_ENUM)
			enum_expect(k, why, whylen);
		else
			fmt(why, whylen, "%s", type_expect[k->type]);
		return -1;
	}
	if (k->type != CHAOS_T_STR && k->type != CHAOS_T_ENUM && check_bounds(k, v, why, whylen))
		return -1;
	if (k->type == CHAOS_T_STR || k->type == CHAOS_T_ENUM) {
		memcpy(v->text, text, len);
		v->text[len] = '\0';
	} else {
		format_value(k, v, v->text, sizeof(v->text));
	}
	v->set = 1;
	return 0;
}

/* --- SPEC grammar (spec.py) ----------------------------------------------------------- */

struct spec_ctx {
	const char *spec;
	char problem[PROBLEM_MAX];
};

static int fail(struct spec_ctx *c, const char *format, ...) __attribute__((format(printf, 2, 3)));

static int fail(struct spec_ctx *c, const char *format, ...)
{
	va_list ap;

	va_start(ap, format);
	vsnprintf(c->problem, sizeof(c->problem), format, ap);
	va_end(ap);
	return -1;
}

static int unknown_fault(struct spec_ctx *c, const char *name, size_t len)
{
	size_t used;

	fail(c, "unknown fault '%.*s' (known: ", (int)len, name);
	for (size_t i = 0; i < CHAOS_NFAULTS; i++) {
		used = strlen(c->problem);
		fmt(c->problem + used, sizeof(c->problem) - used, "%s%s", i ? ", " : "",
		    chaos_faults[i].name);
	}
	used = strlen(c->problem);
	fmt(c->problem + used, sizeof(c->problem) - used, ")");
	return -1;
}

static int unknown_key(struct spec_ctx *c, const struct chaos_fault_def *f, const char *k, size_t len)
{
	size_t used;

	fail(c, "%s: unknown key '%.*s' (keys: ", f->name, (int)len, k);
	for (size_t i = 0; i < f->nkeys; i++) {
		used = strlen(c->problem);
		fmt(c->problem + used, sizeof(c->problem) - used, "%s%s", i ? ", " : "", f->keys[i].name);
	}
	used = strlen(c->problem);
	fmt(c->problem + used, sizeof(c->problem) - used, ")");
	return -1;
}

static const char *find_char(const char *s, size_t len, char ch)
{
	return memchr(s, ch, len);
}

/* One KEY=VALUE item of fault r. */
static int parse_item(struct spec_ctx *c, struct chaos_request *r, const char *item, size_t len)
{
	const char *eq = find_char(item, len, '=');
	char why[512];
	size_t klen, vlen;
	int idx;

	if (!eq)
		return fail(c, "%s: '%.*s' is not KEY=VALUE", r->def->name, (int)len, item);
	klen = (size_t)(eq - item);
	vlen = len - klen - 1;
	idx = key_index(r->def, item, klen);
	if (idx < 0)
		return unknown_key(c, r->def, item, klen);
	if (r->values[idx].given)
		return fail(c, "%s: key '%.*s' given twice", r->def->name, (int)klen, item);
	if (chaos_parse_value(&r->def->keys[idx], eq + 1, vlen, &r->values[idx], why, sizeof(why)))
		return fail(c, "%s: %.*s: bad value '%.*s' (%s)", r->def->name, (int)klen, item,
			    (int)vlen, eq + 1, why);
	r->values[idx].given = 1;
	return 0;
}

static int fill_defaults(struct spec_ctx *c, struct chaos_request *r)
{
	char why[512];

	for (size_t i = 0; i < r->def->nkeys; i++) {
		const struct chaos_key_def *k = &r->def->keys[i];

		if (r->values[i].given)
			continue;
		if (k->required)
			return fail(c, "%s: key '%s' is required", r->def->name, k->name);
		if (k->def && chaos_parse_value(k, k->def, strlen(k->def), &r->values[i], why, sizeof(why)))
			return fail(c, "%s: %s: bad default (%s)", r->def->name, k->name, why);
	}
	return 0;
}

static int parse_fault(struct spec_ctx *c, struct chaos_request *r, const char *piece, size_t len)
{
	const char *colon = find_char(piece, len, ':');
	size_t nlen = colon ? (size_t)(colon - piece) : len;
	const char *item, *end;

	memset(r, 0, sizeof(*r));
	if (len == 0)
		return fail(c, "empty fault (stray '+')");
	r->def = chaos_fault_lookup(piece, nlen);
	if (!r->def)
		return unknown_fault(c, piece, nlen);
	if (colon && nlen + 1 == len)
		return fail(c, "%s: no KEY=VALUE after ':'", r->def->name);
	if (colon) {
		end = piece + len;
		for (item = colon + 1; item <= end;) {
			const char *comma = find_char(item, (size_t)(end - item), ',');
			size_t ilen = comma ? (size_t)(comma - item) : (size_t)(end - item);

			if (parse_item(c, r, item, ilen))
				return -1;
			item += ilen + 1;
		}
	}
	return fill_defaults(c, r);
}

static int parse_all(struct spec_ctx *c, const char *text, size_t len, struct chaos_spec *out)
{
	size_t pieces = 1;
	const char *piece = text, *end = text + len;

	if (len == 0)
		return fail(c, "empty SPEC");
	if (len > CHAOS_SPEC_MAX)
		return fail(c, "longer than %d characters", CHAOS_SPEC_MAX);
	for (size_t i = 0; i < len; i++)
		pieces += text[i] == '+';
	if (pieces > CHAOS_MAX_FAULTS)
		return fail(c, "more than %d faults", CHAOS_MAX_FAULTS);
	while (piece <= end) {
		const char *plus = find_char(piece, (size_t)(end - piece), '+');
		size_t plen = plus ? (size_t)(plus - piece) : (size_t)(end - piece);
		struct chaos_request *r = &out->req[out->n];

		if (parse_fault(c, r, piece, plen))
			return -1;
		for (size_t j = 0; j < out->n; j++)
			if (out->req[j].def == r->def)
				return fail(c, "fault '%s' given twice", r->def->name);
		out->n++;
		piece += plen + 1;
	}
	return 0;
}

static int chaos_parse_spec_c(const char *text, struct chaos_spec *out, char *err, size_t errlen);

/*
 * Numbers are read and printed in the C locale whatever the process set (srun, sbatch), so
 * "1.5" means the same everywhere and matches Python.
 */
static locale_t c_locale(void)
{
	static locale_t loc;

	if (!loc)
		loc = newlocale(LC_ALL_MASK, "C", (locale_t)0);
	return loc;
}

int chaos_parse_spec(const char *text, struct chaos_spec *out, char *err, size_t errlen)
{
	locale_t loc = c_locale(), old = loc ? uselocale(loc) : (locale_t)0;
	int rc = chaos_parse_spec_c(text, out, err, errlen);

	if (loc)
		uselocale(old);
	return rc;
}

static int chaos_parse_spec_c(const char *text, struct chaos_spec *out, char *err, size_t errlen)
{
	/* The context holds a large message buffer: keep it off the (stepd) stack. */
	struct spec_ctx *c = calloc(1, sizeof(*c));
	size_t len;
	int rc;

	memset(out, 0, sizeof(*out));
	if (!c) {
		fmt(err, errlen, "out of memory");
		return -1;
	}
	text = text ? text : "";
	len = strnlen(text, CHAOS_SPEC_MAX + 1);
	c->spec = text;
	rc = parse_all(c, text, len, out);
	if (rc) {
		/* Quote the SPEC as given, bounded: parse_all never read past CHAOS_SPEC_MAX + 1. */
		fmt(err, errlen, "bad chaos SPEC '%.*s': %s", (int)len, text, c->problem);
		memset(out, 0, sizeof(*out));
	}
	free(c);
	return rc;
}

int chaos_format_spec(const struct chaos_spec *spec, char *buf, size_t len)
{
	size_t used = 0;

	if (!len)
		return -1;
	buf[0] = '\0';
	for (size_t i = 0; i < spec->n; i++) {
		const struct chaos_request *r = &spec->req[i];
		int first = 1, n;

		n = snprintf(buf + used, len - used, "%s%s", i ? "+" : "", r->def->name);
		if (n < 0 || (size_t)n >= len - used)
			return -1;
		used += (size_t)n;
		for (size_t k = 0; k < r->def->nkeys; k++) {
			if (!r->values[k].given)
				continue;
			n = snprintf(buf + used, len - used, "%c%s=%s", first ? ':' : ',',
				     r->def->keys[k].name, r->values[k].text);
			if (n < 0 || (size_t)n >= len - used)
				return -1;
			used += (size_t)n;
			first = 0;
		}
	}
	return (int)used;
}

const struct chaos_value *chaos_get(const struct chaos_request *r, const char *key)
{
	int idx = key_index(r->def, key, strlen(key));

	if (idx < 0 || !r->values[idx].set)
		return NULL;
	return &r->values[idx];
}

const struct chaos_request *chaos_find(const struct chaos_spec *spec, const char *name)
{
	for (size_t i = 0; i < spec->n; i++)
		if (!strcmp(spec->req[i].def->name, name))
			return &spec->req[i];
	return NULL;
}

/* --- plugstack.conf arguments ---------------------------------------------------------- */

static int parse_path(const char *arg, const char *value, char *out, size_t len, char *err, size_t errlen)
{
	if (value[0] != '/' || strlen(value) >= len) {
		fmt(err, errlen, "plugstack argument '%s': expected an absolute path", arg);
		return -1;
	}
	snprintf(out, len, "%s", value);
	return 0;
}

static int parse_one_arg(const char *arg, struct chaos_config *cfg, char *err, size_t errlen)
{
	const char *eq = strchr(arg, '=');
	size_t klen = eq ? (size_t)(eq - arg) : 0;
	const char *value = eq ? eq + 1 : "";

#define IS(name) (klen == strlen(name) && !strncmp(arg, name, klen))
	if (IS("policy"))
		return parse_path("policy", value, cfg->policy, sizeof(cfg->policy), err, errlen);
	if (IS("journal_dir"))
		return parse_path("journal_dir", value, cfg->journal_dir, sizeof(cfg->journal_dir), err, errlen);
	if (IS("allow_users") || IS("allow_accounts") || IS("allow_partitions") || IS("allow_reservations") ||
	    IS("require_exclusive")) {
		fmt(err, errlen, "plugstack argument '%s': the rules are in the policy file now, not on this "
		    "line (slurm-chaos plugin install writes it)", arg);
		return -1;
	}
#undef IS
	fmt(err, errlen, "unknown plugstack argument '%s' (known: policy, journal_dir)", arg);
	return -1;
}

int chaos_parse_args(int ac, char *const *av, struct chaos_config *cfg, char *err, size_t errlen)
{
	memset(cfg, 0, sizeof(*cfg));
	snprintf(cfg->journal_dir, sizeof(cfg->journal_dir), "%s", CHAOS_DEFAULT_JOURNAL_DIR);
	snprintf(cfg->policy, sizeof(cfg->policy), "%s", CHAOS_DEFAULT_POLICY);
	for (int i = 0; i < ac; i++)
		if (!av[i] || parse_one_arg(av[i], cfg, err, errlen))
			return -1;
	return 0;
}

/* --- helpers -------------------------------------------------------------------------------- */

static int parse_cpu_number(const char **p, long *out)
{
	char *end;
	long v;

	if (**p < '0' || **p > '9')
		return -1;
	v = strtol(*p, &end, 10);
	if (v < 0 || v >= CHAOS_MAX_CPUS || end - *p > 5)
		return -1;
	*p = end;
	*out = v;
	return 0;
}

int chaos_parse_cpulist(const char *text, uint64_t *mask, size_t nwords)
{
	const char *p = text;
	int count = 0;

	if (nwords * 64 < CHAOS_MAX_CPUS)
		return -1;
	memset(mask, 0, nwords * sizeof(*mask));
	while (*p && *p != '\n') {
		long lo, hi;

		if (parse_cpu_number(&p, &lo))
			return -1;
		hi = lo;
		if (*p == '-') {
			p++;
			if (parse_cpu_number(&p, &hi) || hi < lo)
				return -1;
		}
		for (long c = lo; c <= hi; c++) {
			if (!(mask[c / 64] & (1ULL << (c % 64))))
				count++;
			mask[c / 64] |= 1ULL << (c % 64);
		}
		if (*p == ',')
			p++;
		else if (*p && *p != '\n')
			return -1;
	}
	return (*p == '\0' || (*p == '\n' && p[1] == '\0')) ? count : -1;
}

int chaos_format_cpulist(const uint64_t *mask, size_t nwords, char *buf, size_t len)
{
	size_t used = 0, bits = nwords * 64;

	if (!len)
		return -1;
	buf[0] = '\0';
	for (size_t c = 0; c < bits; c++) {
		size_t hi = c;
		int n;

		if (!(mask[c / 64] & (1ULL << (c % 64))))
			continue;
		while (hi + 1 < bits && (mask[(hi + 1) / 64] & (1ULL << ((hi + 1) % 64))))
			hi++;
		if (hi == c)
			n = snprintf(buf + used, len - used, "%s%zu", used ? "," : "", c);
		else
			n = snprintf(buf + used, len - used, "%s%zu-%zu", used ? "," : "", c, hi);
		if (n < 0 || (size_t)n >= len - used)
			return -1;
		used += (size_t)n;
		c = hi;
	}
	return 0;
}

int chaos_json_string(const char *s, char *buf, size_t len)
{
	size_t used = 0;

#define PUT(ch) do { if (used + 1 >= len) return -1; buf[used++] = (ch); } while (0)
	if (!len)
		return -1;
	PUT('"');
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;

		if (c == '"' || c == '\\') {
			PUT('\\');
			PUT((char)c);
		} else if (c < 0x20 || c == 0x7f) {
			char esc[8];

			snprintf(esc, sizeof(esc), "\\u%04x", c);
			for (char *e = esc; *e; e++)
				PUT(*e);
		} else {
			PUT((char)c);
		}
	}
	PUT('"');
#undef PUT
	buf[used] = '\0';
	return 0;
}

int chaos_env_name(const char *fault, const char *key, char *buf, size_t len)
{
	int n = snprintf(buf, len, "SLURM_CHAOS_%s_%s", fault, key);

	if (n < 0 || (size_t)n >= len)
		return -1;
	for (char *p = buf; *p; p++)
		*p = isalnum((unsigned char)*p) ? (char)toupper((unsigned char)*p) : '_';
	return 0;
}
