/*
 * Expansion of stateful entries into a plain state (see stateful.h). The
 * expanded state borrows tensor buffers (copying only the description) and
 * holds copies of values, which after a load are swapped back into the
 * entries they came from.
 */
#include "stateful.h"

#include <string.h>

#include "cuda.h"

/* A callback's nonzero return: a dcp error code passes through, anything
 * else is DCP_EINVAL. */
static int callback_code(int r)
{
    return r < 0 && strcmp(dcp_err_name(r), "DCP_UNKNOWN") != 0 ? r
                                                                : DCP_EINVAL;
}

/* Adds a copy of entry se, at prefix + se's path, to x; records where it
 * came from. A key already in x is refused. */
static int add_copy(struct st_expansion *ex, const struct md_pathel *prefix,
                    size_t nprefix, const struct st_entry *se, long sub,
                    size_t idx, struct dcp_err *err)
{
    dcp_state *x = ex->x;
    struct md_pathel *path;
    size_t n = nprefix + se->npath, before = x->n, b;
    int rc;
    if (before >= ex->norigin) {
        size_t cap = ex->norigin ? ex->norigin * 2 : 16;
        struct sf_origin *o = dcp__realloc(ex->origin, cap * sizeof(*o));
        if (!o)
            return dcp__err(err, DCP_ENOMEM, "out of memory");
        ex->origin = o;
        ex->norigin = cap;
    }
    path = dcp__malloc(n * sizeof(*path));
    if (!path)
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    if (nprefix)
        memcpy(path, prefix, nprefix * sizeof(*path));
    memcpy(path + nprefix, se->path, se->npath * sizeof(*path));
    rc = dcp__state_set_cursor(x, path, n);
    dcp__free(path);
    if (rc != DCP_OK)
        return dcp__err(err, rc, "out of memory");
    if (se->is_tensor) {
        for (b = 0; rc == DCP_OK && b < se->nboxes; b++) {
            const struct st_box *box = &se->boxes[b];
            rc = dcp_state_add_tensor_strided(
                x, NULL, se->dtype, se->ndim, se->shape, box->off, box->size,
                box->strided ? box->stride : NULL, box->buf, se->mem);
            if (rc == DCP_OK && b == 0 && x->n == before)
                rc = DCP_EINVAL; /* merged into an existing key */
        }
    } else {
        rc = dcp_state_add_value(x, NULL, dcp_value_copy(se->value));
        if (rc == DCP_OK && x->n != before + 1)
            rc = DCP_EINVAL;
    }
    if (rc == DCP_ENOMEM)
        return dcp__err(err, rc, "out of memory");
    if (rc != DCP_OK)
        return dcp__err(err, rc, "key '%s'%s is used twice", se->key,
                        sub >= 0 ? " (below a stateful entry)" : "");
    if (x->n > before) {
        ex->origin[before].sub = sub;
        ex->origin[before].idx = idx;
    }
    return DCP_OK;
}

/* Calls one stateful's state_dict and adds what it produced. */
static int expand_one(struct st_expansion *ex, const struct st_entry *e, int op,
                      struct dcp_err *err)
{
    long j = (long)ex->nsubs;
    dcp_state *sub;
    size_t i;
    int r, rc = dcp_state_create(&sub);
    if (rc != DCP_OK)
        return dcp__err(err, rc, "out of memory");
    ex->subs[ex->nsubs++] = sub;
    sub->op = op + 1;
    r = e->sops.state_dict(e->userdata, sub);
    if (r != 0)
        return dcp__err(err, callback_code(r),
                        "stateful '%s': state_dict failed (returned %d)",
                        e->key, r);
    for (i = 0; i < sub->n; i++) {
        if (sub->e[i].is_stateful)
            return dcp__err(err, DCP_EINVAL,
                            "stateful '%s': its state_dict added the "
                            "stateful entry '%s' (nested stateful entries "
                            "are not supported)",
                            e->key, sub->e[i].key);
    }
    for (i = 0; rc == DCP_OK && i < sub->n; i++)
        rc = add_copy(ex, e->path, e->npath, &sub->e[i], j, i, err);
    return rc;
}

int dcp__state_expand(const dcp_state *st, int op, struct st_expansion *ex,
                      struct dcp_err *err)
{
    size_t i, nsf = 0;
    int rc;
    memset(ex, 0, sizeof(*ex));
    ex->use = st;
    for (i = 0; i < st->n; i++)
        nsf += st->e[i].is_stateful ? 1 : 0;
    if (!nsf)
        return DCP_OK;
    rc = dcp_state_create(&ex->x);
    ex->subs = dcp__calloc(nsf, sizeof(*ex->subs));
    ex->sfidx = dcp__calloc(nsf, sizeof(*ex->sfidx));
    if (rc != DCP_OK || !ex->subs || !ex->sfidx)
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    for (i = 0; rc == DCP_OK && i < st->n; i++) {
        const struct st_entry *e = &st->e[i];
        if (e->is_stateful) {
            ex->sfidx[ex->nsubs] = i;
            rc = expand_one(ex, e, op, err);
        } else {
            rc = add_copy(ex, NULL, 0, e, -1, i, err);
        }
    }
    if (rc == DCP_OK)
        ex->use = ex->x;
    return rc;
}

int dcp__state_expand_loaded(struct st_expansion *ex, dcp_state *st,
                             struct dcp_err *err)
{
    size_t i;
    if (!ex->x)
        return DCP_OK;
    for (i = 0; i < ex->x->n; i++) {
        struct st_entry *xe = &ex->x->e[i];
        const struct sf_origin *o = &ex->origin[i];
        dcp_state *from = o->sub < 0 ? st : ex->subs[o->sub];
        dcp_value *v;
        if (xe->is_tensor)
            continue;
        /* The template goes into x (freed with it), the loaded value back
         * where the caller will look for it. */
        v = from->e[o->idx].value;
        from->e[o->idx].value = xe->value;
        xe->value = v;
    }
    for (i = 0; i < ex->nsubs; i++) {
        const struct st_entry *e = &st->e[ex->sfidx[i]];
        int r = e->sops.load_state_dict(e->userdata, ex->subs[i]);
        if (r != 0)
            return dcp__err(err, callback_code(r),
                            "stateful '%s': load_state_dict failed "
                            "(returned %d)",
                            e->key, r);
    }
    return DCP_OK;
}

void dcp__state_expand_release(struct st_expansion *ex)
{
    size_t i;
    for (i = 0; i < ex->nsubs; i++)
        dcp_state_free(ex->subs[i]);
    dcp__free(ex->subs);
    dcp__free(ex->sfidx);
    dcp__free(ex->origin);
    dcp_state_free(ex->x);
    memset(ex, 0, sizeof(*ex));
}

static const struct st_entry *first_cuda(const dcp_state *st)
{
    size_t i;
    for (i = 0; i < st->n; i++)
        if (st->e[i].is_tensor && st->e[i].mem == DCP_MEM_CUDA)
            return &st->e[i];
    return NULL;
}

int dcp__state_expand_io(const dcp_state *st, int op, struct st_expansion *ex,
                         struct dcp_err *err)
{
    const struct st_entry *ce;
    int rc;
    memset(ex, 0, sizeof(*ex));
    if (!st)
        return DCP_OK;
    if (st->fail_code) /* dcp_state_fail: agreed by the caller's next step */
        return dcp__err(err, st->fail_code, "%s", st->fail_msg);
    rc = dcp__state_expand(st, op, ex, err);
    if (rc == DCP_OK && (ce = first_cuda(ex->use)) != NULL) {
        rc = dcp__cuda_open(err);
        if (rc != DCP_OK)
            (void)dcp__err_prefix(err, "tensor '%s' is in CUDA memory",
                                  ce->key);
    }
    return rc;
}

int dcp_state_op(const dcp_state *st)
{
    return st && st->op ? st->op - 1 : DCP_EINVAL;
}
