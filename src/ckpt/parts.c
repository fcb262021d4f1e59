/*
 * A save planned elsewhere (dcp_parts.h): the coordinator's begin and
 * commit, the writers' data files, and the reads a foreign reader needs
 * (a record as stored, boxes in one batch). The pieces are save.c's and
 * read.c's: records as save.c writes them, the commit through the back
 * end's publish (commit.c's primitive, here with bytes another planner
 * encoded, decoded first), the lock and leftovers of lock.c.
 */
#include "ctx.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "dcp/dcp_parts.h"
#include "ioengine.h"
#include "lock.h"
#include "meta.h"
#include "read.h"
#include "reshard.h"
#include "save.h"
#include "storage.h"

struct dcp_part_save {
    dcp_ctx *ctx;
    char *path;
    int dirfd;
    struct dcp__lock lock;
    struct dcp_metadata *old; /* the committed checkpoint, if read */
    int had;                  /* one was there (read or not) */
    int committed;
    char sid[24];
    char tag[24];
};

static int check_flags(unsigned flags, unsigned known)
{
    return (flags & ~known) == 0;
}

/* Whether one of the old checkpoint's file names carries tag. */
static int tag_used(const struct dcp_metadata *old, const char *tag)
{
    size_t i, n = strlen(tag);
    for (i = 0; old && i < old->nfiles; i++) {
        const char *dot = strchr(old->files[i], '.');
        if (dot && strncmp(dot + 1, tag, n) == 0 && dot[1 + n] == '.')
            return 1;
    }
    return 0;
}

int dcp_part_save_begin(dcp_ctx *ctx, const char *path, unsigned flags,
                        dcp_part_save **out)
{
    struct dcp_part_save *s;
    struct dcp_err ignore;
    uint8_t *md = NULL;
    size_t mdlen = 0;
    int rc, unknown = 0;
    if (!ctx || !out)
        return DCP_EINVAL;
    *out = NULL;
    dcp__ctx_begin(ctx);
    if (!path || !*path)
        return dcp__err(&ctx->err, DCP_EINVAL, "no checkpoint path");
    if (!check_flags(flags, DCP_PART_NO_OVERWRITE | DCP_PART_NO_LOCK))
        return dcp__err(&ctx->err, DCP_EINVAL, "unknown flags 0x%x", flags);
    s = dcp__calloc(1, sizeof(*s));
    if (!s || !(s->path = dcp__strdup(path))) {
        dcp__free(s);
        return dcp__err(&ctx->err, DCP_ENOMEM, "out of memory");
    }
    s->ctx = ctx;
    s->dirfd = -1;
    s->lock.dirfd = -1;
    dcp__save_random_tag(s->sid, sizeof(s->sid));
    rc = dcp__fs_mkdirs(path, &ctx->err);
    if (rc == DCP_OK)
        rc = dcp__fs_open_dir(path, &s->dirfd, &ctx->err);
    if (rc == DCP_OK && !(flags & DCP_PART_NO_LOCK))
        rc = dcp__lock_acquire(s->dirfd, path, s->sid, 0, &s->lock, &ctx->err);
    if (rc != DCP_OK) {
        dcp_part_save_free(s);
        return rc;
    }
    /* The committed checkpoint stays loadable until ours commits: read at
     * once (one request on S3; the commit is conditional on it there). */
    rc = dcp__fs_read_all(s->dirfd, ".metadata", ctx->max_metadata_bytes, &md,
                          &mdlen, &ignore);
    if (rc == DCP_OK) {
        s->had = 1;
        if (dcp__meta_decode(md, mdlen, &s->old, &ignore) != DCP_OK) {
            s->old = NULL;
            unknown = 1;
        }
        dcp__free(md);
    } else if (rc != DCP_ENOENT) {
        s->had = unknown = 1;
    } else if (dcp__fs_exists(s->dirfd, "__0.metadata")) {
        s->had = unknown = 1; /* a rank-local checkpoint: our names */
    }
    if (s->had && (flags & DCP_PART_NO_OVERWRITE)) {
        rc = dcp__err(&ctx->err, DCP_EEXIST,
                      "'%s' already holds a checkpoint and overwriting was "
                      "not asked for",
                      path);
        dcp_part_save_free(s);
        return rc;
    }
    if (s->had) {
        while (tag_used(s->old, s->sid)) /* 2^-64 */
            dcp__save_random_tag(s->sid, sizeof(s->sid));
        (void)snprintf(s->tag, sizeof(s->tag), "%s", s->sid);
    }
    /* Interrupted writers' leftovers (we hold the lock); best effort. */
    if (!unknown && !(flags & DCP_PART_NO_LOCK) &&
        dcp__clean_leftovers(s->dirfd, path, s->old, 0, NULL, NULL,
                             &ctx->err) != DCP_OK)
        dcp__err_clear(&ctx->err);
    *out = s;
    return DCP_OK;
}

const char *dcp_part_save_id(const dcp_part_save *s)
{
    return s ? s->sid : "";
}

const char *dcp_part_save_tag(const dcp_part_save *s)
{
    return s ? s->tag : "";
}

int dcp_part_save_had_checkpoint(const dcp_part_save *s)
{
    return s ? s->had : 0;
}

int dcp_part_save_commit(dcp_part_save *s, const char *name,
                         const void *metadata, size_t len, int sync)
{
    struct dcp_metadata *md = NULL;
    dcp_ctx *ctx;
    int rc, visible = 0;
    if (!s)
        return DCP_EINVAL;
    ctx = s->ctx;
    dcp__ctx_begin(ctx);
    if (s->committed || !metadata || !len)
        return dcp__err(&ctx->err, DCP_EINVAL,
                        s->committed ? "'%s': this save already committed"
                                     : "'%s': no metadata to commit",
                        s->path);
    if (name && (strncmp(name, "__", 2) != 0 ||
                 strlen(name) < 12 ||
                 strcmp(name + strlen(name) - 9, ".metadata") != 0 ||
                 strchr(name, '/')))
        return dcp__err(&ctx->err, DCP_EINVAL,
                        "'%s': '%s' is not a rank's metadata name", s->path,
                        name);
    if (len > ctx->max_metadata_bytes)
        return dcp__err(&ctx->err, DCP_ELIMIT,
                        "'%s': the metadata (%zu bytes) exceeds the limit of "
                        "%" PRIu64 " bytes",
                        s->path, len, ctx->max_metadata_bytes);
    rc = dcp__meta_decode(metadata, len, &md, &ctx->err);
    if (rc != DCP_OK)
        return dcp__err(&ctx->err, rc, "'%s': the metadata to commit: %s",
                        s->path, dcp_errmsg(ctx));
    if (!md->save_id || strcmp(md->save_id, s->sid) != 0) {
        rc = dcp__err(&ctx->err, DCP_EINVAL,
                      "'%s': the metadata names save id '%s', not this "
                      "save's '%s'",
                      s->path, md->save_id ? md->save_id : "", s->sid);
        dcp__meta_free(md);
        return rc;
    }
    s->committed = 1;
    rc = dcp__fs_publish(s->dirfd, s->path, name ? name : ".metadata",
                         metadata, len, sync ? 0u : DCP_PUBLISH_NOSYNC,
                         &visible, &ctx->err);
    if (rc != DCP_OK && visible)
        rc = dcp__err(&ctx->err, rc,
                      "%s (the new .metadata is visible, its durability "
                      "unknown)",
                      dcp_errmsg(ctx));
    if (rc == DCP_OK && !name)
        dcp__save_remove_old(s->dirfd, s->old, md);
    dcp__meta_free(md);
    dcp__lock_release(&s->lock);
    return rc;
}

void dcp_part_save_free(dcp_part_save *s)
{
    if (!s)
        return;
    dcp__lock_release(&s->lock);
    if (s->dirfd >= 0)
        dcp__fs_release(s->dirfd);
    dcp__meta_free(s->old);
    dcp__free(s->path);
    dcp__free(s);
}

/* ------------------------------------------------------ data files */

struct dcp_part_file {
    dcp_ctx *ctx;
    char *name;
    char sid[TZ_SID_MAX + 1];
    int dirfd, fd;
    struct io_writer w;
    int rc; /* the first failure */
};

/* __<r>_<n>.distcp or __<r>_<n>.<tag>.distcp (lock.c's leftover names). */
static int data_name(const char *name)
{
    size_t n = strlen(name);
    return n > 9 && strncmp(name, "__", 2) == 0 &&
           strcmp(name + n - 7, ".distcp") == 0 && !strchr(name, '/') &&
           dcp__leftover_name(name);
}

static int good_sid(const char *sid)
{
    size_t i, n = strlen(sid);
    if (n > TZ_SID_MAX)
        return 0;
    for (i = 0; i < n; i++)
        if (sid[i] < 0x21 || sid[i] > 0x7e)
            return 0;
    return 1;
}

int dcp_part_file_open(dcp_ctx *ctx, const char *path, const char *name,
                       const char *save_id, uint64_t size_hint,
                       dcp_part_file **out)
{
    struct dcp_part_file *f;
    struct io_eng *eng;
    int rc;
    if (!ctx || !out)
        return DCP_EINVAL;
    *out = NULL;
    dcp__ctx_begin(ctx);
    if (!path || !name || !data_name(name))
        return dcp__err(&ctx->err, DCP_EINVAL,
                        "'%s' is not a data file name (__<rank>_<n>.distcp "
                        "or __<rank>_<n>.<tag>.distcp)",
                        name ? name : "(null)");
    if (save_id && !good_sid(save_id))
        return dcp__err(&ctx->err, DCP_EINVAL,
                        "bad save id (1 to %u printable ASCII bytes)",
                        TZ_SID_MAX);
    f = dcp__calloc(1, sizeof(*f));
    if (!f || !(f->name = dcp__strdup(name))) {
        dcp__free(f);
        return dcp__err(&ctx->err, DCP_ENOMEM, "out of memory");
    }
    f->ctx = ctx;
    f->fd = -1;
    (void)snprintf(f->sid, sizeof(f->sid), "%s", save_id ? save_id : "");
    rc = dcp__fs_open_dir(path, &f->dirfd, &ctx->err);
    if (rc != DCP_OK) {
        dcp__free(f->name);
        dcp__free(f);
        return rc;
    }
    rc = dcp__fs_create(f->dirfd, name, &f->fd, &ctx->err);
    if (rc == DCP_OK)
        rc = dcp__ctx_io_begin(ctx, f->dirfd, &eng);
    if (rc == DCP_OK)
        rc = dcp__iow_open(&f->w, eng, f->dirfd, f->name, f->fd, size_hint,
                           &ctx->err);
    if (rc != DCP_OK) {
        if (f->fd >= 0) {
            dcp__fs_release(f->fd);
            (void)dcp__fs_unlink(f->dirfd, name, NULL);
        }
        dcp__fs_release(f->dirfd);
        dcp__free(f->name);
        dcp__free(f);
        return rc;
    }
    *out = f;
    return DCP_OK;
}

int dcp_part_file_tensor(dcp_part_file *f, dcp_dtype dtype, int ndim,
                         const int64_t *sizes, const void *data,
                         uint64_t nbytes, uint64_t *offset, uint64_t *length)
{
    uint64_t off = 0, len = 0, want;
    int64_t numel;
    if (!f)
        return DCP_EINVAL;
    dcp__ctx_begin(f->ctx);
    if (f->rc != DCP_OK)
        return dcp__err(&f->ctx->err, f->rc,
                        "'%s': an earlier write failed", f->name);
    if (ndim < 0 || ndim > DCP_MAX_NDIM || (ndim && !sizes) ||
        dcp_dtype_size(dtype) == 0)
        return dcp__err(&f->ctx->err, DCP_EINVAL,
                        "'%s': bad tensor (dtype %d, %d dimensions)", f->name,
                        (int)dtype, ndim);
    numel = dcp__shape_numel(ndim, sizes);
    if (numel < 0 ||
        __builtin_mul_overflow((uint64_t)numel, dcp_dtype_size(dtype),
                               &want) ||
        want != nbytes || (nbytes && !data))
        return dcp__err(&f->ctx->err, DCP_EINVAL,
                        "'%s': the tensor's elements take other than the "
                        "%" PRIu64 " bytes given",
                        f->name, nbytes);
    f->w.err = &f->ctx->err;
    f->rc = dcp__save_rec_tensor(&f->w, f->name, dtype, ndim, sizes, data,
                                 nbytes, f->sid, &off, &len);
    if (offset)
        *offset = off;
    if (length)
        *length = len;
    return f->rc;
}

int dcp_part_file_bytes(dcp_part_file *f, const void *data, size_t len,
                        uint64_t *offset, uint64_t *length)
{
    uint64_t off = 0, n = 0;
    if (!f)
        return DCP_EINVAL;
    dcp__ctx_begin(f->ctx);
    if (f->rc != DCP_OK)
        return dcp__err(&f->ctx->err, f->rc,
                        "'%s': an earlier write failed", f->name);
    if (len && !data)
        return dcp__err(&f->ctx->err, DCP_EINVAL, "'%s': no bytes", f->name);
    f->w.err = &f->ctx->err;
    f->rc = dcp__save_rec_bytes(&f->w, data, len, &off, &n);
    if (offset)
        *offset = off;
    if (length)
        *length = n;
    return f->rc;
}

int dcp_part_file_close(dcp_part_file *f, unsigned flags)
{
    dcp_ctx *ctx;
    int rc, frc;
    if (!f)
        return DCP_OK;
    ctx = f->ctx;
    dcp__ctx_begin(ctx);
    f->w.err = &ctx->err;
    rc = f->rc;
    if (!check_flags(flags, DCP_PART_SYNC | DCP_PART_DISCARD) &&
        rc == DCP_OK)
        rc = dcp__err(&ctx->err, DCP_EINVAL, "unknown flags 0x%x", flags);
    frc = dcp__iow_finish(&f->w); /* waits for every request */
    if (rc == DCP_OK)
        rc = frc;
    dcp__ctx_io_end(ctx, DCP_IO_SAVE);
    if (rc == DCP_OK && !(flags & DCP_PART_DISCARD) && (flags & DCP_PART_SYNC))
        rc = dcp__fs_fsync(f->fd, f->name, &ctx->err);
    if (rc == DCP_OK && !(flags & DCP_PART_DISCARD)) {
        rc = dcp__fs_close(f->fd, f->name, &ctx->err);
        if (rc != DCP_OK)
            (void)dcp__fs_unlink(f->dirfd, f->name, NULL);
    } else {
        dcp__fs_release(f->fd);
        (void)dcp__fs_unlink(f->dirfd, f->name, NULL);
    }
    dcp__fs_release(f->dirfd);
    dcp__free(f->name);
    dcp__free(f);
    return rc;
}

uint64_t dcp_part_record_bound(uint64_t nbytes)
{
    return dcp__save_rec_bound(nbytes);
}

/* ------------------------------------------------------- reading */

const char *dcp_metadata_save_id(const dcp_metadata *md)
{
    return md && md->save_id ? md->save_id : "";
}

int dcp_metadata_read_record(dcp_ctx *ctx, const dcp_metadata *md,
                             size_t index, size_t chunk, uint8_t **out,
                             size_t *len)
{
    const struct md_entry *e;
    const struct md_chunk *c;
    const char *file;
    uint64_t size = 0;
    int dirfd = -1, fd = -1, rc;
    if (!ctx || !out || !len)
        return DCP_EINVAL;
    *out = NULL;
    *len = 0;
    dcp__ctx_begin(ctx);
    if (!md || !md->dir || index >= md->n ||
        chunk >= md->e[index].nchunks || md->e[index].member)
        return dcp__err(&ctx->err, DCP_EINVAL, "no such stored record");
    e = &md->e[index];
    c = &e->chunks[chunk];
    if (c->file >= md->nfiles)
        return dcp__err(&ctx->err, DCP_EFORMAT, "'%s': no data file",
                        e->key);
    file = md->files[c->file];
    if (c->length > ctx->max_value_bytes + RD_XFORM_SLACK ||
        c->length > SIZE_MAX)
        return dcp__err(&ctx->err, DCP_ELIMIT,
                        "'%s': record of %" PRIu64 " bytes in '%s' exceeds "
                        "the value limit",
                        e->key, c->length, file);
    rc = dcp__fs_open_dir(md->dir, &dirfd, &ctx->err);
    if (rc == DCP_OK)
        rc = dcp__fs_open_read(dirfd, file, &fd, &size, &ctx->err);
    if (rc == DCP_OK && (c->offset > size || c->length > size - c->offset))
        rc = dcp__err(&ctx->err, DCP_ECORRUPT,
                      "'%s': record at byte %" PRIu64 " (%" PRIu64
                      " bytes) outside '%s' (%" PRIu64 " bytes)",
                      e->key, c->offset, c->length, file, size);
    if (rc == DCP_OK && c->xform != MD_XFORM_NONE) {
        rc = dcp__rd_inflate(fd, file, e, c, ctx->max_value_bytes, out, len,
                             &ctx->err);
    } else if (rc == DCP_OK) {
        *out = dcp__malloc(c->length ? (size_t)c->length : 1);
        if (!*out)
            rc = dcp__err(&ctx->err, DCP_ENOMEM, "out of memory");
        else
            rc = dcp__fs_pread(fd, *out, (size_t)c->length, c->offset, file,
                               &ctx->err);
        if (rc == DCP_OK)
            *len = (size_t)c->length;
    }
    if (rc != DCP_OK) {
        dcp__free(*out);
        *out = NULL;
        *len = 0;
    }
    if (fd >= 0)
        dcp__fs_release(fd);
    if (dirfd >= 0)
        dcp__fs_release(dirfd);
    return rc;
}

static int check_box(dcp_ctx *ctx, const struct md_entry *e,
                     const dcp_box_read *r)
{
    uint64_t want;
    int d;
    for (d = 0; d < e->ndim; d++)
        if (r->offsets[d] < 0 || r->sizes[d] < 0 ||
            r->offsets[d] > e->shape[d] ||
            r->sizes[d] > e->shape[d] - r->offsets[d])
            return dcp__err(&ctx->err, DCP_EINVAL,
                            "'%s': box outside the shape in dimension %d",
                            e->key, d);
    want = dcp__box_numel(e->ndim, r->sizes) * dcp_dtype_size(e->dtype);
    if (want != r->len || (!r->buf && r->len))
        return dcp__err(&ctx->err, DCP_EINVAL,
                        "'%s': the box holds %" PRIu64 " bytes, buffer has "
                        "%zu",
                        e->key, want, r->len);
    return DCP_OK;
}

/* The reads of one entry: reads[perm[i0..i1)], all of index e. */
static int plan_entry(dcp_ctx *ctx, struct rd_files *f,
                      const struct md_entry *e, const dcp_box_read *reads,
                      const size_t *perm, size_t i0, size_t i1, int verify,
                      struct io_rbatch *batch)
{
    size_t n = i1 - i0, i, nwanted = 0;
    struct rd_dest *dest = dcp__calloc(n, sizeof(*dest));
    uint8_t *mark = dcp__calloc(e->nchunks ? e->nchunks : 1, 1);
    int rc = DCP_OK;
    if (!dest || !mark)
        rc = dcp__err(&ctx->err, DCP_ENOMEM, "out of memory");
    if (rc == DCP_OK)
        rc = dcp__meta_check_tiling(e, &ctx->err);
    for (i = 0; rc == DCP_OK && i < n; i++) {
        const dcp_box_read *r = &reads[perm[i0 + i]];
        rc = check_box(ctx, e, r);
        dest[i].off = r->offsets;
        dest[i].size = r->sizes;
        dest[i].buf = r->buf;
        dest[i].dtype = e->dtype;
        if (rc == DCP_OK && dcp__box_numel(e->ndim, r->sizes))
            nwanted += dcp__meta_overlapping(e, r->offsets, r->sizes, mark);
    }
    for (i = 0; rc == DCP_OK && nwanted && i < e->nchunks; i++) {
        if (!mark[i])
            continue;
        nwanted--;
        rc = dcp__rd_chunk_plan(f, e, i, dest, n, verify, batch, &ctx->err);
    }
    dcp__free(dest);
    dcp__free(mark);
    return rc;
}

/* perm: the reads ordered by entry index (a counting sort). */
static int order_reads(const dcp_box_read *reads, size_t n, size_t nent,
                       size_t *perm)
{
    size_t *count = dcp__calloc(nent + 1, sizeof(*count)), i;
    if (!count)
        return DCP_ENOMEM;
    for (i = 0; i < n; i++)
        count[reads[i].index + 1]++;
    for (i = 1; i <= nent; i++)
        count[i] += count[i - 1];
    for (i = 0; i < n; i++)
        perm[count[reads[i].index]++] = i;
    dcp__free(count);
    return DCP_OK;
}

int dcp_metadata_read_boxes(dcp_ctx *ctx, const dcp_metadata *md,
                            const dcp_box_read *reads, size_t n, int verify)
{
    struct io_rbatch batch = {0};
    struct io_eng *eng = NULL;
    struct rd_files f;
    size_t *perm, i, j;
    int rc;
    if (!ctx)
        return DCP_EINVAL;
    dcp__ctx_begin(ctx);
    if (!md || !md->dir || (n && !reads))
        return dcp__err(&ctx->err, DCP_EINVAL, "no metadata or reads");
    for (i = 0; i < n; i++)
        if (reads[i].index >= md->n || !md->e[reads[i].index].is_tensor ||
            (md->e[reads[i].index].ndim &&
             (!reads[i].offsets || !reads[i].sizes)))
            return dcp__err(&ctx->err, DCP_EINVAL,
                            "read %zu: not a tensor entry or no box", i);
    if (n == 0)
        return DCP_OK;
    perm = dcp__malloc(n * sizeof(*perm));
    if (!perm || order_reads(reads, n, md->n, perm) != DCP_OK) {
        dcp__free(perm);
        return dcp__err(&ctx->err, DCP_ENOMEM, "out of memory");
    }
    rc = dcp__rd_open(&f, md->dir, md, &ctx->err);
    if (rc != DCP_OK) {
        dcp__free(perm);
        return rc;
    }
    rc = dcp__io_rbatch_init(&batch, f.dirfd, md->nfiles, &ctx->err);
    dcp__ctx_io_clear(ctx, DCP_IO_LOAD);
    for (i = 0; rc == DCP_OK && i < n; i = j) {
        size_t idx = reads[perm[i]].index;
        for (j = i + 1; j < n && reads[perm[j]].index == idx; j++)
            ;
        rc = plan_entry(ctx, &f, &md->e[idx], reads, perm, i, j, verify,
                        &batch);
    }
    if (rc == DCP_OK && batch.nparts) {
        rc = dcp__ctx_io_begin(ctx, f.dirfd, &eng);
        if (rc == DCP_OK)
            rc = dcp__io_rbatch_run(&batch, eng, &ctx->err);
        dcp__ctx_io_end(ctx, DCP_IO_LOAD);
    }
    dcp__io_rbatch_release(&batch);
    dcp__rd_close(&f);
    dcp__free(perm);
    return rc;
}
