/*
 * Planners (see planner.h and dcp_planner.h). The item hooks run over the
 * expanded state before anything is planned and produce a planned state:
 * the same entries, renamed, skipped, or (save) pointing at converted
 * copies. When every decision keeps its entry, the state is used as it
 * is: the default planner costs one hook call per entry and no copy.
 */
#include "planner.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "dtype.h"
#include "value.h"

struct dcp_plan_decision {
    int load; /* a load planner's decision */
    const dcp_plan_item *it;
    int skip;
    char *key; /* rename, owned */
    int conv;  /* cast or transform */
    dcp_dtype dtype;
    dcp_plan_box_fn fn; /* NULL: a cast */
    void *fn_ud;
    char msg[DCP_ERRMSG_MAX];
};

const dcp_save_planner *dcp__save_opts_planner(const dcp_save_options *o)
{
    return o && o->struct_size >=
                       offsetof(dcp_save_options, planner) + sizeof(o->planner)
               ? o->planner
               : NULL;
}

const dcp_load_planner *dcp__load_opts_planner(const dcp_load_options *o)
{
    return o && o->struct_size >=
                       offsetof(dcp_load_options, planner) + sizeof(o->planner)
               ? o->planner
               : NULL;
}

/* ------------------------------------------------------------ decisions */

int dcp_plan_rename(dcp_plan_decision *d, const char *key)
{
    char *k;
    if (!d || !key || !*key)
        return DCP_EINVAL;
    if (!(k = dcp__strdup(key)))
        return DCP_ENOMEM;
    dcp__free(d->key);
    d->key = k;
    return DCP_OK;
}

int dcp_plan_skip(dcp_plan_decision *d)
{
    if (!d)
        return DCP_EINVAL;
    d->skip = 1;
    return DCP_OK;
}

static int conv_check(const dcp_plan_decision *d, dcp_dtype dtype)
{
    if (!d || d->load || !d->it->is_tensor || dcp_dtype_size(dtype) == 0)
        return DCP_EINVAL;
    if (d->it->mem != DCP_MEM_HOST)
        return DCP_ENOTSUP;
    return DCP_OK;
}

int dcp_plan_cast(dcp_plan_decision *d, dcp_dtype dtype)
{
    DCP_RETURN_IF(conv_check(d, dtype));
    if (!dcp__can_convert(dtype, d->it->dtype))
        return DCP_ENOTSUP;
    d->conv = dtype != d->it->dtype;
    d->dtype = dtype;
    d->fn = NULL;
    d->fn_ud = NULL;
    return DCP_OK;
}

int dcp_plan_transform(dcp_plan_decision *d, dcp_dtype dtype,
                       dcp_plan_box_fn fn, void *userdata)
{
    if (!fn)
        return DCP_EINVAL;
    DCP_RETURN_IF(conv_check(d, dtype));
    d->conv = 1;
    d->dtype = dtype;
    d->fn = fn;
    d->fn_ud = userdata;
    return DCP_OK;
}

int dcp_plan_error(dcp_plan_decision *d, const char *fmt, ...)
{
    va_list ap;
    if (!d || !fmt)
        return DCP_EINVAL;
    va_start(ap, fmt);
    vsnprintf(d->msg, sizeof(d->msg), fmt, ap);
    va_end(ap);
    return DCP_OK;
}

/* A hook's nonzero return: a dcp error code passes through, anything else
 * is DCP_EINVAL. */
static int hook_code(int r)
{
    return r < 0 && strcmp(dcp_err_name(r), "DCP_UNKNOWN") != 0 ? r
                                                                : DCP_EINVAL;
}

static int hook_failed(struct dcp_err *err, int r, const char *hook,
                       const char *key, const char *msg)
{
    if (*msg)
        return dcp__err(err, hook_code(r), "%s on key '%s': %s", hook, key,
                        msg);
    return dcp__err(err, hook_code(r), "%s on key '%s' failed (returned %d)",
                    hook, key, r);
}

static void item_of(const struct st_entry *e, int rank, int world,
                    dcp_plan_item *it)
{
    memset(it, 0, sizeof(*it));
    it->key = e->key;
    it->is_tensor = e->is_tensor;
    it->dtype = e->dtype;
    it->ndim = e->ndim;
    it->shape = e->shape;
    it->nboxes = e->nboxes;
    it->mem = e->mem;
    it->rank = rank;
    it->world = world;
}

/* Calls hook over every entry of st: (*dp)[i] gets entry i's decision
 * (*dp NULL when there is no hook or no entry); *same is 1 when every
 * decision keeps its entry. */
static int decide(int (*hook)(void *, const dcp_plan_item *,
                              dcp_plan_decision *),
                  void *ud, int load, int rank, int world, const dcp_state *st,
                  dcp_plan_decision **dp, int *same, struct dcp_err *err)
{
    const char *what = load ? "load planner" : "save planner";
    dcp_plan_decision *d;
    size_t i;
    *same = 1;
    *dp = NULL;
    if (!hook || !st || !st->n)
        return DCP_OK;
    d = *dp = dcp__calloc(st->n, sizeof(*d));
    if (!d)
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    for (i = 0; i < st->n; i++) {
        dcp_plan_item it;
        int r;
        item_of(&st->e[i], rank, world, &it);
        d[i].load = load;
        d[i].it = &it;
        d[i].dtype = it.dtype;
        r = hook(ud, &it, &d[i]);
        d[i].it = NULL;
        if (r != 0)
            return hook_failed(err, r, what, st->e[i].key, d[i].msg);
        if (d[i].key && !strcmp(d[i].key, st->e[i].key)) {
            dcp__free(d[i].key);
            d[i].key = NULL;
        }
        if (d[i].skip || d[i].key || d[i].conv)
            *same = 0;
    }
    return DCP_OK;
}

static void decisions_free(dcp_plan_decision *d, size_t n)
{
    size_t i;
    for (i = 0; d && i < n; i++)
        dcp__free(d[i].key);
    dcp__free(d);
}

/* Positions x's cursor for entry e: the one component key when renamed,
 * e's path otherwise; *name is what to add at it. */
static int place_at(dcp_state *x, const struct st_entry *e, const char *key,
                    const char **name)
{
    *name = key;
    return dcp__state_set_cursor(x, key ? NULL : e->path, key ? 0 : e->npath);
}

static int check_version(uint32_t v, const char *what, struct dcp_err *err)
{
    if (v < 1)
        return dcp__err(err, DCP_EINVAL,
                        "%s planner: version %u (set DCP_PLANNER_VERSION)",
                        what, (unsigned)v);
    return DCP_OK;
}

/* ----------------------------------------------------------------- save */

/* The box's elements converted or transformed into a new buffer. */
static int convert_box(struct pn_save *ps, const struct st_entry *e, size_t b,
                       const dcp_plan_decision *d, int rank, int world,
                       void **out, struct dcp_err *err)
{
    const struct st_box *box = &e->boxes[b];
    const void *src = box->buf;
    uint64_t n = dcp__box_numel(e->ndim, box->size);
    size_t es = dcp_dtype_size(d->dtype), bytes;
    void **nb;
    void *buf;
    if (n > SIZE_MAX / (es ? es : 1))
        return dcp__err(err, DCP_ELIMIT, "key '%s': box too large", e->key);
    bytes = (size_t)n * es;
    nb = dcp__realloc(ps->bufs, (ps->nbufs + 1) * sizeof(*nb));
    if (!nb)
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    ps->bufs = nb;
    /* Aligned, so that the I/O engine writes it without a copy. */
    buf = dcp__malloc_aligned(4096, bytes);
    if (!buf)
        return dcp__err(err, DCP_ENOMEM,
                        "out of memory converting key '%s' (%zu bytes)", e->key,
                        bytes);
    ps->bufs[ps->nbufs++] = buf;
    if (box->strided && n) { /* packed first: hooks see C order */
        size_t ib = (size_t)n * dcp_dtype_size(e->dtype);
        void *packed = dcp__malloc(ib);
        if (!packed)
            return dcp__err(err, DCP_ENOMEM, "out of memory packing key '%s'",
                            e->key);
        dcp__box_gather(e->ndim, dcp_dtype_size(e->dtype), box->size,
                        box->stride, box->buf, 0, ib, packed);
        ps->bufs[ps->nbufs - 1] = packed; /* freed with the others */
        nb = dcp__realloc(ps->bufs, (ps->nbufs + 1) * sizeof(*nb));
        if (!nb) {
            dcp__free(buf);
            return dcp__err(err, DCP_ENOMEM, "out of memory");
        }
        ps->bufs = nb;
        ps->bufs[ps->nbufs++] = buf;
        src = packed;
    }
    if (d->fn) {
        dcp_plan_item it;
        int r;
        item_of(e, rank, world, &it);
        r = d->fn(d->fn_ud, &it, b, box->off, box->size, src, buf, (size_t)n);
        if (r != 0)
            return hook_failed(err, r, "save planner's transform", e->key, "");
    } else if (n) {
        dcp__convert(buf, d->dtype, src, e->dtype, (size_t)n);
    }
    *out = buf;
    return DCP_OK;
}

static int add_planned(struct pn_save *ps, const struct st_entry *e,
                       const dcp_plan_decision *d, int rank, int world,
                       struct dcp_err *err)
{
    dcp_state *x = ps->x;
    size_t before = x->n, b;
    const char *name;
    int rc = place_at(x, e, d->key, &name);
    if (rc != DCP_OK)
        return dcp__err(err, rc, "out of memory");
    if (!e->is_tensor) {
        rc = dcp_state_add_value(x, name, dcp_value_copy(e->value));
    } else {
        dcp_dtype dt = d->conv ? d->dtype : e->dtype;
        for (b = 0; rc == DCP_OK && b < e->nboxes; b++) {
            void *buf = e->boxes[b].buf;
            if (d->conv && (rc = convert_box(ps, e, b, d, rank, world, &buf,
                                             err)) != DCP_OK)
                return rc;
            rc = dcp_state_add_tensor_strided(
                x, name, dt, e->ndim, e->shape, e->boxes[b].off,
                e->boxes[b].size,
                e->boxes[b].strided && !d->conv ? e->boxes[b].stride : NULL,
                buf, e->mem);
            if (rc == DCP_OK && b == 0 && x->n == before)
                rc = DCP_EEXIST;
        }
    }
    if (rc == DCP_ENOMEM)
        return dcp__err(err, rc, "out of memory");
    if (rc != DCP_OK || x->n != before + 1)
        return dcp__err(err, DCP_EINVAL,
                        "save planner: key '%s' saved as '%s', a key "
                        "another entry is saved as too",
                        e->key, d->key ? d->key : e->key);
    return DCP_OK;
}

int dcp__planner_save(const dcp_save_planner *p, int rank, int world,
                      const dcp_state *use, const dcp_state **out,
                      struct pn_save *ps, struct dcp_err *err)
{
    dcp_plan_decision *d = NULL;
    size_t i;
    int rc, same = 1;
    memset(ps, 0, sizeof(*ps));
    *out = use;
    rc = p ? check_version(p->version, "save", err) : DCP_OK;
    if (p && rc == DCP_OK)
        rc = decide(p->item, p->userdata, 0, rank, world, use, &d, &same, err);
    if (rc == DCP_OK && !same) {
        rc = dcp_state_create(&ps->x);
        if (rc != DCP_OK)
            rc = dcp__err(err, rc, "out of memory");
        for (i = 0; rc == DCP_OK && i < use->n; i++)
            if (!d[i].skip)
                rc = add_planned(ps, &use->e[i], &d[i], rank, world, err);
        if (rc == DCP_OK)
            *out = ps->x;
    }
    decisions_free(d, use ? use->n : 0);
    return rc;
}

void dcp__planner_save_release(struct pn_save *ps)
{
    size_t i;
    for (i = 0; i < ps->nbufs; i++)
        dcp__free(ps->bufs[i]);
    dcp__free(ps->bufs);
    dcp_state_free(ps->x);
    memset(ps, 0, sizeof(*ps));
}

int dcp__planner_save_nocache(const dcp_save_planner *p)
{
    return p && p->version >= 1 &&
           (p->global || (p->flags & DCP_PLAN_DEDUP_LOWEST_RANK));
}

int dcp__planner_save_has_global(const dcp_save_planner *p)
{
    return p && p->version >= 1 && p->global;
}

unsigned dcp__planner_policy(const dcp_save_planner *p)
{
    return p && p->version >= 1 && (p->flags & DCP_PLAN_DEDUP_LOWEST_RANK)
               ? PL_DEDUP_LOWEST
               : 0;
}

/* --------------------------------------------------------- global plan */

struct dcp_global_plan {
    struct pl_view *v;
    struct dcp_metadata *md;
    char msg[DCP_ERRMSG_MAX];
};

const dcp_metadata *dcp_global_plan_metadata(const dcp_global_plan *gp)
{
    return gp ? gp->md : NULL;
}

int dcp_global_plan_writer(const dcp_global_plan *gp, size_t index,
                           size_t chunk)
{
    if (!gp || index >= gp->md->n || chunk >= gp->md->e[index].nchunks)
        return -1;
    return dcp__pl_view_writer(gp->v, (uint32_t)index, (uint32_t)chunk);
}

size_t dcp_global_plan_holders(const dcp_global_plan *gp, size_t index,
                               size_t chunk, int *ranks, size_t cap)
{
    if (!gp || index >= gp->md->n || chunk >= gp->md->e[index].nchunks ||
        (cap && !ranks))
        return 0;
    return dcp__pl_view_holders(gp->v, (uint32_t)index, (uint32_t)chunk, ranks,
                                cap);
}

int dcp_global_plan_set_writer(dcp_global_plan *gp, size_t index, size_t chunk,
                               int rank)
{
    if (!gp || index >= gp->md->n || chunk >= gp->md->e[index].nchunks)
        return DCP_EINVAL;
    return dcp__pl_view_set_writer(gp->v, (uint32_t)index, (uint32_t)chunk,
                                   rank);
}

int dcp_global_plan_set_data(dcp_global_plan *gp, size_t index, dcp_value *v)
{
    struct md_entry *e;
    if (!gp || !v || index >= gp->md->n) {
        dcp_value_free(v);
        return DCP_EINVAL;
    }
    e = &gp->md->e[index];
    dcp_value_free(e->pdata);
    e->pdata = v;
    return DCP_OK;
}

int dcp_global_plan_error(dcp_global_plan *gp, const char *fmt, ...)
{
    va_list ap;
    if (!gp || !fmt)
        return DCP_EINVAL;
    va_start(ap, fmt);
    vsnprintf(gp->msg, sizeof(gp->msg), fmt, ap);
    va_end(ap);
    return DCP_OK;
}

const dcp_value *dcp_metadata_planner_data(const dcp_metadata *md, size_t index)
{
    return md && index < md->n ? md->e[index].pdata : NULL;
}

struct hook_ud {
    const dcp_save_planner *p;
    struct dcp_err *err;
};

/* plan.c's hook: the save planner's global hook over the plan. */
static int global_hook(void *ud, struct pl_view *v, struct dcp_metadata *md)
{
    const struct hook_ud *h = ud;
    dcp_global_plan gp;
    int r;
    memset(&gp, 0, sizeof(gp));
    gp.v = v;
    gp.md = md;
    r = h->p->global(h->p->userdata, &gp);
    if (r == 0)
        return DCP_OK;
    if (gp.msg[0])
        return dcp__err(h->err, hook_code(r), "save planner's global hook: %s",
                        gp.msg);
    return dcp__err(h->err, hook_code(r),
                    "save planner's global hook failed (returned %d)", r);
}

int dcp__planner_plan_global(const dcp_save_planner *p, const uint8_t *blobs,
                             const size_t *lens, const size_t *displs,
                             int nranks, struct pl_global *g,
                             struct dcp_err *err)
{
    struct hook_ud h = {p, err};
    int hook = p && p->version >= 1 && p->global;
    return dcp__plan_global_ex(blobs, lens, displs, nranks,
                               dcp__planner_policy(p),
                               hook ? global_hook : NULL, &h, g, err);
}

/* ----------------------------------------------------------------- load */

/* The key of the first entry of use before i that reads x's entry o
 * (o's own key is the stored key, not the state's). */
static const char *first_reader(const struct pn_load *pl, const dcp_state *use,
                                size_t i, const struct st_entry *o)
{
    size_t j, xi = (size_t)(o - pl->x->e);
    for (j = 0; j < i; j++)
        if (pl->map[j] == xi)
            return use->e[j].key;
    return o->key;
}

static int add_load(struct pn_load *pl, const dcp_state *use, size_t i,
                    const char *key, struct dcp_err *err)
{
    dcp_state *x = pl->x;
    const struct st_entry *e = &use->e[i];
    const char *k = key ? key : e->key;
    struct st_entry *o = dcp__state_find(x, k);
    const char *name;
    size_t b;
    int rc;
    if (o) {
        if (o->is_tensor != e->is_tensor ||
            (e->is_tensor &&
             (o->dtype != e->dtype || o->ndim != e->ndim || o->mem != e->mem ||
              !dcp__same_ints(o->shape, e->shape, e->ndim))))
            return dcp__err(err, DCP_EINVAL,
                            "load planner: keys '%s' and '%s' both read "
                            "stored key '%s' but differ in kind, dtype, "
                            "shape or memory",
                            first_reader(pl, use, i, o), e->key, k);
        if (!e->is_tensor) {
            pl->map[i] = (size_t)(o - x->e);
            return DCP_OK;
        }
    }
    rc = place_at(x, e, key, &name);
    if (rc == DCP_OK && !e->is_tensor)
        rc = dcp_state_add_value(x, name, dcp_value_copy(e->value));
    for (b = 0; rc == DCP_OK && e->is_tensor && b < e->nboxes; b++)
        rc = dcp_state_add_tensor_strided(
            x, name, e->dtype, e->ndim, e->shape, e->boxes[b].off,
            e->boxes[b].size, e->boxes[b].strided ? e->boxes[b].stride : NULL,
            e->boxes[b].buf, e->mem);
    if (rc != DCP_OK)
        return dcp__err(err, rc, "load planner: key '%s' read as '%s': %s",
                        e->key, k, dcp_strerror(rc));
    o = dcp__state_find(x, k);
    pl->map[i] = o ? (size_t)(o - x->e) : SIZE_MAX;
    return DCP_OK;
}

int dcp__planner_load(const dcp_load_planner *p, int rank, int world,
                      dcp_state *use, dcp_state **out, struct pn_load *pl,
                      struct dcp_err *err)
{
    dcp_plan_decision *d = NULL;
    size_t i;
    int rc, same = 1;
    memset(pl, 0, sizeof(*pl));
    *out = use;
    rc = p ? check_version(p->version, "load", err) : DCP_OK;
    if (p && rc == DCP_OK)
        rc = decide(p->item, p->userdata, 1, rank, world, use, &d, &same, err);
    if (rc == DCP_OK && !same) {
        pl->map = dcp__malloc(use->n * sizeof(*pl->map));
        pl->nmap = use->n;
        rc = pl->map ? dcp_state_create(&pl->x) : DCP_ENOMEM;
        if (rc != DCP_OK)
            rc = dcp__err(err, rc, "out of memory");
        for (i = 0; rc == DCP_OK && i < use->n; i++) {
            pl->map[i] = SIZE_MAX;
            if (!d[i].skip)
                rc = add_load(pl, use, i, d[i].key, err);
        }
        if (rc == DCP_OK)
            *out = pl->x;
    }
    decisions_free(d, use ? use->n : 0);
    return rc;
}

/* Whether key is among the n missing keys of the load. */
static int is_missing(const char *key, const char *const *missing, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++)
        if (!strcmp(key, missing[i]))
            return 1;
    return 0;
}

int dcp__planner_loaded_can_fail(const dcp_load_planner *p,
                                 const struct pn_load *pl)
{
    return pl->x != NULL || (p && p->version >= 1 && p->post_load);
}

int dcp__planner_loaded(const dcp_load_planner *p, int rank, int world,
                        dcp_state *use, struct pn_load *pl,
                        const char *const *missing, size_t nmissing,
                        struct dcp_err *err)
{
    size_t i, b;
    for (i = 0; pl->x && i < use->n; i++) {
        struct st_entry *e = &use->e[i];
        dcp_value *v;
        if (e->is_tensor || pl->map[i] == SIZE_MAX)
            continue;
        v = dcp_value_copy(pl->x->e[pl->map[i]].value);
        if (!v)
            return dcp__err(err, DCP_ENOMEM, "out of memory");
        dcp_value_free(e->value);
        e->value = v;
    }
    if (!p || p->version < 1 || !p->post_load)
        return DCP_OK;
    for (i = 0; i < use->n; i++) {
        const struct st_entry *e = &use->e[i];
        dcp_plan_item it;
        if (!e->is_tensor || (pl->x && pl->map[i] == SIZE_MAX))
            continue;
        if (nmissing && is_missing(pl->x ? pl->x->e[pl->map[i]].key : e->key,
                                   missing, nmissing))
            continue;
        item_of(e, rank, world, &it);
        for (b = 0; b < e->nboxes; b++) {
            int r = p->post_load(
                p->userdata, &it, b, e->boxes[b].off, e->boxes[b].size,
                e->boxes[b].strided ? e->boxes[b].stride : NULL,
                e->boxes[b].buf);
            if (r != 0)
                return hook_failed(err, r, "load planner's post_load", e->key,
                                   "");
        }
    }
    return DCP_OK;
}

void dcp__planner_load_release(struct pn_load *pl)
{
    dcp__free(pl->map);
    dcp_state_free(pl->x);
    memset(pl, 0, sizeof(*pl));
}

/* ------------------------------------------------------------ defaults */

static int keep_item(void *ud, const dcp_plan_item *it, dcp_plan_decision *d)
{
    (void)ud;
    (void)it;
    (void)d;
    return 0;
}

static const dcp_save_planner default_save = {DCP_PLANNER_VERSION, 0, NULL,
                                              keep_item, NULL};
static const dcp_load_planner default_load = {DCP_PLANNER_VERSION, 0, NULL,
                                              keep_item, NULL};

const dcp_save_planner *dcp_default_save_planner(void)
{
    return &default_save;
}

const dcp_load_planner *dcp_default_load_planner(void)
{
    return &default_load;
}
