/*
 * Model + AdamW state for C trainers (dcp_statedict.h): the description
 * (parameters in one flat space, AdamW groups), the flat slices each rank
 * binds, and the two stateful entries that turn them into the entries
 * PyTorch's get_state_dict has, at every save and load.
 *
 * Slices become boxes through dcp_range_boxes, so every tensor is stored
 * with its real shape and reshards like any other. dcp_sd_load runs the
 * check of sdcheck.c on rank 0 before dcp_load touches a buffer; the
 * optimizer's load_state_dict callback then takes the step (and, when
 * asked, the hyper-parameters) from what landed.
 */
#include "statedict.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "request.h"
#include "ctx.h"
#include "state.h"

/* ------------------------------------------------------- range boxes */

struct rb {
    int ndim;
    const int64_t *shape;
    int64_t stride[DCP_MAX_NDIM]; /* elements per index of dim k */
    int64_t prefix[DCP_MAX_NDIM]; /* fixed indices of the outer dims */
    dcp_box *boxes;
    size_t cap, n;
};

/* A box with dims < k fixed at prefix, dim k [off, off + size), the inner
 * dims whole. */
static int rb_emit(struct rb *r, int k, int64_t off, int64_t size,
                   int64_t begin)
{
    dcp_box *b;
    int d;
    if (r->n == r->cap)
        return DCP_EINVAL;
    b = &r->boxes[r->n++];
    memset(b, 0, sizeof(*b));
    for (d = 0; d < r->ndim; d++) {
        if (d < k) {
            b->offsets[d] = r->prefix[d];
            b->sizes[d] = 1;
        } else if (d == k) {
            b->offsets[d] = off;
            b->sizes[d] = size;
        } else {
            b->sizes[d] = r->shape[d];
        }
    }
    b->begin = begin;
    return DCP_OK;
}

/* Elements [s, e) of the sub-tensor of dims k.. whose outer indices are
 * r->prefix[0..k) and whose first element is at base: a partial head
 * (cut one level down), whole slices of dim k, a partial tail. Each level
 * adds at most two boxes, the innermost one. */
static int rb_cut(struct rb *r, int k, int64_t base, int64_t s, int64_t e)
{
    int64_t R = r->stride[k], i0, i1;
    int rc = DCP_OK;
    if (s >= e)
        return DCP_OK;
    if (k == r->ndim - 1 || (s % R == 0 && e % R == 0))
        return rb_emit(r, k, s / R, (e - s) / R, base + s);
    i0 = s / R;
    i1 = e / R;
    if (i0 == i1) {
        r->prefix[k] = i0;
        return rb_cut(r, k + 1, base + i0 * R, s - i0 * R, e - i0 * R);
    }
    if (s % R) {
        r->prefix[k] = i0;
        rc = rb_cut(r, k + 1, base + i0 * R, s - i0 * R, R);
        i0++;
    }
    if (rc == DCP_OK && i0 < i1)
        rc = rb_emit(r, k, i0, i1 - i0, base + i0 * R);
    if (rc == DCP_OK && e % R) {
        r->prefix[k] = i1;
        rc = rb_cut(r, k + 1, base + i1 * R, 0, e - i1 * R);
    }
    return rc;
}

int dcp_range_boxes(int ndim, const int64_t *shape, int64_t begin, int64_t end,
                    dcp_box *boxes, size_t cap, size_t *nboxes)
{
    struct rb r;
    int64_t numel;
    int d, rc;
    if (nboxes)
        *nboxes = 0;
    if (!nboxes || !boxes || ndim < 0 || ndim > DCP_MAX_NDIM ||
        (ndim && !shape))
        return DCP_EINVAL;
    numel = dcp__shape_numel(ndim, shape);
    if (numel < 0 || begin < 0 || begin > end || end > numel)
        return DCP_EINVAL;
    if (begin == end)
        return DCP_OK;
    if (ndim == 0) {
        if (cap < 1)
            return DCP_EINVAL;
        memset(boxes, 0, sizeof(*boxes));
        *nboxes = 1;
        return DCP_OK;
    }
    memset(&r, 0, sizeof(r));
    r.ndim = ndim;
    r.shape = shape;
    r.boxes = boxes;
    r.cap = cap;
    r.stride[ndim - 1] = 1;
    for (d = ndim - 2; d >= 0; d--)
        r.stride[d] = r.stride[d + 1] * shape[d + 1]; /* <= numel, nonzero */
    rc = rb_cut(&r, 0, 0, begin, end);
    *nboxes = rc == DCP_OK ? r.n : 0;
    return rc;
}

/* ------------------------------------------------------- description */

void dcp_adamw_defaults(dcp_adamw *hp)
{
    if (!hp)
        return;
    memset(hp, 0, sizeof(*hp));
    hp->struct_size = sizeof(*hp);
    hp->lr = 1e-3;
    hp->beta1 = 0.9;
    hp->beta2 = 0.999;
    hp->eps = 1e-8;
    hp->weight_decay = 1e-2;
}

static int hp_ok(const dcp_adamw *hp)
{
    return hp && hp->struct_size >= sizeof(*hp) && isfinite(hp->lr) &&
           hp->lr >= 0 && isfinite(hp->eps) && hp->eps >= 0 &&
           isfinite(hp->weight_decay) && hp->weight_decay >= 0 &&
           hp->beta1 >= 0 && hp->beta1 < 1 && hp->beta2 >= 0 && hp->beta2 < 1;
}

int dcp_sd_create(dcp_sd **out, dcp_dtype dtype)
{
    if (!out)
        return DCP_EINVAL;
    *out = NULL;
    if (dcp_dtype_size(dtype) == 0)
        return DCP_EINVAL;
    *out = dcp__calloc(1, sizeof(**out));
    if (!*out)
        return DCP_ENOMEM;
    (*out)->dtype = dtype;
    return DCP_OK;
}

void dcp_sd_free(dcp_sd *sd)
{
    size_t i;
    if (!sd)
        return;
    for (i = 0; i < sd->np; i++)
        dcp__free(sd->p[i].fqn);
    dcp__free(sd->p);
    dcp__free(sd->index);
    dcp__free(sd->g);
    dcp__free(sd->steps);
    dcp__free(sd);
}

int dcp_sd_add_group(dcp_sd *sd, const dcp_adamw *hp)
{
    if (!sd || !hp_ok(hp) || sd->frozen)
        return DCP_EINVAL;
    if (sd->ng == sd->capg) {
        size_t cap = sd->capg ? sd->capg * 2 : 4;
        dcp_adamw *g = dcp__realloc(sd->g, cap * sizeof(*g));
        if (!g)
            return DCP_ENOMEM;
        sd->g = g;
        sd->capg = cap;
    }
    memcpy(&sd->g[sd->ng], hp, sizeof(*hp));
    sd->g[sd->ng].struct_size = sizeof(*hp);
    sd->ng++;
    return DCP_OK;
}

static uint64_t fqn_hash(const char *s)
{
    uint64_t h = 1469598103934665603ULL;
    while (*s) {
        h ^= (unsigned char)*s++;
        h *= 1099511628211ULL;
    }
    return h;
}

/* Slot of fqn in the index: its entry, or the empty slot where it goes. */
static size_t index_slot(const dcp_sd *sd, const char *fqn)
{
    size_t m = sd->index_cap - 1, j = (size_t)fqn_hash(fqn) & m;
    while (sd->index[j] && strcmp(sd->p[sd->index[j] - 1].fqn, fqn) != 0)
        j = (j + 1) & m;
    return j;
}

long dcp__sd_find(const dcp_sd *sd, const char *fqn)
{
    size_t j;
    if (!sd->index_cap)
        return -1;
    j = index_slot(sd, fqn);
    return sd->index[j] ? (long)sd->index[j] - 1 : -1;
}

static int index_grow(dcp_sd *sd)
{
    size_t cap = sd->index_cap ? sd->index_cap * 2 : 64, i;
    uint32_t *old = sd->index;
    size_t oldcap = sd->index_cap;
    sd->index = dcp__calloc(cap, sizeof(*sd->index));
    if (!sd->index) {
        sd->index = old;
        return DCP_ENOMEM;
    }
    sd->index_cap = cap;
    for (i = 0; i < oldcap; i++)
        if (old[i])
            sd->index[index_slot(sd, sd->p[old[i] - 1].fqn)] = old[i];
    dcp__free(old);
    return DCP_OK;
}

int dcp_sd_add_param(dcp_sd *sd, size_t g, const char *fqn, int ndim,
                     const int64_t *shape)
{
    struct sd_param *p;
    int64_t numel, end, bytes;
    size_t slot;
    int rc;
    if (!sd || !fqn || !*fqn || sd->frozen || g >= sd->ng || ndim < 0 ||
        ndim > DCP_MAX_NDIM || (ndim && !shape) || sd->np >= UINT32_MAX - 1)
        return DCP_EINVAL;
    /* The flat space, in bytes too, must fit an int64_t. */
    numel = dcp__shape_numel(ndim, shape);
    if (numel < 0 || dcp__add_overflow_i64(sd->numel, numel, &end) ||
        dcp__mul_overflow_i64(end, (int64_t)dcp_dtype_size(sd->dtype), &bytes))
        return DCP_EINVAL;
    if (2 * (sd->np + 1) > sd->index_cap && (rc = index_grow(sd)) != DCP_OK)
        return rc;
    slot = index_slot(sd, fqn);
    if (sd->index[slot])
        return DCP_EINVAL;
    if (sd->np == sd->capp) {
        size_t cap = sd->capp ? sd->capp * 2 : 16;
        p = dcp__realloc(sd->p, cap * sizeof(*p));
        if (!p)
            return DCP_ENOMEM;
        sd->p = p;
        sd->capp = cap;
    }
    p = &sd->p[sd->np];
    memset(p, 0, sizeof(*p));
    p->fqn = dcp__strdup(fqn);
    if (!p->fqn)
        return DCP_ENOMEM;
    p->ndim = ndim;
    if (ndim)
        memcpy(p->shape, shape, (size_t)ndim * sizeof(*shape));
    p->off = sd->numel;
    p->numel = numel;
    p->group = g;
    sd->numel = end;
    sd->index[slot] = (uint32_t)++sd->np;
    return DCP_OK;
}

size_t dcp_sd_group_count(const dcp_sd *sd)
{
    return sd ? sd->ng : 0;
}

size_t dcp_sd_param_count(const dcp_sd *sd)
{
    return sd ? sd->np : 0;
}

int64_t dcp_sd_numel(const dcp_sd *sd)
{
    return sd ? sd->numel : 0;
}

int64_t dcp_sd_param_offset(const dcp_sd *sd, size_t i)
{
    return sd && i < sd->np ? sd->p[i].off : -1;
}

/* No more groups or parameters from here on; the step buffers exist. */
static int freeze(dcp_sd *sd)
{
    size_t i;
    if (sd->frozen)
        return DCP_OK;
    sd->steps = dcp__calloc(sd->np ? sd->np : 1, sizeof(*sd->steps));
    if (!sd->steps)
        return DCP_ENOMEM;
    for (i = 0; i < sd->np; i++)
        sd->steps[i] = (float)sd->step;
    sd->frozen = 1;
    return DCP_OK;
}

static int bind_ok(const dcp_sd *sd, int64_t begin, int64_t end, int bufs)
{
    return sd && begin >= 0 && begin <= end && end <= sd->numel &&
           (bufs || begin == end);
}

int dcp_sd_bind_model(dcp_sd *sd, int64_t begin, int64_t end, void *buf)
{
    int rc;
    if (!bind_ok(sd, begin, end, buf != NULL))
        return DCP_EINVAL;
    rc = freeze(sd);
    if (rc != DCP_OK)
        return rc;
    sd->mlo = begin;
    sd->mhi = end;
    sd->mbuf = buf;
    return DCP_OK;
}

int dcp_sd_bind_optim(dcp_sd *sd, int64_t begin, int64_t end, void *exp_avg,
                      void *exp_avg_sq)
{
    int rc;
    if (!bind_ok(sd, begin, end, exp_avg && exp_avg_sq))
        return DCP_EINVAL;
    rc = freeze(sd);
    if (rc != DCP_OK)
        return rc;
    sd->olo = begin;
    sd->ohi = end;
    sd->oavg = exp_avg;
    sd->osq = exp_avg_sq;
    return DCP_OK;
}

#define SD_MAX_STEP ((int64_t)1 << 24)

int dcp_sd_set_step(dcp_sd *sd, int64_t step)
{
    size_t i;
    if (!sd || step < 0 || step > SD_MAX_STEP)
        return DCP_EINVAL;
    sd->step = step;
    for (i = 0; sd->steps && i < sd->np; i++)
        sd->steps[i] = (float)step;
    return DCP_OK;
}

int64_t dcp_sd_step(const dcp_sd *sd)
{
    return sd ? sd->step : 0;
}

int dcp_sd_hparams(const dcp_sd *sd, size_t g, dcp_adamw *out)
{
    if (!sd || !out || g >= sd->ng || out->struct_size < sizeof(*out))
        return DCP_EINVAL;
    memcpy(out, &sd->g[g], sizeof(*out));
    return DCP_OK;
}

int dcp_sd_set_hparams(dcp_sd *sd, size_t g, const dcp_adamw *hp)
{
    if (!sd || g >= sd->ng || !hp_ok(hp))
        return DCP_EINVAL;
    memcpy(&sd->g[g], hp, sizeof(*hp));
    sd->g[g].struct_size = sizeof(*hp);
    return DCP_OK;
}

const char *dcp_sd_errmsg(const dcp_sd *sd)
{
    return sd ? sd->err : "";
}

/* ---------------------------------------------------------- entries */

const char *const dcp__sd_hp_names[SD_NHP] = {"lr",
                                              "betas",
                                              "eps",
                                              "weight_decay",
                                              "amsgrad",
                                              "maximize",
                                              "foreach",
                                              "capturable",
                                              "differentiable",
                                              "fused",
                                              "decoupled_weight_decay",
                                              "params"};

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
        if (sd->p[i].group == g &&
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

static int optim_state_dict(void *ud, dcp_state *sub)
{
    dcp_sd *sd = ud;
    int64_t none[1] = {0};
    size_t i, g;
    int rc = dcp_state_push(sub, "state");
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
static int optim_load_state_dict(void *ud, const dcp_state *sub)
{
    dcp_sd *sd = ud;
    struct dcp_buf why = {0}, key = {0};
    const dcp_value *vals[SD_NHP];
    dcp_adamw *got = NULL;
    size_t i, g, k, nbad = 0;
    int adopt = (sd->load_flags & DCP_SD_LOAD_HPARAMS) != 0;
    int rc = DCP_OK;
    sd->err[0] = '\0';
    for (i = 1; i < sd->np; i++) {
        if (memcmp(&sd->steps[i], &sd->steps[0], sizeof(float)) != 0) {
            (void)snprintf(sd->err, sizeof(sd->err),
                           "step of '%s' (%.9g) differs from that of '%s' "
                           "(%.9g)",
                           sd->p[i].fqn, sd->steps[i], sd->p[0].fqn,
                           sd->steps[0]);
            return DCP_EMISMATCH;
        }
    }
    if (sd->np) {
        float s = sd->steps[0];
        if (!(s >= 0 && s <= (float)SD_MAX_STEP) || s != floorf(s)) {
            (void)snprintf(sd->err, sizeof(sd->err),
                           "step of '%s' is %.9g, not a step count",
                           sd->p[0].fqn, s);
            return DCP_EMISMATCH;
        }
    }
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
    if (rc == DCP_OK && sd->np)
        sd->step = (int64_t)sd->steps[0];
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
    rc = freeze(sd);
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
    for (i = 0; rc == DCP_OK && i < sd->ng; i++)
        rc = dcp__buf_printf(b, "g%a,%a,%a,%a,%a|", sd->g[i].lr, sd->g[i].beta1,
                             sd->g[i].beta2, sd->g[i].eps,
                             sd->g[i].weight_decay);
    for (i = 0; rc == DCP_OK && i < sd->np; i++) {
        rc = dcp__buf_printf(b, "%zu:%s[", sd->p[i].group, sd->p[i].fqn);
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
    char ***list = &ctx->missing;
    size_t *n = &ctx->nmissing, i = 0;
    while (i < len) {
        const char *s = (const char *)p + i;
        size_t l = strnlen(s, len - i);
        char **nl;
        if (l == len - i)
            break; /* not terminated: cannot come from rank 0 */
        i += l + 1;
        if (l == 0) {
            list = &ctx->unexpected;
            n = &ctx->nunexpected;
            continue;
        }
        nl = dcp__realloc(*list, (*n + 1) * sizeof(*nl));
        if (!nl)
            return DCP_ENOMEM;
        *list = nl;
        nl[*n] = dcp__strdup(s);
        if (!nl[*n])
            return DCP_ENOMEM;
        (*n)++;
    }
    return DCP_OK;
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
