/*
 * dcp_load: a checkpoint into the caller's buffers, in place, on every rank.
 *
 * Rank 0 reads .metadata once and broadcasts its bytes; every rank decodes
 * them. Check first, then touch: each rank matches its requested keys
 * against the metadata (missing, kind, shape, dtype) and the ranks agree on
 * the outcome; then a checkpoint key counts as unexpected only when no rank
 * asked for it (an element-wise minimum over ranks of "not requested"
 * flags); every value is read and decoded before the first tensor byte
 * lands in a caller's buffer. Then each rank reads each stored chunk that
 * overlaps one of its boxes once and copies the overlap into every such box
 * (straight into the buffer when the chunk lands there whole and
 * contiguous). Every step ends in an agreement, so all ranks return the
 * same code and the failing rank's message.
 */
#include "load.h"

#include <inttypes.h>
#include <string.h>
#include <unistd.h>

#include "comm.h"
#include "cuda.h"
#include "dtype.h"
#include "meta.h"
#include "read.h"
#include "request.h"
#include "state.h"
#include "stateful.h"
#include "storage.h"

static int shape_repr(struct dcp_buf *b, int ndim, const int64_t *shape)
{
    int d, rc = dcp__buf_put_u8(b, '[');
    for (d = 0; rc == DCP_OK && d < ndim; d++)
        rc = dcp__buf_printf(b, d ? ",%" PRId64 : "%" PRId64, shape[d]);
    if (rc == DCP_OK)
        rc = dcp__buf_put_u8(b, ']');
    return rc == DCP_OK ? dcp__buf_put_u8(b, '\0') : rc;
}

static int check_entry(dcp_ctx *ctx, const struct st_entry *se,
                       const struct md_entry *e, unsigned flags)
{
    struct dcp_buf a = {0}, b = {0};
    int rc = DCP_OK;
    if (se->is_tensor != e->is_tensor)
        return dcp__err(&ctx->err, DCP_EMISMATCH,
                        "'%s': saved as a %s, requested as a %s", se->key,
                        e->is_tensor ? "tensor" : "value",
                        se->is_tensor ? "tensor" : "value");
    if (!se->is_tensor)
        return DCP_OK;
    if (se->ndim != e->ndim ||
        memcmp(se->shape, e->shape, (size_t)se->ndim * sizeof(int64_t))) {
        if (shape_repr(&a, e->ndim, e->shape) == DCP_OK &&
            shape_repr(&b, se->ndim, se->shape) == DCP_OK)
            rc = dcp__err(&ctx->err, DCP_EMISMATCH,
                          "'%s': shape mismatch: saved %s, requested %s",
                          se->key, (char *)a.p, (char *)b.p);
        else
            rc = dcp__err(&ctx->err, DCP_ENOMEM, "out of memory");
    } else if (se->dtype != e->dtype && !(flags & DCP_LOAD_CAST)) {
        rc = dcp__err(&ctx->err, DCP_EMISMATCH,
                      "'%s': dtype mismatch: saved %s, requested %s "
                      "(DCP_LOAD_CAST converts)",
                      se->key, dcp_dtype_name(e->dtype),
                      dcp_dtype_name(se->dtype));
    } else if (!dcp__can_convert(se->dtype, e->dtype)) {
        rc = dcp__err(&ctx->err, DCP_ENOTSUP,
                      "'%s': cannot cast saved %s to requested %s (torch "
                      "does not convert it either)",
                      se->key, dcp_dtype_name(e->dtype),
                      dcp_dtype_name(se->dtype));
    }
    /* Stored chunks with a gap would leave part of the caller's box
     * unwritten, overlapping ones make it depend on read order. */
    if (rc == DCP_OK)
        rc = dcp__meta_check_tiling(e, &ctx->err);
    dcp__buf_free(&a);
    dcp__buf_free(&b);
    return rc;
}

static int report_add(char ***list, size_t *n, const char *key)
{
    char **nl = dcp__realloc(*list, (*n + 1) * sizeof(**list));
    if (!nl)
        return DCP_ENOMEM;
    *list = nl;
    nl[*n] = dcp__strdup(key);
    if (!nl[*n])
        return DCP_ENOMEM;
    (*n)++;
    return DCP_OK;
}

/* Matches this rank's keys with the checkpoint's: kinds, shapes, dtypes;
 * missing keys go to ctx's report and fail a strict load. */
static int match_keys(dcp_ctx *ctx, const dcp_state *st,
                      const struct dcp_metadata *md, unsigned flags)
{
    size_t i;
    int rc = DCP_OK;
    for (i = 0; rc == DCP_OK && i < st->n; i++) {
        long ei = dcp__meta_find(md, st->e[i].key);
        if (ei < 0)
            rc = report_add(&ctx->missing, &ctx->nmissing, st->e[i].key);
        else
            rc = check_entry(ctx, &st->e[i], &md->e[ei], flags);
    }
    if (rc == DCP_ENOMEM)
        return dcp__err(&ctx->err, rc, "out of memory");
    if (rc != DCP_OK || (flags & DCP_LOAD_PARTIAL) || !ctx->nmissing)
        return rc;
    return dcp__err(&ctx->err, DCP_EKEY,
                    "missing key '%s' in checkpoint (%zu missing; "
                    "DCP_LOAD_PARTIAL allows it)",
                    ctx->missing[0], ctx->nmissing);
}

/* Checkpoint keys that no rank asked for: the same list on every rank,
 * failing a strict load everywhere. Collective. */
static int unexpected_keys(dcp_ctx *ctx, const dcp_state *st,
                           const struct dcp_metadata *md, unsigned flags)
{
    int64_t *nreq;
    size_t i;
    int rc = DCP_OK;
    nreq = dcp__malloc((md->n ? md->n : 1) * sizeof(*nreq));
    if (!nreq)
        rc = dcp__err(&ctx->err, DCP_ENOMEM, "out of memory");
    for (i = 0; rc == DCP_OK && i < md->n; i++)
        nreq[i] = dcp__state_find(st, md->e[i].key) ? 0 : 1;
    rc = dcp__comm_agree_err(ctx->comm, rc, &ctx->err);
    if (rc == DCP_OK && md->n)
        rc = dcp__comm_allreduce_min(ctx->comm, nreq, md->n, &ctx->err);
    for (i = 0; rc == DCP_OK && i < md->n; i++)
        if (nreq[i])
            rc = report_add(&ctx->unexpected, &ctx->nunexpected, md->e[i].key);
    if (rc == DCP_ENOMEM)
        rc = dcp__err(&ctx->err, rc, "out of memory");
    dcp__free(nreq);
    /* Identical lists everywhere; only an allocation failure can differ. */
    rc = dcp__comm_agree_err(ctx->comm, rc, &ctx->err);
    if (rc != DCP_OK || (flags & DCP_LOAD_PARTIAL) || !ctx->nunexpected)
        return rc;
    return dcp__err(&ctx->err, DCP_EKEY,
                    "unexpected key '%s' in checkpoint (%zu unexpected%s; "
                    "DCP_LOAD_PARTIAL allows it)",
                    ctx->unexpected[0], ctx->nunexpected,
                    ctx->size > 1 ? ", asked for by no rank" : "");
}

/* CUDA boxes are read into one host buffer, copied to the device after. */
static int cuda_bounce(const struct st_entry *se, uint8_t **host,
                       struct dcp_err *err)
{
    size_t i, total = 0, es = dcp_dtype_size(se->dtype);
    *host = NULL;
    if (se->mem != DCP_MEM_CUDA)
        return DCP_OK;
    for (i = 0; i < se->nboxes; i++)
        total += (size_t)dcp__box_numel(se->ndim, se->boxes[i].size) * es;
    *host = dcp__malloc(total);
    return *host ? DCP_OK
                 : dcp__err(err, DCP_ENOMEM,
                            "out of memory for '%s' (%zu bytes to copy to "
                            "the device)",
                            se->key, total);
}

static int cuda_upload(const struct st_entry *se, const uint8_t *host,
                       struct dcp_err *err)
{
    size_t i, off = 0, es = dcp_dtype_size(se->dtype);
    int rc = DCP_OK;
    for (i = 0; rc == DCP_OK && i < se->nboxes; i++) {
        size_t n = (size_t)dcp__box_numel(se->ndim, se->boxes[i].size) * es;
        if (n)
            rc = dcp__cuda_copy(se->boxes[i].buf, host + off, n, err);
        off += n;
    }
    return rc == DCP_OK ? DCP_OK
                        : dcp__err_prefix(err, "cannot load '%s'", se->key);
}

/*
 * Reads the chunks of e that overlap se's boxes: parsed now, their bytes
 * added to batch; with batch NULL, only prefetched. A CUDA tensor is read
 * at once (not batched) into one host buffer, then copied to the device.
 */
static int load_tensor(struct rd_files *f, const struct st_entry *se,
                       const struct md_entry *e, int verify,
                       struct io_rbatch *batch, struct dcp_err *err)
{
    struct rd_dest *dest;
    uint8_t *host = NULL, *mark;
    size_t i, hoff = 0, nwanted = 0;
    int rc = batch ? cuda_bounce(se, &host, err) : DCP_OK;
    if (rc != DCP_OK)
        return rc;
    dest = dcp__calloc(se->nboxes ? se->nboxes : 1, sizeof(*dest));
    mark = dcp__calloc(e->nchunks ? e->nchunks : 1, 1);
    if (!dest || !mark) {
        dcp__free(host);
        dcp__free(dest);
        dcp__free(mark);
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    }
    for (i = 0; i < se->nboxes; i++) {
        dest[i].off = se->boxes[i].off;
        dest[i].size = se->boxes[i].size;
        dest[i].buf = host ? host + hoff : se->boxes[i].buf;
        dest[i].dtype = se->dtype;
        hoff += (size_t)dcp__box_numel(se->ndim, se->boxes[i].size) *
                dcp_dtype_size(se->dtype);
        if (dcp__box_numel(e->ndim, se->boxes[i].size))
            nwanted += dcp__meta_overlapping(e, se->boxes[i].off,
                                             se->boxes[i].size, mark);
    }
    /* In chunk order: the order of the bytes in each file. */
    for (i = 0; rc == DCP_OK && nwanted && i < e->nchunks; i++) {
        if (!mark[i])
            continue;
        nwanted--;
        if (!batch)
            dcp__rd_prefetch(f, e, i);
        else if (host)
            rc = dcp__rd_chunk(f, e, i, dest, se->nboxes, verify, NULL, err);
        else
            rc = dcp__rd_chunk_plan(f, e, i, dest, se->nboxes, verify, batch,
                                    err);
    }
    if (rc == DCP_OK && host && batch)
        rc = cuda_upload(se, host, err);
    dcp__free(host);
    dcp__free(mark);
    dcp__free(dest);
    return rc;
}

static int load_all(dcp_ctx *ctx, dcp_state *st, struct rd_files *f,
                    const struct dcp_metadata *md, int verify)
{
    dcp_value **vals = dcp__calloc(st->n ? st->n : 1, sizeof(*vals));
    struct io_rbatch batch = {0};
    size_t i;
    int rc = DCP_OK;
    if (!vals)
        return dcp__err(&ctx->err, DCP_ENOMEM, "out of memory");
    /* Values are decoded before any buffer changes. */
    for (i = 0; rc == DCP_OK && i < st->n; i++) {
        long ei = dcp__meta_find(md, st->e[i].key);
        if (ei >= 0 && !st->e[i].is_tensor)
            rc = dcp__rd_value(f, &md->e[ei], verify, ctx->max_value_bytes,
                               &vals[i], &ctx->err);
    }
    /* Tensors: archives parsed, then their bytes read in one batch,
     * sorted by file and offset (ioengine.h). */
    dcp__ctx_io_clear(ctx, DCP_IO_LOAD);
    for (i = 0; rc == DCP_OK && i < st->n; i++) {
        long ei = dcp__meta_find(md, st->e[i].key);
        if (ei >= 0 && st->e[i].is_tensor)
            rc = load_tensor(f, &st->e[i], &md->e[ei], verify, NULL, &ctx->err);
    }
    if (rc == DCP_OK)
        rc = dcp__io_rbatch_init(&batch, f->dirfd, md->nfiles, &ctx->err);
    for (i = 0; rc == DCP_OK && i < st->n; i++) {
        long ei = dcp__meta_find(md, st->e[i].key);
        if (ei >= 0 && st->e[i].is_tensor)
            rc = load_tensor(f, &st->e[i], &md->e[ei], verify, &batch,
                             &ctx->err);
    }
    if (rc == DCP_OK && batch.nparts) {
        struct io_eng *e = NULL;
        rc = dcp__ctx_io_begin(ctx, &e);
        if (rc == DCP_OK)
            rc = dcp__io_rbatch_run(&batch, e, &ctx->err);
        dcp__ctx_io_end(ctx, DCP_IO_LOAD);
    }
    dcp__io_rbatch_release(&batch);
    for (i = 0; i < st->n; i++) {
        if (!vals[i])
            continue;
        if (rc == DCP_OK) {
            dcp_value_free(st->e[i].value);
            st->e[i].value = vals[i];
        } else {
            dcp_value_free(vals[i]);
        }
    }
    dcp__free(vals);
    return rc;
}

/* Rank 0: the bytes of path/.metadata. */
static int read_metadata_bytes(dcp_ctx *ctx, const char *path, uint8_t **p,
                               size_t *len)
{
    int dirfd = -1;
    int rc = dcp__fs_open_dir(path, &dirfd, &ctx->err);
    if (rc != DCP_OK)
        return rc;
    rc = dcp__fs_read_all(dirfd, ".metadata", ctx->max_metadata_bytes, p, len,
                          &ctx->err);
    dcp__fs_release(dirfd);
    if (rc == DCP_ENOENT)
        return dcp__err(&ctx->err, DCP_ENOENT,
                        "no checkpoint in '%s': .metadata not found (an "
                        "interrupted save leaves none)",
                        path);
    if (rc != DCP_OK)
        return dcp__err_prefix(&ctx->err, "'%s'", path);
    return DCP_OK;
}

int dcp__load_state(dcp_ctx *ctx, dcp_state *st, const char *path,
                    const dcp_load_options *opts)
{
    struct dcp_metadata *md = NULL;
    struct rd_files f;
    uint8_t *bytes = NULL, *got = NULL;
    size_t len = 0, gotlen = 0;
    unsigned flags = 0;
    int rc = DCP_OK;
    if (!ctx)
        return DCP_EINVAL;
    dcp__ctx_begin(ctx);
    dcp__ctx_clear_report(ctx);
    if (!st || !path)
        rc = dcp__err(&ctx->err, DCP_EINVAL, "load: state and path needed");
    if (opts && opts->struct_size >= sizeof(dcp_load_options))
        flags = opts->flags;
    rc = dcp__comm_agree_err(ctx->comm, rc, &ctx->err);
    if (rc == DCP_OK)
        rc = dcp__comm_same_string(ctx->comm, path, "checkpoint path",
                                   &ctx->err);
    if (rc == DCP_OK && ctx->rank == 0)
        rc = read_metadata_bytes(ctx, path, &bytes, &len);
    rc = dcp__comm_agree_err(ctx->comm, rc, &ctx->err);
    if (rc == DCP_OK)
        rc = dcp__comm_bcast_blob(ctx->comm, bytes, len, 0, &got, &gotlen,
                                  &ctx->err);
    if (rc != DCP_OK)
        goto out;
    rc =
        dcp__meta_decode(got ? got : bytes, got ? gotlen : len, &md, &ctx->err);
    if (rc != DCP_OK)
        (void)dcp__err_prefix(&ctx->err, "'%s/.metadata'", path);
    dcp__free(bytes);
    dcp__free(got);
    bytes = got = NULL;
    if (rc == DCP_OK)
        rc = match_keys(ctx, st, md, flags);
    rc = dcp__comm_agree_err(ctx->comm, rc, &ctx->err);
    if (rc == DCP_OK)
        rc = unexpected_keys(ctx, st, md, flags);
    if (rc != DCP_OK)
        goto out;
    rc = dcp__rd_open(&f, path, md, &ctx->err);
    if (rc == DCP_OK) {
        rc = load_all(ctx, st, &f, md, !(flags & DCP_LOAD_NO_VERIFY));
        dcp__rd_close(&f);
    }
    rc = dcp__comm_agree_err(ctx->comm, rc, &ctx->err);
out:
    dcp__free(bytes);
    dcp__free(got);
    dcp__meta_free(md);
    return rc;
}

int dcp_load(dcp_ctx *ctx, dcp_state *st, const char *path,
             const dcp_load_options *opts)
{
    struct st_expansion ex;
    int rc;
    if (!ctx)
        return DCP_EINVAL;
    dcp__async_settle(ctx);
    dcp__ctx_begin(ctx);
    rc = dcp__state_expand_io(st, &ex, &ctx->err);
    rc = dcp__comm_agree_err(ctx->comm, rc, &ctx->err);
    if (rc == DCP_OK) {
        rc = dcp__load_state(ctx, ex.x ? ex.x : st, path, opts);
        if (rc == DCP_OK) {
            rc = dcp__state_expand_loaded(&ex, st, &ctx->err);
            rc = dcp__comm_agree_err(ctx->comm, rc, &ctx->err);
        }
    }
    dcp__state_expand_release(&ex);
    return rc;
}
