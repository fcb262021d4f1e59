/*
 * ZStandard frames through libzstd's streaming decoder, with the output
 * bounded by the caller and the window bounded by ZSTD_d_windowLogMax.
 */
#include "zframe.h"

#include <string.h>

#ifdef DCP_HAVE_ZSTD
#include <zstd.h>
#endif

/* A window of at most 128 MiB: zstd's own default limit for decoding
 * (ZSTD_WINDOWLOG_LIMIT_DEFAULT), stated here so it never grows. */
#define WINDOW_LOG_MAX 27

int dcp__zstd_descriptor_ok(const char *desc)
{
    static const char name[] = "stream.zstd/";
    size_t n = sizeof(name) - 1;
    if (strncmp(desc, name, n) != 0)
        return 0;
    /* version.partition(".")[0] == "1" */
    return desc[n] == '1' && (desc[n + 1] == '\0' || desc[n + 1] == '.');
}

#ifdef DCP_HAVE_ZSTD

int dcp__zstd_decode(const uint8_t *src, size_t len, uint64_t max_out,
                     uint8_t **out, size_t *out_len, struct dcp_err *err)
{
    ZSTD_DCtx *d;
    ZSTD_inBuffer in = {src, len, 0};
    ZSTD_outBuffer o;
    unsigned long long fcs;
    size_t cap, rc = 1;
    uint8_t *p;
    *out = NULL;
    *out_len = 0;
    if (max_out > SIZE_MAX - 1)
        max_out = SIZE_MAX - 1;
    /* A frame that states its content size lets the buffer be sized once;
     * the statement is only trusted up to max_out. */
    fcs = len ? ZSTD_getFrameContentSize(src, len) : ZSTD_CONTENTSIZE_ERROR;
    if (fcs == ZSTD_CONTENTSIZE_ERROR)
        return dcp__err(err, DCP_ECORRUPT,
                        "compressed record is not a zstd frame");
    if (fcs != ZSTD_CONTENTSIZE_UNKNOWN && fcs > max_out)
        return dcp__err(err, DCP_ECORRUPT,
                        "zstd frame states %llu bytes, more than the %llu "
                        "the metadata allows",
                        fcs, (unsigned long long)max_out);
    cap = fcs != ZSTD_CONTENTSIZE_UNKNOWN ? (size_t)fcs + 1
          : max_out < ((size_t)1 << 20)   ? (size_t)max_out + 1
                                          : (size_t)1 << 20;
    p = dcp__malloc(cap);
    d = ZSTD_createDCtx();
    if (!p || !d) {
        dcp__free(p);
        ZSTD_freeDCtx(d);
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    }
    (void)ZSTD_DCtx_setParameter(d, ZSTD_d_windowLogMax, WINDOW_LOG_MAX);
    o.dst = p;
    o.size = cap;
    o.pos = 0;
    for (;;) {
        if (o.pos == o.size) {
            /* One byte past max_out is room to detect the lie. */
            size_t ncap =
                o.size > (SIZE_MAX - 1) / 2 ? SIZE_MAX - 1 : o.size * 2;
            uint8_t *np;
            if (ncap > (size_t)max_out + 1)
                ncap = (size_t)max_out + 1;
            if (o.size >= ncap)
                break; /* full at max_out + 1: reported below */
            np = dcp__realloc(p, ncap);
            if (!np) {
                dcp__free(p);
                ZSTD_freeDCtx(d);
                return dcp__err(err, DCP_ENOMEM, "out of memory");
            }
            p = np;
            o.dst = p;
            o.size = ncap;
        }
        rc = ZSTD_decompressStream(d, &o, &in);
        if (ZSTD_isError(rc)) {
            const char *why = ZSTD_getErrorName(rc);
            dcp__free(p);
            ZSTD_freeDCtx(d);
            return dcp__err(err, DCP_ECORRUPT,
                            "damaged zstd frame near compressed byte %zu of "
                            "%zu: %s",
                            in.pos, len, why);
        }
        if (o.pos > max_out)
            break;
        /* All input taken and the output not full: nothing is pending. */
        if (in.pos == in.size && o.pos < o.size)
            break;
    }
    ZSTD_freeDCtx(d);
    if (o.pos > max_out) {
        dcp__free(p);
        return dcp__err(err, DCP_ECORRUPT,
                        "zstd frame expands past the %llu bytes the "
                        "metadata allows",
                        (unsigned long long)max_out);
    }
    if (rc != 0) {
        dcp__free(p);
        return dcp__err(err, DCP_ECORRUPT,
                        "truncated zstd frame (%zu compressed bytes)", len);
    }
    *out = p;
    *out_len = o.pos;
    return DCP_OK;
}

int dcp__zstd_encode(const void *src, size_t len, int level,
                     struct dcp_buf *out, struct dcp_err *err)
{
    size_t bound = ZSTD_compressBound(len), n;
    ZSTD_CCtx *c;
    if (ZSTD_isError(bound) || dcp__buf_reserve(out, bound) != DCP_OK)
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    c = ZSTD_createCCtx();
    if (!c)
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    (void)ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, level);
    (void)ZSTD_CCtx_setParameter(c, ZSTD_c_checksumFlag, 1);
    (void)ZSTD_CCtx_setParameter(c, ZSTD_c_contentSizeFlag, 1);
    n = ZSTD_compress2(c, out->p + out->len, bound, src, len);
    ZSTD_freeCCtx(c);
    if (ZSTD_isError(n))
        return dcp__err(err, DCP_ENOMEM, "zstd compression failed: %s",
                        ZSTD_getErrorName(n));
    out->len += n;
    return DCP_OK;
}

#else /* !DCP_HAVE_ZSTD */

int dcp__zstd_decode(const uint8_t *src, size_t len, uint64_t max_out,
                     uint8_t **out, size_t *out_len, struct dcp_err *err)
{
    (void)src;
    (void)len;
    (void)max_out;
    *out = NULL;
    *out_len = 0;
    return dcp__err(err, DCP_ENOTSUP,
                    "zstd-compressed record: dcp was built without libzstd");
}

int dcp__zstd_encode(const void *src, size_t len, int level,
                     struct dcp_buf *out, struct dcp_err *err)
{
    (void)src;
    (void)len;
    (void)level;
    (void)out;
    return dcp__err(err, DCP_ENOTSUP,
                    "zstd compression: dcp was built without libzstd");
}

#endif
