/*
 * Model + AdamW state for C trainers (dcp_statedict.h), the description:
 * parameters in one flat space with an index by name, AdamW groups, the
 * flat slices each rank binds, the step. What the checks (sdcheck.c) and
 * the state entries and load (sdload.c) read; this file calls neither.
 *
 * Slices become boxes through dcp_range_boxes, so every tensor is stored
 * with its real shape and reshards like any other.
 */
#include "sd.h"

#include <math.h> /* isfinite */
#include <string.h>

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
    dcp__htab_release(&sd->index);
    dcp__free(sd->g);
    dcp__free(sd->steps);
    for (i = 0; i < sd->nt; i++)
        dcp__free(sd->tname[i]);
    for (i = 0; i < sd->ns; i++)
        dcp__free(sd->sname[i]);
    for (i = 0; sd->gv && i < sd->ng; i++)
        dcp_value_free(sd->gv[i]);
    dcp__free(sd->gv);
    dcp__free(sd->sval);
    dcp__free(sd);
}

int dcp_sd_add_group(dcp_sd *sd, const dcp_adamw *hp)
{
    if (!sd || !hp_ok(hp) || sd->frozen || sd->generic)
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

/* The name of parameter i, for the index. */
static const void *param_fqn(const void *arr, uint32_t i, size_t *len)
{
    const struct sd_param *p = arr;
    *len = strlen(p[i].fqn);
    return p[i].fqn;
}

long dcp__sd_find(const dcp_sd *sd, const char *fqn)
{
    uint32_t i = dcp__htab_get(&sd->index, fqn, strlen(fqn), param_fqn, sd->p);
    return (long)i - 1;
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
    rc = dcp__htab_reserve(&sd->index, sd->np + 1, param_fqn, sd->p);
    if (rc != DCP_OK)
        return rc;
    slot = dcp__htab_slot(&sd->index, fqn, strlen(fqn), param_fqn, sd->p);
    if (sd->index.slot[slot])
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
    dcp__htab_set(&sd->index, slot, (uint32_t)sd->np++);
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

int dcp__sd_freeze(dcp_sd *sd)
{
    size_t i;
    if (sd->frozen)
        return DCP_OK;
    if (!sd->steps)
        sd->steps = dcp__calloc(sd->np ? sd->np : 1, sizeof(*sd->steps));
    if (!sd->steps)
        return DCP_ENOMEM;
    if (sd->ns && !sd->sval) {
        sd->sval = dcp__calloc(sd->ns * (sd->np ? sd->np : 1), sizeof(float));
        if (!sd->sval)
            return DCP_ENOMEM;
    }
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
    rc = dcp__sd_freeze(sd);
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
    if (!bind_ok(sd, begin, end, exp_avg && exp_avg_sq) || sd->generic)
        return DCP_EINVAL;
    rc = dcp__sd_freeze(sd);
    if (rc != DCP_OK)
        return rc;
    sd->olo = begin;
    sd->ohi = end;
    sd->oavg = exp_avg;
    sd->osq = exp_avg_sq;
    return DCP_OK;
}

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
    if (!sd || !out || g >= sd->ng || out->struct_size < sizeof(*out) ||
        sd->generic)
        return DCP_EINVAL;
    memcpy(out, &sd->g[g], sizeof(*out));
    return DCP_OK;
}

int dcp_sd_set_hparams(dcp_sd *sd, size_t g, const dcp_adamw *hp)
{
    if (!sd || g >= sd->ng || !hp_ok(hp) || sd->generic)
        return DCP_EINVAL;
    memcpy(&sd->g[g], hp, sizeof(*hp));
    sd->g[g].struct_size = sizeof(*hp);
    return DCP_OK;
}

const char *dcp_sd_errmsg(const dcp_sd *sd)
{
    return sd ? sd->err : "";
}

/* ------------------------------------------------------- hparam names */

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
