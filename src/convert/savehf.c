/*
 * dcp_save_hf: a collective save straight to Hugging Face safetensors
 * files, as torch 2.13's HuggingFaceStorageWriter writes them
 * (docs/FORMAT.md §9.5).
 *
 *  1. Every rank describes its tensor boxes (key, dtype, shape, box) to
 *     rank 0, which checks them (the ranks agree on each key's dtype and
 *     shape; replicated boxes are kept once, the lowest rank's; the kept
 *     boxes tile each tensor), assigns each kept box to the rank that holds
 *     it, names the files, creates the directory (which must hold no
 *     *.safetensors file yet), and answers every rank with its file name
 *     and the boxes it writes.
 *  2. Each rank streams its boxes from the caller's buffers into its one
 *     file under a unique temporary name (header first: DCP_SHARDING_INFO
 *     with each box's offsets, DCP_VERSION, format), fsyncs it.
 *  3. Once every rank has written, each renames its file into place; then
 *     rank 0 syncs the directory and, for consolidated output, publishes
 *     model.safetensors.index.json: the commit.
 *
 * Sharded: rank r writes shard-<r+1>-model-00001-of-00001.safetensors with
 * its pieces. Consolidated: every tensor must be held whole by some rank;
 * the lowest such rank writes it, whole; the writing ranks' files are
 * model-<k>-of-<N>.safetensors.
 */
#include "ctx.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "dcp/dcp_convert.h"
#include "json.h"
#include "meta.h"
#include "reshard.h"
#include "safetensors.h"
#include "state.h"
#include "storage.h"

#define HF_INDEX "model.safetensors.index.json"
#define HF_NAME  64

/* One box of one rank, as rank 0 sees it. */
struct hbox {
    const char *key; /* in the gathered blob, not NUL-terminated */
    uint32_t klen;
    uint32_t rank, ei, bi; /* entry and box index on that rank */
    int32_t dtype, ndim;
    int64_t shape[DCP_MAX_NDIM], off[DCP_MAX_NDIM], size[DCP_MAX_NDIM];
    int keep;
};

struct sh {
    dcp_ctx *ctx;
    dcp_state *st;
    const char *dir;
    unsigned flags;
    int consolidated;
    int rank, size;
    struct dcp_err *err;
};

/* ------------------------------------------------------ descriptions */

static int describe(struct sh *s, struct dcp_buf *b)
{
    size_t i, j;
    int d, rc = DCP_OK;
    for (i = 0; rc == DCP_OK && i < s->st->n; i++) {
        const struct st_entry *e = &s->st->e[i];
        if (!e->is_tensor)
            return dcp__err(s->err, DCP_ENOTSUP,
                            "'%s' is not a tensor: safetensors files hold "
                            "tensors only",
                            e->key);
        if (e->mem != DCP_MEM_HOST)
            return dcp__err(s->err, DCP_ENOTSUP,
                            "'%s': only host memory is saved to safetensors",
                            e->key);
        if (!dcp__sf_dtype_name(e->dtype))
            return dcp__err(s->err, DCP_ENOTSUP,
                            "'%s': dtype %s has no safetensors name", e->key,
                            dcp_dtype_name(e->dtype));
        for (j = 0; rc == DCP_OK && j < e->nboxes; j++) {
            const struct st_box *x = &e->boxes[j];
            rc = dcp__buf_put_le32(b, (uint32_t)strlen(e->key));
            if (rc == DCP_OK)
                rc = dcp__buf_put(b, e->key, strlen(e->key));
            if (rc == DCP_OK)
                rc = dcp__buf_put_le32(b, (uint32_t)i);
            if (rc == DCP_OK)
                rc = dcp__buf_put_le32(b, (uint32_t)j);
            if (rc == DCP_OK)
                rc = dcp__buf_put_le32(b, (uint32_t)e->dtype);
            if (rc == DCP_OK)
                rc = dcp__buf_put_le32(b, (uint32_t)e->ndim);
            for (d = 0; rc == DCP_OK && d < e->ndim; d++) {
                rc = dcp__buf_put_le64(b, (uint64_t)e->shape[d]);
                if (rc == DCP_OK)
                    rc = dcp__buf_put_le64(b, (uint64_t)x->off[d]);
                if (rc == DCP_OK)
                    rc = dcp__buf_put_le64(b, (uint64_t)x->size[d]);
            }
        }
    }
    return rc == DCP_OK ? DCP_OK : dcp__err(s->err, rc, "out of memory");
}

/* Decodes rank r's description p[0..len) into *v (grown). */
static int decode(struct sh *s, const uint8_t *p, size_t len, uint32_t r,
                  struct hbox **v, size_t *n, size_t *cap)
{
    size_t pos = 0;
    int d;
    while (pos < len) {
        struct hbox *h;
        if (*n == *cap) {
            size_t c = *cap ? 2 * *cap : 64;
            h = dcp__realloc(*v, c * sizeof(*h));
            if (!h)
                return dcp__err(s->err, DCP_ENOMEM, "out of memory");
            *v = h;
            *cap = c;
        }
        h = &(*v)[*n];
        memset(h, 0, sizeof(*h));
        if (len - pos < 4 || len - pos - 4 < dcp__le32(p + pos) ||
            len - pos - 4 - dcp__le32(p + pos) < 16)
            return dcp__err(s->err, DCP_EIO, "rank %u sent a bad plan", r);
        h->klen = dcp__le32(p + pos);
        h->key = (const char *)p + pos + 4;
        pos += 4 + h->klen;
        h->rank = r;
        h->ei = dcp__le32(p + pos);
        h->bi = dcp__le32(p + pos + 4);
        h->dtype = (int32_t)dcp__le32(p + pos + 8);
        h->ndim = (int32_t)dcp__le32(p + pos + 12);
        pos += 16;
        if (h->ndim < 0 || h->ndim > DCP_MAX_NDIM ||
            len - pos < (size_t)h->ndim * 24)
            return dcp__err(s->err, DCP_EIO, "rank %u sent a bad plan", r);
        for (d = 0; d < h->ndim; d++, pos += 24) {
            h->shape[d] = (int64_t)dcp__le64(p + pos);
            h->off[d] = (int64_t)dcp__le64(p + pos + 8);
            h->size[d] = (int64_t)dcp__le64(p + pos + 16);
        }
        (*n)++;
    }
    return DCP_OK;
}

static int cmp_key(const struct hbox *a, const struct hbox *b)
{
    size_t n = a->klen < b->klen ? a->klen : b->klen;
    int c = memcmp(a->key, b->key, n);
    return c ? c : (a->klen > b->klen) - (a->klen < b->klen);
}

/* By key, then box (dim-0 offset first), then rank. */
static int cmp_hbox(const void *pa, const void *pb)
{
    const struct hbox *a = pa, *b = pb;
    int c = cmp_key(a, b), d;
    if (c)
        return c;
    for (d = 0; d < a->ndim && d < b->ndim; d++)
        if (a->off[d] != b->off[d])
            return a->off[d] < b->off[d] ? -1 : 1;
    for (d = 0; d < a->ndim && d < b->ndim; d++)
        if (a->size[d] != b->size[d])
            return a->size[d] < b->size[d] ? -1 : 1;
    return (a->rank > b->rank) - (a->rank < b->rank);
}

static int overlap(const struct hbox *a, const struct hbox *b)
{
    return dcp__boxes_overlap(a->ndim, a->off, a->size, b->off, b->size);
}

static int whole(const struct hbox *h)
{
    int d;
    for (d = 0; d < h->ndim; d++)
        if (h->off[d] != 0 || h->size[d] != h->shape[d])
            return 0;
    return 1;
}

/* Marks the boxes v[0..n) of one key to keep, checking them. */
static int plan_key(struct sh *s, struct hbox *v, size_t n)
{
    uint64_t total = dcp__box_numel(v[0].ndim, v[0].shape), sum = 0;
    size_t i, j, kept = 0, last = 0;
    for (i = 1; i < n; i++)
        if (v[i].dtype != v[0].dtype || v[i].ndim != v[0].ndim ||
            !dcp__same_ints(v[i].shape, v[0].shape, v[0].ndim))
            return dcp__err(s->err, DCP_EMISMATCH,
                            "'%.*s': ranks %u and %u disagree on its dtype "
                            "or shape",
                            (int)v[0].klen, v[0].key, v[0].rank, v[i].rank);
    if (s->consolidated) {
        for (i = 0; i < n && !whole(&v[i]); i++)
            ;
        if (i == n)
            return dcp__err(s->err, DCP_ENOTSUP,
                            "'%.*s' is held whole by no rank: consolidated "
                            "output needs one (write it sharded)",
                            (int)v[0].klen, v[0].key);
        for (j = i + 1; j < n; j++) /* the lowest rank holding it whole */
            if (whole(&v[j]) && v[j].rank < v[i].rank)
                i = j;
        v[i].keep = 1;
        return DCP_OK;
    }
    for (i = 0; i < n; i++) {
        uint64_t vol = dcp__box_numel(v[i].ndim, v[i].size);
        if (vol == 0 && (total != 0 || kept))
            continue; /* empty boxes hold nothing */
        if (kept && dcp__same_ints(v[i].off, v[last].off, v[i].ndim) &&
            dcp__same_ints(v[i].size, v[last].size, v[i].ndim))
            continue; /* replicated: the lowest rank's (sorted first) */
        for (j = 0; j < i; j++)
            if (v[j].keep && vol && overlap(&v[i], &v[j]))
                return dcp__err(s->err, DCP_EINVAL,
                                "'%.*s': the boxes of ranks %u and %u "
                                "overlap without being equal",
                                (int)v[0].klen, v[0].key, v[j].rank, v[i].rank);
        v[i].keep = 1;
        last = i;
        kept++;
        sum += vol;
    }
    if (sum != total)
        return dcp__err(s->err, DCP_EINVAL,
                        "'%.*s': the ranks' boxes cover %" PRIu64
                        " of its %" PRIu64 " elements",
                        (int)v[0].klen, v[0].key, sum, total);
    return DCP_OK;
}

/* ------------------------------------------------------------- rank 0 */

static int check_dir(struct sh *s)
{
    dcp_storage_entry *ls;
    size_t cnt = 0, i, k = sizeof(".safetensors") - 1;
    int dirfd = -1, rc = dcp__fs_mkdirs(s->dir, s->err);
    if (rc == DCP_OK)
        rc = dcp__fs_open_dir(s->dir, &dirfd, s->err);
    if (rc != DCP_OK)
        return rc;
    ls = dcp__malloc(4096 * sizeof(*ls));
    rc = ls ? dcp__fs_list(dirfd, "", 4096, ls, &cnt, s->err) : DCP_ENOMEM;
    if (rc == DCP_ENOTSUP || rc == DCP_ELIMIT)
        rc = DCP_OK; /* cannot tell: the exclusive renames still protect */
    for (i = 0; rc == DCP_OK && i < cnt; i++) {
        size_t n = strlen(ls[i].name);
        if (!strcmp(ls[i].name, HF_INDEX) || !strcmp(ls[i].name, ".metadata") ||
            (n > k && !strcmp(ls[i].name + n - k, ".safetensors")))
            rc = dcp__err(s->err, DCP_EEXIST,
                          "'%s' already holds '%s': safetensors output goes "
                          "to a directory without one",
                          s->dir, ls[i].name);
    }
    dcp__free(ls);
    dcp__fs_release(dirfd);
    return rc == DCP_ENOMEM ? dcp__err(s->err, rc, "out of memory") : rc;
}

/*
 * Rank 0: checks the gathered descriptions and writes each rank's answer
 * into out (file name, then (entry, box) pairs), lens and displs; the
 * index into idx for consolidated output.
 */
static int plan(struct sh *s, const uint8_t *all, const size_t *lens,
                const size_t *displs, struct dcp_buf *out, size_t *alens,
                size_t *adispl, struct dcp_buf *idx)
{
    struct hbox *v = NULL;
    size_t n = 0, cap = 0, i, j;
    uint32_t *nw = NULL, *fileno = NULL, nfiles = 0, r;
    uint64_t total = 0;
    int rc = DCP_OK, idx_first = 1;
    for (r = 0; rc == DCP_OK && r < (uint32_t)s->size; r++)
        rc = decode(s, all + displs[r], lens[r], r, &v, &n, &cap);
    if (rc == DCP_OK && n == 0)
        rc = dcp__err(s->err, DCP_EINVAL, "no tensor to save");
    if (rc != DCP_OK)
        goto out;
    qsort(v, n, sizeof(*v), cmp_hbox);
    for (i = 0; rc == DCP_OK && i < n; i = j) {
        for (j = i + 1; j < n && !cmp_key(&v[i], &v[j]); j++)
            ;
        rc = plan_key(s, v + i, j - i);
    }
    nw = dcp__calloc((size_t)s->size, sizeof(*nw));
    fileno = dcp__calloc((size_t)s->size, sizeof(*fileno));
    if (rc == DCP_OK && (!nw || !fileno))
        rc = dcp__err(s->err, DCP_ENOMEM, "out of memory");
    /* fileno doubles as each rank's last key group + 1 here: a kept box
     * whose rank already has one in this group is a second piece. */
    for (i = 0, j = 0; rc == DCP_OK && i < n; i++) {
        if (i > 0 && cmp_key(&v[i], &v[i - 1]))
            j = i; /* start of the key group */
        if (!v[i].keep)
            continue;
        if (fileno[v[i].rank] == (uint32_t)j + 1)
            rc = dcp__err(s->err, DCP_ENOTSUP,
                          "rank %u holds two boxes of '%.*s': one piece of "
                          "a tensor per rank",
                          v[i].rank, (int)v[i].klen, v[i].key);
        fileno[v[i].rank] = (uint32_t)j + 1;
        nw[v[i].rank]++;
    }
    for (r = 0; r < (uint32_t)s->size && rc == DCP_OK; r++)
        fileno[r] = nw[r] ? ++nfiles : 0; /* from here, the file numbers */
    if (rc == DCP_OK)
        rc = check_dir(s);
    for (i = 0; i < n; i++)
        if (v[i].keep)
            total += dcp__box_numel(v[i].ndim, v[i].size) *
                     dcp_dtype_size((dcp_dtype)v[i].dtype);
    if (rc == DCP_OK && s->consolidated)
        rc = dcp__buf_printf(idx,
                             "{\n  \"metadata\": {\n    \"total_size\": "
                             "%" PRIu64 "\n  },\n  \"weight_map\": {",
                             total);
    for (r = 0; rc == DCP_OK && r < (uint32_t)s->size; r++) {
        char name[HF_NAME] = "";
        size_t at = out->len;
        if (nw[r] && s->consolidated)
            (void)snprintf(name, sizeof(name), "model-%05u-of-%05u.safetensors",
                           fileno[r], nfiles);
        else if (nw[r])
            (void)snprintf(name, sizeof(name),
                           "shard-%05u-model-00001-of-00001.safetensors",
                           r + 1);
        adispl[r] = at;
        rc = dcp__buf_put_le32(out, (uint32_t)strlen(name));
        if (rc == DCP_OK)
            rc = dcp__buf_put(out, name, strlen(name));
        for (i = 0; rc == DCP_OK && i < n; i++) {
            if (!v[i].keep || v[i].rank != r)
                continue;
            rc = dcp__buf_put_le32(out, v[i].ei);
            if (rc == DCP_OK)
                rc = dcp__buf_put_le32(out, v[i].bi);
            if (rc != DCP_OK || !s->consolidated)
                continue;
            rc = dcp__buf_printf(idx, "%s\n    ", idx_first ? "" : ",");
            idx_first = 0;
            if (rc == DCP_OK)
                rc = dcp__json_put_str(idx, v[i].key, v[i].klen);
            if (rc == DCP_OK)
                rc = dcp__buf_printf(idx, ": \"%s\"", name);
        }
        alens[r] = out->len - at;
    }
    if (rc == DCP_OK && s->consolidated)
        rc = dcp__buf_printf(idx, "\n  }\n}");
    if (rc == DCP_ENOMEM)
        rc = dcp__err(s->err, rc, "out of memory");
out:
    dcp__free(v);
    dcp__free(nw);
    dcp__free(fileno);
    return rc;
}

/* --------------------------------------------------------- each rank */

struct wt {
    const struct st_entry *e;
    const struct st_box *b;
    size_t es;
};

static int cmp_wt(const void *pa, const void *pb)
{
    const struct wt *a = pa, *b = pb;
    if (a->es != b->es)
        return a->es > b->es ? -1 : 1;
    return strcmp(a->e->key, b->e->key);
}

/* Writes this rank's file (answer p[0..len)) under a temporary name in
 * tmp; *wrote is set when there is one. */
static int write_mine(struct sh *s, int dirfd, const uint8_t *p, size_t len,
                      char *final, char *tmp, size_t cap, int *wrote)
{
    struct wt *w = NULL;
    struct sf_out *so = NULL;
    struct dcp_buf hdr = {0}, info = {0};
    const char *meta[6];
    size_t n, i, nl, nmeta = 0;
    uint64_t pos = 0;
    int fd = -1, rc = DCP_OK, d;
    *wrote = 0;
    if (len < 4 || (nl = dcp__le32(p)) > len - 4 || nl >= HF_NAME ||
        (len - 4 - nl) % 8)
        return dcp__err(s->err, DCP_EIO, "a bad answer from rank 0");
    memcpy(final, p + 4, nl);
    final[nl] = '\0';
    n = (len - 4 - nl) / 8;
    if (n == 0)
        return DCP_OK;
    if (nl == 0 || strlen(final) != nl || !dcp__safe_name(final))
        return dcp__err(s->err, DCP_EIO, "a bad file name from rank 0");
    w = dcp__calloc(n, sizeof(*w));
    so = dcp__calloc(n, sizeof(*so));
    if (!w || !so) {
        rc = dcp__err(s->err, DCP_ENOMEM, "out of memory");
        goto out;
    }
    for (i = 0; i < n; i++) {
        uint32_t ei = dcp__le32(p + 4 + nl + 8 * i);
        uint32_t bi = dcp__le32(p + 8 + nl + 8 * i);
        if (ei >= s->st->n || bi >= s->st->e[ei].nboxes) {
            rc = dcp__err(s->err, DCP_EIO, "a bad answer from rank 0");
            goto out;
        }
        w[i].e = &s->st->e[ei];
        w[i].b = &w[i].e->boxes[bi];
        w[i].es = dcp_dtype_size(w[i].e->dtype);
    }
    qsort(w, n, sizeof(*w), cmp_wt); /* largest elements first: aligned */
    rc = dcp__buf_printf(&info, "{");
    for (i = 0; rc == DCP_OK && i < n; i++) {
        so[i].name = w[i].e->key;
        so[i].dtype = w[i].e->dtype;
        so[i].ndim = w[i].e->ndim;
        so[i].shape = w[i].b->size;
        rc = dcp__buf_printf(&info, "%s", i ? ", " : "");
        if (rc == DCP_OK)
            rc = dcp__json_put_str(&info, w[i].e->key, strlen(w[i].e->key));
        if (rc == DCP_OK)
            rc = dcp__buf_printf(&info, ": {\"saved_offsets\": [");
        for (d = 0; rc == DCP_OK && d < w[i].e->ndim; d++)
            rc = dcp__buf_printf(&info, "%s%" PRId64, d ? ", " : "",
                                 w[i].b->off[d]);
        if (rc == DCP_OK)
            rc = dcp__buf_printf(&info, "]}");
    }
    if (rc == DCP_OK)
        rc = dcp__buf_put(&info, "}", 2); /* with the NUL */
    if (rc != DCP_OK) {
        rc = dcp__err(s->err, DCP_ENOMEM, "out of memory");
        goto out;
    }
    if (!s->consolidated) {
        meta[2 * nmeta] = "DCP_SHARDING_INFO";
        meta[2 * nmeta++ + 1] = (const char *)info.p;
        meta[2 * nmeta] = "DCP_VERSION";
        meta[2 * nmeta++ + 1] = "1.0";
    }
    meta[2 * nmeta] = "format";
    meta[2 * nmeta++ + 1] = "pt";
    rc = dcp__sf_header_build(so, n, meta, nmeta, &hdr, NULL);
    if (rc != DCP_OK) {
        rc = dcp__err(s->err, rc, "'%s': cannot build its header", final);
        goto out;
    }
    rc = dcp__unique_tmp(tmp, cap, final, s->err);
    if (rc == DCP_OK)
        rc = dcp__fs_create(dirfd, tmp, &fd, s->err);
    if (rc != DCP_OK)
        goto out;
    *wrote = 1;
    rc = dcp__fs_pwrite(fd, hdr.p, hdr.len, 0, final, s->err);
    pos = hdr.len;
    for (i = 0; rc == DCP_OK && i < n; i++) {
        size_t bytes =
            (size_t)dcp__box_numel(w[i].e->ndim, w[i].b->size) * w[i].es;
        if (bytes && w[i].b->strided) {
            /* a strided box (dcp_state_add_tensor_strided): packed first */
            int64_t cs[DCP_MAX_NDIM];
            void *pk = dcp__malloc(bytes);
            if (!pk) {
                rc = dcp__err(s->err, DCP_ENOMEM, "out of memory");
                break;
            }
            dcp__box_cstrides(w[i].e->ndim, w[i].b->size, cs);
            dcp__box_copy(w[i].e->ndim, w[i].es, w[i].b->size, w[i].b->buf, 0,
                          w[i].b->stride, pk, 0, cs);
            rc = dcp__fs_pwrite(fd, pk, bytes, pos, final, s->err);
            dcp__free(pk);
        } else if (bytes) {
            rc = dcp__fs_pwrite(fd, w[i].b->buf, bytes, pos, final, s->err);
        }
        pos += bytes;
    }
    if (rc == DCP_OK && !(s->flags & DCP_CONVERT_NO_FSYNC))
        rc = dcp__fs_fsync(fd, final, s->err);
    {
        int crc = dcp__fs_close(fd, final, rc == DCP_OK ? s->err : NULL);
        if (rc == DCP_OK)
            rc = crc;
    }
out:
    dcp__free(w);
    dcp__free(so);
    dcp__buf_free(&hdr);
    dcp__buf_free(&info);
    return rc;
}

static int run(struct sh *s)
{
    const dcp_comm *c = s->ctx->comm;
    struct dcp_buf desc = {0}, ans = {0}, idx = {0};
    uint8_t *all = NULL, *mine = NULL;
    size_t *lens = NULL, *displs = NULL, *alens = NULL, *adispl = NULL;
    size_t mlen = 0;
    char final[HF_NAME], tmp[DCP_STORAGE_NAME_MAX + 1];
    int dirfd = -1, wrote = 0, renamed = 0, visible = 0, lrc, rc;
    char flags[32];
    rc = dcp__comm_same_string(c, s->dir, "directory", s->err);
    (void)snprintf(flags, sizeof(flags), "%u", s->flags);
    if (rc == DCP_OK)
        rc = dcp__comm_same_string(c, flags, "options' flags", s->err);
    if (rc != DCP_OK)
        return rc;
    rc = dcp__comm_agree_err(c, describe(s, &desc), s->err);
    if (rc == DCP_OK)
        rc = dcp__comm_gather_blob(c, desc.p, desc.len, 0, &all, &lens, &displs,
                                   s->err);
    if (rc == DCP_OK && s->rank == 0) {
        alens = dcp__calloc((size_t)s->size, sizeof(*alens));
        adispl = dcp__calloc((size_t)s->size, sizeof(*adispl));
        lrc = alens && adispl
                  ? plan(s, all, lens, displs, &ans, alens, adispl, &idx)
                  : dcp__err(s->err, DCP_ENOMEM, "out of memory");
    } else {
        lrc = DCP_OK;
    }
    if (rc == DCP_OK)
        rc = dcp__comm_share_err(c, lrc, s->err, 0);
    if (rc == DCP_OK)
        rc = dcp__comm_scatter_blob(c, ans.p, alens, adispl, 0, &mine, &mlen,
                                    s->err);
    /* 2. each rank its file */
    if (rc == DCP_OK) {
        lrc = dcp__fs_open_dir(s->dir, &dirfd, s->err);
        if (lrc == DCP_OK)
            lrc = write_mine(s, dirfd, mine, mlen, final, tmp, sizeof(tmp),
                             &wrote);
        rc = dcp__comm_agree_err(c, lrc, s->err);
    }
    /* 3. the commit: renames, the directory, the index */
    if (rc == DCP_OK) {
        lrc = wrote ? dcp__fs_rename(dirfd, tmp, final, s->err) : DCP_OK;
        renamed = wrote && lrc == DCP_OK;
        rc = dcp__comm_agree_err(c, lrc, s->err);
    }
    if (rc == DCP_OK) {
        lrc = DCP_OK;
        if (s->rank == 0 && !(s->flags & DCP_CONVERT_NO_FSYNC))
            lrc = dcp__fs_fsync_dir(dirfd, s->dir, s->err);
        if (s->rank == 0 && lrc == DCP_OK && s->consolidated)
            lrc = dcp__fs_publish(
                dirfd, s->dir, HF_INDEX, idx.p, idx.len,
                s->flags & DCP_CONVERT_NO_FSYNC ? DCP_PUBLISH_NOSYNC : 0,
                &visible, s->err);
        rc = dcp__comm_share_err(c, lrc, s->err, 0);
    }
    /* Nothing of a failed save stays: the files carry no commit marker of
     * their own (torch's layout has none), so a reader would take the
     * renamed shards of the other ranks as the whole checkpoint. */
    if (rc != DCP_OK && dirfd >= 0) {
        if (renamed)
            (void)dcp__fs_unlink(dirfd, final, NULL);
        else if (wrote)
            (void)dcp__fs_unlink(dirfd, tmp, NULL);
        if (visible)
            (void)dcp__fs_unlink(dirfd, HF_INDEX, NULL);
    }
    if (dirfd >= 0)
        dcp__fs_release(dirfd);
    dcp__buf_free(&desc);
    dcp__buf_free(&ans);
    dcp__buf_free(&idx);
    dcp__free(all);
    dcp__free(lens);
    dcp__free(displs);
    dcp__free(alens);
    dcp__free(adispl);
    dcp__free(mine);
    return rc;
}

int dcp_save_hf(dcp_ctx *ctx, dcp_state *st, const char *dir,
                const dcp_convert_options *opts)
{
    struct sh s;
    int rc = DCP_OK;
    if (!ctx)
        return DCP_EINVAL;
    dcp__ctx_begin(ctx);
    if (!st || !dir || !*dir)
        rc = dcp__err(&ctx->err, DCP_EINVAL, "no state or directory");
    else if (opts &&
             (opts->struct_size == 0 || opts->struct_size > sizeof(*opts) ||
              opts->dtype || opts->max_shard_bytes || opts->nkeys ||
              opts->strip_prefix || opts->add_prefix ||
              (opts->flags & ~(unsigned)(DCP_CONVERT_NO_FSYNC |
                                         DCP_CONVERT_HF_CONSOLIDATED))))
        rc = dcp__err(&ctx->err, DCP_EINVAL,
                      "bad options for a safetensors save (only flags "
                      "DCP_CONVERT_NO_FSYNC and "
                      "DCP_CONVERT_HF_CONSOLIDATED apply)");
    /* every rank returns the same: one rank's bad arguments fail all */
    rc = dcp__comm_agree_err(ctx->comm, rc, &ctx->err);
    if (rc != DCP_OK)
        return rc;
    memset(&s, 0, sizeof(s));
    s.ctx = ctx;
    s.st = st;
    s.dir = dir;
    s.flags = opts ? opts->flags : 0;
    s.consolidated = (s.flags & DCP_CONVERT_HF_CONSOLIDATED) != 0;
    s.rank = dcp__comm_rank(ctx->comm);
    s.size = dcp__comm_size(ctx->comm);
    s.err = &ctx->err;
    return run(&s);
}
