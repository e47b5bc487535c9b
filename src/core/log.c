/* Leveled logging to stderr, in the supervisor and the fork server (and its
 * cgroup helper). A line is one of
 *   text:  "ident: LEVEL func:line: msg[: strerror]\n"
 *   json:  {"ts":"...","level":"info","proc":"ident","pid":N,"src":"func:line","msg":"..."}
 * and, when stderr is the journal, starts with sd-daemon.h's priority
 * prefix ("<3>" .. "<7>") and carries no timestamp (journald adds one).
 *
 * Each line is formatted into a stack buffer and written with one write(2)
 * (or handed whole to the sink: the supervisor's queue, loop/logq.h), so
 * lines from several processes sharing stderr do not interleave as long as
 * they stay under PIPE_BUF. Long messages are cut rather than split. */
#include "core/log.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/utf8.h"
#include "core/util.h"

#define LOG_LINE_MAX 1024
/* A JSON line: the message (at most LOG_LINE_MAX bytes) escaped, which can
 * grow it up to six times; it is cut at PIPE_BUF, where one write(2) to a
 * pipe stops being atomic. */
#define LOG_JSON_LINE_MAX PIPE_BUF

/* The only process-wide state of this module: set once by log_init() before
 * anything else runs, read-only afterwards. */
static char log_ident[32] = "forkbox";
static enum log_level log_min = LOG_LEVEL_INFO;
static enum log_format log_fmt = LOG_FORMAT_TEXT;
static bool log_journal; /* stderr is the journal: priority prefixes, no timestamps */
/* Set at start (atomically: threads may be logging): the supervisor's queue. */
static void (*log_sink)(const char *line, size_t len);
/* Lines a non-blocking stderr refused (EAGAIN), not reported yet. */
static uint64_t log_refused;

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

void log_set_sink(void (*sink)(const char *line, size_t len))
{
    __atomic_store_n(&log_sink, sink, __ATOMIC_RELEASE);
}

void log_set_format(enum log_format fmt, bool journal)
{
    log_fmt = fmt;
    log_journal = journal;
}

/* systemd.exec(5), $JOURNAL_STREAM: "device and inode number ... formatted
 * in decimal, separated by a colon"; the stream is ours only if fd is that
 * very file (a child whose stderr was redirected inherits the variable). */
bool log_journal_stream_matches(const char *journal_stream, int fd)
{
    const char *colon = journal_stream ? strchr(journal_stream, ':') : NULL;
    char dev_s[24];
    uint64_t dev, ino;
    struct stat st;

    if (!colon || (size_t)(colon - journal_stream) >= sizeof dev_s)
        return false;
    memcpy(dev_s, journal_stream, (size_t)(colon - journal_stream));
    dev_s[colon - journal_stream] = '\0';
    if (parse_u64(dev_s, UINT64_MAX, &dev) < 0 || parse_u64(colon + 1, UINT64_MAX, &ino) < 0)
        return false;
    if (fstat(fd, &st) < 0)
        return false;
    return (uint64_t)st.st_dev == dev && (uint64_t)st.st_ino == ino;
}

/* Write one escape (or one kept byte run) if it fits: 0 if it does not. */
static size_t put(char *out, size_t cap, size_t len, const char *p, size_t n)
{
    if (n > cap - len)
        return 0;
    memcpy(out + len, p, n);
    return n;
}

size_t log_json_escape(char *out, size_t cap, const char *in, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    const uint8_t *p = (const uint8_t *)in;
    size_t len = 0;

    for (size_t i = 0; i < n;) {
        uint8_t c = p[i], need, lo, hi;
        char e[6];
        size_t w, used = 1;
        if (c == '"' || c == '\\') {
            e[0] = '\\';
            e[1] = (char)c;
            w = put(out, cap, len, e, 2);
        } else if (c < 0x20 || c == 0x7f) {
            const char *shortf = c == '\n' ? "\\n" : c == '\t' ? "\\t" : c == '\r' ? "\\r" : NULL;
            if (shortf) {
                w = put(out, cap, len, shortf, 2);
            } else {
                char u[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
                w = put(out, cap, len, u, 6);
            }
        } else if (c < 0x80) {
            w = put(out, cap, len, (const char *)&p[i], 1);
        } else {
            /* A whole, well-formed sequence is kept as is; anything else
             * (a stray byte, a cut or overlong sequence, a surrogate) is
             * one U+FFFD per byte, so the line stays valid UTF-8 JSON. */
            bool okseq = utf8_lead(c, &need, &lo, &hi) && n - i > need;
            for (uint8_t k = 1; okseq && k <= need; k++)
                okseq = p[i + k] >= (k == 1 ? lo : 0x80) && p[i + k] <= (k == 1 ? hi : 0xBF);
            if (okseq) {
                used = 1 + (size_t)need;
                w = put(out, cap, len, (const char *)&p[i], used);
            } else {
                w = put(out, cap, len, "\\ufffd", 6);
            }
        }
        if (w == 0)
            break; /* cut before an escape that does not fit, never inside one */
        len += w;
        i += used;
    }
    return len;
}

size_t log_printable(char *out, size_t cap, const char *in, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    size_t len = 0;
    if (cap == 0)
        return 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t c = (uint8_t)in[i];
        size_t w;
        if (c >= 0x20 && c < 0x7f && c != '\\' && c != '"') {
            w = put(out, cap - 1, len, (const char *)&in[i], 1);
        } else {
            char x[4] = {'\\', 'x', hex[c >> 4], hex[c & 15]};
            w = put(out, cap - 1, len, x, 4);
        }
        if (w == 0)
            break;
        len += w;
    }
    out[len] = '\0';
    return len;
}

/* sd-daemon.h: SD_ERR, SD_WARNING, SD_INFO, SD_DEBUG. */
static const char *const log_journal_prefix[] = {
    [LOG_LEVEL_DEBUG] = "<7>",
    [LOG_LEVEL_INFO] = "<6>",
    [LOG_LEVEL_WARN] = "<4>",
    [LOG_LEVEL_ERROR] = "<3>",
};

static const char *const log_json_level[] = {
    [LOG_LEVEL_DEBUG] = "debug",
    [LOG_LEVEL_INFO] = "info",
    [LOG_LEVEL_WARN] = "warn",
    [LOG_LEVEL_ERROR] = "error",
};

/* The JSON line around msg[0..len) (already cut to LOG_LINE_MAX). ts is
 * RFC 3339 in UTC with milliseconds, left out when journald stamps lines. */
static size_t json_line(char *line, enum log_level lvl, const char *func, int fline,
                        const char *msg, size_t len)
{
    char ts[80] = "", ident[2 * sizeof log_ident], src[96];
    if (!log_journal) {
        struct timespec now;
        struct tm tm;
        clock_gettime(CLOCK_REALTIME, &now);
        gmtime_r(&now.tv_sec, &tm);
        snprintf(ts, sizeof ts, "\"ts\":\"%04d-%02d-%02dT%02d:%02d:%02d.%03dZ\",",
                 tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
                 (int)(now.tv_nsec / 1000000));
    }
    size_t il = log_json_escape(ident, sizeof ident - 1, log_ident, strlen(log_ident));
    ident[il] = '\0';
    char fl[32];
    int fn = snprintf(fl, sizeof fl, ":%d", fline);
    const char *f = func ? func : "?";
    size_t sl = log_json_escape(src, sizeof src - sizeof fl, f, strlen(f));
    memcpy(src + sl, fl, (size_t)fn + 1);

    static const char tail[] = "\"}\n";
    int r = snprintf(line, LOG_JSON_LINE_MAX, "%s{%s\"level\":\"%s\",\"proc\":\"%s\",\"pid\":%ld,"
                     "\"src\":\"%s\",\"msg\":\"", log_journal ? log_journal_prefix[lvl] : "",
                     ts, log_json_level[lvl], ident, (long)getpid(), src);
    size_t n = r < 0 ? 0 : (size_t)r;
    if (n > LOG_JSON_LINE_MAX - sizeof tail) /* cannot happen: the head is short */
        return 0;
    n += log_json_escape(line + n, LOG_JSON_LINE_MAX - sizeof tail + 1 - n, msg, len);
    memcpy(line + n, tail, sizeof tail - 1);
    return n + sizeof tail - 1;
}

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
    /* A JSON line's fields are added around the message (json_line). */
    int r = log_fmt == LOG_FORMAT_JSON
                ? 0
                : snprintf(msg, room, "%s%s: %s %s:%d: ", log_journal ? log_journal_prefix[lvl] : "",
                           log_ident, log_level_names[lvl], func ? func : "?", line);
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

    char json[LOG_JSON_LINE_MAX];
    const char *out = msg;
    if (log_fmt == LOG_FORMAT_JSON) {
        len = json_line(json, lvl, func, line, msg, len);
        out = json;
    } else {
        msg[len++] = '\n';
    }

    void (*sink)(const char *, size_t) = __atomic_load_n(&log_sink, __ATOMIC_ACQUIRE);
    if (sink) {
        sink(out, len);
        errno = saved;
        return;
    }
    /* Lines refused earlier are reported first (the report is a line of its
     * own; the count is taken, so it is reported once). */
    uint64_t refused = __atomic_exchange_n(&log_refused, 0, __ATOMIC_RELAXED);
    if (refused)
        log_write(LOG_LEVEL_WARN, __func__, __LINE__, 0,
                  "%" PRIu64 " log line%s dropped: stderr was full", refused,
                  refused == 1 ? "" : "s");
    /* One write; a short write or EINTR just loses the rest of the line. A
     * full non-blocking stderr loses the line (counted): logging must never
     * block or fail the caller. */
    ssize_t w;
    do
        w = write(STDERR_FILENO, out, len);
    while (w < 0 && errno == EINTR);
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        __atomic_add_fetch(&log_refused, 1, __ATOMIC_RELAXED);
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
