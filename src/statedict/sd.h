/*
 * The description of a model + AdamW state (sd.c): what dcp_sd_* build
 * and bind, read by the checks (sdcheck.h) and the state entries and load
 * (sdload.c) of the statedict layer.
 */
#ifndef DCP_SD_H
#define DCP_SD_H

#include "dcp/dcp_statedict.h"
#include "util.h"
#include "hashtab.h"

struct sd_param {
    char *fqn;
    int ndim;
    int64_t shape[DCP_MAX_NDIM];
    int64_t off; /* in the flat space */
    int64_t numel;
    size_t group;
    int frozen; /* requires_grad=False: no optimizer state, in no group */
};

/* Most state tensors and scalars of a generic optimizer layout. */
#define SD_MAX_STATE DCP_SD_OPTIM_MAX_STATE

struct dcp_sd {
    dcp_dtype dtype;
    struct sd_param *p;
    size_t np, capp;
    struct dcp_htab index; /* parameters by fqn */
    dcp_adamw *g;
    size_t ng, capg;
    int64_t numel;
    int frozen; /* bound or added to a state: no more groups or params */
    int64_t mlo, mhi;
    void *mbuf;
    int64_t olo, ohi;
    void *oavg, *osq;
    int64_t step;
    float *steps;        /* one per parameter: the step tensors' buffers */
    unsigned load_flags; /* dcp_sd_load's flags while it runs dcp_load */
    /* A generic optimizer (dcp_sd_create_optim); the AdamW fields above
     * (g, oavg, osq) are then unused. */
    int generic;
    unsigned oflags;            /* DCP_SD_FLAT */
    int has_step;               /* a "step" per parameter */
    size_t nt, ns;              /* state tensors, state scalars */
    char *tname[SD_MAX_STATE];  /* tensor names, copied */
    char *sname[SD_MAX_STATE];  /* scalar names, copied */
    void *tbuf[SD_MAX_STATE];   /* bound slices [olo, ohi) */
    dcp_sd_state_kind tkind[SD_MAX_STATE];

    float *sval;                /* ns * np scalars, scalar k of param i at
                                 * k * np + i (after freezing) */
    dcp_value **gv;             /* ng group dicts (no "params") */
    char err[DCP_ERRMSG_MAX];
};

/* Index of parameter fqn, or -1. */
long dcp__sd_find(const dcp_sd *sd, const char *fqn);

/* The shape of state tensor k of parameter p into shape (*ndim dims) and
 * its element count into *numel; 0 when p has no tensor k. */
int dcp__sd_state_shape(const dcp_sd *sd, size_t k, const struct sd_param *p,
                        int *ndim, int64_t *shape, int64_t *numel);

/* Index of scalar name in a generic layout, or -1. */
long dcp__sd_scalar_index(const dcp_sd *sd, const char *name);

/* No more groups or parameters from here on (sd->frozen); the step
 * buffers (sd->steps) exist. Returns DCP_OK or DCP_ENOMEM. */
int dcp__sd_freeze(dcp_sd *sd);

/* The largest step count: a float32 step tensor holds every integer up
 * to it exactly. */
#define SD_MAX_STEP ((int64_t)1 << 24)

/* The hyper-parameter names of one param group, in torch's order. */
#define SD_NHP 12
extern const char *const dcp__sd_hp_names[SD_NHP];

#endif /* DCP_SD_H */
