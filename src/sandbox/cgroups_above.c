/* Runs in the fork server's cgroup helper: which limit above the turn
 * cgroups was hit (see cgroups_above.h). */
#include "sandbox/cgroups_above.h"

#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/cleanup.h"

/* dir/file's text, or false if it cannot be read. */
static bool read_at(const char *dir, const char *file, char *buf, size_t len)
{
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n = fd < 0 ? -1 : read(fd, buf, len - 1);
    if (n < 0)
        return false;
    buf[n] = '\0';
    return true;
}

uint64_t cg_limit_hit_above(const char *dir, bool v2)
{
    char d[PATH_MAX], buf[1024];
    snprintf(d, sizeof d, "%s", dir);
    /* Up to the hierarchy's root, whose parent has no memory files. */
    while (read_at(d, v2 ? "memory.max" : "memory.limit_in_bytes", buf, sizeof buf)) {
        uint64_t limit = strncmp(buf, "max", 3) == 0 ? 0 : strtoull(buf, NULL, 10);
        bool limited = limit && limit < (1ULL << 62); /* v1: "none" is ~2^63 */
        bool hit = false;
        if (limited && v2 && read_at(d, "memory.events.local", buf, sizeof buf)) {
            const char *oom = strstr(buf, "\noom ");
            hit = (oom ? strtoull(oom + 5, NULL, 10) : 0) > 0;
        } else if (limited && !v2 && read_at(d, "memory.max_usage_in_bytes", buf, sizeof buf)) {
            hit = strtoull(buf, NULL, 10) >= limit; /* its peak at its limit */
        }
        if (hit)
            return limit;
        char *slash = strrchr(d, '/');
        if (!slash || slash == d)
            break;
        *slash = '\0';
    }
    return 0;
}
