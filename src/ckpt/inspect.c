/*
 * Inspection without a communicator: the metadata API, reading one box or
 * one value, and dcp_verify (a complete check of a checkpoint).
 */
#include "ctx.h"

#include <inttypes.h>
#include <string.h>
#include <unistd.h>

#include "meta.h"
#include "read.h"
#include "storage.h"
#include "unflat.h"

int dcp_metadata_open(dcp_ctx *ctx, const char *path, dcp_metadata **out)
{
    int dirfd = -1, rc;
    if (!ctx || !out)
        return DCP_EINVAL;
    *out = NULL;
    dcp__ctx_begin(ctx);
    if (!path)
        return dcp__err(&ctx->err, DCP_EINVAL, "no path");
    rc = dcp__fs_open_dir(path, &dirfd, &ctx->err);
    if (rc != DCP_OK)
        return rc;
    rc = dcp__rd_metadata(dirfd, path, ctx->max_metadata_bytes, out,
                          &ctx->err);
    dcp__fs_release(dirfd);
    /* Values holding tensors (flatten_state_dict=False) become their
     * leaves (unflat.h). */
    if (rc == DCP_OK && (rc = dcp__uf_expand(path, *out, &ctx->err)) !=
                            DCP_OK) {
        dcp__meta_free(*out);
        *out = NULL;
        return rc;
    }
    if (rc == DCP_OK && !((*out)->dir = dcp__strdup(path))) {
        dcp__meta_free(*out);
        *out = NULL;
        rc = dcp__err(&ctx->err, DCP_ENOMEM, "out of memory");
    }
    return rc;
}

void dcp_metadata_free(dcp_metadata *md)
{
    dcp__meta_free(md);
}

size_t dcp_metadata_count(const dcp_metadata *md)
{
    return md ? md->n : 0;
}

long dcp_metadata_find(const dcp_metadata *md, const char *key)
{
    return md && key ? dcp__meta_find(md, key) : -1;
}

const char *dcp_metadata_version(const dcp_metadata *md)
{
    return md && md->version ? md->version : "";
}

int dcp_metadata_entry(const dcp_metadata *md, size_t index,
                       dcp_entry_info *out)
{
    const struct md_entry *e;
    size_t i;
    if (!md || !out || index >= md->n)
        return DCP_EINVAL;
    e = &md->e[index];
    memset(out, 0, sizeof(*out));
    out->key = e->key;
    out->is_tensor = e->is_tensor;
    out->dtype = e->dtype;
    out->ndim = e->ndim;
    out->shape = e->shape;
    out->nchunks = e->nchunks;
    out->npath = e->npath;
    if (e->is_tensor)
        out->nbytes = dcp__box_numel(e->ndim, e->shape) *
                      dcp_dtype_size(e->dtype);
    else
        for (i = 0; i < e->nchunks; i++)
            out->nbytes += e->chunks[i].length;
    return DCP_OK;
}

size_t dcp_metadata_unsupported_count(const dcp_metadata *md)
{
    return md ? md->nunsup : 0;
}

int dcp_metadata_unsupported(const dcp_metadata *md, size_t index,
                             dcp_entry_info *out, const char **dtype_name)
{
    const struct md_entry *e;
    if (!md || !out || index >= md->nunsup)
        return DCP_EINVAL;
    e = &md->unsup[index];
    memset(out, 0, sizeof(*out));
    out->key = e->key;
    out->is_tensor = 1;
    out->ndim = e->ndim;
    out->shape = e->shape;
    out->nchunks = e->nchunks;
    out->npath = e->npath;
    if (dtype_name)
        *dtype_name = e->unsup;
    return DCP_OK;
}

int dcp_metadata_check_key(dcp_ctx *ctx, const dcp_metadata *md,
                           const char *key)
{
    if (!ctx)
        return DCP_EINVAL;
    dcp__ctx_begin(ctx);
    if (!md || !key)
        return dcp__err(&ctx->err, DCP_EINVAL,
                        "dcp_metadata_check_key: NULL argument");
    if (dcp__meta_find(md, key) >= 0)
        return DCP_OK;
    DCP_RETURN_IF(dcp__meta_unsup_err(md, key, &ctx->err));
    return dcp__err(&ctx->err, DCP_EKEY, "no key '%s' in the checkpoint",
                    key);
}

int dcp_metadata_chunk(const dcp_metadata *md, size_t index, size_t chunk,
                       dcp_chunk_info *out)
{
    const struct md_chunk *c;
    if (!md || !out || index >= md->n || chunk >= md->e[index].nchunks)
        return DCP_EINVAL;
    c = &md->e[index].chunks[chunk];
    out->offsets = c->off;
    out->sizes = c->size;
    out->file = c->file < md->nfiles ? md->files[c->file] : "";
    out->offset = c->offset;
    out->length = c->length;
    return DCP_OK;
}

int dcp_metadata_path(const dcp_metadata *md, size_t index, size_t i,
                      const char **str, int64_t *num)
{
    const struct md_entry *e;
    if (!md || index >= md->n || i >= md->e[index].npath)
        return DCP_EINVAL;
    e = &md->e[index];
    if (str)
        *str = e->path[i].s;
    if (num)
        *num = e->path[i].s ? 0 : e->path[i].i;
    return DCP_OK;
}

int dcp_metadata_read_box(dcp_ctx *ctx, const dcp_metadata *md, size_t index,
                          const int64_t *offsets, const int64_t *sizes,
                          void *buf, size_t len, int verify)
{
    int64_t off[DCP_MAX_NDIM] = {0}, size[DCP_MAX_NDIM] = {0};
    int64_t io[DCP_MAX_NDIM], is[DCP_MAX_NDIM];
    const struct md_entry *e;
    struct rd_dest dest;
    struct rd_files f;
    uint64_t want;
    size_t i;
    int d, rc;
    if (!ctx)
        return DCP_EINVAL;
    dcp__ctx_begin(ctx);
    if (!md || index >= md->n || !md->e[index].is_tensor || !md->dir)
        return dcp__err(&ctx->err, DCP_EINVAL, "not a tensor entry");
    e = &md->e[index];
    for (d = 0; d < e->ndim; d++) {
        off[d] = offsets ? offsets[d] : 0;
        size[d] = sizes ? sizes[d] : e->shape[d];
        if (off[d] < 0 || size[d] < 0 || off[d] > e->shape[d] ||
            size[d] > e->shape[d] - off[d])
            return dcp__err(&ctx->err, DCP_EINVAL,
                            "'%s': box outside the shape in dimension %d",
                            e->key, d);
    }
    want = dcp__box_numel(e->ndim, size) * dcp_dtype_size(e->dtype);
    if (want != len || (!buf && len))
        return dcp__err(&ctx->err, DCP_EINVAL,
                        "'%s': the box holds %" PRIu64 " bytes, buffer has "
                        "%zu",
                        e->key, want, len);
    if (want == 0)
        return DCP_OK;
    /* A gap in the stored chunks would leave part of buf unwritten. */
    rc = dcp__meta_check_tiling(e, &ctx->err);
    if (rc != DCP_OK)
        return rc;
    dest.off = off;
    dest.size = size;
    dest.buf = buf;
    dest.stride = NULL;
    dest.dtype = e->dtype;
    rc = dcp__rd_open(&f, md->dir, md, &ctx->err);
    if (rc != DCP_OK)
        return rc;
    for (i = 0; rc == DCP_OK && i < e->nchunks; i++)
        if (dcp__box_intersect(e->ndim, e->chunks[i].off, e->chunks[i].size,
                               off, size, io, is))
            rc = dcp__rd_chunk(&f, e, i, &dest, 1, verify, NULL, &ctx->err);
    dcp__rd_close(&f);
    return rc;
}

int dcp_metadata_read_value(dcp_ctx *ctx, const dcp_metadata *md,
                            size_t index, dcp_value **out)
{
    struct rd_files f;
    int rc;
    if (!ctx || !out)
        return DCP_EINVAL;
    *out = NULL;
    dcp__ctx_begin(ctx);
    if (!md || index >= md->n || md->e[index].is_tensor || !md->dir)
        return dcp__err(&ctx->err, DCP_EINVAL, "not a value entry");
    rc = dcp__rd_open(&f, md->dir, md, &ctx->err);
    if (rc != DCP_OK)
        return rc;
    rc = dcp__rd_value(&f, &md->e[index], 1, ctx->max_value_bytes, out,
                       &ctx->err);
    dcp__rd_close(&f);
    return rc;
}

int dcp_verify(dcp_ctx *ctx, const char *path)
{
    dcp_metadata *md = NULL;
    struct rd_files f;
    struct dcp__phrec ph; /* events only: the load report stays */
    uint64_t done = 0;
    size_t i, j;
    double t;
    int rc;
    if (!ctx)
        return DCP_EINVAL;
    dcp__ph_reset(&ph, DCP_IO_LOAD, ctx->ev_fn, ctx->ev_arg);
    rc = dcp_metadata_open(ctx, path, &md);
    if (rc != DCP_OK)
        return rc;
    for (i = 0; rc == DCP_OK && i < md->n; i++)
        rc = dcp__meta_check_tiling(&md->e[i], &ctx->err);
    if (rc == DCP_OK)
        rc = dcp__rd_open(&f, path, md, &ctx->err);
    if (rc != DCP_OK) {
        dcp_metadata_free(md);
        return rc;
    }
    t = dcp__ph_start(&ph, DCP_PHASE_VERIFY);
    for (i = 0; rc == DCP_OK && i < md->n; i++) {
        const struct md_entry *e = &md->e[i];
        dcp_entry_info info;
        if (!e->is_tensor) {
            dcp_value *v = NULL;
            rc = dcp__rd_value(&f, e, 1, ctx->max_value_bytes, &v, &ctx->err);
            dcp_value_free(v);
        } else {
            for (j = 0; rc == DCP_OK && j < e->nchunks; j++)
                rc = dcp__rd_chunk(&f, e, j, NULL, 0, 1, NULL, &ctx->err);
        }
        if (rc == DCP_OK && dcp_metadata_entry(md, i, &info) == DCP_OK) {
            done += info.nbytes;
            dcp__ph_progress(&ph, DCP_PHASE_VERIFY, done);
        }
    }
    dcp__ph_end(&ph, DCP_PHASE_VERIFY, t, rc == DCP_OK ? done : 0);
    /* Everything readable is intact; a key dcp cannot read is not
     * verified, which the answer must say. */
    if (rc == DCP_OK && md->nunsup)
        rc = dcp__err(&ctx->err, DCP_ENOTSUP,
                      "'%s': key '%s' not verified: dtype torch.%s is not "
                      "supported (%zu such keys; the other keys verified)",
                      path, md->unsup[0].key, md->unsup[0].unsup, md->nunsup);
    dcp__rd_close(&f);
    dcp_metadata_free(md);
    return rc;
}
