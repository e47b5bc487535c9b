/* Small fd and time helpers shared by every process. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

int fd_set_nonblock(int fd, bool on);   /* 0 or -errno */
int fd_set_cloexec(int fd, bool on);    /* 0 or -errno */
/* Blocking full write/read, retrying EINTR. 0 or -errno; read returns -EPIPE on EOF. */
int write_all(int fd, const void *p, size_t n);
int read_all(int fd, void *p, size_t n);
uint64_t now_ms(void);                  /* CLOCK_MONOTONIC */
uint64_t now_ns(void);
/* Constant-time comparison of two byte strings; leaks only the lengths. */
bool ct_equal(const void *a, size_t alen, const void *b, size_t blen);
/* Parse a decimal unsigned integer with an upper bound; 0 or -EINVAL/-ERANGE. */
int parse_u64(const char *s, uint64_t max, uint64_t *out);
/* Raise RLIMIT_NOFILE as far as allowed (util.c says how far and why). */
void raise_nofile(void);
