/*
 * Source files: a torch.save file, a safetensors file or a safetensors
 * index with its shards, opened and parsed into one list of entries
 * (flattened keys, paths, dtypes, shapes, where each tensor's bytes are),
 * for dcp_import and dcp_load_file. Tensor data is read on demand with
 * bounded buffers.
 */
#ifndef DCP_SRCFILE_H
#define DCP_SRCFILE_H

#include "util.h"
#include "state.h"

/* A box of a tensor stored in pieces, contiguous (C order) at base. */
struct src_piece {
    uint32_t file;
    uint64_t base;
    int64_t off[DCP_MAX_NDIM];
    int64_t size[DCP_MAX_NDIM];
};

struct src_entry {
    char *key;              /* flattened as torch's flatten_state_dict */
    struct md_pathel *path; /* owned; npath >= 1 */
    size_t npath;
    int is_tensor;
    dcp_dtype dtype;
    int ndim;
    int64_t shape[DCP_MAX_NDIM];
    /* tensors: the view over a storage of storage_bytes at base in file */
    uint32_t file;
    uint64_t base;
    uint64_t storage_bytes;
    int64_t stride[DCP_MAX_NDIM]; /* elements */
    int64_t storage_offset;       /* elements */
    int contiguous;               /* C order, the view starts at offset */
    dcp_value *value;             /* values: owned */
    /* A tensor of a safetensors directory (hfdir.h): its pieces, which
     * tile the shape; file, base and the view are then unused. */
    struct src_piece *pieces;
    size_t npieces;
    /* Quantized input presented dequantized as float32 (dcp__src_dequant):
     * SRC_Q_FP8 (a 2-D weight with block scales, entry qscale) or
     * SRC_Q_MXFP4 (uint8 blocks [a, b, G, B] with uint8 exponents [a, b,
     * G]); dtype, ndim and shape are then the dequantized tensor's, the
     * stored ones in q*. */
    int quant;
    dcp_dtype qdtype;
    int qndim;
    int64_t qshape[DCP_MAX_NDIM];
    size_t qscale;
    uint32_t qblock;
};

#define SRC_Q_FP8   1
#define SRC_Q_MXFP4 2

struct src_index {
    struct src_entry *e; /* sorted by key */
    size_t n;
    char **files; /* paths as opened */
    int *fds;
    uint64_t *sizes;
    size_t nfiles;
    int format; /* enum dcp_file_format, resolved */
    /* one storage cached for non-contiguous views */
    const struct src_entry *cached;
    uint8_t *cache;
    size_t cache_cap;
};

/*
 * Opens path as format (DCP_FORMAT_AUTO sniffs: a directory is a
 * safetensors directory, a zip archive is torch, a name ending in ".json"
 * a safetensors index, else safetensors) and
 * parses it. max_pickle bounds a torch.save file's data.pkl. Duplicate
 * keys are DCP_EFORMAT. On failure *ix is released.
 */
int dcp__src_open(const char *path, int format, uint64_t max_pickle,
                  struct src_index *ix, struct dcp_err *err);
void dcp__src_close(struct src_index *ix);

/* Entry by key (binary search), or NULL. */
const struct src_entry *dcp__src_find(const struct src_index *ix,
                                      const char *key);

/*
 * Reads count elements of tensor e, in C order from linear element index
 * first, into dst (count * dtype size bytes). A contiguous view is one
 * pread; another goes through the cached storage, which must fit in
 * cache_limit bytes (DCP_ENOTSUP otherwise).
 */
int dcp__src_read(struct src_index *ix, const struct src_entry *e,
                  uint64_t first, uint64_t count, void *dst,
                  uint64_t cache_limit, struct dcp_err *err);

/*
 * Reads the box (off, size) of tensor e into dst (C order of the box).
 * Contiguous views read one run per innermost row (rows merged where the
 * box spans whole dimensions); others go through the cache.
 */
int dcp__src_read_box(struct src_index *ix, const struct src_entry *e,
                      const int64_t *off, const int64_t *size, void *dst,
                      uint64_t cache_limit, struct dcp_err *err);

/*
 * Dequantization on read, as torch 2.13's QuantizedHuggingFaceStorageReader
 * does (docs/FORMAT.md §9.6): a tensor "X.weight" with a tensor
 * "X.weight_scale_inv" becomes float32 weight * scale_inv[i / block][j /
 * block] (the weight converted to float32, the scale too, one float32
 * multiplication); "X_blocks" (uint8 [a, b, G, B], two FP4 e2m1 codes a
 * byte, low nibble first) with "X_scales" (uint8 [a, b, G], exponents
 * biased by 127) becomes float32 [a, b, G * B * 2], code * 2^(scale -
 * 127) rounded once to float32 (torch's ldexp). The scale tensors stay
 * entries.
 * Returns DCP_OK, DCP_ENOTSUP (a pair torch does not dequantize either: a
 * weight of other than 2 dims, blocks of other than 4 dims or not uint8),
 * DCP_EFORMAT (scales of the wrong shape), DCP_ELIMIT; messages name the
 * key.
 */
int dcp__src_dequant(struct src_index *ix, uint32_t block, struct dcp_err *err);

#endif /* DCP_SRCFILE_H */
