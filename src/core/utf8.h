#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* True if p[0..n) is well-formed UTF-8 (RFC 3629: no overlongs, no surrogates,
 * nothing above U+10FFFF). */
bool utf8_valid(const uint8_t *p, size_t n);
