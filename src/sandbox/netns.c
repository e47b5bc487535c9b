/* Runs in the fork server (and test_sandbox): network namespaces made ahead
 * of the spawns that take them (see netns.h).
 *
 * Why: of clone() with a sandbox's six namespaces, the network namespace is
 * most of the cost (on the 2-vCPU VM, ~290 of ~380 us for a small process),
 * and bringing its loopback up costs ~80 us more; both were on every fresh
 * turn's critical path (clone in the fork server, lo in the child's step 4).
 * A spare made while the fork server waits costs the spawn one setns(),
 * ~1 us. The fork server makes spares between requests (forkserver.c);
 * when none is left, netns_enter makes one on the spot, as the clone did.
 *
 * What it changes: the namespace is made by the fork server, root in the
 * host's user namespace, so that user namespace owns it, not the sandbox's.
 * The sandbox holds no capability over its network namespace at any time
 * (its steps held CAP_NET_ADMIN there until step 7 before); it sees the
 * same thing: a loopback, up, and nothing else. Each namespace serves one
 * sandbox: the fork server drops its fd once it has entered it, so it lives
 * as long as the sandbox's processes and nothing of one turn can be in
 * another's (tests/integration/test_spawn.py). The kernel charges it to the
 * fork server (host root's count of network namespaces, its memory cgroup),
 * as it charged the clone's. */
#include "sandbox/netns.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/sockios.h>
#include <net/if.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/util.h"

struct netns_spares {
    int home;     /* the namespace we were made in (an nsfs fd) */
    int *fd;      /* spares, oldest first (owned) */
    size_t n, max;
};

void netns_leave(struct netns_spares *s)
{
    if (setns(s->home, CLONE_NEWNET) < 0)
        abort();
}

/* A fresh namespace with lo up: unshare, bring it up, keep an fd, go home. */
static int make_one(struct netns_spares *s, int *out, char *err, size_t errlen)
{
    *out = -1;
    if (unshare(CLONE_NEWNET) < 0)
        return err_errno(err, errlen, "network namespace: unshare");
    int r = 0;
    int sk = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct ifreq ifr = {0};
    snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "lo");
    if (sk < 0 || ioctl(sk, SIOCGIFFLAGS, &ifr) < 0)
        r = err_errno(err, errlen, "network namespace: loopback");
    ifr.ifr_flags |= IFF_UP;
    if (r == 0 && ioctl(sk, SIOCSIFFLAGS, &ifr) < 0)
        r = err_errno(err, errlen, "network namespace: bring lo up");
    /* The namespace of the socket, as an fd (close-on-exec). */
    if (r == 0 && (*out = ioctl(sk, SIOCGSKNS)) < 0)
        r = err_errno(err, errlen, "network namespace: SIOCGSKNS");
    if (sk >= 0)
        close(sk);
    netns_leave(s);
    return r;
}

int netns_spares_new(unsigned max, struct netns_spares **out, char *err, size_t errlen)
{
    *out = NULL;
    struct netns_spares *s = calloc(1, sizeof *s);
    if (s)
        s->fd = calloc(max ? max : 1, sizeof *s->fd);
    max = max ? max : 1;
    if (!s || !s->fd) {
        if (s)
            free(s);
        return err_fmt(err, errlen, -ENOMEM, "network namespaces: out of memory");
    }
    s->max = max;
    s->home = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    if (s->home < 0) {
        int r = err_errno(err, errlen, "network namespaces: open /proc/thread-self/ns/net");
        netns_spares_free(s);
        return r;
    }
    int r = netns_refill(s, err, errlen);
    if (r < 0) {
        netns_spares_free(s);
        return r;
    }
    *out = s;
    return 0;
}

void netns_spares_free(struct netns_spares *s)
{
    if (!s)
        return;
    for (size_t i = 0; i < s->n; i++)
        close(s->fd[i]);
    if (s->home >= 0)
        close(s->home);
    free(s->fd);
    free(s);
}

size_t netns_spares_ready(const struct netns_spares *s) { return s->n; }

size_t netns_spares_max(const struct netns_spares *s) { return s->max; }

int netns_refill(struct netns_spares *s, char *err, size_t errlen)
{
    if (s->n >= s->max)
        return 0;
    int fd;
    int r = make_one(s, &fd, err, errlen);
    if (r == 0)
        s->fd[s->n++] = fd;
    return r;
}

int netns_enter(struct netns_spares *s, char *err, size_t errlen)
{
    int fd;
    if (s->n) {
        fd = s->fd[0];
        memmove(s->fd, s->fd + 1, --s->n * sizeof *s->fd);
    } else {
        int r = make_one(s, &fd, err, errlen);
        if (r < 0)
            return r;
    }
    int r = setns(fd, CLONE_NEWNET) < 0 ? err_errno(err, errlen, "network namespace: setns") : 0;
    close(fd);
    return r;
}
