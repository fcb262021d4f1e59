/*
 * Shared internals: allocation, error detail, growable byte buffers and
 * checked arithmetic. Every module includes this; it includes nothing of
 * dcp's but the public header.
 */
#ifndef DCP_UTIL_H
#define DCP_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "dcp/dcp.h"

/* All internal allocation goes through these (one place for OOM tests). */
void *dcp__malloc(size_t n);
void *dcp__calloc(size_t n, size_t size);
void *dcp__realloc(void *p, size_t n);
/* align: a power of two, a multiple of sizeof(void *); freed by dcp__free. */
void *dcp__malloc_aligned(size_t align, size_t n);
void dcp__free(void *p);
char *dcp__strdup(const char *s);
char *dcp__strndup(const char *s, size_t n);

/*
 * Test hook: make the k-th allocation from now on fail (k >= 1), or never
 * (k = 0). Returns the number of allocations made since the last call.
 */
uint64_t dcp__alloc_fail_after(uint64_t k);
/* The same, but only the k-th allocation fails (a transient failure). */
uint64_t dcp__alloc_fail_once(uint64_t k);

/* Error detail carried by a context (or a stack variable in tests). */
#define DCP_ERRMSG_MAX 1024
struct dcp_err {
    int code;
    char msg[DCP_ERRMSG_MAX];
};

/*
 * Records code and a printf-style message in err (err may be NULL) and
 * returns code, so callers write: return dcp__err(err, DCP_EFORMAT, "...").
 * Messages follow git's style: lowercase, no full stop, subject quoted.
 */
int dcp__err(struct dcp_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int dcp__verr(struct dcp_err *err, int code, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));
/* Prepends "prefix: " to the message already in err; returns err->code. */
int dcp__err_prefix(struct dcp_err *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void dcp__err_clear(struct dcp_err *err);

/*
 * Asks the kernel to back the page-aligned interior of a block of at least
 * 4 MiB with transparent huge pages (Linux madvise MADV_HUGEPAGE; nothing
 * elsewhere, or for smaller blocks). Advice only: errors are ignored. The
 * coordinator's planning arrays at scale (hundreds of MiB, accessed out of
 * order) spend a third of their time in TLB misses without it.
 */
void dcp__advise_huge(void *p, size_t n);

/*
 * Makes room for need elements of elem bytes in the array *p of capacity
 * *cap (used of them in use, kept), at least doubling from first. Arrays
 * of 4 MiB and more move to fresh memory advised for huge pages before the
 * copy touches it (realloc would copy into small pages: the advice splits
 * the mapping, so the kernel cannot move it). DCP_OK or DCP_ENOMEM (*p
 * unchanged).
 */
int dcp__grow_huge(void **p, size_t *cap, size_t used, size_t need,
                   size_t elem, size_t first);

/* Growable byte buffer. Zero-initialise; free with dcp__buf_free. */
struct dcp_buf {
    uint8_t *p;
    size_t len;
    size_t cap;
};

int dcp__buf_reserve(struct dcp_buf *b, size_t extra); /* DCP_OK/ENOMEM */
int dcp__buf_put(struct dcp_buf *b, const void *p, size_t n);
int dcp__buf_put_u8(struct dcp_buf *b, uint8_t v);
int dcp__buf_put_le16(struct dcp_buf *b, uint16_t v);
int dcp__buf_put_le32(struct dcp_buf *b, uint32_t v);
int dcp__buf_put_le64(struct dcp_buf *b, uint64_t v);
int dcp__buf_fill(struct dcp_buf *b, uint8_t byte, size_t n);
int dcp__buf_printf(struct dcp_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void dcp__buf_free(struct dcp_buf *b);

/* Little-endian loads from unaligned memory. */
static inline uint16_t dcp__le16(const uint8_t *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}
static inline uint32_t dcp__le32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}
static inline uint64_t dcp__le64(const uint8_t *p)
{
    return (uint64_t)dcp__le32(p) | ((uint64_t)dcp__le32(p + 4) << 32);
}

/* Checked arithmetic: return nonzero on overflow. */
static inline int dcp__add_overflow_u64(uint64_t a, uint64_t b, uint64_t *r)
{
    return __builtin_add_overflow(a, b, r);
}
static inline int dcp__mul_overflow_u64(uint64_t a, uint64_t b, uint64_t *r)
{
    return __builtin_mul_overflow(a, b, r);
}
static inline int dcp__mul_overflow_i64(int64_t a, int64_t b, int64_t *r)
{
    return __builtin_mul_overflow(a, b, r);
}
static inline int dcp__add_overflow_i64(int64_t a, int64_t b, int64_t *r)
{
    return __builtin_add_overflow(a, b, r);
}

#define DCP_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* Returns from the calling function with call's result unless DCP_OK. */
#define DCP_RETURN_IF(call) \
    do {                    \
        int rc_ = (call);   \
        if (rc_ != DCP_OK)  \
            return rc_;     \
    } while (0)

/*
 * Element count of a shape or box (1 for ndim 0). dcp__box_numel is for
 * sizes already checked (boxes are when added: the product fits);
 * dcp__shape_numel checks them, for input that may be hostile: -1 when a
 * size is negative or the count exceeds INT64_MAX.
 */
static inline uint64_t dcp__box_numel(int ndim, const int64_t *size)
{
    uint64_t n = 1;
    int d;
    for (d = 0; d < ndim; d++)
        n *= (uint64_t)size[d];
    return n;
}
static inline int64_t dcp__shape_numel(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    int d;
    for (d = 0; d < ndim; d++)
        if (shape[d] < 0 || dcp__mul_overflow_i64(n, shape[d], &n))
            return -1;
    return n;
}

/* Whether two boxes of ndim dimensions (offsets and sizes) overlap: their
 * half-open intervals intersect in every dimension (ndim 0: always). A
 * box with a zero size may still count as overlapping one that spans its
 * offset: callers that care check the volume first. */
static inline int dcp__boxes_overlap(int ndim, const int64_t *aoff,
                                     const int64_t *asize,
                                     const int64_t *boff,
                                     const int64_t *bsize)
{
    int d;
    for (d = 0; d < ndim; d++)
        if (aoff[d] >= boff[d] + bsize[d] || boff[d] >= aoff[d] + asize[d])
            return 0;
    return 1;
}

/* Whether the n int64s at a and b are equal. */
static inline int dcp__same_ints(const int64_t *a, const int64_t *b, int n)
{
    int d;
    for (d = 0; d < n; d++)
        if (a[d] != b[d])
            return 0;
    return 1;
}

#endif /* DCP_UTIL_H */
