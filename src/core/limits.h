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

/* Host proc files the fork server reads once to make a sandbox's synthetic
 * /proc (cpuinfo: ~1.5 KiB per CPU). */
#define SBX_PROC_HOST_TEXT_MAX (1 * MiB)
/* Host /etc files up to this size are copied into the sandbox root, larger
 * ones bound (the root tmpfs holds 4 MiB). */
#define SBX_ETC_COPY_MAX (256 * KiB)

/* Output capture per stream per block. */
#define OUTPUT_DEFAULT_CAP (16 * MiB)

/* Backpressure: stop reading a side while the other side has this much queued. */
#define RELAY_HIGH_WATER (4 * MiB)
