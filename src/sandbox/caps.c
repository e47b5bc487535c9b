/* Runs in the sandbox child (its step 7): dropping privilege inside its user
 * namespace (nsjail caps.cc).
 *
 * The sandbox runs as uid 0 of its own user namespace (mapped to an
 * unprivileged host uid). Capabilities there only act on objects that
 * namespace owns, but they would still let user code remount, re-pivot or
 * reconfigure its network namespace, so all of them go. The securebits
 * matter as much as the sets: without SECBIT_NOROOT an execve() by uid 0
 * would hand the full set back. */
#include "sandbox/caps.h"

#include <errno.h>
#include <linux/securebits.h>
#include <stdio.h>
#include <sys/capability.h>
#include <sys/prctl.h>

#include "core/util.h"

/* cap_last_cap from the running kernel, not the headers we were built with:
 * a newer kernel may know capabilities our libcap does not. */
static int last_cap(void)
{
    int last = CAP_LAST_CAP;
    /* Probe upwards: PR_CAPBSET_READ fails with EINVAL past the last one. */
    while (prctl(PR_CAPBSET_READ, (unsigned long)last + 1, 0, 0, 0) >= 0)
        last++;
    return last;
}

int caps_drop_all(char *err, size_t errlen)
{
    int last = last_cap();

    /* Bounding set first: dropping needs CAP_SETPCAP in the effective set,
     * which the last step below removes. */
    for (int c = 0; c <= last; c++) {
        if (prctl(PR_CAPBSET_DROP, (unsigned long)c, 0, 0, 0) < 0 && errno != EINVAL)
            return err_errno(err, errlen, "PR_CAPBSET_DROP");
    }
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0)
        return err_errno(err, errlen, "PR_CAP_AMBIENT_CLEAR_ALL");

    /* Also needs CAP_SETPCAP. KEEP_CAPS stays off (its bit clear) and locked. */
    unsigned long bits = SECBIT_NOROOT | SECBIT_NOROOT_LOCKED |
                         SECBIT_NO_SETUID_FIXUP | SECBIT_NO_SETUID_FIXUP_LOCKED |
                         SECBIT_KEEP_CAPS_LOCKED |
                         SECBIT_NO_CAP_AMBIENT_RAISE | SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED;
    if (prctl(PR_SET_SECUREBITS, bits, 0, 0, 0) < 0)
        return err_errno(err, errlen, "PR_SET_SECUREBITS");

    cap_t empty = cap_init(); /* all three sets clear */
    if (!empty)
        return err_errno(err, errlen, "cap_init");
    int r = cap_set_proc(empty);
    int e = errno;
    cap_free(empty);
    if (r < 0) {
        errno = e;
        return err_errno(err, errlen, "cap_set_proc");
    }

    /* Last: execve() can no longer add privilege (setuid bits, file caps),
     * and seccomp can be installed without CAP_SYS_ADMIN. */
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
        return err_errno(err, errlen, "PR_SET_NO_NEW_PRIVS");
    return 0;
}

int caps_all_dropped(void)
{
    struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3};
    struct __user_cap_data_struct data[2];
    if (capget(&hdr, data) < 0)
        return -errno;
    for (int i = 0; i < 2; i++)
        if (data[i].effective || data[i].permitted || data[i].inheritable)
            return 0;
    int last = last_cap();
    for (int c = 0; c <= last; c++) {
        if (prctl(PR_CAPBSET_READ, (unsigned long)c, 0, 0, 0) > 0)
            return 0;
        if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_IS_SET, (unsigned long)c, 0, 0) > 0)
            return 0;
    }
    int nnp = prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0);
    if (nnp < 0)
        return -errno;
    return nnp == 1;
}
