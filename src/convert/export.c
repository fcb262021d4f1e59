/*
 * dcp_export: a DCP checkpoint into one torch.save file or into
 * safetensors, streaming with bounded memory.
 *
 * A tensor is produced in C order as a sequence of slabs: boxes that span
 * the whole tensor in every dimension after a split dimension k (chosen so
 * that one row of dims > k fits the slab budget), one index at a time in
 * dims < k, and a range in dim k. Each stored chunk meets a slab in a box
 * that also spans the chunk's whole extent after dim k, so its bytes are one
 * contiguous range of the chunk's record: one pread per (slab, chunk). As
 * the slabs advance, each chunk is read front to back exactly once, so its
 * CRC-32 is computed on the way and checked when its last byte has been
 * read. Chunks whose stored view is not the plain contiguous storage (a
 * torch-written transposed or offset view) are verified by a separate CRC
 * pass, and a non-contiguous one is read whole into a cache bounded by half
 * the memory limit.
 *
 * Buffers: the slab, a piece buffer (a chunk's part of a slab, when it is
 * not the whole slab), the cast output, each mem_limit / 8, and the cache.
 *
 * Output goes to temporary files beside the destination, which are
 * fsynced and renamed into place only when everything succeeded (shards
 * first, the index last); on failure they are removed.
 */
#include "ctx.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h> /* fchmod */
#include <unistd.h>

#include "crc32.h"
#include "cvname.h"
#include "dcp/dcp_convert.h"
#include "hashtab.h"
#include "json.h"
#include "meta.h"
#include "pickle.h"
#include "read.h"
#include "reshard.h"
#include "safetensors.h"
#include "storage.h"
#include "torchzip.h"
#include "value.h"

/* One selected entry, renamed. */
struct xent {
    const struct md_entry *e;
    struct cv_name nm;
    dcp_dtype odt;  /* dtype written */
    uint64_t bytes; /* tensor bytes written */
    size_t shard;
};

/* An output file being written under a temporary name. */
struct ofile {
    char *final;
    char *tmp;
    int fd;
    uint64_t pos;
    uint32_t crc; /* running CRC of the current zip record */
    int renamed;
};

struct xp {
    dcp_ctx *ctx;
    struct dcp_err *err;
    dcp_convert_options o;
    dcp_metadata *md;
    struct rd_files f;
    int f_open;
    int verify;
    size_t slab_cap;
    uint8_t *slab, *piece, *cbuf, *cache;
    size_t cache_cap;
    uint64_t done, total;
    struct xent *x;
    size_t nx;
    struct ofile *out;
    size_t nout;
    dcp_convert_result res;
};

/* ------------------------------------------------------------ output */

static int ofile_create(struct xp *xp, struct ofile *of, const char *final)
{
    const char *slash = strrchr(final, '/');
    size_t dl = slash ? (size_t)(slash - final) + 1 : 0;
    const char *base = final + dl;
    int fd;
    memset(of, 0, sizeof(*of));
    of->fd = -1;
    of->final = dcp__strdup(final);
    of->tmp = dcp__malloc(dl + strlen(base) + 16);
    if (!of->final || !of->tmp)
        return dcp__err(xp->err, DCP_ENOMEM, "out of memory");
    memcpy(of->tmp, final, dl);
    (void)sprintf(of->tmp + dl, ".%s.tmp-XXXXXX", base);
    fd = mkstemp(of->tmp);
    if (fd < 0) {
        int e = errno;
        of->tmp[0] = '\0';
        return dcp__err(xp->err,
                        e == ENOSPC   ? DCP_ENOSPC
                        : e == ENOENT ? DCP_ENOENT
                                      : DCP_EIO,
                        "cannot create a temporary file beside '%s': %s", final,
                        strerror(e));
    }
    (void)fchmod(fd, 0644);
    of->fd = fd;
    return DCP_OK;
}

static int owrite(struct xp *xp, struct ofile *of, const void *p, size_t n)
{
    int rc = dcp__fs_pwrite(of->fd, p, n, of->pos, of->final, xp->err);
    of->pos += n;
    of->crc = dcp__crc32(of->crc, p, n);
    return rc;
}

/* fsync and close; the file keeps its temporary name. */
static int ofile_finish(struct xp *xp, struct ofile *of)
{
    int rc = DCP_OK;
    if (!(xp->o.flags & DCP_CONVERT_NO_FSYNC))
        rc = dcp__fs_fsync(of->fd, of->final, xp->err);
    if (rc == DCP_OK)
        rc = dcp__fs_close(of->fd, of->final, xp->err);
    else
        (void)close(of->fd);
    of->fd = -1;
    return rc;
}

static void ofile_discard(struct ofile *of)
{
    if (of->fd >= 0)
        (void)close(of->fd);
    if (of->tmp && of->tmp[0])
        (void)unlink(of->renamed ? of->final : of->tmp);
    dcp__free(of->final);
    dcp__free(of->tmp);
    memset(of, 0, sizeof(*of));
}

static int ofile_rename(struct xp *xp, struct ofile *of)
{
    if (rename(of->tmp, of->final) != 0)
        return dcp__err(xp->err, DCP_EIO, "cannot rename '%s' to '%s': %s",
                        of->tmp, of->final, strerror(errno));
    of->renamed = 1;
    return DCP_OK;
}

static int fsync_parent(struct xp *xp, const char *path)
{
    const char *slash = strrchr(path, '/');
    char *dir;
    int fd, rc;
    if (xp->o.flags & DCP_CONVERT_NO_FSYNC)
        return DCP_OK;
    dir = slash ? dcp__strndup(path, (size_t)(slash - path) + 1)
                : dcp__strdup(".");
    if (!dir)
        return dcp__err(xp->err, DCP_ENOMEM, "out of memory");
    rc = dcp__fs_open_dir(dir, &fd, xp->err);
    if (rc == DCP_OK) {
        rc = dcp__fs_fsync_dir(fd, dir, xp->err);
        dcp__fs_release(fd);
    }
    dcp__free(dir);
    return rc;
}

/* ------------------------------------------------------------- slabs */

static void progress(struct xp *xp, uint64_t n)
{
    xp->done += n;
    if (xp->o.progress)
        xp->o.progress(xp->o.progress_arg, xp->done, xp->total);
}

/* Per-chunk reading state of the tensor being streamed. */
struct cstate {
    struct rd_loc loc;
    int plain; /* storage == the chunk, contiguous: running CRC */
    uint32_t crc;
    uint64_t crc_len;
};

static int is_c_contiguous(const struct tz_tensor *t)
{
    int64_t s = 1;
    int d;
    for (d = t->ndim - 1; d >= 0; d--) {
        if (t->size[d] != 1 && t->stride[d] != s)
            return 0;
        s *= t->size[d];
    }
    return 1;
}

/* CRC of a whole storage record, read in slab-sized pieces. */
static int crc_pass(struct xp *xp, const struct md_entry *e, struct cstate *c)
{
    uint64_t pos = 0;
    uint32_t crc = 0;
    while (pos < c->loc.size) {
        size_t n = c->loc.size - pos < xp->slab_cap
                       ? (size_t)(c->loc.size - pos)
                       : xp->slab_cap;
        DCP_RETURN_IF(dcp__rd_loc_read(&c->loc, xp->piece, n, pos, xp->err));
        crc = dcp__crc32(crc, xp->piece, n);
        pos += n;
    }
    if (crc != c->loc.crc)
        return dcp__err(xp->err, DCP_ECORRUPT,
                        "'%s': CRC mismatch in '%s' (data at byte %" PRIu64
                        ", %" PRIu64 " bytes)",
                        e->key, c->loc.file, c->loc.data, c->loc.size);
    return DCP_OK;
}

static int locate_chunks(struct xp *xp, const struct md_entry *e,
                         struct cstate *cs)
{
    size_t i, es = dcp_dtype_size(e->dtype);
    for (i = 0; i < e->nchunks; i++) {
        struct cstate *c = &cs[i];
        uint64_t want = dcp__box_numel(e->ndim, e->chunks[i].size) * es;
        DCP_RETURN_IF(dcp__rd_chunk_locate(&xp->f, e, i, &c->loc, xp->err));
        c->plain = c->loc.t.storage_offset == 0 && c->loc.size == want &&
                   is_c_contiguous(&c->loc.t);
        if (!c->plain && xp->verify && c->loc.size)
            DCP_RETURN_IF(crc_pass(xp, e, c));
        if (!c->plain && !is_c_contiguous(&c->loc.t) &&
            c->loc.size > xp->o.mem_limit / 2)
            return dcp__err(xp->err, DCP_ENOTSUP,
                            "'%s': a non-contiguous stored chunk of %" PRIu64
                            " bytes exceeds half the memory limit",
                            e->key, c->loc.size);
    }
    return DCP_OK;
}

/* Reads the part I (global ioff, isize) of chunk c into dst, contiguous. */
static int read_part(struct xp *xp, const struct md_entry *e,
                     const struct md_chunk *mc, struct cstate *c,
                     const int64_t *ioff, const int64_t *isize, uint8_t *dst)
{
    size_t es = dcp_dtype_size(e->dtype);
    int64_t lin = 0, cstride = 1, dstride[DCP_MAX_NDIM];
    uint64_t n = dcp__box_numel(e->ndim, isize);
    int d;
    if (is_c_contiguous(&c->loc.t)) {
        uint64_t at;
        for (d = e->ndim - 1; d >= 0; d--) {
            lin += (ioff[d] - mc->off[d]) * cstride;
            cstride *= mc->size[d];
        }
        at = ((uint64_t)c->loc.t.storage_offset + (uint64_t)lin) * es;
        DCP_RETURN_IF(
            dcp__rd_loc_read(&c->loc, dst, (size_t)(n * es), at, xp->err));
        if (c->plain && xp->verify && at == c->crc_len) {
            c->crc = dcp__crc32(c->crc, dst, (size_t)(n * es));
            c->crc_len += n * es;
        }
        return DCP_OK;
    }
    /* A strided view: the whole storage through the cache. */
    if (xp->cache_cap < c->loc.size) {
        uint8_t *p = dcp__realloc(xp->cache, (size_t)c->loc.size);
        if (!p)
            return dcp__err(xp->err, DCP_ENOMEM, "out of memory");
        xp->cache = p;
        xp->cache_cap = (size_t)c->loc.size;
    }
    DCP_RETURN_IF(dcp__rd_loc_read(&c->loc, xp->cache, (size_t)c->loc.size,
                                   0, xp->err));
    dcp__box_cstrides(e->ndim, isize, dstride);
    dcp__box_copy(e->ndim, es, isize, xp->cache,
                  c->loc.t.storage_offset +
                      dcp__box_at(e->ndim, ioff, mc->off, c->loc.t.stride),
                  c->loc.t.stride, dst, 0, dstride);
    return DCP_OK;
}

typedef int (*sink_fn)(struct xp *xp, void *arg, const void *p, size_t n);

/* Fills the slab (soff, ssize) from every chunk that meets it. */
static int fill_slab(struct xp *xp, const struct md_entry *e, struct cstate *cs,
                     const int64_t *soff, const int64_t *ssize)
{
    size_t es = dcp_dtype_size(e->dtype), i;
    uint64_t sn = dcp__box_numel(e->ndim, ssize);
    int64_t ioff[DCP_MAX_NDIM], isize[DCP_MAX_NDIM];
    int64_t istride[DCP_MAX_NDIM], sstride[DCP_MAX_NDIM];
    for (i = 0; i < e->nchunks; i++) {
        const struct md_chunk *mc = &e->chunks[i];
        uint64_t in;
        if (!dcp__box_intersect(e->ndim, mc->off, mc->size, soff, ssize, ioff,
                                isize))
            continue;
        in = dcp__box_numel(e->ndim, isize);
        if (in == 0)
            continue;
        if (in == sn) {
            DCP_RETURN_IF(read_part(xp, e, mc, &cs[i], ioff, isize, xp->slab));
            continue;
        }
        DCP_RETURN_IF(read_part(xp, e, mc, &cs[i], ioff, isize, xp->piece));
        dcp__box_cstrides(e->ndim, isize, istride);
        dcp__box_cstrides(e->ndim, ssize, sstride);
        dcp__box_copy(e->ndim, es, isize, xp->piece, 0, istride, xp->slab,
                      dcp__box_at(e->ndim, ioff, soff, sstride), sstride);
    }
    return DCP_OK;
}

static int check_crcs(struct xp *xp, const struct md_entry *e,
                      struct cstate *cs)
{
    size_t i;
    if (!xp->verify)
        return DCP_OK;
    for (i = 0; i < e->nchunks; i++) {
        struct cstate *c = &cs[i];
        if (!c->plain || c->loc.size == 0)
            continue;
        if (c->crc_len != c->loc.size)
            DCP_RETURN_IF(crc_pass(xp, e, c)); /* not read in order */
        else if (c->crc != c->loc.crc)
            return dcp__err(xp->err, DCP_ECORRUPT,
                            "'%s': CRC mismatch in '%s' (data at byte %" PRIu64
                            ", %" PRIu64 " bytes)",
                            e->key, c->loc.file, c->loc.data, c->loc.size);
    }
    return DCP_OK;
}

/* Streams tensor x in C order, cast to x->odt, into sink. */
static int stream_tensor(struct xp *xp, const struct xent *x, sink_fn sink,
                         void *arg)
{
    const struct md_entry *e = x->e;
    size_t es = dcp_dtype_size(e->dtype), os = dcp_dtype_size(x->odt);
    size_t wide = es > os ? es : os;
    int64_t soff[DCP_MAX_NDIM] = {0}, ssize[DCP_MAX_NDIM], row = 1, m;
    uint64_t first = 0;
    struct cstate *cs;
    size_t ci;
    int nd = e->ndim, k, d, rc;
    if (dcp__box_numel(nd, e->shape) == 0)
        return DCP_OK;
    DCP_RETURN_IF(dcp__meta_check_tiling(e, xp->err));
    /* Split dimension: the first k whose rows after it fit the slab. */
    for (k = 0; k < nd; k++) {
        row = 1;
        for (d = k + 1; d < nd; d++)
            row *= e->shape[d];
        if ((uint64_t)row * wide <= xp->slab_cap)
            break;
    }
    m = nd ? (int64_t)(xp->slab_cap / ((size_t)row * wide)) : 1;
    if (nd && m > e->shape[k])
        m = e->shape[k];
    cs = dcp__calloc(e->nchunks, sizeof(*cs));
    if (!cs)
        return dcp__err(xp->err, DCP_ENOMEM, "out of memory");
    rc = locate_chunks(xp, e, cs);
    for (d = 0; d < nd; d++)
        ssize[d] = d < k ? 1 : e->shape[d];
    while (rc == DCP_OK) {
        uint64_t n;
        const uint8_t *out = xp->slab;
        if (nd)
            ssize[k] = e->shape[k] - soff[k] < m ? e->shape[k] - soff[k] : m;
        n = dcp__box_numel(nd, ssize);
        rc = fill_slab(xp, e, cs, soff, ssize);
        if (rc == DCP_OK && x->odt != e->dtype) {
            rc = dcp__cv_cast(&xp->o, xp->cbuf, x->odt, xp->slab, e->dtype,
                              (size_t)n, x->nm.key, first, xp->err);
            out = xp->cbuf;
        }
        if (rc == DCP_OK)
            rc = sink(xp, arg, out, (size_t)(n * os));
        if (rc != DCP_OK)
            break;
        progress(xp, n * os);
        first += n;
        /* next slab: advance dim k, then the index over dims < k */
        if (!nd)
            break;
        soff[k] += ssize[k];
        if (soff[k] < e->shape[k])
            continue;
        soff[k] = 0;
        for (d = k - 1; d >= 0; d--) {
            if (++soff[d] < e->shape[d])
                break;
            soff[d] = 0;
        }
        if (d < 0)
            break;
    }
    if (rc == DCP_OK)
        rc = check_crcs(xp, e, cs);
    for (ci = 0; ci < e->nchunks; ci++)
        dcp__rd_loc_free(&cs[ci].loc);
    dcp__free(cs);
    return rc;
}

static int sink_file(struct xp *xp, void *arg, const void *p, size_t n)
{
    return owrite(xp, arg, p, n);
}

/* --------------------------------------------------------- selection */

static int cmp_xkey(const void *a, const void *b)
{
    return strcmp(((const struct xent *)a)->nm.key,
                  ((const struct xent *)b)->nm.key);
}

/* Selects and renames the entries to export (values too when
 * with_values); fails when nothing is selected or two names collide. */
static int select_entries(struct xp *xp, int with_values)
{
    size_t i, n = dcp_metadata_count(xp->md);
    xp->x = dcp__calloc(n ? n : 1, sizeof(*xp->x));
    if (!xp->x)
        return dcp__err(xp->err, DCP_ENOMEM, "out of memory");
    for (i = 0; i < n; i++) {
        const struct md_entry *e = &xp->md->e[i];
        struct xent *x;
        if (!dcp__cv_selected(&xp->o, e->key))
            continue;
        if (!e->is_tensor && !with_values) {
            xp->res.skipped++;
            continue;
        }
        x = &xp->x[xp->nx];
        x->e = e;
        DCP_RETURN_IF(
            dcp__cv_rename(&xp->o, e->key, e->path, e->npath, &x->nm, xp->err));
        xp->nx++;
        if (!e->is_tensor)
            continue;
        x->odt = dcp__cv_out_dtype(&xp->o, e->dtype);
        x->bytes = dcp__box_numel(e->ndim, e->shape) * dcp_dtype_size(x->odt);
        xp->total += x->bytes;
    }
    if (xp->nx == 0 && !xp->o.nkeys)
        return dcp__err(xp->err, DCP_EKEY,
                        "the checkpoint holds no tensor (safetensors holds "
                        "tensors only)");
    if (xp->nx == 0)
        return dcp__err(xp->err, DCP_EKEY,
                        with_values ? "no entry matches the key filter"
                                    : "no tensor matches the key filter");
    qsort(xp->x, xp->nx, sizeof(*xp->x), cmp_xkey);
    for (i = 1; i < xp->nx; i++)
        if (strcmp(xp->x[i - 1].nm.key, xp->x[i].nm.key) == 0)
            return dcp__err(
                xp->err, DCP_EKEY, "'%s' and '%s' are both renamed to '%s'",
                xp->x[i - 1].e->key, xp->x[i].e->key, xp->x[i].nm.key);
    return DCP_OK;
}

static void count_tensor(struct xp *xp, const struct xent *x)
{
    xp->res.tensors++;
    xp->res.bytes += x->bytes;
    if (x->odt != x->e->dtype)
        xp->res.cast++;
    else if (xp->o.dtype && !dcp__cv_is_float(x->e->dtype))
        xp->res.kept++;
}

/* ------------------------------------------------------- safetensors */

/* Larger elements first (natural alignment in the data buffer), then by
 * name. */
static int cmp_sf(const void *a, const void *b)
{
    const struct xent *x = a, *y = b;
    size_t sx = dcp_dtype_size(x->odt), sy = dcp_dtype_size(y->odt);
    if (sx != sy)
        return sx > sy ? -1 : 1;
    return strcmp(x->nm.key, y->nm.key);
}

static int shard_name(const char *out, size_t k, size_t n, char **name)
{
    size_t l = strlen(out);
    const char *ext = ".safetensors";
    size_t stem = l >= strlen(ext) && strcmp(out + l - strlen(ext), ext) == 0
                      ? l - strlen(ext)
                      : l;
    *name = dcp__malloc(stem + 40);
    if (!*name)
        return DCP_ENOMEM;
    (void)sprintf(*name, "%.*s-%05zu-of-%05zu.safetensors", (int)stem, out,
                  k + 1, n);
    return DCP_OK;
}

static int write_shard(struct xp *xp, struct ofile *of, size_t first,
                       size_t last)
{
    static const char *const meta[] = {"format", "pt"};
    struct sf_out *t = dcp__calloc(last - first + 1, sizeof(*t));
    struct dcp_buf hdr = {0};
    size_t i;
    int rc = DCP_OK;
    if (!t)
        return dcp__err(xp->err, DCP_ENOMEM, "out of memory");
    for (i = first; i < last; i++) {
        t[i - first].name = xp->x[i].nm.key;
        t[i - first].dtype = xp->x[i].odt;
        t[i - first].ndim = xp->x[i].e->ndim;
        t[i - first].shape = xp->x[i].e->shape;
    }
    if (dcp__sf_header_build(t, last - first, meta, 1, &hdr, NULL) != DCP_OK)
        rc = dcp__err(xp->err, DCP_ENOMEM, "out of memory");
    dcp__free(t);
    if (rc == DCP_OK)
        rc = owrite(xp, of, hdr.p, hdr.len);
    dcp__buf_free(&hdr);
    for (i = first; rc == DCP_OK && i < last; i++) {
        rc = stream_tensor(xp, &xp->x[i], sink_file, of);
        if (rc == DCP_OK)
            count_tensor(xp, &xp->x[i]);
    }
    return rc == DCP_OK ? ofile_finish(xp, of) : rc;
}

static int write_index(struct xp *xp, struct ofile *of, const char *out)
{
    struct dcp_buf j = {0};
    size_t i;
    int rc =
        dcp__buf_printf(&j,
                        "{\n  \"metadata\": {\n    \"total_size\": %" PRIu64
                        "\n  },\n  \"weight_map\": {",
                        xp->res.bytes);
    for (i = 0; rc == DCP_OK && i < xp->nx; i++) {
        const char *f = xp->out[xp->x[i].shard].final;
        const char *base = strrchr(f, '/') ? strrchr(f, '/') + 1 : f;
        rc = dcp__buf_printf(&j, i ? ",\n    " : "\n    ");
        if (rc == DCP_OK)
            rc = dcp__json_put_str(&j, xp->x[i].nm.key, strlen(xp->x[i].nm.key));
        if (rc == DCP_OK)
            rc = dcp__buf_printf(&j, ": ");
        if (rc == DCP_OK)
            rc = dcp__json_put_str(&j, base, strlen(base));
    }
    if (rc == DCP_OK)
        rc = dcp__buf_printf(&j, "\n  }\n}\n");
    if (rc != DCP_OK)
        rc = dcp__err(xp->err, DCP_ENOMEM, "out of memory");
    if (rc == DCP_OK) {
        char *name = dcp__malloc(strlen(out) + 16);
        if (!name) {
            rc = dcp__err(xp->err, DCP_ENOMEM, "out of memory");
        } else {
            (void)sprintf(name, "%s.index.json", out);
            rc = ofile_create(xp, of, name);
            dcp__free(name);
        }
    }
    if (rc == DCP_OK)
        rc = owrite(xp, of, j.p, j.len);
    if (rc == DCP_OK)
        rc = ofile_finish(xp, of);
    dcp__buf_free(&j);
    return rc;
}

static int export_safetensors(struct xp *xp, const char *out)
{
    size_t i, nshards = 1, start;
    uint64_t cur = 0;
    int rc;
    DCP_RETURN_IF(select_entries(xp, 0));
    for (i = 0; i < xp->nx; i++)
        if (!dcp__sf_dtype_name(xp->x[i].odt))
            return dcp__err(xp->err, DCP_ENOTSUP,
                            "'%s': safetensors has no dtype for %s (export "
                            "it to a torch.save file, or leave it out)",
                            xp->x[i].e->key, dcp_dtype_name(xp->x[i].odt));
    qsort(xp->x, xp->nx, sizeof(*xp->x), cmp_sf);
    for (i = 0; i < xp->nx; i++) {
        if (xp->o.max_shard_bytes && cur > 0 &&
            cur + xp->x[i].bytes > xp->o.max_shard_bytes) {
            nshards++;
            cur = 0;
        }
        cur += xp->x[i].bytes;
        xp->x[i].shard = nshards - 1;
    }
    xp->out = dcp__calloc(nshards + 1, sizeof(*xp->out));
    if (!xp->out)
        return dcp__err(xp->err, DCP_ENOMEM, "out of memory");
    for (i = 0; i <= nshards; i++)
        xp->out[i].fd = -1;
    for (i = 0, start = 0; i < nshards; i++) {
        size_t end = start;
        char *name = NULL;
        while (end < xp->nx && xp->x[end].shard == i)
            end++;
        if (nshards > 1 && shard_name(out, i, nshards, &name) != DCP_OK)
            return dcp__err(xp->err, DCP_ENOMEM, "out of memory");
        xp->nout = i + 1;
        rc = ofile_create(xp, &xp->out[i], name ? name : out);
        dcp__free(name); /* copied (ofile_create), or the export failed */
        if (rc != DCP_OK)
            return rc;
        DCP_RETURN_IF(write_shard(xp, &xp->out[i], start, end));
        start = end;
    }
    if (nshards > 1) {
        /* the index names tensors in name order, as Hugging Face writes */
        qsort(xp->x, xp->nx, sizeof(*xp->x), cmp_xkey);
        xp->nout = nshards + 1;
        DCP_RETURN_IF(write_index(xp, &xp->out[nshards], out));
    }
    for (i = 0; i < xp->nout; i++)
        DCP_RETURN_IF(ofile_rename(xp, &xp->out[i]));
    xp->res.files = xp->nout;
    return fsync_parent(xp, out);
}

/* --------------------------------------------------------- torch.save */

/* The nested structure planner_data describes, rebuilt as torch's
 * unflatten_state_dict (set_element) does. */
struct tnode {
    int kind; /* 0 dict, 1 list, 2 leaf; an empty list slot (None) is a
                 NULL child */
    const struct xent *x;
    struct tnode **kid;
    char **key; /* dict keys */
    size_t n, cap;
    struct dcp_htab index; /* dict: key -> kid index */
};

#define MAX_LIST_INDEX ((int64_t)1 << 20)

static void tnode_free(struct tnode *t)
{
    size_t i;
    if (!t)
        return;
    for (i = 0; i < t->n; i++) {
        tnode_free(t->kid[i]); /* NULL for a None slot */
        if (t->key)
            dcp__free(t->key[i]);
    }
    dcp__free(t->kid);
    dcp__free(t->key);
    dcp__htab_release(&t->index);
    dcp__free(t);
}

/* dcp_htab key function: the key of kid i of a dict node. */
static const void *tnode_key(const void *arr, uint32_t i, size_t *len)
{
    const char *const *key = arr;
    *len = strlen(key[i]);
    return key[i];
}

static int grow(struct tnode *t, size_t need)
{
    if (need <= t->cap)
        return DCP_OK;
    {
        size_t c = t->cap ? t->cap : 4;
        struct tnode **k;
        while (c < need)
            c *= 2;
        k = dcp__realloc(t->kid, c * sizeof(*k));
        if (!k)
            return DCP_ENOMEM;
        t->kid = k;
        if (t->kind == 0) {
            char **kk = dcp__realloc(t->key, c * sizeof(*kk));
            if (!kk)
                return DCP_ENOMEM;
            t->key = kk;
        }
        t->cap = c;
    }
    return DCP_OK;
}

/* The child of dict t under key, created (kind) when absent. */
static int dict_child(struct tnode *t, const char *key, int kind,
                      struct tnode **out)
{
    size_t p, len = strlen(key);
    int rc = dcp__htab_reserve(&t->index, t->n + 1, tnode_key, t->key);
    if (rc != DCP_OK)
        return rc;
    p = dcp__htab_slot(&t->index, key, len, tnode_key, t->key);
    if (t->index.slot[p]) {
        *out = t->kid[t->index.slot[p] - 1];
        return DCP_OK;
    }
    if (grow(t, t->n + 1) != DCP_OK)
        return DCP_ENOMEM;
    t->kid[t->n] = dcp__calloc(1, sizeof(struct tnode));
    t->key[t->n] = dcp__strdup(key);
    if (!t->kid[t->n] || !t->key[t->n]) {
        dcp__free(t->kid[t->n]);
        dcp__free(t->key[t->n]);
        return DCP_ENOMEM;
    }
    t->kid[t->n]->kind = kind;
    dcp__htab_set(&t->index, p, (uint32_t)t->n);
    *out = t->kid[t->n++];
    return DCP_OK;
}

static int list_child(struct tnode *t, int64_t i, int kind, struct tnode **out)
{
    if (grow(t, (size_t)i + 1) != DCP_OK)
        return DCP_ENOMEM;
    while (t->n <= (size_t)i)
        t->kid[t->n++] = NULL;
    if (!t->kid[i]) {
        t->kid[i] = dcp__calloc(1, sizeof(struct tnode));
        if (!t->kid[i])
            return DCP_ENOMEM;
        t->kid[i]->kind = kind;
    }
    *out = t->kid[i];
    return DCP_OK;
}

static int tree_insert(struct xp *xp, struct tnode *root, const struct xent *x)
{
    const struct md_pathel *p = x->nm.path;
    struct tnode *cur = root, *next;
    size_t i;
    for (i = 0; i < x->nm.npath; i++) {
        int last = i + 1 == x->nm.npath;
        int kind = last ? 2 : (p[i + 1].s ? 0 : 1);
        int rc;
        if ((cur->kind == 0) != (p[i].s != NULL) ||
            (!p[i].s && (p[i].i < 0 || p[i].i >= MAX_LIST_INDEX)))
            return dcp__err(xp->err, DCP_EFORMAT,
                            "'%s': planner_data path element %zu does not "
                            "fit the structure of the other keys",
                            x->e->key, i);
        rc = cur->kind == 0 ? dict_child(cur, p[i].s, kind, &next)
                            : list_child(cur, p[i].i, kind, &next);
        if (rc != DCP_OK)
            return dcp__err(xp->err, DCP_ENOMEM, "out of memory");
        if (next->kind != kind || (last && next->x))
            return dcp__err(xp->err, DCP_EFORMAT,
                            "'%s': its planner_data path conflicts with "
                            "another key's",
                            x->e->key);
        if (last)
            next->x = x;
        cur = next;
    }
    return DCP_OK;
}

struct emit {
    struct xp *xp;
    struct pk_writer w;
    const struct xent **order; /* tensors in storage-key order */
    size_t ntensors;
};

static int emit_node(struct emit *em, const struct tnode *t, int depth);

static int emit_items(struct emit *em, const struct tnode *t, int depth)
{
    size_t i, j;
    int rc = DCP_OK;
    for (i = 0; rc == DCP_OK && i < t->n; i += 1000) {
        size_t batch = t->n - i < 1000 ? t->n - i : 1000;
        rc = dcp__pkw_mark(&em->w);
        for (j = i; rc == DCP_OK && j < i + batch; j++) {
            if (t->kind == 0)
                rc = dcp__pkw_str_memo(&em->w, t->key[j], strlen(t->key[j]), NULL);
            if (rc == DCP_OK)
                rc = t->kid[j] ? emit_node(em, t->kid[j], depth + 1)
                               : dcp__pkw_none(&em->w);
        }
        if (rc == DCP_OK)
            rc = dcp__pkw_op(&em->w, t->kind == 0 ? PK_OP_SETITEMS : PK_OP_APPENDS);
    }
    return rc;
}

static int emit_leaf(struct emit *em, const struct xent *x)
{
    struct xp *xp = em->xp;
    char key[32];
    dcp_value *v = NULL;
    int rc;
    if (x->e->is_tensor) {
        (void)snprintf(key, sizeof(key), "%zu", em->ntensors);
        em->order[em->ntensors++] = x;
        return dcp__tz_tensor_emit(&em->w, x->odt, x->e->ndim, x->e->shape, key);
    }
    rc = dcp__rd_value(&xp->f, x->e, xp->verify, xp->ctx->max_value_bytes, &v,
                       xp->err);
    if (rc != DCP_OK)
        return rc;
    rc = dcp__value_emit(&em->w, v);
    dcp_value_free(v);
    if (rc == DCP_OK)
        xp->res.values++;
    return rc;
}

static int emit_node(struct emit *em, const struct tnode *t, int depth)
{
    int rc;
    if (depth > 64)
        return DCP_ELIMIT;
    switch (t->kind) {
    case 0:
    case 1:
        rc = t->kind == 0 ? dcp__pkw_empty_dict(&em->w) : dcp__pkw_empty_list(&em->w);
        if (rc == DCP_OK)
            rc = dcp__pkw_put(&em->w, NULL);
        return rc == DCP_OK ? emit_items(em, t, depth) : rc;
    default:
        return emit_leaf(em, t->x);
    }
}

static int drain(struct xp *xp, struct ofile *of, struct tz_writer *z)
{
    int rc = owrite(xp, of, z->out.p, z->out.len);
    z->out.len = 0;
    return rc;
}

static int write_torch(struct xp *xp, struct ofile *of, struct emit *em,
                       const struct dcp_buf *pkl)
{
    struct tz_writer z;
    size_t i;
    char name[48];
    int rc = dcp__tz_writer_init(&z, 0, 64);
    if (rc == DCP_OK)
        rc = dcp__tz_writer_set_max(&z, em->ntensors + 8);
    if (rc == DCP_OK)
        rc = dcp__tz_add(&z, "archive/data.pkl", pkl->p, pkl->len);
    if (rc == DCP_OK)
        rc = dcp__tz_add(&z, "archive/.format_version", "1", 1);
    if (rc == DCP_OK)
        rc = dcp__tz_add(&z, "archive/.storage_alignment", "64", 2);
    if (rc == DCP_OK)
        rc = dcp__tz_add(&z, "archive/byteorder", "little", 6);
    if (rc != DCP_OK)
        rc = dcp__err(xp->err, rc, "cannot encode the archive");
    for (i = 0; rc == DCP_OK && i < em->ntensors; i++) {
        const struct xent *x = em->order[i];
        uint64_t data_off;
        (void)snprintf(name, sizeof(name), "archive/data/%zu", i);
        rc = dcp__tz_stream_begin(&z, name, x->bytes, &data_off);
        if (rc != DCP_OK) {
            rc = dcp__err(xp->err, rc, "cannot encode '%s'", x->nm.key);
            break;
        }
        rc = drain(xp, of, &z);
        of->crc = 0;
        if (rc == DCP_OK)
            rc = stream_tensor(xp, x, sink_file, of);
        if (rc == DCP_OK)
            rc = dcp__tz_stream_end(&z, of->crc);
        if (rc == DCP_OK)
            count_tensor(xp, x);
    }
    if (rc == DCP_OK)
        rc = dcp__tz_add(&z, "archive/version", "3\n", 2);
    if (rc == DCP_OK)
        rc = dcp__tz_finish(&z);
    if (rc == DCP_OK)
        rc = drain(xp, of, &z);
    else if (xp->err->code != rc)
        rc = dcp__err(xp->err, rc, "cannot encode the archive");
    dcp__tz_writer_release(&z);
    return rc == DCP_OK ? ofile_finish(xp, of) : rc;
}

static int export_torch(struct xp *xp, const char *out)
{
    struct tnode *root = dcp__calloc(1, sizeof(*root));
    struct dcp_buf pkl = {0};
    struct emit em;
    size_t i;
    int rc = root ? DCP_OK : dcp__err(xp->err, DCP_ENOMEM, "out of memory");
    memset(&em, 0, sizeof(em));
    if (rc == DCP_OK)
        rc = select_entries(xp, 1);
    for (i = 0; rc == DCP_OK && i < xp->nx; i++)
        rc = tree_insert(xp, root, &xp->x[i]);
    em.xp = xp;
    em.order = dcp__calloc(xp->nx ? xp->nx : 1, sizeof(*em.order));
    if (rc == DCP_OK && !em.order)
        rc = dcp__err(xp->err, DCP_ENOMEM, "out of memory");
    if (rc == DCP_OK) {
        dcp__pk_writer_init(&em.w, &pkl);
        rc = dcp__pkw_proto(&em.w);
        if (rc == DCP_OK)
            rc = emit_node(&em, root, 0);
        if (rc == DCP_OK)
            rc = dcp__pkw_stop(&em.w);
        dcp__pk_writer_release(&em.w);
        if (rc != DCP_OK && xp->err->code != rc)
            rc = dcp__err(xp->err, rc, "cannot encode data.pkl");
    }
    if (rc == DCP_OK) {
        xp->out = dcp__calloc(1, sizeof(*xp->out));
        if (!xp->out)
            rc = dcp__err(xp->err, DCP_ENOMEM, "out of memory");
    }
    if (rc == DCP_OK) {
        xp->nout = 1;
        rc = ofile_create(xp, &xp->out[0], out);
    }
    if (rc == DCP_OK)
        rc = write_torch(xp, &xp->out[0], &em, &pkl);
    if (rc == DCP_OK)
        rc = ofile_rename(xp, &xp->out[0]);
    if (rc == DCP_OK) {
        xp->res.files = 1;
        rc = fsync_parent(xp, out);
    }
    dcp__buf_free(&pkl);
    dcp__free((void *)em.order);
    tnode_free(root);
    return rc;
}

/* ------------------------------------------------------------ entry */

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

static int xp_run(struct xp *xp, const char *dir, const char *out)
{
    int format = xp->o.format;
    DCP_RETURN_IF(dcp_metadata_open(xp->ctx, dir, &xp->md));
    DCP_RETURN_IF(dcp__rd_open(&xp->f, dir, xp->md, xp->err));
    xp->f_open = 1;
    if (format == DCP_FORMAT_AUTO)
        format = ends_with(out, ".safetensors") ? DCP_FORMAT_SAFETENSORS
                                                : DCP_FORMAT_TORCH;
    if (format == DCP_FORMAT_SAFETENSORS)
        return export_safetensors(xp, out);
    if (format == DCP_FORMAT_TORCH)
        return export_torch(xp, out);
    return dcp__err(xp->err, DCP_EINVAL, "cannot export to format %d", format);
}

int dcp_export(dcp_ctx *ctx, const char *dir, const char *out,
               const dcp_convert_options *opts, dcp_convert_result *res)
{
    struct xp xp;
    size_t i;
    int rc;
    if (!ctx)
        return DCP_EINVAL;
    dcp__ctx_begin(ctx);
    if (!dir || !out || !*out)
        return dcp__err(&ctx->err, DCP_EINVAL, "no checkpoint or output");
    {
        struct stat sb;
        if (out[strlen(out) - 1] == '/' ||
            (stat(out, &sb) == 0 && S_ISDIR(sb.st_mode)))
            return dcp__err(&ctx->err, DCP_EINVAL,
                            "'%s' is a directory: name the output file", out);
    }
    rc = dcp__cv_result_check(res, &ctx->err);
    if (rc != DCP_OK)
        return rc;
    memset(&xp, 0, sizeof(xp));
    xp.ctx = ctx;
    xp.err = &ctx->err;
    rc = dcp__cv_options(opts, &xp.o, xp.err);
    if (rc != DCP_OK)
        return rc;
    xp.verify = !(xp.o.flags & DCP_CONVERT_NO_VERIFY);
    xp.slab_cap = (size_t)(xp.o.mem_limit / 8);
    xp.slab = dcp__malloc(xp.slab_cap);
    xp.piece = dcp__malloc(xp.slab_cap);
    xp.cbuf = dcp__malloc(xp.slab_cap);
    if (!xp.slab || !xp.piece || !xp.cbuf)
        rc = dcp__err(xp.err, DCP_ENOMEM, "out of memory");
    if (rc == DCP_OK)
        rc = xp_run(&xp, dir, out);
    for (i = 0; i < xp.nout; i++) {
        if (rc != DCP_OK)
            ofile_discard(&xp.out[i]);
        else {
            dcp__free(xp.out[i].final);
            dcp__free(xp.out[i].tmp);
        }
    }
    dcp__free(xp.out);
    for (i = 0; i < xp.nx; i++)
        dcp__cv_name_release(&xp.x[i].nm);
    dcp__free(xp.x);
    if (xp.f_open)
        dcp__rd_close(&xp.f);
    dcp_metadata_free(xp.md);
    dcp__free(xp.slab);
    dcp__free(xp.piece);
    dcp__free(xp.cbuf);
    dcp__free(xp.cache);
    dcp__cv_result_put(res, &xp.res);
    return rc;
}
