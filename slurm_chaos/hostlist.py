"""Slurm hostlist expressions (`node[1-3,5],gpu[01-02]`) expanded and compressed, in pure Python."""

from __future__ import annotations

import re

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _split_top(expr: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in expr:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError("unbalanced ']'")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise ValueError("unbalanced '['")
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def _expand_one(item: str) -> list[str]:
    m = re.match(r"^([^\[]*)\[([^\]]*)\](.*)$", item)
    if not m:
        if "[" in item or "]" in item:
            raise ValueError(f"bad hostlist item {item!r}")
        return [item]
    prefix, ranges, rest = m.groups()
    tails = _expand_one(rest) if rest else [""]
    out = []
    for rng in ranges.split(","):
        r = _RANGE.match(rng.strip())
        if not r:
            raise ValueError(f"bad range {rng!r} in {item!r}")
        lo_s, hi_s = r.group(1), r.group(2) or r.group(1)
        lo, hi = int(lo_s), int(hi_s)
        if hi < lo:
            raise ValueError(f"descending range {rng!r} in {item!r}")
        width = len(lo_s) if lo_s.startswith("0") else 0
        out += [f"{prefix}{n:0{width}d}{t}" for n in range(lo, hi + 1) for t in tails]
    return out


def expand_hostlist(expr: str) -> list[str]:
    """`node[1-2],login` -> ['node1', 'node2', 'login'] (order kept, duplicates kept)."""
    if not expr or expr in ("(null)", "None"):
        return []
    return [h for item in _split_top(expr) for h in _expand_one(item)]


def compress_hostlist(hosts: list[str]) -> str:
    """['node1', 'node2', 'node4'] -> 'node[1-2,4]' (sorted within each prefix)."""
    groups: dict[tuple[str, int], list[int]] = {}
    plain: list[str] = []
    for h in hosts:
        m = re.match(r"^(.*?)(\d+)$", h)
        if not m:
            plain.append(h)
            continue
        prefix, digits = m.groups()
        width = len(digits) if digits.startswith("0") and len(digits) > 1 else 0
        groups.setdefault((prefix, width), []).append(int(digits))
    out = list(dict.fromkeys(plain))
    for (prefix, width), nums in groups.items():
        nums = sorted(set(nums))
        if len(nums) == 1:
            out.append(f"{prefix}{nums[0]:0{width}d}")
            continue
        spans, start = [], nums[0]
        for a, b in zip(nums, [*nums[1:], None], strict=True):
            if b is None or b != a + 1:
                spans.append(f"{start:0{width}d}" if start == a else f"{start:0{width}d}-{a:0{width}d}")
                if b is not None:
                    start = b
        out.append(f"{prefix}[{','.join(spans)}]")
    return ",".join(out)
