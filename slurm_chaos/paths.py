"""Canonical absolute paths: the only form of a path named by a user that root acts on.

A canonical path is absolute and has no empty, ``.`` or ``..`` component, no trailing slash and
none of the characters that mean something to mount options, findmnt or a shell (``:``, ``,``,
``\\``, whitespace, control characters). Whether its directories are symlinks can only be told on
the node itself (`os.path.realpath`); these checks are the part that can be told from the text.
"""

from __future__ import annotations

from collections.abc import Iterable

#: ':' separates overlayfs layers, ',' mount options; '\\' starts findmnt's escapes.
FORBIDDEN_CHARS = frozenset(":,\\")


def path_problem(text: str) -> str | None:
    """Why `text` is not a canonical absolute path, or None when it is one."""
    if not text.startswith("/"):
        return "is not an absolute path"
    bad = sorted({c for c in text if c in FORBIDDEN_CHARS or c.isspace() or not c.isprintable()})
    if bad:
        return f"contains {', '.join(repr(c) for c in bad)}"
    parts = text.split("/")[1:]
    if text == "/" or "" in parts:
        return "has an empty component ('//' or a trailing '/')" if text != "/" else "is the root directory"
    if "." in parts or ".." in parts:
        return "has a '.' or '..' component"
    return None


def components(text: str) -> tuple[str, ...]:
    """The names of a canonical path, from the top: '/a/b' -> ('a', 'b')."""
    return tuple(text.split("/")[1:])


def below(path: str, root: str) -> tuple[str, ...] | None:
    """The components of `path` under `root` (both canonical); None unless strictly below it."""
    p, r = components(path), components(root)
    if len(p) <= len(r) or p[: len(r)] != r:
        return None
    return p[len(r) :]


def root_of(path: str, roots: Iterable[str]) -> tuple[str, tuple[str, ...]] | None:
    """The first of `roots` that `path` is strictly below, with the components under it."""
    for root in roots:
        rest = below(path, root)
        if rest is not None:
            return root, rest
    return None
