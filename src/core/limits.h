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

/* flock(2) of a sandbox, carried out by the supervisor (src/session/flock.c).
 * A blocking call that would block is parked and retried with LOCK_NB, the
 * delay doubling from MIN to MAX; each parked call holds one supervisor fd. */
#define FLOCK_MAX_PARKED 16        /* per turn; one more blocking call gets ENOLCK */
#define FLOCK_RETRY_MIN_MS 1
#define FLOCK_RETRY_MAX_MS 50
