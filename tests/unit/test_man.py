"""The manual pages (man/), as meson configures and installs them.

Each page renders without a warning (man-db and groff, as `man -l` runs
them, and mandoc's lint), has a NAME line that whatis can index (lexgrog),
and is installed in its section. Each holds what its program says of itself:
forkboxd(8) every flag of `forkboxd --help` with the same argument and the
numbers and paths of its help line (defaults, bounds), and every environment
variable forkboxd reads; forkbox(1) each command of `forkbox --help`, every
flag of `forkbox sandbox --help` placed among those that apply or those
without effect, and every flag of `forkbox run --help` with its argument;
forkbox-policy(1) the flags of its --help; forkbox-policy(5) every statement
and operator the parser names, every built-in constant of policy.c's table,
and an example that compiles. Run by meson (suite unit) with MANDIR,
FORKBOXD, FORKBOX, FORKBOX_POLICY, FORKBOX_SRCDIR and FORKBOX_BUILDDIR.
"""
import json
import os
import re
import shutil
import subprocess

import pytest

SRC = os.environ.get("FORKBOX_SRCDIR") or os.path.join(os.path.dirname(__file__), "..", "..")
BUILD = os.environ.get("FORKBOX_BUILDDIR") or os.path.join(SRC, "build")
MANDIR = os.environ.get("MANDIR") or os.path.join(BUILD, "man")
FORKBOXD = os.environ.get("FORKBOXD") or os.path.join(BUILD, "src", "forkboxd")
FORKBOX = os.environ.get("FORKBOX") or os.path.join(BUILD, "src", "forkbox")
FORKBOX_POLICY = os.environ.get("FORKBOX_POLICY") or os.path.join(BUILD, "tools", "forkbox-policy")
PAGES = ["forkboxd.8", "forkbox.1", "forkbox-policy.1", "forkbox-policy.5"]


def page_path(name):
    path = os.path.join(MANDIR, name)
    assert os.path.isfile(path), f"{path}: no such page (man/meson.build)"
    return path


def run(argv, **kw):
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, **kw)


def helptext(argv):
    """A program's --help: exit 0, on stdout, whatever fds are open."""
    r = run(argv, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, f"{argv}: exit {r.returncode}: {r.stderr}"
    return r.stdout


# --- reading roff: the few constructs the pages use -------------------------

ESCAPES = [(r"\-", "-"), (r"\%", ""), (r"\&", ""), (r"\(em", "\u2014"),
           (r"\(bu", "\u2022"), (r"\(dq", '"'), (r"\(lq", '"'), (r"\(rq", '"'), (r"\[mu]", "\u00d7")]


def unroff(s):
    s = re.sub(r"\\f[BIRP]", "", s).replace(r"\e", "\0")
    for esc, plain in ESCAPES:
        s = s.replace(esc, plain)
    assert "\\" not in s, f"an escape this test does not know: {s!r}"
    return s.replace("\0", "\\")


def macro_args(rest):
    """A macro line's arguments: blanks separate them, double quotes group."""
    return [a[1:-1] if a.startswith('"') else a for a in re.findall(r'"[^"]*"|\S+', rest)]


FONT_MACROS = {"B", "I", "BR", "RB", "BI", "IB", "IR", "RI", "SM", "SB"}


def line_text(line):
    """The text a source line contributes ("" for a macro that prints none)."""
    if not line.startswith("."):
        return unroff(line)
    name, _, rest = line[1:].partition(" ")
    if name in FONT_MACROS:
        args = macro_args(rest)
        return unroff(" ".join(args) if name in ("B", "I", "SM", "SB") else "".join(args))
    return ""


class Page:
    """A page as sections (.SH) of subsections (.SS), each with its text and
    its tagged paragraphs (.TP: tag, body)."""

    def __init__(self, name):
        self.name = name
        with open(page_path(name), encoding="utf-8") as f:
            self.source = f.read()
        self.sections = {}  # (section, subsection) -> {"text": [...], "items": [(tag, [body])]}
        sec, sub, item, want_tag = None, None, None, False
        for line in self.source.splitlines():
            if line.startswith('.\\"'):
                continue
            m = re.match(r"\.(SH|SS) (.*)", line)
            if m:
                title = " ".join(macro_args(m.group(2)))
                sec, sub = (title, None) if m.group(1) == "SH" else (sec, title)
                item, want_tag = None, False
                continue
            part = self.sections.setdefault((sec, sub), {"text": [], "items": []})
            if line.startswith((".TP", ".TQ")):
                want_tag = True
                continue
            if want_tag:
                item = (line_text(line), [])
                part["items"].append(item)
                part["text"].append(item[0])
                want_tag = False
                continue
            if re.match(r"\.(PP|IP|RS|RE)\b", line):
                item = None
            text = line_text(line)
            part["text"].append(text)
            if item is not None:
                item[1].append(text)

    def examples(self, sec):
        """The source lines of each .EX block of a section, unescaped."""
        body = re.search(rf'^\.SH "?{re.escape(sec)}"?\n(.*?)(?=^\.SH |\Z)', self.source, re.M | re.S)
        return [[unroff(line) for line in block.splitlines()]
                for block in re.findall(r"^\.EX\n(.*?)^\.EE", body.group(1), re.M | re.S)]

    def text(self, sec=None, sub=None):
        """The words of a section (all its subsections unless one is named)."""
        return " ".join(w for (s, ss), p in self.sections.items()
                        if (sec is None or s == sec) and (sub is None or ss == sub)
                        for w in p["text"])

    def items(self, sec, sub=None):
        """{tag: body} of a section's tagged paragraphs (every subsection's
        unless one is named)."""
        return {tag: " ".join(body) for (s, ss), p in self.sections.items()
                if s == sec and (sub is None or ss == sub) for tag, body in p["items"]}


def flag_items(items):
    """{--flag: (ARG or None, body)} from tags such as "--listen ADDR:PORT" and
    "-h, --help"."""
    out = {}
    for tag, body in items.items():
        m = re.match(r"(?:-\w, )?(--[a-z][a-z0-9-]*)(?: (\S+))?$", tag)
        if m:
            out[m.group(1)] = (m.group(2), body)
    return out


def numbers(s):
    """Whole numbers and sizes (64, 528M), and absolute paths, of a text."""
    return (set(re.findall(r"(?<![\w.])\d+[KMG]?(?!\w)", s))
            | set(re.findall(r"(?<![\w$.])/[\w./-]*\w", s)))


def flags_in(s):
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", s))


def forkboxd_help():
    """{--flag: (ARG or None, its help text)} of `forkboxd --help`, in order."""
    out, last = {}, None
    for line in helptext([FORKBOXD, "--help"]).splitlines():
        m = re.match(r"  (--[a-z][a-z0-9-]*)(?: (\S+))?  +(.*)$", line)
        if m:
            last = m.group(1)
            out[last] = [m.group(2), m.group(3)]
        elif line.startswith(" " * 20) and last:
            out[last][1] += " " + line.strip()
    assert len(out) > 30, "forkboxd --help lists no flags this test can read"
    return out


def argparse_flags(text):
    """{--flag: METAVAR or None} of an argparse --help's options."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"  (?:-\w, )?(--[a-z][a-z0-9-]*)(?: (\S+))?(?:  |$)", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


def source(path):
    with open(os.path.join(SRC, path), encoding="utf-8") as f:
        return f.read()


# --- every page -------------------------------------------------------------

@pytest.mark.parametrize("name", PAGES)
def test_renders_without_warnings(name):
    path = page_path(name)
    env = dict(os.environ, MANWIDTH="80", LC_ALL="C.UTF-8")
    r = run(["man", "--warnings", "-E", "UTF-8", "-l", path], env=env)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    assert "NAME" in r.stdout and "SEE ALSO" in r.stdout
    r = run(["mandoc", "-T", "lint", "-W", "warning", path])
    assert r.returncode == 0 and r.stdout + r.stderr == "", r.stdout + r.stderr


@pytest.mark.parametrize("name", PAGES)
def test_whatis_entry(name):
    """lexgrog reads NAME as mandb does for whatis and apropos."""
    r = run(["lexgrog", page_path(name)])
    title = name.rsplit(".", 1)[0]
    assert r.returncode == 0 and f': "{title} - ' in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize("name", PAGES)
def test_configured_and_cross_referenced(name):
    page = Page(name)
    assert not re.search(r"@[A-Za-z_]+@", page.source), "a placeholder meson did not fill"
    th = re.search(r"^\.TH (\S+) (\d) ", page.source, re.M)
    assert th and unroff(th.group(1)) == name.rsplit(".", 1)[0].upper() and th.group(2) == name[-1]
    for ref, sec in re.findall(r"^\.BR (forkbox\S*) \((\d)\)", page.source, re.M):
        assert f"{unroff(ref)}.{sec}" in PAGES, f"{name} refers to {unroff(ref)}({sec})"


def test_installed_in_their_sections():
    """meson install puts each page in share/man/manN."""
    meson = shutil.which("meson")
    assert meson, "meson not on PATH"
    r = run([meson, "introspect", BUILD, "--installed"])
    assert r.returncode == 0, r.stderr
    installed = json.loads(r.stdout)
    for name in PAGES:
        (dest,) = [d for s, d in installed.items() if os.path.basename(s) == name]
        assert dest.endswith(os.path.join("share", "man", "man" + name[-1], name)), dest


# --- forkboxd(8) ------------------------------------------------------------

def test_forkboxd_every_flag_with_its_argument_and_defaults():
    page = Page("forkboxd.8")
    documented = flag_items(page.items("OPTIONS"))
    helped = forkboxd_help()
    assert set(documented) == set(helped) | {"--help"}, (
        f"in --help only: {sorted(set(helped) - set(documented))}; "
        f"in the page only: {sorted(set(documented) - set(helped) - {'--help'})}")
    for flag, (arg, text) in helped.items():
        man_arg, body = documented[flag]
        assert man_arg == arg, f"{flag}: --help says {arg}, the page {man_arg}"
        missing = numbers(text) - numbers(body)
        assert not missing, f"{flag}: --help says {sorted(missing)} ({text}); the page: {body}"


def test_forkboxd_environment():
    """Every variable forkboxd reads (the option table's, the token's, PORT,
    systemd's) is in ENVIRONMENT; a variable of the table is in its flag's
    paragraph too."""
    page = Page("forkboxd.8")
    listed = " ".join(page.items("ENVIRONMENT"))
    config = source("src/config/config.c")
    read = set(re.findall(r'getenv\("([A-Z_]+)"\)', config + source("src/core/sdnotify.c")))
    read |= set(re.findall(r'#define \w*ENV\w* "([A-Z_]+)"', source("src/main.c")))
    rows = re.findall(r'\{"([a-z-]+)",[^{]*?\.env = "([A-Z_]+)"', config)
    assert len(rows) >= 3, "the option table's variables: none found"
    read |= {env for _, env in rows}
    assert {"PORT", "ADK_CODE_MODE_AUTH_TOKEN", "NOTIFY_SOCKET"} <= read
    for var in sorted(read):
        assert re.search(rf"\b{var}\b", listed), f"{var} is not in ENVIRONMENT"
    options = flag_items(page.items("OPTIONS"))
    for flag, env in rows:
        assert env in options["--" + flag][1], f"--{flag}: its variable {env} is not named"


def test_forkboxd_endpoints_and_exit_statuses():
    """The bodies the front door answers with (admission.c, server.c), and
    main()'s exit statuses."""
    page = Page("forkboxd.8")
    http = page.text("HTTP ENDPOINTS")
    bodies = {b.replace("%u", "N") for b in re.findall(
        r'"([A-Z][^"\\]*)\\n"', source("src/session/admission.c") + source("src/session/server.c"))}
    assert {"OK", "Ready", "Busy", "Unauthorized", "Shutting down"} <= bodies, bodies
    for body in sorted(bodies):
        assert body in http, f"the answer {body!r} is not in HTTP ENDPOINTS"
    statuses = {int(s) for s in re.findall(r"return (\d);", source("src/main.c"))}
    statuses |= {int(s) for s in re.findall(r"exit_code = (\d);", source("src/session/server.c"))}
    assert statuses == {0, 1, 2}, statuses
    assert set(page.items("EXIT STATUS")) == {str(s) for s in statuses}


# --- forkbox(1) ---------------------------------------------------------------

def test_forkbox_commands():
    page = Page("forkbox.1")
    text = helptext([FORKBOX, "--help"])
    commands = re.findall(r"^usage: forkbox (\w+)", text, re.M)
    assert commands == ["sandbox", "run"], commands
    synopsis = page.text("SYNOPSIS")
    for cmd in commands:
        assert f"forkbox {cmd}" in synopsis
        assert page.text("DESCRIPTION", f"forkbox {cmd}"), f"no subsection forkbox {cmd}"
    assert flags_in(text) <= flags_in(page.text()), flags_in(text) - flags_in(page.text())


def test_forkbox_sandbox_every_flag_placed():
    """Each flag forkbox sandbox takes (forkboxd's) is named once: among those
    that apply to one sandbox, or among those of the server alone."""
    text = helptext([FORKBOX, "sandbox", "--help"])
    assert text.startswith("usage: forkbox sandbox")
    helped = flags_in(text) - {"--help"}
    assert helped == set(forkboxd_help()), "forkbox sandbox takes forkboxd's flags"
    sub = Page("forkbox.1").text("DESCRIPTION", "forkbox sandbox")
    m = re.search(r"These apply:(.*?)These are the server's.*?without effect:(.*?)--help prints",
                  sub)
    assert m, "the two lists of forkbox sandbox's options"
    apply, ignored = flags_in(m.group(1)), flags_in(m.group(2))
    assert not apply & ignored, f"in both lists: {sorted(apply & ignored)}"
    assert apply | ignored == helped, (
        f"not placed: {sorted(helped - apply - ignored)}; "
        f"not flags: {sorted((apply | ignored) - helped)}")


def test_forkbox_run_every_flag():
    page = Page("forkbox.1")
    text = helptext([FORKBOX, "run", "--help"])
    helped = argparse_flags(text)
    documented = flag_items(page.items("DESCRIPTION", "forkbox run"))
    assert set(documented) == set(helped), (set(documented), set(helped))
    synopsis = page.text("SYNOPSIS")
    for flag, metavar in helped.items():
        man_arg, body = documented[flag]
        assert man_arg == metavar, f"{flag}: --help says {metavar}, the page {man_arg}"
        if metavar:
            assert f"[{flag} {metavar}]" in synopsis, f"{flag} not in SYNOPSIS"
        help_line = re.search(rf"^  (?:-\w, )?{flag}\b.*?(?=^  -|\Z)", text, re.M | re.S).group(0)
        missing = numbers(help_line) - numbers(body)
        assert not missing, f"{flag}: --help says {sorted(missing)}; the page: {body}"


def test_forkbox_environment():
    """The transport's and the workspace's variables (stream/transport.c,
    forkbox.c) are in ENVIRONMENT."""
    listed = " ".join(Page("forkbox.1").items("ENVIRONMENT"))
    read = set(re.findall(r'#define ENV_\w+ "([A-Z_]+)"',
                          source("src/stream/transport.c") + source("src/forkbox.c")))
    assert len(read) >= 6, read
    for var in sorted(read | {"ADK_CODE_MODE_TOOLS_DIR", "FORKBOX"}):
        assert re.search(rf"\b{var}\b", listed), f"{var} is not in ENVIRONMENT"


# --- forkbox-policy(1) and (5) -----------------------------------------------

def test_forkbox_policy_command_flags():
    text = helptext([FORKBOX_POLICY, "--help"])
    helped = flags_in(text)
    assert {"--rules", "--arch"} <= helped, text
    documented = flag_items(Page("forkbox-policy.1").items("OPTIONS"))
    assert set(documented) == helped | {"--help"}, (set(documented), helped)
    assert documented["--arch"][0] == re.search(r"--arch (\w+)", text).group(1)


def policy_error(tmp_path, text):
    """forkbox-policy's complaint about a policy file."""
    f = tmp_path / "p.policy"
    f.write_text(text)
    r = run([FORKBOX_POLICY, str(f)])
    assert r.returncode == 1, r.stdout
    return r.stderr


def test_policy_statements_and_operators(tmp_path):
    """What the parser names as statements and operators is documented."""
    page = Page("forkbox-policy.5")
    err = policy_error(tmp_path, "default kill\nbogus read\n")
    words = re.search(r"\(expected (.*)\)", err).group(1).replace(" or ", ", ").split(", ")
    assert "supervise" in words, err
    tags = {tag.split()[0] for tag in page.items("STATEMENTS")}
    assert set(words) <= tags, set(words) - tags
    err = policy_error(tmp_path, "default kill\nallow read when arg0 ~ 1\n")
    ops = re.search(r"\(use (.*)\)", err).group(1).split()
    assert "<=" in ops, err
    conditions = page.text("CONDITIONS")
    for op in ops:
        assert re.search(rf"(^|\s){re.escape(op)}([,.;]?\s|$)", conditions), op


def test_policy_builtin_constants(tmp_path):
    """The list is policy.c's table, and each name compiles."""
    table = source("src/sandbox/policy.c")
    table = table[table.index("builtin_constants[] = {"):]
    table = table[:table.index("};")]
    builtin = re.findall(r"C\(([A-Z0-9_]+)\)", table)
    assert len(builtin) > 100
    (block,) = Page("forkbox-policy.5").examples("BUILT-IN CONSTANTS")
    listed = " ".join(block).split()
    assert sorted(listed) == sorted(builtin), set(listed) ^ set(builtin)
    f = tmp_path / "constants.policy"
    f.write_text("default kill\n" + "".join(f"define K{i} {n}\n" for i, n in enumerate(listed)))
    r = run([FORKBOX_POLICY, str(f)])
    assert r.returncode == 0, r.stderr


def test_policy_example_compiles(tmp_path):
    """The page's example, as a reader copies it, compiles here and for
    arm64."""
    example = Page("forkbox-policy.5").examples("EXAMPLES")[0]
    f = tmp_path / "example.policy"
    f.write_text("\n".join(example) + "\n")
    for arch in ([], ["--arch", "aarch64"]):
        r = run([FORKBOX_POLICY, "--rules", *arch, str(f)])
        assert r.returncode == 0, r.stderr
    assert "supervise" in r.stdout and "when" in r.stdout
