/*
 * What export and import share: their options and result structs, the
 * selection and renaming of entries (dcp_convert_options.keys,
 * strip_prefix, add_prefix) on keys with their nested paths, the cast.
 */
#ifndef DCP_CVNAME_H
#define DCP_CVNAME_H

#include "dcp/dcp_convert.h"
#include "state.h"

/* The options with their defaults filled in (a zeroed struct for NULL);
 * DCP_EINVAL for a bad struct_size or dtype. */
int dcp__cv_options(const dcp_convert_options *in, dcp_convert_options *out,
                    struct dcp_err *err);

/* DCP_EINVAL (message in err) when res, the caller's result struct, has a
 * bad struct_size; DCP_OK for a good one or NULL (no result wanted). */
int dcp__cv_result_check(const dcp_convert_result *res, struct dcp_err *err);
/* Copies *mine into res (NULL: nothing), as many bytes as the struct_size
 * res came with says (checked by dcp__cv_result_check), which it keeps. */
void dcp__cv_result_put(dcp_convert_result *res, dcp_convert_result *mine);

/* 1 when key passes the filter (no filter passes everything). */
int dcp__cv_selected(const dcp_convert_options *o, const char *key);

/* A key and its path, owned. */
struct cv_name {
    char *key;
    struct md_pathel *path;
    size_t npath;
};

/*
 * Renames (key, path) by o's prefixes into *out; path may be NULL/0 for a
 * flat key. Returns DCP_OK, DCP_EKEY (the new key is empty), DCP_ENOMEM.
 */
int dcp__cv_rename(const dcp_convert_options *o, const char *key,
                   const struct md_pathel *path, size_t npath,
                   struct cv_name *out, struct dcp_err *err);
void dcp__cv_name_release(struct cv_name *n);

/* Joins a path the way torch's flatten does ('.' between components,
 * list indices in decimal). *out is dcp__malloc'd. */
int dcp__cv_join(const struct md_pathel *path, size_t npath, char **out);

/* 1 for the floating-point dtypes. */
int dcp__cv_is_float(dcp_dtype dt);

/* The dtype an entry of dtype dt is written with under o's cast. */
dcp_dtype dcp__cv_out_dtype(const dcp_convert_options *o, dcp_dtype dt);

/*
 * Converts n elements (src of dtype from, dst of dtype to) and, unless
 * DCP_CONVERT_ALLOW_OVERFLOW, fails with DCP_EMISMATCH naming key and the
 * element index (first + i) when a finite value is not represented.
 */
int dcp__cv_cast(const dcp_convert_options *o, void *dst, dcp_dtype to,
                 const void *src, dcp_dtype from, size_t n, const char *key,
                 uint64_t first, struct dcp_err *err);

#endif /* DCP_CVNAME_H */
