/* Every compile-time ceiling in one place. Runtime-configurable limits live in
 * config.h and are validated against the bounds given here. */
#pragma once

#define KiB (1024ULL)
#define MiB (1024ULL * KiB)

/* HTTP request before the upgrade. */
#define HTTP_MAX_REQUEST_BYTES (16 * KiB)
#define HTTP_MAX_HEADERS 64
#define HTTP_REQUEST_TIMEOUT_MS 10000

/* WebSocket: largest message either way (spec 1.4). */
#define WS_MAX_MESSAGE_BYTES (256 * MiB)
#define WS_PING_INTERVAL_MS 20000
#define WS_PONG_TIMEOUT_MS 20000

/* Supervisor <-> sandbox channel. */
#define CHAN_MAX_MESSAGE_BYTES (256 * MiB)

/* Archives (spec 4). */
#define ARCHIVE_DEFAULT_MAX_UPLOAD (100 * MiB)
#define ARCHIVE_DEFAULT_MAX_UNPACKED (1024 * MiB)
#define ARCHIVE_DEFAULT_MAX_MEMBERS 100000
#define SNAPSHOT_DEFAULT_MAX_BYTES (100 * MiB)

/* Output capture per stream per block. */
#define OUTPUT_DEFAULT_CAP (16 * MiB)

/* Backpressure: stop reading a side while the other side has this much queued. */
#define RELAY_HIGH_WATER (4 * MiB)

/* Per-sandbox shares of what the kernel counts per user. Each sandbox has a
 * host uid of its own (--id-range), so the host-wide per-user limits already
 * apply to one sandbox at a time; these keep that share small. Chosen so that
 * ordinary code (threads, subprocess, asyncio, multiprocessing, a file
 * watcher) never meets them. */
/* inotify (user namespace caps, written in setup step 4): the host default is
 * 128 instances and ~190k watches per user. */
#define SBX_MAX_INOTIFY_INSTANCES 32
#define SBX_MAX_INOTIFY_WATCHES 8192
/* RLIMIT_SIGPENDING: queued signals. Only real-time signals sent with
 * sigqueue and POSIX timers ever fail on it; a standard signal is delivered
 * without its extra info instead. The host default is ~96k here. */
#define SBX_RLIMIT_SIGPENDING 1024
/* RLIMIT_MSGQUEUE: bytes in POSIX message queues (the Linux default). The
 * default seccomp policy refuses mq_open; this holds under another policy. */
#define SBX_RLIMIT_MSGQUEUE (800 * KiB)
