/*
 * dcp_save: the state of every rank into one checkpoint directory.
 *
 * The protocol, every step ending with all ranks agreeing on one outcome
 * (comm.h), so that a failure anywhere fails the call everywhere, with the
 * failing rank's message, and nothing is committed:
 *  1. plan: each rank encodes what it holds (plan.c) and pickles its
 *     values; agree.
 *  2. gather the local plans on rank 0, which creates the directory, takes
 *     its one-writer lock (lock.h: DCP_EBUSY when another writer holds
 *     it), reads the committed checkpoint there (if any), removes the
 *     leftovers of interrupted writers, builds and checks the global plan
 *     (dedup, writers), picks the save id, names the data files and
 *     encodes each rank's assignment; its verdict and the save id are
 *     shared.
 *  3. scatter the assignments; each rank writes its records into its data
 *     file (values first, then tensors; a tensor's bytes go from the
 *     caller's buffer straight to the file, with the CRC computed on the
 *     way; the save id in every record's save-id field), fsyncs it; agree.
 *  4. gather each rank's (offset, length) per record on rank 0, which
 *     writes .metadata.tmp, fsyncs it, renames it to .metadata and fsyncs
 *     the directory: the commit (commit.c); its verdict is shared. On
 *     failure every rank removes the data file it wrote; on success rank 0
 *     removes the old checkpoint's data files that the new one does not
 *     use. Rank 0 releases the lock when the job is freed.
 * With no communicator (one process) the same code runs, each collective
 * degenerating to a local copy.
 *
 * Rank-local (DCP_SAVE_RANK_LOCAL, docs/FORMAT.md §9.2): step 2's global
 * plan only checks; rank 0 refuses a directory holding a checkpoint
 * (DCP_EEXIST); instead of the scatter each rank plans its own items
 * alone (prepare_rl), and step 4 is each rank publishing its own
 * __<r>.metadata, the outcome agreed (commit_rl).
 *
 * Threads (save.h): steps 1-2 and 4 run on the caller's thread; step 3's
 * writing runs on the context's worker thread, from a self-contained
 * description of the records (sv_rec) and, for the tensors an
 * asynchronous save staged, from the staging pipe (stage.c), never from
 * the caller's state. Step 3's agreement opens step 4, in
 * dcp__save_finish.
 *
 * Overwriting: when the directory holds a committed checkpoint, every
 * rank's file is named with the save id (fresh names for every overwrite,
 * never one the old checkpoint uses), so the old checkpoint stays loadable
 * until the new .metadata replaces the old one, and a reader holding the
 * old .metadata never opens a file of the new save.
 */
#include "save.h"

#include <fcntl.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stddef.h> /* offsetof */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "commit.h"
#include "crc32.h"
#include "ioengine.h"
#include "lock.h"
#include "meta.h"
#include "plan.h"
#include "planner.h"
#include "ranklocal.h"
#include "read.h"
#include "stage.h"
#include "state.h"
#include "storage.h"
#include "torchzip.h"
#include "zframe.h"

#define ITEM_ALIGN 64 /* torch.save's record alignment */

/* ----------------------------------------------------------- writer */

/* One record this rank writes, described without the caller's state (which
 * an asynchronous save no longer sees once the writing starts). */
struct sv_rec {
    char *key;
    int is_tensor;
    dcp_dtype dtype;
    int ndim;
    int64_t size[DCP_MAX_NDIM];
    uint64_t nbytes;
    const void *src; /* the caller's buffer: valid during dcp__save_begin
                        and, for a dcp_save, until it returns */
    dcp_mem mem;
    size_t stage;  /* staging source index + 1; 0: written from src */
    size_t pickle; /* values: index into lp.pickles */
    /* A strided box (dcp_state_add_tensor_strided): src's element strides;
     * always staged, gathered by gather_rec. */
    int strided;
    int64_t stride[DCP_MAX_NDIM];
};

/* The staging copy of a strided record: bytes [off, off + len) of its
 * packed image. */
static void gather_rec(const void *ud, uint64_t off, uint64_t len, void *dst)
{
    const struct sv_rec *r = ud;
    dcp__box_gather(r->ndim, dcp_dtype_size(r->dtype), r->size, r->stride,
                    r->src, off, len, dst);
}

/* Test hook: the k-th data file write from now on fails. */
static _Atomic uint64_t wfail_count, wfail_at;

uint64_t dcp__save_write_fail_after(uint64_t k)
{
    uint64_t n = atomic_exchange(&wfail_count, 0);
    atomic_store(&wfail_at, k);
    return n;
}

/*
 * The hook's check before each write into the engine: on the k-th, the
 * writer's sticky error is set (nothing in flight is abandoned).
 */
static int wf_hook(struct io_writer *w)
{
    uint64_t k = atomic_load(&wfail_at);
    if (w->rc == DCP_OK && k && atomic_fetch_add(&wfail_count, 1) + 1 >= k)
        w->rc = dcp__err(w->err, DCP_EIO,
                         "cannot write '%s' at byte %llu: injected failure",
                         w->name, (unsigned long long)w->off);
    return w->rc;
}

/*
 * The bytes go through the I/O engine (ioengine.h): records start on
 * ITEM_ALIGN file offsets (zero bytes between them) and a tensor's data on
 * an IO_DATA_ALIGN one (padding in the zip extra field), so the engine can
 * write tensor data straight from the caller's buffer with O_DIRECT.
 */

/* Moves what the zip writer produced into the file. */
static int wf_drain(struct io_writer *w, struct tz_writer *z)
{
    int rc = dcp__iow_put(w, z->out.p, z->out.len);
    z->out.len = 0;
    return rc;
}

/* Pads the file to the next record boundary and starts a record there. */
static int wf_record(struct io_writer *w, struct tz_writer *z, const char *sid)
{
    int rc = dcp__iow_zero(
        w, (size_t)((ITEM_ALIGN - w->off % ITEM_ALIGN) % ITEM_ALIGN));
    if (rc == DCP_OK)
        rc = dcp__tz_writer_init(z, w->off, ITEM_ALIGN);
    if (rc == DCP_OK)
        rc = dcp__tz_writer_save_id(z, sid);
    if (rc == DCP_OK)
        rc = dcp__tz_writer_stream_align(z, IO_DATA_ALIGN);
    return rc;
}

/* Writes a value record from its pickle; *off and *len get its extent. */
static int write_value(struct io_writer *w, const struct sv_rec *r,
                       const struct dcp_buf *pkl, const char *sid,
                       uint64_t *off, uint64_t *len)
{
    struct tz_writer z;
    int rc = wf_record(w, &z, sid);
    *off = w->off;
    if (rc == DCP_OK)
        rc = dcp__tz_value_item(&z, pkl->p, pkl->len);
    if (rc == DCP_OK)
        rc = wf_drain(w, &z);
    else if (rc != w->rc)
        rc = dcp__err(w->err, rc, "cannot encode value '%s'", r->key);
    *len = w->off - *off;
    dcp__tz_writer_release(&z);
    return rc;
}

/*
 * A staged tensor's bytes, piece by piece from the staging pipe. A piece
 * goes out without a copy when it can (dcp__iow_data), so it is released
 * to the stager only once its writes have completed.
 */
static int put_staged(struct io_writer *w, struct stg_pipe *pipe,
                      const struct sv_rec *r, struct crc_blocks *crc)
{
    uint64_t done = 0, off;
    int rc = DCP_OK;
    while (rc == DCP_OK && done < r->nbytes) {
        const void *p;
        size_t n, src;
        rc = dcp__stage_next(pipe, &p, &n, &src, &off, w->err);
        if (rc != DCP_OK)
            break;
        if (src != r->stage - 1 || off != done || n > r->nbytes - done)
            rc = dcp__err(w->err, DCP_EIO,
                          "staging out of step at '%s' (internal)", r->key);
        if (rc == DCP_OK)
            rc = wf_hook(w);
        if (rc == DCP_OK)
            rc = dcp__iow_data_blocks(w, p, n, crc);
        if (rc == DCP_OK)
            rc = dcp__iow_wait(w);
        dcp__stage_release(pipe);
        done += n;
    }
    return rc;
}

static int write_box(struct io_writer *w, const struct sv_rec *r,
                     struct stg_pipe *pipe, const char *sid, uint64_t *off,
                     uint64_t *len)
{
    uint64_t nbytes = r->nbytes;
    uint64_t data_off, bsize;
    /* Block CRCs (docs/FORMAT.md §4), unless a record is too large for
     * the field: the whole CRC is derived from them. */
    uint64_t nblk = dcp__tz_block_layout(nbytes, &bsize);
    uint32_t *blk = NULL;
    struct crc_blocks crc;
    struct tz_writer z;
    int rc;
    if (nblk) {
        blk = dcp__malloc((size_t)nblk * sizeof(*blk));
        if (!blk) {
            *off = w->off;
            *len = 0;
            return dcp__err(w->err, DCP_ENOMEM, "out of memory");
        }
    }
    dcp__crcb_init(&crc, bsize, blk, (size_t)nblk);
    rc = wf_record(w, &z, sid);
    *off = w->off;
    if (rc == DCP_OK)
        rc = dcp__tz_tensor_item_begin(&z, r->dtype, r->ndim, r->size, nbytes,
                                  &data_off);
    if (rc != DCP_OK) {
        dcp__tz_writer_release(&z);
        dcp__free(blk);
        if (rc == w->rc)
            return rc;
        return dcp__err(w->err, rc, "cannot encode tensor '%s'", r->key);
    }
    rc = wf_drain(w, &z);
    if (rc == DCP_OK && nbytes && r->stage) {
        rc = put_staged(w, pipe, r, &crc);
    } else if (rc == DCP_OK && nbytes) {
        rc = wf_hook(w);
        if (rc == DCP_OK)
            rc = dcp__iow_data_blocks(w, r->src, (size_t)nbytes, &crc);
    }
    if (rc == DCP_OK) {
        uint32_t whole = dcp__crcb_finish(&crc);
        rc = dcp__tz_tensor_item_end_blocks(&z, whole, bsize, blk,
                                            (size_t)nblk);
        if (rc == DCP_OK)
            rc = wf_drain(w, &z);
        else
            rc = dcp__err(w->err, rc, "cannot encode tensor '%s'", r->key);
    }
    *len = w->off - *off;
    dcp__tz_writer_release(&z);
    dcp__free(blk);
    return rc;
}

/* A tensor record from a packed buffer (parts.c: a save planned
 * elsewhere): the same record write_box writes for an unstaged box. */
int dcp__save_rec_tensor(struct io_writer *w, const char *key, dcp_dtype dt,
                         int ndim, const int64_t *size, const void *src,
                         uint64_t nbytes, const char *sid, uint64_t *off,
                         uint64_t *len)
{
    struct sv_rec r;
    memset(&r, 0, sizeof(r));
    memcpy(&r.key, &key, sizeof(key)); /* only read (messages) */
    r.is_tensor = 1;
    r.dtype = dt;
    r.ndim = ndim;
    if (ndim > 0)
        memcpy(r.size, size, (size_t)ndim * sizeof(*size));
    r.nbytes = nbytes;
    r.src = src;
    return write_box(w, &r, NULL, sid, off, len);
}

/* A record of bytes given whole (parts.c: a byte item, already a
 * torch.save archive), at the next record boundary, copied. */
int dcp__save_rec_bytes(struct io_writer *w, const void *p, size_t n,
                        uint64_t *off, uint64_t *len)
{
    int rc = dcp__iow_zero(
        w, (size_t)((ITEM_ALIGN - w->off % ITEM_ALIGN) % ITEM_ALIGN));
    *off = w->off;
    if (rc == DCP_OK)
        rc = wf_hook(w);
    if (rc == DCP_OK)
        rc = dcp__iow_put(w, p, n);
    *len = w->off - *off;
    return rc;
}

/* An upper bound of the bytes one record of nbytes data takes in a data
 * file: zip structures and alignment (under 16 KiB) and block CRCs. */
uint64_t dcp__save_rec_bound(uint64_t nbytes)
{
    return ((uint64_t)16 << 10) + nbytes + TZ_BLK_HEAD +
           4u * dcp__tz_block_count(nbytes, dcp__tz_block_size(nbytes));
}

/*
 * DCP_SAVE_ZSTD (docs/FORMAT.md §9.1): the record is built in memory as
 * the plain one (torch's 64-byte alignment, one CRC), compressed as one
 * zstd frame and written; *off and *len are the frame's extent.
 */
#define ZSTD_SAVE_LEVEL 3
static int write_zstd(struct io_writer *w, const struct sv_rec *r,
                      struct stg_pipe *pipe, const struct dcp_buf *pkl,
                      const char *sid, uint64_t *off, uint64_t *len)
{
    struct dcp_buf frame = {0};
    struct tz_writer z;
    uint64_t data_off, done = 0;
    int rc = dcp__iow_zero(
        w, (size_t)((ITEM_ALIGN - w->off % ITEM_ALIGN) % ITEM_ALIGN));
    *off = w->off;
    *len = 0;
    if (rc != DCP_OK)
        return rc;
    rc = dcp__tz_writer_init(&z, 0, 64);
    if (rc == DCP_OK)
        rc = dcp__tz_writer_save_id(&z, sid);
    if (rc == DCP_OK && !r->is_tensor)
        rc = dcp__tz_value_item(&z, pkl->p, pkl->len);
    if (rc == DCP_OK && r->is_tensor)
        rc = dcp__tz_tensor_item_begin(&z, r->dtype, r->ndim, r->size,
                                       r->nbytes, &data_off);
    if (rc == DCP_OK && r->is_tensor) {
        uint32_t crc = 0;
        size_t at = z.out.len;
        if (data_off != at)
            rc = dcp__err(w->err, DCP_EIO,
                          "'%s': record layout out of step (internal)",
                          r->key);
        else if (r->nbytes > SIZE_MAX - at ||
            dcp__buf_reserve(&z.out, (size_t)r->nbytes) != DCP_OK)
            rc = DCP_ENOMEM;
        while (rc == DCP_OK && r->stage && done < r->nbytes) {
            const void *p;
            size_t n, src;
            uint64_t soff;
            rc = dcp__stage_next(pipe, &p, &n, &src, &soff, w->err);
            if (rc != DCP_OK)
                break;
            if (src != r->stage - 1 || soff != done || n > r->nbytes - done)
                rc = dcp__err(w->err, DCP_EIO,
                              "staging out of step at '%s' (internal)",
                              r->key);
            else
                memcpy(z.out.p + at + done, p, n);
            dcp__stage_release(pipe);
            done += n;
        }
        if (rc == DCP_OK && !r->stage && r->nbytes)
            memcpy(z.out.p + at, r->src, (size_t)r->nbytes);
        if (rc == DCP_OK) {
            z.out.len += (size_t)r->nbytes;
            crc = dcp__crc32(0, z.out.p + at, (size_t)r->nbytes);
            rc = dcp__tz_tensor_item_end(&z, crc);
        }
    }
    if (rc == DCP_OK)
        rc = dcp__zstd_encode(z.out.p, z.out.len, ZSTD_SAVE_LEVEL, &frame,
                              w->err);
    else if (rc != w->rc && rc != DCP_EIO)
        rc = dcp__err(w->err, rc, "cannot encode '%s'", r->key);
    dcp__tz_writer_release(&z);
    if (rc == DCP_OK)
        rc = wf_hook(w);
    if (rc == DCP_OK)
        rc = dcp__iow_put(w, frame.p, frame.len); /* copies */
    dcp__buf_free(&frame);
    *len = w->off - *off;
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
void dcp__save_remove_old(int dirfd, const struct dcp_metadata *old,
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

void dcp__save_random_tag(char *out, size_t n)
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
    int old_rl;               /* it is a rank-local one (no .metadata) */
    int dirfd;
    struct dcp__lock lock; /* the path's one-writer lock (lock.h) */
    int *fidx;          /* per rank: its file's index in md->files, or -1 */
    char sid[24];       /* this save's id (records, .metadata) */
    char tag[24];       /* the data files' fresh tag, "" when none */
    struct dcp_buf asg; /* every rank's assignment, back to back */
    size_t *alens;
    size_t *adispls;
};

static void coord_release(struct coord *co)
{
    dcp__plan_global_release(&co->g);
    dcp__meta_free(co->old);
    dcp__lock_release(&co->lock);
    if (co->dirfd >= 0)
        dcp__fs_release(co->dirfd);
    dcp__free(co->fidx);
    dcp__buf_free(&co->asg);
    dcp__free(co->alens);
    dcp__free(co->adispls);
}

/* Rank r's data file name, with tag ("" for none). */
static void file_name(char *out, size_t n, int r, const char *tag)
{
    if (*tag)
        (void)snprintf(out, n, "__%d_0.%.16s.distcp", r, tag);
    else
        (void)snprintf(out, n, "__%d_0.distcp", r);
}

/* Names the data file of every rank that writes: __<r>_0.distcp into a
 * directory without a committed checkpoint, else __<r>_0.<save id>.distcp:
 * fresh names for every overwrite (never a name the committed checkpoint
 * uses, never one an earlier save used), so a reader holding an old
 * .metadata reads the old files or finds them gone. A cached plan's
 * previous names are dropped first. */
static int name_files(struct coord *co, struct dcp_err *err)
{
    struct dcp_metadata *md = co->g.md;
    const char **old = sorted_files(co->old);
    size_t nold = co->old ? co->old->nfiles : 0, i;
    char name[96];
    int r, n = co->g.nranks, need_tag = co->old_unknown, rc = DCP_OK;
    for (i = 0; i < md->nfiles; i++)
        dcp__free(md->files[i]);
    dcp__free(md->files);
    md->files = NULL;
    md->nfiles = 0;
    dcp__free(co->fidx);
    co->tag[0] = '\0';
    co->fidx = dcp__malloc((size_t)n * sizeof(*co->fidx));
    md->files = dcp__calloc((size_t)n, sizeof(*md->files));
    if (!old || !co->fidx || !md->files) {
        dcp__free(old);
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    }
    need_tag = need_tag || co->old != NULL;
    if (need_tag)
        (void)snprintf(co->tag, sizeof(co->tag), "%s", co->sid);
    for (r = 0; r < n && need_tag; r++) {
        file_name(name, sizeof(name), r, co->tag);
        if (has_name(old, nold, name)) { /* 2^-64: a new id, and again */
            dcp__save_random_tag(co->sid, sizeof(co->sid));
            (void)snprintf(co->tag, sizeof(co->tag), "%s", co->sid);
            r = -1;
        }
    }
    dcp__free(old);
    for (r = 0; r < n && rc == DCP_OK; r++) {
        co->fidx[r] = -1;
        if (co->g.recbase[r + 1] == co->g.recbase[r])
            continue;
        file_name(name, sizeof(name), r, co->tag);
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
/* Rank 0: the directory made and opened, the save's id drawn, and the
 * one-writer lock taken, from here to the commit (lock.h). */
static int coord_open(dcp_ctx *ctx, struct coord *co, const char *path)
{
    int rc = dcp__fs_mkdirs(path, &ctx->err);
    if (rc == DCP_OK)
        rc = dcp__fs_open_dir(path, &co->dirfd, &ctx->err);
    dcp__save_random_tag(co->sid, sizeof(co->sid));
    if (rc == DCP_OK)
        rc = dcp__lock_acquire(co->dirfd, path, co->sid, 0, &co->lock,
                               &ctx->err);
    return rc;
}

/* Step 2's directory part on rank 0, with a plan in co->g (new or
 * cached): the directory, the committed checkpoint there, file names. */
static int coord_dir(dcp_ctx *ctx, struct coord *co, const char *path)
{
    int rc = coord_open(ctx, co, path);
    if (rc != DCP_OK)
        return rc;
    /* A committed checkpoint here stays loadable until ours commits. One
     * whose .metadata cannot be read now (an I/O error, a limit) may still
     * be loadable: its file names are unknown, so ours get a fresh tag.
     * (.metadata read at once, not tested first: one request on S3.) */
    struct dcp_err ignore;
    uint8_t *md = NULL;
    size_t mdlen = 0;
    rc = dcp__fs_read_all(co->dirfd, ".metadata", ctx->max_metadata_bytes, &md,
                          &mdlen, &ignore);
    if (rc == DCP_OK) {
        if (dcp__meta_decode(md, mdlen, &co->old, &ignore) != DCP_OK) {
            co->old = NULL;
            co->old_unknown = 1;
        }
        dcp__free(md);
    } else if (rc != DCP_ENOENT) {
        co->old_unknown = 1;
    } else if (dcp__fs_exists(co->dirfd, "__0.metadata")) {
        /* A rank-local checkpoint (torch's use_collectives=False, or
         * DCP_SAVE_RANK_LOCAL): its data files have our names, so ours
         * get a fresh tag; it is removed once ours committed. */
        co->old_unknown = 1;
        co->old_rl = 1;
    }
    /* Leftovers of interrupted saves: named by no committed .metadata,
     * and no live writer (we hold the lock). Best effort: a failure here
     * leaves them for the next save or dcptool clean. */
    if (!co->old_unknown &&
        dcp__clean_leftovers(co->dirfd, path, co->old, 0, NULL, NULL,
                             &ctx->err) != DCP_OK)
        dcp__err_clear(&ctx->err);
    return name_files(co, &ctx->err);
}

static int coord_plan(dcp_ctx *ctx, struct coord *co, const char *path,
                      const dcp_save_planner *planner, const uint8_t *blobs,
                      const size_t *lens, const size_t *displs)
{
    int rc = dcp__planner_plan_global(planner, blobs, lens, displs,
                                      ctx->size, &co->g, &ctx->err);
    if (rc == DCP_OK)
        rc = coord_dir(ctx, co, path);
    return rc == DCP_OK ? encode_assignments(co, &ctx->err) : rc;
}

/* Step 2's directory part on rank 0 for a rank-local save: the
 * directory, the one-writer lock, no checkpoint there (DCP_EEXIST: the
 * ranks commit one by one, so an old checkpoint could not stay loadable
 * meanwhile), interrupted writers' leftovers removed. */
static int coord_dir_rl(dcp_ctx *ctx, struct coord *co, const char *path)
{
    char name[32];
    int found, rc = coord_open(ctx, co, path);
    if (rc == DCP_OK)
        rc = dcp__fs_exists_err(co->dirfd, ".metadata", &found, &ctx->err);
    if (rc != DCP_OK)
        return rc;
    if (found)
        return dcp__err(&ctx->err, DCP_EEXIST,
                        "'%s' already holds a checkpoint (.metadata): a "
                        "rank-local save does not overwrite one (remove it "
                        "or save elsewhere)",
                        path);
    /* A rank file of any rank, also beyond this world size (one left by
     * a larger or failed save), would be read with this save's files. */
    rc = dcp__rl_find_any(co->dirfd, (uint32_t)ctx->size, name, sizeof(name),
                          &ctx->err);
    if (rc != DCP_OK)
        return rc;
    if (name[0])
        return dcp__err(&ctx->err, DCP_EEXIST,
                        "'%s' already holds a checkpoint or rank-local "
                        "metadata of another save (%s): a rank-local save "
                        "does not write beside it (remove it or save "
                        "elsewhere)",
                        path, name);
    if (dcp__clean_leftovers(co->dirfd, path, NULL, 0, NULL, NULL,
                             &ctx->err) != DCP_OK)
        dcp__err_clear(&ctx->err);
    return DCP_OK;
}

/* Step 2 on rank 0 for a rank-local save: the global plan only checks
 * (every rank then plans its own items, prepare_rl); the directory. */
static int coord_plan_rl(dcp_ctx *ctx, struct coord *co, const char *path,
                         const dcp_save_planner *planner, const uint8_t *blobs,
                         const size_t *lens, const size_t *displs)
{
    int rc = dcp__planner_plan_global(planner, blobs, lens, displs,
                                      ctx->size, &co->g, &ctx->err);
    return rc == DCP_OK ? coord_dir_rl(ctx, co, path) : rc;
}

/* What a plan's metadata gets at every commit: the transform of every
 * chunk (set again: a cached plan's md), the save id (the records') and
 * the checkpoint id. */
static int finish_md(struct dcp_metadata *md, const char *sid,
                     const char *path, int zstd, struct dcp_err *err)
{
    size_t k, j;
    for (k = 0; k < md->n; k++)
        for (j = 0; j < md->e[k].nchunks; j++)
            md->e[k].chunks[j].xform = zstd ? MD_XFORM_ZSTD : MD_XFORM_NONE;
    dcp__free(md->save_id); /* a cached plan's, from the previous save */
    dcp__free(md->checkpoint_id);
    md->save_id = dcp__strdup(sid);
    md->checkpoint_id = dcp__strdup(path);
    if (!md->save_id || !md->checkpoint_id)
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    return DCP_OK;
}

/* Step 4 on rank 0: every rank's record extents into the plan, commit. */
static int coord_commit(dcp_ctx *ctx, struct coord *co, const char *path,
                        const uint8_t *blobs, const size_t *lens,
                        const size_t *displs, int sync, int zstd,
                        int *renamed)
{
    struct dcp_metadata *md = co->g.md;
    int r, rc = DCP_OK;
    for (r = 0; r < ctx->size && rc == DCP_OK; r++)
        rc = dcp__plan_results_apply(
            &co->g, r, co->fidx[r] >= 0 ? (uint32_t)co->fidx[r] : 0,
            blobs + displs[r], lens[r], &ctx->err);
    if (rc != DCP_OK)
        return rc;
    rc = finish_md(md, co->sid, path, zstd, &ctx->err);
    if (rc != DCP_OK)
        return rc;
    return dcp__commit_metadata(co->dirfd, path, md, sync, renamed, &ctx->err);
}

/* ------------------------------------------------------- plan cache */

/*
 * The plan of the last successful save on a context, kept for the next
 * one: when every rank's local plan has the same structure as then (keys,
 * paths, kinds, dtypes, shapes, boxes, value sizes: everything the global
 * plan depends on; not the values' contents, not buffer addresses), the
 * global plan and every assignment are the same, so the save skips the
 * gather, the global plan and the scatter (dcp__save_begin). What depends
 * on the path (the directory, the committed checkpoint there, the file
 * names and their tag) and on the data (record extents, .metadata's
 * storage fields, its save_id) is redone every save.
 *
 * Safety: a save takes the cache off the context at its start and gives
 * it back only when it succeeded on every rank (the agreed outcome), so a
 * failed save leaves none; the decision to use it is one allreduce, so
 * every rank decides alike, and any rank without a matching cache makes
 * every rank plan afresh.
 */
struct sv_cache {
    struct dcp_buf sblob; /* this rank's local plan, value hashes zeroed */
    struct pl_rec *recs;  /* this rank's assignment */
    size_t n;
    uint64_t gen;       /* ctx->saves when it was kept */
    struct pl_global g; /* rank 0: the global plan */
    int *fidx;          /* rank 0: per rank, its file in g.md->files */
};

static void cache_free(struct sv_cache *c)
{
    if (!c)
        return;
    dcp__buf_free(&c->sblob);
    dcp__free(c->recs);
    dcp__plan_global_release(&c->g);
    dcp__free(c->fidx);
    dcp__free(c);
}

void dcp__save_cache_drop(dcp_ctx *ctx)
{
    cache_free(ctx->plan_cache);
    ctx->plan_cache = NULL;
}

/* ------------------------------------------------------------ ranks */

/*
 * One save from begin to finish. The caller's thread owns it, except while
 * the worker runs dcp__save_write: then the worker owns file, offlen and
 * wrote, and both sides share only the pipe and the sticky error.
 */
struct sv_job {
    char *path;
    int sync;
    struct pl_local lp;
    struct coord co; /* rank 0 */
    int dirfd;       /* co.dirfd on rank 0 */
    char *file;      /* this rank's data file; NULL: nothing to write */
    char sid[24];    /* the save id (rank 0's co.sid), into every record */
    struct sv_rec *recs;
    size_t nrecs;
    uint64_t *offlen; /* (offset, length) per record */
    struct stg_src *srcs;
    size_t nsrcs;
    struct stg_pipe *pipe;
    int wrote;    /* the data file was created */
    int finished; /* dcp__save_finish ran: files are settled */
    /* Plan cache: this rank's assignment (kept for the next save), the
     * context's cache taken for this save (given back on success), and
     * DCP_SAVE_NO_PLAN_CACHE. */
    struct pl_rec *arecs;
    size_t narecs;
    struct sv_cache *cache;
    int nocache;
    int zstd; /* DCP_SAVE_ZSTD: records as zstd frames (FORMAT.md §9.1) */
    /* DCP_SAVE_RANK_LOCAL (FORMAT.md §9.2): this rank's own plan (every
     * item it holds, into its own file) and the name of its metadata. */
    int ranklocal;
    struct pl_global rl;
    char mdname[32];
    int rl_left; /* after a failure: the lowest rank whose __<r>.metadata
                    could not be removed, or -1 */
    const dcp_save_planner *planner; /* borrowed for begin; NULL: default */
    /* The context's I/O engine (borrowed; set on the caller's thread, used
     * by the worker only while it writes) and its figures for this save,
     * copied to the context's report at the finish. */
    struct io_eng *io;
    struct io_stats iost;
    int have_iost;
    /* Phases WRITE and FSYNC, timed on the worker (its events there). */
    struct dcp__phrec ph;
    /* First error wins (c-style.md 4); msg written by the winner only,
     * read once both sides are done. */
    _Atomic int rc;
    struct dcp_err err;
};

int dcp__save_fail(struct sv_job *job, int rc, const struct dcp_err *e)
{
    int expected = DCP_OK;
    if (rc == DCP_OK)
        return DCP_OK;
    if (atomic_compare_exchange_strong(&job->rc, &expected, rc)) {
        job->err.code = rc;
        if (e && e->msg[0])
            memcpy(job->err.msg, e->msg, sizeof(job->err.msg));
        else
            (void)snprintf(job->err.msg, sizeof(job->err.msg), "%s",
                           dcp_strerror(rc));
    }
    if (job->pipe)
        dcp__stage_stop(job->pipe);
    return rc;
}

int dcp__save_failed(struct sv_job *job)
{
    return atomic_load(&job->rc);
}

const char *dcp__save_path(const struct sv_job *job)
{
    return job->path;
}

/* This rank's records, described from the state, for the writer. */
static int build_recs(struct sv_job *job, const dcp_state *st,
                      const struct pl_assign *a, struct dcp_err *err)
{
    size_t i;
    job->recs = dcp__calloc(a->n ? a->n : 1, sizeof(*job->recs));
    job->offlen = dcp__calloc(a->n ? 2 * a->n : 1, sizeof(*job->offlen));
    if (!job->recs || !job->offlen)
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    for (i = 0; i < a->n; i++) {
        const struct st_entry *se = &st->e[a->recs[i].lent];
        struct sv_rec *r = &job->recs[i];
        r->key = dcp__strdup(se->key);
        if (!r->key)
            return dcp__err(err, DCP_ENOMEM, "out of memory");
        job->nrecs = i + 1;
        r->is_tensor = se->is_tensor;
        if (se->is_tensor) {
            const struct st_box *b = &se->boxes[a->recs[i].lbox];
            r->dtype = se->dtype;
            r->ndim = se->ndim;
            memcpy(r->size, b->size, sizeof(r->size));
            r->nbytes =
                dcp__box_numel(se->ndim, b->size) * dcp_dtype_size(se->dtype);
            r->src = b->buf;
            r->mem = se->mem;
            r->strided = b->strided;
            if (b->strided)
                memcpy(r->stride, b->stride, sizeof(r->stride));
        } else {
            r->pickle = a->recs[i].lent;
        }
    }
    return DCP_OK;
}

/* Local preparation after the assignment arrived: decode it, describe the
 * records, open the directory, get the I/O engine ready. A failure here is
 * the job's, agreed on in dcp__save_finish. */
static int prepare_recs(dcp_ctx *ctx, struct sv_job *job, const dcp_state *st,
                        struct pl_assign *a)
{
    int rc = build_recs(job, st, a, &ctx->err);
    if (rc == DCP_OK && a->n) {
        job->file = a->file;
        a->file = NULL;
        if (job->dirfd < 0)
            rc = dcp__fs_open_dir(job->path, &job->dirfd, &ctx->err);
        if (rc == DCP_OK)
            rc = dcp__ctx_io_begin(ctx, job->dirfd, &job->io);
    }
    job->arecs = a->recs; /* for the plan cache */
    job->narecs = a->n;
    a->recs = NULL;
    dcp__plan_assign_release(a);
    return rc;
}

static int prepare(dcp_ctx *ctx, struct sv_job *job, const dcp_state *st,
                   const uint8_t *mine, size_t len)
{
    struct pl_assign a;
    int rc = dcp__plan_assign_decode(mine, len, st, &a, &ctx->err);
    return rc == DCP_OK ? prepare_recs(ctx, job, st, &a) : rc;
}

/*
 * A rank-local save's step 3a, on every rank once rank 0's checks passed:
 * this rank plans its own items alone (every box and value it holds, its
 * boxes need not tile: PL_NO_TILING), as torch's use_collectives=False
 * does; the plan's metadata is the rank's __<r>.metadata, its records go
 * into __<r>_0.distcp. Local: a failure is the job's.
 */
static int prepare_rl(dcp_ctx *ctx, struct sv_job *job, const dcp_state *st)
{
    struct dcp_buf asg = {0};
    struct dcp_metadata *md;
    size_t zero = 0, len = job->lp.blob.len;
    char name[48];
    int rc = dcp__plan_global_ex(job->lp.blob.p, &len, &zero, 1, PL_NO_TILING,
                                 NULL, NULL, &job->rl, &ctx->err);
    if (rc != DCP_OK)
        return rc;
    md = job->rl.md;
    (void)snprintf(name, sizeof(name), "__%d_0.distcp", ctx->rank);
    if (job->rl.recbase[1] > job->rl.recbase[0]) {
        md->files = dcp__calloc(1, sizeof(*md->files));
        if (md->files)
            md->files[0] = dcp__strdup(name);
        if (!md->files || !md->files[0])
            return dcp__err(&ctx->err, DCP_ENOMEM, "out of memory");
        md->nfiles = 1;
    }
    if (dcp__plan_assign_encode(&job->rl, 0, md->nfiles ? name : "", &asg) !=
        DCP_OK)
        rc = dcp__err(&ctx->err, DCP_ENOMEM, "out of memory planning the save");
    if (rc == DCP_OK)
        rc = prepare(ctx, job, st, asg.p, asg.len);
    dcp__buf_free(&asg);
    if (rc == DCP_OK && job->dirfd < 0) /* a rank with nothing to write */
        rc = dcp__fs_open_dir(job->path, &job->dirfd, &ctx->err);
    return rc;
}

/*
 * Whether this save reuses the cached plan, on every rank alike (reduced
 * by begin_agree): (this rank's cache matches its local plan, the hash of its
 * values' contents and the cache's generation, each with its negation for
 * a maximum). The contents must be equal everywhere, since a new global
 * plan would check that values held by several ranks are equal: ranks
 * holding different values (or a changed one on some rank) plan afresh.
 */
static void cache_vals(const dcp_ctx *ctx, const struct sv_job *job, int ok,
                       int64_t v[7])
{
    const struct sv_cache *c = ok ? job->cache : NULL;
    v[0] = c && !job->nocache && c->gen == ctx->saves &&
           dcp__plan_local_same(&job->lp, &c->sblob);
    v[1] = ok ? (int64_t)(job->lp.vhash >> 1) : 0;
    v[2] = -v[1];
    v[3] = (int64_t)(ctx->saves & INT64_MAX);
    v[4] = -v[3];
    v[5] = ok ? job->ranklocal : 0; /* the same on every rank, or refused */
    v[6] = -v[5];
}

/*
 * Steps 1 and 1b agreed in one allreduce (each costs milliseconds through
 * a Python communicator): every rank's outcome so far (as
 * dcp__comm_agree_err), the same path on every rank (as
 * dcp__comm_same_string) and whether the cached plan serves (cache_vals),
 * checked in that order. Collective; every rank returns the same code.
 */
static int begin_agree(dcp_ctx *ctx, struct sv_job *job, const char *path,
                       int rc, int *hit)
{
    int64_t v[9];
    uint64_t h = dcp__fnv1a64(path ? path : "", path ? strlen(path) : 0);
    *hit = 0;
    v[0] = (int64_t)(h >> 1);
    v[1] = -v[0];
    cache_vals(ctx, job, rc == DCP_OK, v + 2);
    rc = dcp__comm_agree_err_vals(ctx->comm, rc, &ctx->err, v, 9);
    if (rc != DCP_OK)
        return rc;
    if (v[0] != -v[1])
        return dcp__err(&ctx->err, DCP_EINVAL,
                        "not every rank passed the same checkpoint path");
    if (v[7] != -v[8])
        return dcp__err(&ctx->err, DCP_EINVAL,
                        "DCP_SAVE_RANK_LOCAL is set on some ranks only (pass "
                        "the same flags on every rank)");
    *hit = v[2] == 1 && v[3] == -v[4] && v[5] == -v[6];
    return DCP_OK;
}

static int hex_tag(const uint8_t *p, size_t n, char *out, size_t cap)
{
    size_t i;
    if (n >= cap)
        return 0;
    for (i = 0; i < n; i++)
        if (!((p[i] >= '0' && p[i] <= '9') || (p[i] >= 'a' && p[i] <= 'f')))
            return 0;
    if (n)
        memcpy(out, p, n);
    out[n] = '\0';
    return 1;
}

/* What rank 0 sends every rank once it made or took the plan. */
struct begin_msg {
    int64_t code;
    char tag[24];
    char sid[24];
    char msg[DCP_ERRMSG_MAX];
};

/*
 * Rank 0's rc (with its message on failure: every rank returns rank 0's
 * code and message, as dcp__comm_share_err), its files' tag and its save
 * id, in one broadcast. A tag or save id that is not a hex string sets
 * *bad on that rank (the caller fails the job). Collective; every rank
 * returns the same code.
 */
static int share_begin(dcp_ctx *ctx, struct sv_job *job, int rc, int *bad)
{
    struct begin_msg m;
    int trc;
    *bad = 0;
    if (ctx->size == 1) {
        if (rc == DCP_OK)
            (void)snprintf(job->sid, sizeof(job->sid), "%s", job->co.sid);
        return rc;
    }
    memset(&m, 0, sizeof(m));
    if (ctx->rank == 0) {
        m.code = rc;
        if (rc != DCP_OK)
            memcpy(m.msg, ctx->err.msg, sizeof(m.msg));
        (void)snprintf(m.tag, sizeof(m.tag), "%s", job->co.tag);
        (void)snprintf(m.sid, sizeof(m.sid), "%s", job->co.sid);
    }
    trc = dcp__comm_bcast(ctx->comm, &m, sizeof(m), 0, &ctx->err);
    if (trc != DCP_OK)
        return trc;
    if (ctx->rank == 0) {
        if (rc == DCP_OK)
            (void)snprintf(job->sid, sizeof(job->sid), "%s", job->co.sid);
        return rc;
    }
    m.msg[sizeof(m.msg) - 1] = '\0';
    if (m.code != DCP_OK)
        return dcp__err(&ctx->err,
                        m.code > 0 || m.code < INT32_MIN ? DCP_EIO
                                                         : (int)m.code,
                        "%s", m.msg);
    if (!hex_tag((const uint8_t *)m.tag, strnlen(m.tag, sizeof(m.tag)),
                 job->co.tag, sizeof(job->co.tag)) ||
        !m.sid[0] ||
        !hex_tag((const uint8_t *)m.sid, strnlen(m.sid, sizeof(m.sid)),
                 job->sid, sizeof(job->sid)))
        *bad = 1;
    return DCP_OK;
}

/*
 * Step 2 with the cached plan: rank 0 redoes what depends on the path
 * (directory, committed checkpoint, file names) and broadcasts the files'
 * tag; each rank takes its assignment from the cache.
 */
static int begin_cached(dcp_ctx *ctx, struct sv_job *job, const dcp_state *st)
{
    struct sv_cache *c = job->cache;
    struct pl_assign a;
    char name[96];
    int rc = DCP_OK, bad = 0;
    if (ctx->rank == 0) {
        job->co.g = c->g;
        memset(&c->g, 0, sizeof(c->g));
        job->co.fidx = c->fidx;
        c->fidx = NULL;
        rc = coord_dir(ctx, &job->co, job->path);
        if (rc != DCP_OK && ctx->size > 1)
            (void)dcp__err_prefix(&ctx->err, "rank 0 failed");
        job->dirfd = job->co.dirfd;
    }
    /* Rank 0's outcome, the files' tag and the save id in one broadcast
     * (as dcp__comm_share_err, then the two strings). */
    rc = share_begin(ctx, job, rc, &bad);
    if (rc != DCP_OK)
        return rc;
    /* Local from here: a failure is the job's, agreed on at the finish. */
    memset(&a, 0, sizeof(a));
    if (bad)
        rc = dcp__err(&ctx->err, DCP_EFORMAT,
                      "corrupt data file tag or save id from rank 0");
    a.recs = c->recs;
    a.n = c->n;
    c->recs = NULL;
    c->n = 0;
    file_name(name, sizeof(name), ctx->rank, job->co.tag);
    a.file = dcp__strdup(a.n ? name : "");
    if (rc == DCP_OK && !a.file)
        rc = dcp__err(&ctx->err, DCP_ENOMEM, "out of memory");
    if (rc == DCP_OK)
        rc = prepare_recs(ctx, job, st, &a);
    else
        dcp__plan_assign_release(&a);
    (void)dcp__save_fail(job, rc, &ctx->err);
    dcp__err_clear(&ctx->err);
    return DCP_OK;
}

/* After a save that succeeded on every rank: its plan becomes the
 * context's cache. Out of memory here only loses the cache (this rank
 * then votes against using one, so every rank plans the next save). */
static void cache_keep(dcp_ctx *ctx, struct sv_job *job)
{
    struct sv_cache *c = job->cache;
    job->cache = NULL;
    dcp__save_cache_drop(ctx);
    if (job->nocache) {
        cache_free(c);
        return;
    }
    if (!c)
        c = dcp__calloc(1, sizeof(*c));
    if (!c || dcp__plan_local_structure(&job->lp, &c->sblob) != DCP_OK) {
        cache_free(c);
        return;
    }
    dcp__free(c->recs);
    c->recs = job->arecs;
    c->n = job->narecs;
    job->arecs = NULL;
    if (ctx->rank == 0) {
        dcp__plan_global_release(&c->g);
        c->g = job->co.g;
        memset(&job->co.g, 0, sizeof(job->co.g));
        dcp__free(c->fidx);
        c->fidx = job->co.fidx;
        job->co.fidx = NULL;
    }
    c->gen = ctx->saves;
    ctx->plan_cache = c;
}

void dcp__save_job_free(struct sv_job *job)
{
    size_t i;
    if (!job)
        return;
    /* Abandoned before finish: nothing was committed, remove our file. */
    if (!job->finished && job->wrote)
        (void)dcp__fs_unlink(job->dirfd, job->file, NULL);
    if (job->dirfd >= 0 && job->dirfd != job->co.dirfd)
        dcp__fs_release(job->dirfd);
    coord_release(&job->co);
    dcp__plan_global_release(&job->rl);
    cache_free(job->cache);
    dcp__free(job->arecs);
    dcp__plan_local_release(&job->lp);
    for (i = 0; i < job->nrecs; i++)
        dcp__free(job->recs[i].key);
    dcp__free(job->recs);
    dcp__free(job->offlen);
    dcp__free(job->srcs);
    if (job->pipe) {
        dcp__stage_pipe_destroy(job->pipe);
        dcp__free(job->pipe);
    }
    dcp__free(job->file);
    dcp__free(job->path);
    dcp__free(job);
}

int dcp__save_begin(dcp_ctx *ctx, const dcp_state *st, const char *path,
                    const dcp_save_options *opts, int rc, struct sv_job **out)
{
    struct sv_job *job = dcp__calloc(1, sizeof(*job));
    const dcp_comm *c = ctx->comm;
    uint8_t *blobs = NULL, *mine = NULL;
    size_t *lens = NULL, *displs = NULL, minelen = 0;
    int hit = 0, bad = 0;
    *out = NULL;
    dcp__ctx_io_clear(ctx, DCP_IO_SAVE);
    ctx->plan_cached[DCP_IO_SAVE] = 0;
    if (job) {
        job->dirfd = job->co.dirfd = -1;
        job->co.lock.dirfd = -1;
        job->rl_left = -1;
        job->sync = 1;
        dcp__ph_reset(&job->ph, DCP_IO_SAVE, ctx->ev_fn, ctx->ev_arg);
        atomic_init(&job->rc, DCP_OK);
        job->cache = ctx->plan_cache; /* back on the context on success */
        ctx->plan_cache = NULL;
    }
    dcp__save_cache_drop(ctx);
    if (rc == DCP_OK && !job)
        rc = dcp__err(&ctx->err, DCP_ENOMEM, "out of memory");
    if (rc == DCP_OK && (!st || !path || !*path))
        rc = dcp__err(&ctx->err, DCP_EINVAL, "save: state and path needed");
    if (rc == DCP_OK && !(job->path = dcp__strdup(path)))
        rc = dcp__err(&ctx->err, DCP_ENOMEM, "out of memory");
    if (job && opts &&
        opts->struct_size >= offsetof(dcp_save_options, no_fsync) + sizeof(int))
        job->sync = !opts->no_fsync;
    if (job && opts &&
        opts->struct_size >=
            offsetof(dcp_save_options, flags) + sizeof(opts->flags))
    {
        job->nocache = (opts->flags & DCP_SAVE_NO_PLAN_CACHE) != 0;
        job->zstd = (opts->flags & DCP_SAVE_ZSTD) != 0;
        job->ranklocal = (opts->flags & DCP_SAVE_RANK_LOCAL) != 0;
    }
    if (job)
        job->planner = dcp__save_opts_planner(opts);
    if (job && dcp__planner_save_nocache(job->planner))
        job->nocache = 1;
    if (job && job->ranklocal) {
        job->nocache = 1; /* a rank-local plan is neither used nor kept */
        (void)snprintf(job->mdname, sizeof(job->mdname), "__%d.metadata",
                       ctx->rank);
        if (rc == DCP_OK && dcp__planner_save_has_global(job->planner))
            rc = dcp__err(&ctx->err, DCP_EINVAL,
                          "DCP_SAVE_RANK_LOCAL: the save planner's global hook "
                          "needs one global plan, which a rank-local save "
                          "does not write");
    }
    /* 1. Local plans. */
    if (rc == DCP_OK)
        rc = dcp__plan_local(st, &job->lp, &ctx->err);
    /* 1b. The plan of the last save, when every rank's still fits: agreed
     * with step 1's outcome and the path. */
    rc = begin_agree(ctx, job, path, rc, &hit);
    if (rc == DCP_OK && hit) {
        rc = begin_cached(ctx, job, st);
        if (rc != DCP_OK)
            goto out;
        ctx->plan_cached[DCP_IO_SAVE] = 1;
        *out = job;
        job = NULL;
        goto out;
    }
    if (job) {
        cache_free(job->cache);
        job->cache = NULL;
    }
    if (rc == DCP_OK)
        rc = dcp__comm_gather_blob(c, job->lp.blob.p, job->lp.blob.len, 0,
                                   &blobs, &lens, &displs, &ctx->err);
    if (rc != DCP_OK)
        goto out;
    /* 2. The global plan, on rank 0. */
    if (ctx->rank == 0) {
        rc = job->ranklocal ? coord_plan_rl(ctx, &job->co, path, job->planner,
                                            blobs, lens, displs)
                            : coord_plan(ctx, &job->co, path, job->planner,
                                         blobs, lens, displs);
        if (rc != DCP_OK && rc != DCP_EPLAN && ctx->size > 1)
            (void)dcp__err_prefix(&ctx->err, "rank 0 failed");
        job->dirfd = job->co.dirfd;
        dcp__free(blobs);
        dcp__free(lens);
        dcp__free(displs);
        blobs = NULL;
        lens = displs = NULL;
    }
    /* Rank 0's outcome and its save id in one broadcast (as
     * dcp__comm_share_err, then the id); a corrupt id fails this rank's
     * job, agreed at the finish (as with the cached plan). */
    rc = share_begin(ctx, job, rc, &bad);
    if (rc == DCP_OK && bad) {
        (void)dcp__save_fail(job,
                             dcp__err(&ctx->err, DCP_EFORMAT,
                                      "corrupt data file tag or save id "
                                      "from rank 0"),
                             &ctx->err);
        dcp__err_clear(&ctx->err);
    }
    if (rc == DCP_OK && job->ranklocal) {
        /* 3a. Each rank plans its own items: a failure is the job's. */
        if (!dcp__save_failed(job))
            (void)dcp__save_fail(job, prepare_rl(ctx, job, st), &ctx->err);
        dcp__err_clear(&ctx->err);
        *out = job;
        job = NULL;
        goto out;
    }
    if (rc == DCP_OK)
        rc = dcp__comm_scatter_blob(c, job->co.asg.p, job->co.alens,
                                    job->co.adispls, 0, &mine, &minelen,
                                    &ctx->err);
    if (rc != DCP_OK)
        goto out;
    /* 3a. What this rank writes: a local failure is kept for the finish. */
    if (!dcp__save_failed(job))
        (void)dcp__save_fail(job, prepare(ctx, job, st, mine, minelen),
                             &ctx->err);
    dcp__err_clear(&ctx->err);
    *out = job;
    job = NULL;
out:
    if (rc != DCP_OK && path)
        (void)dcp__err_prefix(&ctx->err,
                              "save to '%s' failed, nothing committed", path);
    else if (rc != DCP_OK)
        (void)dcp__err_prefix(&ctx->err, "save failed, nothing committed");
    dcp__save_job_free(job);
    dcp__free(mine);
    dcp__free(blobs);
    dcp__free(lens);
    dcp__free(displs);
    return rc;
}

int dcp__save_prepare_staging(dcp_ctx *ctx, struct sv_job *job, int copy_all)
{
    struct dcp_err err;
    uint64_t need, cap;
    size_t i, n = 0;
    int cuda = 0, rc;
    if (atomic_load(&job->rc) != DCP_OK)
        return DCP_OK;
    for (i = 0; i < job->nrecs; i++) {
        const struct sv_rec *r = &job->recs[i];
        n += r->is_tensor && r->nbytes &&
             (copy_all || r->mem == DCP_MEM_CUDA || r->strided);
    }
    if (!n)
        return DCP_OK;
    dcp__err_clear(&err);
    job->srcs = dcp__calloc(n, sizeof(*job->srcs));
    job->pipe = dcp__calloc(1, sizeof(*job->pipe));
    if (!job->srcs || !job->pipe) {
        dcp__free(job->pipe);
        job->pipe = NULL;
        return dcp__save_fail(job, dcp__err(&err, DCP_ENOMEM, "out of memory"),
                              &err);
    }
    for (i = 0; i < job->nrecs; i++) {
        struct sv_rec *r = &job->recs[i];
        if (!r->is_tensor || !r->nbytes ||
            !(copy_all || r->mem == DCP_MEM_CUDA || r->strided))
            continue;
        job->srcs[job->nsrcs].p = r->src;
        job->srcs[job->nsrcs].n = r->nbytes;
        job->srcs[job->nsrcs].cuda = r->mem == DCP_MEM_CUDA;
        if (r->strided) {
            job->srcs[job->nsrcs].gather = gather_rec;
            job->srcs[job->nsrcs].ud = r;
        }
        cuda |= r->mem == DCP_MEM_CUDA;
        r->stage = ++job->nsrcs;
    }
    /* The arena is whole pages: with a budget, at most its last whole
     * page, so the arena never exceeds it. */
    need = dcp__stage_need(job->srcs, job->nsrcs);
    cap = need;
    if (ctx->staging_budget) {
        uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
        uint64_t lim = ctx->staging_budget / page * page;
        if (need > lim)
            cap = lim;
    }
    rc = cap > SIZE_MAX
             ? dcp__err(&err, DCP_ENOMEM, "staging too large")
             : dcp__stage_arena_reserve(&ctx->arena, (size_t)cap, cuda, &err);
    if (rc == DCP_OK)
        rc = dcp__stage_pipe_init(job->pipe, job->srcs, job->nsrcs,
                                  ctx->arena->p, cap, &err);
    if (rc != DCP_OK) {
        dcp__free(job->pipe);
        job->pipe = NULL;
        return dcp__save_fail(job, rc, &err);
    }
    return DCP_OK;
}

int dcp__save_stage_alone(const struct sv_job *job)
{
    return !job->pipe || !job->pipe->eager;
}

void dcp__save_stage(dcp_ctx *ctx, struct sv_job *job)
{
    struct dcp_err err;
    uint64_t bytes = 0;
    size_t i;
    double t;
    int rc;
    if (!job->pipe || atomic_load(&job->rc) != DCP_OK)
        return;
    for (i = 0; i < job->nsrcs; i++)
        bytes += job->srcs[i].n;
    t = dcp__ph_start(&ctx->ph[DCP_IO_SAVE], DCP_PHASE_STAGE);
    dcp__err_clear(&err);
    rc = dcp__stage_run(job->pipe, &err);
    dcp__ph_end(&ctx->ph[DCP_IO_SAVE], DCP_PHASE_STAGE, t,
                rc == DCP_OK ? bytes : 0);
    if (rc != DCP_OK)
        (void)dcp__save_fail(job, rc, &err);
}

/* An upper bound of the data file's length: data, alignment and zip
 * structures (under 12 KiB per record, plus a tensor's block CRCs: 4 bytes
 * per MiB); the engine allocates it first. */
static uint64_t file_hint(const struct sv_job *job)
{
    uint64_t hint = 0;
    size_t i;
    for (i = 0; i < job->nrecs; i++) {
        const struct sv_rec *r = &job->recs[i];
        hint += dcp__save_rec_bound(
            r->is_tensor ? r->nbytes : job->lp.pickles[r->pickle].len);
    }
    return hint;
}

/* 3b, on the worker: this rank's records into its data file. */
void dcp__save_write(void *arg)
{
    struct sv_job *job = arg;
    struct io_writer w;
    struct dcp_err err;
    size_t i;
    uint64_t done = 0;
    double t;
    int fd, frc, rc = atomic_load(&job->rc);
    if (rc != DCP_OK || !job->file)
        return;
    dcp__err_clear(&err);
    t = dcp__ph_start(&job->ph, DCP_PHASE_WRITE);
    rc = dcp__fs_create(job->dirfd, job->file, &fd, &err);
    if (rc != DCP_OK) {
        dcp__ph_end(&job->ph, DCP_PHASE_WRITE, t, 0);
        (void)dcp__save_fail(job, rc, &err);
        return;
    }
    job->wrote = 1;
    rc = dcp__iow_open(&w, job->io, job->dirfd, job->file, fd, file_hint(job),
                       &err);
    if (rc != DCP_OK) {
        dcp__fs_release(fd);
        dcp__ph_end(&job->ph, DCP_PHASE_WRITE, t, 0);
        (void)dcp__save_fail(job, rc, &err);
        return;
    }
    for (i = 0; i < job->nrecs && rc == DCP_OK; i++) {
        const struct sv_rec *r = &job->recs[i];
        uint64_t *ol = &job->offlen[2 * i];
        if (job->zstd)
            rc = write_zstd(&w, r, job->pipe, &job->lp.pickles[r->pickle],
                            job->sid, &ol[0], &ol[1]);
        else if (r->is_tensor)
            rc = write_box(&w, r, job->pipe, job->sid, &ol[0], &ol[1]);
        else
            rc = write_value(&w, r, &job->lp.pickles[r->pickle], job->sid,
                             &ol[0], &ol[1]);
        /* Another failure (staging, cancel) stops the writing too. */
        if (rc == DCP_OK && atomic_load(&job->rc) != DCP_OK)
            rc = atomic_load(&job->rc);
        if (rc == DCP_OK && ol[0] + ol[1] > done) {
            done = ol[0] + ol[1];
            dcp__ph_progress(&job->ph, DCP_PHASE_WRITE, done);
        }
    }
    frc = dcp__iow_finish(&w); /* waits for every request, also on error */
    if (rc == DCP_OK)
        rc = frc;
    dcp__ph_end(&job->ph, DCP_PHASE_WRITE, t, rc == DCP_OK ? done : 0);
    t = dcp__ph_start(&job->ph, DCP_PHASE_FSYNC);
    if (rc == DCP_OK && job->sync)
        rc = dcp__fs_fsync(fd, job->file, &err);
    if (rc == DCP_OK)
        rc = dcp__fs_close(fd, job->file, &err);
    else
        dcp__fs_release(fd);
    dcp__ph_end(&job->ph, DCP_PHASE_FSYNC, t, rc == DCP_OK ? done : 0);
    dcp__io_stats_get(job->io, &job->iost);
    job->have_iost = 1;
    (void)dcp__save_fail(job, rc, &err);
}

/* Tells every rank whether rank 0's failed commit got past the rename:
 * *renamed 0 or 1 as rank 0 says, RENAMED_UNKNOWN when rank 0 did not
 * answer (a timeout: it may still be committing). */
#define RENAMED_UNKNOWN 2
static void share_renamed(const dcp_comm *c, int *renamed)
{
    int64_t v = *renamed;
    if (dcp__comm_bcast(c, &v, sizeof(v), 0, NULL) == DCP_OK)
        *renamed = (int)v;
    else
        *renamed = RENAMED_UNKNOWN; /* keep the files */
}

/*
 * A rank-local save's step 4, after every rank's data is durable: this
 * rank's extents into its own plan, its __<r>.metadata published (its
 * commit point), the outcome agreed. On an agreed failure each rank
 * removes its own __<r>.metadata if it was renamed (then its data file
 * goes too, in dcp__save_finish); *renamed stays 1 only when that
 * removal failed, so the data file it names is kept. The lowest such
 * rank is agreed (job->rl_left), so every rank's message names it.
 */
static int commit_rl(dcp_ctx *ctx, struct sv_job *job,
                     const struct dcp_buf *res, int *renamed)
{
    struct dcp_err e;
    int rc = dcp__plan_results_apply(&job->rl, 0, 0, res->p, res->len,
                                     &ctx->err);
    if (rc == DCP_OK)
        rc = finish_md(job->rl.md, job->sid, job->path, job->zstd,
                       &ctx->err);
    /* Every rank but 0 first, then rank 0: __0.metadata is published
     * last, so a save killed between the commits leaves no __0.metadata
     * and a reader refuses the others (a rank's metadata missing), never
     * loading some ranks' items only. */
    if (rc == DCP_OK && ctx->rank != 0)
        rc = dcp__commit_metadata_as(job->dirfd, job->path, job->mdname,
                                     job->rl.md, job->sync, renamed,
                                     &ctx->err);
    rc = dcp__comm_agree_err(ctx->comm, rc, &ctx->err);
    if (rc == DCP_OK)
        rc = dcp__comm_agree_err(
            ctx->comm,
            ctx->rank == 0
                ? dcp__commit_metadata_as(job->dirfd, job->path, job->mdname,
                                          job->rl.md, job->sync, renamed,
                                          &ctx->err)
                : DCP_OK,
            &ctx->err);
    dcp__err_clear(&e);
    /* The rollback the other way round: rank 0's file first; when it
     * cannot be removed the others keep theirs (the checkpoint stays
     * whole rather than some ranks' items only). */
    if (rc != DCP_OK) {
        int64_t keep = 0;
        if (ctx->rank == 0 && *renamed) {
            if (dcp__fs_unlink(job->dirfd, job->mdname, &e) == DCP_OK)
                *renamed = 0;
            else
                keep = 1;
        }
        if (dcp__comm_bcast(ctx->comm, &keep, sizeof(keep), 0, &e) != DCP_OK)
            keep = 1; /* unknown: removing could leave a part */
        if (!keep && ctx->rank != 0 && *renamed &&
            dcp__fs_unlink(job->dirfd, job->mdname, &e) == DCP_OK)
            *renamed = 0;
    }
    if (rc != DCP_OK) {
        int64_t v = *renamed ? ctx->rank : INT64_MAX;
        if (dcp__comm_allreduce_min(ctx->comm, &v, 1, &e) != DCP_OK)
            v = *renamed ? ctx->rank : INT64_MAX; /* own knowledge only */
        job->rl_left = v == INT64_MAX ? -1 : (int)v;
    }
    return rc;
}

int dcp__save_finish(dcp_ctx *ctx, struct sv_job *job)
{
    const dcp_comm *c = ctx->comm;
    struct dcp_buf res = {0};
    uint8_t *blobs = NULL;
    size_t *lens = NULL, *displs = NULL;
    int rc = atomic_load(&job->rc), renamed = 0;
    struct dcp__phrec *ph = &ctx->ph[DCP_IO_SAVE];
    double t;
    int p;
    for (p = DCP_PHASE_WRITE; p <= DCP_PHASE_FSYNC; p++) {
        ph->sec[p] += job->ph.sec[p];
        ph->bytes[p] += job->ph.bytes[p];
    }
    if (job->have_iost)
        ctx->io_last[DCP_IO_SAVE] = job->iost;
    t = dcp__ph_start(ph, DCP_PHASE_AGREE);
    if (rc != DCP_OK)
        ctx->err = job->err;
    if (rc == DCP_OK &&
        dcp__plan_results_encode(job->offlen, job->nrecs, &res) != DCP_OK)
        rc = dcp__err(&ctx->err, DCP_ENOMEM, "out of memory");
    if (job->ranklocal)
        rc = dcp__comm_agree_err(c, rc, &ctx->err);
    if (rc == DCP_OK && job->ranklocal) {
        dcp__ph_end(ph, DCP_PHASE_AGREE, t, 0);
        t = dcp__ph_start(ph, DCP_PHASE_COMMIT);
        rc = commit_rl(ctx, job, &res, &renamed);
        dcp__ph_end(ph, DCP_PHASE_COMMIT, t, 0);
        if (rc == DCP_OK) {
            ctx->saves++;
            cache_keep(ctx, job);
        }
        goto out;
    }
    /* Every rank's outcome agreed, then the results gathered. */
    if (!job->ranklocal)
        rc = dcp__comm_gather_blob_rc(c, rc, res.p, res.len, 0, &blobs, &lens,
                                      &displs, &ctx->err);
    dcp__ph_end(ph, DCP_PHASE_AGREE, t, 0);
    if (rc != DCP_OK)
        goto out;
    /* 4. Commit, on rank 0, once every rank's data is durable. */
    t = dcp__ph_start(ph, DCP_PHASE_COMMIT);
    if (ctx->rank == 0) {
        rc = coord_commit(ctx, &job->co, job->path, blobs, lens, displs,
                          job->sync, job->zstd, &renamed);
        /* Before anyone returns, so the directory holds exactly the new
         * checkpoint when the call ends on any rank. */
        if (rc == DCP_OK) {
            dcp__save_remove_old(job->co.dirfd, job->co.old, job->co.g.md);
            /* A rank-local checkpoint replaced: its __<k>.metadata, now
             * shadowed by ours, and its data files (best effort: what
             * stays is never loaded; the next save or dcp_clean removes
             * it). */
            if (job->co.old_rl &&
                dcp__clean_leftovers(job->co.dirfd, job->path, job->co.g.md,
                                     0, NULL, NULL, &ctx->err) != DCP_OK)
                dcp__err_clear(&ctx->err);
        } else if (ctx->size > 1)
            (void)dcp__err_prefix(&ctx->err, "rank 0 failed");
    }
    rc = dcp__comm_share_err(c, rc, &ctx->err, 0);
    if (rc != DCP_OK && ctx->size > 1)
        share_renamed(c, &renamed);
    dcp__ph_end(ph, DCP_PHASE_COMMIT, t, 0);
    if (rc == DCP_OK) {
        ctx->saves++;
        cache_keep(ctx, job);
    }
out:
    if (rc != DCP_OK && job->wrote && !renamed)
        (void)dcp__fs_unlink(job->dirfd, job->file, NULL);
    job->finished = 1;
    if (rc != DCP_OK && job->ranklocal && job->rl_left >= 0)
        (void)dcp__err_prefix(&ctx->err,
                              "rank-local save to '%s' failed; rank %d could "
                              "not remove its committed __%d.metadata (its "
                              "files are left)",
                              job->path, job->rl_left, job->rl_left);
    else if (rc != DCP_OK && renamed == RENAMED_UNKNOWN)
        (void)dcp__err_prefix(&ctx->err,
                              "save to '%s' failed: rank 0 did not say "
                              "whether it committed the checkpoint (the "
                              "directory holds the previous checkpoint or "
                              "this one, never a mix)",
                              job->path);
    else if (rc != DCP_OK && renamed)
        (void)dcp__err_prefix(&ctx->err,
                              "save to '%s' failed after .metadata was "
                              "renamed into place; the new checkpoint may "
                              "not be durable",
                              job->path);
    else if (rc != DCP_OK)
        (void)dcp__err_prefix(
            &ctx->err, "save to '%s' failed, nothing committed", job->path);
    dcp__buf_free(&res);
    dcp__free(blobs);
    dcp__free(lens);
    dcp__free(displs);
    return rc;
}
