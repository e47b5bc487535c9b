/* The supervisor <-> sandbox channel: a SOCK_STREAM socketpair carrying
 * length-prefixed messages. Text frames travel as the same JSON frames as on
 * the WebSocket; archives need an envelope because they are binary.
 *
 *   +------+-------+-----+-----+------------------------+
 *   | type | flags |  0  |  0  | length (u32, little e.) | payload (length bytes)
 *   +------+-------+-----+-----+------------------------+
 *
 * Both ends run on the same host, so the byte order is fixed as little endian
 * only to keep the format explicit.
 *
 * Parts (supervisor to sandbox only: the sandbox's own messages are whole,
 * flags 0). A message the supervisor relays as it arrives (a large or
 * fragmented client message) is sent in parts, its length unknown at its
 * start: envelopes of one type with CHAN_MORE, each a piece of the body,
 * then one without it: the last piece (the message is complete), or an
 * empty CHAN_ABORT (the parts so far are dropped: the message turned out
 * not to be one to deliver). Nothing else comes between a message's parts.
 * The sandbox reassembles them in its own memory.
 *
 * File descriptors: the only one that travels is the seccomp listener, once,
 * attached (SCM_RIGHTS) to the sandbox's first message, a zero-length
 * CHAN_NOTIFY, sent during setup before any untrusted code runs. The
 * supervisor reads with recvmsg, adopts that one fd and closes any other a
 * sandbox sends. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#define CHAN_HDR_LEN 8

enum chan_type {
    CHAN_FRAME = 'F',     /* both ways: one JSON frame */
    CHAN_TOOLS = 'T',     /* to child: the tools archive (state T) */
    CHAN_WORKSPACE = 'W', /* to child: a workspace archive (state B) */
    CHAN_SNAPSHOT = 'S',  /* from child: the workspace snapshot after output */
    CHAN_NOTIFY = 'N',    /* from child, first message only: zero-length payload
                             carrying the seccomp listener fd (SCM_RIGHTS) */
};

/* Envelope flags (byte 1), supervisor to sandbox only. */
enum chan_flag {
    CHAN_MORE = 0x01,  /* a part: more parts of this message follow */
    CHAN_ABORT = 0x02, /* the last "part", empty: the parts so far are dropped */
    CHAN_RAW = 0x04,   /* the last part of a frame relayed as the client wrote it,
                          not in frame_encode()'s form: read it with a full decoder,
                          never by its shape (proto/shape.h) */
};
#define CHAN_FLAGS_ALL (CHAN_MORE | CHAN_ABORT | CHAN_RAW)

void chan_hdr_encode(uint8_t out[CHAN_HDR_LEN], enum chan_type type, uint32_t len);
/* The same with flags (enum chan_flag). */
void chan_hdr_encode_flags(uint8_t out[CHAN_HDR_LEN], enum chan_type type, unsigned flags,
                           uint32_t len);

/* Parse a header from p[0..n). Returns 1 and sets *type and *len when a whole,
 * valid header is present; 0 if n < CHAN_HDR_LEN; -EPROTO for an unknown type
 * or non-zero padding (flags included: what the supervisor reads); -EMSGSIZE
 * if len > max_len. */
int chan_hdr_decode(const uint8_t *p, size_t n, uint32_t max_len,
                    enum chan_type *type, uint32_t *len);
/* The same for the sandbox's reader: byte 1 may hold flags, returned in
 * *flags (-EPROTO for an unknown one, ABORT with MORE or a length, RAW with
 * MORE or on a type but 'F'). */
int chan_hdr_decode_flags(const uint8_t *p, size_t n, uint32_t max_len, enum chan_type *type,
                          unsigned *flags, uint32_t *len);

/* Write a `log` frame (frame_log_write(), FRAME_LOG_MAX bytes at most) to fd
 * as one CHAN_FRAME message: blocking writes, EINTR and short writes retried,
 * nothing allocated. For a process with nothing else on the channel, such as
 * the sandbox child reporting a setup failure before it _exits. 0, or
 * -errno of the failed write (-EPIPE if a write wrote nothing). */
int chan_write_log(int fd, const char *level, const char *msg);
