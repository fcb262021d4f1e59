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

/* One tensor of one file: a box of its global tensor, stored contiguous
 * (C order) at byte data of file. */
struct hf_piece {
    char *key;
    uint32_t file; /* index into hf_dir.files */
    dcp_dtype dtype;
    int ndim;
    uint64_t bytes;
    uint64_t data; /* absolute file offset of the piece's bytes */
    int64_t off[DCP_MAX_NDIM];
    int64_t size[DCP_MAX_NDIM];
};

/* A global tensor: pieces p[first .. first + n), sorted by dim-0 offset. */
struct hf_tensor {
    const char *key; /* its first piece's */
    dcp_dtype dtype;
    int ndim;
    int64_t shape[DCP_MAX_NDIM];
    size_t first, n;
};

struct hf_dir {
    char **files; /* plain names, sorted */
    size_t nfiles;
    struct hf_piece *p; /* sorted by key, then dim-0 offset, then file */
    size_t np;
    struct hf_tensor *t; /* sorted by key */
    size_t nt;
};

struct sf_file;

/*
 * Checks that every tensor of sf (the header of file name) is whole: with
 * a DCP_SHARDING_INFO, its saved_offsets are all 0 (DCP_EFORMAT naming
 * the tensor otherwise: a per-rank piece read as a whole tensor would be
 * wrong). For a file opened alone or through an index.
 */
int dcp__hf_check_whole(const struct sf_file *sf, const char *name,
                        struct dcp_err *err);

/*
 * Lists the *.safetensors files of the open directory dirfd (path for
 * messages), reads their headers and groups the pieces into tensors,
 * checked as for dcp__hf_metadata (which see for the return codes). On
 * failure *out is released.
 */
int dcp__hf_scan(int dirfd, const char *path, struct hf_dir *out,
                 struct dcp_err *err);
void dcp__hf_release(struct hf_dir *d);

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
