/*
 * dcp_save: the state of every rank into one checkpoint directory.
 *
 * Plan: the state becomes a struct dcp_metadata (one chunk per box, one
 * record per value) and is validated (boxes tile each tensor exactly)
 * before any byte is written. Write: each rank appends its records to its
 * data file, values first, then tensors; a tensor's bytes go from the
 * caller's buffer straight to the file, with the CRC computed on the way.
 * Commit: data files fsynced, then rank 0 writes .metadata.tmp, fsyncs it,
 * renames it to .metadata and fsyncs the directory. Every rank returns the
 * same result.
 *
 * Overwriting: when the directory already holds a committed checkpoint whose
 * data files have the names this save would use, the new files get a fresh
 * suffix, so the old checkpoint stays loadable until the new .metadata
 * replaces the old one; the old checkpoint's files are removed after that.
 */
#include "ctx.h"

#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "crc32.h"
#include "meta.h"
#include "read.h"
#include "state.h"
#include "storage.h"
#include "torchzip.h"

#define WBUF_FLUSH ((size_t)4 << 20) /* pending small writes flushed here */
#define DIRECT_MIN ((size_t)64 << 10) /* data this large goes straight out */
#define ITEM_ALIGN 64                 /* torch.save's record alignment */

/* ------------------------------------------------------------- plan */

/* Builds the metadata of a single-process save from the state; chunk
 * storage fields are filled by the writer. */
static int plan_from_state(const dcp_state *st, const char *path,
                           struct dcp_metadata **out, struct dcp_err *err)
{
    struct dcp_metadata *md = dcp__calloc(1, sizeof(*md));
    size_t i, j;
    int rc = DCP_OK, d;
    *out = NULL;
    if (!md)
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    md->e = dcp__calloc(st->n ? st->n : 1, sizeof(*md->e));
    md->version = dcp__strdup("1.0.0");
    md->checkpoint_id = dcp__strdup(path);
    if (!md->e || !md->version || !md->checkpoint_id)
        goto out_nomem;
    for (i = 0; i < st->n; i++) {
        const struct st_entry *se = &st->e[i];
        struct md_entry *e = &md->e[md->n++];
        e->key = dcp__strdup(se->key);
        e->path = dcp__calloc(se->npath, sizeof(*e->path));
        if (!e->key || !e->path)
            goto out_nomem;
        e->npath = se->npath;
        for (j = 0; j < se->npath; j++) {
            e->path[j].i = se->path[j].i;
            if (se->path[j].s && !(e->path[j].s = dcp__strdup(se->path[j].s)))
                goto out_nomem;
        }
        e->is_tensor = se->is_tensor;
        e->dtype = se->dtype;
        e->ndim = se->ndim;
        for (d = 0; d < se->ndim; d++)
            e->shape[d] = se->shape[d];
        e->nchunks = se->is_tensor ? se->nboxes : 1;
        e->chunks = dcp__calloc(e->nchunks ? e->nchunks : 1,
                                sizeof(*e->chunks));
        if (!e->chunks)
            goto out_nomem;
        for (j = 0; se->is_tensor && j < se->nboxes; j++) {
            struct md_chunk *c = &e->chunks[j];
            c->off = dcp__calloc(2 * (size_t)(se->ndim ? se->ndim : 1),
                                 sizeof(int64_t));
            if (!c->off)
                goto out_nomem;
            c->size = c->off + (se->ndim ? se->ndim : 1);
            for (d = 0; d < se->ndim; d++) {
                c->off[d] = se->boxes[j].off[d];
                c->size[d] = se->boxes[j].size[d];
            }
        }
    }
    rc = dcp__meta_sort(md, err);
    for (i = 0; rc == DCP_OK && i < md->n; i++) {
        rc = dcp__meta_check_tiling(&md->e[i], err);
        if (rc == DCP_EFORMAT) {
            (void)dcp__err_prefix(err, "invalid save plan");
            rc = err->code = DCP_EPLAN;
        }
    }
    if (rc != DCP_OK) {
        dcp__meta_free(md);
        return rc;
    }
    *out = md;
    return DCP_OK;
out_nomem:
    dcp__meta_free(md);
    return dcp__err(err, DCP_ENOMEM, "out of memory planning the save");
}

/* ----------------------------------------------------------- writer */

struct wfile {
    int fd;
    const char *name;
    uint64_t off;        /* bytes in the file so far */
    struct dcp_buf pend; /* small writes not yet issued */
    struct dcp_err *err;
};

static int wf_flush(struct wfile *w)
{
    int rc = DCP_OK;
    if (w->pend.len) {
        rc = dcp__fs_pwrite(w->fd, w->pend.p, w->pend.len,
                            w->off - w->pend.len, w->name, w->err);
        w->pend.len = 0;
    }
    return rc;
}

static int wf_put(struct wfile *w, const void *p, size_t n)
{
    int rc;
    if (n >= DIRECT_MIN) {
        rc = wf_flush(w);
        if (rc == DCP_OK)
            rc = dcp__fs_pwrite(w->fd, p, n, w->off, w->name, w->err);
        w->off += n;
        return rc;
    }
    if (dcp__buf_put(&w->pend, p, n) != DCP_OK)
        return dcp__err(w->err, DCP_ENOMEM, "out of memory");
    w->off += n;
    return w->pend.len >= WBUF_FLUSH ? wf_flush(w) : DCP_OK;
}

/* Moves what the zip writer produced into the file. */
static int wf_drain(struct wfile *w, struct tz_writer *z)
{
    int rc = wf_put(w, z->out.p, z->out.len);
    z->out.len = 0;
    return rc;
}

static int write_value(struct wfile *w, const struct st_entry *se,
                       struct md_chunk *c, uint32_t file)
{
    struct dcp_buf pkl = {0};
    struct tz_writer z;
    int rc = dcp__value_pickle(se->value, &pkl);
    if (rc != DCP_OK) {
        dcp__buf_free(&pkl);
        return dcp__err(w->err, rc, "cannot encode value '%s'", se->key);
    }
    rc = tz_writer_init(&z, w->off, ITEM_ALIGN);
    if (rc == DCP_OK)
        rc = tz_value_item(&z, pkl.p, pkl.len);
    dcp__buf_free(&pkl);
    c->file = file;
    c->offset = w->off;
    if (rc == DCP_OK)
        rc = wf_drain(w, &z);
    else
        rc = dcp__err(w->err, rc, "cannot encode value '%s'", se->key);
    c->length = w->off - c->offset;
    tz_writer_release(&z);
    return rc;
}

static int write_box(struct wfile *w, const struct st_entry *se,
                     const struct st_box *b, struct md_chunk *c,
                     uint32_t file)
{
    uint64_t nbytes = dcp__box_numel(se->ndim, b->size) *
                      dcp_dtype_size(se->dtype);
    uint64_t data_off;
    struct tz_writer z;
    uint32_t crc = 0;
    int rc = tz_writer_init(&z, w->off, ITEM_ALIGN);
    c->file = file;
    c->offset = w->off;
    if (rc == DCP_OK)
        rc = tz_tensor_item_begin(&z, se->dtype, se->ndim, b->size, nbytes,
                                  &data_off);
    if (rc != DCP_OK) {
        tz_writer_release(&z);
        return dcp__err(w->err, rc, "cannot encode tensor '%s'", se->key);
    }
    rc = wf_drain(w, &z);
    if (rc == DCP_OK && nbytes) {
        crc = dcp__crc32(0, b->buf, (size_t)nbytes);
        rc = wf_put(w, b->buf, (size_t)nbytes);
    }
    if (rc == DCP_OK) {
        rc = tz_tensor_item_end(&z, crc);
        if (rc == DCP_OK)
            rc = wf_drain(w, &z);
        else
            rc = dcp__err(w->err, rc, "cannot encode tensor '%s'", se->key);
    }
    c->length = w->off - c->offset;
    tz_writer_release(&z);
    return rc;
}

/* Writes every record of this rank into one data file. */
static int write_rank(int dirfd, const char *name, const dcp_state *st,
                      struct dcp_metadata *md, uint32_t file, int sync,
                      struct dcp_err *err)
{
    struct wfile w;
    size_t i, j;
    int rc, pass;
    memset(&w, 0, sizeof(w));
    w.name = name;
    w.err = err;
    rc = dcp__fs_create(dirfd, name, &w.fd, err);
    if (rc != DCP_OK)
        return rc;
    /* Values first, then tensors, as torch's writer orders them. */
    for (pass = 0; pass < 2 && rc == DCP_OK; pass++) {
        for (i = 0; i < st->n && rc == DCP_OK; i++) {
            const struct st_entry *se = &st->e[i];
            struct md_entry *e;
            long ei;
            if (se->is_tensor != pass)
                continue;
            ei = dcp__meta_find(md, se->key);
            e = &md->e[ei];
            if (!se->is_tensor) {
                rc = write_value(&w, se, &e->chunks[0], file);
                continue;
            }
            for (j = 0; j < se->nboxes && rc == DCP_OK; j++)
                rc = write_box(&w, se, &se->boxes[j], &e->chunks[j], file);
        }
    }
    if (rc == DCP_OK)
        rc = wf_flush(&w);
    if (rc == DCP_OK && sync)
        rc = dcp__fs_fsync(w.fd, name, err);
    if (rc == DCP_OK)
        rc = dcp__fs_close(w.fd, name, err);
    else
        (void)close(w.fd);
    dcp__buf_free(&w.pend);
    return rc;
}

/* ----------------------------------------------------------- commit */

static int write_metadata(int dirfd, const char *path,
                          const struct dcp_metadata *md, int sync,
                          struct dcp_err *err)
{
    static const char tmp[] = ".metadata.tmp";
    struct dcp_buf b = {0};
    int fd = -1, rc;
    rc = dcp__meta_encode(md, &b);
    if (rc != DCP_OK) {
        dcp__buf_free(&b);
        return dcp__err(err, rc, "cannot encode the metadata");
    }
    rc = dcp__fs_create(dirfd, tmp, &fd, err);
    if (rc == DCP_OK)
        rc = dcp__fs_pwrite(fd, b.p, b.len, 0, tmp, err);
    if (rc == DCP_OK && sync)
        rc = dcp__fs_fsync(fd, tmp, err);
    if (fd >= 0) {
        if (rc == DCP_OK)
            rc = dcp__fs_close(fd, tmp, err);
        else
            (void)close(fd);
    }
    dcp__buf_free(&b);
    /* The commit point: after this rename the new checkpoint exists. */
    if (rc == DCP_OK)
        rc = dcp__fs_rename(dirfd, tmp, ".metadata", err);
    if (rc == DCP_OK && sync)
        rc = dcp__fs_fsync_dir(dirfd, path, err);
    if (rc != DCP_OK)
        (void)dcp__fs_unlink(dirfd, tmp, NULL);
    return rc;
}

static int md_uses_file(const struct dcp_metadata *md, const char *name)
{
    size_t i;
    for (i = 0; md && i < md->nfiles; i++)
        if (strcmp(md->files[i], name) == 0)
            return 1;
    return 0;
}

/* Removes the old checkpoint's data files that the new one does not use. */
static void remove_old_files(int dirfd, const struct dcp_metadata *old,
                             const struct dcp_metadata *md)
{
    size_t i;
    for (i = 0; old && i < old->nfiles; i++)
        if (!md_uses_file(md, old->files[i]))
            (void)dcp__fs_unlink(dirfd, old->files[i], NULL);
}

static void random_tag(char *out, size_t n)
{
    struct timespec ts;
    uint64_t x;
    (void)clock_gettime(CLOCK_REALTIME, &ts);
    x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^
        ((uint64_t)getpid() << 40);
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    (void)snprintf(out, n, "%016" PRIx64, x);
}

int dcp_save(dcp_ctx *ctx, const dcp_state *st, const char *path,
             const dcp_save_options *opts)
{
    struct dcp_metadata *md = NULL, *old = NULL;
    char name[96], tag[24], save_id[40];
    int dirfd = -1, rc, sync = 1, bad = -1;
    uint32_t file = 0;
    if (!ctx)
        return DCP_EINVAL;
    dcp__ctx_begin(ctx);
    if (!st || !path || !*path)
        return dcp__err(&ctx->err, DCP_EINVAL, "save: state and path needed");
    if (opts && opts->struct_size >= sizeof(dcp_save_options))
        sync = !opts->no_fsync;
    if (ctx->size != 1)
        return dcp__err(&ctx->err, DCP_ENOTSUP,
                        "save: several ranks need the MPI communicator");
    rc = plan_from_state(st, path, &md, &ctx->err);
    if (rc == DCP_OK)
        rc = dcp__fs_mkdirs(path, &ctx->err);
    if (rc == DCP_OK)
        rc = dcp__fs_open_dir(path, &dirfd, &ctx->err);
    if (rc != DCP_OK)
        goto out;
    /* A committed checkpoint here stays loadable until ours commits. */
    if (dcp__fs_exists(dirfd, ".metadata")) {
        struct dcp_err ignore;
        if (dcp__rd_metadata(dirfd, path, ctx->max_metadata_bytes, &old,
                             &ignore) != DCP_OK)
            old = NULL;
    }
    (void)snprintf(name, sizeof(name), "__%d_0.distcp", ctx->rank);
    if (old && md_uses_file(old, name)) {
        random_tag(tag, sizeof(tag));
        (void)snprintf(name, sizeof(name), "__%d_0.%.8s.distcp", ctx->rank,
                       tag);
    }
    random_tag(save_id, sizeof(save_id));
    md->save_id = dcp__strdup(save_id);
    md->files = dcp__calloc(1, sizeof(*md->files));
    if (!md->save_id || !md->files || !(md->files[0] = dcp__strdup(name))) {
        rc = dcp__err(&ctx->err, DCP_ENOMEM, "out of memory");
        goto out;
    }
    md->nfiles = 1;
    rc = write_rank(dirfd, name, st, md, file, sync, &ctx->err);
    rc = dcp__comm_agree(ctx->comm, rc, &bad);
    if (rc == DCP_OK && ctx->rank == 0)
        rc = write_metadata(dirfd, path, md, sync, &ctx->err);
    rc = dcp__comm_agree(ctx->comm, rc, &bad);
    if (rc == DCP_OK && ctx->rank == 0)
        remove_old_files(dirfd, old, md);
    else if (rc != DCP_OK && !md_uses_file(old, name))
        (void)dcp__fs_unlink(dirfd, name, NULL);
    if (rc != DCP_OK)
        (void)dcp__err_prefix(&ctx->err, "save to '%s' failed, nothing "
                              "committed", path);
out:
    if (dirfd >= 0)
        (void)close(dirfd);
    dcp__meta_free(md);
    dcp__meta_free(old);
    return rc;
}
