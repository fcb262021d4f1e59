/*
 * Any optimizer for C trainers (dcp_statedict.h), the description: the
 * presets of torch 2.13's optimizers (state names, param_groups values with
 * torch's defaults and Python types) and the generic description an sd
 * holds instead of AdamW's (state tensor and scalar names, groups as
 * dicts, frozen parameters). The entries (sdload.c) and checks
 * (sdcheck.c) read it through sd.h.
 */
#include "sd.h"

#include <string.h>

/* ----------------------------------------------------------- presets */

/* One hyper-parameter of a preset: its name and torch's default. */
enum hpt { HP_F, HP_I0, HP_B, HP_NONE, HP_BETAS, HP_NONE_F };
struct hp {
    const char *name;
    enum hpt t;
    double f; /* HP_F: the float; HP_B: 0/1; HP_BETAS: beta1 (beta2 in f2) */
    double f2;
};

#define F(n, v) {n, HP_F, v, 0}
#define I0(n) {n, HP_I0, 0, 0}
#define B(n, v) {n, HP_B, v, 0}
#define NONE(n) {n, HP_NONE, 0, 0}
#define BETAS(a, b) {"betas", HP_BETAS, a, b}
#define NONE_F(n, b) {n, HP_NONE_F, 0, b} /* (None, b) */
#define END {NULL, HP_NONE, 0, 0}

/* torch 2.13, group 0 of each optimizer built with its defaults, in
 * state_dict()'s order. */
static const struct hp sgd[] = {
    F("lr", 1e-3),      I0("momentum"),        I0("dampening"),
    I0("weight_decay"), B("nesterov", 0),      B("maximize", 0),
    NONE("foreach"),    B("differentiable", 0), NONE("fused"),
    END};
static const struct hp adam[] = {
    F("lr", 1e-3),          BETAS(0.9, 0.999),     F("eps", 1e-8),
    I0("weight_decay"),     B("amsgrad", 0),       B("maximize", 0),
    NONE("foreach"),        B("capturable", 0),    B("differentiable", 0),
    NONE("fused"),          B("decoupled_weight_decay", 0),
    END};
static const struct hp adamw[] = {
    F("lr", 1e-3),          BETAS(0.9, 0.999),     F("eps", 1e-8),
    F("weight_decay", 1e-2), B("amsgrad", 0),      B("maximize", 0),
    NONE("foreach"),        B("capturable", 0),    B("differentiable", 0),
    NONE("fused"),          B("decoupled_weight_decay", 1),
    END};
static const struct hp adagrad[] = {
    F("lr", 1e-2),       I0("lr_decay"),
    F("eps", 1e-10),     I0("weight_decay"),
    I0("initial_accumulator_value"), NONE("foreach"),
    B("maximize", 0),    B("differentiable", 0),
    NONE("fused"),       END};
static const struct hp rmsprop[] = {
    F("lr", 1e-2),      I0("momentum"),         F("alpha", 0.99),
    F("eps", 1e-8),     B("centered", 0),       I0("weight_decay"),
    B("capturable", 0), NONE("foreach"),        B("maximize", 0),
    B("differentiable", 0), END};
static const struct hp adadelta[] = {
    F("lr", 1.0),       F("rho", 0.9),          F("eps", 1e-6),
    I0("weight_decay"), B("maximize", 0),       B("capturable", 0),
    NONE("foreach"),    B("differentiable", 0), END};
static const struct hp adamax[] = {
    F("lr", 2e-3),      BETAS(0.9, 0.999),      F("eps", 1e-8),
    I0("weight_decay"), NONE("foreach"),        B("maximize", 0),
    B("differentiable", 0), B("capturable", 0), END};
static const struct hp nadam[] = {
    F("lr", 2e-3),      BETAS(0.9, 0.999),      F("eps", 1e-8),
    I0("weight_decay"), F("momentum_decay", 4e-3),
    B("decoupled_weight_decay", 0), B("maximize", 0), NONE("foreach"),
    B("capturable", 0), B("differentiable", 0), END};
static const struct hp radam[] = {
    F("lr", 1e-3),      BETAS(0.9, 0.999),      F("eps", 1e-8),
    I0("weight_decay"), B("maximize", 0),       NONE("foreach"),
    B("capturable", 0), B("decoupled_weight_decay", 0),
    B("differentiable", 0), END};

static const struct hp adafactor[] = {
    F("lr", 1e-2),      F("beta2_decay", -0.8), NONE_F("eps", 1e-3),
    F("d", 1.0),        F("weight_decay", 0.0), NONE("foreach"),
    B("maximize", 0),   END};

static dcp_value *hp_value(const struct hp *h)
{
    dcp_value *t;
    switch (h->t) {
    case HP_NONE_F:
        t = dcp_value_tuple();
        if (t && (dcp_value_append(t, dcp_value_none()) != DCP_OK ||
                  dcp_value_append(t, dcp_value_float(h->f2)) != DCP_OK)) {
            dcp_value_free(t);
            return NULL;
        }
        return t;
    case HP_F:
        return dcp_value_float(h->f);
    case HP_I0:
        return dcp_value_int(0);
    case HP_B:
        return dcp_value_bool(h->f != 0);
    case HP_NONE:
        return dcp_value_none();
    case HP_BETAS:
        t = dcp_value_tuple();
        if (t && (dcp_value_append(t, dcp_value_float(h->f)) != DCP_OK ||
                  dcp_value_append(t, dcp_value_float(h->f2)) != DCP_OK)) {
            dcp_value_free(t);
            return NULL;
        }
        return t;
    }
    return NULL;
}

static int set_one(dcp_value *d, const char *name, dcp_value *v)
{
    return v ? dcp_value_dict_set(d, name, v) : DCP_ENOMEM;
}

/* Appends state tensor name of this kind to l. */
static void add_tensor(dcp_sd_optim *l, const char *name, dcp_sd_state_kind k)
{
    l->tensor_kinds[l->ntensors] = k;
    l->tensors[l->ntensors++] = name;
}

/* kind's state for the variant into l (zeroed by the caller), the
 * variant bits it knows into *allowed; its hyper-parameters, or NULL for
 * an unknown kind. */
static const struct hp *preset_layout(dcp_optim_kind kind, unsigned variant,
                                      dcp_sd_optim *l, unsigned *allowed)
{
    const dcp_sd_state_kind par = DCP_SD_STATE_PARAM;
    l->step = 1;
    *allowed = 0;
    switch (kind) {
    case DCP_OPTIM_SGD:
        *allowed = DCP_OPTIM_MOMENTUM;
        l->step = 0;
        if (variant & DCP_OPTIM_MOMENTUM)
            add_tensor(l, "momentum_buffer", par);
        return sgd;
    case DCP_OPTIM_ADAM:
    case DCP_OPTIM_ADAMW:
        *allowed = DCP_OPTIM_AMSGRAD;
        add_tensor(l, "exp_avg", par);
        add_tensor(l, "exp_avg_sq", par);
        if (variant & DCP_OPTIM_AMSGRAD)
            add_tensor(l, "max_exp_avg_sq", par);
        return kind == DCP_OPTIM_ADAM ? adam : adamw;
    case DCP_OPTIM_ADAGRAD:
        add_tensor(l, "sum", par);
        return adagrad;
    case DCP_OPTIM_RMSPROP:
        *allowed = DCP_OPTIM_MOMENTUM | DCP_OPTIM_CENTERED;
        add_tensor(l, "square_avg", par);
        if (variant & DCP_OPTIM_MOMENTUM)
            add_tensor(l, "momentum_buffer", par);
        if (variant & DCP_OPTIM_CENTERED)
            add_tensor(l, "grad_avg", par);
        return rmsprop;
    case DCP_OPTIM_ADADELTA:
        add_tensor(l, "square_avg", par);
        add_tensor(l, "acc_delta", par);
        return adadelta;
    case DCP_OPTIM_ADAMAX:
        add_tensor(l, "exp_avg", par);
        add_tensor(l, "exp_inf", par);
        return adamax;
    case DCP_OPTIM_NADAM:
        l->scalars[l->nscalars++] = "mu_product";
        add_tensor(l, "exp_avg", par);
        add_tensor(l, "exp_avg_sq", par);
        return nadam;
    case DCP_OPTIM_RADAM:
        add_tensor(l, "exp_avg", par);
        add_tensor(l, "exp_avg_sq", par);
        return radam;
    case DCP_OPTIM_ADAFACTOR:
        add_tensor(l, "row_var", DCP_SD_STATE_ROW);
        add_tensor(l, "col_var", DCP_SD_STATE_COL);
        add_tensor(l, "variance", DCP_SD_STATE_UNFACTORED);
        return adafactor;
    }
    return NULL;
}

int dcp_sd_optim_preset(dcp_optim_kind kind, unsigned variant,
                        dcp_sd_optim *layout, dcp_value **group)
{
    const struct hp *hps;
    dcp_sd_optim l;
    unsigned allowed;
    size_t k;
    int rc = DCP_OK;
    dcp_value *d;
    if (group)
        *group = NULL;
    if (!layout)
        return DCP_EINVAL;
    memset(&l, 0, sizeof(l));
    l.struct_size = sizeof(l);
    hps = preset_layout(kind, variant, &l, &allowed);
    if (!hps || (variant & ~allowed))
        return DCP_EINVAL;
    *layout = l;
    if (!group)
        return DCP_OK;
    d = dcp_value_dict();
    if (!d)
        return DCP_ENOMEM;
    for (k = 0; rc == DCP_OK && hps[k].name; k++)
        rc = set_one(d, hps[k].name, hp_value(&hps[k]));
    if (rc == DCP_OK && (variant & DCP_OPTIM_MOMENTUM))
        rc = set_one(d, "momentum", dcp_value_float(0.9));
    if (rc == DCP_OK && (variant & DCP_OPTIM_AMSGRAD))
        rc = set_one(d, "amsgrad", dcp_value_bool(1));
    if (rc == DCP_OK && (variant & DCP_OPTIM_CENTERED))
        rc = set_one(d, "centered", dcp_value_bool(1));
    if (rc != DCP_OK) {
        dcp_value_free(d);
        return rc;
    }
    *group = d;
    return DCP_OK;
}

/* ------------------------------------------------------- description */

static int name_ok(const char *n)
{
    return n && *n && !strchr(n, '.') && strcmp(n, "step") != 0;
}

/* The layout's names: valid and all different. */
static int layout_ok(const dcp_sd_optim *l)
{
    const char *all[2 * DCP_SD_OPTIM_MAX_STATE];
    size_t n = 0, i, j;
    if (!l || l->struct_size < sizeof(*l) || (l->flags & ~(unsigned)DCP_SD_FLAT) ||
        l->ntensors > DCP_SD_OPTIM_MAX_STATE ||
        l->nscalars > DCP_SD_OPTIM_MAX_STATE)
        return 0;
    for (i = 0; i < l->ntensors; i++) {
        if ((unsigned)l->tensor_kinds[i] > DCP_SD_STATE_UNFACTORED)
            return 0;
        all[n++] = l->tensors[i];
    }
    for (i = 0; i < l->nscalars; i++)
        all[n++] = l->scalars[i];
    for (i = 0; i < n; i++) {
        if (!name_ok(all[i]))
            return 0;
        for (j = 0; j < i; j++)
            if (!strcmp(all[i], all[j]))
                return 0;
    }
    return 1;
}

int dcp_sd_create_optim(dcp_sd **out, dcp_dtype dtype,
                        const dcp_sd_optim *layout)
{
    dcp_sd *sd;
    size_t i;
    int rc;
    if (!out)
        return DCP_EINVAL;
    *out = NULL;
    if (!layout_ok(layout))
        return DCP_EINVAL;
    rc = dcp_sd_create(&sd, dtype);
    if (rc != DCP_OK)
        return rc;
    sd->generic = 1;
    sd->oflags = layout->flags;
    sd->has_step = layout->step != 0;
    for (i = 0; rc == DCP_OK && i < layout->ntensors; i++) {
        sd->tkind[i] = layout->tensor_kinds[i];
        sd->tname[i] = dcp__strdup(layout->tensors[i]);
        if (!sd->tname[i])
            rc = DCP_ENOMEM;
        else
            sd->nt++;
    }
    for (i = 0; rc == DCP_OK && i < layout->nscalars; i++) {
        sd->sname[i] = dcp__strdup(layout->scalars[i]);
        if (!sd->sname[i])
            rc = DCP_ENOMEM;
        else
            sd->ns++;
    }
    if (rc != DCP_OK) {
        dcp_sd_free(sd);
        return rc;
    }
    *out = sd;
    return DCP_OK;
}

/* A group dict: str keys, non-empty, without '.', not "params". */
static int group_ok(const dcp_value *d)
{
    size_t i, n;
    if (dcp_value_type_of(d) != DCP_VALUE_DICT)
        return 0;
    n = dcp_value_len(d);
    for (i = 0; i < n; i++) {
        size_t len;
        const char *k = dcp_value_as_str(dcp_value_dict_key(d, i), &len);
        if (!k || !len || strlen(k) != len || strchr(k, '.') ||
            !strcmp(k, "params"))
            return 0;
    }
    return 1;
}

int dcp_sd_add_group_values(dcp_sd *sd, const dcp_value *group)
{
    dcp_value *c;
    if (!sd || !sd->generic || sd->frozen || !group || !group_ok(group))
        return DCP_EINVAL;
    if (sd->ng == sd->capg) {
        size_t cap = sd->capg ? sd->capg * 2 : 4;
        dcp_value **g = dcp__realloc(sd->gv, cap * sizeof(*g));
        if (!g)
            return DCP_ENOMEM;
        sd->gv = g;
        sd->capg = cap;
    }
    c = dcp_value_copy(group);
    if (!c)
        return DCP_ENOMEM;
    sd->gv[sd->ng++] = c;
    return DCP_OK;
}

const dcp_value *dcp_sd_group_values(const dcp_sd *sd, size_t g)
{
    return sd && sd->generic && g < sd->ng ? sd->gv[g] : NULL;
}

/* 1 when a and b have the same keys. */
static int same_keys(const dcp_value *a, const dcp_value *b)
{
    size_t i, n = dcp_value_len(a);
    if (dcp_value_len(b) != n)
        return 0;
    for (i = 0; i < n; i++) {
        size_t len;
        const char *k = dcp_value_as_str(dcp_value_dict_key(a, i), &len);
        if (!dcp_value_dict_get(b, k))
            return 0;
    }
    return 1;
}

int dcp_sd_set_group_values(dcp_sd *sd, size_t g, const dcp_value *group)
{
    dcp_value *c;
    if (!sd || !sd->generic || g >= sd->ng || !group || !group_ok(group) ||
        !same_keys(sd->gv[g], group))
        return DCP_EINVAL;
    c = dcp_value_copy(group);
    if (!c)
        return DCP_ENOMEM;
    dcp_value_free(sd->gv[g]);
    sd->gv[g] = c;
    return DCP_OK;
}

int dcp_sd_set_param_frozen(dcp_sd *sd, size_t i, int frozen)
{
    if (!sd || !sd->generic || sd->frozen || i >= sd->np)
        return DCP_EINVAL;
    sd->p[i].frozen = frozen != 0;
    return DCP_OK;
}

int dcp_sd_bind_state(dcp_sd *sd, int64_t begin, int64_t end,
                      void *const *bufs)
{
    size_t k;
    int rc;
    if (!sd || !sd->generic || begin < 0 || begin > end || end > sd->numel)
        return DCP_EINVAL;
    for (k = 0; begin < end && k < sd->nt; k++)
        if (!bufs || !bufs[k])
            return DCP_EINVAL;
    rc = dcp__sd_freeze(sd);
    if (rc != DCP_OK)
        return rc;
    sd->olo = begin;
    sd->ohi = end;
    for (k = 0; k < sd->nt; k++)
        sd->tbuf[k] = begin < end ? bufs[k] : NULL;
    return DCP_OK;
}

long dcp__sd_scalar_index(const dcp_sd *sd, const char *name)
{
    size_t k;
    for (k = 0; name && k < sd->ns; k++)
        if (!strcmp(sd->sname[k], name))
            return (long)k;
    return -1;
}

int dcp_sd_scalar(const dcp_sd *sd, const char *name, size_t i, float *out)
{
    long k;
    if (out)
        *out = 0;
    if (!sd || !sd->generic || !out || i >= sd->np)
        return DCP_EINVAL;
    k = dcp__sd_scalar_index(sd, name);
    if (k < 0)
        return DCP_EINVAL;
    if (sd->sval)
        *out = sd->sval[(size_t)k * sd->np + i];
    return DCP_OK;
}

int dcp_sd_set_scalar(dcp_sd *sd, const char *name, size_t i, float value)
{
    long k;
    int rc;
    if (!sd || !sd->generic || i >= sd->np)
        return DCP_EINVAL;
    k = dcp__sd_scalar_index(sd, name);
    if (k < 0)
        return DCP_EINVAL;
    rc = dcp__sd_freeze(sd);
    if (rc != DCP_OK)
        return rc;
    sd->sval[(size_t)k * sd->np + i] = value;
    return DCP_OK;
}

int dcp__sd_state_shape(const dcp_sd *sd, size_t k, const struct sd_param *p,
                        int *ndim, int64_t *shape, int64_t *numel)
{
    dcp_sd_state_kind kind = sd->tkind[k];
    int d;
    if ((kind == DCP_SD_STATE_ROW || kind == DCP_SD_STATE_COL) && p->ndim < 2)
        return 0;
    if (kind == DCP_SD_STATE_UNFACTORED && p->ndim >= 2)
        return 0;
    *ndim = p->ndim;
    *numel = 1;
    for (d = 0; d < p->ndim; d++) {
        shape[d] = p->shape[d];
        if ((kind == DCP_SD_STATE_ROW && d == p->ndim - 1) ||
            (kind == DCP_SD_STATE_COL && d == p->ndim - 2))
            shape[d] = 1;
        *numel *= shape[d];
    }
    return 1;
}

/* 1 for the kinds whose space is their own (not the parameters'). */
static int factored(const dcp_sd *sd, size_t k)
{
    return sd->tkind[k] == DCP_SD_STATE_ROW || sd->tkind[k] == DCP_SD_STATE_COL;
}

int64_t dcp_sd_state_offset(const dcp_sd *sd, size_t k, size_t i)
{
    int64_t shape[DCP_MAX_NDIM], n, off = 0;
    size_t j;
    int ndim;
    if (!sd || !sd->generic || k >= sd->nt || i >= sd->np ||
        !dcp__sd_state_shape(sd, k, &sd->p[i], &ndim, shape, &n))
        return -1;
    if (!factored(sd, k))
        return sd->p[i].off;
    for (j = 0; j < i; j++)
        if (dcp__sd_state_shape(sd, k, &sd->p[j], &ndim, shape, &n))
            off += n;
    return off;
}

int64_t dcp_sd_state_numel(const dcp_sd *sd, size_t k)
{
    int64_t shape[DCP_MAX_NDIM], n, total = 0;
    size_t j;
    int ndim;
    if (!sd || !sd->generic || k >= sd->nt)
        return 0;
    if (!factored(sd, k))
        return sd->numel;
    for (j = 0; j < sd->np; j++)
        if (dcp__sd_state_shape(sd, k, &sd->p[j], &ndim, shape, &n))
            total += n;
    return total;
}
