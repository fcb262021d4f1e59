/*
 * Model + AdamW state for C trainers (dcp_statedict.h), at every save and
 * load: the two stateful entries that turn an sd's description (sd.c) into
 * the entries PyTorch's get_state_dict has, and dcp_sd_load, which runs the
 * check of sdcheck.c on rank 0 before dcp_load touches a buffer; the
 * optimizer's load_state_dict callback then takes the step (and, when
 * asked, the hyper-parameters) from what landed.
 */
#include "sd.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "request.h"
#include "ctx.h"
#include "sdcheck.h"
#include "state.h"

/* ---------------------------------------------------------- entries */

/*
 * Adds the boxes of parameter p that the slice [lo, hi) (held in base)
 * covers, as entry name of sub. An empty parameter is added whole by every
 * rank, so that its key exists.
 */
static int add_slice(const dcp_sd *sd, dcp_state *sub, const char *name,
                     const struct sd_param *p, int64_t lo, int64_t hi,
                     void *base)
{
    dcp_box boxes[DCP_RANGE_MAX_BOXES];
    size_t es = dcp_dtype_size(sd->dtype), n, k;
    int64_t a = p->off > lo ? p->off : lo;
    int64_t b = p->off + p->numel < hi ? p->off + p->numel : hi;
    int rc;
    if (p->numel == 0)
        return dcp_state_add_tensor(sub, name, sd->dtype, p->ndim, p->shape,
                                    NULL, NULL, NULL, DCP_MEM_HOST);
    if (a >= b)
        return DCP_OK;
    rc = dcp_range_boxes(p->ndim, p->shape, a - p->off, b - p->off, boxes,
                         DCP_RANGE_MAX_BOXES, &n);
    for (k = 0; rc == DCP_OK && k < n; k++) {
        uint8_t *buf =
            (uint8_t *)base + (size_t)(p->off + boxes[k].begin - lo) * es;
        rc = dcp_state_add_tensor(sub, name, sd->dtype, p->ndim, p->shape,
                                  boxes[k].offsets, boxes[k].sizes, buf,
                                  DCP_MEM_HOST);
    }
    return rc;
}

static int model_state_dict(void *ud, dcp_state *sub)
{
    dcp_sd *sd = ud;
    size_t i;
    int rc = DCP_OK;
    for (i = 0; rc == DCP_OK && i < sd->np; i++)
        rc = add_slice(sd, sub, sd->p[i].fqn, &sd->p[i], sd->mlo, sd->mhi,
                       sd->mbuf);
    return rc;
}

static int model_load_state_dict(void *ud, const dcp_state *sub)
{
    (void)ud;
    (void)sub;
    return 0;
}

static dcp_value *betas_value(const dcp_adamw *hp)
{
    dcp_value *t = dcp_value_tuple();
    if (t && (dcp_value_append(t, dcp_value_float(hp->beta1)) != DCP_OK ||
              dcp_value_append(t, dcp_value_float(hp->beta2)) != DCP_OK)) {
        dcp_value_free(t);
        return NULL;
    }
    return t;
}

static dcp_value *params_value(const dcp_sd *sd, size_t g)
{
    dcp_value *l = dcp_value_list();
    size_t i;
    for (i = 0; l && i < sd->np; i++) {
        if (sd->p[i].group == g && !sd->p[i].frozen &&
            dcp_value_append(l, dcp_value_str(sd->p[i].fqn)) != DCP_OK) {
            dcp_value_free(l);
            return NULL;
        }
    }
    return l;
}

/* Group g's values, in torch's order: what AdamW(...).state_dict() has. */
static int add_group(const dcp_sd *sd, dcp_state *sub, size_t g)
{
    const dcp_adamw *hp = &sd->g[g];
    dcp_value *v[SD_NHP];
    size_t k;
    int rc = DCP_OK;
    v[0] = dcp_value_float(hp->lr);
    v[1] = betas_value(hp);
    v[2] = dcp_value_float(hp->eps);
    v[3] = dcp_value_float(hp->weight_decay);
    v[4] = dcp_value_bool(0);  /* amsgrad */
    v[5] = dcp_value_bool(0);  /* maximize */
    v[6] = dcp_value_none();   /* foreach */
    v[7] = dcp_value_bool(0);  /* capturable */
    v[8] = dcp_value_bool(0);  /* differentiable */
    v[9] = dcp_value_none();   /* fused */
    v[10] = dcp_value_bool(1); /* decoupled_weight_decay */
    v[11] = params_value(sd, g);
    for (k = 0; k < SD_NHP; k++) {
        if (rc == DCP_OK)
            rc = dcp_state_add_value(sub, dcp__sd_hp_names[k], v[k]);
        else
            dcp_value_free(v[k]);
    }
    return rc;
}

/* A generic group's values (copies), and its "params" when nested. */
static int add_gvalues(const dcp_sd *sd, dcp_state *sub, size_t g,
                       int params)
{
    const dcp_value *d = sd->gv[g];
    size_t k, n = dcp_value_len(d);
    int rc = DCP_OK;
    for (k = 0; rc == DCP_OK && k < n; k++) {
        size_t len;
        const char *name = dcp_value_as_str(dcp_value_dict_key(d, k), &len);
        dcp_value *v = dcp_value_copy(dcp_value_dict_get(d, name));
        rc = v ? dcp_state_add_value(sub, name, v) : DCP_ENOMEM;
    }
    if (rc == DCP_OK && params) {
        dcp_value *l = params_value(sd, g);
        rc = l ? dcp_state_add_value(sub, "params", l) : DCP_ENOMEM;
    }
    return rc;
}

/*
 * State tensor k of parameter p: the part of the bound slice it covers
 * (kinds PARAM and UNFACTORED, whose elements are the parameter's), or the
 * whole tensor at *foff of its own space when the slice reaches the
 * parameter (ROW and COL). *foff advances past p's tensor k whether it is
 * added or not.
 */
static int add_state_tensor(const dcp_sd *sd, dcp_state *sub, size_t k,
                            const struct sd_param *p, int64_t *foff, int add)
{
    int64_t shape[DCP_MAX_NDIM], n, start = *foff;
    int ndim;
    uint8_t *buf;
    if (!dcp__sd_state_shape(sd, k, p, &ndim, shape, &n))
        return DCP_OK;
    if (sd->tkind[k] != DCP_SD_STATE_ROW && sd->tkind[k] != DCP_SD_STATE_COL)
        return add ? add_slice(sd, sub, sd->tname[k], p, sd->olo, sd->ohi,
                               sd->tbuf[k])
                   : DCP_OK;
    *foff += n;
    if (!add)
        return DCP_OK;
    if (p->numel == 0)
        return dcp_state_add_tensor(sub, sd->tname[k], sd->dtype, ndim, shape,
                                    NULL, NULL, NULL, DCP_MEM_HOST);
    if (p->off >= sd->ohi || p->off + p->numel <= sd->olo)
        return DCP_OK;
    buf = (uint8_t *)sd->tbuf[k] + (size_t)start * dcp_dtype_size(sd->dtype);
    return dcp_state_add_tensor(sub, sd->tname[k], sd->dtype, ndim, shape,
                                NULL, NULL, buf, DCP_MEM_HOST);
}

/* The state and param_groups of a generic optimizer (dcp_sd_create_optim),
 * nested or flat; frozen parameters have none. */
static int generic_state_dict(dcp_sd *sd, dcp_state *sub)
{
    int64_t none[1] = {0}, foff[SD_MAX_STATE] = {0};
    size_t i, g, k;
    int rc = dcp_state_push(sub, "state");
    for (i = 0; rc == DCP_OK && i < sd->np; i++) {
        const struct sd_param *p = &sd->p[i];
        if (p->frozen || (!sd->has_step && !sd->ns && !sd->nt)) {
            for (k = 0; rc == DCP_OK && k < sd->nt; k++)
                rc = add_state_tensor(sd, sub, k, p, &foff[k], 0);
            continue;
        }
        sd->steps[i] = (float)sd->step;
        rc = dcp_state_push(sub, p->fqn);
        if (rc == DCP_OK && sd->has_step)
            rc = dcp_state_add_tensor(sub, "step", DCP_F32, 0, none, NULL, NULL,
                                      &sd->steps[i], DCP_MEM_HOST);
        for (k = 0; rc == DCP_OK && k < sd->ns; k++)
            rc = dcp_state_add_tensor(sub, sd->sname[k], DCP_F32, 0, none,
                                      NULL, NULL, &sd->sval[k * sd->np + i],
                                      DCP_MEM_HOST);
        for (k = 0; rc == DCP_OK && k < sd->nt; k++)
            rc = add_state_tensor(sd, sub, k, p, &foff[k], 1);
        if (rc == DCP_OK)
            rc = dcp_state_pop(sub);
    }
    if (rc == DCP_OK)
        rc = dcp_state_pop(sub);
    if (rc == DCP_OK)
        rc = dcp_state_push(sub, "param_groups");
    if (sd->oflags & DCP_SD_FLAT) {
        for (i = 0; rc == DCP_OK && i < sd->np; i++) {
            if (sd->p[i].frozen)
                continue;
            rc = dcp_state_push(sub, sd->p[i].fqn);
            if (rc == DCP_OK)
                rc = add_gvalues(sd, sub, sd->p[i].group, 0);
            if (rc == DCP_OK)
                rc = dcp_state_pop(sub);
        }
    } else {
        for (g = 0; rc == DCP_OK && g < sd->ng; g++) {
            rc = dcp_state_push_index(sub, (int64_t)g);
            if (rc == DCP_OK)
                rc = add_gvalues(sd, sub, g, 1);
            if (rc == DCP_OK)
                rc = dcp_state_pop(sub);
        }
    }
    if (rc == DCP_OK)
        rc = dcp_state_pop(sub);
    return rc;
}

static int optim_state_dict(void *ud, dcp_state *sub)
{
    dcp_sd *sd = ud;
    int64_t none[1] = {0};
    size_t i, g;
    int rc;
    if (sd->generic)
        return generic_state_dict(sd, sub);
    rc = dcp_state_push(sub, "state");
    for (i = 0; rc == DCP_OK && i < sd->np; i++) {
        const struct sd_param *p = &sd->p[i];
        sd->steps[i] = (float)sd->step;
        rc = dcp_state_push(sub, p->fqn);
        if (rc == DCP_OK)
            rc = dcp_state_add_tensor(sub, "step", DCP_F32, 0, none, NULL, NULL,
                                      &sd->steps[i], DCP_MEM_HOST);
        if (rc == DCP_OK)
            rc = add_slice(sd, sub, "exp_avg", p, sd->olo, sd->ohi, sd->oavg);
        if (rc == DCP_OK)
            rc = add_slice(sd, sub, "exp_avg_sq", p, sd->olo, sd->ohi, sd->osq);
        if (rc == DCP_OK)
            rc = dcp_state_pop(sub);
    }
    if (rc == DCP_OK)
        rc = dcp_state_pop(sub);
    if (rc == DCP_OK)
        rc = dcp_state_push(sub, "param_groups");
    for (g = 0; rc == DCP_OK && g < sd->ng; g++) {
        rc = dcp_state_push_index(sub, (int64_t)g);
        if (rc == DCP_OK)
            rc = add_group(sd, sub, g);
        if (rc == DCP_OK)
            rc = dcp_state_pop(sub);
    }
    if (rc == DCP_OK)
        rc = dcp_state_pop(sub);
    return rc;
}

/* After a load: one step count for every parameter, the groups' values
 * checked again (a plain dcp_load has no check before) or adopted. */
/* The step counts that landed: one, a whole number, for every parameter
 * with optimizer state. Sets *first to the first such parameter (-1 when
 * none). Returns DCP_OK or DCP_EMISMATCH (sd->err says why). */
static int steps_landed(dcp_sd *sd, long *first)
{
    size_t i;
    long f = -1;
    for (i = 0; i < sd->np; i++) {
        if (sd->p[i].frozen)
            continue;
        if (f < 0) {
            float s = sd->steps[i];
            f = (long)i;
            if (!(s >= 0 && s <= (float)SD_MAX_STEP) || s != floorf(s)) {
                (void)snprintf(sd->err, sizeof(sd->err),
                               "step of '%s' is %.9g, not a step count",
                               sd->p[i].fqn, s);
                return DCP_EMISMATCH;
            }
        } else if (memcmp(&sd->steps[i], &sd->steps[f], sizeof(float)) != 0) {
            (void)snprintf(sd->err, sizeof(sd->err),
                           "step of '%s' (%.9g) differs from that of '%s' "
                           "(%.9g)",
                           sd->p[i].fqn, sd->steps[i], sd->p[f].fqn,
                           sd->steps[f]);
            return DCP_EMISMATCH;
        }
    }
    *first = f;
    return DCP_OK;
}

/* A generic optimizer after a load: steps, then every group's values as
 * landed, compared with the sd's or adopted. */
static int generic_landed(dcp_sd *sd, const dcp_state *sub)
{
    struct dcp_buf why = {0}, key = {0};
    const dcp_value **vals = NULL;
    dcp_value **got = NULL;
    size_t i, g, k, nbad = 0, maxk = 1;
    long first = -1;
    int adopt = (sd->load_flags & DCP_SD_LOAD_HPARAMS) != 0;
    int flat = (sd->oflags & DCP_SD_FLAT) != 0;
    int rc = sd->has_step ? steps_landed(sd, &first) : DCP_OK;
    if (rc != DCP_OK)
        return rc;
    for (g = 0; g < sd->ng; g++)
        if (dcp_value_len(sd->gv[g]) > maxk)
            maxk = dcp_value_len(sd->gv[g]);
    vals = dcp__calloc(maxk, sizeof(*vals));
    got = dcp__calloc(sd->ng ? sd->ng : 1, sizeof(*got));
    if (!vals || !got)
        rc = DCP_ENOMEM;
    /* Nested: one record per group. Flat: one per parameter, the group's
     * first parameter adopted (with adopt), the others compared with it. */
    for (i = 0; rc == DCP_OK && i < (flat ? sd->np : sd->ng); i++) {
        const dcp_value *d, *want, *params = NULL;
        size_t n;
        g = flat ? sd->p[i].group : i;
        if (flat && sd->p[i].frozen)
            continue;
        d = sd->gv[g];
        n = dcp_value_len(d);
        key.len = 0;
        rc = flat ? dcp__buf_printf(&key, "param_groups.%s", sd->p[i].fqn)
                  : dcp__buf_printf(&key, "param_groups.%zu", g);
        for (k = 0; rc == DCP_OK && k < n; k++) {
            size_t base = key.len, len;
            const char *name =
                dcp_value_as_str(dcp_value_dict_key(d, k), &len);
            rc = dcp__buf_printf(&key, ".%s", name);
            if (rc == DCP_OK)
                vals[k] = dcp_state_value(sub, (const char *)key.p);
            key.len = base;
            key.p[base] = '\0';
        }
        if (rc == DCP_OK && !flat) {
            size_t base = key.len;
            rc = dcp__buf_printf(&key, ".params");
            if (rc == DCP_OK)
                params = dcp_state_value(sub, (const char *)key.p);
            key.len = base;
            key.p[base] = '\0';
        }
        want = got[g] ? got[g] : d;
        if (rc == DCP_OK)
            rc = dcp__sd_check_gvalues(sd, g, want, (const char *)key.p, vals,
                                       params, adopt && !got[g],
                                       got[g] ? NULL : &got[g], &why, &nbad);
    }
    if (rc == DCP_OK && nbad) {
        rc = DCP_EMISMATCH;
        (void)snprintf(sd->err, sizeof(sd->err),
                       "optimizer param_groups differ from the model's: %s",
                       (const char *)why.p);
    }
    if (rc == DCP_OK && first >= 0)
        sd->step = (int64_t)sd->steps[first];
    for (g = 0; rc == DCP_OK && adopt && g < sd->ng; g++) {
        if (got[g]) {
            dcp_value_free(sd->gv[g]);
            sd->gv[g] = got[g];
            got[g] = NULL;
        }
    }
    for (g = 0; got && g < sd->ng; g++)
        dcp_value_free(got[g]);
    dcp__free(got);
    dcp__free(vals);
    dcp__buf_free(&why);
    dcp__buf_free(&key);
    return rc;
}

static int optim_load_state_dict(void *ud, const dcp_state *sub)
{
    dcp_sd *sd = ud;
    struct dcp_buf why = {0}, key = {0};
    const dcp_value *vals[SD_NHP];
    dcp_adamw *got = NULL;
    size_t g, k, nbad = 0;
    long first = -1;
    int adopt = (sd->load_flags & DCP_SD_LOAD_HPARAMS) != 0;
    int rc = DCP_OK;
    sd->err[0] = '\0';
    if (sd->generic)
        return generic_landed(sd, sub);
    rc = steps_landed(sd, &first);
    if (rc != DCP_OK)
        return rc;
    got = dcp__calloc(sd->ng ? sd->ng : 1, sizeof(*got));
    if (!got)
        return DCP_ENOMEM;
    for (g = 0; rc == DCP_OK && g < sd->ng; g++) {
        key.len = 0;
        rc = dcp__buf_printf(&key, "param_groups.%zu", g);
        for (k = 0; rc == DCP_OK && k < SD_NHP; k++) {
            size_t base = key.len;
            rc = dcp__buf_printf(&key, ".%s", dcp__sd_hp_names[k]);
            if (rc == DCP_OK)
                vals[k] = dcp_state_value(sub, (const char *)key.p);
            key.len = base;
            key.p[base] = '\0';
        }
        if (rc == DCP_OK)
            rc = dcp__sd_check_group(sd, g, (const char *)key.p, vals, adopt,
                                     &got[g], &why, &nbad);
    }
    if (rc == DCP_OK && nbad) {
        rc = DCP_EMISMATCH;
        (void)snprintf(sd->err, sizeof(sd->err),
                       "optimizer param_groups differ from the model's: %s",
                       (const char *)why.p);
    }
    if (rc == DCP_OK && first >= 0)
        sd->step = (int64_t)sd->steps[first];
    for (g = 0; rc == DCP_OK && adopt && g < sd->ng; g++)
        sd->g[g] = got[g];
    dcp__buf_free(&why);
    dcp__buf_free(&key);
    dcp__free(got);
    return rc;
}

static const dcp_stateful_ops model_ops = {
    DCP_STATEFUL_OPS_VERSION, model_state_dict, model_load_state_dict};
static const dcp_stateful_ops optim_ops = {
    DCP_STATEFUL_OPS_VERSION, optim_state_dict, optim_load_state_dict};

/* 1 when key, at st's current path, is already an entry of st. */
static int key_used(const dcp_state *st, const char *key)
{
    struct dcp_buf b = {0};
    size_t i;
    int rc = DCP_OK, used;
    for (i = 0; rc == DCP_OK && i < st->ncur; i++)
        rc = st->cur[i].s ? dcp__buf_printf(&b, "%s.", st->cur[i].s)
                          : dcp__buf_printf(&b, "%" PRId64 ".", st->cur[i].i);
    if (rc == DCP_OK)
        rc = dcp__buf_printf(&b, "%s", key);
    used = rc != DCP_OK || dcp__state_find(st, (const char *)b.p) != NULL;
    dcp__buf_free(&b);
    return used;
}

int dcp_sd_add_to_state(dcp_sd *sd, dcp_state *st, const char *model_key,
                        const char *optim_key)
{
    int rc;
    if (!sd || !st || (!model_key && !optim_key) ||
        (model_key && !*model_key) || (optim_key && !*optim_key) ||
        (model_key && optim_key && !strcmp(model_key, optim_key)) || !sd->np)
        return DCP_EINVAL;
    if ((model_key && key_used(st, model_key)) ||
        (optim_key && key_used(st, optim_key)))
        return DCP_EINVAL;
    rc = dcp__sd_freeze(sd);
    if (rc == DCP_OK && model_key)
        rc = dcp_state_add_stateful(st, model_key, &model_ops, sd);
    if (rc == DCP_OK && optim_key)
        rc = dcp_state_add_stateful(st, optim_key, &optim_ops, sd);
    return rc;
}

/* -------------------------------------------------------------- load */

/* The sd's two entries in st (keys, or NULL when absent). */
static void find_entries(const dcp_sd *sd, const dcp_state *st,
                         const char **mkey, const char **okey)
{
    size_t i;
    *mkey = *okey = NULL;
    for (i = 0; i < st->n; i++) {
        const struct st_entry *e = &st->e[i];
        if (!e->is_stateful || e->userdata != sd)
            continue;
        if (e->sops.state_dict == model_state_dict && !*mkey)
            *mkey = e->key;
        else if (e->sops.state_dict == optim_state_dict && !*okey)
            *okey = e->key;
    }
}

/* What every rank must agree on: dtype, keys, groups, parameters. */
static int describe(const dcp_sd *sd, const char *mkey, const char *okey,
                    struct dcp_buf *b)
{
    size_t i;
    int d, rc = dcp__buf_printf(b, "%d|%s|%s|", (int)sd->dtype,
                                mkey ? mkey : "", okey ? okey : "");
    for (i = 0; rc == DCP_OK && !sd->generic && i < sd->ng; i++)
        rc = dcp__buf_printf(b, "g%a,%a,%a,%a,%a|", sd->g[i].lr, sd->g[i].beta1,
                             sd->g[i].beta2, sd->g[i].eps,
                             sd->g[i].weight_decay);
    if (rc == DCP_OK && sd->generic)
        rc = dcp__buf_printf(b, "generic %u %d|", sd->oflags, sd->has_step);
    for (i = 0; rc == DCP_OK && sd->generic && i < sd->nt; i++)
        rc = dcp__buf_printf(b, "t%s:%d|", sd->tname[i], (int)sd->tkind[i]);
    for (i = 0; rc == DCP_OK && sd->generic && i < sd->ns; i++)
        rc = dcp__buf_printf(b, "s%s|", sd->sname[i]);
    for (i = 0; rc == DCP_OK && sd->generic && i < sd->ng; i++) {
        char *js = NULL;
        rc = dcp_value_to_json(sd->gv[i], &js);
        if (rc == DCP_OK)
            rc = dcp__buf_printf(b, "g%s|", js);
        dcp_free(js);
    }
    for (i = 0; rc == DCP_OK && i < sd->np; i++) {
        rc = dcp__buf_printf(b, "%zu%s:%s[", sd->p[i].group,
                             sd->p[i].frozen ? "f" : "", sd->p[i].fqn);
        for (d = 0; rc == DCP_OK && d < sd->p[i].ndim; d++)
            rc = dcp__buf_printf(b, "%" PRId64 ",", sd->p[i].shape[d]);
        if (rc == DCP_OK)
            rc = dcp__buf_put_u8(b, ']');
    }
    return rc == DCP_OK ? dcp__buf_put_u8(b, '\0') : rc;
}

/* Fills ctx's report from rank 0's lists, NUL-separated: missing keys, an
 * empty string, unexpected keys. */
static int report_from(dcp_ctx *ctx, const uint8_t *p, size_t len)
{
    int which = DCP__REPORT_MISSING, rc = DCP_OK;
    size_t i = 0;
    while (rc == DCP_OK && i < len) {
        const char *s = (const char *)p + i;
        size_t l = strnlen(s, len - i);
        if (l == len - i)
            break; /* not terminated: cannot come from rank 0 */
        i += l + 1;
        if (l == 0)
            which = DCP__REPORT_UNEXPECTED;
        else
            rc = dcp__ctx_report_add(ctx, which, s);
    }
    return rc;
}

/* Rank 0 checks path; every rank gets its verdict and the report. */
static int check_shared(dcp_ctx *ctx, const dcp_sd *sd, const char *path,
                        const char *mkey, const char *okey, unsigned lflags,
                        unsigned flags)
{
    struct dcp_buf miss = {0}, unex = {0};
    struct dcp_err scratch;
    uint8_t *got = NULL;
    size_t nmiss = 0, nunex = 0, gotlen = 0;
    int rc = DCP_OK, rc2;
    if (ctx->rank == 0) {
        rc = dcp__sd_check(ctx, sd, path, mkey, okey, lflags, flags, &miss,
                           &nmiss, &unex, &nunex);
        if (rc == DCP_EKEY && (dcp__buf_put_u8(&miss, '\0') != DCP_OK ||
                               dcp__buf_put(&miss, unex.p, unex.len) != DCP_OK))
            miss.len = 0; /* the message still names them */
    }
    rc = dcp__comm_share_err(ctx->comm, rc, &ctx->err, 0);
    if (rc == DCP_EKEY) {
        dcp__err_clear(&scratch);
        rc2 = dcp__comm_bcast_blob(ctx->comm, miss.p, miss.len, 0, &got,
                                   &gotlen, &scratch);
        if (rc2 == DCP_OK)
            rc2 = got ? report_from(ctx, got, gotlen)
                      : report_from(ctx, miss.p, miss.len);
        (void)rc2; /* the report is a convenience; the message has the keys */
    }
    dcp__free(got);
    dcp__buf_free(&miss);
    dcp__buf_free(&unex);
    return rc;
}

int dcp_sd_load(dcp_ctx *ctx, dcp_sd *sd, dcp_state *st, const char *path,
                const dcp_load_options *opts, unsigned flags)
{
    struct dcp_buf desc = {0};
    const char *mkey = NULL, *okey = NULL;
    unsigned lflags = 0;
    int rc = DCP_OK;
    if (!ctx)
        return DCP_EINVAL;
    dcp__async_settle(ctx);
    dcp__ctx_begin(ctx);
    dcp__ctx_clear_report(ctx);
    if (opts && opts->struct_size >= sizeof(*opts))
        lflags = opts->flags;
    if (!sd || !st || !path)
        rc = dcp__err(&ctx->err, DCP_EINVAL,
                      "dcp_sd_load: sd, state and path needed");
    if (rc == DCP_OK) {
        find_entries(sd, st, &mkey, &okey);
        if (!mkey && !okey)
            rc = dcp__err(&ctx->err, DCP_EINVAL,
                          "dcp_sd_load: the state holds no entry of this sd "
                          "(see dcp_sd_add_to_state)");
    }
    if (rc == DCP_OK && (flags & ~(unsigned)DCP_SD_LOAD_HPARAMS))
        rc = dcp__err(&ctx->err, DCP_EINVAL, "dcp_sd_load: unknown flags %#x",
                      flags);
    if (rc == DCP_OK && describe(sd, mkey, okey, &desc) != DCP_OK)
        rc = dcp__err(&ctx->err, DCP_ENOMEM, "out of memory");
    rc = dcp__comm_agree_err(ctx->comm, rc, &ctx->err);
    if (rc == DCP_OK)
        rc = dcp__comm_same_string(ctx->comm, (const char *)desc.p,
                                   "model and optimizer description (dtype, "
                                   "keys, groups, parameters)",
                                   &ctx->err);
    dcp__buf_free(&desc);
    if (rc == DCP_OK)
        rc = check_shared(ctx, sd, path, mkey, okey, lflags, flags);
    if (rc != DCP_OK)
        return rc;
    sd->err[0] = '\0';
    sd->load_flags = flags;
    rc = dcp_load(ctx, st, path, opts);
    sd->load_flags = 0;
    if (rc != DCP_OK && sd->err[0])
        (void)dcp__err_prefix(&ctx->err, "%s", sd->err);
    return rc;
}
