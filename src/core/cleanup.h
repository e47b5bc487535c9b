/* Cleanup attributes (bubblewrap/crun style) and ownership helpers. */
#pragma once
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

static inline void cleanup_freep(void *p) { free(*(void **)p); }
static inline void cleanup_closep(int *fd)
{
    if (*fd >= 0) {
        int saved = errno;
        close(*fd);
        errno = saved;
    }
}

#define _cleanup_free_ __attribute__((cleanup(cleanup_freep)))
#define _cleanup_close_ __attribute__((cleanup(cleanup_closep)))

/* Hand ownership of *pp to the caller and leave NULL behind. */
static inline void *steal_ptr(void *pp)
{
    void **p = pp, *v = *p;
    *p = NULL;
    return v;
}
#define steal_pointer(pp) ((__typeof__(*(pp)))steal_ptr(pp))

/* Hand ownership of *fdp to the caller and leave -1 behind. */
static inline int steal_fd(int *fdp)
{
    int fd = *fdp;
    *fdp = -1;
    return fd;
}

static inline void close_and_reset(int *fdp)
{
    if (*fdp >= 0)
        close(*fdp);
    *fdp = -1;
}
