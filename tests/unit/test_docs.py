"""The README and the manual behind it (docs/), as a reader follows them.

The README stays a page a newcomer reads in five minutes (at most 300
lines); every relative link in the project's Markdown resolves, `#anchor`s
included (GitHub's heading slugs and explicit `<a id>`s); every document in
docs/ is reachable from the README; and the README's "Repository layout"
names only paths that exist, every top-level directory and every directory
of src/; and dist/meson.build installs every document. Run by meson (suite
unit) with FORKBOX_SRCDIR.
"""
import glob
import os
import re
import subprocess

import pytest

SRC = os.path.abspath(os.environ.get("FORKBOX_SRCDIR")
                      or os.path.join(os.path.dirname(__file__), "..", ".."))
README_MAX_LINES = 300


def tracked():
    """The source tree's files, relative: git's list when it is a checkout,
    else (a copy, as tools/deb-test builds the package from) a walk that
    skips hidden directories, meson build directories (build/,
    dpkg-buildpackage's obj-<triplet>/) and debhelper's debian/<package>/."""
    r = subprocess.run(["git", "-C", SRC, "ls-files", "-z"], capture_output=True)
    if r.returncode == 0 and r.stdout:
        return [p for p in r.stdout.decode().split("\0") if p and os.path.exists(os.path.join(SRC, p))]
    out = []
    for d, dirs, files in os.walk(SRC):
        if d == SRC:
            dirs[:] = [x for x in dirs if not x.startswith(".")
                       and not os.path.exists(os.path.join(d, x, "meson-info"))]
        elif d == os.path.join(SRC, "debian"):      # debhelper's staging trees
            dirs[:] = [x for x in dirs if x == "source"]
        out += [os.path.relpath(os.path.join(d, f), SRC) for f in files]
    return out


FILES = tracked()
MARKDOWN = sorted(p for p in FILES if p.endswith(".md"))


def read(rel):
    with open(os.path.join(SRC, rel), encoding="utf-8") as f:
        return f.read()


def prose(text):
    """The text without fenced code blocks and code spans, whose brackets
    are not links."""
    text = re.sub(r"^```.*?^```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading):
    """GitHub's anchor for a heading: lower case, markup and punctuation
    dropped, blanks to hyphens."""
    s = re.sub(r"<[^>]+>", "", heading).strip().lower()
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def anchors(rel):
    text = read(rel)
    seen, out = {}, set()
    for h in re.findall(r"^#{1,6} +(.+?) *#*$", re.sub(r"^```.*?^```", "", text, flags=re.M | re.S), re.M):
        s = slug(h)
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    out.update(re.findall(r"<a (?:id|name)=\"([^\"]+)\"", text))
    return out


def links(rel):
    """(target, line) of every relative link in a Markdown file."""
    text = prose(read(rel))
    for m in re.finditer(r"\]\(([^)\s]+)\)", text):
        t = m.group(1)
        if re.match(r"[a-z][a-z0-9+.-]*:", t):      # http:, https:, mailto:
            continue
        yield t, text.count("\n", 0, m.start()) + 1


def test_readme_is_short():
    n = read("README.md").count("\n")
    assert n <= README_MAX_LINES, f"README.md has {n} lines, more than {README_MAX_LINES}: move detail to docs/"


@pytest.mark.parametrize("rel", MARKDOWN)
def test_relative_links_resolve(rel):
    bad = []
    for target, line in links(rel):
        path, _, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(os.path.dirname(rel), path)) if path else rel
        if not os.path.exists(os.path.join(SRC, dest)):
            bad.append(f"{rel}:{line}: {target}: no such file")
        elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
            bad.append(f"{rel}:{line}: {target}: no heading or <a id> '{anchor}' in {dest}")
    assert not bad, "\n".join(bad)


def test_every_doc_is_linked_from_the_readme():
    targets = {os.path.normpath(t.partition("#")[0]) for t, _ in links("README.md")}
    docs = {p for p in FILES if p.startswith("docs/") and p.endswith(".md")}
    assert docs, "no docs/*.md"
    assert not docs - targets, f"not linked from README.md: {sorted(docs - targets)}"


def layout():
    """The README's layout block: (directory, its description) per entry."""
    r = read("README.md")
    sec = r[r.index("## Repository layout"):]
    block = re.search(r"^```\n(.*?)^```", sec, re.M | re.S).group(1)
    entries = []
    for line in block.splitlines():
        if line and not line[0].isspace():
            name, _, desc = line.partition(" ")
            entries.append([name.rstrip("/"), desc])
        elif entries:
            entries[-1][1] += " " + line.strip()
    return entries


def exists(pattern, base=""):
    return bool(glob.glob(os.path.join(SRC, base, pattern)))


def test_layout_names_only_paths_that_exist():
    bad = []
    for name, desc in layout():
        if not os.path.isdir(os.path.join(SRC, name)):
            bad.append(f"{name}: not a directory")
            continue
        # A token is a path when it names a file (foo.c) or starts at a
        # directory of the tree or of the entry (src/embed, k8s/); "SHA-1/base64"
        # is prose.
        for tok in re.findall(r"[\w.*-]*[\w*](?:/[\w.*-]+)+/?|[\w*-]+\.(?:c|h|py|ini|md|build)\b", desc):
            tok = tok.rstrip("/")
            first = tok.split("/")[0]
            if "/" in tok and not (exists(first) or exists(first, name)):
                continue
            if not (exists(tok) or exists(tok, name)):
                bad.append(f"{name}: names {tok}, which is neither in the tree nor in {name}/")
    assert not bad, "\n".join(bad)


def test_layout_names_every_top_level_and_src_directory():
    named = {name for name, _ in layout()}
    named |= {n.split("/")[0] for n in named}
    dirs = {p.split("/")[0] for p in FILES if "/" in p}
    src = {"/".join(p.split("/")[:2]) for p in FILES if p.startswith("src/") and p.count("/") >= 2}
    missing = sorted((dirs | src) - named)
    assert not missing, f"README.md's layout does not name: {missing}"


def test_every_doc_is_installed():
    """dist/meson.build installs docs/ beside the README by name: a new
    document is listed there too, or the installed README links to nothing."""
    listed = set(re.findall(r"'\.\./(docs/[\w.-]+\.md)'", read("dist/meson.build")))
    docs = {p for p in FILES if p.startswith("docs/") and p.endswith(".md")}
    assert docs == listed, f"docs/ {sorted(docs)} != installed by dist/meson.build {sorted(listed)}"
