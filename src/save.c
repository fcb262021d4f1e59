/*
 * dcp_save: the state of every rank into one checkpoint directory.
 *
 * The protocol, every step ending with all ranks agreeing on one outcome
 * (comm.h), so that a failure anywhere fails the call everywhere, with the
 * failing rank's message, and nothing is committed:
 *  1. plan: each rank encodes what it holds (plan.c) and pickles its
 *     values; agree.
 *  2. gather the local plans on rank 0, which creates the directory, reads
 *     the committed checkpoint there (if any), builds and checks the global
 *     plan (dedup, writers), names the data files and encodes each rank's
 *     assignment; its verdict is shared.
 *  3. scatter the assignments; each rank writes its records into its data
 *     file (values first, then tensors; a tensor's bytes go from the
 *     caller's buffer straight to the file, with the CRC computed on the
 *     way), fsyncs it; agree.
 *  4. gather each rank's (offset, length) per record on rank 0, which
 *     writes .metadata.tmp, fsyncs it, renames it to .metadata and fsyncs
 *     the directory: the commit; its verdict is shared. On failure every
 *     rank removes the data file it wrote; on success rank 0 removes the
 *     old checkpoint's data files that the new one does not use.
 * With no communicator (one process) the same code runs, each collective
 * degenerating to a local copy.
 *
 * Overwriting: when the directory holds a committed checkpoint that uses
 * any of the data file names this save would use, every rank's file gets
 * the same fresh tag, so the old checkpoint stays loadable until the new
 * .metadata replaces the old one.
 */
#include "ctx.h"

#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "crc32.h"
#include "meta.h"
#include "plan.h"
#include "read.h"
#include "state.h"
#include "storage.h"
#include "torchzip.h"

#define WBUF_FLUSH ((size_t)4 << 20)  /* pending small writes flushed here */
#define DIRECT_MIN ((size_t)64 << 10) /* data this large goes straight out */
#define ITEM_ALIGN 64                 /* torch.save's record alignment */

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
        rc = dcp__fs_pwrite(w->fd, w->pend.p, w->pend.len, w->off - w->pend.len,
                            w->name, w->err);
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

/* Writes a value record from its pickle; *off and *len get its extent. */
static int write_value(struct wfile *w, const struct st_entry *se,
                       const struct dcp_buf *pkl, uint64_t *off, uint64_t *len)
{
    struct tz_writer z;
    int rc = tz_writer_init(&z, w->off, ITEM_ALIGN);
    if (rc == DCP_OK)
        rc = tz_value_item(&z, pkl->p, pkl->len);
    *off = w->off;
    if (rc == DCP_OK)
        rc = wf_drain(w, &z);
    else
        rc = dcp__err(w->err, rc, "cannot encode value '%s'", se->key);
    *len = w->off - *off;
    tz_writer_release(&z);
    return rc;
}

static int write_box(struct wfile *w, const struct st_entry *se,
                     const struct st_box *b, uint64_t *off, uint64_t *len)
{
    uint64_t nbytes =
        dcp__box_numel(se->ndim, b->size) * dcp_dtype_size(se->dtype);
    uint64_t data_off;
    struct tz_writer z;
    uint32_t crc = 0;
    int rc = tz_writer_init(&z, w->off, ITEM_ALIGN);
    *off = w->off;
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
    *len = w->off - *off;
    tz_writer_release(&z);
    return rc;
}

/* Writes this rank's records, in assignment order, into its data file;
 * offlen receives (offset, length) per record. */
static int write_rank(int dirfd, const struct pl_assign *a, const dcp_state *st,
                      const struct pl_local *lp, int sync, uint64_t *offlen,
                      struct dcp_err *err)
{
    struct wfile w;
    size_t i;
    int rc;
    memset(&w, 0, sizeof(w));
    w.name = a->file;
    w.err = err;
    rc = dcp__fs_create(dirfd, a->file, &w.fd, err);
    if (rc != DCP_OK)
        return rc;
    for (i = 0; i < a->n && rc == DCP_OK; i++) {
        const struct st_entry *se = &st->e[a->recs[i].lent];
        if (se->is_tensor)
            rc = write_box(&w, se, &se->boxes[a->recs[i].lbox], &offlen[2 * i],
                           &offlen[2 * i + 1]);
        else
            rc = write_value(&w, se, &lp->pickles[a->recs[i].lent],
                             &offlen[2 * i], &offlen[2 * i + 1]);
    }
    if (rc == DCP_OK)
        rc = wf_flush(&w);
    if (rc == DCP_OK && sync)
        rc = dcp__fs_fsync(w.fd, a->file, err);
    if (rc == DCP_OK)
        rc = dcp__fs_close(w.fd, a->file, err);
    else
        dcp__fs_release(w.fd);
    dcp__buf_free(&w.pend);
    return rc;
}

/* ----------------------------------------------------------- commit */

/* Commits md. *renamed is set once .metadata is in place: from then on a
 * failure (of the directory fsync) no longer means "nothing committed". */
static int write_metadata(int dirfd, const char *path,
                          const struct dcp_metadata *md, int sync, int *renamed,
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
            dcp__fs_release(fd);
    }
    dcp__buf_free(&b);
    /* The commit point: after this rename the new checkpoint exists. */
    if (rc == DCP_OK)
        rc = dcp__fs_rename(dirfd, tmp, ".metadata", err);
    if (rc == DCP_OK)
        *renamed = 1;
    if (rc == DCP_OK && sync)
        rc = dcp__fs_fsync_dir(dirfd, path, err);
    if (rc != DCP_OK)
        (void)dcp__fs_unlink(dirfd, tmp, NULL);
    return rc;
}

static int cmp_name(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A sorted copy of a checkpoint's file names, for membership tests. */
static const char **sorted_files(const struct dcp_metadata *md)
{
    const char **v;
    size_t n = md ? md->nfiles : 0;
    v = dcp__malloc((n ? n : 1) * sizeof(*v));
    if (!v)
        return NULL;
    if (n)
        memcpy(v, md->files, n * sizeof(*v));
    if (n > 1)
        qsort(v, n, sizeof(*v), cmp_name);
    return v;
}

static int has_name(const char **v, size_t n, const char *name)
{
    return n && bsearch(&name, v, n, sizeof(*v), cmp_name) != NULL;
}

/* Removes the old checkpoint's data files that the new one does not use. */
static void remove_old_files(int dirfd, const struct dcp_metadata *old,
                             const struct dcp_metadata *md)
{
    const char **now;
    size_t i;
    if (!old || !old->nfiles)
        return;
    now = sorted_files(md);
    if (!now)
        return; /* leaves garbage, never removes a file in use */
    for (i = 0; i < old->nfiles; i++)
        if (!has_name(now, md->nfiles, old->files[i]))
            (void)dcp__fs_unlink(dirfd, old->files[i], NULL);
    dcp__free(now);
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

/* ------------------------------------------------------ coordinator */

/* Rank 0's side of a save. */
struct coord {
    struct pl_global g;
    struct dcp_metadata *old; /* the committed checkpoint there, if any */
    int old_unknown;          /* there is one, but it could not be read */
    int dirfd;
    int *fidx;          /* per rank: its file's index in md->files, or -1 */
    struct dcp_buf asg; /* every rank's assignment, back to back */
    size_t *alens;
    size_t *adispls;
};

static void coord_release(struct coord *co)
{
    dcp__plan_global_release(&co->g);
    dcp__meta_free(co->old);
    if (co->dirfd >= 0)
        dcp__fs_release(co->dirfd);
    dcp__free(co->fidx);
    dcp__buf_free(&co->asg);
    dcp__free(co->alens);
    dcp__free(co->adispls);
}

/* Names the data file of every rank that writes: __<r>_0.distcp, or with
 * one fresh tag for all when the committed checkpoint uses such a name. */
static int name_files(struct coord *co, struct dcp_err *err)
{
    struct dcp_metadata *md = co->g.md;
    const char **old = sorted_files(co->old);
    size_t nold = co->old ? co->old->nfiles : 0;
    char name[96], tag[24];
    int r, n = co->g.nranks, need_tag = co->old_unknown, rc = DCP_OK;
    co->fidx = dcp__malloc((size_t)n * sizeof(*co->fidx));
    md->files = dcp__calloc((size_t)n, sizeof(*md->files));
    if (!old || !co->fidx || !md->files) {
        dcp__free(old);
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    }
    for (r = 0; r < n && !need_tag; r++) {
        (void)snprintf(name, sizeof(name), "__%d_0.distcp", r);
        need_tag = co->g.recbase[r + 1] > co->g.recbase[r] &&
                   has_name(old, nold, name);
    }
    dcp__free(old);
    if (need_tag)
        random_tag(tag, sizeof(tag));
    for (r = 0; r < n && rc == DCP_OK; r++) {
        co->fidx[r] = -1;
        if (co->g.recbase[r + 1] == co->g.recbase[r])
            continue;
        if (need_tag)
            (void)snprintf(name, sizeof(name), "__%d_0.%.8s.distcp", r, tag);
        else
            (void)snprintf(name, sizeof(name), "__%d_0.distcp", r);
        md->files[md->nfiles] = dcp__strdup(name);
        if (!md->files[md->nfiles])
            rc = dcp__err(err, DCP_ENOMEM, "out of memory");
        else
            co->fidx[r] = (int)md->nfiles++;
    }
    return rc;
}

static int encode_assignments(struct coord *co, struct dcp_err *err)
{
    int r, n = co->g.nranks, rc = DCP_OK;
    co->alens = dcp__malloc((size_t)n * sizeof(*co->alens));
    co->adispls = dcp__malloc((size_t)n * sizeof(*co->adispls));
    if (!co->alens || !co->adispls)
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    for (r = 0; r < n && rc == DCP_OK; r++) {
        const char *file = co->fidx[r] >= 0 ? co->g.md->files[co->fidx[r]] : "";
        co->adispls[r] = co->asg.len;
        rc = dcp__plan_assign_encode(&co->g, r, file, &co->asg);
        co->alens[r] = co->asg.len - co->adispls[r];
    }
    return rc == DCP_OK ? DCP_OK
                        : dcp__err(err, rc, "out of memory planning the save");
}

/* Step 2 on rank 0: plan, directory, file names, assignments. */
static int coord_plan(dcp_ctx *ctx, struct coord *co, const char *path,
                      const uint8_t *blobs, const size_t *lens,
                      const size_t *displs)
{
    int rc =
        dcp__plan_global(blobs, lens, displs, ctx->size, &co->g, &ctx->err);
    if (rc == DCP_OK)
        rc = dcp__fs_mkdirs(path, &ctx->err);
    if (rc == DCP_OK)
        rc = dcp__fs_open_dir(path, &co->dirfd, &ctx->err);
    if (rc != DCP_OK)
        return rc;
    /* A committed checkpoint here stays loadable until ours commits. One
     * whose .metadata cannot be read now (an I/O error, a limit) may still
     * be loadable: its file names are unknown, so ours get a fresh tag. */
    if (dcp__fs_exists(co->dirfd, ".metadata")) {
        struct dcp_err ignore;
        if (dcp__rd_metadata(co->dirfd, path, ctx->max_metadata_bytes, &co->old,
                             &ignore) != DCP_OK) {
            co->old = NULL;
            co->old_unknown = 1;
        }
    }
    rc = name_files(co, &ctx->err);
    return rc == DCP_OK ? encode_assignments(co, &ctx->err) : rc;
}

/* Step 4 on rank 0: every rank's record extents into the plan, commit. */
static int coord_commit(dcp_ctx *ctx, struct coord *co, const char *path,
                        const uint8_t *blobs, const size_t *lens,
                        const size_t *displs, int sync, int *renamed)
{
    struct dcp_metadata *md = co->g.md;
    char save_id[40];
    int r, rc = DCP_OK;
    for (r = 0; r < ctx->size && rc == DCP_OK; r++)
        rc = dcp__plan_results_apply(
            &co->g, r, co->fidx[r] >= 0 ? (uint32_t)co->fidx[r] : 0,
            blobs + displs[r], lens[r], &ctx->err);
    if (rc != DCP_OK)
        return rc;
    random_tag(save_id, sizeof(save_id));
    md->save_id = dcp__strdup(save_id);
    md->checkpoint_id = dcp__strdup(path);
    if (!md->save_id || !md->checkpoint_id)
        return dcp__err(&ctx->err, DCP_ENOMEM, "out of memory");
    return write_metadata(co->dirfd, path, md, sync, renamed, &ctx->err);
}

/* ------------------------------------------------------------ ranks */

/* Step 3 on every rank: write what the assignment says; *res receives
 * the record extents to send back. */
static int write_step(dcp_ctx *ctx, const dcp_state *st,
                      const struct pl_local *lp, const char *path,
                      const uint8_t *mine, size_t len, int sync,
                      struct pl_assign *a, int *dirfd, struct dcp_buf *res,
                      int *wrote)
{
    uint64_t *offlen = NULL;
    int rc = dcp__plan_assign_decode(mine, len, st, a, &ctx->err);
    if (rc != DCP_OK)
        return rc;
    if (a->n) {
        offlen = dcp__calloc(2 * a->n, sizeof(*offlen));
        if (!offlen)
            return dcp__err(&ctx->err, DCP_ENOMEM, "out of memory");
        if (*dirfd < 0)
            rc = dcp__fs_open_dir(path, dirfd, &ctx->err);
        *wrote = rc == DCP_OK;
        if (rc == DCP_OK)
            rc = write_rank(*dirfd, a, st, lp, sync, offlen, &ctx->err);
    }
    if (rc == DCP_OK && dcp__plan_results_encode(offlen, a->n, res) != DCP_OK)
        rc = dcp__err(&ctx->err, DCP_ENOMEM, "out of memory");
    dcp__free(offlen);
    return rc;
}

/* Tells every rank whether rank 0's failed commit got past the rename. */
static void share_renamed(const dcp_comm *c, int *renamed)
{
    int64_t v = *renamed;
    if (dcp__comm_bcast(c, &v, sizeof(v), 0, NULL) == DCP_OK)
        *renamed = (int)v;
    else
        *renamed = 1; /* unsure: keep the files */
}

int dcp_save(dcp_ctx *ctx, const dcp_state *st, const char *path,
             const dcp_save_options *opts)
{
    struct pl_local lp;
    struct pl_assign a;
    struct coord co;
    struct dcp_buf res = {0};
    const dcp_comm *c;
    uint8_t *blobs = NULL, *mine = NULL;
    size_t *lens = NULL, *displs = NULL, minelen = 0;
    int rc = DCP_OK, sync = 1, dirfd = -1, wrote = 0, renamed = 0;
    if (!ctx)
        return DCP_EINVAL;
    dcp__ctx_begin(ctx);
    c = ctx->comm;
    memset(&lp, 0, sizeof(lp));
    memset(&a, 0, sizeof(a));
    memset(&co, 0, sizeof(co));
    co.dirfd = -1;
    if (!st || !path || !*path)
        rc = dcp__err(&ctx->err, DCP_EINVAL, "save: state and path needed");
    if (opts && opts->struct_size >= sizeof(dcp_save_options))
        sync = !opts->no_fsync;
    /* 1. Local plans. */
    if (rc == DCP_OK)
        rc = dcp__plan_local(st, &lp, &ctx->err);
    rc = dcp__comm_agree_err(c, rc, &ctx->err);
    if (rc == DCP_OK)
        rc = dcp__comm_same_string(c, path, "checkpoint path", &ctx->err);
    if (rc == DCP_OK)
        rc = dcp__comm_gather_blob(c, lp.blob.p, lp.blob.len, 0, &blobs, &lens,
                                   &displs, &ctx->err);
    if (rc != DCP_OK)
        goto out;
    /* 2. The global plan, on rank 0. */
    if (ctx->rank == 0) {
        rc = coord_plan(ctx, &co, path, blobs, lens, displs);
        if (rc != DCP_OK && rc != DCP_EPLAN && ctx->size > 1)
            (void)dcp__err_prefix(&ctx->err, "rank 0 failed");
        dcp__free(blobs);
        dcp__free(lens);
        dcp__free(displs);
        blobs = NULL;
        lens = displs = NULL;
        dirfd = co.dirfd;
    }
    rc = dcp__comm_share_err(c, rc, &ctx->err, 0);
    if (rc == DCP_OK)
        rc = dcp__comm_scatter_blob(c, co.asg.p, co.alens, co.adispls, 0, &mine,
                                    &minelen, &ctx->err);
    if (rc != DCP_OK)
        goto out;
    /* 3. Every rank writes its records. */
    rc = write_step(ctx, st, &lp, path, mine, minelen, sync, &a, &dirfd, &res,
                    &wrote);
    rc = dcp__comm_agree_err(c, rc, &ctx->err);
    if (rc == DCP_OK)
        rc = dcp__comm_gather_blob(c, res.p, res.len, 0, &blobs, &lens, &displs,
                                   &ctx->err);
    if (rc != DCP_OK)
        goto out;
    /* 4. Commit, on rank 0, once every rank's data is durable. */
    if (ctx->rank == 0) {
        rc = coord_commit(ctx, &co, path, blobs, lens, displs, sync, &renamed);
        /* Before anyone returns, so the directory holds exactly the new
         * checkpoint when the call ends on any rank. */
        if (rc == DCP_OK)
            remove_old_files(co.dirfd, co.old, co.g.md);
        else if (ctx->size > 1)
            (void)dcp__err_prefix(&ctx->err, "rank 0 failed");
    }
    rc = dcp__comm_share_err(c, rc, &ctx->err, 0);
    if (rc != DCP_OK && ctx->size > 1)
        share_renamed(c, &renamed);
out:
    if (rc != DCP_OK && wrote && !renamed)
        (void)dcp__fs_unlink(dirfd, a.file, NULL);
    if (rc != DCP_OK && renamed)
        (void)dcp__err_prefix(&ctx->err,
                              "save to '%s' failed after .metadata was "
                              "renamed into place; the new checkpoint may "
                              "not be durable",
                              path);
    else if (rc != DCP_OK && path)
        (void)dcp__err_prefix(&ctx->err,
                              "save to '%s' failed, nothing committed", path);
    else if (rc != DCP_OK)
        (void)dcp__err_prefix(&ctx->err, "save failed, nothing committed");
    if (dirfd >= 0 && dirfd != co.dirfd)
        dcp__fs_release(dirfd);
    coord_release(&co);
    dcp__plan_assign_release(&a);
    dcp__plan_local_release(&lp);
    dcp__buf_free(&res);
    dcp__free(mine);
    dcp__free(blobs);
    dcp__free(lens);
    dcp__free(displs);
    return rc;
}
