/*
 * dcp_import: a torch.save or safetensors file (or a sharded safetensors
 * set) into a new DCP checkpoint, streaming.
 *
 * One process writes one data file, __0_0.distcp, record after record:
 * values as torch.save value items, tensors as tensor items whose data is
 * copied from the source in pieces of at most mem_limit / 2 bytes (cast on
 * the way when asked), with the CRC computed as the bytes pass. Then the
 * data file is fsynced and .metadata is committed by the sequence dcp_save
 * uses, dcp__commit_metadata (commit.h: a temporary, fsync, rename, fsync
 * of the directory), under the directory's one-writer lock (lock.h: a
 * second importer or saver gets DCP_EBUSY), with the import's save id in
 * every record. Leftovers of interrupted writers are removed first. On
 * failure the data file this call created (and only that) and the
 * temporary metadata are removed, so the directory never looks like a
 * checkpoint and a refused import never touches one that is there.
 */
#include "ctx.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "commit.h"
#include "crc32.h"
#include "cvname.h"
#include "dcp/dcp_convert.h"
#include "lock.h"
#include "meta.h"
#include "srcfile.h"
#include "storage.h"
#include "torchzip.h"
#include "value.h"

#define DATA_FILE  "__0_0.distcp"
#define ITEM_ALIGN 64
#define MAX_PICKLE ((uint64_t)1 << 30)

struct imp {
    dcp_ctx *ctx;
    dcp_convert_options o;
    struct src_index ix;
    int dirfd, fd;
    int created;          /* the data file is this call's */
    struct dcp__lock lock; /* the directory's one-writer lock */
    uint64_t off;        /* bytes in the data file */
    uint8_t *buf, *cbuf; /* source piece, cast piece */
    size_t piece;        /* bytes of buf */
    uint64_t done, total;
    struct dcp_metadata *md;
    dcp_convert_result res;
};

static int put(struct imp *im, const void *p, size_t n)
{
    int rc = dcp__fs_pwrite(im->fd, p, n, im->off, DATA_FILE, &im->ctx->err);
    im->off += n;
    return rc;
}

static int drain(struct imp *im, struct tz_writer *z)
{
    int rc = put(im, z->out.p, z->out.len);
    z->out.len = 0;
    return rc;
}

static void progress(struct imp *im, uint64_t n)
{
    im->done += n;
    if (im->o.progress)
        im->o.progress(im->o.progress_arg, im->done, im->total);
}

/* The record's chunk: one box covering the tensor, or a value's. */
static int add_md_entry(struct imp *im, const struct src_entry *s,
                        struct cv_name *nm, dcp_dtype dt, uint64_t off,
                        uint64_t len)
{
    struct md_entry *e = &im->md->e[im->md->n];
    struct md_chunk *c = dcp__calloc(1, sizeof(*c));
    if (!c)
        return dcp__err(&im->ctx->err, DCP_ENOMEM, "out of memory");
    e->chunks = c;
    e->nchunks = 1;
    e->key = nm->key;
    e->path = nm->path;
    e->npath = nm->npath;
    memset(nm, 0, sizeof(*nm));
    im->md->n++;
    e->is_tensor = s->is_tensor;
    c->offset = off;
    c->length = len;
    c->file = 0;
    c->has_storage = 1;
    if (!s->is_tensor)
        return DCP_OK;
    e->dtype = dt;
    e->ndim = s->ndim;
    memcpy(e->shape, s->shape, sizeof(e->shape));
    c->off = dcp__calloc(2 * (size_t)(s->ndim ? s->ndim : 1), sizeof(int64_t));
    if (!c->off)
        return dcp__err(&im->ctx->err, DCP_ENOMEM, "out of memory");
    c->size = c->off + s->ndim;
    memcpy(c->size, s->shape, (size_t)s->ndim * sizeof(int64_t));
    return DCP_OK;
}

static int write_tensor(struct imp *im, const struct src_entry *s,
                        struct cv_name *nm)
{
    struct dcp_err *err = &im->ctx->err;
    dcp_dtype dt = dcp__cv_out_dtype(&im->o, s->dtype);
    size_t is = dcp_dtype_size(s->dtype), os = dcp_dtype_size(dt);
    uint64_t numel = dcp__box_numel(s->ndim, s->shape), i, step;
    uint64_t start = im->off, data_off, bsize;
    /* Block CRCs, as a save writes them (docs/FORMAT.md §4). */
    uint64_t nblk = dcp__tz_block_layout(numel * os, &bsize);
    uint32_t *blk = NULL;
    struct crc_blocks crc;
    struct tz_writer z;
    int rc;
    if (nblk && !(blk = dcp__malloc((size_t)nblk * sizeof(*blk))))
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    dcp__crcb_init(&crc, bsize, blk, (size_t)nblk);
    rc = dcp__tz_writer_init(&z, im->off, ITEM_ALIGN);
    if (rc == DCP_OK)
        rc = dcp__tz_writer_save_id(&z, im->md->save_id);
    if (rc == DCP_OK)
        rc = dcp__tz_tensor_item_begin(&z, dt, s->ndim, s->shape, numel * os,
                                  &data_off);
    if (rc != DCP_OK) {
        dcp__tz_writer_release(&z);
        dcp__free(blk);
        return dcp__err(err, rc, "cannot encode tensor '%s'", s->key);
    }
    rc = drain(im, &z);
    step = im->piece / (is > os ? is : os);
    for (i = 0; rc == DCP_OK && i < numel; i += step) {
        uint64_t n = numel - i < step ? numel - i : step;
        const uint8_t *out = im->buf;
        rc = dcp__src_read(&im->ix, s, i, n, im->buf, im->o.mem_limit / 2, err);
        if (rc == DCP_OK && dt != s->dtype) {
            rc = dcp__cv_cast(&im->o, im->cbuf, dt, im->buf, s->dtype,
                              (size_t)n, s->key, i, err);
            out = im->cbuf;
        }
        if (rc == DCP_OK) {
            dcp__crcb_update(&crc, NULL, out, (size_t)(n * os));
            rc = put(im, out, (size_t)(n * os));
        }
        if (rc == DCP_OK)
            progress(im, n * os);
    }
    if (rc == DCP_OK) {
        uint32_t whole = dcp__crcb_finish(&crc);
        rc = dcp__tz_tensor_item_end_blocks(&z, whole, bsize, blk,
                                            (size_t)nblk);
        rc = rc == DCP_OK
                 ? drain(im, &z)
                 : dcp__err(err, rc, "cannot encode tensor '%s'", s->key);
    }
    dcp__tz_writer_release(&z);
    dcp__free(blk);
    if (rc == DCP_OK) {
        im->res.tensors++;
        im->res.bytes += numel * os;
        if (dt != s->dtype)
            im->res.cast++;
        else if (im->o.dtype && !dcp__cv_is_float(s->dtype))
            im->res.kept++;
        rc = add_md_entry(im, s, nm, dt, start, im->off - start);
    }
    return rc;
}

static int write_value(struct imp *im, const struct src_entry *s,
                       struct cv_name *nm)
{
    struct dcp_buf pkl = {0};
    struct tz_writer z;
    uint64_t start = im->off;
    int rc = dcp__value_pickle(s->value, &pkl);
    if (rc == DCP_OK)
        rc = dcp__tz_writer_init(&z, im->off, ITEM_ALIGN);
    if (rc == DCP_OK)
        rc = dcp__tz_writer_save_id(&z, im->md->save_id);
    if (rc == DCP_OK) {
        rc = dcp__tz_value_item(&z, pkl.p, pkl.len);
        if (rc == DCP_OK)
            rc = drain(im, &z);
        dcp__tz_writer_release(&z);
    }
    dcp__buf_free(&pkl);
    if (rc != DCP_OK)
        return im->ctx->err.code == rc
                   ? rc
                   : dcp__err(&im->ctx->err, rc, "cannot encode value '%s'",
                              s->key);
    im->res.values++;
    return add_md_entry(im, s, nm, 0, start, im->off - start);
}

static int init_md(struct imp *im, const char *dir)
{
    char id[17];
    struct timespec ts;
    unsigned long long x;
    im->md = dcp__calloc(1, sizeof(*im->md));
    if (!im->md)
        return DCP_ENOMEM;
    im->md->e = dcp__calloc(im->ix.n ? im->ix.n : 1, sizeof(*im->md->e));
    im->md->files = dcp__calloc(1, sizeof(char *));
    if (!im->md->e || !im->md->files)
        return DCP_ENOMEM;
    im->md->files[0] = dcp__strdup(DATA_FILE);
    im->md->nfiles = im->md->files[0] ? 1 : 0;
    (void)clock_gettime(CLOCK_REALTIME, &ts);
    x = (unsigned long long)ts.tv_sec * 1000000007ull ^
        (unsigned long long)ts.tv_nsec ^ ((unsigned long long)getpid() << 32);
    (void)snprintf(id, sizeof(id), "%016llx", x);
    im->md->version = dcp__strdup("1.0.0");
    im->md->checkpoint_id = dcp__strdup(dir);
    im->md->save_id = dcp__strdup(id);
    if (!im->md->nfiles || !im->md->version || !im->md->checkpoint_id ||
        !im->md->save_id)
        return DCP_ENOMEM;
    return DCP_OK;
}

/* Renames every selected entry; fails on a rename collision or when the
 * filter keeps nothing. names[i] is NULL for entries left out. */
static int plan_names(struct imp *im, struct cv_name *names)
{
    struct dcp_err *err = &im->ctx->err;
    size_t i, kept = 0;
    int rc = DCP_OK;
    for (i = 0; rc == DCP_OK && i < im->ix.n; i++) {
        const struct src_entry *s = &im->ix.e[i];
        if (!dcp__cv_selected(&im->o, s->key))
            continue;
        rc = dcp__cv_rename(&im->o, s->key, s->path, s->npath, &names[i], err);
        if (rc == DCP_OK && s->is_tensor)
            im->total += dcp__box_numel(s->ndim, s->shape) *
                         dcp_dtype_size(dcp__cv_out_dtype(&im->o, s->dtype));
        kept++;
    }
    if (rc == DCP_OK && kept == 0)
        rc = dcp__err(err, DCP_EKEY,
                      "no entry of the file matches the key filter");
    return rc;
}

static int write_all(struct imp *im, struct cv_name *names)
{
    size_t i;
    int rc = DCP_OK;
    for (i = 0; rc == DCP_OK && i < im->ix.n; i++) {
        if (!names[i].key)
            continue;
        if (im->ix.e[i].is_tensor)
            rc = write_tensor(im, &im->ix.e[i], &names[i]);
        else
            rc = write_value(im, &im->ix.e[i], &names[i]);
    }
    if (rc == DCP_OK)
        rc = dcp__meta_sort(im->md, &im->ctx->err);
    if (rc == DCP_EPLAN)
        rc = dcp__err(&im->ctx->err, DCP_EKEY,
                      "two entries are renamed to one key: %s",
                      im->ctx->err.msg);
    return rc;
}

static int run(struct imp *im, const char *in, const char *dir)
{
    struct dcp_err *err = &im->ctx->err;
    struct cv_name *names = NULL;
    int rc, renamed = 0,
            sync = !(im->o.flags & DCP_CONVERT_NO_FSYNC);
    size_t i;
    rc = dcp__src_open(in, im->o.format, MAX_PICKLE, &im->ix, err);
    if (rc == DCP_OK && (im->o.flags & DCP_CONVERT_DEQUANT))
        rc = dcp__src_dequant(&im->ix, 128, err);
    if (rc != DCP_OK)
        return rc;
    names = dcp__calloc(im->ix.n ? im->ix.n : 1, sizeof(*names));
    if (!names)
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    rc = plan_names(im, names);
    if (rc == DCP_OK && init_md(im, dir) != DCP_OK)
        rc = dcp__err(err, DCP_ENOMEM, "out of memory");
    if (rc == DCP_OK)
        rc = dcp__fs_mkdirs(dir, err);
    if (rc == DCP_OK)
        rc = dcp__fs_open_dir(dir, &im->dirfd, err);
    /* One writer per path (lock.h), from here to the commit. */
    if (rc == DCP_OK)
        rc = dcp__lock_acquire(im->dirfd, dir, im->md->save_id, 0, &im->lock,
                               err);
    if (rc == DCP_OK && dcp__fs_exists(im->dirfd, ".metadata"))
        rc = dcp__err(err, DCP_EEXIST,
                      "'%s' already holds a checkpoint: import into a new "
                      "directory",
                      dir);
    /* What an interrupted writer left here (no checkpoint, no live
     * writer): removed, so that the data file is this call's own. */
    if (rc == DCP_OK &&
        dcp__clean_leftovers(im->dirfd, dir, NULL, 0, NULL, NULL, err) !=
            DCP_OK)
        dcp__err_clear(err);
    if (rc == DCP_OK) {
        rc = dcp__fs_create(im->dirfd, DATA_FILE, &im->fd, err);
        im->created = rc == DCP_OK;
    }
    if (rc == DCP_OK)
        rc = write_all(im, names);
    if (rc == DCP_OK && sync)
        rc = dcp__fs_fsync(im->fd, DATA_FILE, err);
    if (im->fd >= 0) {
        int crc = dcp__fs_close(im->fd, DATA_FILE, err);
        if (rc == DCP_OK)
            rc = crc;
        im->fd = -1;
    }
    if (rc == DCP_OK)
        rc = dcp__commit_metadata(im->dirfd, dir, im->md, sync, &renamed, err);
    /* Only a file this call created: a refused import (another
     * checkpoint or writer there) removes nothing. */
    if (rc != DCP_OK && !renamed && im->created)
        (void)dcp__fs_unlink(im->dirfd, DATA_FILE, NULL);
    if (rc == DCP_OK)
        im->res.files = 1;
    for (i = 0; i < im->ix.n; i++)
        dcp__cv_name_release(&names[i]);
    dcp__free(names);
    return rc;
}

int dcp_import(dcp_ctx *ctx, const char *in, const char *dir,
               const dcp_convert_options *opts, dcp_convert_result *res)
{
    struct imp im;
    int rc;
    if (!ctx)
        return DCP_EINVAL;
    dcp__ctx_begin(ctx);
    if (!in || !dir)
        return dcp__err(&ctx->err, DCP_EINVAL, "no input file or directory");
    rc = dcp__cv_result_check(res, &ctx->err);
    if (rc != DCP_OK)
        return rc;
    memset(&im, 0, sizeof(im));
    im.ctx = ctx;
    im.dirfd = -1;
    im.fd = -1;
    im.lock.dirfd = -1;
    rc = dcp__cv_options(opts, &im.o, &ctx->err);
    if (rc != DCP_OK)
        return rc;
    im.piece = (size_t)(im.o.mem_limit / 4);
    im.buf = dcp__malloc(im.piece);
    im.cbuf = dcp__malloc(im.piece);
    if (!im.buf || !im.cbuf)
        rc = dcp__err(&ctx->err, DCP_ENOMEM, "out of memory");
    if (rc == DCP_OK)
        rc = run(&im, in, dir);
    dcp__fs_release(im.fd);
    dcp__lock_release(&im.lock);
    dcp__fs_release(im.dirfd);
    dcp__src_close(&im.ix);
    dcp__meta_free(im.md);
    dcp__free(im.buf);
    dcp__free(im.cbuf);
    dcp__cv_result_put(res, &im.res);
    return rc;
}
