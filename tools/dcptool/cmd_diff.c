/*
 * dcptool diff DIR1 DIR2 [--rtol R] [--atol A] [--max-lines N]: compares
 * two checkpoints entry by entry: keys present in one only, kinds, dtypes,
 * global shapes, tensor elements (bit-exact by default; with a tolerance,
 * |a - b| <= atol + rtol * |b| after conversion to float64, NaN equal to
 * NaN) and values. Tensors are read chunk by chunk of DIR1 (a box that is
 * a stored chunk is read once, straight into the buffer), in pieces of at
 * most 256 MiB a side.
 * Exit status as diff(1): 0 identical, 1 different, 2 trouble (an error
 * reading either checkpoint, bad usage).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <dcp/dcp_convert.h>

#include "dcptool.h"

#define CHUNK_BYTES ((size_t)256 << 20)

static const char usage_text[] =
    "diff DIR1 DIR2 [--rtol R] [--atol A] [--max-lines N]";

struct diff {
    dcp_ctx *ctx;
    dcp_metadata *a, *b;
    const char *da, *db;
    char only_a[512], only_b[512];
    double rtol, atol;
    long max_lines, lines;
    long ndiff;
    void *ba, *bb;   /* the box of each side */
    double *fa, *fb; /* as float64 */
    size_t cap;      /* elements the four buffers hold */
    int tty;         /* stderr is a terminal: progress shown there */
    int shown;       /* a progress line is on the terminal */
};

/* "diff: N of M entries" on stderr, rewritten in place; only when stderr
 * is a terminal (never in tests' output). */
static void progress(struct diff *d, size_t done, size_t total)
{
    if (!d->tty)
        return;
    fflush(stdout);
    fprintf(stderr, "\rdiff: %zu of %zu entries", done, total);
    fflush(stderr);
    d->shown = 1;
}

/* Clears the progress line before other output. */
static void progress_clear(struct diff *d)
{
    if (!d->shown)
        return;
    fputs("\r\033[K", stderr);
    fflush(stderr);
    d->shown = 0;
}

/* One line: "WHAT: KEY" or "WHAT: KEY: DETAIL". */
static void report(struct diff *d, const char *what, const char *key,
                   const char *detail)
{
    d->ndiff++;
    if (d->max_lines >= 0 && d->lines >= d->max_lines)
        return;
    d->lines++;
    progress_clear(d);
    printf("%s: ", what);
    tool_text(stdout, key);
    printf("%s%s\n", detail ? ": " : "", detail ? detail : "");
}

static int is_float(dcp_dtype dt)
{
    return dt == DCP_F64 || dt == DCP_F32 || dt == DCP_F16 || dt == DCP_BF16 ||
           dt == DCP_F8_E4M3FN || dt == DCP_F8_E5M2 ||
           dt == DCP_F8_E4M3FNUZ || dt == DCP_F8_E5M2FNUZ ||
           dt == DCP_F8_E8M0FNU;
}

/* Whether elements are compared as numbers (with a tolerance): not the
 * complex dtypes (one double cannot hold them) nor float4 (bytes only). */
static int is_real(dcp_dtype dt)
{
    return dt != DCP_C32 && dt != DCP_C64 && dt != DCP_C128 &&
           dt != DCP_F4_E2M1FN_X2;
}

/* Grows the four comparison buffers to n elements (of any dtype: the
 * element buffers are sized for 16-byte elements). */
static int reserve(struct diff *d, size_t n)
{
    void *p;
    if (n <= d->cap)
        return DCP_OK;
    p = realloc(d->ba, n * 16);
    if (p)
        d->ba = p;
    p = p ? realloc(d->bb, n * 16) : NULL;
    if (p)
        d->bb = p;
    p = p ? realloc(d->fa, n * sizeof(double)) : NULL;
    if (p)
        d->fa = p;
    p = p ? realloc(d->fb, n * sizeof(double)) : NULL;
    if (p)
        d->fb = p;
    if (!p)
        return DCP_ENOMEM;
    d->cap = n;
    return DCP_OK;
}

/* Per-tensor tally of the differing elements. */
struct tally {
    uint64_t count;
    uint64_t first; /* smallest C-order index of a difference */
    double maxabs;
};

/* Compares the box (off, size) of both tensors, already read into ba/bb
 * (n elements). */
static void compare(struct diff *d, const dcp_entry_info *e, const int64_t *off,
                    const int64_t *size, size_t n, struct tally *t)
{
    size_t es = dcp_dtype_size(e->dtype), i;
    const unsigned char *x = d->ba, *y = d->bb;
    int tol = (d->rtol > 0 || d->atol > 0) && is_real(e->dtype);
    int fl = is_float(e->dtype);
    if (memcmp(x, y, n * es) == 0)
        return;
    if (tol || fl) {
        (void)dcp_convert_elements(d->fa, DCP_F64, x, e->dtype, n);
        (void)dcp_convert_elements(d->fb, DCP_F64, y, e->dtype, n);
    }
    for (i = 0; i < n; i++) {
        uint64_t rem = i, lin = 0;
        int64_t idx[DCP_MAX_NDIM];
        int same, k;
        if (tol) {
            double p = d->fa[i], q = d->fb[i];
            same = (isnan(p) && isnan(q)) || p == q ||
                   fabs(p - q) <= d->atol + d->rtol * fabs(q);
        } else {
            same = memcmp(x + i * es, y + i * es, es) == 0;
        }
        if (same)
            continue;
        for (k = e->ndim - 1; k >= 0; k--) {
            idx[k] = (int64_t)(rem % (uint64_t)size[k]);
            rem /= (uint64_t)size[k];
        }
        for (k = 0; k < e->ndim; k++)
            lin = lin * (uint64_t)e->shape[k] + (uint64_t)(off[k] + idx[k]);
        if (t->count == 0 || lin < t->first)
            t->first = lin;
        t->count++;
        if (tol || fl) {
            double diff = fabs(d->fa[i] - d->fb[i]);
            if (!(diff <= t->maxabs))
                t->maxabs = diff;
        }
    }
}

static void index_text(char *buf, size_t cap, uint64_t lin, int ndim,
                       const int64_t *shape)
{
    int64_t idx[DCP_MAX_NDIM];
    int k;
    for (k = ndim - 1; k >= 0; k--) {
        idx[k] = shape[k] ? (int64_t)(lin % (uint64_t)shape[k]) : 0;
        lin = shape[k] ? lin / (uint64_t)shape[k] : 0;
    }
    (void)dcp_shape_format(buf, cap, ndim, idx);
}

/* Reads and compares the box (off, size), in pieces of at most
 * CHUNK_BYTES that span the box after a split dimension. */
static int diff_box(struct diff *d, size_t ia, size_t ib,
                    const dcp_entry_info *e, const int64_t *boff,
                    const int64_t *bsize, struct tally *t)
{
    size_t es = dcp_dtype_size(e->dtype), cap = CHUNK_BYTES / es;
    int64_t off[DCP_MAX_NDIM] = {0}, size[DCP_MAX_NDIM], row = 1, m;
    int k, j, nd = e->ndim, rc;
    for (j = 0; j < nd; j++)
        if (bsize[j] == 0)
            return DCP_OK;
    for (k = 0; k < nd; k++) {
        row = 1;
        for (j = k + 1; j < nd; j++)
            row *= bsize[j];
        if ((uint64_t)row <= cap)
            break;
    }
    m = nd ? (int64_t)(cap / (uint64_t)row) : 1;
    if (nd && m > bsize[k])
        m = bsize[k];
    for (j = 0; j < nd; j++)
        size[j] = j < k ? 1 : bsize[j];
    for (;;) {
        int64_t goff[DCP_MAX_NDIM];
        uint64_t n = 1;
        if (nd)
            size[k] = bsize[k] - off[k] < m ? bsize[k] - off[k] : m;
        for (j = 0; j < nd; j++) {
            n *= (uint64_t)size[j];
            goff[j] = boff[j] + off[j];
        }
        if (reserve(d, (size_t)n) != DCP_OK)
            return DCP_ENOMEM;
        rc = dcp_metadata_read_box(d->ctx, d->a, ia, goff, size, d->ba,
                                   (size_t)n * es, 1);
        if (rc == DCP_OK)
            rc = dcp_metadata_read_box(d->ctx, d->b, ib, goff, size, d->bb,
                                       (size_t)n * es, 1);
        if (rc != DCP_OK)
            return rc;
        compare(d, e, goff, size, (size_t)n, t);
        if (!nd)
            return DCP_OK;
        off[k] += size[k];
        if (off[k] < bsize[k])
            continue;
        off[k] = 0;
        for (j = k - 1; j >= 0; j--) {
            if (++off[j] < bsize[j])
                break;
            off[j] = 0;
        }
        if (j < 0)
            return DCP_OK;
    }
}

/* Compares a tensor chunk by chunk of the first checkpoint: reading a box
 * that is exactly a stored chunk reads it once, straight into the buffer
 * (a chunk larger than CHUNK_BYTES is compared in pieces). */
static int diff_tensor(struct diff *d, size_t ia, size_t ib,
                       const dcp_entry_info *e)
{
    struct tally t = {0, 0, 0};
    uint64_t numel = 1;
    size_t c;
    int k, rc = DCP_OK;
    for (k = 0; k < e->ndim; k++)
        numel *= (uint64_t)e->shape[k];
    for (c = 0; rc == DCP_OK && c < e->nchunks; c++) {
        dcp_chunk_info ci;
        rc = dcp_metadata_chunk(d->a, ia, c, &ci);
        if (rc == DCP_OK)
            rc = diff_box(d, ia, ib, e, ci.offsets, ci.sizes, &t);
    }
    if (rc == DCP_OK && t.count) {
        char idx[256], detail[512];
        index_text(idx, sizeof(idx), t.first, e->ndim, e->shape);
        if (is_float(e->dtype) ||
            ((d->rtol > 0 || d->atol > 0) && is_real(e->dtype)))
            (void)snprintf(detail, sizeof(detail),
                           "%llu of %llu elements (first at %s, largest "
                           "difference %g)",
                           (unsigned long long)t.count,
                           (unsigned long long)numel, idx, t.maxabs);
        else
            (void)snprintf(
                detail, sizeof(detail), "%llu of %llu elements (first at %s)",
                (unsigned long long)t.count, (unsigned long long)numel, idx);
        report(d, "values differ", e->key, detail);
    }
    return rc;
}

static int diff_entry(struct diff *d, size_t ia, size_t ib)
{
    dcp_entry_info x, y;
    char sx[256], sy[256], detail[600];
    (void)dcp_metadata_entry(d->a, ia, &x);
    (void)dcp_metadata_entry(d->b, ib, &y);
    if (x.is_tensor != y.is_tensor) {
        report(d, "kind differs", x.key,
               x.is_tensor ? "tensor vs value" : "value vs tensor");
        return DCP_OK;
    }
    if (!x.is_tensor) {
        dcp_value *va = NULL, *vb = NULL;
        int rc = dcp_metadata_read_value(d->ctx, d->a, ia, &va);
        if (rc == DCP_OK)
            rc = dcp_metadata_read_value(d->ctx, d->b, ib, &vb);
        if (rc == DCP_OK && !dcp_value_equal(va, vb))
            report(d, "value differs", x.key, NULL);
        dcp_value_free(va);
        dcp_value_free(vb);
        return rc;
    }
    if (x.dtype != y.dtype) {
        (void)snprintf(detail, sizeof(detail), "%s vs %s",
                       dcp_dtype_name(x.dtype), dcp_dtype_name(y.dtype));
        report(d, "dtype differs", x.key, detail);
        return DCP_OK;
    }
    (void)dcp_shape_format(sx, sizeof(sx), x.ndim, x.shape);
    (void)dcp_shape_format(sy, sizeof(sy), y.ndim, y.shape);
    if (strcmp(sx, sy) != 0) {
        (void)snprintf(detail, sizeof(detail), "%s vs %s", sx, sy);
        report(d, "shape differs", x.key, detail);
        return DCP_OK;
    }
    return diff_tensor(d, ia, ib, &x);
}

static int run(struct diff *d)
{
    size_t na = dcp_metadata_count(d->a), nb = dcp_metadata_count(d->b);
    size_t i = 0, j = 0;
    int rc = DCP_OK;
    while (rc == DCP_OK && (i < na || j < nb)) {
        dcp_entry_info x, y;
        int c;
        if (i < na)
            (void)dcp_metadata_entry(d->a, i, &x);
        if (j < nb)
            (void)dcp_metadata_entry(d->b, j, &y);
        c = i >= na ? 1 : j >= nb ? -1 : strcmp(x.key, y.key);
        progress(d, i, na);
        if (c < 0) {
            report(d, d->only_a, x.key, NULL);
            i++;
        } else if (c > 0) {
            report(d, d->only_b, y.key, NULL);
            j++;
        } else {
            rc = diff_entry(d, i++, j++);
        }
    }
    return rc;
}

static int parse_double(const char *s, double *out)
{
    char *end;
    *out = strtod(s, &end);
    return end != s && !*end && *out >= 0 ? 0 : -1;
}

int cmd_diff(int argc, char **argv)
{
    struct diff d;
    const char *pos[2];
    int i, npos = 0, rc;
    memset(&d, 0, sizeof(d));
    d.max_lines = -1;
    for (i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(argv[i], "--rtol") == 0 && v) {
            if (parse_double(v, &d.rtol))
                return tool_usage(usage_text);
            i++;
        } else if (strcmp(argv[i], "--atol") == 0 && v) {
            if (parse_double(v, &d.atol))
                return tool_usage(usage_text);
            i++;
        } else if (strcmp(argv[i], "--max-lines") == 0 && v) {
            d.max_lines = atol(v);
            i++;
        } else if (argv[i][0] == '-' || npos == 2) {
            return tool_usage(usage_text);
        } else {
            pos[npos++] = argv[i];
        }
    }
    if (npos != 2)
        return tool_usage(usage_text);
    d.da = pos[0];
    d.db = pos[1];
    (void)snprintf(d.only_a, sizeof(d.only_a), "only in %s", d.da);
    (void)snprintf(d.only_b, sizeof(d.only_b), "only in %s", d.db);
    if (tool_open(d.da, &d.ctx, &d.a))
        return 2;
    rc = dcp_metadata_open(d.ctx, d.db, &d.b);
    d.tty = isatty(STDERR_FILENO);
    if (rc == DCP_OK)
        rc = run(&d);
    progress_clear(&d);
    if (rc != DCP_OK)
        tool_fail(d.ctx, rc);
    else if (d.ndiff)
        printf("%ld difference%s\n", d.ndiff, d.ndiff == 1 ? "" : "s");
    free(d.ba);
    free(d.bb);
    free(d.fa);
    free(d.fb);
    dcp_metadata_free(d.a);
    dcp_metadata_free(d.b);
    dcp_ctx_free(d.ctx);
    return rc != DCP_OK ? 2 : d.ndiff ? 1 : 0;
}
