/* Runs as the fork server: forkbox-sandbox.so, a Python extension module
 * that Debian's own python3.11 loads, and through it every sandbox child.
 *
 * Only forkboxd starts it (fsclient.c): it execs python3.11 by fd, with
 * FS_ARGV (fd 0 a pipe holding FS_BOOT, fd 3 the control socket, fd 4 this
 * file, the environment a fixed minimal one), and FS_BOOT loads this
 * module from fd 4 and calls main() (forkserver.h). The configuration comes as the first record on fd 3, never in
 * argv (sandboxes read this process's command line as their own).
 *
 * Why the fork server is python3.11 itself and not an executable that
 * embeds libpython: Debian's python3.11 is linked with link-time
 * optimisation (the interpreter loop inlines the int, float and allocator
 * fast paths), and neither library Debian ships has that code:
 * libpython3.11.a has its LTO sections stripped, and libpython3.11.so is
 * position-independent. Pure Python ran ~1.15x slower in an executable
 * linked with the static library and ~1.3x with the shared one. Loaded by
 * python3.11, the sandbox runs the very code `python3` runs. This module's
 * own code (channel, capture, archives, spawning) is position-independent;
 * none of it is on a hot path of user code. */
#include <Python.h>
#include <fcntl.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "core/log.h"
#include "core/util.h"
#include "sandbox/forkserver.h"

/* _forkbox_sandbox.main(): become the fork server. Never returns. */
static PyObject *fs_module_main(PyObject *self, PyObject *args)
{
    (void)self;
    (void)args;
    /* Exec'd by fd, the kernel names us after the fd's number: say what we
     * are in ps and in every sandbox's /proc/self/comm. */
    prctl(PR_SET_NAME, "forkbox-sandbox", 0, 0, 0);
    /* This file is mapped and FS_BOOT read: neither fd is needed any more,
     * and no sandbox may inherit them. fd 0 stays open (on /dev/null), as
     * every process's does. */
    close(FS_MODULE_FD);
    int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (null >= 0) {
        dup2(null, 0);
        close(null);
    }
    raise_nofile();
    log_init("forkserver", LOG_LEVEL_INFO);
    forkserver_main(FS_CTL_FD);
}

static PyMethodDef fs_module_methods[] = {
    {"main", fs_module_main, METH_NOARGS, "Become forkboxd's fork server (never returns)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef fs_module_def = {
    PyModuleDef_HEAD_INIT, "_forkbox_sandbox", "forkboxd's fork server (private).", -1,
    fs_module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__forkbox_sandbox(void); /* the one exported symbol */
PyMODINIT_FUNC PyInit__forkbox_sandbox(void)
{
    return PyModule_Create(&fs_module_def);
}
