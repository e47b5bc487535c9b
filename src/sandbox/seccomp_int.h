/* Internal to the filter's two halves: the fork server compiles it
 * (seccomp.c), a sandbox child installs it (seccomp_install.c). */
#pragma once
#include <linux/filter.h>
#include <stdbool.h>

struct sbx_policy {
    struct sock_fprog main;   /* .filter owned: the allowlist */
    struct sock_fprog except; /* .filter owned, .len 0 if none: refusing `when` rules */
    bool counts;              /* some call is a counted refusal: load with a listener */
    char summary[512];
};
