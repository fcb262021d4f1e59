/*
 * Fuzz target: the safetensors header parser (src/safetensors.c) and the
 * JSON parser under it. The input is a whole .safetensors file: an 8-byte
 * little-endian header length N, N bytes of JSON, the data buffer.
 *  1. dcp__sf_parse_header on the header the length prefix gives, as dcp__sf_read
 *     does; when the prefix does not fit the file, on the rest of the
 *     input as the header (so mutations of the JSON are not wasted on a
 *     wrong length).
 *  2. Properties of every header accepted: each tensor has a non-empty
 *     name without NUL, no name occurs twice, at most DCP_MAX_NDIM
 *     dimensions, end - begin = element count x element size, and the
 *     ranges tile the data buffer exactly (sorted, no gap, no overlap, up
 *     to the end of the file).
 *  3. Round trip: the tensors, in data order, and __metadata__ go through
 *     dcp__sf_header_build and parse again to the same names, dtypes, shapes,
 *     offsets and metadata. A violation aborts (a finding).
 */
#include <dcp/dcp.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "safetensors.h"
#include "util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int cmp_ptr_begin(const void *a, const void *b)
{
    const struct sf_tensor *x = *(const struct sf_tensor *const *)a;
    const struct sf_tensor *y = *(const struct sf_tensor *const *)b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return strcmp(x->name, y->name);
}

static int cmp_ptr_name(const void *a, const void *b)
{
    return strcmp((*(const struct sf_tensor *const *)a)->name,
                  (*(const struct sf_tensor *const *)b)->name);
}

/* Checks the properties of an accepted header; o receives the tensors in
 * data order. */
static void check(const struct sf_file *f, const struct sf_tensor **o)
{
    uint64_t pos = 0;
    size_t i;
    int d;
    if (f->data_off > f->file_size)
        abort();
    for (i = 0; i < f->n; i++) {
        const struct sf_tensor *t = &f->t[i];
        uint64_t numel = 1, nbytes;
        if (!t->name[0] || t->ndim < 0 || t->ndim > DCP_MAX_NDIM ||
            t->begin > t->end || dcp_dtype_size(t->dtype) == 0)
            abort();
        for (d = 0; d < t->ndim; d++)
            if (t->shape[d] < 0 ||
                dcp__mul_overflow_u64(numel, (uint64_t)t->shape[d], &numel))
                abort();
        if (dcp__mul_overflow_u64(numel, dcp_dtype_size(t->dtype), &nbytes) ||
            nbytes != t->end - t->begin)
            abort();
        o[i] = t;
    }
    qsort((void *)o, f->n, sizeof(*o), cmp_ptr_name);
    for (i = 1; i < f->n; i++)
        if (strcmp(o[i - 1]->name, o[i]->name) == 0)
            abort(); /* a duplicate name was accepted */
    qsort((void *)o, f->n, sizeof(*o), cmp_ptr_begin);
    for (i = 0; i < f->n; i++) {
        if (o[i]->begin != pos)
            abort(); /* gap or overlap */
        pos = o[i]->end;
    }
    if (pos != f->file_size - f->data_off)
        abort(); /* the data buffer is not covered exactly */
}

static void round_trip(const struct sf_file *f, const struct sf_tensor **o)
{
    struct sf_out *out = calloc(f->n + 1, sizeof(*out));
    struct dcp_buf b = {0};
    struct sf_file g;
    struct dcp_err err;
    uint64_t data_len = 0, n;
    size_t i;
    if (!out)
        return;
    for (i = 0; i < f->n; i++) {
        out[i].name = o[i]->name;
        out[i].dtype = o[i]->dtype;
        out[i].ndim = o[i]->ndim;
        out[i].shape = o[i]->shape;
    }
    if (dcp__sf_header_build(out, f->n, (const char *const *)f->meta, f->nmeta, &b,
                        &data_len) != DCP_OK) {
        free(out); /* out of memory only */
        dcp__buf_free(&b);
        return;
    }
    if (data_len != f->file_size - f->data_off || b.len < 8)
        abort();
    n = dcp__le64(b.p);
    if (n != b.len - 8)
        abort();
    if (dcp__sf_parse_header(b.p + 8, (size_t)n, b.len + data_len, &g, &err) !=
        DCP_OK)
        abort(); /* what dcp writes, dcp must read */
    if (g.n != f->n || g.nmeta != f->nmeta)
        abort();
    for (i = 0; i < g.n; i++) {
        const struct sf_tensor *x = o[i], *y = &g.t[i];
        if (strcmp(x->name, y->name) != 0 || x->dtype != y->dtype ||
            x->ndim != y->ndim || x->begin != y->begin || x->end != y->end ||
            memcmp(x->shape, y->shape, (size_t)x->ndim * sizeof(int64_t)) != 0)
            abort();
    }
    for (i = 0; i < 2 * g.nmeta; i++)
        if (strcmp(f->meta[i], g.meta[i]) != 0)
            abort();
    dcp__sf_release(&g);
    dcp__buf_free(&b);
    free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct sf_file f;
    struct dcp_err err;
    const struct sf_tensor **o;
    uint64_t n;
    if (size < 8)
        return 0;
    n = dcp__le64(data);
    if (n > size - 8 || n > SF_MAX_HEADER)
        n = size - 8; /* the header is the rest; no data */
    if (dcp__sf_parse_header(data + 8, (size_t)n, size, &f, &err) != DCP_OK)
        return 0;
    o = malloc((f.n + 1) * sizeof(*o));
    if (o) {
        check(&f, o);
        round_trip(&f, o);
        free((void *)o);
    }
    dcp__sf_release(&f);
    return 0;
}
