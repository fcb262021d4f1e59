/*
 * The unflattened layout (docs/FORMAT.md §9.4): value entries whose
 * record is torch.save of a nested state, expanded into one entry per
 * leaf. Every tensor leaf is checked here against the record's archive
 * (its view inside its storage, the storage record present with exactly
 * its bytes) and again when it is read (read.c, through md_entry.member).
 */
#include "unflat.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nested.h"
#include "read.h"
#include "torchzip.h"
#include "value.h"

/* Entries built, and for each the index of the value entry it came from. */
struct grow {
    struct md_entry *e;
    size_t *src;
    size_t n, cap;
};

struct leafctx {
    const struct md_entry *v; /* the value entry */
    size_t vi;                /* its index */
    const struct rd_files *f; /* its archive: dcp__rd_wide_find */
    struct grow *out;
    size_t tensors;
    size_t budget[2]; /* dcp__value_from_node's, for the whole pickle */
};

static int candidate(const struct md_entry *e)
{
    return !e->is_tensor && !e->path && !e->member && !e->bad &&
           e->nchunks == 1 && e->chunks[0].xform == MD_XFORM_NONE;
}

static int push(struct grow *g, size_t src, struct md_entry **out)
{
    if (g->n == g->cap) {
        size_t cap = g->cap ? 2 * g->cap : 16;
        struct md_entry *e = dcp__realloc(g->e, cap * sizeof(*e));
        size_t *s;
        if (!e)
            return DCP_ENOMEM;
        g->e = e;
        s = dcp__realloc(g->src, cap * sizeof(*s));
        if (!s)
            return DCP_ENOMEM;
        g->src = s;
        g->cap = cap;
    }
    *out = &g->e[g->n];
    memset(*out, 0, sizeof(**out));
    g->src[g->n++] = src;
    return DCP_OK;
}

static void release(const struct dcp_metadata *md, struct grow *g)
{
    size_t i;
    for (i = 0; i < g->n; i++)
        dcp__meta_entry_release(md, &g->e[i]);
    dcp__free(g->e);
    dcp__free(g->src);
    memset(g, 0, sizeof(*g));
}

static int copy_el(struct md_pathel *d, const char *s, int64_t i)
{
    d->i = s ? 0 : i;
    d->s = NULL;
    if (s && !(d->s = dcp__strdup(s)))
        return DCP_ENOMEM;
    return DCP_OK;
}

/* The member path (below the record's root) and the whole path (the value's
 * key first), as planner_data would record it. */
static int set_paths(struct md_entry *n, const char *key,
                     const struct nest_el *p, size_t np)
{
    size_t i;
    int rc = DCP_OK;
    n->member = dcp__calloc(np ? np : 1, sizeof(*n->member));
    n->path = dcp__calloc(np + 1, sizeof(*n->path));
    if (!n->member || !n->path)
        return DCP_ENOMEM;
    n->nmember = np;
    n->npath = np + 1;
    rc = copy_el(&n->path[0], key, 0);
    for (i = 0; rc == DCP_OK && i < np; i++) {
        rc = copy_el(&n->member[i], p[i].s, p[i].i);
        if (rc == DCP_OK)
            rc = copy_el(&n->path[i + 1], p[i].s, p[i].i);
    }
    return rc;
}

/* A tensor leaf: checked against the archive, then described. */
static int tensor_leaf(struct leafctx *lc, struct md_entry *n,
                       const struct pk_node *leaf, struct dcp_err *err)
{
    char sname[TZ_MAX_NAME + 8];
    const struct tz_entry *te;
    struct tz_tensor t;
    uint64_t want;
    int64_t *ints;
    int d, rc = dcp__tz_tensor_from_node(leaf, &t, err);
    if (rc != DCP_OK)
        return rc;
    (void)snprintf(sname, sizeof(sname), "data/%s", t.key);
    te = dcp__rd_wide_find(lc->f, sname);
    if (dcp__mul_overflow_u64(t.storage_numel, dcp_dtype_size(t.dtype), &want))
        return dcp__err(err, DCP_EFORMAT, "storage '%s' size overflows",
                        sname);
    if (!te && dcp__box_numel(t.ndim, t.size) > 0)
        return dcp__err(err, DCP_EFORMAT, "the record has no storage '%s'",
                        sname);
    if (te && te->size != want)
        return dcp__err(err, DCP_EFORMAT,
                        "storage '%s' is %" PRIu64 " bytes, its %" PRIu64
                        " elements need %" PRIu64,
                        sname, te->size, t.storage_numel, want);
    ints = dcp__calloc(2 * (size_t)(t.ndim ? t.ndim : 1), sizeof(*ints));
    if (!ints)
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    n->chunks[0].off = ints;
    n->chunks[0].size = ints + (t.ndim ? t.ndim : 1);
    n->is_tensor = 1;
    n->dtype = t.dtype;
    n->ndim = t.ndim;
    for (d = 0; d < t.ndim; d++) {
        n->shape[d] = t.size[d];
        n->chunks[0].size[d] = t.size[d];
    }
    lc->tensors++;
    return DCP_OK;
}

static int on_leaf(void *arg, const struct nest_el *p, size_t np,
                   const struct pk_node *leaf, struct dcp_err *err)
{
    struct leafctx *lc = arg;
    const struct md_chunk *vc = &lc->v->chunks[0];
    struct dcp_buf name = {0};
    struct md_entry *n = NULL;
    dcp_value *val = NULL;
    int rc = dcp__buf_put(&name, lc->v->key, strlen(lc->v->key));
    if (rc == DCP_OK)
        rc = dcp__buf_put_u8(&name, '.');
    if (rc == DCP_OK)
        rc = dcp__nest_name(p, np, &name);
    if (rc == DCP_OK)
        rc = dcp__buf_put_u8(&name, 0);
    if (rc == DCP_OK)
        rc = push(lc->out, lc->vi, &n);
    if (rc != DCP_OK) {
        dcp__buf_free(&name);
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    }
    n->key = (char *)name.p; /* owned by the entry now */
    if (set_paths(n, lc->v->key, p, np) != DCP_OK ||
        !(n->chunks = dcp__calloc(1, sizeof(*n->chunks))))
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    n->nchunks = 1;
    n->chunks[0].file = vc->file;
    n->chunks[0].offset = vc->offset;
    n->chunks[0].length = vc->length;
    n->chunks[0].xform = vc->xform;
    n->chunks[0].has_storage = 1;
    if (dcp__nest_is_tensor(leaf)) {
        rc = tensor_leaf(lc, n, leaf, err);
    } else {
        rc = dcp__value_from_node(leaf, lc->budget, &val, err);
        dcp_value_free(val);
    }
    if (rc != DCP_OK)
        return dcp__err_prefix(err, "member '%s'", n->key);
    return DCP_OK;
}

/* Marks value entry v refused with the error in e. */
static int set_bad(struct md_entry *v, const struct dcp_err *e,
                   struct dcp_err *err)
{
    v->bad = dcp__strdup(e->msg);
    v->badrc = e->code;
    if (!v->bad)
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    return DCP_OK;
}

/* Expands value entry vi into add, or leaves it (unreadable, plain, not a
 * nested state), or marks it bad. Only DCP_ENOMEM before its pickle is
 * read, or when marking it, fails. */
static int expand_one(struct rd_files *f, struct dcp_metadata *md, size_t vi,
                      struct tz_archive *a, struct grow *add,
                      struct dcp_err *err)
{
    struct md_entry *v = &md->e[vi];
    struct leafctx lc;
    struct pk_arena *arena = NULL;
    struct pk_node *root = NULL;
    struct dcp_err e2;
    uint8_t *pkl = NULL;
    size_t len = 0, first = add->n, i;
    int rc, pkl_read;
    memset(&e2, 0, sizeof(e2));
    rc = dcp__rd_value_pickle(f, v, a, &pkl, &len, &e2);
    if (rc != DCP_OK && rc != DCP_ENOMEM)
        rc = DCP_EINVAL; /* unreadable: a read says why */
    pkl_read = rc == DCP_OK;
    /* The record holds storages: a pickle the decoder refuses (a global
     * off the allow-list, a bound) refuses the value. */
    if (rc == DCP_OK)
        rc = dcp__nest_decode(pkl, len, &arena, &root, &e2);
    if (rc == DCP_OK) {
        memset(&lc, 0, sizeof(lc));
        lc.v = v;
        lc.vi = vi;
        lc.f = f;
        lc.out = add;
        rc = dcp__nest_walk(root, on_leaf, &lc, &e2);
        if (rc == DCP_OK && lc.tensors == 0)
            rc = DCP_EINVAL; /* plain: stays one value */
    }
    dcp__pk_arena_free(arena);
    dcp__free(pkl);
    for (i = first; rc == DCP_OK && i < add->n; i++)
        if (dcp__meta_find(md, add->e[i].key) >= 0)
            rc = dcp__err(&e2, DCP_EFORMAT,
                          "member '%s' has the name of a stored entry",
                          add->e[i].key);
    if (rc == DCP_OK)
        return DCP_OK;
    while (add->n > first)
        dcp__meta_entry_release(md, &add->e[--add->n]);
    if (rc == DCP_EINVAL)
        return DCP_OK;
    if (!pkl_read) /* no memory to read it: the whole open fails */
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    /* Past the read, every failure (out of memory too: a hostile pickle
     * can ask for much) refuses this value only. */
    (void)dcp__err_prefix(&e2, "'%s': record in '%s'", v->key,
                          md->files[v->chunks[0].file]);
    return set_bad(v, &e2, err);
}

static int cmp_key(const void *pa, const void *pb)
{
    const struct md_entry *a = *(const struct md_entry *const *)pa;
    const struct md_entry *b = *(const struct md_entry *const *)pb;
    return strcmp(a->key, b->key);
}

/* Two leaves of the same name (in one value or two): their values are
 * refused. */
static int check_repeats(struct dcp_metadata *md, struct grow *add,
                         struct dcp_err *err)
{
    struct md_entry **s;
    struct dcp_err e2;
    size_t i;
    int rc = DCP_OK;
    if (add->n < 2)
        return DCP_OK;
    s = dcp__malloc(add->n * sizeof(*s));
    if (!s)
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    for (i = 0; i < add->n; i++)
        s[i] = &add->e[i];
    qsort(s, add->n, sizeof(*s), cmp_key);
    for (i = 1; rc == DCP_OK && i < add->n; i++) {
        size_t x = add->src[s[i - 1] - add->e], y = add->src[s[i] - add->e];
        if (strcmp(s[i - 1]->key, s[i]->key) != 0)
            continue;
        if (x == y)
            (void)dcp__err(&e2, DCP_EFORMAT,
                           "'%s': two members are named '%s'", md->e[x].key,
                           s[i]->key);
        else
            (void)dcp__err(&e2, DCP_EFORMAT,
                           "'%s': member '%s' has the name of one of '%s'",
                           md->e[x].key, s[i]->key, md->e[y].key);
        if (!md->e[x].bad)
            rc = set_bad(&md->e[x], &e2, err);
        if (rc == DCP_OK && !md->e[y].bad)
            rc = set_bad(&md->e[y], &e2, err);
    }
    dcp__free(s);
    return rc;
}

/* md's entries: the values that gave leaves dropped, their leaves (those
 * of values not refused) added. */
static int rebuild(struct dcp_metadata *md, struct grow *add,
                   struct dcp_err *err)
{
    struct md_entry *e;
    char *gone;
    size_t i, n = 0;
    gone = dcp__calloc(md->n ? md->n : 1, 1);
    e = dcp__calloc(md->n + add->n, sizeof(*e));
    if (!gone || !e) {
        dcp__free(gone);
        dcp__free(e);
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    }
    for (i = 0; i < add->n; i++) {
        if (md->e[add->src[i]].bad) {
            dcp__meta_entry_release(md, &add->e[i]);
        } else {
            gone[add->src[i]] = 1;
            e[n++] = add->e[i];
        }
    }
    for (i = 0; i < md->n; i++) {
        if (gone[i])
            dcp__meta_entry_release(md, &md->e[i]);
        else
            e[n++] = md->e[i];
    }
    add->n = 0; /* moved or released */
    dcp__free(gone);
    dcp__free(md->e);
    md->e = e;
    md->n = n;
    return DCP_OK;
}

int dcp__uf_candidates(const struct dcp_metadata *md)
{
    size_t i;
    for (i = 0; i < md->n; i++)
        if (candidate(&md->e[i]))
            return 1;
    return 0;
}

int dcp__uf_expand(const char *path, struct dcp_metadata *md,
                   struct dcp_err *err)
{
    struct tz_archive *a = NULL;
    struct grow add;
    struct rd_files f;
    size_t i;
    int rc = DCP_OK;
    memset(&add, 0, sizeof(add));
    for (i = 0; i < md->n && !candidate(&md->e[i]); i++)
        ;
    if (i == md->n || !path)
        return DCP_OK;
    if (dcp__rd_open(&f, path, md, NULL) != DCP_OK)
        return DCP_OK; /* a read reports it */
    a = dcp__malloc(sizeof(*a));
    if (!a)
        rc = dcp__err(err, DCP_ENOMEM, "out of memory");
    for (; rc == DCP_OK && i < md->n; i++)
        if (candidate(&md->e[i]))
            rc = expand_one(&f, md, i, a, &add, err);
    dcp__rd_close(&f);
    dcp__free(a);
    if (rc == DCP_OK)
        rc = check_repeats(md, &add, err);
    if (rc == DCP_OK && add.n) {
        rc = rebuild(md, &add, err);
        if (rc == DCP_OK)
            rc = dcp__meta_sort(md, err);
        if (rc == DCP_OK)
            dcp__meta_index(md);
    }
    release(md, &add);
    return rc;
}
