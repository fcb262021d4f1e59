/*
 * Selection, renaming and casting rules shared by export and import (see
 * cvname.h and the dcp_convert_options comments in dcp_convert.h).
 */
#include "cvname.h"

#include <fnmatch.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "dtype.h"

#define DEFAULT_MEM ((uint64_t)64 << 20)
#define MIN_MEM     ((uint64_t)1 << 20)

int dcp__cv_is_float(dcp_dtype dt)
{
    return dcp__dtype_is_float(dt);
}

int dcp__cv_options(const dcp_convert_options *in, dcp_convert_options *out,
                    struct dcp_err *err)
{
    memset(out, 0, sizeof(*out));
    if (in) {
        if (in->struct_size == 0 || in->struct_size > sizeof(*in))
            return dcp__err(err, DCP_EINVAL,
                            "bad dcp_convert_options.struct_size %u",
                            (unsigned)in->struct_size);
        memcpy(out, in, in->struct_size);
    }
    out->struct_size = sizeof(*out);
    if (out->dtype != 0 && !dcp__cv_is_float(out->dtype))
        return dcp__err(err, DCP_EINVAL,
                        "cannot cast to %s: the cast target must be a "
                        "floating-point dtype (integer and bool tensors are "
                        "never cast)",
                        dcp_dtype_name(out->dtype) ? dcp_dtype_name(out->dtype)
                                                   : "an unknown dtype");
    if (out->nkeys && !out->keys)
        return dcp__err(err, DCP_EINVAL, "nkeys without keys");
    if (out->mem_limit == 0)
        out->mem_limit = DEFAULT_MEM;
    if (out->mem_limit < MIN_MEM)
        out->mem_limit = MIN_MEM;
    return DCP_OK;
}

int dcp__cv_result_check(const dcp_convert_result *res, struct dcp_err *err)
{
    if (res && (res->struct_size == 0 || res->struct_size > sizeof(*res)))
        return dcp__err(err, DCP_EINVAL, "bad result struct_size");
    return DCP_OK;
}

void dcp__cv_result_put(dcp_convert_result *res, dcp_convert_result *mine)
{
    if (res) {
        uint32_t sz = res->struct_size;
        mine->struct_size = sz;
        memcpy(res, mine, sz);
    }
}

int dcp__cv_selected(const dcp_convert_options *o, const char *key)
{
    size_t i;
    if (!o->nkeys)
        return 1;
    for (i = 0; i < o->nkeys; i++)
        if (o->keys[i] && fnmatch(o->keys[i], key, 0) == 0)
            return 1;
    return 0;
}

void dcp__cv_name_release(struct cv_name *n)
{
    size_t i;
    for (i = 0; i < n->npath; i++)
        dcp__free(n->path[i].s);
    dcp__free(n->path);
    dcp__free(n->key);
    memset(n, 0, sizeof(*n));
}

int dcp__cv_join(const struct md_pathel *path, size_t npath, char **out)
{
    struct dcp_buf b = {0};
    size_t i;
    int rc = DCP_OK;
    for (i = 0; rc == DCP_OK && i < npath; i++) {
        if (i)
            rc = dcp__buf_put_u8(&b, '.');
        if (rc == DCP_OK)
            rc = path[i].s ? dcp__buf_put(&b, path[i].s, strlen(path[i].s))
                           : dcp__buf_printf(&b, "%" PRId64, path[i].i);
    }
    if (rc == DCP_OK)
        rc = dcp__buf_put_u8(&b, '\0');
    if (rc != DCP_OK) {
        dcp__buf_free(&b);
        return DCP_ENOMEM;
    }
    *out = (char *)b.p;
    return DCP_OK;
}

/* Appends a str (s != NULL, n bytes) or int component. */
static int push(struct cv_name *n, size_t *cap, const char *s, size_t len,
                int64_t i)
{
    if (n->npath == *cap) {
        size_t c = *cap ? *cap * 2 : 4;
        struct md_pathel *p = dcp__realloc(n->path, c * sizeof(*p));
        if (!p)
            return DCP_ENOMEM;
        n->path = p;
        *cap = c;
    }
    n->path[n->npath].s = NULL;
    n->path[n->npath].i = i;
    if (s && !(n->path[n->npath].s = dcp__strndup(s, len)))
        return DCP_ENOMEM;
    n->npath++;
    return DCP_OK;
}

/* Number of leading components whose joined text plus '.' is prefix, or
 * 0 when the prefix does not end on a component boundary. */
static size_t covered(const struct md_pathel *p, size_t np, const char *pre)
{
    size_t k, pos = 0, plen = strlen(pre);
    char num[32];
    for (k = 0; k + 1 < np; k++) {
        const char *s = p[k].s;
        size_t l;
        if (!s) {
            (void)snprintf(num, sizeof(num), "%" PRId64, p[k].i);
            s = num;
        }
        l = strlen(s);
        if (pos + l + 1 > plen || memcmp(pre + pos, s, l) != 0 ||
            pre[pos + l] != '.')
            return 0;
        pos += l + 1;
        if (pos == plen)
            return k + 1;
    }
    return 0;
}

static int rename_path(const dcp_convert_options *o, const char *key,
                       const struct md_pathel *path, size_t npath,
                       struct cv_name *out, size_t *cap)
{
    const char *sp = o->strip_prefix, *ap = o->add_prefix;
    size_t i, skip = 0, plen = sp ? strlen(sp) : 0;
    struct md_pathel flat_el;
    const struct md_pathel *rest = path;
    size_t nrest = npath;
    int rc = DCP_OK;

    /* 1. strip: drop whole components, or flatten to the stripped key */
    if (npath == 0 || (plen && strncmp(key, sp, plen) == 0 &&
                       !(skip = covered(path, npath, sp)))) {
        flat_el.s =
            (char *)(uintptr_t)(key + (plen && strncmp(key, sp, plen) == 0
                                           ? plen
                                           : 0));
        flat_el.i = 0;
        rest = &flat_el;
        nrest = 1;
    } else {
        rest = path + skip;
        nrest = npath - skip;
    }
    /* 2. add: whole components ("model."), or one flat component */
    if (ap && *ap && ap[strlen(ap) - 1] == '.') {
        const char *s = ap, *dot;
        while (rc == DCP_OK && (dot = strchr(s, '.')) != NULL) {
            rc = push(out, cap, s, (size_t)(dot - s), 0);
            s = dot + 1;
        }
    } else if (ap && *ap) {
        char *joined = NULL, *k;
        int ok;
        rc = dcp__cv_join(rest, nrest, &joined);
        if (rc != DCP_OK)
            return rc;
        k = dcp__malloc(strlen(ap) + strlen(joined) + 1);
        ok = k != NULL;
        if (k) {
            memcpy(k, ap, strlen(ap));
            memcpy(k + strlen(ap), joined, strlen(joined) + 1);
            rc = push(out, cap, k, strlen(k), 0);
        }
        dcp__free(joined);
        dcp__free(k);
        return ok ? rc : DCP_ENOMEM;
    }
    for (i = 0; rc == DCP_OK && i < nrest; i++)
        rc = push(out, cap, rest[i].s, rest[i].s ? strlen(rest[i].s) : 0,
                  rest[i].i);
    return rc;
}

int dcp__cv_rename(const dcp_convert_options *o, const char *key,
                   const struct md_pathel *path, size_t npath,
                   struct cv_name *out, struct dcp_err *err)
{
    size_t cap = 0;
    int rc;
    memset(out, 0, sizeof(*out));
    rc = rename_path(o, key, path, npath, out, &cap);
    if (rc == DCP_OK)
        rc = dcp__cv_join(out->path, out->npath, &out->key);
    if (rc != DCP_OK) {
        dcp__cv_name_release(out);
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    }
    if (out->key[0] == '\0') {
        dcp__cv_name_release(out);
        return dcp__err(err, DCP_EKEY, "'%s' renamed to an empty key", key);
    }
    return DCP_OK;
}

dcp_dtype dcp__cv_out_dtype(const dcp_convert_options *o, dcp_dtype dt)
{
    return o->dtype && dcp__cv_is_float(dt) ? o->dtype : dt;
}

int dcp__cv_cast(const dcp_convert_options *o, void *dst, dcp_dtype to,
                 const void *src, dcp_dtype from, size_t n, const char *key,
                 uint64_t first, struct dcp_err *err)
{
    size_t bad;
    dcp__convert(dst, to, src, from, n);
    if (to == from || (o->flags & DCP_CONVERT_ALLOW_OVERFLOW))
        return DCP_OK;
    bad = dcp__convert_overflow(dst, to, src, from, n);
    if (bad == n)
        return DCP_OK;
    return dcp__err(err, DCP_EMISMATCH,
                    "'%s': element %" PRIu64 " cannot be represented in %s "
                    "(out of range; DCP_CONVERT_ALLOW_OVERFLOW or "
                    "--allow-overflow keeps torch's result)",
                    key, first + bad, dcp_dtype_name(to));
}
