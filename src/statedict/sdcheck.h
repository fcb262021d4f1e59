/*
 * The check of a checkpoint against an sd's description before it is
 * loaded (sdcheck.c), and the checks of a param group's values that the
 * optimizer's load callback (sdload.c) makes again.
 */
#ifndef DCP_SDCHECK_H
#define DCP_SDCHECK_H

#include "sd.h"

/* The checks of a param group's values, shared by the check before a load
 * (sdcheck.c) and the callback after one (sdload.c). vals: the group's
 * SD_NHP values, in dcp__sd_hp_names order (NULL where absent); key: the
 * group's key prefix ("optim.param_groups.0"). Appends "'key.name': why"
 * items to out, counting them in *nbad; with adopt, lr, betas, eps and
 * weight_decay are not compared and *got receives them. Returns DCP_OK
 * or DCP_ENOMEM. */
int dcp__sd_check_group(const dcp_sd *sd, size_t g, const char *key,
                        const dcp_value *const *vals, int adopt, dcp_adamw *got,
                        struct dcp_buf *out, size_t *nbad);

/* The same for a generic optimizer's group g: vals[k] is the saved value
 * of the k-th key of want (NULL where absent), params the saved "params"
 * (nested layout; NULL for the flat one, or absent). Values are compared
 * with want's (the same type and bits; an int and a float equal as
 * numbers count as equal) unless got is not NULL and adopt is set: then
 * *got receives a new dict of the saved values (want's where absent).
 * Returns DCP_OK or DCP_ENOMEM. */
int dcp__sd_check_gvalues(const dcp_sd *sd, size_t g, const dcp_value *want,
                          const char *key, const dcp_value *const *vals,
                          const dcp_value *params, int adopt, dcp_value **got,
                          struct dcp_buf *out, size_t *nbad);

/* Appends "; " (when out is not empty) and a printf text to out, unless
 * out already holds more than a message can show: then only counts. */
int dcp__sd_note(struct dcp_buf *out, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Rank 0's verdict on path for the sd entries found in st: the whole
 * check of dcp_sd_load, message in ctx's err, missing and unexpected keys
 * in *missing / *unexpected (NUL-separated lists, dcp__malloc'd). Not
 * collective. */
struct dcp_ctx;
int dcp__sd_check(struct dcp_ctx *ctx, const dcp_sd *sd, const char *path,
                  const char *model_key, const char *optim_key,
                  unsigned load_flags, unsigned sd_flags,
                  struct dcp_buf *missing, size_t *nmissing,
                  struct dcp_buf *unexpected, size_t *nunexpected);

#endif /* DCP_SDCHECK_H */
