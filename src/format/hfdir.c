/*
 * Hugging Face safetensors directories read as a checkpoint (hfdir.h,
 * docs/FORMAT.md §9.5).
 *
 * Every *.safetensors file of the directory is listed and its header
 * parsed (bounded, safetensors.c); each tensor of it becomes a piece, placed
 * in its global tensor by the file's DCP_SHARDING_INFO (a JSON string in
 * __metadata__, parsed bounded too) or at the origin without one. Pieces
 * are grouped by name; the group must agree on dtype and rank, and tile
 * the extent of the pieces exactly. The result is a struct dcp_metadata
 * whose every chunk points at the start of its file with the piece's byte
 * length, which ckpt's readers take as §9.3's safetensors records: the
 * tensor is found there by its name.
 */
#include "hfdir.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "safetensors.h"
#include "storage.h"

#define HF_SUFFIX     ".safetensors"
#define HF_INFO_KEY   "DCP_SHARDING_INFO"
#define HF_MAX_PIECES ((size_t)1 << 21)
/* Box comparisons of the overlap check, all tensors together. */
#define HF_MAX_CMP ((uint64_t)1 << 28)

struct hf {
    const char *path;
    char **files; /* the directory's *.safetensors names */
    size_t nfiles;
    struct hf_piece *p;
    size_t np, cap;
    uint64_t cmp; /* overlap comparisons made */
    struct dcp_err *err;
};

void dcp__hf_release(struct hf_dir *d)
{
    size_t i;
    if (!d)
        return;
    for (i = 0; i < d->np; i++)
        dcp__free(d->p[i].key);
    dcp__free(d->p);
    for (i = 0; i < d->nfiles; i++)
        dcp__free(d->files[i]);
    dcp__free(d->files);
    dcp__free(d->t);
    memset(d, 0, sizeof(*d));
}

static int is_sf_name(const char *s)
{
    size_t n = strlen(s), k = sizeof(HF_SUFFIX) - 1;
    return n > k && s[0] != '.' && strcmp(s + n - k, HF_SUFFIX) == 0 &&
           dcp__safe_name(s);
}

/* The directory's safetensors names, sorted (dcp__fs_list sorts). */
static int list_files(struct hf *h, int dirfd)
{
    dcp_storage_entry *ls = NULL;
    size_t cap = 256, cnt = 0, i;
    int rc;
    for (;;) {
        ls = dcp__malloc(cap * sizeof(*ls));
        if (!ls)
            return dcp__err(h->err, DCP_ENOMEM, "out of memory");
        rc = dcp__fs_list(dirfd, "", cap, ls, &cnt, NULL);
        if (rc != DCP_ELIMIT || cap == HF_MAX_FILES)
            break;
        dcp__free(ls);
        cap = HF_MAX_FILES;
    }
    if (rc == DCP_ELIMIT)
        rc = dcp__err(h->err, DCP_ELIMIT,
                      "'%s': more than %d names in a directory read as "
                      "safetensors files",
                      h->path, HF_MAX_FILES);
    else if (rc != DCP_OK)
        rc = DCP_ENOENT; /* cannot list: not read as safetensors */
    if (rc == DCP_OK) {
        h->files = dcp__calloc(cnt ? cnt : 1, sizeof(*h->files));
        if (!h->files)
            rc = dcp__err(h->err, DCP_ENOMEM, "out of memory");
    }
    for (i = 0; rc == DCP_OK && i < cnt; i++) {
        if (!is_sf_name(ls[i].name))
            continue;
        h->files[h->nfiles] = dcp__strdup(ls[i].name);
        if (!h->files[h->nfiles])
            rc = dcp__err(h->err, DCP_ENOMEM, "out of memory");
        else
            h->nfiles++;
    }
    dcp__free(ls);
    if (rc == DCP_OK && h->nfiles == 0)
        rc = DCP_ENOENT;
    return rc;
}

static int cmp_member(const void *a, const void *b)
{
    const struct json_node *const *x = a, *const *y = b;
    size_t n = x[0]->len < y[0]->len ? x[0]->len : y[0]->len;
    int c = memcmp(x[0]->s, y[0]->s, n);
    return c ? c : (x[0]->len > y[0]->len) - (x[0]->len < y[0]->len);
}

/* The value of key in members (key, value pairs sorted by key), or NULL. */
static const struct json_node *find_member(const struct json_node **m, size_t n,
                                           const char *key)
{
    size_t lo = 0, hi = n, len = strlen(key);
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2, k = m[2 * mid]->len;
        int c = memcmp(m[2 * mid]->s, key, k < len ? k : len);
        if (!c)
            c = (k > len) - (k < len);
        if (!c)
            return m[2 * mid + 1];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* Fills p->off from the DCP_SHARDING_INFO entry v of tensor p->key. */
static int piece_offsets(struct hf *h, const char *file, struct hf_piece *p,
                         const struct json_node *v)
{
    const struct json_node *so = v ? dcp__json_get(v, "saved_offsets") : NULL;
    int d;
    if (!v || v->kind != JSON_OBJ || !so || so->kind != JSON_ARR ||
        so->len != (size_t)p->ndim)
        return dcp__err(h->err, DCP_EFORMAT,
                        "'%s/%s': tensor '%s': %s DCP_SHARDING_INFO entry "
                        "with saved_offsets of %d integers",
                        h->path, file, p->key, v ? "not a" : "no", p->ndim);
    for (d = 0; d < p->ndim; d++) {
        const struct json_node *o = so->v[d];
        if (o->kind != JSON_NUM || !o->is_int || o->i < 0 ||
            o->i > INT64_MAX - p->size[d])
            return dcp__err(h->err, DCP_EFORMAT,
                            "'%s/%s': tensor '%s': saved_offsets[%d] is not "
                            "an integer from 0 to %" PRId64,
                            h->path, file, p->key, d, INT64_MAX - p->size[d]);
        p->off[d] = o->i;
    }
    return DCP_OK;
}

/* The pieces of one parsed file. info: its DCP_SHARDING_INFO members
 * sorted (n pairs), or NULL without one. */
static int add_pieces(struct hf *h, uint32_t f, const struct sf_file *sf,
                      const struct json_node **info, size_t n)
{
    size_t i;
    int rc = DCP_OK;
    if (h->np + sf->n > HF_MAX_PIECES)
        return dcp__err(h->err, DCP_ELIMIT,
                        "'%s': more than %zu tensors in its safetensors files",
                        h->path, HF_MAX_PIECES);
    if (h->np + sf->n > h->cap) {
        size_t c = h->np + sf->n > 2 * h->cap ? h->np + sf->n : 2 * h->cap;
        struct hf_piece *p = dcp__realloc(h->p, c * sizeof(*p));
        if (!p)
            return dcp__err(h->err, DCP_ENOMEM, "out of memory");
        h->p = p;
        h->cap = c;
    }
    for (i = 0; rc == DCP_OK && i < sf->n; i++) {
        const struct sf_tensor *t = &sf->t[i];
        struct hf_piece *p = &h->p[h->np];
        memset(p, 0, sizeof(*p));
        p->key = dcp__strdup(t->name);
        if (!p->key)
            return dcp__err(h->err, DCP_ENOMEM, "out of memory");
        h->np++;
        p->file = f;
        p->dtype = t->dtype;
        p->ndim = t->ndim;
        p->bytes = t->end - t->begin;
        p->data = sf->data_off + t->begin;
        memcpy(p->size, t->shape, sizeof(p->size));
        if (info)
            rc =
                piece_offsets(h, h->files[f], p, find_member(info, n, t->name));
    }
    return rc;
}

/*
 * The DCP_SHARDING_INFO of sf (file name, in h->path), parsed: *m its
 * members (key, value pairs) sorted by key, *n pairs; *m NULL without
 * one. Free *m and *doc.
 */
static int info_members(struct hf *h, const char *name,
                        const struct sf_file *sf, struct json_doc **doc,
                        const struct json_node ***m, size_t *n)
{
    struct json_node *root = NULL;
    const char *info = NULL;
    size_t i, len;
    int rc;
    *doc = NULL;
    *m = NULL;
    *n = 0;
    for (i = 0; i < sf->nmeta; i++)
        if (!strcmp(sf->meta[2 * i], HF_INFO_KEY))
            info = sf->meta[2 * i + 1];
    if (!info)
        return DCP_OK;
    len = strlen(info);
    rc = dcp__json_parse(info, len, 4,
                         len / 2 + 16 < ((size_t)1 << 22) ? len / 2 + 16
                                                          : ((size_t)1 << 22),
                         doc, &root, h->err);
    if (rc == DCP_OK && root->kind != JSON_OBJ)
        rc = dcp__err(h->err, DCP_EFORMAT, "not a JSON object");
    if (rc == DCP_OK && dcp__json_dup_key(root))
        rc = dcp__err(h->err, DCP_EFORMAT, "tensor '%s' given twice",
                      dcp__json_dup_key(root));
    if (rc != DCP_OK)
        return dcp__err_prefix(h->err, "'%s/%s': " HF_INFO_KEY, h->path, name);
    *m = dcp__malloc((2 * root->len + 1) * sizeof(**m));
    if (!*m)
        return dcp__err(h->err, DCP_ENOMEM, "out of memory");
    for (i = 0; i < 2 * root->len; i++)
        (*m)[i] = root->v[i];
    qsort(*m, root->len, 2 * sizeof(**m), cmp_member);
    *n = root->len;
    return DCP_OK;
}

/* Reads file f's header and adds its pieces. */
static int read_file(struct hf *h, int dirfd, uint32_t f)
{
    const char *name = h->files[f];
    struct json_doc *doc = NULL;
    const struct json_node **m = NULL;
    struct sf_file sf;
    uint64_t size = 0;
    size_t n = 0;
    int fd = -1, rc;
    memset(&sf, 0, sizeof(sf));
    rc = dcp__fs_open_read(dirfd, name, &fd, &size, h->err);
    if (rc == DCP_OK)
        rc = dcp__sf_read(fd, name, size, &sf, h->err);
    if (fd >= 0)
        (void)dcp__fs_close(fd, name, NULL);
    if (rc != DCP_OK) {
        dcp__sf_release(&sf);
        return dcp__err_prefix(h->err, "'%s'", h->path);
    }
    rc = info_members(h, name, &sf, &doc, &m, &n);
    if (rc == DCP_OK)
        rc = add_pieces(h, f, &sf, m, n);
    dcp__free(m);
    dcp__json_free(doc);
    dcp__sf_release(&sf);
    return rc;
}

int dcp__hf_check_whole(const struct sf_file *sf, const char *name,
                        struct dcp_err *err)
{
    struct json_doc *doc = NULL;
    const struct json_node **m = NULL;
    struct hf_piece p;
    struct hf h;
    char s[160];
    size_t i, n = 0;
    int rc, d;
    memset(&h, 0, sizeof(h));
    h.path = ".";
    h.err = err;
    rc = info_members(&h, name, sf, &doc, &m, &n);
    for (i = 0; rc == DCP_OK && m && i < sf->n; i++) {
        const struct sf_tensor *t = &sf->t[i];
        memset(&p, 0, sizeof(p));
        p.key = (char *)(uintptr_t)t->name; /* read only */
        p.ndim = t->ndim;
        memcpy(p.size, t->shape, sizeof(p.size));
        rc = piece_offsets(&h, name, &p, find_member(m, n, t->name));
        for (d = 0; rc == DCP_OK && d < p.ndim; d++)
            if (p.off[d]) {
                (void)dcp_shape_format(s, sizeof(s), p.ndim, p.off);
                rc = dcp__err(err, DCP_EFORMAT,
                              "'%s': tensor '%s' is a piece at %s of a "
                              "larger tensor (" HF_INFO_KEY
                              "): open the directory of the per-rank "
                              "files instead",
                              name, t->name, s);
            }
    }
    dcp__free(m);
    dcp__json_free(doc);
    return rc;
}

static int cmp_piece(const void *a, const void *b)
{
    const struct hf_piece *x = a, *y = b;
    int c = strcmp(x->key, y->key);
    if (c)
        return c;
    if (x->ndim && x->off[0] != y->off[0])
        return x->off[0] < y->off[0] ? -1 : 1;
    return (x->file > y->file) - (x->file < y->file);
}

static int boxes_overlap(const struct hf_piece *a, const struct hf_piece *b)
{
    return dcp__boxes_overlap(a->ndim, a->off, a->size, b->off, b->size);
}

static int overlap_err(struct hf *h, const struct hf_piece *a,
                       const struct hf_piece *b)
{
    char oa[160], ob[160];
    (void)dcp_shape_format(oa, sizeof(oa), a->ndim, a->off);
    (void)dcp_shape_format(ob, sizeof(ob), b->ndim, b->off);
    return dcp__err(h->err, DCP_EFORMAT,
                    "'%s': tensor '%s': its pieces in '%s' (at %s) and "
                    "'%s' (at %s) overlap",
                    h->path, a->key, h->files[a->file], oa, h->files[b->file],
                    ob);
}

/*
 * Checks the pieces p[0..n) of one tensor (sorted by dim-0 offset) and
 * sets its shape: same dtype and rank, no two overlapping, volumes summing
 * to the extent's.
 */
static int check_group(struct hf *h, const struct hf_piece *p, size_t n,
                       int64_t *shape)
{
    uint64_t sum = 0, vol;
    int64_t total;
    size_t i, j;
    int d;
    for (d = 0; d < p[0].ndim; d++)
        shape[d] = 0;
    for (i = 0; i < n; i++) {
        if (p[i].dtype != p[0].dtype || p[i].ndim != p[0].ndim)
            return dcp__err(h->err, DCP_EFORMAT,
                            "'%s': tensor '%s' is %s of %d dims in '%s' but "
                            "%s of %d dims in '%s'",
                            h->path, p[0].key, dcp_dtype_name(p[0].dtype),
                            p[0].ndim, h->files[p[0].file],
                            dcp_dtype_name(p[i].dtype), p[i].ndim,
                            h->files[p[i].file]);
        for (d = 0; d < p[0].ndim; d++)
            if (p[i].off[d] + p[i].size[d] > shape[d])
                shape[d] = p[i].off[d] + p[i].size[d];
    }
    total = dcp__shape_numel(p[0].ndim, shape);
    if (total < 0)
        return dcp__err(h->err, DCP_EFORMAT,
                        "'%s': tensor '%s': its pieces span more than 2^63 "
                        "elements",
                        h->path, p[0].key);
    if (p[0].ndim == 0 && n > 1)
        return overlap_err(h, &p[0], &p[1]);
    for (i = 0; i < n; i++) {
        vol = dcp__box_numel(p[i].ndim, p[i].size);
        if (!vol)
            continue;
        sum += vol; /* each at most total: no wrap before an overlap */
        for (j = i + 1; j < n && p[j].off[0] < p[i].off[0] + p[i].size[0];
             j++) {
            if (++h->cmp > HF_MAX_CMP)
                return dcp__err(h->err, DCP_ELIMIT,
                                "'%s': more than %" PRIu64 " comparisons of "
                                "tensor pieces",
                                h->path, HF_MAX_CMP);
            if (dcp__box_numel(p[j].ndim, p[j].size) &&
                boxes_overlap(&p[i], &p[j]))
                return overlap_err(h, &p[i], &p[j]);
        }
    }
    if (sum != (uint64_t)total) {
        char s[160];
        (void)dcp_shape_format(s, sizeof(s), p[0].ndim, shape);
        return dcp__err(
            h->err, DCP_EFORMAT,
            "'%s': tensor '%s': its %zu pieces (the first in "
            "'%s') cover %" PRIu64 " of the %" PRId64 " elements of %s: a gap",
            h->path, p[0].key, n, h->files[p[0].file], sum, total, s);
    }
    return DCP_OK;
}

int dcp__hf_scan(int dirfd, const char *path, struct hf_dir *out,
                 struct dcp_err *err)
{
    struct hf h;
    size_t i, j, nt = 0;
    int rc;
    memset(out, 0, sizeof(*out));
    memset(&h, 0, sizeof(h));
    h.path = path;
    h.err = err;
    rc = list_files(&h, dirfd);
    for (i = 0; rc == DCP_OK && i < h.nfiles; i++)
        rc = read_file(&h, dirfd, (uint32_t)i);
    /* h's arrays change hands: released with out from here on */
    out->files = h.files;
    out->nfiles = h.nfiles;
    out->p = h.p;
    out->np = h.np;
    if (rc != DCP_OK)
        goto fail;
    qsort(h.p, h.np, sizeof(*h.p), cmp_piece);
    for (i = 0; i < h.np; i++)
        nt += !i || strcmp(h.p[i].key, h.p[i - 1].key);
    out->t = dcp__calloc(nt ? nt : 1, sizeof(*out->t));
    if (!out->t) {
        rc = dcp__err(err, DCP_ENOMEM, "out of memory");
        goto fail;
    }
    for (i = 0; rc == DCP_OK && i < h.np; i = j) {
        struct hf_tensor *t = &out->t[out->nt++];
        for (j = i + 1; j < h.np && !strcmp(h.p[j].key, h.p[i].key); j++)
            ;
        t->key = h.p[i].key;
        t->dtype = h.p[i].dtype;
        t->ndim = h.p[i].ndim;
        t->first = i;
        t->n = j - i;
        rc = check_group(&h, h.p + i, j - i, t->shape);
    }
    if (rc == DCP_OK)
        return DCP_OK;
fail:
    dcp__hf_release(out);
    return rc;
}

/* Entry *e from tensor t of d. */
static int make_entry(const struct hf_dir *d, const struct hf_tensor *t,
                      struct md_entry *e)
{
    size_t i, k = (size_t)(t->ndim ? t->ndim : 1);
    e->key = dcp__strdup(t->key);
    e->chunks = dcp__calloc(t->n, sizeof(*e->chunks));
    if (!e->key || !e->chunks)
        return DCP_ENOMEM;
    e->is_tensor = 1;
    e->dtype = t->dtype;
    e->ndim = t->ndim;
    memcpy(e->shape, t->shape, sizeof(e->shape));
    for (i = 0; i < t->n; i++) {
        const struct hf_piece *p = &d->p[t->first + i];
        struct md_chunk *c = &e->chunks[i];
        c->off = dcp__calloc(2 * k, sizeof(int64_t));
        if (!c->off)
            return DCP_ENOMEM;
        e->nchunks = i + 1;
        c->size = c->off + k;
        memcpy(c->off, p->off, (size_t)p->ndim * sizeof(int64_t));
        memcpy(c->size, p->size, (size_t)p->ndim * sizeof(int64_t));
        c->file = p->file;
        c->offset = 0; /* the file's safetensors header (§9.3) */
        c->length = p->bytes;
        c->has_storage = 1;
        c->xform = MD_XFORM_NONE;
    }
    return DCP_OK;
}

static int build(struct hf_dir *d, struct dcp_metadata *md)
{
    size_t i;
    md->e = dcp__calloc(d->nt ? d->nt : 1, sizeof(*md->e));
    md->files = d->files; /* changes hands */
    md->nfiles = d->nfiles;
    d->files = NULL;
    d->nfiles = 0;
    md->version = dcp__strdup("");
    if (!md->e || !md->version)
        return DCP_ENOMEM;
    for (i = 0; i < d->nt; i++) {
        md->n++; /* counted first: a failure frees what it holds */
        DCP_RETURN_IF(make_entry(d, &d->t[i], &md->e[i]));
    }
    return DCP_OK;
}

int dcp__hf_metadata(int dirfd, const char *path, struct dcp_metadata **out,
                     struct dcp_err *err)
{
    struct dcp_metadata *md = NULL;
    struct hf_dir d;
    int rc;
    *out = NULL;
    rc = dcp__hf_scan(dirfd, path, &d, err);
    if (rc != DCP_OK)
        return rc;
    md = dcp__calloc(1, sizeof(*md));
    rc = md ? build(&d, md) : DCP_ENOMEM;
    if (rc == DCP_ENOMEM)
        rc = dcp__err(err, DCP_ENOMEM, "out of memory");
    if (rc == DCP_OK)
        rc = dcp__meta_sort(md, err);
    if (rc == DCP_OK)
        dcp__meta_index(md);
    dcp__hf_release(&d);
    if (rc != DCP_OK)
        dcp__meta_free(md);
    else
        *out = md;
    return rc;
}
int dcp__hf_metadata_bytes(int dirfd, const char *path, uint8_t **out,
                           size_t *len, struct dcp_err *err)
{
    struct dcp_metadata *md = NULL;
    struct dcp_buf b = {0};
    int rc = dcp__hf_metadata(dirfd, path, &md, err);
    *out = NULL;
    *len = 0;
    if (rc != DCP_OK)
        return rc;
    rc = dcp__meta_encode(md, &b);
    dcp__meta_free(md);
    if (rc != DCP_OK) {
        dcp__buf_free(&b);
        return dcp__err(err, rc, "'%s': encoding the safetensors metadata",
                        path);
    }
    *out = b.p;
    *len = b.len;
    return DCP_OK;
}
