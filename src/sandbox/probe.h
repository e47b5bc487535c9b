/* Runs in the fork server, once at start (forkserver_main): does this host
 * give us what an isolated sandbox needs? Each probe tries what a turn does,
 * in a short-lived child, rather than testing for files or sysctls, and on
 * failure writes one line into err: what is missing and how to fix it, which
 * the fork server sends as its failed ready record (fsproto.h, sync 0) so
 * that forkboxd refuses to start with it. (The cgroup limits are probed by
 * cgroups_init.) */
#pragma once
#include <stddef.h>
#include <stdint.h>

struct sbx_policy;

/* The kernel offers seccomp filters with user notification (which counted
 * refusals need; Linux 5.0). Asked of the kernel directly, before the policy
 * is compiled, so that a kernel without them is named as such rather than as
 * a policy error. 0 or -errno. */
int probe_seccomp_kernel(char *err, size_t errlen);

/* The compiled policy loads: a child sets no_new_privs and installs it as a
 * sandbox's step 8 does (policy_install), then exits. 0 or -errno. */
int probe_seccomp_policy(const struct sbx_policy *policy, char *err, size_t errlen);

/* User namespaces: a child takes host id `id` as its real and effective ids
 * (as a sandbox's clone does, spawn.c clone_as: the namespace is created by
 * an unprivileged id, so kernel.unprivileged_userns_clone and similar
 * policies apply although forkboxd is root), unshares every namespace a
 * sandbox gets, and we write its id maps. 0 or -errno. */
int probe_userns(uint32_t id, char *err, size_t errlen);
