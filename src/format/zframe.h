/*
 * ZStandard frames: the "stream.zstd/1" stream transform torch 2.13's
 * FileSystemWriter(_extensions=[ZStandard()]) applies to each record
 * (docs/FORMAT.md §9.1). Decoding is bounded: a hostile frame can neither
 * expand past the caller's limit nor make libzstd allocate a large window.
 * Built with libzstd (DCP_HAVE_ZSTD); without it both calls return
 * DCP_ENOTSUP.
 */
#ifndef DCP_ZFRAME_H
#define DCP_ZFRAME_H

#include "util.h"

/* The transform descriptor torch records in _StorageInfo. */
#define ZSTD_DESCRIPTOR "stream.zstd/1"

/* Nonzero when desc names a ZStandard transform version dcp decodes
 * (torch's rule: the name is "stream.zstd", the version's major is 1). */
int dcp__zstd_descriptor_ok(const char *desc);

/*
 * Decompresses the frame(s) in src[0..len) into a new buffer *out of
 * *out_len bytes (freed with dcp__free), refusing to produce more than
 * max_out bytes. Returns DCP_OK; DCP_ECORRUPT (not a zstd frame, a damaged
 * or truncated frame, a checksum mismatch, output beyond max_out, bytes
 * after the last frame); DCP_ENOMEM; DCP_ENOTSUP (built without libzstd).
 * The message names no file: the caller prefixes it.
 */
int dcp__zstd_decode(const uint8_t *src, size_t len, uint64_t max_out,
                     uint8_t **out, size_t *out_len, struct dcp_err *err);

/* Appends src[0..len) as one zstd frame (with its content size and a
 * checksum) to out. DCP_OK, DCP_ENOMEM, DCP_ENOTSUP. */
int dcp__zstd_encode(const void *src, size_t len, int level,
                     struct dcp_buf *out, struct dcp_err *err);

#endif /* DCP_ZFRAME_H */
