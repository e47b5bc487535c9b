/* Private to the policy's files in src/sandbox/ (policy*.c): what the
 * parser and the filter builder both use. Runs wherever a policy is read
 * (policy.c's opening comment). Nothing else includes this. */
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "sandbox/policy.h"

/* Names in messages are the rules' architecture's. */
#define rule_name(r, nr, buf) policy_syscall_name_arch((r)->arch, (nr), (buf), sizeof(buf))

/* Actions that override an `allow`: a refusal, or `noop` (a refusal whose
 * errno is 0). `supervise` combines like `allow`. */
static inline bool refusing(enum policy_action a)
{
    return a == POLICY_DENY || a == POLICY_ERRNO || a == POLICY_KILL || a == POLICY_NOOP;
}
