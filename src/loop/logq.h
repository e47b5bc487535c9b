/* The operator log without waiting for its reader. Runs in forkboxd.
 *
 * stderr is whoever started us: a terminal, a pipe to a log shipper, the
 * journal's stream socket. A reader that stops (a stuck shipper, a journald
 * that is not scheduled) fills the pipe, and a blocking write(2) then stops
 * the whole supervisor (0.6 s after the reader stopped, on d4bf581). So the
 * supervisor's log lines (core/log.h formats them as before: text or JSON,
 * journal prefixes, rate limits) go into a bounded queue of whole lines, and
 * one writer thread writes them to stderr, blocking only itself. A line that
 * does not fit is dropped and counted; once the writer gets a write through
 * again, it logs "N log lines dropped" (through the queue, as a line of its
 * own).
 *
 * The fork server and its cgroup placer cannot have threads (clone with
 * CLONE_NEWUSER needs a single-threaded caller), so their stderr is a pipe
 * whose write end is non-blocking (a line that does not fit is dropped and
 * counted by log.c there, and the count written with its next line), and
 * the supervisor's loop reads it (logq_watch) and queues the lines, whole:
 * they reach stderr in the order read, formatted by the fork server.
 *
 * Order of use in main(): logq_open (the pipe, before the fork server
 * starts), then, once the fork server runs, logq_start (the thread; the
 * sink) and logq_watch (the loop). Lines logged before logq_start are
 * written directly, as before. */
#pragma once
#include <stddef.h>
#include <stdint.h>

struct loop;

/* Make the fork server's log pipe: *fs_stderr gets its write end (non-
 * blocking, close-on-exec: the fork server's start dup2s it to 2). What is
 * in it and in the queue at exit is written then (at most
 * LOGQ_EXIT_FLUSH_MS). 0, or -errno with a reason. */
int logq_open(int *fs_stderr, char *err, size_t errlen);
/* Start the writer thread (every signal blocked in it) and send every line
 * log.c writes from now on through the queue. 0, or -errno with a reason. */
int logq_start(char *err, size_t errlen);
/* Read the fork server's pipe in loop l (borrowed, must outlive the
 * process's logging). 0 or -errno. */
int logq_watch(struct loop *l);
/* Take what is in the fork server's pipe now (its start-up lines, right
 * after its ready record: they come before ours, as they were written). */
void logq_drain(void);

/* One whole line (ending in '\n', at most LOGQ_LINE_MAX bytes) into the
 * queue, or dropped and counted when it does not fit; before logq_start,
 * written at once. Any thread. */
void logq_push(const char *line, size_t len);

struct logq_counts {
    uint64_t lines;   /* queued */
    uint64_t dropped; /* not: the queue was full */
};
void logq_get_counts(struct logq_counts *out);
