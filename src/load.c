/*
 * dcp_load: a checkpoint into the caller's buffers, in place.
 *
 * Check first, then touch: every requested key is matched against the
 * metadata (missing, unexpected, kind, shape, dtype) and every value is read
 * and decoded before the first tensor byte lands in a caller's buffer. Then
 * each stored chunk that overlaps a requested box is read once and its
 * overlap copied into every such box (straight into the buffer when the
 * chunk lands there whole and contiguous).
 */
#include "ctx.h"

#include <inttypes.h>
#include <string.h>
#include <unistd.h>

#include "meta.h"
#include "read.h"
#include "state.h"
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
    }
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

/* Matches the state's keys with the checkpoint's, filling ctx's report. */
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
    for (i = 0; rc == DCP_OK && i < md->n; i++)
        if (!dcp__state_find(st, md->e[i].key))
            rc = report_add(&ctx->unexpected, &ctx->nunexpected,
                            md->e[i].key);
    if (rc == DCP_ENOMEM)
        return dcp__err(&ctx->err, rc, "out of memory");
    if (rc != DCP_OK || (flags & DCP_LOAD_PARTIAL))
        return rc;
    if (ctx->nmissing)
        return dcp__err(&ctx->err, DCP_EKEY,
                        "missing key '%s' in checkpoint (%zu missing, %zu "
                        "unexpected; DCP_LOAD_PARTIAL allows it)",
                        ctx->missing[0], ctx->nmissing, ctx->nunexpected);
    if (ctx->nunexpected)
        return dcp__err(&ctx->err, DCP_EKEY,
                        "unexpected key '%s' in checkpoint (%zu unexpected; "
                        "DCP_LOAD_PARTIAL allows it)",
                        ctx->unexpected[0], ctx->nunexpected);
    return DCP_OK;
}

static int load_tensor(struct rd_files *f, const struct st_entry *se,
                       const struct md_entry *e, int verify,
                       struct dcp_err *err)
{
    struct rd_dest *dest;
    int64_t io[DCP_MAX_NDIM], is[DCP_MAX_NDIM];
    size_t i, j;
    int rc = DCP_OK;
    dest = dcp__calloc(se->nboxes ? se->nboxes : 1, sizeof(*dest));
    if (!dest)
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    for (i = 0; i < se->nboxes; i++) {
        dest[i].off = se->boxes[i].off;
        dest[i].size = se->boxes[i].size;
        dest[i].buf = se->boxes[i].buf;
        dest[i].dtype = se->dtype;
    }
    for (i = 0; rc == DCP_OK && i < e->nchunks; i++) {
        const struct md_chunk *c = &e->chunks[i];
        int wanted = 0;
        for (j = 0; !wanted && j < se->nboxes; j++)
            wanted = dcp__box_numel(e->ndim, se->boxes[j].size) &&
                     dcp__box_intersect(e->ndim, c->off, c->size,
                                        dest[j].off, dest[j].size, io, is);
        if (wanted)
            rc = dcp__rd_chunk(f, e, i, dest, se->nboxes, verify, NULL, err);
    }
    dcp__free(dest);
    return rc;
}

static int load_all(dcp_ctx *ctx, dcp_state *st, struct rd_files *f,
                    const struct dcp_metadata *md, int verify)
{
    dcp_value **vals = dcp__calloc(st->n ? st->n : 1, sizeof(*vals));
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
    for (i = 0; rc == DCP_OK && i < st->n; i++) {
        long ei = dcp__meta_find(md, st->e[i].key);
        if (ei >= 0 && st->e[i].is_tensor)
            rc = load_tensor(f, &st->e[i], &md->e[ei], verify, &ctx->err);
    }
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

int dcp_load(dcp_ctx *ctx, dcp_state *st, const char *path,
             const dcp_load_options *opts)
{
    struct dcp_metadata *md = NULL;
    struct rd_files f;
    unsigned flags = 0;
    int dirfd = -1, rc, bad = -1;
    if (!ctx)
        return DCP_EINVAL;
    dcp__ctx_begin(ctx);
    dcp__ctx_clear_report(ctx);
    if (!st || !path)
        return dcp__err(&ctx->err, DCP_EINVAL, "load: state and path needed");
    if (opts && opts->struct_size >= sizeof(dcp_load_options))
        flags = opts->flags;
    if (ctx->size != 1)
        return dcp__err(&ctx->err, DCP_ENOTSUP,
                        "load: several ranks need the MPI communicator");
    rc = dcp__fs_open_dir(path, &dirfd, &ctx->err);
    if (rc == DCP_OK) {
        rc = dcp__rd_metadata(dirfd, path, ctx->max_metadata_bytes, &md,
                              &ctx->err);
        (void)close(dirfd);
    }
    if (rc == DCP_OK)
        rc = match_keys(ctx, st, md, flags);
    if (rc == DCP_OK)
        rc = dcp__rd_open(&f, path, md, &ctx->err);
    if (rc == DCP_OK) {
        rc = load_all(ctx, st, &f, md, !(flags & DCP_LOAD_NO_VERIFY));
        dcp__rd_close(&f);
    }
    rc = dcp__comm_agree(ctx->comm, rc, &bad);
    dcp__meta_free(md);
    return rc;
}
