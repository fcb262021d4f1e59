/*
 * dcp_convert.h: format utilities. Export a DCP checkpoint to one torch.save
 * file or to safetensors (one file, or shards with
 * model.safetensors.index.json); import such files into a DCP checkpoint;
 * load one torch.save or safetensors file straight into sharded buffers
 * across ranks. Conventions as in dcp.h (return codes, dcp_errmsg,
 * ownership); this header includes no MPI header.
 *
 * Memory: export and import stream. Tensor data moves through buffers of
 * at most mem_limit bytes in all (64 MiB by default), whatever the size of
 * a tensor or of the model; only the metadata (names, shapes: a few hundred
 * bytes per tensor) is held whole.
 *
 * Output files are written under a temporary name in the destination's
 * directory (".NAME.tmp-XXXXXX"), fsynced, and renamed into place only
 * when complete; on failure (a full disk, a bad input) the temporary files
 * are removed, so no partial output is ever left looking complete. A
 * sharded safetensors export renames its shards first and writes the
 * index last. An import writes a DCP checkpoint, whose .metadata is its
 * commit record, with the same protocol as dcp_save.
 *
 * Every input file is hostile: torch.save files are read with dcp's own
 * pickle decoder (nothing is executed; only tensors, nn.Parameter,
 * OrderedDict and plain values are accepted), safetensors headers are
 * bounded and checked (sizes, offsets, overlaps, gaps, duplicate names,
 * dtype x shape against the byte range, the file's length).
 */
#ifndef DCP_DCP_CONVERT_H
#define DCP_DCP_CONVERT_H

#include <stddef.h>
#include <stdint.h>

#include "dcp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* File formats. */
enum dcp_file_format {
    /* Export: from the output name (".safetensors" picks safetensors,
     * anything else torch.save). Import and load: from the content (a zip
     * archive is torch.save, a name ending in ".json" is a safetensors
     * index, anything else safetensors). */
    DCP_FORMAT_AUTO = 0,
    DCP_FORMAT_SAFETENSORS = 1,
    DCP_FORMAT_TORCH = 2,
    /* Import only: a model.safetensors.index.json and the shards it names
     * (in the same directory). */
    DCP_FORMAT_SAFETENSORS_INDEX = 3,
    /* Import and load: a directory of *.safetensors files as torch's
     * HuggingFaceStorageWriter writes them, each tensor whole or in
     * per-rank pieces placed by the files' DCP_SHARDING_INFO (AUTO picks
     * it for a directory; docs/FORMAT.md §9.5). */
    DCP_FORMAT_SAFETENSORS_DIR = 4
};

enum dcp_convert_flags {
    /* Do not verify the CRC-32 of the checkpoint records read (export). */
    DCP_CONVERT_NO_VERIFY = 1 << 0,
    /* Skip fsync of the files written (faster, not durable; tests). */
    DCP_CONVERT_NO_FSYNC = 1 << 1,
    /* Cast a finite value that does not fit the target dtype to infinity
     * (or, for float8_e4m3fn, to the largest finite value) as torch does,
     * instead of failing. */
    DCP_CONVERT_ALLOW_OVERFLOW = 1 << 2,
    /* dcp_save_hf: consolidated output (whole tensors, with an index)
     * instead of per-rank pieces. */
    DCP_CONVERT_HF_CONSOLIDATED = 1 << 3,
    /* dcp_import: dequantize quantized Hugging Face input to float32 as
     * dcp_load_file does with DCP_LOAD_FILE_DEQUANT (which see). */
    DCP_CONVERT_DEQUANT = 1 << 4
};

/*
 * Progress report: called on the calling thread after each piece of tensor
 * data, with the bytes done and the total for the whole call.
 */
typedef void (*dcp_progress_fn)(void *arg, uint64_t done, uint64_t total);

/*
 * Options of dcp_export and dcp_import. Zero-initialise, set struct_size =
 * sizeof(dcp_convert_options), then set what you need.
 */
typedef struct dcp_convert_options {
    uint32_t struct_size;
    int format;     /* enum dcp_file_format of the file written or read */
    unsigned flags; /* enum dcp_convert_flags */
    /*
     * Cast: 0 keeps every dtype. Otherwise a floating-point dtype (f64,
     * f32, f16, bf16, float8_e4m3fn, float8_e5m2): every floating-point
     * tensor is converted to it, rounding to nearest even as torch's
     * Tensor.to() does. Integer and bool tensors are never cast (they are
     * indices and masks; they keep their dtype and are counted in
     * dcp_convert_result.kept). An integer or bool target is refused
     * (DCP_EINVAL). A finite value that the target cannot represent (it
     * would become infinite, or saturate in float8_e4m3fn) fails the call
     * with DCP_EMISMATCH naming the key and element, unless
     * DCP_CONVERT_ALLOW_OVERFLOW.
     */
    dcp_dtype dtype;
    /* Safetensors export: largest shard in bytes (tensor data); 0 writes
     * one file. A tensor larger than the limit gets a shard of its own. */
    uint64_t max_shard_bytes;
    /*
     * Key filter: nkeys shell patterns (fnmatch(3), '*' also matches '.')
     * matched against the source keys (checkpoint keys for an export,
     * flattened file keys for an import); an entry is kept when any
     * pattern matches. NULL/0 keeps everything. A filter that keeps no
     * tensor (safetensors) or no entry is DCP_EKEY.
     */
    const char *const *keys;
    size_t nkeys;
    /*
     * Renaming, after filtering. strip_prefix is removed from keys that
     * start with it (others are unchanged); add_prefix is then prepended.
     * Nested paths (planner_data, a torch.save file's dicts) follow: a
     * prefix made of whole path components ("model." for ("model", ...))
     * removes or adds those components; any other prefix flattens the
     * entry's path to its new key. Two entries renamed to one key is
     * DCP_EKEY.
     */
    const char *strip_prefix;
    const char *add_prefix;
    /* Bytes of tensor buffers the call may use (0: 64 MiB; at least 1 MiB
     * is used). */
    uint64_t mem_limit;
    dcp_progress_fn progress; /* may be NULL */
    void *progress_arg;
} dcp_convert_options;

/* What an export or import did. Zero-initialise and set struct_size. */
typedef struct dcp_convert_result {
    uint32_t struct_size;
    size_t tensors; /* tensors written */
    size_t values;  /* non-tensor values written */
    size_t skipped; /* values a safetensors export cannot hold (left out) */
    size_t cast;    /* tensors converted to opts->dtype */
    size_t kept;    /* integer/bool tensors left in their dtype by a cast */
    size_t files;   /* files written (shards, plus the index if any) */
    uint64_t bytes; /* tensor data bytes written */
} dcp_convert_result;

/*
 * Exports the checkpoint in dir to out: a torch.save file (torch.load(out,
 * weights_only=True) returns the nested state dict that planner_data
 * records, tensors contiguous on CPU, values as Python objects), or
 * safetensors (tensors only, under their keys; values are left out and
 * counted in res->skipped; __metadata__ is {"format": "pt"}). With
 * max_shard_bytes and more than one shard, the shards are
 * "<stem>-00001-of-0000N.safetensors" next to out, and the index
 * "<out>.index.json" ("model.safetensors" gives "model.safetensors.index.json",
 * as Hugging Face names them; out itself is not written).
 * Tensors sharded over several chunks are assembled in C order. Not
 * collective (the context's communicator is not used).
 *  - res: may be NULL.
 * Returns DCP_OK, DCP_EINVAL (bad options, a dtype the format cannot hold),
 * DCP_ENOENT, DCP_EFORMAT, DCP_EUNSAFE, DCP_ECORRUPT (a CRC mismatch),
 * DCP_EKEY (filter matches nothing, a rename collision), DCP_EMISMATCH (a
 * value the cast cannot represent), DCP_ENOSPC, DCP_EIO, DCP_ENOMEM. On
 * failure no output file is left (temporary files are removed).
 */
DCP_API int dcp_export(dcp_ctx *ctx, const char *dir, const char *out,
                       const dcp_convert_options *opts,
                       dcp_convert_result *res);

/*
 * Imports in (a torch.save file, a safetensors file, a
 * model.safetensors.index.json with its shards, or a directory of
 * safetensors files as torch's HuggingFaceStorageWriter writes them, each
 * tensor assembled from its per-rank pieces) into a new DCP checkpoint
 * in dir (created, parents too): one data file __0_0.distcp and .metadata,
 * committed like dcp_save. A torch.save file's nested dicts and lists are
 * flattened as torch's flatten_state_dict does (keys joined with '.',
 * planner_data paths recorded), tensors sharing a storage are written
 * each in full, non-contiguous views are made contiguous. A safetensors
 * tensor's key is its name, with a one-element path. dir must not already
 * hold a checkpoint (DCP_EEXIST). Not collective.
 * Returns DCP_OK, DCP_EINVAL, DCP_EEXIST, DCP_ENOENT, DCP_EFORMAT,
 * DCP_EUNSAFE (a pickle naming a global outside the allow-list),
 * DCP_ENOTSUP (a dtype or object dcp does not hold), DCP_ELIMIT,
 * DCP_ECORRUPT (truncated), DCP_EKEY, DCP_EMISMATCH, DCP_ENOSPC, DCP_EIO,
 * DCP_ENOMEM. On failure nothing is committed and the data file is
 * removed.
 */
DCP_API int dcp_import(dcp_ctx *ctx, const char *in, const char *dir,
                       const dcp_convert_options *opts,
                       dcp_convert_result *res);

/*
 * dcp_load_file flag (with the dcp_load_flags of dcp.h): rank 0 reads the
 * file and sends each rank its boxes, even where every rank could read it.
 */
#define DCP_LOAD_FILE_ROOT_READS (1u << 16)

/*
 * dcp_load_file flag: quantized Hugging Face input is read dequantized to
 * float32, as torch 2.13's QuantizedHuggingFaceStorageReader(target_dtype=
 * torch.float32, block_size=128) reads it, bit for bit (docs/FORMAT.md
 * §9.6): a tensor "X.weight" with a tensor "X.weight_scale_inv" (FP8
 * weights with 128 x 128 block scales) becomes a float32 tensor of the
 * weight's shape; "X_blocks" (uint8 [a, b, G, B], MXFP4) with "X_scales"
 * (uint8 [a, b, G]) a float32 tensor [a, b, G * B * 2] under the key
 * "X_blocks". The scale tensors stay entries of their own. With
 * DCP_LOAD_CAST the float32 values are cast to the buffer's dtype as
 * torch's Tensor.to does, which gives torch's target_dtype result for
 * bfloat16, float16 and float32 (and float64 for FP8 weights).
 */
#define DCP_LOAD_FILE_DEQUANT (1u << 17)

/*
 * Loads one torch.save or safetensors file, or a directory of safetensors
 * files (HuggingFaceStorageWriter's, per-rank pieces assembled; format
 * from the content, as for an import) into the state, in place, like dcp_load
 * loads a checkpoint: the file's tensors and values are the checkpoint's
 * entries (keys flattened as for dcp_import), each rank passes the boxes it
 * wants, with any sharding. Collective over the context's communicator, with
 * the same file on every rank (checked).
 *
 * Every rank tries to open file; when all can and see the same file (size
 * and a hash of its header), each reads its own byte ranges. Otherwise
 * (or with DCP_LOAD_FILE_ROOT_READS) rank 0 reads and sends each rank
 * only its boxes, in rounds of at most 64 MiB in all, over the
 * communicator (scatterv); the other ranks need not see the file at all.
 * Rank 0 parses the file and checks every rank's request once.
 *
 * opts->flags: DCP_LOAD_PARTIAL, DCP_LOAD_CAST (as for dcp_load; missing
 * and unexpected keys are reported by dcp_load_report),
 * DCP_LOAD_FILE_ROOT_READS. DCP_LOAD_NO_VERIFY has no effect (these
 * formats carry no checksums dcp verifies).
 * Returns, on every rank the same code: DCP_OK, DCP_EINVAL, DCP_ENOENT
 * (rank 0 cannot open the file), DCP_EFORMAT, DCP_EUNSAFE, DCP_ENOTSUP,
 * DCP_ELIMIT, DCP_ECORRUPT, DCP_EKEY, DCP_EMISMATCH, DCP_EIO, DCP_ENOMEM;
 * dcp_errmsg reads "rank R failed: ..." as for dcp_load.
 */
DCP_API int dcp_load_file(dcp_ctx *ctx, dcp_state *st, const char *file,
                          const dcp_load_options *opts);

/*
 * Saves the tensors of st (every rank's boxes) as Hugging Face safetensors
 * files in dir, as torch 2.13's HuggingFaceStorageWriter does
 * (docs/FORMAT.md §9.5), so that torch's HuggingFaceStorageReader (and the
 * safetensors library, and dcp itself) read them. Collective over the
 * context's communicator, with the same dir on every rank (checked).
 *
 * Sharded (default, save_distributed=True): each rank r that holds data
 * streams its boxes from its buffers into its own file
 * shard-<r+1, 5 digits>-model-00001-of-00001.safetensors, each tensor
 * under its key with the box's shape, its global offsets in __metadata__
 * DCP_SHARDING_INFO (with DCP_VERSION "1.0" and format "pt"). A box that
 * several ranks hold alike (a replicated tensor) is written once, by the
 * lowest rank; empty boxes are not written. No index is written (torch
 * writes none for this layout).
 *
 * DCP_CONVERT_HF_CONSOLIDATED: every tensor must be held whole by at least
 * one rank (DCP_ENOTSUP naming it otherwise); the lowest such rank writes
 * it, whole, so that each writing rank streams its own output file
 * model-<k>-of-<N>.safetensors (k-th of the N writing ranks, __metadata__
 * {"format": "pt"}), and rank 0 writes model.safetensors.index.json
 * (metadata.total_size, weight_map) at the commit.
 *
 * Files are written under unique temporary names, fsynced (unless
 * DCP_CONVERT_NO_FSYNC), renamed into place once every rank has written
 * its own, and the directory synced; the index comes last. A failure at
 * any of these steps on any rank removes every file of this save, renamed
 * ones included: the layout has no commit record of its own, so a reader
 * would take the shards left behind as a whole checkpoint (a process
 * killed between the renames and the index can still leave some: check
 * the return code, not the directory). Strided boxes
 * (dcp_state_add_tensor_strided) are packed as they are written. Not
 * thread safe with other calls on ctx. dir is created
 * (parents too) and must hold no *.safetensors file, index or .metadata
 * yet (DCP_EEXIST). Only tensors in host memory whose dtype safetensors
 * names can be saved: a value or a device buffer is DCP_ENOTSUP naming
 * the key. One box of a tensor per rank. The ranks' boxes must agree on
 * dtype and shape (DCP_EMISMATCH) and cover each tensor exactly, replicas
 * aside (DCP_EINVAL naming the key). opts may be NULL; only its flags
 * (DCP_CONVERT_NO_FSYNC, DCP_CONVERT_HF_CONSOLIDATED) are used, other
 * members must be zero (DCP_EINVAL).
 * Returns, on every rank the same code: DCP_OK, DCP_EINVAL, DCP_EEXIST,
 * DCP_ENOTSUP, DCP_EMISMATCH, DCP_ENOSPC, DCP_EIO, DCP_ENOMEM.
 */
DCP_API int dcp_save_hf(dcp_ctx *ctx, dcp_state *st, const char *dir,
                        const dcp_convert_options *opts);

/*
 * Converts n elements from src (dtype src_dt) to dst (dtype dst_dt), as
 * torch 2.13's Tensor.to() does on the CPU, bit for bit (round to nearest
 * even, narrower-than-float32 targets through float32, overflow to
 * infinity, float8_e4m3fn saturating, the fnuz float8s overflowing to NaN,
 * float to integer truncating with x86-64's out-of-range results, integers
 * wrapping, complex to real taking the real part; docs/FORMAT.md has the
 * rules). Same dtypes copy bytes. dst and src must not overlap unless
 * equal with the same dtype. Returns DCP_OK, DCP_EINVAL (unknown dtype,
 * NULL with n > 0), DCP_ENOTSUP (float4_e2m1fn_x2 to or from another
 * dtype: torch does not convert it either; nothing is written).
 * Thread safe.
 */
DCP_API int dcp_convert_elements(void *dst, dcp_dtype dst_dt, const void *src,
                                 dcp_dtype src_dt, size_t n);

#ifdef __cplusplus
}
#endif

#endif /* DCP_DCP_CONVERT_H */
