/*
 * The check dcp_sd_load makes before dcp_load touches a buffer: rank 0
 * reads .metadata (and the few small records that hold the step counts and
 * the param_groups values) and compares them with the sd's description,
 * collecting every problem instead of stopping at the first:
 *  - keys under the sd's keys missing from the checkpoint, and checkpoint
 *    keys under them that the model does not have (DCP_EKEY);
 *  - kinds, shapes and dtypes, step counts, hyper-parameters and group
 *    membership (DCP_EMISMATCH).
 * The message names the first of each (it must fit DCP_ERRMSG_MAX); the
 * missing and unexpected lists are complete, for dcp_load_report.
 */
#include "sdcheck.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "ctx.h"
#include "dtype.h"

/* How much of each list a message shows. */
#define NOTE_LIMIT 360

static int vnote(struct dcp_buf *out, const char *sep, const char *fmt,
                 va_list ap) __attribute__((format(printf, 3, 0)));
static int vnote(struct dcp_buf *out, const char *sep, const char *fmt,
                 va_list ap)
{
    int rc = DCP_OK;
    if (out->len >= NOTE_LIMIT) {
        if (out->len < 3 || memcmp(out->p + out->len - 3, "...", 3) != 0)
            rc = dcp__buf_printf(out, "%s...", sep);
        return rc;
    }
    if (out->len)
        rc = dcp__buf_printf(out, "%s", sep);
    if (rc == DCP_OK) {
        char tmp[512];
        (void)vsnprintf(tmp, sizeof(tmp), fmt, ap);
        rc = dcp__buf_printf(out, "%s", tmp);
    }
    return rc;
}

int dcp__sd_note(struct dcp_buf *out, const char *fmt, ...)
{
    va_list ap;
    int rc;
    va_start(ap, fmt);
    rc = vnote(out, "; ", fmt, ap);
    va_end(ap);
    return rc;
}

static int key_note(struct dcp_buf *out, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int key_note(struct dcp_buf *out, const char *fmt, ...)
{
    va_list ap;
    int rc;
    va_start(ap, fmt);
    rc = vnote(out, ", ", fmt, ap);
    va_end(ap);
    return rc;
}

static const char *type_name(const dcp_value *v)
{
    switch (dcp_value_type_of(v)) {
    case DCP_VALUE_NONE:
        return "None";
    case DCP_VALUE_BOOL:
        return "bool";
    case DCP_VALUE_INT:
        return "int";
    case DCP_VALUE_FLOAT:
        return "float";
    case DCP_VALUE_STR:
        return "str";
    case DCP_VALUE_BYTES:
        return "bytes";
    case DCP_VALUE_LIST:
        return "list";
    case DCP_VALUE_TUPLE:
        return "tuple";
    case DCP_VALUE_DICT:
        return "dict";
    }
    return "value";
}

/* A float or an int (not a bool) as a double. */
static int number(const dcp_value *v, double *x)
{
    if (dcp_value_type_of(v) == DCP_VALUE_FLOAT)
        *x = dcp_value_as_float(v);
    else if (dcp_value_type_of(v) == DCP_VALUE_INT)
        *x = (double)dcp_value_as_int(v);
    else
        return 0;
    return 1;
}

/* 1 for True (or a nonzero int), 0 for False (or 0), -1 for anything
 * else. */
static int truth(const dcp_value *v)
{
    if (dcp_value_type_of(v) == DCP_VALUE_BOOL)
        return dcp_value_as_bool(v) != 0;
    if (dcp_value_type_of(v) == DCP_VALUE_INT)
        return dcp_value_as_int(v) != 0;
    return -1;
}

/* One number of a group: compared with want, or adopted into *slot. */
static int check_number(const char *key, const char *name, const char *sub,
                        const dcp_value *v, double want, int adopt,
                        double *slot, int (*valid)(double), struct dcp_buf *out,
                        size_t *nbad)
{
    double x;
    if (!number(v, &x)) {
        (*nbad)++;
        return dcp__sd_note(out, "'%s.%s'%s: saved a %s, expected a number",
                            key, name, sub, type_name(v));
    }
    if (adopt && valid(x)) {
        *slot = x;
        return DCP_OK;
    }
    if (adopt) {
        (*nbad)++;
        return dcp__sd_note(out, "'%s.%s'%s: saved %.17g, not a valid value",
                            key, name, sub, x);
    }
    if (memcmp(&x, &want, sizeof(x)) != 0) {
        (*nbad)++;
        return dcp__sd_note(out, "'%s.%s'%s: saved %.17g, expected %.17g", key,
                            name, sub, x, want);
    }
    return DCP_OK;
}

static int valid_nonneg(double x)
{
    return isfinite(x) && x >= 0;
}

static int valid_beta(double x)
{
    return x >= 0 && x < 1;
}

static int check_flag(const char *key, const char *name, const dcp_value *v,
                      int want, const char *why, struct dcp_buf *out,
                      size_t *nbad)
{
    int t = truth(v);
    if (t == want)
        return DCP_OK;
    (*nbad)++;
    if (t < 0)
        return dcp__sd_note(out, "'%s.%s': saved a %s, expected %s", key, name,
                            type_name(v), want ? "True" : "False");
    return dcp__sd_note(out, "'%s.%s': saved %s, expected %s (%s)", key, name,
                        t ? "True" : "False", want ? "True" : "False", why);
}

/* The group's "params": the FQNs of its parameters, in any order. */
static int check_params(const dcp_sd *sd, size_t g, const char *key,
                        const dcp_value *v, struct dcp_buf *out, size_t *nbad)
{
    uint8_t *seen;
    size_t i, n = dcp_value_len(v);
    int rc = DCP_OK;
    if (dcp_value_type_of(v) != DCP_VALUE_LIST &&
        dcp_value_type_of(v) != DCP_VALUE_TUPLE) {
        (*nbad)++;
        return dcp__sd_note(out, "'%s.params': saved a %s, expected a list",
                            key, type_name(v));
    }
    seen = dcp__calloc(sd->np ? sd->np : 1, 1);
    if (!seen)
        return DCP_ENOMEM;
    for (i = 0; rc == DCP_OK && i < n; i++) {
        const dcp_value *it = dcp_value_item(v, i);
        size_t len;
        const char *s = dcp_value_as_str(it, &len);
        long j = s && strlen(s) == len ? dcp__sd_find(sd, s) : -1;
        if (!s) {
            (*nbad)++;
            rc = dcp__sd_note(out,
                              "'%s.params'[%zu]: saved a %s, expected "
                              "a str",
                              key, i, type_name(it));
        } else if (j < 0 || sd->p[j].group != g || seen[j] ||
                   sd->p[j].frozen) {
            (*nbad)++;
            rc = dcp__sd_note(out, "'%s.params': '%.*s' %s", key, (int)len, s,
                              j < 0              ? "is not a parameter of the model"
                              : seen[j]          ? "is listed twice"
                              : sd->p[j].frozen  ? "is frozen here"
                                                 : "belongs to another group");
        } else {
            seen[j] = 1;
        }
    }
    for (i = 0; rc == DCP_OK && i < sd->np; i++) {
        if (sd->p[i].group == g && !seen[i] && !sd->p[i].frozen) {
            (*nbad)++;
            rc = dcp__sd_note(out, "'%s.params': '%s' of group %zu missing",
                              key, sd->p[i].fqn, g);
        }
    }
    dcp__free(seen);
    return rc;
}

int dcp__sd_check_group(const dcp_sd *sd, size_t g, const char *key,
                        const dcp_value *const *vals, int adopt, dcp_adamw *got,
                        struct dcp_buf *out, size_t *nbad)
{
    const dcp_adamw *hp = &sd->g[g];
    const dcp_value *b = vals[1];
    int rc = DCP_OK;
    *got = *hp;
    if (vals[0])
        rc = check_number(key, "lr", "", vals[0], hp->lr, adopt, &got->lr,
                          valid_nonneg, out, nbad);
    if (rc == DCP_OK && b) {
        if ((dcp_value_type_of(b) != DCP_VALUE_TUPLE &&
             dcp_value_type_of(b) != DCP_VALUE_LIST) ||
            dcp_value_len(b) != 2) {
            (*nbad)++;
            rc = dcp__sd_note(out,
                              "'%s.betas': saved a %s of %zu, expected "
                              "a pair",
                              key, type_name(b), dcp_value_len(b));
        } else {
            rc = check_number(key, "betas", "[0]", dcp_value_item(b, 0),
                              hp->beta1, adopt, &got->beta1, valid_beta, out,
                              nbad);
            if (rc == DCP_OK)
                rc = check_number(key, "betas", "[1]", dcp_value_item(b, 1),
                                  hp->beta2, adopt, &got->beta2, valid_beta,
                                  out, nbad);
        }
    }
    if (rc == DCP_OK && vals[2])
        rc = check_number(key, "eps", "", vals[2], hp->eps, adopt, &got->eps,
                          valid_nonneg, out, nbad);
    if (rc == DCP_OK && vals[3])
        rc = check_number(key, "weight_decay", "", vals[3], hp->weight_decay,
                          adopt, &got->weight_decay, valid_nonneg, out, nbad);
    if (rc == DCP_OK && vals[4])
        rc = check_flag(key, "amsgrad", vals[4], 0,
                        "no max_exp_avg_sq state here", out, nbad);
    if (rc == DCP_OK && vals[5])
        rc =
            check_flag(key, "maximize", vals[5], 0, "not supported", out, nbad);
    if (rc == DCP_OK && vals[10])
        rc = check_flag(key, "decoupled_weight_decay", vals[10], 1,
                        "Adam's weight decay is not AdamW's", out, nbad);
    if (rc == DCP_OK && vals[11])
        rc = check_params(sd, g, key, vals[11], out, nbad);
    return rc;
}

/* Equal values: same type and bits, or an int and a float of equal
 * value (torch keeps a default 0 as the int 0). */
static int same_value(const dcp_value *a, const dcp_value *b)
{
    double x, y;
    if (dcp_value_equal(a, b))
        return 1;
    return number(a, &x) && number(b, &y) &&
           dcp_value_type_of(a) != dcp_value_type_of(b) && x == y;
}

int dcp__sd_check_gvalues(const dcp_sd *sd, size_t g, const dcp_value *want,
                          const char *key, const dcp_value *const *vals,
                          const dcp_value *params, int adopt, dcp_value **got,
                          struct dcp_buf *out, size_t *nbad)
{
    size_t k, n = dcp_value_len(want);
    int rc = DCP_OK;
    if (got && adopt) {
        *got = dcp_value_dict();
        if (!*got)
            return DCP_ENOMEM;
    }
    for (k = 0; rc == DCP_OK && k < n; k++) {
        size_t len;
        const char *name = dcp_value_as_str(dcp_value_dict_key(want, k), &len);
        const dcp_value *w = dcp_value_dict_get(want, name);
        if (got && adopt) {
            dcp_value *c = dcp_value_copy(vals[k] ? vals[k] : w);
            rc = c ? dcp_value_dict_set(*got, name, c) : DCP_ENOMEM;
        } else if (vals[k] && !same_value(vals[k], w)) {
            char *a = NULL, *b = NULL;
            (*nbad)++;
            (void)dcp_value_to_json(vals[k], &a);
            (void)dcp_value_to_json(w, &b);
            rc = dcp__sd_note(out, "'%s.%s': saved %s %.60s, expected %s %.60s",
                              key, name, type_name(vals[k]), a ? a : "?",
                              type_name(w), b ? b : "?");
            dcp_free(a);
            dcp_free(b);
        }
    }
    if (rc == DCP_OK && params)
        rc = check_params(sd, g, key, params, out, nbad);
    if (rc != DCP_OK && got && adopt) {
        dcp_value_free(*got);
        *got = NULL;
    }
    return rc;
}

/* ------------------------------------------------------------ check */

struct chk {
    dcp_ctx *ctx;
    const dcp_sd *sd;
    dcp_metadata *md;
    unsigned lflags;
    struct dcp_buf key; /* the key being checked */
    char **expected;    /* every key the sd has, for the scan */
    size_t nexpected, capexpected;
    struct dcp_buf *miss, *unex, mism;
    size_t *nmiss, *nunex, nmism;
    /* Step counts: the first one read, and its key. */
    int have_step;
    double step0;
    char *step0_key;
};

static int set_key(struct chk *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int set_key(struct chk *c, const char *fmt, ...)
{
    char tmp[1024];
    va_list ap;
    int n;
    va_start(ap, fmt);
    n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    c->key.len = 0;
    if (n < 0)
        return DCP_EINVAL;
    if ((size_t)n < sizeof(tmp))
        return dcp__buf_put(&c->key, tmp, (size_t)n + 1);
    /* Long FQNs: format again into the buffer itself. */
    if (dcp__buf_reserve(&c->key, (size_t)n + 1) != DCP_OK)
        return DCP_ENOMEM;
    va_start(ap, fmt);
    (void)vsnprintf((char *)c->key.p, (size_t)n + 1, fmt, ap);
    va_end(ap);
    c->key.len = (size_t)n + 1;
    return DCP_OK;
}

static int remember(struct chk *c, const char *key)
{
    if (c->nexpected == c->capexpected) {
        size_t cap = c->capexpected ? c->capexpected * 2 : 64;
        char **e = dcp__realloc(c->expected, cap * sizeof(*e));
        if (!e)
            return DCP_ENOMEM;
        c->expected = e;
        c->capexpected = cap;
    }
    c->expected[c->nexpected] = dcp__strdup(key);
    if (!c->expected[c->nexpected])
        return DCP_ENOMEM;
    c->nexpected++;
    return DCP_OK;
}

static int missing(struct chk *c, const char *key)
{
    /* A key of a dtype dcp cannot read is refused, never missing. */
    size_t i, nu = dcp_metadata_unsupported_count(c->md);
    int rc;
    for (i = 0; i < nu; i++) {
        dcp_entry_info e;
        const char *dt = "?";
        if (dcp_metadata_unsupported(c->md, i, &e, &dt) == DCP_OK &&
            !strcmp(e.key, key))
            return dcp__err(&c->ctx->err, DCP_ENOTSUP,
                            "key '%s': dtype torch.%s is not supported (the "
                            "checkpoint's other keys load)",
                            key, dt);
    }
    rc = dcp__buf_put(c->miss, key, strlen(key) + 1);
    (*c->nmiss)++;
    return rc;
}

/*
 * The tensor key in c->key: present, a tensor, of this shape and dtype
 * (any dtype with DCP_LOAD_CAST). Returns its metadata index in *idx, or
 * -1 when it is missing or does not match (recorded).
 */
static int expect_tensor(struct chk *c, dcp_dtype dtype, int ndim,
                         const int64_t *shape, long *idx)
{
    const char *key = (const char *)c->key.p;
    dcp_entry_info e;
    char a[DCP_SHAPE_TEXT_MAX], b[DCP_SHAPE_TEXT_MAX];
    int rc = remember(c, key);
    *idx = -1;
    if (rc != DCP_OK)
        return rc;
    *idx = dcp_metadata_find(c->md, key);
    if (*idx < 0)
        return missing(c, key);
    (void)dcp_metadata_entry(c->md, (size_t)*idx, &e);
    if (!e.is_tensor) {
        *idx = -1;
        c->nmism++;
        return dcp__sd_note(&c->mism, "'%s': saved a value, expected a tensor",
                            key);
    }
    if (e.ndim != ndim ||
        (ndim && memcmp(e.shape, shape, (size_t)ndim * sizeof(*shape)))) {
        *idx = -1;
        c->nmism++;
        (void)dcp_shape_format(a, sizeof(a), e.ndim, e.shape);
        (void)dcp_shape_format(b, sizeof(b), ndim, shape);
        return dcp__sd_note(&c->mism, "'%s': shape %s saved, %s expected", key,
                            a, b);
    }
    if (e.dtype != dtype && !(c->lflags & DCP_LOAD_CAST)) {
        *idx = -1;
        c->nmism++;
        return dcp__sd_note(&c->mism, "'%s': dtype %s saved, %s expected", key,
                            dcp_dtype_name(e.dtype), dcp_dtype_name(dtype));
    }
    if (!dcp__can_convert(dtype, e.dtype)) {
        *idx = -1;
        c->nmism++;
        return dcp__sd_note(&c->mism,
                            "'%s': dtype %s saved, %s expected, and torch "
                            "does not convert it either",
                            key, dcp_dtype_name(e.dtype),
                            dcp_dtype_name(dtype));
    }
    return DCP_OK;
}

/* The value key in c->key: read into *v (NULL when missing or a tensor,
 * recorded). */
static int expect_value(struct chk *c, dcp_value **v)
{
    const char *key = (const char *)c->key.p;
    dcp_entry_info e;
    long idx;
    int rc = remember(c, key);
    *v = NULL;
    if (rc != DCP_OK)
        return rc;
    idx = dcp_metadata_find(c->md, key);
    if (idx < 0)
        return missing(c, key);
    (void)dcp_metadata_entry(c->md, (size_t)idx, &e);
    if (e.is_tensor) {
        c->nmism++;
        return dcp__sd_note(&c->mism, "'%s': saved a tensor, expected a value",
                            key);
    }
    return dcp_metadata_read_value(c->ctx, c->md, (size_t)idx, v);
}

/* A stored step count (0-d) as a double; 0 when its dtype is not one a
 * step count comes in. */
static int read_step(struct chk *c, long idx, double *x)
{
    dcp_entry_info e;
    union {
        float f;
        double d;
        int64_t i64;
        int32_t i32;
    } u;
    int rc;
    (void)dcp_metadata_entry(c->md, (size_t)idx, &e);
    if (e.dtype != DCP_F32 && e.dtype != DCP_F64 && e.dtype != DCP_I64 &&
        e.dtype != DCP_I32)
        return 0;
    rc = dcp_metadata_read_box(c->ctx, c->md, (size_t)idx, NULL, NULL, &u,
                               dcp_dtype_size(e.dtype), 1);
    if (rc != DCP_OK)
        return rc;
    *x = e.dtype == DCP_F32   ? (double)u.f
         : e.dtype == DCP_F64 ? u.d
         : e.dtype == DCP_I64 ? (double)u.i64
                              : (double)u.i32;
    return 1;
}

static int check_step(struct chk *c, long idx)
{
    const char *key = (const char *)c->key.p;
    double x = 0;
    int r = read_step(c, idx, &x);
    if (r < 0)
        return r;
    if (r == 0) {
        c->nmism++;
        return dcp__sd_note(&c->mism,
                            "'%s': a step count cannot be a tensor "
                            "of this dtype",
                            key);
    }
    if (!(x >= 0 && x <= (double)SD_MAX_STEP) || x != floor(x)) {
        c->nmism++;
        return dcp__sd_note(&c->mism, "'%s': saved %.9g, not a step count", key,
                            x);
    }
    if (!c->have_step) {
        c->have_step = 1;
        c->step0 = x;
        c->step0_key = dcp__strdup(key);
        return c->step0_key ? DCP_OK : DCP_ENOMEM;
    }
    if (x != c->step0) {
        c->nmism++;
        return dcp__sd_note(&c->mism, "'%s': step %.9g, but '%s' has %.9g", key,
                            x, c->step0_key, c->step0);
    }
    return DCP_OK;
}

static int check_model(struct chk *c, const char *mkey)
{
    size_t i;
    long idx;
    int rc = DCP_OK;
    for (i = 0; rc == DCP_OK && i < c->sd->np; i++) {
        const struct sd_param *p = &c->sd->p[i];
        rc = set_key(c, "%s.%s", mkey, p->fqn);
        if (rc == DCP_OK)
            rc = expect_tensor(c, c->sd->dtype, p->ndim, p->shape, &idx);
    }
    return rc;
}

static int check_group_values(struct chk *c, const char *okey, size_t g,
                              unsigned flags)
{
    dcp_value *vals[SD_NHP] = {0};
    struct dcp_buf prefix = {0};
    dcp_adamw got;
    size_t k;
    int rc = dcp__buf_printf(&prefix, "%s.param_groups.%zu", okey, g);
    for (k = 0; rc == DCP_OK && k < SD_NHP; k++) {
        rc = set_key(c, "%s.%s", (const char *)prefix.p, dcp__sd_hp_names[k]);
        if (rc == DCP_OK)
            rc = expect_value(c, &vals[k]);
    }
    if (rc == DCP_OK)
        rc = dcp__sd_check_group(
            c->sd, g, (const char *)prefix.p, (const dcp_value *const *)vals,
            (flags & DCP_SD_LOAD_HPARAMS) != 0, &got, &c->mism, &c->nmism);
    for (k = 0; k < SD_NHP; k++)
        dcp_value_free(vals[k]);
    dcp__buf_free(&prefix);
    return rc;
}

/* The values of one generic group record: prefix.<hp> for every hp of the
 * group, and prefix.params when nested. */
static int check_gvalues_at(struct chk *c, const char *prefix, size_t g,
                            const dcp_value *want, int adopt, int nested)
{
    size_t k, n = dcp_value_len(want);
    dcp_value **vals = dcp__calloc(n ? n : 1, sizeof(*vals));
    dcp_value *params = NULL, *got = NULL;
    int rc = vals ? DCP_OK : DCP_ENOMEM;
    for (k = 0; rc == DCP_OK && k < n; k++) {
        size_t len;
        const char *name = dcp_value_as_str(dcp_value_dict_key(want, k), &len);
        rc = set_key(c, "%s.%s", prefix, name);
        if (rc == DCP_OK)
            rc = expect_value(c, &vals[k]);
    }
    if (rc == DCP_OK && nested) {
        rc = set_key(c, "%s.params", prefix);
        if (rc == DCP_OK)
            rc = expect_value(c, &params);
    }
    if (rc == DCP_OK)
        rc = dcp__sd_check_gvalues(c->sd, g, want, prefix,
                                   (const dcp_value *const *)vals, params,
                                   adopt, adopt ? &got : NULL, &c->mism,
                                   &c->nmism);
    for (k = 0; vals && k < n; k++)
        dcp_value_free(vals[k]);
    dcp__free(vals);
    dcp_value_free(params);
    dcp_value_free(got);
    return rc;
}

static int check_generic(struct chk *c, const char *okey, unsigned flags)
{
    const dcp_sd *sd = c->sd;
    struct dcp_buf prefix = {0};
    int adopt = (flags & DCP_SD_LOAD_HPARAMS) != 0;
    size_t i, g, k;
    long idx;
    int rc = DCP_OK;
    for (i = 0; rc == DCP_OK && i < sd->np; i++) {
        const struct sd_param *p = &sd->p[i];
        if (p->frozen)
            continue;
        if (sd->has_step) {
            rc = set_key(c, "%s.state.%s.step", okey, p->fqn);
            if (rc == DCP_OK)
                rc = expect_tensor(c, DCP_F32, 0, NULL, &idx);
            if (rc == DCP_OK && idx >= 0)
                rc = check_step(c, idx);
        }
        for (k = 0; rc == DCP_OK && k < sd->ns; k++) {
            rc = set_key(c, "%s.state.%s.%s", okey, p->fqn, sd->sname[k]);
            if (rc == DCP_OK)
                rc = expect_tensor(c, DCP_F32, 0, NULL, &idx);
        }
        for (k = 0; rc == DCP_OK && k < sd->nt; k++) {
            int64_t shape[DCP_MAX_NDIM], n;
            int ndim;
            if (!dcp__sd_state_shape(sd, k, p, &ndim, shape, &n))
                continue;
            rc = set_key(c, "%s.state.%s.%s", okey, p->fqn, sd->tname[k]);
            if (rc == DCP_OK)
                rc = expect_tensor(c, sd->dtype, ndim, shape, &idx);
        }
    }
    if (sd->oflags & DCP_SD_FLAT) {
        /* With adopt, values are not compared before the load: the
         * callback checks that a group's parameters agree. */
        for (i = 0; rc == DCP_OK && i < sd->np; i++) {
            if (sd->p[i].frozen)
                continue;
            prefix.len = 0;
            rc = dcp__buf_printf(&prefix, "%s.param_groups.%s", okey,
                                 sd->p[i].fqn);
            if (rc == DCP_OK)
                rc = check_gvalues_at(c, (const char *)prefix.p,
                                      sd->p[i].group, sd->gv[sd->p[i].group],
                                      adopt, 0);
        }
    } else {
        for (g = 0; rc == DCP_OK && g < sd->ng; g++) {
            prefix.len = 0;
            rc = dcp__buf_printf(&prefix, "%s.param_groups.%zu", okey, g);
            if (rc == DCP_OK)
                rc = check_gvalues_at(c, (const char *)prefix.p, g, sd->gv[g],
                                      adopt, 1);
        }
    }
    dcp__buf_free(&prefix);
    return rc;
}

static int check_optim(struct chk *c, const char *okey, unsigned flags)
{
    static const char *const moments[2] = {"exp_avg", "exp_avg_sq"};
    size_t i, g;
    long idx;
    int m, rc = DCP_OK;
    if (c->sd->generic)
        return check_generic(c, okey, flags);
    for (i = 0; rc == DCP_OK && i < c->sd->np; i++) {
        const struct sd_param *p = &c->sd->p[i];
        rc = set_key(c, "%s.state.%s.step", okey, p->fqn);
        if (rc == DCP_OK)
            rc = expect_tensor(c, DCP_F32, 0, NULL, &idx);
        if (rc == DCP_OK && idx >= 0)
            rc = check_step(c, idx);
        for (m = 0; rc == DCP_OK && m < 2; m++) {
            rc = set_key(c, "%s.state.%s.%s", okey, p->fqn, moments[m]);
            if (rc == DCP_OK)
                rc = expect_tensor(c, c->sd->dtype, p->ndim, p->shape, &idx);
        }
    }
    for (g = 0; rc == DCP_OK && g < c->sd->ng; g++)
        rc = check_group_values(c, okey, g, flags);
    return rc;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int under(const char *key, const char *prefix)
{
    size_t n = prefix ? strlen(prefix) : 0;
    return n && strncmp(key, prefix, n) == 0 && key[n] == '.';
}

/* Checkpoint keys under the sd's keys that it does not have. */
static int scan_unexpected(struct chk *c, const char *mkey, const char *okey)
{
    size_t i, n = dcp_metadata_count(c->md);
    int rc = DCP_OK;
    qsort(c->expected, c->nexpected, sizeof(*c->expected), cmp_str);
    for (i = 0; rc == DCP_OK && i < n; i++) {
        dcp_entry_info e;
        (void)dcp_metadata_entry(c->md, i, &e);
        if (!under(e.key, mkey) && !under(e.key, okey))
            continue;
        if (bsearch(&e.key, c->expected, c->nexpected, sizeof(*c->expected),
                    cmp_str))
            continue;
        rc = dcp__buf_put(c->unex, e.key, strlen(e.key) + 1);
        (*c->nunex)++;
    }
    return rc;
}

/* "'a', 'b', ..." from a NUL-separated list. */
static int quote_list(const struct dcp_buf *list, struct dcp_buf *out)
{
    size_t i = 0;
    int rc = DCP_OK;
    while (rc == DCP_OK && i < list->len) {
        const char *s = (const char *)list->p + i;
        rc = key_note(out, "'%s'", s);
        i += strlen(s) + 1;
    }
    return rc;
}

/* One part of the verdict: "; 3 mismatches (...)", when there are any. */
static int part(struct dcp_buf *msg, size_t n, const char *one,
                const char *many, const struct dcp_buf *items)
{
    if (!n)
        return DCP_OK;
    return dcp__buf_printf(msg, "%s%zu %s (%.*s)", msg->len ? "; " : "", n,
                           n == 1 ? one : many, (int)items->len,
                           items->p ? (const char *)items->p : "");
}

static int verdict(struct chk *c, const char *path)
{
    struct dcp_buf m = {0}, u = {0}, msg = {0};
    int code = *c->nmiss || *c->nunex ? DCP_EKEY : DCP_EMISMATCH;
    int rc = quote_list(c->miss, &m);
    if (rc == DCP_OK)
        rc = quote_list(c->unex, &u);
    if (rc == DCP_OK)
        rc = part(&msg, *c->nmiss, "missing key", "missing keys", &m);
    if (rc == DCP_OK)
        rc = part(&msg, *c->nunex, "unexpected key", "unexpected keys", &u);
    if (rc == DCP_OK)
        rc = part(&msg, c->nmism, "mismatch", "mismatches", &c->mism);
    if (rc == DCP_OK)
        rc = dcp__err(&c->ctx->err, code,
                      "checkpoint '%s' does not match the model and "
                      "optimizer: %s",
                      path, (const char *)msg.p);
    else
        rc = dcp__err(&c->ctx->err, DCP_ENOMEM, "out of memory");
    dcp__buf_free(&m);
    dcp__buf_free(&u);
    dcp__buf_free(&msg);
    return rc;
}

int dcp__sd_check(dcp_ctx *ctx, const dcp_sd *sd, const char *path,
                  const char *mkey, const char *okey, unsigned lflags,
                  unsigned flags, struct dcp_buf *miss, size_t *nmiss,
                  struct dcp_buf *unex, size_t *nunex)
{
    struct chk c;
    size_t i;
    int rc;
    memset(&c, 0, sizeof(c));
    c.ctx = ctx;
    c.sd = sd;
    c.lflags = lflags;
    c.miss = miss;
    c.unex = unex;
    c.nmiss = nmiss;
    c.nunex = nunex;
    rc = dcp_metadata_open(ctx, path, &c.md);
    if (rc == DCP_OK && mkey)
        rc = check_model(&c, mkey);
    if (rc == DCP_OK && okey)
        rc = check_optim(&c, okey, flags);
    if (rc == DCP_OK)
        rc = scan_unexpected(&c, mkey, okey);
    if (rc == DCP_ENOMEM)
        rc = dcp__err(&ctx->err, rc, "out of memory");
    if (rc == DCP_OK && (*nmiss || *nunex || c.nmism))
        rc = verdict(&c, path);
    for (i = 0; i < c.nexpected; i++)
        dcp__free(c.expected[i]);
    dcp__free(c.expected);
    dcp__free(c.step0_key);
    dcp__buf_free(&c.key);
    dcp__buf_free(&c.mism);
    dcp_metadata_free(c.md);
    return rc;
}
