/*
 * Model + AdamW state descriptions (statedict.c) and the check of a
 * checkpoint against one before it is loaded (sdcheck.c).
 */
#ifndef DCP_STATEDICT_H
#define DCP_STATEDICT_H

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
};

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
    char err[DCP_ERRMSG_MAX];
};

/* Index of parameter fqn, or -1 (statedict.c). */
long dcp__sd_find(const dcp_sd *sd, const char *fqn);

/* The hyper-parameter names of one param group, in torch's order. */
#define SD_NHP 12
extern const char *const dcp__sd_hp_names[SD_NHP];

/* The checks of a param group's values, shared by the check before a load
 * (sdcheck.c) and the callback after one (statedict.c). vals: the group's
 * SD_NHP values, in dcp__sd_hp_names order (NULL where absent); key: the
 * group's key prefix ("optim.param_groups.0"). Appends "'key.name': why"
 * items to out, counting them in *nbad; with adopt, lr, betas, eps and
 * weight_decay are not compared and *got receives them. Returns DCP_OK
 * or DCP_ENOMEM. */
int dcp__sd_check_group(const dcp_sd *sd, size_t g, const char *key,
                        const dcp_value *const *vals, int adopt, dcp_adamw *got,
                        struct dcp_buf *out, size_t *nbad);

/* Appends "; " (when out is not empty) and a printf text to out, unless
 * out already holds more than a message can show: then only counts. */
int dcp__sd_note(struct dcp_buf *out, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Rank 0's verdict on path for the sd entries found in st (sdcheck.c): the
 * whole check of dcp_sd_load, message in ctx's err, missing and unexpected
 * keys in *missing / *unexpected (NUL-separated lists, dcp__malloc'd).
 * Not collective. */
struct dcp_ctx;
int dcp__sd_check(struct dcp_ctx *ctx, const dcp_sd *sd, const char *path,
                  const char *model_key, const char *optim_key,
                  unsigned load_flags, unsigned sd_flags,
                  struct dcp_buf *missing, size_t *nmissing,
                  struct dcp_buf *unexpected, size_t *nunexpected);

#endif /* DCP_STATEDICT_H */
