"""The interpreter and the process split (issue 13, item 4): the fork server is
Debian's python3.11 running forkbox-sandbox.so (the interpreter's own LTO-built
code: pure Python as fast as `python3`), and forkboxd links no Python at all.

* extension modules (numpy, pandas, lxml, sqlite3, ssl, ctypes) load and work
  in a turn, cold and preloaded: they resolve the C API from the interpreter;
* a sandbox maps no libpython*.so, and sys.executable, the prefixes and the
  sysconfig paths are what the host's python3 reports;
* the supervisor maps no libpython and stays PIE; the fork server is
  /usr/bin/python3.11 with forkbox-sandbox.so mapped;
* --sandbox-module: the file is checked before it is loaded (owner, mode), a
  bad one stops forkboxd at start with the reason; --sandbox-exe is refused.
"""

import json
import os
import shutil
import subprocess
import tempfile

import pytest

from fbtest import SANDBOX_MODULE, SANDBOX_PYTHON, run_blocks

T = 60


def ok(r):
    assert r.exit_code == 0, r.stderr
    return r.stdout


EXTENSIONS = r'''
import ctypes, ctypes.util, json, sqlite3, ssl
import numpy as np, pandas as pd
from lxml import etree
a = np.arange(12, dtype=np.float64).reshape(3, 4)
df = pd.DataFrame({"k": ["a", "b", "a", "b"], "v": [1, 2, 3, 4]})
doc = etree.fromstring(b"<r><i n='1'/><i n='2'/><i n='3'/></r>")
db = sqlite3.connect(":memory:")
db.execute("create table t (x integer)")
db.executemany("insert into t values (?)", [(i,) for i in range(10)])
ctx = ssl.create_default_context()
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.strlen.argtypes = [ctypes.c_char_p]
print(json.dumps({
    "matmul": (a @ a.T).tolist()[2][2],
    "groupby": df.groupby("k")["v"].sum().to_dict(),
    "xpath": [int(x) for x in doc.xpath("//i/@n")],
    "sqlite": db.execute("select sum(x) from t").fetchone()[0],
    "ssl": [ctx.verify_mode == ssl.CERT_REQUIRED, ssl.OPENSSL_VERSION.startswith("OpenSSL")],
    "ctypes": libc.strlen(b"forkbox"),
}))
'''
EXPECTED = {"matmul": 8 * 8 + 9 * 9 + 10 * 10 + 11 * 11, "groupby": {"a": 4, "b": 6},
            "xpath": [1, 2, 3], "sqlite": 45, "ssl": [True, True], "ctypes": 7}


def test_extension_modules_work_in_a_turn(daemon):
    _, (r,) = run_blocks(daemon, EXTENSIONS)
    assert json.loads(ok(r)) == EXPECTED


def test_extension_modules_work_preloaded(make_daemon):
    """Loaded into the fork server before any clone (--preload), then used."""
    d = make_daemon(["--preload", "numpy,pandas,lxml.etree,sqlite3,ssl,ctypes", "--pool", "1"])
    _, (r,) = run_blocks(d, EXTENSIONS)
    assert json.loads(ok(r)) == EXPECTED


HOST_VIEW = r'''
import json, sys, sysconfig
print(json.dumps({"executable": sys.executable, "prefix": sys.prefix,
                  "exec_prefix": sys.exec_prefix, "base_prefix": sys.base_prefix,
                  "version": sys.version, "paths": sysconfig.get_paths(),
                  "ext_suffix": sysconfig.get_config_var("EXT_SUFFIX")}))
'''


def test_interpreter_identity_matches_host_python(daemon):
    """sys.executable, the prefixes and the sysconfig paths (what pip, site and
    subprocess rely on) do not depend on how the interpreter is linked: they
    are /usr/bin/python3.11's, in isolated mode as the runtime runs."""
    _, (r,) = run_blocks(daemon, HOST_VIEW)
    inside = json.loads(ok(r))
    host = json.loads(subprocess.run(["/usr/bin/python3.11", "-I", "-c", HOST_VIEW],
                                     capture_output=True, text=True, check=True).stdout)
    assert inside == host


MAPS = r'''
import os
maps = open("/proc/self/maps").read()
print(sorted({l.split()[-1].rsplit("/", 1)[-1] for l in maps.splitlines()
              if "libpython" in l}))
'''


def test_sandbox_maps_no_shared_libpython(daemon):
    """The interpreter is python3.11's own code, not Debian's
    position-independent libpython3.11.so, which ran pure Python ~1.3x
    slower; extension modules imported above resolved against it."""
    _, (r,) = run_blocks(daemon, "import numpy, lxml.etree\n" + MAPS)
    assert ok(r).strip() == "[]"


def elf_type(path):
    with open(path, "rb") as f:
        head = f.read(18)
    assert head[:4] == b"\x7fELF"
    return int.from_bytes(head[16:18], "little")  # 2 = ET_EXEC (non-PIE), 3 = ET_DYN (PIE)


def mapped_files(pid):
    with open(f"/proc/{pid}/maps") as f:
        return {line.split(None, 5)[5].strip() for line in f if len(line.split(None, 5)) == 6}


def test_supervisor_links_no_python_and_stays_pie(daemon):
    """forkboxd (network and sandbox bytes, the token) keeps ASLR for its code
    and has no interpreter in it; the fork server is python3.11 with
    forkbox-sandbox.so loaded."""
    with open(f"/proc/{daemon.pid}/maps") as f:
        assert "libpython" not in f.read()
    assert elf_type(f"/proc/{daemon.pid}/exe") == 3
    fs = daemon.forkserver_pid()
    assert os.path.samefile(f"/proc/{fs}/exe", SANDBOX_PYTHON)
    assert os.path.realpath(SANDBOX_MODULE) in mapped_files(fs)
    with open(f"/proc/{fs}/comm") as f:
        assert f.read() == "forkbox-sandbox\n"
    # The boot pipe and the module's fd are closed; fd 0 is /dev/null.
    assert os.readlink(f"/proc/{fs}/fd/0") == "/dev/null"
    assert not os.path.exists(f"/proc/{fs}/fd/4") or \
        not os.readlink(f"/proc/{fs}/fd/4").endswith("forkbox-sandbox.so")


def test_sandbox_module_flag_runs_a_copy(make_daemon):
    """--sandbox-module: a copy elsewhere (e.g. beside a copied forkboxd) serves turns."""
    with tempfile.TemporaryDirectory() as tmp:
        mod = os.path.join(tmp, "forkbox-sandbox-copy.so")
        shutil.copy2(SANDBOX_MODULE, mod)
        os.chmod(mod, 0o755)
        d = make_daemon(["--sandbox-module", mod])
        _, (r,) = run_blocks(d, "print(6 * 7)")
        assert ok(r) == "42\n"
        assert mod in mapped_files(d.forkserver_pid())


def test_sandbox_exe_flag_is_gone(make_daemon):
    d = make_daemon(["--sandbox-exe", "/usr/bin/true"], listen=False)
    assert d.wait_exit(30) not in (None, 0)
    d._reader.join(10)
    assert "--sandbox-module" in d.stderr(), d.stderr()


@pytest.mark.parametrize("case", ["group-writable", "world-writable", "other-owner", "missing",
                                  "directory", "relative"])
def test_sandbox_module_refused(make_daemon, case):
    """A fork server module someone else could have written is not loaded:
    forkboxd exits at start and says why (nothing listens)."""
    with tempfile.TemporaryDirectory() as tmp:
        os.chmod(tmp, 0o755)
        mod = os.path.join(tmp, "fs.so")
        if case not in ("missing", "directory", "relative"):
            shutil.copy2(SANDBOX_MODULE, mod)
        want = {"group-writable": "writable by group or others",
                "world-writable": "writable by group or others",
                "other-owner": "owned by another user",
                "missing": "No such file", "directory": "not a regular file",
                "relative": "expected an absolute path"}[case]
        if case == "group-writable":
            os.chmod(mod, 0o775)
        elif case == "world-writable":
            os.chmod(mod, 0o757)
        elif case == "other-owner":
            os.chmod(mod, 0o755)
            os.chown(mod, 65534, 65534)
        elif case == "directory":
            mod = tmp
        elif case == "relative":
            mod = "forkbox-sandbox.so"
        d = make_daemon(["--sandbox-module", mod], listen=False)
        assert d.wait_exit(30) not in (None, 0)
        d._reader.join(10)  # all of its stderr read
        assert want in d.stderr(), d.stderr()
