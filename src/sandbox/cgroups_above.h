/* Runs in the fork server's cgroup helper (cgroups_events): the memory
 * cgroups above the turn cgroups (the daemon's own, a systemd slice), for a
 * death report that names the limit the OOM killer acted for.
 *
 * A sandbox killed by the OOM killer while its own turn cgroup never reached
 * its limit was killed for another cgroup's: one above it whose limit was
 * hit (a daemon-wide MemoryMax=), or none (the host ran out of memory). Its
 * reason used to name the turn's limit all the same. */
#pragma once
#include <stdbool.h>
#include <stdint.h>

/* The limit of the nearest memory cgroup at or above dir (a turn cgroups'
 * parent) that has one and has reached it (v2 memory.events.local oom, v1
 * memory.max_usage_in_bytes at the limit), in bytes; 0 if none has. Both
 * cover the cgroup's life, not only the sandbox's: a limit reached long ago
 * counts too. */
uint64_t cg_limit_hit_above(const char *dir, bool v2);
