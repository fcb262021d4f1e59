/*
 * Hugging Face safetensors directories (docs/FORMAT.md §9.5): what torch
 * 2.13's HuggingFaceStorageWriter writes -- no .metadata, one or more
 * *.safetensors files, each tensor stored whole or as per-rank pieces
 * whose place in the global tensor is the file's __metadata__
 * DCP_SHARDING_INFO ({fqn: {"saved_offsets": [...]}}). Read as a
 * checkpoint whose .metadata is made up from the headers, as torch's
 * HuggingFaceStorageReader.read_metadata does: every piece a chunk whose
 * byte range starts at its file's safetensors header (§9.3's records).
 */
#ifndef DCP_HFDIR_H
#define DCP_HFDIR_H

#include "util.h"
#include "meta.h"

/* Most names listed and safetensors files read in one directory. */
#define HF_MAX_FILES 16384

/*
 * Lists the *.safetensors files of the open directory dirfd (path for
 * messages) and makes *out from their headers: one tensor entry per name,
 * its chunks the pieces (offsets from DCP_SHARDING_INFO, zeros without
 * it), its shape the pieces' extent. The pieces must agree on dtype and
 * rank and tile the shape exactly (no gap, no overlap, nothing outside).
 * Returns DCP_OK; DCP_ENOENT (nothing set in err) when the directory holds
 * no *.safetensors file or cannot be listed; DCP_EFORMAT naming the file
 * and the tensor (a bad header, a bad DCP_SHARDING_INFO, pieces that
 * disagree, overlap or leave a gap); DCP_ELIMIT; DCP_ENOTSUP (a dtype dcp
 * does not hold); DCP_EIO, DCP_ENOMEM. Not collective.
 */
int dcp__hf_metadata(int dirfd, const char *path, struct dcp_metadata **out,
                     struct dcp_err *err);

/* As dcp__hf_metadata, encoded as .metadata bytes (freed with dcp__free). */
int dcp__hf_metadata_bytes(int dirfd, const char *path, uint8_t **out,
                           size_t *len, struct dcp_err *err);

#endif /* DCP_HFDIR_H */
