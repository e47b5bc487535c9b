/* Runs in the fork server: the interpreter glue (sbx_runtime_init, and the
 * table of pyrt's functions a sandbox child calls after its steps), the only
 * file of the sandbox module that names pyrt.
 * Keeping it here lets tests spawn real sandboxes with their own hooks
 * without linking the embedded interpreter. */
#include "pyrt/pyrt.h"
#include "sandbox/spawn.h"

int sbx_runtime_init(const struct config *cfg, char *err, size_t errlen)
{
    return pyrt_init(cfg, err, errlen);
}

const struct sbx_hooks sbx_runtime_hooks = {
    .after_fork = pyrt_after_fork,
    .serve = pyrt_serve,
};
