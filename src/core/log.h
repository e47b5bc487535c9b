/* Leveled logging with function:line; one sink per process.
 *
 * The supervisor and the fork server log to stderr. A sandbox child must not
 * write to fds it does not own, so it never calls these (it reports through
 * `log` frames instead). */
#pragma once
#include <stdarg.h>

enum log_level { LOG_LEVEL_DEBUG, LOG_LEVEL_INFO, LOG_LEVEL_WARN, LOG_LEVEL_ERROR };

/* ident prefixes every line ("forkboxd", "forkserver"); min drops lower levels. */
void log_init(const char *ident, enum log_level min);
enum log_level log_min_level(void);

/* errnum != 0 appends ": strerror(errnum)". */
void log_write(enum log_level lvl, const char *func, int line, int errnum,
               const char *fmt, ...) __attribute__((format(printf, 5, 6)));
/* The same with a va_list, and a suffix (NULL or "") written after the
 * message and the errno text; a long message is cut so the suffix is kept. */
void log_vwrite(enum log_level lvl, const char *func, int line, int errnum, const char *suffix,
                const char *fmt, va_list ap) __attribute__((format(printf, 6, 0)));

#define LOG_D(...) log_write(LOG_LEVEL_DEBUG, __func__, __LINE__, 0, __VA_ARGS__)
#define LOG_I(...) log_write(LOG_LEVEL_INFO, __func__, __LINE__, 0, __VA_ARGS__)
#define LOG_W(...) log_write(LOG_LEVEL_WARN, __func__, __LINE__, 0, __VA_ARGS__)
#define LOG_E(...) log_write(LOG_LEVEL_ERROR, __func__, __LINE__, 0, __VA_ARGS__)
/* errno variants: append strerror(errno). */
#define PLOG_W(...) log_write(LOG_LEVEL_WARN, __func__, __LINE__, errno, __VA_ARGS__)
#define PLOG_E(...) log_write(LOG_LEVEL_ERROR, __func__, __LINE__, errno, __VA_ARGS__)
