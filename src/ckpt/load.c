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
 * same code and the failing rank's message; consecutive agreements share
 * one allreduce (dcp__comm_agree_stage: each costs milliseconds through a
 * Python communicator), a local failure carried into the next one, so
 * that every rank makes the same collective calls whatever happens.
 */
#include "load.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "comm.h"
#include "cuda.h"
#include "dtype.h"
#include "meta.h"
#include "plan.h"
#include "planner.h"
#include "hfdir.h"
#include "ranklocal.h"
#include "read.h"
#include "readonce.h"
#include "request.h"
#include "state.h"
#include "stateful.h"
#include "storage.h"
#include "unflat.h"

/* The bytes a load hints at once on a back end that takes hints (S3):
 * fetched records are held in memory until their round's batch ran. */
#define HINT_ROUND ((uint64_t)128 << 20)

uint64_t dcp__load_hint_round; /* load.h */

static int check_entry(dcp_ctx *ctx, const struct st_entry *se,
                       const struct md_entry *e, unsigned flags)
{
    char a[DCP_SHAPE_TEXT_MAX], b[DCP_SHAPE_TEXT_MAX];
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
        (void)dcp_shape_format(a, sizeof(a), e->ndim, e->shape);
        (void)dcp_shape_format(b, sizeof(b), se->ndim, se->shape);
        rc = dcp__err(&ctx->err, DCP_EMISMATCH,
                      "'%s': shape mismatch: saved %s, requested %s", se->key,
                      a, b);
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
    return rc;
}

/* Matches this rank's keys with the checkpoint's: kinds, shapes, dtypes;
 * missing keys go to ctx's report and fail a strict load. */
static int match_keys(dcp_ctx *ctx, const dcp_state *st,
                      const struct dcp_metadata *md, unsigned flags)
{
    size_t i, rank_keys = 0, pl;
    const char *strict = NULL; /* the first missing key that fails */
    char pfx[32];
    int rc = DCP_OK;
    /* This rank's dcp_state_push_rank prefix, "rank<r>." */
    pl = (size_t)snprintf(pfx, sizeof pfx, "rank%d.", ctx->rank);
    for (i = 0; rc == DCP_OK && i < st->n; i++) {
        long ei = dcp__meta_find(md, st->e[i].key);
        /* A key of a dtype dcp cannot read is refused, never missing
         * (not even for a partial load). */
        if (ei < 0)
            rc = dcp__meta_unsup_err(md, st->e[i].key, &ctx->err);
        if (ei < 0 && rc == DCP_OK) {
            rc = dcp__ctx_report_add(ctx, DCP__REPORT_MISSING,
                                     st->e[i].key);
            if ((flags & DCP_LOAD_MISSING_RANK_KEYS) &&
                !strncmp(st->e[i].key, pfx, pl))
                rank_keys++;
            else if (!strict)
                strict = st->e[i].key;
        } else if (ei >= 0) {
            rc = check_entry(ctx, &st->e[i], &md->e[ei], flags);
        }
    }
    if (rc == DCP_ENOMEM)
        return dcp__err(&ctx->err, rc, "out of memory");
    if (rc != DCP_OK || (flags & DCP_LOAD_PARTIAL) || !strict)
        return rc;
    return dcp__err(&ctx->err, DCP_EKEY,
                    "missing key '%s' in checkpoint (%zu missing%s; "
                    "DCP_LOAD_PARTIAL allows it)",
                    strict, ctx->nmissing - rank_keys,
                    rank_keys ? " beside this rank's own" : "");
}

/* Checkpoint keys that no rank asked for, from nreq (per md entry, over
 * every rank: the minimum of "not requested", agreed with match_keys'
 * outcome), into ctx's report: the same list on every rank, unless out of
 * memory here. Local; a strict load fails on it after the next agreement
 * (unexpected_err). */
static int unexpected_keys(dcp_ctx *ctx, const struct dcp_metadata *md,
                           const int64_t *nreq)
{
    size_t i;
    int rc = DCP_OK;
    for (i = 0; rc == DCP_OK && i < md->n; i++)
        if (nreq[i])
            rc = dcp__ctx_report_add(ctx, DCP__REPORT_UNEXPECTED,
                                     md->e[i].key);
    if (rc == DCP_ENOMEM)
        rc = dcp__err(&ctx->err, rc, "out of memory");
    return rc;
}

/* Whether a strict load fails on the unexpected keys: the same on every
 * rank once unexpected_keys succeeded everywhere. */
static int unexpected_fail(const dcp_ctx *ctx, unsigned flags)
{
    return !(flags & (DCP_LOAD_PARTIAL | DCP_LOAD_ALLOW_UNEXPECTED)) &&
           ctx->nunexpected;
}

static int unexpected_err(dcp_ctx *ctx)
{
    return dcp__err(&ctx->err, DCP_EKEY,
                    "unexpected key '%s' in checkpoint (%zu unexpected%s; "
                    "DCP_LOAD_ALLOW_UNEXPECTED allows it)",
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

/* Whether chunk c lies whole inside one of se's boxes (it is then read
 * whole). */
static int chunk_inside(const struct st_entry *se, const struct md_chunk *c)
{
    size_t i;
    int d;
    for (i = 0; i < se->nboxes; i++) {
        for (d = 0; d < se->ndim; d++)
            if (c->off[d] < se->boxes[i].off[d] ||
                c->off[d] + c->size[d] >
                    se->boxes[i].off[d] + se->boxes[i].size[d])
                break;
        if (d == se->ndim)
            return 1;
    }
    return 0;
}

/*
 * Reads the chunks of e that overlap se's boxes: parsed now, their bytes
 * added to batch; with batch NULL, only prefetched. A CUDA tensor is read
 * at once (not batched) into one host buffer, then copied to the device.
 */
static int load_tensor(struct rd_files *f, const struct st_entry *se,
                       const struct md_entry *e, int verify,
                       struct io_rbatch *batch, const struct ro_plan *ro,
                       size_t ei, uint64_t *hinted, uint64_t budget,
                       struct dcp_err *err)
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
        /* A strided box is host memory (dcp_state_add_tensor_strided). */
        dest[i].stride = se->boxes[i].strided ? se->boxes[i].stride : NULL;
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
        if (dcp__ro_shared(ro, ei, i))
            continue; /* read once, by its reader (readonce.c) */
        /* A record read whole is hinted whole while the round's budget
         * lasts (a tensor of many chunks stops there: its other records
         * get their headers hinted only), and never a value record's
         * member (its leaves share the record: unflat.c). */
        if (!batch)
            *hinted += dcp__rd_prefetch(f, e, i,
                                        f->hints && !e->member &&
                                            *hinted < budget &&
                                            chunk_inside(se, &e->chunks[i]));
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

/* The prefetch pass of one round: the tensors from i0 on until about
 * round bytes are hinted (at least one entry); returns the index after
 * the round's last entry. *rc gets a failure. */
static size_t hint_round(struct rd_files *f, const dcp_state *st,
                         const struct dcp_metadata *md, int verify,
                         const struct ro_plan *ro, size_t i0, uint64_t round,
                         uint64_t *hinted, int *rc, struct dcp_err *err)
{
    size_t i;
    for (i = i0; *rc == DCP_OK && i < st->n && (i == i0 || *hinted < round);
         i++) {
        long ei = dcp__meta_find(md, st->e[i].key);
        if (ei >= 0 && st->e[i].is_tensor)
            *rc = load_tensor(f, &st->e[i], &md->e[ei], verify, NULL, ro,
                              (size_t)ei, hinted, round, err);
    }
    return i;
}

/*
 * Values, then this rank's own tensor chunks (batched), then the chunks
 * read once (readonce.h: every rank takes part when ro->on, even one that
 * failed before, rc_in, so that its peers' messages are answered); values
 * replace the templates only when all of it succeeded and every chunk
 * this rank needed landed (a failed reader's chunks did not).
 */
static int load_all(dcp_ctx *ctx, dcp_state *st, struct rd_files *f,
                    const struct dcp_metadata *md, int verify,
                    struct ro_plan *ro, int rc_in)
{
    dcp_value **vals = dcp__calloc(st->n ? st->n : 1, sizeof(*vals));
    struct io_rbatch batch = {0};
    struct io_eng *eng = NULL;
    uint64_t hinted = 0, round;
    size_t i1 = 0;
    size_t i;
    int rc = rc_in, dropped = 0;
    if (!vals && rc == DCP_OK)
        rc = dcp__err(&ctx->err, DCP_ENOMEM, "out of memory");
    if (!vals && !ro->on)
        return rc;
    /* On a back end that takes hints (S3) the records are fetched whole,
     * several in flight, before they are parsed; the fetched bytes are
     * held until their batch ran, so the tensors go in rounds of at most
     * about HINT_ROUND hinted bytes. The value records are hinted with the
     * first round's tensors, so that reading the values fetches them all
     * together. */
    round = dcp__load_hint_round ? dcp__load_hint_round : HINT_ROUND;
    for (i = 0; rc == DCP_OK && i < st->n; i++) {
        long ei = dcp__meta_find(md, st->e[i].key);
        if (ei >= 0 && !st->e[i].is_tensor)
            hinted += dcp__rd_prefetch(f, &md->e[ei], 0,
                                       md->e[ei].member == NULL &&
                                           hinted < round);
    }
    if (rc == DCP_OK)
        i1 = hint_round(f, st, md, verify, ro, 0, round, &hinted, &rc,
                        &ctx->err);
    /* Values are decoded before any buffer changes. */
    for (i = 0; rc == DCP_OK && i < st->n; i++) {
        long ei = dcp__meta_find(md, st->e[i].key);
        if (ei >= 0 && !st->e[i].is_tensor)
            rc = dcp__rd_value(f, &md->e[ei], verify, ctx->max_value_bytes,
                               &vals[i], &ctx->err);
    }
    if (rc != DCP_OK && hinted)
        dcp__rd_hints_drop(f); /* not held through the read-once exchange */
    /* Tensors: archives parsed, then their bytes read in one batch per
     * round, sorted by file and offset (ioengine.h). */
    dcp__ctx_io_clear(ctx, DCP_IO_LOAD);
    for (i = 0; rc == DCP_OK && i < st->n; i = i1) {
        if (i > 0) {
            hinted = 0;
            i1 = hint_round(f, st, md, verify, ro, i, round, &hinted, &rc,
                            &ctx->err);
        }
        if (rc == DCP_OK)
            rc = dcp__io_rbatch_init(&batch, f->dirfd, md->nfiles, &ctx->err);
        for (size_t k = i; rc == DCP_OK && k < i1; k++) {
            long ei = dcp__meta_find(md, st->e[k].key);
            if (ei >= 0 && st->e[k].is_tensor)
                rc = load_tensor(f, &st->e[k], &md->e[ei], verify, &batch, ro,
                                 (size_t)ei, NULL, 0, &ctx->err);
        }
        if (rc == DCP_OK && batch.nparts) {
            if (!eng)
                rc = dcp__ctx_io_begin(ctx, f->dirfd, &eng);
            if (rc == DCP_OK)
                rc = dcp__io_rbatch_run(&batch, eng, &ctx->err);
        }
        dcp__io_rbatch_release(&batch);
        if (hinted)
            dcp__rd_hints_drop(f);
    }
    if (eng)
        dcp__ctx_io_end(ctx, DCP_IO_LOAD);
    if (ro->on) {
        uint64_t nread = 0, nrecv = 0;
        double t = dcp__ph_start(&ctx->ph[DCP_IO_LOAD], DCP_PHASE_EXCHANGE);
        rc = dcp__ro_run(ctx, ro, st, f, md, verify, rc, round, &nread, &nrecv,
                         &dropped);
        dcp__ph_end(&ctx->ph[DCP_IO_LOAD], DCP_PHASE_EXCHANGE, t, nrecv);
    }
    for (i = 0; vals && i < st->n; i++) {
        if (!vals[i])
            continue;
        if (rc == DCP_OK && !dropped) {
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
    if (rc == DCP_ENOENT) /* a rank-local checkpoint? (ranklocal.c) */
        rc = dcp__rl_metadata_bytes(dirfd, path, ctx->max_metadata_bytes, p,
                                    len, &ctx->err);
    if (rc == DCP_ENOENT) /* Hugging Face safetensors files? (hfdir.c) */
        rc = dcp__hf_metadata_bytes(dirfd, path, p, len, &ctx->err);
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

/*
 * Load plan cache. The context keeps the decoded .metadata of its last
 * successful load that reported no missing or unexpected key, with what
 * it was checked against and the read-once plan made for it. A load of
 * the same path with the same flags, whose state has the same structure
 * on every rank (plan.h: keys, kinds, dtypes, shapes, boxes, value sizes)
 * and the same marks for the read-once plan (readonce.h: the chunks each
 * rank's boxes overlap, the memory they are in), and whose .metadata
 * bytes, read by rank 0 as always, have the cached identity (hash and
 * length), reuses it: no broadcast of the bytes, no decode, no key
 * checks, no read planning (their outcome depends on nothing else). The
 * load's first allreduce decides it on every rank alike (ld_begin_agree:
 * this rank matches; its cached identity as min and max; rank 0's current
 * identity, with rank 0's outcome reading the bytes). A changed .metadata
 * (every save writes a new save_id) or any difference on any rank makes
 * every rank decode, check and plan afresh, as does
 * DCP_LOAD_NO_PLAN_CACHE (which keeps nothing). The cache is taken off
 * the context at the start and given back on success only (or when
 * dcp_load's own steps failed: nothing of the load ran). The data files
 * are read and their CRCs checked as on any load.
 */

/* An identity of .metadata's bytes: a 64-bit multiply-xor hash, 8 bytes
 * a step (rank 0 hashes every load's bytes: FNV-1a's byte steps would
 * cost about a second at 887 MiB). */
static uint64_t bytes_id(const uint8_t *p, size_t n)
{
    uint64_t h = 0x9e3779b97f4a7c15ULL ^ (uint64_t)n, w;
    size_t i;
    for (i = 0; i + 8 <= n; i += 8) {
        memcpy(&w, p + i, 8);
        h = (h ^ w) * 0xff51afd7ed558ccdULL;
        h ^= h >> 29;
    }
    for (; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    return h;
}

/*
 * The load's first agreement: what used to take three allreduces (each
 * costs milliseconds through a Python communicator) in one, in stages
 * (dcp__comm_agree_stage): 0 dcp_load's own steps (rc passed in), 1 the
 * arguments' checks, 2 rank 0's read of .metadata; the same path on every
 * rank (as dcp__comm_same_string, a failure of stage 1); whether the
 * cached plan serves (*hit; id gets rank 0's identity of the bytes, their
 * length in id[1] >> 1); whether any rank needs an agreement after
 * dcp_load's post-load steps (post, this rank's in, any rank's out).
 * *fstage gets the stage of the failure agreed on (-1: none, or the
 * communicator failed). Collective; every rank returns the same code.
 */
static int ld_begin_agree(dcp_ctx *ctx, const struct ld_cache *lc,
                          const dcp_state *st, const char *path,
                          unsigned flags, int rc, int stage,
                          const uint8_t *bytes, size_t len,
                          struct pl_local *lp, int64_t id[2], int *hit,
                          int post[2], int *fstage)
{
    struct dcp_err ignore;
    uint64_t h = dcp__fnv1a64(path ? path : "", path ? strlen(path) : 0);
    int64_t v[11];
    int match = rc == DCP_OK && lc && !strcmp(lc->path, path) &&
                lc->flags == flags && !(flags & DCP_LOAD_NO_PLAN_CACHE);
    *hit = 0;
    dcp__err_clear(&ignore);
    /* The structure is wanted for the next load too (st is checked from
     * stage 2 on); failing to encode it only loses the cache. */
    if (stage < 2 || dcp__plan_local(st, lp, &ignore) != DCP_OK)
        match = 0;
    else if (match)
        match = dcp__plan_local_same(lp, &lc->sblob) &&
                dcp__ro_same(&lc->ro, st, lc->md, flags);
    /* min(x) == max(x) over ranks, with max(x) = -min(-x); rank 0's
     * bytes' identity reaches every rank through the minimum (the others
     * pass the largest value); a post-load step anywhere as a 0. */
    v[0] = (int64_t)(h >> 1);
    v[1] = -v[0];
    v[2] = match;
    v[3] = lc ? lc->id[0] : -1;
    v[4] = -v[3];
    v[5] = lc ? lc->id[1] : -1;
    v[6] = -v[5];
    v[7] = v[8] = INT64_MAX;
    if (ctx->rank == 0 && rc == DCP_OK) {
        uint64_t b = bytes_id(bytes, len);
        v[7] = (int64_t)(b >> 1);
        v[8] = (int64_t)((((uint64_t)len << 1) | (b & 1)) & INT64_MAX);
    }
    v[9] = !post[0];
    v[10] = !post[1];
    rc = dcp__comm_agree_stage(ctx->comm, rc, stage, &ctx->err, v, 11, fstage);
    /* The path came before rank 0's read. */
    if ((rc == DCP_OK || *fstage >= 2) && v[0] != -v[1]) {
        *fstage = 1;
        return dcp__err(&ctx->err, DCP_EINVAL,
                        "not every rank passed the same checkpoint path");
    }
    id[0] = v[7];
    id[1] = v[8];
    post[0] = v[9] == 0;
    post[1] = v[10] == 0;
    *hit = rc == DCP_OK && v[2] == 1 && v[3] == -v[4] && v[5] == -v[6] &&
           v[3] == v[7] && v[5] == v[8];
    return rc;
}

/* nreq: 2 + md->n values (dcp__comm_agree_buf's two, then one per
 * entry). */
static int nreq_alloc(dcp_ctx *ctx, const struct dcp_metadata *md,
                      int64_t **nreq)
{
    *nreq = dcp__malloc((2 + md->n) * sizeof(**nreq));
    return *nreq ? DCP_OK : dcp__err(&ctx->err, DCP_ENOMEM, "out of memory");
}

/* After a load that succeeded on every rank: md (taken) becomes the
 * context's cache, when nothing was reported missing or unexpected. */
static void ld_cache_keep(dcp_ctx *ctx, struct ld_cache *lc,
                          struct dcp_metadata **md, const struct pl_local *lp,
                          const char *path, unsigned flags, const int64_t id[2],
                          struct ro_plan *ro)
{
    dcp__ld_cache_free(ctx->load_cache);
    ctx->load_cache = NULL;
    if (ctx->nmissing || ctx->nunexpected || !lp->blob.len ||
        (flags & DCP_LOAD_NO_PLAN_CACHE)) {
        dcp__ld_cache_free(lc);
        return;
    }
    if (!lc)
        lc = dcp__calloc(1, sizeof(*lc));
    if (!lc || dcp__plan_local_structure(lp, &lc->sblob) != DCP_OK) {
        dcp__ld_cache_free(lc);
        return;
    }
    dcp__free(lc->path);
    lc->path = dcp__strdup(path);
    if (!lc->path) {
        dcp__ld_cache_free(lc);
        return;
    }
    dcp__meta_free(lc->md);
    lc->md = *md;
    *md = NULL;
    dcp__ro_release(&lc->ro);
    lc->ro = *ro;
    memset(ro, 0, sizeof(*ro));
    lc->flags = flags;
    lc->id[0] = id[0];
    lc->id[1] = id[1];
    ctx->load_cache = lc;
}

/*
 * dcp__load_state with rc, dcp_load's outcome so far on this rank (agreed
 * in the first allreduce: a failure there ends the load as if it had not
 * begun), and post: whether this rank's post-load steps need an
 * agreement (planner, stateful entries), in; whether any rank's do, out.
 */
static int load_state(dcp_ctx *ctx, dcp_state *st, const char *path,
                      const dcp_load_options *opts, int rc, int post[2])
{
    struct ld_cache *lc;
    struct pl_local lp;
    int64_t id[2] = {0, 0};
    int64_t *nreq = NULL;
    int hit = 0, stage = 0, fstage = -1, stop = 0;
    struct dcp_metadata *md = NULL;
    struct rd_files f;
    struct ro_plan ro;
    uint64_t nbytes = 0;
    uint8_t *bytes = NULL, *got = NULL;
    size_t len = 0, gotlen = 0, i;
    unsigned flags = 0;
    struct dcp__phrec *ph = &ctx->ph[DCP_IO_LOAD];
    double t, t0;
    memset(&lp, 0, sizeof(lp));
    memset(&ro, 0, sizeof(ro));
    lc = ctx->load_cache; /* back on the context on success */
    ctx->load_cache = NULL;
    if (rc == DCP_OK) {
        stage = 1;
        if (!st || !path)
            rc = dcp__err(&ctx->err, DCP_EINVAL,
                          "load: state and path needed");
    }
    if (opts && opts->struct_size >=
                    offsetof(dcp_load_options, flags) + sizeof(opts->flags))
        flags = opts->flags;
    if (rc == DCP_OK && (flags & DCP_LOAD_READ_ONCE) &&
        (flags & DCP_LOAD_PER_RANK_READS))
        rc = dcp__err(&ctx->err, DCP_EINVAL,
                      "load: DCP_LOAD_READ_ONCE and DCP_LOAD_PER_RANK_READS "
                      "both set");
    else if (rc == DCP_OK && (flags & DCP_LOAD_READ_ONCE) && ctx->size > 1 &&
             !dcp__comm_has_p2p(ctx->comm))
        rc = dcp__err(&ctx->err, DCP_ENOTSUP,
                      "load: DCP_LOAD_READ_ONCE needs a communicator with "
                      "point-to-point operations (dcp_comm.h version 2)");
    /* Rank 0 reads .metadata before the ranks agree on the steps before
     * (stages 0 and 1): what it read is dropped when they failed. */
    t0 = dcp__now();
    if (rc == DCP_OK) {
        stage = 2;
        if (ctx->rank == 0)
            rc = read_metadata_bytes(ctx, path, &bytes, &len);
    }
    rc = ld_begin_agree(ctx, lc, st, path, flags, rc, stage, bytes, len, &lp,
                        id, &hit, post, &fstage);
    if (rc != DCP_OK && fstage <= 0) {
        /* dcp_load's own steps failed: nothing of the load ran. */
        ctx->load_cache = lc;
        lc = NULL;
        goto out;
    }
    dcp__ctx_clear_report(ctx);
    ctx->plan_cached[DCP_IO_LOAD] = 0;
    if (rc != DCP_OK && fstage == 1)
        goto out;
    (void)dcp__ph_start(ph, DCP_PHASE_METADATA);
    t = t0; /* the read of .metadata counts */
    if (rc == DCP_OK && hit) {
        /* The cached plan: no broadcast, no decode, no key checks, no
         * read planning. */
        md = lc->md;
        lc->md = NULL;
        ro = lc->ro;
        memset(&lc->ro, 0, sizeof(lc->ro));
        dcp__free(bytes);
        bytes = NULL;
        ctx->plan_cached[DCP_IO_LOAD] = 1;
        dcp__ph_end(ph, DCP_PHASE_METADATA, t, len);
        goto read;
    }
    if (rc == DCP_OK) {
        /* Its length came with the first agreement. */
        gotlen = ctx->rank == 0 ? len : (size_t)((uint64_t)id[1] >> 1);
        rc = dcp__comm_bcast_known(ctx->comm, bytes, gotlen, 0, &got,
                                   &ctx->err);
        if (!got)
            gotlen = 0;
    }
    if (rc != DCP_OK) {
        dcp__ph_end(ph, DCP_PHASE_METADATA, t, 0);
        goto out;
    }
    rc =
        dcp__meta_decode(got ? got : bytes, got ? gotlen : len, &md, &ctx->err);
    if (rc != DCP_OK)
        (void)dcp__err_prefix(&ctx->err, "'%s/.metadata'", path);
    /* Values holding tensors (flatten_state_dict=False) become their
     * leaves (unflat.h), on every rank: each reads those values' pickles.
     * The ranks must end with the same entries (a read failing on one
     * rank leaves its value unexpanded there): checked, collectively,
     * only for such checkpoints (every rank decoded the same bytes; the
     * decode's outcome agreed first). The buffer of the key check's
     * allreduce (its size is the entries') is allocated before the last
     * agreement of these, a failure of it a later stage (as when it was
     * allocated after the key check). */
    stage = 0;
    if (rc == DCP_OK && !dcp__uf_candidates(md)) {
        stage = 1;
        rc = nreq_alloc(ctx, md, &nreq);
    }
    rc = dcp__comm_agree_stage(ctx->comm, rc, stage, &ctx->err, NULL, 0,
                               &fstage);
    if (rc == DCP_OK && dcp__uf_candidates(md)) {
        int64_t nv[2];
        stage = 0;
        rc = dcp__uf_expand(path, md, &ctx->err);
        if (rc == DCP_OK) {
            stage = 1;
            rc = nreq_alloc(ctx, md, &nreq);
        }
        nv[0] = (int64_t)md->n;
        nv[1] = -nv[0];
        rc = dcp__comm_agree_stage(ctx->comm, rc, stage, &ctx->err, nv, 2,
                                   &fstage);
        if ((rc == DCP_OK || fstage >= 1) && nv[0] != -nv[1]) {
            fstage = 0;
            rc = dcp__err(&ctx->err, DCP_EINVAL,
                          "not every rank passed the same entries of the "
                          "unflattened values");
        }
    }
    dcp__ph_end(ph, DCP_PHASE_METADATA, t, got ? gotlen : len);
    dcp__free(bytes);
    dcp__free(got);
    bytes = got = NULL;
    if (rc != DCP_OK && fstage != 1)
        goto out;
    t = dcp__ph_start(ph, DCP_PHASE_VERIFY);
    if (rc != DCP_OK) {
        /* Some rank could not allocate the key check's buffer: the key
         * check's verdict still comes first. */
        int krc = match_keys(ctx, st, md, flags), kstage = 0;
        if (krc == DCP_OK && !nreq) {
            kstage = 1;
            krc = dcp__err(&ctx->err, DCP_ENOMEM, "out of memory");
        }
        rc = dcp__comm_agree_stage(ctx->comm, krc, kstage, &ctx->err, NULL, 0,
                                   NULL);
        dcp__ph_end(ph, DCP_PHASE_VERIFY, t, 0);
        goto out;
    }
    /* This rank's keys checked, and the checkpoint's keys it does not ask
     * for (an element-wise minimum over ranks of "not requested" flags),
     * in one allreduce. */
    rc = match_keys(ctx, st, md, flags);
    for (i = 0; i < md->n; i++)
        nreq[2 + i] = dcp__state_find(st, md->e[i].key) ? 0 : 1;
    rc = dcp__comm_agree_buf(ctx->comm, rc, 0, &ctx->err, nreq, md->n, NULL);
    if (rc != DCP_OK) {
        dcp__ph_end(ph, DCP_PHASE_VERIFY, t, 0);
        goto out;
    }
    rc = unexpected_keys(ctx, md, nreq + 2);
    stop = rc == DCP_OK && unexpected_fail(ctx, flags);
    /* Who reads which shared chunk (readonce.h), agreed together with the
     * unexpected keys (an allocation failure can differ). */
    rc = dcp__ro_plan(ctx, st, md, flags, rc, stop, &ro, &fstage);
    dcp__ph_end(ph, DCP_PHASE_VERIFY, t, 0);
    if (rc == DCP_OK && stop)
        rc = unexpected_err(ctx);
    if (rc != DCP_OK && fstage != 1)
        goto out;
    if (rc != DCP_OK) {
        /* The plan's own failure, as when it was made in the read. */
        t = dcp__ph_start(ph, DCP_PHASE_READ);
        dcp__ph_end(ph, DCP_PHASE_READ, t, 0);
        goto out;
    }
read:
    t = dcp__ph_start(ph, DCP_PHASE_READ);
    {
        uint64_t direct;
        int orc = dcp__rd_open(&f, path, md, &ctx->err);
        rc = load_all(ctx, st, &f, md, !(flags & DCP_LOAD_NO_VERIFY), &ro, orc);
        direct = f.data_read;
        if (orc == DCP_OK)
            dcp__rd_close(&f);
        nbytes = ctx->io_last[DCP_IO_LOAD].bytes + direct;
    }
    rc = dcp__comm_agree_err(ctx->comm, rc, &ctx->err);
    dcp__ph_end(ph, DCP_PHASE_READ, t, rc == DCP_OK ? nbytes : 0);
    if (rc == DCP_OK) {
        ld_cache_keep(ctx, lc, &md, &lp, path, flags, id, &ro);
        lc = NULL;
    }
out:
    dcp__ro_release(&ro);
    dcp__ld_cache_free(lc);
    dcp__plan_local_release(&lp);
    dcp__free(nreq);
    dcp__free(bytes);
    dcp__free(got);
    dcp__meta_free(md);
    return rc;
}

int dcp__load_state(dcp_ctx *ctx, dcp_state *st, const char *path,
                    const dcp_load_options *opts)
{
    int post[2] = {0, 0};
    if (!ctx)
        return DCP_EINVAL;
    dcp__ctx_begin(ctx);
    return load_state(ctx, st, path, opts, DCP_OK, post);
}

int dcp_load(dcp_ctx *ctx, dcp_state *st, const char *path,
             const dcp_load_options *opts)
{
    const dcp_load_planner *planner = dcp__load_opts_planner(opts);
    struct st_expansion ex;
    struct pn_load pl;
    dcp_state *use = NULL;
    int post[2] = {0, 0};
    int rc;
    if (!ctx)
        return DCP_EINVAL;
    dcp__async_settle(ctx);
    dcp__ctx_begin(ctx);
    dcp__ctx_ph_begin(ctx, DCP_IO_LOAD);
    memset(&pl, 0, sizeof(pl));
    rc = dcp__state_expand_io(st, DCP_IO_LOAD, &ex, &ctx->err);
    if (rc == DCP_OK)
        rc = dcp__planner_load(planner, ctx->rank, ctx->size,
                               ex.x ? ex.x : st, &use, &pl, &ctx->err);
    /* Whether the steps after the load can fail (then agreed on): known
     * here, told to every rank by the load's first agreement, which
     * agrees on this outcome too. */
    post[0] = rc == DCP_OK && dcp__planner_loaded_can_fail(planner, &pl);
    post[1] = rc == DCP_OK && ex.x != NULL;
    rc = load_state(ctx, rc == DCP_OK ? use : NULL, path, opts, rc, post);
    if (rc == DCP_OK) {
        double t = dcp__ph_start(&ctx->ph[DCP_IO_LOAD], DCP_PHASE_COPY);
        rc = dcp__planner_loaded(planner, ctx->rank, ctx->size,
                                 ex.x ? ex.x : st, &pl,
                                 (const char *const *)ctx->missing,
                                 ctx->nmissing, &ctx->err);
        if (post[0])
            rc = dcp__comm_agree_err(ctx->comm, rc, &ctx->err);
        if (rc == DCP_OK)
            rc = dcp__state_expand_loaded(&ex, st, &ctx->err);
        if (post[1])
            rc = dcp__comm_agree_err(ctx->comm, rc, &ctx->err);
        dcp__ph_end(&ctx->ph[DCP_IO_LOAD], DCP_PHASE_COPY, t, 0);
    }
    dcp__planner_load_release(&pl);
    dcp__state_expand_release(&ex);
    dcp__ctx_ph_done(ctx, DCP_IO_LOAD);
    return rc;
}
