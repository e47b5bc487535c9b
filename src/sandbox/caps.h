/* Runs in the sandbox child (its step 7): dropping privilege inside its user
 * namespace. */
#pragma once
#include <stddef.h>

/* Empty every capability set (bounding via PR_CAPBSET_DROP, ambient, then
 * effective/permitted/inheritable with libcap), lock the securebits so that
 * uid 0 in the namespace never regains capabilities (SECBIT_NOROOT,
 * NO_SETUID_FIXUP, KEEP_CAPS off, NO_CAP_AMBIENT_RAISE, all locked) and set
 * PR_SET_NO_NEW_PRIVS. 0 or -errno with what failed in err. */
int caps_drop_all(char *err, size_t errlen);

/* 1 if the calling process has no capability in any set and no_new_privs is
 * set, 0 if not, -errno on error (tests and self-checks). */
int caps_all_dropped(void);
