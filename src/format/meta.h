/*
 * The checkpoint's .metadata: PyTorch's Metadata object as dcp holds it.
 * Decoded from the pickle tree (never executing anything), validated, and
 * encoded back as a protocol-2 pickle that torch's pickle.load accepts.
 */
#ifndef DCP_META_H
#define DCP_META_H

#include "util.h"
#include "hashtab.h"

/* The Python modules of the classes .metadata pickles. */
#define MD_MOD_DCP "torch.distributed.checkpoint.metadata"
#define MD_MOD_OLD "torch.distributed._shard.sharded_tensor.metadata"
#define MD_MOD_FS "torch.distributed.checkpoint.filesystem"

/* The planner_data key prefix of a planner's per-entry data. */
#define MD_PDATA_PREFIX "dcp.planner_data:"

/* One component of an entry's nested path (planner_data): a dict key
 * (s != NULL, owned) or a list index. */
struct md_pathel {
    char *s;
    int64_t i;
};

struct md_chunk {
    int64_t *off; /* ndim elements (NULL for values) */
    int64_t *size;
    uint32_t file; /* index into md->files */
    uint64_t offset;
    uint64_t length;
    int has_storage; /* storage_data entry seen (decode) */
    /* The record's stream transform (_StorageInfo.transform_descriptors):
     * MD_XFORM_NONE, or MD_XFORM_ZSTD ("stream.zstd/1"): the byte range
     * holds the record as zstd frames (docs/FORMAT.md §9.1). */
    int xform;
};

#define MD_XFORM_NONE 0
#define MD_XFORM_ZSTD 1

struct md_entry {
    char *key;
    int is_tensor;
    dcp_dtype dtype;
    int ndim;
    int64_t shape[DCP_MAX_NDIM];
    int requires_grad;
    struct md_chunk *chunks; /* values: exactly one, off/size NULL */
    size_t nchunks;
    struct md_pathel *path; /* planner_data; NULL when absent */
    size_t npath;
    /* A save planner's data for the entry (dcp_global_plan_set_data),
     * stored in planner_data under MD_PDATA_PREFIX + key; owned, NULL
     * when none. */
    dcp_value *pdata;
    /* Set by the decoders (dcp__meta_index) for dcp__meta_overlapping:
     * chunks listed by ascending offset along dim 0 (as dcp and torch write
     * them), and the largest chunk extent along dim 0. */
    int sorted0;
    int64_t maxlen0;
    /* A leaf inside a value record holding tensors (docs/FORMAT.md §9.4,
     * ckpt/unflat.c): its path below the record's pickle root; NULL for a
     * stored entry. Such entries own their chunk (one, whose off and size
     * are one allocation), whatever md->ints and md->chunk_block say. */
    struct md_pathel *member;
    size_t nmember;
    /* A value record holding tensors that could not be expanded: the
     * error a read of it returns (owned), or NULL. */
    char *bad;
    int badrc;
    /* A tensor of a dtype dcp cannot read (qint8, ...): torch's name of
     * it (owned), dtype 0. Such entries live in md->unsup, never md->e. */
    char *unsup;
};

struct dcp_metadata {
    struct md_entry *e; /* sorted by key (strcmp) */
    size_t n;
    char **files;
    size_t nfiles;
    char *version;       /* "" when absent */
    char *checkpoint_id; /* storage_meta.checkpoint_id when a str/path */
    char *save_id;
    int64_t *ints;       /* backing store for chunk offsets/sizes */
    /* When set, every entry's chunks lie in this one block (the save
     * plan's), freed with it instead of one by one. */
    struct md_chunk *chunk_block;
    char *dir;           /* set by dcp_metadata_open: where it was read */
    /* Tensor entries of dtypes dcp cannot read (their unsup set), sorted
     * by key, apart from e so that every reader of e sees a checkpoint
     * without them; a load or read naming one is refused with
     * DCP_ENOTSUP (dcp__meta_unsup_err). Their files stay in files. */
    struct md_entry *unsup;
    size_t nunsup;
};

/* The index in md->unsup of key, or -1. */
long dcp__meta_find_unsup(const struct dcp_metadata *md, const char *key);

/* DCP_ENOTSUP naming key and its dtype when key is one of md->unsup; else
 * DCP_OK (err untouched). */
int dcp__meta_unsup_err(const struct dcp_metadata *md, const char *key,
                        struct dcp_err *err);

/*
 * Decodes .metadata bytes. Validates: known classes only (allow-list),
 * every tensor chunk inside its global shape, every chunk and value has
 * exactly one storage entry, file names are single safe path components,
 * byte ranges do not overflow. Tiling is not checked here
 * (dcp__meta_check_tiling).
 */
int dcp__meta_decode(const void *p, size_t len, struct dcp_metadata **out,
                     struct dcp_err *err);

/* Encodes md as a protocol-2 pickle (PROTO ... STOP) appended to out. */
int dcp__meta_encode(const struct dcp_metadata *md, struct dcp_buf *out);

void dcp__meta_free(struct dcp_metadata *md);

/* Frees what entry e of md owns and zeroes it (md->e is not changed). */
void dcp__meta_entry_release(const struct dcp_metadata *md,
                             struct md_entry *e);

/* The general decoder alone (dcp__meta_decode tries the fast path first). */
int dcp__meta_decode_general(const void *p, size_t len,
                             struct dcp_metadata **out, struct dcp_err *err);

/*
 * The fast path (meta_fast.c): decodes the layout dcp__meta_encode writes
 * straight into md, without a pickle tree. Returns DCP_OK, or
 * META_FAST_DECLINE for anything else -- another writer's layout, or any
 * input the general decoder would refuse -- so that the general decoder
 * runs and reports. Whatever it accepts, it decodes exactly as the general
 * decoder would.
 */
#define META_FAST_DECLINE 1
int dcp__meta_decode_fast(const uint8_t *p, size_t len,
                          struct dcp_metadata **out);

/* Index of name[0..len) in md->files, appended if new. t: md->files by
 * name, the decoder's (from empty, and given every file md gets; freed
 * with dcp__htab_release). Returns DCP_OK, DCP_ENOMEM or DCP_ELIMIT. */
int dcp__meta_file_index(struct dcp_metadata *md, struct dcp_htab *t,
                         const char *name, size_t len, uint32_t *out);

/* Index of key in md (binary search), or -1. */
long dcp__meta_find(const struct dcp_metadata *md, const char *key);

/* Sorts entries by key and fails with DCP_EPLAN on a duplicate. */
int dcp__meta_sort(struct dcp_metadata *md, struct dcp_err *err);

/* Fills sorted0 and maxlen0 of every tensor entry: one pass over the
 * chunks. */
void dcp__meta_index(struct dcp_metadata *md);

/* Renders a path component list as "('model', 'fc.weight', 0)". */
int dcp__path_repr(const struct md_pathel *p, size_t n, struct dcp_buf *out);

/* Checks that name is a plain file name inside the checkpoint directory. */
int dcp__safe_name(const char *name);

#endif /* DCP_META_H */
