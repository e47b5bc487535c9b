/* Minimal TAP producer for unit tests (meson `protocol: 'tap'`). */
#pragma once
#include <stdio.h>
#include <string.h>

static int tap_n, tap_failed;

#define ok(cond, ...)                                                          \
    do {                                                                       \
        int ok_c_ = !!(cond);                                                  \
        printf("%sok %d - ", ok_c_ ? "" : "not ", ++tap_n);                    \
        printf(__VA_ARGS__);                                                   \
        printf("\n");                                                          \
        if (!ok_c_) {                                                          \
            tap_failed++;                                                      \
            printf("#   failed at %s:%d: %s\n", __FILE__, __LINE__, #cond);    \
        }                                                                      \
    } while (0)

#define is_int(a, b, ...)                                                      \
    do {                                                                       \
        long long is_a_ = (long long)(a), is_b_ = (long long)(b);              \
        ok(is_a_ == is_b_, __VA_ARGS__);                                       \
        if (is_a_ != is_b_)                                                    \
            printf("#   got %lld, expected %lld\n", is_a_, is_b_);             \
    } while (0)

#define is_str(a, b, ...)                                                      \
    do {                                                                       \
        const char *is_a_ = (a), *is_b_ = (b);                                 \
        int is_eq_ = is_a_ && is_b_ && strcmp(is_a_, is_b_) == 0;              \
        ok(is_eq_, __VA_ARGS__);                                               \
        if (!is_eq_)                                                           \
            printf("#   got '%s', expected '%s'\n", is_a_ ? is_a_ : "(null)",  \
                   is_b_ ? is_b_ : "(null)");                                  \
    } while (0)

static inline int tap_done(void)
{
    printf("1..%d\n", tap_n);
    return tap_failed ? 1 : 0;
}
