"""forkbox-sandbox.so, the fork server every sandbox is a clone of, links the
static libraries Debian's -dev packages ship (src/meson.build says why): every
shared library it loads is five more mappings that each clone copies and each
exit unmaps. Checked on the built module's dynamic section."""

import os
import subprocess

import pytest

MODULE = os.environ["FORKBOX_SANDBOX_MODULE"]
STATIC = {"archive": "libarchive", "cap": "libcap", "seccomp": "libseccomp",
          "nettle": "libnettle"}


def needed(path):
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True,
                         check=True).stdout
    return [line.split("[")[1].split("]")[0] for line in out.splitlines() if "(NEEDED)" in line]


def has_static(lib):
    return any(os.path.exists(os.path.join(d, f"lib{lib}.a"))
               for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib"))


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="static libraries on x86-64 only")
def test_no_shared_copy_of_a_library_linked_statically():
    libs = needed(MODULE)
    for lib, soname in STATIC.items():
        if has_static(lib):
            assert not any(n.startswith(soname + ".so") for n in libs), (lib, libs)
    # libarchive's own dependencies (formats forkbox never reads) are gone too.
    if has_static("archive"):
        for extra in ("libxml2", "libicuuc", "liblzma", "libzstd", "libbz2", "libstdc++"):
            assert not any(n.startswith(extra) for n in libs), (extra, libs)
