/* Leveled logging with function:line; one sink per process.
 *
 * The supervisor and the fork server log to stderr (the supervisor through
 * a queue and a writer thread, the fork server through a pipe the
 * supervisor reads: loop/logq.h). A sandbox child must not
 * write to fds it does not own, so it never calls these (it reports through
 * `log` frames instead). */
#pragma once
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>

enum log_level { LOG_LEVEL_DEBUG, LOG_LEVEL_INFO, LOG_LEVEL_WARN, LOG_LEVEL_ERROR };
enum log_format { LOG_FORMAT_TEXT, LOG_FORMAT_JSON };

/* ident prefixes every line ("forkboxd", "forkserver"); min drops lower levels. */
void log_init(const char *ident, enum log_level min);
enum log_level log_min_level(void);
/* How lines look (log.c): text or one JSON object per line; journal: stderr
 * is the journal, so lines start with a "<N>" priority and carry no
 * timestamp. Set once at start; a later log_init() keeps it. */
void log_set_format(enum log_format fmt, bool journal);
/* True if journal_stream ($JOURNAL_STREAM, "DEV:INO" in decimal; NULL ok)
 * names the file open on fd: systemd's own test for "stderr is the journal". */
bool log_journal_stream_matches(const char *journal_stream, int fd);
/* Where finished lines go: by default one write(2) each to stderr; sink
 * (NULL: back to that) gets every line instead, whole and ending in '\n',
 * at most PIPE_BUF bytes (the supervisor's queue: loop/logq.h). Without a
 * sink a line that stderr refuses with EAGAIN (a non-blocking pipe: the
 * fork server's) is dropped and counted, and the count is logged before
 * the next line that goes through. Safe from any thread. */
void log_set_sink(void (*sink)(const char *line, size_t len));

/* Escapers for bytes a peer chose, cut before an escape that does not fit.
 * log_json_escape: the inside of a JSON string (", \, control bytes escaped;
 * invalid UTF-8 replaced by U+FFFD), not NUL-terminated; returns its length.
 * log_printable: printable ASCII for a text line (anything else, and " and
 * \, as \xHH), NUL-terminated in cap bytes; returns its length. */
size_t log_json_escape(char *out, size_t cap, const char *in, size_t n);
size_t log_printable(char *out, size_t cap, const char *in, size_t n);

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
