#!/usr/bin/env python3
"""Generate catalogue.h (C tables) from slurm_chaos/faults/catalogue.json.

Run by the Makefile at build time so that the plugin and the Python side share one catalogue.
Only the standard library is used: the plugin builds without the slurm_chaos package installed.
"""

from __future__ import annotations

import json
import sys
from typing import Any

TYPES = {
    "int": "CHAOS_T_INT",
    "float": "CHAOS_T_FLOAT",
    "duration": "CHAOS_T_DURATION",
    "percent": "CHAOS_T_PERCENT",
    "str": "CHAOS_T_STR",
    "enum": "CHAOS_T_ENUM",
    "bytes": "CHAOS_T_BYTES",
}


def c_string(value: object) -> str:
    """A C string literal (or NULL for None), escaping what C needs escaped."""
    if value is None:
        return "NULL"
    text = str(value)
    out = ['"']
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif 32 <= ord(ch) < 127:
            out.append(ch)
        else:
            out.append("".join(f"\\{b:03o}" for b in ch.encode()))
    out.append('"')
    return "".join(out)


def c_ident(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)


def c_double(value: object) -> str:
    return "0.0" if value is None else repr(float(value))  # type: ignore[arg-type]


def emit_key(key: dict[str, Any], choices_name: str | None) -> str:
    choices = choices_name or "NULL"
    nchoices = len(key.get("choices", ()))
    return (
        f"\t{{ {c_string(key['name'])}, {TYPES[key['type']]}, {c_string(key.get('help', ''))},\n"
        f"\t  {c_string(key.get('default'))}, {int(bool(key.get('required')))},\n"
        f"\t  {int(key.get('min') is not None)}, {int(key.get('max') is not None)}, "
        f"{c_double(key.get('min'))}, {c_double(key.get('max'))}, {choices}, {nchoices} }},"
    )


def emit_fault(fault: dict[str, Any], out: list[str]) -> None:
    ident = c_ident(fault["name"])
    keys: list[str] = []
    for key in fault["keys"]:
        choices_name = None
        if key.get("choices"):
            choices_name = f"chaos_choices_{ident}_{c_ident(key['name'])}"
            items = ", ".join(c_string(c) for c in key["choices"])
            out.append(f"static const char *const {choices_name}[] = {{ {items} }};")
        keys.append(emit_key(key, choices_name))
    out.append(f"static const struct chaos_key_def chaos_keys_{ident}[] = {{")
    out.extend(keys)
    out.append("};")
    out.append(
        f"_Static_assert(sizeof(chaos_keys_{ident}) / sizeof(chaos_keys_{ident}[0]) <= CHAOS_MAX_KEYS,"
        f' "{fault["name"]}: too many keys for CHAOS_MAX_KEYS");'
    )
    out.append("")


def generate(data: dict[str, Any], source: str) -> str:
    out = [
        f"/* GENERATED from {source} by gen_catalogue.py: do not edit. */",
        "#ifndef SLURM_CHAOS_CATALOGUE_H",
        "#define SLURM_CHAOS_CATALOGUE_H",
        '#include "parse.h"',
        "",
        f"#define CHAOS_CATALOGUE_VERSION {int(data['version'])}",
        "",
    ]
    for fault in data["faults"]:
        emit_fault(fault, out)
    out.append("static const struct chaos_fault_def chaos_faults[] = {")
    for fault in data["faults"]:
        ident = c_ident(fault["name"])
        out.append(
            f"\t{{ {c_string(fault['name'])}, {c_string(fault['description'])}, "
            f"{c_string(fault['where'])}, chaos_keys_{ident}, "
            f"sizeof(chaos_keys_{ident}) / sizeof(chaos_keys_{ident}[0]) }},"
        )
    out.append("};")
    out.append("#define CHAOS_NFAULTS (sizeof(chaos_faults) / sizeof(chaos_faults[0]))")
    out.append("")
    out.append("#endif")
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: gen_catalogue.py CATALOGUE.json > catalogue.h", file=sys.stderr)
        return 2
    with open(argv[1], encoding="utf-8") as fh:
        data = json.load(fh)
    sys.stdout.write(generate(data, "slurm_chaos/faults/catalogue.json"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
