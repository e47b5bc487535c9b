/* Every compile-time ceiling in one place. Runtime-configurable limits live in
 * config.h and are validated against the bounds given here. */
#pragma once

#define KiB (1024ULL)
#define MiB (1024ULL * KiB)

/* forkboxd --config FILE: its size and one line's, at most. */
#define CONFIG_FILE_MAX_BYTES (64 * KiB)
#define CONFIG_LINE_MAX 4096

/* HTTP request before the upgrade. */
#define HTTP_MAX_REQUEST_BYTES (16 * KiB)
#define HTTP_MAX_HEADERS 64
#define HTTP_REQUEST_TIMEOUT_MS 10000

/* Connections not yet admitted as turns (session/preauth.h): the pool and one
 * peer's share of it (defaults of --preauth-max and --preauth-per-peer), and
 * how long a connection that has sent nothing still counts as new. */
#define PREAUTH_DEFAULT_MAX 1024
#define PREAUTH_DEFAULT_PER_PEER 128
#define PREAUTH_MAX_CONNECTIONS_BOUND 1000000
#define PREAUTH_SILENT_GRACE_MS 1000
/* The listener: the kernel's queue of connections not yet accept()ed (capped
 * by net.core.somaxconn), and how many are taken per wakeup so a connect
 * flood cannot starve turns. */
#define LISTEN_BACKLOG 1024
#define ACCEPT_BATCH 64

/* --metrics-listen (session/metrics_http.c): connections served at once
 * (one more closes the oldest), the time each may take from accept to its
 * last byte written, and its request's size. A scraper sends one small GET
 * and reads a few KiB: anything slower or larger is not one. */
#define METRICS_MAX_CONNECTIONS 8
#define METRICS_CONN_TIMEOUT_MS 5000
#define METRICS_MAX_REQUEST_BYTES (4 * KiB)
/* Ended turns whose log line waits for their sandbox's death report (peak
 * memory): at most this many, each at most this long (session/metrics.c). */
#define METRICS_PENDING_MAX 4096
#define METRICS_PENDING_WAIT_MS 5000

/* WebSocket: largest message either way (spec 1.4). */
#define WS_MAX_MESSAGE_BYTES (256 * MiB)
#define WS_PING_INTERVAL_MS 20000
#define WS_PONG_TIMEOUT_MS 20000

/* Supervisor <-> sandbox channel. */
#define CHAN_MAX_MESSAGE_BYTES (256 * MiB)

/* Embedding API (src/embed): one frame line from `forkbox sandbox`, as
 * large as one WebSocket message may be. */
#define EMBED_FRAME_MAX_BYTES WS_MAX_MESSAGE_BYTES

/* Archives (spec 4). */
#define ARCHIVE_DEFAULT_MAX_UPLOAD (100 * MiB)
#define ARCHIVE_DEFAULT_MAX_UNPACKED (1024 * MiB)
#define ARCHIVE_DEFAULT_MAX_MEMBERS 100000
#define SNAPSHOT_DEFAULT_MAX_BYTES (100 * MiB)
/* Bytes of one snapshot member's path (PATH_MAX less its NUL): the writer
 * skips longer ones, the supervisor's check refuses them. */
#define SNAPSHOT_MAX_PATH 4095
/* The sandbox keeps each file's compressed member for the next snapshot
 * (stage/archive.h): at most this many bytes of members, and at most
 * 1/SNAPSHOT_CACHE_MEMORY_SHARE of the turn's --memory, which they count
 * against. Past it, files are compressed again each time. */
#define SNAPSHOT_CACHE_MAX (128 * MiB)
#define SNAPSHOT_CACHE_MEMORY_SHARE 8

/* The supervisor's check of a snapshot (proto/tarcheck.h). Per call, at
 * most this many compressed bytes consumed and this many inflated: ~0.8 ms
 * for text on this VM (inflate runs at ~170 MB/s of output, the check adds
 * nothing measurable), ~0.1 ms for incompressible data. */
#define TARCHECK_STEP_BUDGET (128 * KiB)
#define TARCHECK_DEFAULT_MAX_PATH SNAPSHOT_MAX_PATH
#define TARCHECK_MAX_PATH_CEILING (64 * KiB - 1)
/* Snapshot members the supervisor has verified in a turn, remembered by
 * their SHA-256 so that an unchanged one is not inflated again (tarcheck.h):
 * at most this much memory per turn (~100 bytes and the path per member),
 * charged to the turn's --turn-buffer. */
#define TARCHECK_CACHE_MAX (4 * MiB)
/* Zero bytes allowed after the two end blocks (CPython pads to 10240). */
#define TARCHECK_MAX_TRAILER (64 * KiB)

/* Host proc files the fork server reads once to make a sandbox's synthetic
 * /proc (cpuinfo: ~1.5 KiB per CPU). */
#define SBX_PROC_HOST_TEXT_MAX (1 * MiB)
/* Host /etc files up to this size are copied into the sandbox root, larger
 * ones bound (the root tmpfs holds 4 MiB). */
#define SBX_ETC_COPY_MAX (256 * KiB)

/* Output capture per stream per block. */
#define OUTPUT_DEFAULT_CAP (16 * MiB)
/* A block's output pipes after it ended, still drained (and the bytes
 * dropped) so that a write already blocked in them completes instead of
 * failing with EPIPE (src/pyrt/capture.c): at most this many pipes, each
 * closed at EOF or at the latest this long after the block (a writer that
 * waits for the CPU longer than that under load still gets EPIPE). */
#define CAPTURE_RETIRED_MAX 16
#define CAPTURE_RETIRE_MAX_MS 2000

/* Backpressure: stop reading a side while the other side has this much queued. */
#define RELAY_HIGH_WATER (4 * MiB)
/* A value at least this large in a client frame that must be re-encoded (a
 * tool result) is sent to the sandbox from the client's message, not
 * copied into the new encoding. */
#define RELAY_SLICE_MIN (64 * KiB)

/* Rate-limited log lines (core/ratelimit.h), per call site: a burst, then a
 * steady rate; what is dropped is counted and reported on the next line. */
#define LOG_RATELIMIT_BURST 10
#define LOG_RATELIMIT_PER_INTERVAL 1
#define LOG_RATELIMIT_INTERVAL_MS 1000

/* flock(2) of a sandbox, carried out by the supervisor (src/session/flock.c).
 * A blocking call that would block is parked and retried with LOCK_NB, the
 * delay doubling from MIN to MAX; each parked call holds one supervisor fd. */
#define FLOCK_MAX_PARKED 16        /* per turn; one more blocking call gets ENOLCK */
#define FLOCK_RETRY_MIN_MS 1
#define FLOCK_RETRY_MAX_MS 50

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

/* Memory a turn's buffers may hold in the supervisor (--turn-buffer): one
 * message of the largest size in each direction, plus what backpressure
 * lets queue; and all turns together (--total-buffer, default a quarter of
 * the machine's memory, at least the minimum). */
#define TURN_BUFFER_DEFAULT (2 * WS_MAX_MESSAGE_BYTES + 4 * RELAY_HIGH_WATER)
#define TOTAL_BUFFER_MIN (TURN_BUFFER_DEFAULT)

/* What a sandbox may send, by state and kind (session/from_sandbox.c).
 * Between blocks only ready and log frames are legal, and they are small; a
 * block's tool_call may be as large as any message. */
#define SANDBOX_SMALL_FRAME_MAX (4 * MiB)
#define SANDBOX_READY_ITEMS (1u << 20)  /* ready.packages of a large site dir */
#define SANDBOX_OUTPUT_ITEMS 16         /* done, output: a few scalars */
#define SANDBOX_LOG_ITEMS 16
#define SANDBOX_LOG_MSG_MAX (64 * KiB)
/* Output streams are held to --output-cap plus the notes the sandbox adds
 * ("[forkbox: N bytes of stdout dropped]", snapshot notes). */
#define OUTPUT_NOTE_ALLOWANCE (4 * KiB)
/* A sandbox's log lines in the operator log: a burst, then a few a minute. */
#define SANDBOX_LOG_BURST 20
#define SANDBOX_LOG_PER_MINUTE 10

/* fds one fd_recv() takes (core/util.h): the control buffer's room. The
 * largest legitimate message carries two (the fork server's reply: channel
 * and pidfd), but a sandbox may attach the kernel's most, SCM_MAX_FD (253),
 * and what does not fit is dropped by the kernel (MSG_CTRUNC) with its last
 * close on the receiving thread: the channel's reads take them all and hand
 * them to the closer (loop/closer.h). */
#define FDPASS_MAX_FDS 253

/* The closer thread (loop/closer.h): fds waiting to be closed at most (one
 * more is left open for good), a close that took this long is logged, and
 * the draining of a unix socket's queued fds before its close: rounds of
 * recvmsg per socket and levels of sockets inside sockets. */
#define CLOSER_QUEUE_MAX 16384
#define CLOSER_SLOW_MS 100
#define CLOSER_DRAIN_ROUNDS 64
#define CLOSER_DRAIN_DEPTH 3
#define CLOSER_STACK_BYTES (128 * KiB)
/* Where the kernel has no SO_PASSRIGHTS, any read of a channel can bring a
 * sandbox's fds: the supervisor keeps this many fd slots free under its
 * hard RLIMIT_NOFILE (the soft one is lowered) and lends them for the read,
 * so a full fd table never makes the kernel drop (and close, on the loop
 * thread) what arrives: room for two messages' worth. */
#define FD_RESERVE (2 * FDPASS_MAX_FDS + 6)

/* The operator log (loop/logq.h): the supervisor's queue of lines waiting
 * for stderr (about a thousand lines; one more is dropped and counted), the
 * longest line (one atomic pipe write), the fork server's pipe, how many
 * reads of it per wakeup, how long exit waits for the queue to drain. */
#define LOGQ_BYTES (256 * KiB)
#define LOGQ_LINE_MAX 4096
#define LOGQ_PIPE_BYTES (1 * MiB)
#define LOGQ_READS_PER_WAKEUP 4
#define LOGQ_EXIT_FLUSH_MS 2000
#define LOGQ_STACK_BYTES (64 * KiB)

/* The event loop (loop/loop.h, loop/watchdog.h): an iteration this long is
 * logged; a loop stuck in one call this long is logged, and exits the
 * process when a stop signal has waited that long too (the loop reads
 * signals through a signalfd, so a stuck loop never sees them). */
#define LOOP_SLOW_MS 100
#define LOOP_STUCK_LOG_S 2
#define LOOP_STUCK_EXIT_S 5

/* The fork server (session/server.c, sandbox/fsclient.c): how long a start
 * may take to its ready record; after it dies, the next start is at once,
 * then after RESTART_MIN doubling to RESTART_MAX while starts fail or it
 * dies again; after RESTART_TRIES of those in a row forkboxd exits 1. A fork
 * server that stayed up STABLE resets the count. */
#define FS_READY_TIMEOUT_MS 30000
#define FS_RESTART_MIN_MS 100
#define FS_RESTART_MAX_MS 5000
#define FS_RESTART_TRIES 5
#define FS_STABLE_MS 10000

/* The bearer token file (net/auth.c): one token a line. Bounded so that a
 * wrong --token-file (a log, a device) is refused instead of read whole at
 * every SIGHUP; 64 tokens leave room for any rotation. */
#define TOKEN_FILE_MAX_BYTES (64 * KiB)
#define TOKENS_MAX 64
/* A tenant's name (net/auth.h: "NAME TOKEN" lines), at most. Tenants are
 * therefore at most TOKENS_MAX at a time, which bounds the metrics' tenant
 * label (session/tenants.h). */
#define TENANT_NAME_MAX 64
