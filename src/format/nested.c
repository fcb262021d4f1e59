/*
 * A value record holding tensors (torch.save of a nested state): decoding
 * with the tensor allow-list and naming its leaves as torch's
 * flatten_state_dict does (torch/distributed/checkpoint/_traverse.py:
 * traverse_state_dict with _keep_visiting_tensors).
 */
#include "nested.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "torchzip.h"

static const struct pk_global plain_allow[] = {
    {"_codecs", "encode"},
    {"__builtin__", "bytes"},
    {"builtins", "bytes"},
};

int dcp__nest_decode(const void *pkl, size_t len, struct pk_arena **arena,
                     struct pk_node **root, struct dcp_err *err)
{
    struct pk_global allow[128];
    const struct pk_global *tg;
    struct pk_limits lim;
    size_t nt = dcp__tz_tensor_globals(&tg), i;
    *arena = NULL;
    *root = NULL;
    if (nt + DCP_ARRAY_LEN(plain_allow) > DCP_ARRAY_LEN(allow))
        return dcp__err(err, DCP_ELIMIT, "data.pkl: allow-list too long");
    for (i = 0; i < nt; i++)
        allow[i] = tg[i];
    for (i = 0; i < DCP_ARRAY_LEN(plain_allow); i++)
        allow[nt + i] = plain_allow[i];
    dcp__pk_limits_default(&lim);
    lim.max_nodes = NEST_MAX_NODES;
    return dcp__pk_decode(pkl, len, allow, nt + DCP_ARRAY_LEN(plain_allow),
                          &lim, 0, arena, root, err);
}

int dcp__nest_is_tensor(const struct pk_node *n)
{
    return n && n->kind == PK_OBJ && !n->newobj &&
           (dcp__pk_obj_is(n, "torch._utils", "_rebuild_tensor_v2") ||
            dcp__pk_obj_is(n, "torch._utils", "_rebuild_tensor_v3") ||
            dcp__pk_obj_is(n, "torch._utils", "_rebuild_qtensor"));
}

struct walk {
    nest_leaf_fn fn;
    void *arg;
    struct dcp_err *err;
    size_t visits;
    size_t leaves;
    struct nest_el path[NEST_MAX_DEPTH];
    char num[NEST_MAX_DEPTH][24]; /* str() of int keys */
};

static int visit(struct walk *w)
{
    if (++w->visits > NEST_MAX_VISITS)
        return dcp__err(w->err, DCP_ELIMIT,
                        "nested value: more than %zu objects visited (shared "
                        "references)",
                        NEST_MAX_VISITS);
    return DCP_OK;
}

/* torch's _is_terminal: dicts never are; a list is unless it holds a
 * tensor or a non-terminal dict or list; anything else is. *term gets the
 * answer. */
static int is_terminal(struct walk *w, const struct pk_node *n, int depth,
                       int *term)
{
    size_t i;
    int rc;
    *term = 1;
    if (depth >= NEST_MAX_DEPTH)
        return dcp__err(w->err, DCP_ELIMIT,
                        "nested value: nesting deeper than %d",
                        NEST_MAX_DEPTH);
    if ((rc = visit(w)) != DCP_OK)
        return rc;
    if (n->kind == PK_DICT) {
        *term = 0;
        return DCP_OK;
    }
    if (n->kind != PK_LIST)
        return DCP_OK;
    for (i = 0; i < n->u.seq.n; i++) {
        const struct pk_node *c = n->u.seq.v[i];
        int t = 1;
        if (dcp__nest_is_tensor(c) || c->kind == PK_DICT) {
            *term = 0;
            return DCP_OK;
        }
        if (c->kind == PK_LIST) {
            if ((rc = is_terminal(w, c, depth + 1, &t)) != DCP_OK)
                return rc;
            if (!t) {
                *term = 0;
                return DCP_OK;
            }
        }
    }
    return DCP_OK;
}

/* str(key) of a dict key, or NULL for a key dcp does not name. */
static const char *key_str(const struct pk_node *k, char *num, size_t cap)
{
    if (k->kind == PK_STR)
        return k->u.s.p;
    if (k->kind == PK_INT) {
        (void)snprintf(num, cap, "%" PRId64, k->u.i);
        return num;
    }
    if (k->kind == PK_BOOL)
        return k->u.b ? "True" : "False";
    return k->kind == PK_NONE ? "None" : NULL;
}

struct kname {
    const char *s;
    char num[24];
};

static int cmp_kname(const void *a, const void *b)
{
    return strcmp(((const struct kname *)a)->s, ((const struct kname *)b)->s);
}

/* A Python dict has each key once, and torch refuses two keys of one
 * str(): a pickle repeating one (SETITEM twice, 3 and "3") would name two
 * leaves alike and hide one from dcp__nest_find. */
static int unique_keys(struct walk *w, const struct pk_node *n)
{
    size_t k = n->u.seq.n / 2, i;
    struct kname *names;
    int rc = DCP_OK;
    if (k < 2)
        return DCP_OK;
    names = dcp__calloc(k, sizeof(*names));
    if (!names)
        return dcp__err(w->err, DCP_ENOMEM, "out of memory");
    for (i = 0; rc == DCP_OK && i < k; i++) {
        names[i].s = key_str(n->u.seq.v[2 * i], names[i].num,
                             sizeof(names[i].num));
        if (!names[i].s)
            rc = dcp__err(w->err, DCP_ENOTSUP,
                          "nested value: a dict key that is not a str, int, "
                          "bool or None");
    }
    if (rc == DCP_OK)
        qsort(names, k, sizeof(*names), cmp_kname);
    for (i = 1; rc == DCP_OK && i < k; i++)
        if (strcmp(names[i - 1].s, names[i].s) == 0)
            rc = dcp__err(w->err, DCP_EFORMAT,
                          "nested value: dict key '%.200s' appears twice",
                          names[i].s);
    dcp__free(names);
    return rc;
}

static int walk_node(struct walk *w, const struct pk_node *n, size_t depth)
{
    size_t i;
    int term, rc;
    if (depth >= NEST_MAX_DEPTH)
        return dcp__err(w->err, DCP_ELIMIT,
                        "nested value: nesting deeper than %d",
                        NEST_MAX_DEPTH);
    if ((rc = visit(w)) != DCP_OK)
        return rc;
    if (n->kind == PK_DICT) {
        if ((rc = unique_keys(w, n)) != DCP_OK)
            return rc;
        for (i = 0; i + 1 < n->u.seq.n; i += 2) {
            const char *k = key_str(n->u.seq.v[i], w->num[depth],
                                    sizeof(w->num[depth]));
            if (!k)
                return dcp__err(w->err, DCP_ENOTSUP,
                                "nested value: a dict key that is not a "
                                "str, int, bool or None");
            w->path[depth].s = k;
            w->path[depth].i = 0;
            if ((rc = walk_node(w, n->u.seq.v[i + 1], depth + 1)) != DCP_OK)
                return rc;
        }
        return DCP_OK;
    }
    if ((rc = is_terminal(w, n, (int)depth, &term)) != DCP_OK)
        return rc;
    if (term) {
        if (++w->leaves > NEST_MAX_LEAVES)
            return dcp__err(w->err, DCP_ELIMIT,
                            "nested value: more than %zu leaves",
                            NEST_MAX_LEAVES);
        return w->fn(w->arg, w->path, depth, n, w->err);
    }
    for (i = 0; i < n->u.seq.n; i++) { /* a list (tuples are terminal) */
        w->path[depth].s = NULL;
        w->path[depth].i = (int64_t)i;
        if ((rc = walk_node(w, n->u.seq.v[i], depth + 1)) != DCP_OK)
            return rc;
    }
    return DCP_OK;
}

int dcp__nest_walk(const struct pk_node *root, nest_leaf_fn fn, void *arg,
                   struct dcp_err *err)
{
    struct walk *w;
    int term = 1, rc;
    if (!root || !fn)
        return dcp__err(err, DCP_EINVAL, "nested value: no root");
    w = dcp__calloc(1, sizeof(*w));
    if (!w)
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    w->fn = fn;
    w->arg = arg;
    w->err = err;
    rc = is_terminal(w, root, 0, &term);
    if (rc == DCP_OK && term)
        rc = dcp__err(err, DCP_EINVAL, "not a nested state");
    if (rc == DCP_OK) {
        w->visits = 0;
        rc = walk_node(w, root, 0);
    }
    dcp__free(w);
    return rc;
}

const struct pk_node *dcp__nest_find(const struct pk_node *root,
                                     const struct md_pathel *path,
                                     size_t npath)
{
    const struct pk_node *n = root;
    char num[24];
    size_t d, i;
    for (d = 0; n && d < npath; d++) {
        const struct pk_node *next = NULL;
        if (n->kind == PK_DICT && path[d].s) {
            for (i = 0; !next && i + 1 < n->u.seq.n; i += 2) {
                const char *k = key_str(n->u.seq.v[i], num, sizeof(num));
                if (k && strcmp(k, path[d].s) == 0)
                    next = n->u.seq.v[i + 1];
            }
        } else if (n->kind == PK_LIST && !path[d].s && path[d].i >= 0 &&
                   (uint64_t)path[d].i < n->u.seq.n) {
            next = n->u.seq.v[path[d].i];
        }
        n = next;
    }
    return n;
}

int dcp__nest_name(const struct nest_el *path, size_t npath,
                   struct dcp_buf *out)
{
    size_t d;
    int rc = DCP_OK;
    for (d = 0; rc == DCP_OK && d < npath; d++) {
        if (d)
            rc = dcp__buf_put_u8(out, '.');
        if (rc == DCP_OK)
            rc = path[d].s ? dcp__buf_put(out, path[d].s, strlen(path[d].s))
                           : dcp__buf_printf(out, "%" PRId64, path[d].i);
    }
    return rc;
}
