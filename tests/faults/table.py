#!/usr/bin/python3
"""The fault suite's table: for each fault, what the clients saw, what was left
behind, and the time to recover, for two builds side by side.

    FORKBOX_FAULT_REPORT=/tmp/before.jsonl FORKBOXD=OLD/forkboxd FORKBOX=OLD/forkbox \\
        python3 -m pytest -q -p no:cacheprovider tests/faults     # (its failures expected)
    FORKBOX_FAULT_REPORT=/tmp/after.jsonl python3 -m pytest -q -p no:cacheprovider tests/faults
    tests/faults/table.py /tmp/before.jsonl /tmp/after.jsonl

Each test appends one JSON line before its assertions (faults.record), so a
build that fails them is described too. Markdown on stdout.
"""

import collections
import json
import sys


def rows(path: str) -> dict[str, dict]:
    out = {}
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            out[r["fault"]] = r
    return out


def clients(r: dict | None) -> str:
    if not r:
        return "-"
    seen = collections.Counter(r["clients"])
    return "; ".join(f"{n} x {o}" if n > 1 else o for o, n in seen.items()).replace("|", "/")


def left(r: dict | None) -> str:
    if not r:
        return "-"
    if not r["left"]:
        return "nothing"
    kinds = collections.Counter(x.split(" ", 1)[0] if " " in x else "cgroup" for x in r["left"])
    return ", ".join(f"{n} {k}{'s' if n > 1 else ''}" for k, n in kinds.items())


def recover(r: dict | None) -> str:
    if not r:
        return "-"
    if isinstance(r["recover_s"], str):
        return r["recover_s"]
    return "never (30 s)" if r["recover_s"] is None else f"{r['recover_s']:.2f} s"


def main() -> None:
    before, after = rows(sys.argv[1]), rows(sys.argv[2])
    print("| fault | client saw: before | after | left behind: before | after | "
          "recovery: before | after |")
    print("|---|---|---|---|---|---|---|")
    for fault in list(dict.fromkeys(list(after) + list(before))):
        b, a = before.get(fault), after.get(fault)
        print(f"| {fault} | {clients(b)} | {clients(a)} | {left(b)} | {left(a)} | "
              f"{recover(b)} | {recover(a)} |")


if __name__ == "__main__":
    main()
