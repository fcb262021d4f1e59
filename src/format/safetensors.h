/*
 * safetensors: the header of a .safetensors file, parsed as hostile input,
 * and written. Layout: an 8-byte little-endian header length N, N bytes of
 * JSON ({"__metadata__": {str: str}, name: {"dtype", "shape",
 * "data_offsets": [begin, end]}, ...}, padded with spaces), then the data
 * buffer, in which each tensor's bytes are [begin, end) (C order, little
 * endian).
 *
 * Checks, beyond the JSON grammar (json.h): N at most SF_MAX_HEADER (the
 * limit of the safetensors library) and inside the file; at most 2^22
 * JSON values and nesting 8; a JSON object at
 * the top, no duplicate names (nor a tensor's field or a __metadata__
 * key given twice), no empty name or NUL in a name; every
 * tensor has a known dtype, a shape of at most DCP_MAX_NDIM non-negative
 * integers, data_offsets of two integers with begin <= end, and end - begin
 * equal to the element count times the element size (overflow-checked);
 * sorted by begin, the ranges start at 0 and follow each other with no gap
 * and no overlap, and the last one ends exactly at the end of the file.
 */
#ifndef DCP_SAFETENSORS_H
#define DCP_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "util.h"

/* The safetensors library refuses headers above 100 MB; so does dcp. */
#define SF_MAX_HEADER ((uint64_t)100000000)

struct sf_tensor {
    char *name;
    dcp_dtype dtype;
    int ndim;
    int64_t shape[DCP_MAX_NDIM];
    uint64_t begin, end; /* in the data buffer */
};

struct sf_file {
    uint64_t data_off; /* absolute file offset of the data buffer */
    uint64_t file_size;
    struct sf_tensor *t; /* in header order */
    size_t n;
    char **meta;  /* __metadata__: key0, val0, key1, val1, ... */
    size_t nmeta; /* pairs */
};

/*
 * Parses a header: hdr is the N bytes after the length prefix, file_size
 * the whole file's size. On success *f holds the tensors (dcp__sf_release).
 * Returns DCP_OK, DCP_EFORMAT, DCP_ECORRUPT (the file is shorter than the
 * header says), DCP_ENOTSUP (a dtype dcp does not hold), DCP_ELIMIT,
 * DCP_ENOMEM. Messages name the tensor and the byte offset.
 */
int dcp__sf_parse_header(const void *hdr, size_t n, uint64_t file_size,
                    struct sf_file *f, struct dcp_err *err);

/* Reads the length prefix and header of the open file fd (size bytes) and
 * parses them; name is for messages. */
int dcp__sf_read(int fd, const char *name, uint64_t size, struct sf_file *f,
            struct dcp_err *err);

void dcp__sf_release(struct sf_file *f);

/* safetensors dtype name ("F32", "BF16", "F8_E4M3", ...) of a dcp dtype. */
const char *dcp__sf_dtype_name(dcp_dtype dt);

/* One tensor of a header to write; offsets are assigned in order. */
struct sf_out {
    const char *name;
    dcp_dtype dtype;
    int ndim;
    const int64_t *shape;
};

/*
 * Appends a complete header (length prefix, JSON, space padding to a
 * multiple of 8 bytes) for t[0..n) laid out one after the other, with the
 * __metadata__ pairs meta[0..2*nmeta) (may be NULL). *data_len (may be
 * NULL) receives the data buffer's size.
 */
int dcp__sf_header_build(const struct sf_out *t, size_t n, const char *const *meta,
                    size_t nmeta, struct dcp_buf *out, uint64_t *data_len);

#endif /* DCP_SAFETENSORS_H */
