/*
 * The state: entries added by the caller, the nesting cursor, and the
 * flattening of dict values the way torch's flatten_state_dict does it.
 */
#include "state.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

int dcp_state_create(dcp_state **out)
{
    if (!out)
        return DCP_EINVAL;
    *out = dcp__calloc(1, sizeof(**out));
    return *out ? DCP_OK : DCP_ENOMEM;
}

static void path_free(struct md_pathel *p, size_t n)
{
    size_t i;
    for (i = 0; i < n; i++)
        dcp__free(p[i].s);
}

void dcp_state_free(dcp_state *st)
{
    size_t i;
    if (!st)
        return;
    for (i = 0; i < st->n; i++) {
        struct st_entry *e = &st->e[i];
        dcp__free(e->key);
        path_free(e->path, e->npath);
        dcp__free(e->path);
        dcp__free(e->boxes);
        dcp_value_free(e->value);
    }
    dcp__free(st->e);
    dcp__htab_release(&st->index);
    path_free(st->cur, st->ncur);
    dcp__free(st->cur);
    dcp__free(st->fail_msg);
    dcp__free(st);
}

int dcp_state_fail(dcp_state *st, int code, const char *msg)
{
    char *m;
    if (!st)
        return DCP_EINVAL;
    if (code >= 0 || !dcp_err_name(code) ||
        strcmp(dcp_err_name(code), "DCP_UNKNOWN") == 0)
        code = DCP_EINVAL;
    if (!msg || !*msg)
        msg = "state failed";
    /* dcp__strndup copies n bytes: the length, cut to a message's */
    m = dcp__strndup(msg, strnlen(msg, DCP_ERRMSG_MAX - 1));
    if (!m)
        return DCP_ENOMEM;
    dcp__free(st->fail_msg);
    st->fail_msg = m;
    st->fail_code = code;
    return DCP_OK;
}

/* ------------------------------------------------------------ nesting */

static int cur_push(dcp_state *st, const char *s, int64_t i)
{
    if (st->ncur == st->capcur) {
        size_t cap = st->capcur ? st->capcur * 2 : 8;
        struct md_pathel *p = dcp__realloc(st->cur, cap * sizeof(*p));
        if (!p)
            return DCP_ENOMEM;
        st->cur = p;
        st->capcur = cap;
    }
    st->cur[st->ncur].s = NULL;
    st->cur[st->ncur].i = i;
    if (s) {
        st->cur[st->ncur].s = dcp__strdup(s);
        if (!st->cur[st->ncur].s)
            return DCP_ENOMEM;
    }
    st->ncur++;
    return DCP_OK;
}

int dcp_state_push(dcp_state *st, const char *name)
{
    if (!st || !name)
        return DCP_EINVAL;
    return cur_push(st, name, 0);
}

int dcp_state_push_rank(dcp_state *st, int rank)
{
    char name[24];
    if (!st || rank < 0)
        return DCP_EINVAL;
    (void)snprintf(name, sizeof(name), "rank%d", rank);
    return dcp_state_push(st, name);
}

int dcp_state_push_index(dcp_state *st, int64_t index)
{
    if (!st || index < 0)
        return DCP_EINVAL;
    return cur_push(st, NULL, index);
}

int dcp_state_pop(dcp_state *st)
{
    if (!st || st->ncur == 0)
        return DCP_EINVAL;
    st->ncur--;
    dcp__free(st->cur[st->ncur].s);
    st->cur[st->ncur].s = NULL;
    return DCP_OK;
}

int dcp__state_set_cursor(dcp_state *st, const struct md_pathel *p, size_t n)
{
    size_t i;
    int rc = DCP_OK;
    while (st->ncur)
        (void)dcp_state_pop(st);
    for (i = 0; rc == DCP_OK && i < n; i++)
        rc = cur_push(st, p[i].s, p[i].i);
    return rc;
}

/* -------------------------------------------------------------- index */

/* The key of entry i, for the index. */
static const void *entry_key(const void *arr, uint32_t i, size_t *len)
{
    const struct st_entry *e = arr;
    *len = strlen(e[i].key);
    return e[i].key;
}

struct st_entry *dcp__state_find(const dcp_state *st, const char *key)
{
    uint32_t i = dcp__htab_get(&st->index, key, strlen(key), entry_key, st->e);
    return i ? &st->e[i - 1] : NULL;
}

/* Joins the current path plus a last component into a key. */
static int join_key(const dcp_state *st, const char *last, int64_t last_i,
                    struct dcp_buf *b)
{
    size_t i;
    int rc = DCP_OK;
    for (i = 0; rc == DCP_OK && i <= st->ncur; i++) {
        const char *s = i < st->ncur ? st->cur[i].s : last;
        int64_t num = i < st->ncur ? st->cur[i].i : last_i;
        if (i)
            rc = dcp__buf_put_u8(b, '.');
        if (rc != DCP_OK)
            break;
        rc = s ? dcp__buf_put(b, s, strlen(s))
               : dcp__buf_printf(b, "%" PRId64, num);
    }
    return rc == DCP_OK ? dcp__buf_put_u8(b, '\0') : rc;
}

/* Appends a new entry for the current path + name; *out points into st. */
static int entry_new(dcp_state *st, const char *name, int64_t name_i,
                     struct st_entry **out)
{
    struct dcp_buf key = {0};
    struct st_entry *e;
    size_t i;
    int rc;
    rc = join_key(st, name, name_i, &key);
    if (rc != DCP_OK)
        goto out_free;
    if (dcp__state_find(st, (const char *)key.p)) {
        rc = DCP_EINVAL;
        goto out_free;
    }
    if (st->n >= UINT32_MAX - 1) {
        rc = DCP_ELIMIT;
        goto out_free;
    }
    if (st->n == st->cap) {
        size_t cap = st->cap ? st->cap * 2 : 16;
        struct st_entry *ne = dcp__realloc(st->e, cap * sizeof(*ne));
        if (!ne) {
            rc = DCP_ENOMEM;
            goto out_free;
        }
        st->e = ne;
        st->cap = cap;
    }
    rc = dcp__htab_reserve(&st->index, st->n + 1, entry_key, st->e);
    if (rc != DCP_OK)
        goto out_free;
    e = &st->e[st->n];
    memset(e, 0, sizeof(*e));
    e->path = dcp__calloc(st->ncur + 1, sizeof(*e->path));
    if (!e->path) {
        rc = DCP_ENOMEM;
        goto out_free;
    }
    for (i = 0; i <= st->ncur; i++) {
        const char *s = i < st->ncur ? st->cur[i].s : name;
        e->path[i].i = i < st->ncur ? st->cur[i].i : name_i;
        if (s) {
            e->path[i].s = dcp__strdup(s);
            if (!e->path[i].s) {
                path_free(e->path, i);
                dcp__free(e->path);
                rc = DCP_ENOMEM;
                goto out_free;
            }
        }
    }
    e->npath = st->ncur + 1;
    e->key = (char *)key.p;
    dcp__htab_set(&st->index,
                  dcp__htab_slot(&st->index, e->key, strlen(e->key),
                                 entry_key, st->e),
                  (uint32_t)st->n);
    st->n++;
    *out = e;
    return DCP_OK;
out_free:
    dcp__buf_free(&key);
    return rc;
}

/* ------------------------------------------------------------ tensors */

static int box_check(dcp_dtype dtype, int ndim, const int64_t *shape,
                     const int64_t *off, const int64_t *size)
{
    uint64_t n = dcp_dtype_size(dtype), t;
    int d;
    for (d = 0; d < ndim; d++) {
        int64_t end;
        if (shape[d] < 0 || off[d] < 0 || size[d] < 0)
            return DCP_EINVAL;
        if (dcp__add_overflow_i64(off[d], size[d], &end) || end > shape[d])
            return DCP_EINVAL;
        if (dcp__mul_overflow_u64(n, (uint64_t)shape[d], &t))
            return DCP_EINVAL;
        n = t;
    }
    return n > (uint64_t)INT64_MAX ? DCP_EINVAL : DCP_OK;
}

/*
 * With name NULL the entry goes at the current path itself: its last
 * component (a dict key or a list index pushed by the caller) is taken off
 * the cursor for the duration of the call.
 */
static int take_last(dcp_state *st, const char **name, int64_t *name_i,
                     struct md_pathel *saved)
{
    if (*name)
        return 0;
    if (st->ncur == 0)
        return -1;
    *saved = st->cur[--st->ncur];
    *name = saved->s;
    *name_i = saved->i;
    return 1;
}

static int add_tensor_at(dcp_state *st, const char *name, int64_t name_i,
                         dcp_dtype dtype, int ndim, const int64_t *shape,
                         const int64_t *off, const int64_t *size, void *buf,
                         const int64_t *stride, dcp_mem mem)
{
    struct dcp_buf key = {0};
    struct st_entry *e;
    struct st_box *box;
    int d, rc;
    rc = join_key(st, name, name_i, &key);
    if (rc != DCP_OK)
        return rc;
    e = dcp__state_find(st, (const char *)key.p);
    dcp__buf_free(&key);
    if (e) {
        if (!e->is_tensor || e->dtype != dtype || e->ndim != ndim ||
            e->mem != mem ||
            (ndim && memcmp(e->shape, shape, (size_t)ndim * sizeof(int64_t))))
            return DCP_EINVAL;
    } else {
        rc = entry_new(st, name, name_i, &e);
        if (rc != DCP_OK)
            return rc;
        e->is_tensor = 1;
        e->dtype = dtype;
        e->ndim = ndim;
        e->mem = mem;
        for (d = 0; d < ndim; d++)
            e->shape[d] = shape[d];
    }
    if (e->nboxes == e->capboxes) {
        size_t cap = e->capboxes ? e->capboxes * 2 : 1;
        struct st_box *nb = dcp__realloc(e->boxes, cap * sizeof(*nb));
        if (!nb)
            return DCP_ENOMEM;
        e->boxes = nb;
        e->capboxes = cap;
    }
    box = &e->boxes[e->nboxes++];
    memset(box, 0, sizeof(*box));
    for (d = 0; d < ndim; d++) {
        box->off[d] = off[d];
        box->size[d] = size[d];
    }
    box->buf = buf;
    if (stride) {
        box->strided = 1;
        for (d = 0; d < ndim; d++)
            box->stride[d] = stride[d];
    }
    return DCP_OK;
}

const int64_t *dcp__box_strides(const struct st_box *b, int ndim,
                                int64_t tmp[DCP_MAX_NDIM])
{
    if (b->strided)
        return b->stride;
    dcp__box_cstrides(ndim, b->size, tmp);
    return tmp;
}

#define DCP_MAX_DTYPE_SIZE 16 /* complex128 */

/* Checks strides for a box of the given sizes: non-negative, and no two
 * elements at one address (dimensions of more than one element, ordered
 * by stride, each stride at least the previous one's extent). *contig is
 * 1 when they are the C-contiguous strides wherever it matters (sizes of
 * 0 or 1 make a stride irrelevant). */
static int strides_check(int ndim, const int64_t *size, const int64_t *stride,
                         int *contig)
{
    int order[DCP_MAX_NDIM], n = 0, i, j, d;
    int64_t c = 1;
    *contig = 1;
    for (d = 0; d < ndim; d++)
        if (stride[d] < 0)
            return DCP_EINVAL;
    for (d = ndim - 1; d >= 0; d--) {
        if (size[d] > 1 && stride[d] != c)
            *contig = 0;
        if (size[d] > 1)
            c *= size[d];
    }
    for (d = 0; d < ndim; d++)
        if (size[d] > 1)
            order[n++] = d;
    for (i = 1; i < n; i++) /* insertion sort by stride */
        for (j = i; j > 0 && stride[order[j]] < stride[order[j - 1]]; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    for (i = 0; i < n; i++) {
        int64_t need = 1, ext;
        if (i > 0 && (dcp__mul_overflow_i64(stride[order[i - 1]],
                                            size[order[i - 1]], &ext) ||
                      (need = ext) < 0))
            return DCP_EINVAL;
        if (stride[order[i]] < need)
            return DCP_EINVAL;
    }
    if (n) { /* the whole extent, in bytes, must be addressable */
        int64_t ext;
        if (dcp__mul_overflow_i64(stride[order[n - 1]], size[order[n - 1]],
                                  &ext) ||
            dcp__mul_overflow_i64(ext, DCP_MAX_DTYPE_SIZE, &ext))
            return DCP_EINVAL;
    }
    return DCP_OK;
}

int dcp_state_add_tensor(dcp_state *st, const char *name, dcp_dtype dtype,
                         int ndim, const int64_t *global_shape,
                         const int64_t *offsets, const int64_t *sizes,
                         void *buf, dcp_mem mem)
{
    return dcp_state_add_tensor_strided(st, name, dtype, ndim, global_shape,
                                        offsets, sizes, NULL, buf, mem);
}

int dcp_state_add_tensor_strided(dcp_state *st, const char *name,
                                 dcp_dtype dtype, int ndim,
                                 const int64_t *global_shape,
                                 const int64_t *offsets, const int64_t *sizes,
                                 const int64_t *strides, void *buf,
                                 dcp_mem mem)
{
    int64_t off[DCP_MAX_NDIM] = {0}, size[DCP_MAX_NDIM] = {0}, name_i = 0;
    struct md_pathel saved;
    int d, rc, took, contig = 1;
    if (!st || dcp_dtype_size(dtype) == 0 || ndim < 0 || ndim > DCP_MAX_NDIM ||
        (ndim > 0 && !global_shape) ||
        (mem != DCP_MEM_HOST && mem != DCP_MEM_CUDA))
        return DCP_EINVAL;
    for (d = 0; d < ndim; d++) {
        off[d] = offsets ? offsets[d] : 0;
        size[d] = sizes ? sizes[d] : global_shape[d];
    }
    rc = box_check(dtype, ndim, global_shape, off, size);
    if (rc != DCP_OK)
        return rc;
    if (!buf && dcp__box_numel(ndim, size) != 0)
        return DCP_EINVAL;
    if (strides && (rc = strides_check(ndim, size, strides, &contig)) != DCP_OK)
        return rc;
    if (!contig && mem != DCP_MEM_HOST)
        return DCP_ENOTSUP;
    took = take_last(st, &name, &name_i, &saved);
    if (took < 0)
        return DCP_EINVAL;
    rc = add_tensor_at(st, name, name_i, dtype, ndim, global_shape, off,
                       size, buf, contig ? NULL : strides, mem);
    if (took)
        st->cur[st->ncur++] = saved;
    return rc;
}

/* ------------------------------------------------------------- values */

static int add_value_at(dcp_state *st, const char *name, int64_t name_i,
                        dcp_value *value, int depth);

/* Adds each child of a dict or expanding list one level down. The children
 * move out of the container, which is freed. */
static int add_children(dcp_state *st, dcp_value *v, int depth)
{
    size_t i, n = v->u.seq.n;
    int rc = DCP_OK;
    int is_dict = v->type == DCP_VALUE_DICT;
    for (i = 0; i < n; i += is_dict ? 2 : 1) {
        dcp_value *child = v->u.seq.v[i + (is_dict ? 1 : 0)];
        v->u.seq.v[i + (is_dict ? 1 : 0)] = NULL;
        if (rc != DCP_OK) {
            dcp_value_free(child);
            continue;
        }
        if (is_dict) {
            const dcp_value *k = v->u.seq.v[i];
            if (k->type == DCP_VALUE_STR && strlen(k->u.s.p) != k->u.s.len) {
                /* A NUL inside would cut the key short. */
                dcp_value_free(child);
                rc = DCP_EINVAL;
            } else if (k->type == DCP_VALUE_STR) {
                rc = add_value_at(st, k->u.s.p, 0, child, depth + 1);
            } else if (k->type == DCP_VALUE_INT) {
                /* torch uses str(k) for the key and keeps it a str. */
                char num[32];
                (void)snprintf(num, sizeof(num), "%" PRId64, k->u.i);
                rc = add_value_at(st, num, 0, child, depth + 1);
            } else {
                dcp_value_free(child);
                rc = DCP_EINVAL;
            }
        } else {
            rc = add_value_at(st, NULL, (int64_t)i, child, depth + 1);
        }
    }
    dcp_value_free(v);
    return rc;
}

static int add_value_at(dcp_state *st, const char *name, int64_t name_i,
                        dcp_value *value, int depth)
{
    struct st_entry *e;
    int rc;
    if (depth > 64) {
        dcp_value_free(value);
        return DCP_ELIMIT;
    }
    if (value->type == DCP_VALUE_DICT || dcp__value_list_expands(value)) {
        rc = cur_push(st, name, name_i);
        if (rc != DCP_OK) {
            dcp_value_free(value);
            return rc;
        }
        rc = add_children(st, value, depth);
        (void)dcp_state_pop(st);
        return rc;
    }
    rc = entry_new(st, name, name_i, &e);
    if (rc != DCP_OK) {
        dcp_value_free(value);
        return rc;
    }
    e->value = value;
    return DCP_OK;
}

int dcp_state_add_value(dcp_state *st, const char *name, dcp_value *value)
{
    struct md_pathel saved;
    int64_t name_i = 0;
    int rc, took;
    if (!value)
        return DCP_ENOMEM;
    if (!st) {
        dcp_value_free(value);
        return DCP_EINVAL;
    }
    took = take_last(st, &name, &name_i, &saved);
    if (took < 0) {
        dcp_value_free(value);
        return DCP_EINVAL;
    }
    rc = add_value_at(st, name, name_i, value, 0);
    if (took)
        st->cur[st->ncur++] = saved;
    return rc;
}

int dcp_state_add_stateful(dcp_state *st, const char *name,
                           const dcp_stateful_ops *ops, void *userdata)
{
    struct md_pathel saved;
    struct st_entry *e;
    int64_t name_i = 0;
    int rc, took;
    if (!st || !ops || ops->version < 1 || !ops->state_dict ||
        !ops->load_state_dict)
        return DCP_EINVAL;
    took = take_last(st, &name, &name_i, &saved);
    if (took < 0)
        return DCP_EINVAL;
    rc = entry_new(st, name, name_i, &e);
    if (rc == DCP_OK) {
        e->is_stateful = 1;
        e->sops.version = 1;
        e->sops.state_dict = ops->state_dict;
        e->sops.load_state_dict = ops->load_state_dict;
        e->userdata = userdata;
    }
    if (took)
        st->cur[st->ncur++] = saved;
    return rc;
}

size_t dcp_state_count(const dcp_state *st)
{
    return st ? st->n : 0;
}

const char *dcp_state_key(const dcp_state *st, size_t i)
{
    return st && i < st->n ? st->e[i].key : NULL;
}

const dcp_value *dcp_state_value(const dcp_state *st, const char *fqn)
{
    const struct st_entry *e;
    if (!st || !fqn)
        return NULL;
    e = dcp__state_find(st, fqn);
    return e && !e->is_tensor ? e->value : NULL;
}

