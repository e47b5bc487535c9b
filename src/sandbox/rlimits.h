/* Runs in the sandbox child (its rlimits step, before init, steps.c): the
 * rlimits a sandbox sets on itself. Lowering needs no privilege. */
#pragma once

#include "config/config.h"

/* In the child: RLIMIT_CORE 0, RLIMIT_FSIZE, RLIMIT_NOFILE, RLIMIT_NPROC
 * backstop, RLIMIT_SIGPENDING, RLIMIT_MSGQUEUE. 0 or -errno. */
int rlimits_apply(const struct config *cfg);
