#include "sc_path.h"

#include <string.h>

/* Appends the segments of `s` to out[0..*o), resolving "." and ".."; -1 when out would overflow. */
static int append_segments(char *out, size_t cap, size_t *o, const char *s)
{
	while (*s) {
		while (*s == '/')
			s++;
		const char *seg = s;
		while (*s && *s != '/')
			s++;
		size_t len = (size_t)(s - seg);
		if (len == 0 || (len == 1 && seg[0] == '.'))
			continue;
		if (len == 2 && seg[0] == '.' && seg[1] == '.') {
			while (*o > 0 && out[--*o] != '/')
				;
			continue;
		}
		if (*o + 1 + len >= cap) /* '/', the segment and the final NUL */
			return -1;
		out[(*o)++] = '/';
		memcpy(out + *o, seg, len);
		*o += len;
	}
	return 0;
}

long sc_path_resolve(const char *base, const char *rel, char *out, size_t cap)
{
	size_t o = 0;
	if (!rel || !out || cap < 2)
		return -1;
	if (rel[0] != '/') {
		if (!base || base[0] != '/')
			return -1;
		if (append_segments(out, cap, &o, base))
			return -1;
	}
	if (append_segments(out, cap, &o, rel))
		return -1;
	if (o == 0)
		out[o++] = '/';
	out[o] = '\0';
	return (long)o;
}

int sc_path_under(const char *path, const char *dir, size_t len)
{
	if (!len || !path)
		return 0;
	if (len == 1 && dir[0] == '/')
		return path[0] == '/';
	return !strncmp(path, dir, len) && (path[len] == '/' || path[len] == '\0');
}

void sc_path_strip_deleted(char *path)
{
	static const char suffix[] = " (deleted)";
	size_t n = strlen(path), k = sizeof(suffix) - 1;
	if (n > k && !strcmp(path + n - k, suffix))
		path[n - k] = '\0';
}
