/*
 * The dtype table and element conversion between dtypes, for loads that ask
 * for a cast (DCP_LOAD_CAST) and exports that cast, matching PyTorch 2.13's
 * Tensor.to() on the CPU bit for bit (the rules are at the top of dtype.c;
 * tests/unit/test_cast_table.c checks every pair against torch's table).
 */
#ifndef DCP_CONVERT_H
#define DCP_CONVERT_H

#include <stddef.h>

#include "dcp/dcp.h"

/* Whether dcp__convert converts src to dst: every pair of known dtypes
 * but float4_e2m1fn_x2 to or from another dtype (torch refuses those). */
int dcp__can_convert(dcp_dtype dst, dcp_dtype src);

/* A real floating dtype (float64 ... float8_e8m0fnu; not complex). */
int dcp__dtype_is_float(dcp_dtype dt);

/* The dtype whose torch name (no "torch." prefix, no alias) is the len
 * bytes at name: 1 and *out set, or 0. */
int dcp__dtype_from_torch(const char *name, size_t len, dcp_dtype *out);

/* The legacy storage class torch.save pickles for dt ("FloatStorage"), or
 * NULL when it writes torch.storage.UntypedStorage and the dtype instead. */
const char *dcp__dtype_storage(dcp_dtype dt);
int dcp__dtype_from_storage(const char *name, dcp_dtype *out); /* 1 or 0 */

/* The safetensors dtype name ("BF16"), or NULL when safetensors has none. */
const char *dcp__dtype_st_name(dcp_dtype dt);
int dcp__dtype_from_st_name(const char *name, dcp_dtype *out); /* 1 or 0 */

/* Converts n elements; same dtypes copy bytes; a pair that
 * dcp__can_convert refuses writes nothing (callers check first). */
void dcp__convert(void *dst, dcp_dtype dt_dst, const void *src,
                  dcp_dtype dt_src, size_t n);

/*
 * After a float-to-float conversion: the index of the first element whose
 * source is finite but whose converted value is not that source rounded
 * (it became infinite or NaN, or float8_e4m3fn saturated), or n when
 * every element was represented. Other dtype pairs return n.
 */
size_t dcp__convert_overflow(const void *dst, dcp_dtype dt_dst, const void *src,
                             dcp_dtype dt_src, size_t n);

#endif /* DCP_CONVERT_H */
