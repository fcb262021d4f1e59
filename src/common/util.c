/*
 * Shared internals: the allocation wrappers (with a fail-after-k hook for
 * the allocation-failure tests), error detail, the growable buffer, and
 * the one shape printer (dcp_shape_format, public for dcptool's sake).
 */
#include "util.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static _Atomic uint64_t alloc_count;
static _Atomic uint64_t alloc_fail_at; /* 0: never */
static _Atomic int alloc_fail_once;    /* only the k-th fails */

uint64_t dcp__alloc_fail_after(uint64_t k)
{
    uint64_t n = atomic_exchange(&alloc_count, 0);
    atomic_store(&alloc_fail_once, 0);
    atomic_store(&alloc_fail_at, k);
    return n;
}

uint64_t dcp__alloc_fail_once(uint64_t k)
{
    uint64_t n = dcp__alloc_fail_after(k);
    atomic_store(&alloc_fail_once, 1);
    return n;
}

static int alloc_should_fail(void)
{
    uint64_t n = atomic_fetch_add(&alloc_count, 1) + 1;
    uint64_t k = atomic_load(&alloc_fail_at);
    if (atomic_load(&alloc_fail_once))
        return k != 0 && n == k;
    return k != 0 && n >= k;
}

void *dcp__malloc(size_t n)
{
    if (alloc_should_fail())
        return NULL;
    return malloc(n ? n : 1);
}

void *dcp__calloc(size_t n, size_t size)
{
    if (alloc_should_fail())
        return NULL;
    if (n == 0 || size == 0)
        return calloc(1, 1);
    return calloc(n, size);
}

void *dcp__realloc(void *p, size_t n)
{
    if (alloc_should_fail())
        return NULL;
    return realloc(p, n ? n : 1);
}

void *dcp__malloc_aligned(size_t align, size_t n)
{
    void *p = NULL;
    if (alloc_should_fail())
        return NULL;
    return posix_memalign(&p, align, n ? n : 1) == 0 ? p : NULL;
}

void dcp__free(void *p)
{
    free(p);
}

char *dcp__strndup(const char *s, size_t n)
{
    char *d = dcp__malloc(n + 1);
    if (!d)
        return NULL;
    memcpy(d, s, n);
    d[n] = '\0';
    return d;
}

char *dcp__strdup(const char *s)
{
    return dcp__strndup(s, strlen(s));
}

void dcp_free(void *p)
{
    dcp__free(p);
}

int dcp__verr(struct dcp_err *err, int code, const char *fmt, va_list ap)
{
    if (err) {
        err->code = code;
        (void)vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
    }
    return code;
}

int dcp__err(struct dcp_err *err, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    (void)dcp__verr(err, code, fmt, ap);
    va_end(ap);
    return code;
}

int dcp__err_prefix(struct dcp_err *err, const char *fmt, ...)
{
    char pre[DCP_ERRMSG_MAX], old[DCP_ERRMSG_MAX];
    va_list ap;
    if (!err)
        return DCP_EINVAL;
    va_start(ap, fmt);
    (void)vsnprintf(pre, sizeof(pre), fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof(old));
    {
        /* Truncation is acceptable here: the message is detail only. */
        size_t lp = strnlen(pre, sizeof(err->msg) - 3);
        size_t lo = strnlen(old, sizeof(err->msg) - 3 - lp);
        memcpy(err->msg, pre, lp);
        memcpy(err->msg + lp, ": ", 2);
        memcpy(err->msg + lp + 2, old, lo);
        err->msg[lp + 2 + lo] = '\0';
    }
    return err->code;
}

void dcp__err_clear(struct dcp_err *err)
{
    if (err) {
        err->code = DCP_OK;
        err->msg[0] = '\0';
    }
}

/* ------------------------------------------------------------ buffers */

void dcp__advise_huge(void *p, size_t n)
{
#if defined(MADV_HUGEPAGE)
    const uintptr_t huge = (uintptr_t)2 << 20;
    uintptr_t lo, hi;
    if (!p || n < ((size_t)4 << 20))
        return;
    lo = ((uintptr_t)p + huge - 1) & ~(huge - 1);
    hi = ((uintptr_t)p + n) & ~(huge - 1);
    if (hi > lo)
        (void)madvise((void *)lo, (size_t)(hi - lo), MADV_HUGEPAGE);
#else
    (void)p;
    (void)n;
#endif
}

int dcp__grow_huge(void **p, size_t *cap, size_t used, size_t need,
                   size_t elem, size_t first)
{
    size_t nc = *cap ? *cap : first;
    void *np;
    if (need <= *cap)
        return DCP_OK;
    while (nc < need) {
        if (nc > SIZE_MAX / 2 / elem)
            return DCP_ENOMEM;
        nc *= 2;
    }
    if (nc * elem < ((size_t)4 << 20)) {
        np = dcp__realloc(*p, nc * elem);
        if (!np)
            return DCP_ENOMEM;
    } else { /* advised before the copy touches it (dcp__advise_huge) */
        np = dcp__malloc(nc * elem);
        if (!np)
            return DCP_ENOMEM;
        dcp__advise_huge(np, nc * elem);
        if (used)
            memcpy(np, *p, used * elem);
        dcp__free(*p);
    }
    *p = np;
    *cap = nc;
    return DCP_OK;
}

int dcp__buf_reserve(struct dcp_buf *b, size_t extra)
{
    size_t need;
    void *p = b->p;
    int rc;
    if (__builtin_add_overflow(b->len, extra, &need))
        return DCP_ENOMEM;
    rc = dcp__grow_huge(&p, &b->cap, b->len, need, 1, 256);
    b->p = p;
    return rc;
}

int dcp__buf_put(struct dcp_buf *b, const void *p, size_t n)
{
    if (n == 0)
        return DCP_OK;
    if (dcp__buf_reserve(b, n) != DCP_OK)
        return DCP_ENOMEM;
    memcpy(b->p + b->len, p, n);
    b->len += n;
    return DCP_OK;
}

int dcp__buf_put_u8(struct dcp_buf *b, uint8_t v)
{
    return dcp__buf_put(b, &v, 1);
}

int dcp__buf_put_le16(struct dcp_buf *b, uint16_t v)
{
    uint8_t x[2] = {(uint8_t)v, (uint8_t)(v >> 8)};
    return dcp__buf_put(b, x, 2);
}

int dcp__buf_put_le32(struct dcp_buf *b, uint32_t v)
{
    uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16),
                    (uint8_t)(v >> 24)};
    return dcp__buf_put(b, x, 4);
}

int dcp__buf_put_le64(struct dcp_buf *b, uint64_t v)
{
    if (dcp__buf_put_le32(b, (uint32_t)v) != DCP_OK)
        return DCP_ENOMEM;
    return dcp__buf_put_le32(b, (uint32_t)(v >> 32));
}

int dcp__buf_fill(struct dcp_buf *b, uint8_t byte, size_t n)
{
    if (n == 0)
        return DCP_OK;
    if (dcp__buf_reserve(b, n) != DCP_OK)
        return DCP_ENOMEM;
    memset(b->p + b->len, byte, n);
    b->len += n;
    return DCP_OK;
}

int dcp__buf_printf(struct dcp_buf *b, const char *fmt, ...)
{
    va_list ap, ap2;
    int n;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0 || dcp__buf_reserve(b, (size_t)n + 1) != DCP_OK) {
        va_end(ap2);
        return DCP_ENOMEM;
    }
    (void)vsnprintf((char *)b->p + b->len, (size_t)n + 1, fmt, ap2);
    va_end(ap2);
    b->len += (size_t)n;
    return DCP_OK;
}

void dcp__buf_free(struct dcp_buf *b)
{
    dcp__free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

int dcp_shape_format(char *buf, size_t cap, int ndim, const int64_t *shape)
{
    size_t n = 1;
    int d;
    if (!buf || cap == 0)
        return DCP_EINVAL;
    buf[0] = '\0';
    if (ndim < 0 || ndim > DCP_MAX_NDIM || (ndim && !shape))
        return DCP_EINVAL;
    (void)snprintf(buf, cap, "[");
    for (d = 0; d < ndim && n < cap; d++)
        n += (size_t)snprintf(buf + n, cap - n, d ? ",%" PRId64 : "%" PRId64,
                              shape[d]);
    if (n < cap)
        n += (size_t)snprintf(buf + n, cap - n, "]");
    return n < cap ? DCP_OK : DCP_ELIMIT;
}
