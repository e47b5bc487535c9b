"""docs/security.md's isolation step table against the code (src/sandbox/steps.c).

The `#` column is what a failed step exits with (70 + #), so it must be the
step's id in `enum sbx_step`, not its position; the rows must be the isolated
step table in the order it runs, each named as the code names it in the
failure's log frame."""
import os
import re

SRC = os.environ.get("FORKBOX_SRCDIR", os.path.join(os.path.dirname(__file__), "..", ".."))


def read(rel):
    with open(os.path.join(SRC, rel), encoding="utf-8") as f:
        return f.read()


def code_steps():
    c = read("src/sandbox/steps.c")
    enum = c[c.index("enum sbx_step {"):]
    enum = enum[:enum.index("};")]
    ids = {m[0]: int(m[1]) for m in re.findall(r"(SBX_STEP_\w+)\s*=\s*(\d+)", enum)}
    table = c[c.index("isolated_steps[] = {"):]
    table = table[:table.index("};")]
    rows = re.findall(r'\{(SBX_STEP_\w+),\s*"([^"]+)",\s*\w+(?:,\s*\w+)?\}', table)
    assert rows, "no isolated step table found"
    return [(ids[e], name) for e, name in rows], ids


def doc_steps():
    r = read("docs/security.md")
    sec = r[r.index("## Isolation model"):]
    sec = sec[:sec.index("\n\n", sec.index("| # | step |"))]
    rows = re.findall(r"^\| (\d+) \| \**([a-z][a-z ]*?)\**[: (]", sec, re.M)
    return [(int(n), word.split()[0]) for n, word in rows]


def test_doc_numbers_steps_by_their_exit_ids():
    code, ids = code_steps()
    doc = doc_steps()
    assert doc[0][0] == ids["SBX_STEP_CLONE"] == 0, doc[0]
    assert doc[1:] == code, f"docs/security.md rows {doc[1:]} != code {code}"
