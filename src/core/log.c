/* Leveled logging to stderr: "ident: LEVEL func:line: msg[: strerror]\n".
 *
 * Each line is formatted into a stack buffer and written with one write(2),
 * so lines from several processes sharing stderr (supervisor, fork server)
 * do not interleave as long as they stay under PIPE_BUF. Long messages are
 * cut rather than split. */
#include "core/log.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define LOG_LINE_MAX 1024

/* The only process-wide state of this module: set once by log_init() before
 * anything else runs, read-only afterwards. */
static char log_ident[32] = "forkbox";
static enum log_level log_min = LOG_LEVEL_INFO;

static const char *const log_level_names[] = {
    [LOG_LEVEL_DEBUG] = "DEBUG",
    [LOG_LEVEL_INFO] = "INFO",
    [LOG_LEVEL_WARN] = "WARN",
    [LOG_LEVEL_ERROR] = "ERROR",
};

void log_init(const char *ident, enum log_level min)
{
    if (ident)
        snprintf(log_ident, sizeof log_ident, "%s", ident);
    log_min = min;
}

enum log_level log_min_level(void) { return log_min; }

void log_vwrite(enum log_level lvl, const char *func, int line, int errnum, const char *suffix,
                const char *fmt, va_list ap)
{
    if (lvl < log_min)
        return;
    int saved = errno; /* callers often log and then inspect errno */
    if ((unsigned)lvl > LOG_LEVEL_ERROR)
        lvl = LOG_LEVEL_ERROR;

    char msg[LOG_LINE_MAX];
    /* The suffix (a rate limiter's count) is kept whole: the message before
     * it is cut instead. It is short; a long one is cut to a quarter line. */
    size_t slen = suffix ? strnlen(suffix, LOG_LINE_MAX / 4) : 0;
    size_t len = 0, room = sizeof msg - 1 - slen; /* keep one byte for '\n' */
    int r = snprintf(msg, room, "%s: %s %s:%d: ", log_ident, log_level_names[lvl],
                     func ? func : "?", line);
    len = r < 0 ? 0 : (size_t)r < room ? (size_t)r : room - 1;

    r = vsnprintf(msg + len, room - len, fmt, ap);
    if (r > 0)
        len += (size_t)r < room - len ? (size_t)r : room - len - 1;

    if (errnum && len < room - 1) {
        char ebuf[128];
        /* GNU strerror_r: returns a pointer, maybe to a static string. */
        const char *es = strerror_r(errnum, ebuf, sizeof ebuf);
        r = snprintf(msg + len, room - len, ": %s", es);
        if (r > 0)
            len += (size_t)r < room - len ? (size_t)r : room - len - 1;
    }
    memcpy(msg + len, suffix ? suffix : "", slen);
    len += slen;
    msg[len++] = '\n';

    /* One write; a short write or EINTR just loses the rest of the line:
     * logging must never block or fail the caller. */
    ssize_t w;
    do
        w = write(STDERR_FILENO, msg, len);
    while (w < 0 && errno == EINTR);
    errno = saved;
}

void log_write(enum log_level lvl, const char *func, int line, int errnum,
               const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    log_vwrite(lvl, func, line, errnum, NULL, fmt, ap);
    va_end(ap);
}
