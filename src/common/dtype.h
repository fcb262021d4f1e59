/*
 * Element conversion between dtypes, for loads that ask for a cast
 * (DCP_LOAD_CAST), matching PyTorch 2.13's Tensor.to() (checked against it
 * in tests/unit/test_convert.c). Floats round to nearest even and overflow
 * to infinity; float8_e4m3fn has no infinity and saturates at +-448; float
 * to integer truncates toward zero to int64, then wraps to narrower types
 * (as torch does); NaN to an integer gives 0; anything to bool is x != 0.
 */
#ifndef DCP_CONVERT_H
#define DCP_CONVERT_H

#include <stddef.h>

#include "dcp/dcp.h"

/* Converts n elements; same dtypes copy bytes. */
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
