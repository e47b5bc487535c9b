/* no-passrights CMD [ARG...]: run CMD as on a kernel without SO_PASSRIGHTS
 * (Linux before 6.16, e.g. Debian 12's 6.1): a seccomp filter makes
 * setsockopt(fd, SOL_SOCKET, SO_PASSRIGHTS, ...) fail with ENOPROTOOPT, the
 * old kernels' answer, and lets everything else through. For the tests of
 * the supervisor's fallback (src/session/chan_conn.c), on any kernel. The
 * filter is inherited by CMD's fork server and its sandboxes, where it
 * changes nothing else. Needs root (no no_new_privs is set, so that setuid
 * programs and file capabilities keep working under it). */
#include <errno.h>
#include <seccomp.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define SO_PASSRIGHTS_ 83 /* asm-generic/socket.h, Linux 6.16 */

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: no-passrights CMD [ARG...]\n");
        return 2;
    }
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
    int r = ctx ? 0 : -ENOMEM;
    if (r == 0)
        r = seccomp_attr_set(ctx, SCMP_FLTATR_CTL_NNP, 0);
    if (r == 0)
        r = seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_ALLOW);
    if (r == 0)
        r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOPROTOOPT), SCMP_SYS(setsockopt), 2,
                             SCMP_A1(SCMP_CMP_EQ, SOL_SOCKET),
                             SCMP_A2(SCMP_CMP_EQ, SO_PASSRIGHTS_));
    if (r == 0)
        r = seccomp_load(ctx);
    if (r < 0) {
        fprintf(stderr, "no-passrights: seccomp: %s\n", strerror(-r));
        return 125;
    }
    seccomp_release(ctx);
    execvp(argv[1], argv + 1);
    fprintf(stderr, "no-passrights: %s: %s\n", argv[1], strerror(errno));
    return 127;
}
