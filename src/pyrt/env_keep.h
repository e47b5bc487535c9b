/* The environment a sandbox keeps (spec 6.4): the one copy of the allowlist.
 * Header only. The sandbox's runtime applies it (module.c: the C environ and
 * the initial environment block, then, through _forkbox.env_allowed, Python's
 * os.environ); the integration tests read this file to check a sandbox's
 * environment against it (tests/integration/fbtest.py: keep the two
 * definitions below in this form, one C string per name). */
#pragma once

/* Names kept as they are. */
#define PYRT_ENV_KEEP_NAMES                                                         \
    "PATH", "HOME", "USER", "LANG", "LANGUAGE", "TERM", "TMPDIR", "TEMP", "TMP",     \
        "PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE"
/* And every name that starts with this (the locale categories). */
#define PYRT_ENV_KEEP_PREFIX "LC_"
