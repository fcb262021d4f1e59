/*
 * Element conversion between dtypes, for loads that ask for a cast
 * (DCP_LOAD_CAST). Floats round to nearest even; float to integer truncates
 * toward zero and saturates at the integer's range; NaN to integer gives 0;
 * anything to bool is (x != 0). float8_e4m3fn has no infinity: an infinite
 * or too large value becomes NaN, as in PyTorch.
 */
#ifndef DCP_CONVERT_H
#define DCP_CONVERT_H

#include <stddef.h>

#include "dcp/dcp.h"

/* Converts n elements; same dtypes copy bytes. */
void dcp__convert(void *dst, dcp_dtype dt_dst, const void *src,
                  dcp_dtype dt_src, size_t n);

#endif /* DCP_CONVERT_H */
