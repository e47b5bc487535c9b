/* The 8-byte channel envelope (see chan.h), and a log frame written
 * straight to the channel (supervisor and sandbox both link this). */
#include "proto/chan.h"

#include <errno.h>
#include <unistd.h>

#include "proto/frame.h"

void chan_hdr_encode(uint8_t out[CHAN_HDR_LEN], enum chan_type type, uint32_t len)
{
    chan_hdr_encode_flags(out, type, 0, len);
}

void chan_hdr_encode_flags(uint8_t out[CHAN_HDR_LEN], enum chan_type type, unsigned flags,
                           uint32_t len)
{
    out[0] = (uint8_t)type;
    out[1] = (uint8_t)flags;
    out[2] = out[3] = 0;
    out[4] = (uint8_t)len;
    out[5] = (uint8_t)(len >> 8);
    out[6] = (uint8_t)(len >> 16);
    out[7] = (uint8_t)(len >> 24);
}

int chan_hdr_decode(const uint8_t *p, size_t n, uint32_t max_len,
                    enum chan_type *type, uint32_t *len)
{
    unsigned flags;
    int r = chan_hdr_decode_flags(p, n, max_len, type, &flags, len);
    return r == 1 && flags ? -EPROTO : r;
}

int chan_hdr_decode_flags(const uint8_t *p, size_t n, uint32_t max_len, enum chan_type *type,
                          unsigned *flags, uint32_t *len)
{
    if (n < CHAN_HDR_LEN)
        return 0;
    switch (p[0]) {
    case CHAN_FRAME:
    case CHAN_TOOLS:
    case CHAN_WORKSPACE:
    case CHAN_SNAPSHOT:
    case CHAN_NOTIFY:
        break;
    default:
        return -EPROTO;
    }
    /* Padding must be zero so a desynchronised stream (reading from the
     * middle of a payload) is caught early rather than trusted. */
    if (p[2] | p[3] || (p[1] & ~CHAN_FLAGS_ALL))
        return -EPROTO;
    uint32_t l = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 |
                 (uint32_t)p[7] << 24;
    unsigned f = p[1];
    if (((f & CHAN_ABORT) && (f != CHAN_ABORT || l)) ||
        ((f & CHAN_RAW) && ((f & CHAN_MORE) || p[0] != CHAN_FRAME)))
        return -EPROTO;
    if (l > max_len)
        return -EMSGSIZE;
    *type = (enum chan_type)p[0];
    *flags = f;
    *len = l;
    return 1;
}

int chan_write_log(int fd, const char *level, const char *msg)
{
    char buf[CHAN_HDR_LEN + FRAME_LOG_MAX];
    size_t len = frame_log_write(buf + CHAN_HDR_LEN, FRAME_LOG_MAX, level, msg);
    if (len == 0)
        return -EINVAL;
    chan_hdr_encode((uint8_t *)buf, CHAN_FRAME, (uint32_t)len);
    len += CHAN_HDR_LEN;
    for (size_t off = 0; off < len;) {
        ssize_t w = write(fd, buf + off, len - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return -errno;
        if (w == 0)
            return -EPIPE;
        off += (size_t)w;
    }
    return 0;
}
