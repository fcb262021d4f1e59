/*
 * dcp_parts.h: a save planned by someone else. The pieces a storage
 * writer plugged into another checkpointing framework needs: PyTorch's
 * StorageWriter protocol (torch plans the save, gathers the ranks' plans
 * and their results; dcp writes the bytes and commits) is served by them
 * in python/dcp_torch. Conventions as in dcp.h (return codes,
 * dcp_errmsg, ownership); this header includes no MPI header.
 *
 * A save in parts:
 *   1. the coordinator (one process) calls dcp_part_save_begin: the
 *      directory is made, its one-writer lock taken (docs/ARCHITECTURE.md,
 *      lock.c), the committed checkpoint there read, the leftovers of
 *      interrupted writers removed, and a save id and a name tag chosen.
 *      The tag is not empty when a committed checkpoint is there, so that
 *      the new data files never replace a file the old checkpoint reads:
 *      it stays loadable until the new one commits.
 *   2. every writer process (any number, on any host sharing the storage)
 *      writes its data files with dcp_part_file_*: records in dcp's layout
 *      of torch's format (a torch.save zip archive per tensor, its data on
 *      a 4096-byte file offset, its CRC-32 and per-block CRCs; byte records
 *      as given), through dcp's I/O engine (O_DIRECT/io_uring where the
 *      file system allows, S3 multipart uploads for s3:// paths). The
 *      names: __<r>_<n>.distcp, or __<r>_<n>.<tag>.distcp with the tag of
 *      step 1; every record carries the save id.
 *   3. the coordinator calls dcp_part_save_commit with the .metadata bytes
 *      (a pickle of torch's Metadata naming the files and extents of step
 *      2): they are decoded with dcp's restricted decoder (nothing
 *      executed), checked (the save id), and published atomically (the
 *      commit point; on S3 conditional on the .metadata step 1 read), the
 *      old checkpoint's data files the new one does not name removed, and
 *      the lock released.
 * A failed save calls dcp_part_save_free without committing: nothing
 * becomes visible, the previous checkpoint stays loadable, the lock is
 * released, and the data files written are leftovers that the next
 * save's step 1 or dcp_clean removes.
 *
 * Threads: a handle is used by one thread at a time; a context serves one
 * call at a time (dcp.h's rule). None of these calls is collective.
 */
#ifndef DCP_DCP_PARTS_H
#define DCP_DCP_PARTS_H

#include <stddef.h>
#include <stdint.h>

#include "dcp.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The version of this header's API; newer versions only add. */
#define DCP_PARTS_VERSION 1

typedef struct dcp_part_save dcp_part_save;
typedef struct dcp_part_file dcp_part_file;

/* Flags of dcp_part_save_begin. */
/* Refuse a directory holding a committed checkpoint (DCP_EEXIST naming
 * it) instead of replacing it at the commit. */
#define DCP_PART_NO_OVERWRITE 0x1u
/* No one-writer lock: for rank-local commits (each rank commits its own
 * __<r>.metadata, so each rank is a coordinator of its own). */
#define DCP_PART_NO_LOCK 0x2u

/*
 * Step 1 on the coordinator: path's directory made (as dcp_save: parents
 * too; s3://bucket/prefix on an object store), its lock taken, the
 * committed .metadata there read (kept for the commit), leftovers of dead
 * writers removed (best effort), the save id and tag chosen. *out is owned
 * by the caller (dcp_part_save_free); ctx must outlive it and is used for
 * every later call on it (its storage back end, its error message).
 * Returns DCP_OK, DCP_EINVAL (NULL argument, unknown flag), DCP_EBUSY
 * (another writer holds the lock: the message names it), DCP_EEXIST
 * (DCP_PART_NO_OVERWRITE and a checkpoint is there), DCP_ENOMEM, or the
 * storage back end's code (DCP_EIO, DCP_ENOSPC, ...; a path that is a
 * file: DCP_EIO naming it).
 */
DCP_API int dcp_part_save_begin(dcp_ctx *ctx, const char *path,
                                unsigned flags, dcp_part_save **out);

/* The save id (16 lowercase hex digits) that every record must carry and
 * the committed metadata must name (storage_meta.save_id). Owned by s. */
DCP_API const char *dcp_part_save_id(const dcp_part_save *s);

/* The tag of the data file names, "" for none (no checkpoint was there).
 * Owned by s. */
DCP_API const char *dcp_part_save_tag(const dcp_part_save *s);

/* Whether a committed checkpoint was in the directory at begin (1) or not
 * (0); one that could not be read counts as there. */
DCP_API int dcp_part_save_had_checkpoint(const dcp_part_save *s);

/*
 * Step 3: the len bytes at metadata, a pickle of torch's Metadata, become
 * the checkpoint's .metadata (name NULL), or name (a rank-local
 * "__<r>.metadata": then nothing else is removed). They are decoded first
 * with dcp's restricted decoder and must name the save id of s
 * (storage_meta.save_id): otherwise nothing is published. sync nonzero:
 * durable on return (temporary, fsync, rename, directory fsync). Then the
 * previous checkpoint's data files that the new metadata does not name are
 * removed and the lock released; the handle stays valid for
 * dcp_part_save_free only. A second commit on one handle: DCP_EINVAL.
 * Returns DCP_OK, DCP_EINVAL, DCP_EFORMAT / DCP_EUNSAFE / DCP_ELIMIT (the
 * bytes do not decode: the message says why), DCP_EBUSY (an object
 * store's conditional commit found another writer's .metadata), or the
 * storage back end's code. On failure the previous checkpoint is untouched
 * unless the message says the new .metadata became visible.
 */
DCP_API int dcp_part_save_commit(dcp_part_save *s, const char *name,
                                 const void *metadata, size_t len, int sync);

/* Frees s; without a commit, releases the lock (nothing is published).
 * NULL: no-op. */
DCP_API void dcp_part_save_free(dcp_part_save *s);

/*
 * Step 2: creates the data file name (a single file name matching
 * __<r>_<n>.distcp or __<r>_<n>.<tag>.distcp) in path's directory, which
 * must exist (step 1 made it), replacing a file of that name. save_id:
 * the save's (dcp_part_save_id; NULL or "" for none: a reader then does
 * not check it). size_hint: an upper bound of the file's length, or 0.
 * *out is owned by the caller until dcp_part_file_close. Returns DCP_OK,
 * DCP_EINVAL (NULL argument, a name that is not a data file's, a bad save
 * id), DCP_ENOENT (no such directory), DCP_ENOMEM, or the back end's code.
 */
DCP_API int dcp_part_file_open(dcp_ctx *ctx, const char *path,
                               const char *name, const char *save_id,
                               uint64_t size_hint, dcp_part_file **out);

/*
 * Appends a tensor record: torch.save of a tensor of dtype and sizes
 * (ndim 0..DCP_MAX_NDIM) whose nbytes bytes of C-contiguous little-endian
 * elements are at data. data is borrowed until dcp_part_file_close
 * returns and must not change until then (the engine may write it
 * straight from there). *offset and *length (may be NULL) get the
 * record's extent in the file (torch's _StorageInfo). Returns DCP_OK,
 * DCP_EINVAL (nbytes is not the elements' size), DCP_ENOMEM, or the
 * back end's code; after a failure every later call returns it.
 */
DCP_API int dcp_part_file_tensor(dcp_part_file *f, dcp_dtype dtype, int ndim,
                                 const int64_t *sizes, const void *data,
                                 uint64_t nbytes, uint64_t *offset,
                                 uint64_t *length);

/* Appends len bytes as a record of their own, copied (a byte item: the
 * torch.save archive of a Python object). Same returns. */
DCP_API int dcp_part_file_bytes(dcp_part_file *f, const void *data,
                                size_t len, uint64_t *offset,
                                uint64_t *length);

/* Flags of dcp_part_file_close. */
#define DCP_PART_SYNC 0x1u    /* fsync the file (durable on DCP_OK) */
#define DCP_PART_DISCARD 0x2u /* remove the file instead (a failed save) */

/*
 * Writes what is pending, waits for every request, (DCP_PART_SYNC) makes
 * the file durable, closes it and frees f, in every case. When a call on
 * f failed, or this one fails, or DCP_PART_DISCARD is given, the file is
 * removed. Returns DCP_OK or the first failure's code (the message names
 * the file and byte offset). NULL: DCP_OK.
 */
DCP_API int dcp_part_file_close(dcp_part_file *f, unsigned flags);

/* The bytes a file of these records takes at most: a size_hint for
 * dcp_part_file_open (record structures, alignment, block CRCs). */
DCP_API uint64_t dcp_part_record_bound(uint64_t nbytes);

/*
 * Reading a record as stored (torch's read of a BYTE_IO item): the
 * length bytes at offset of the data file named file (one the metadata md
 * names), with the chunk's stream transforms undone (zstd). chunk: the
 * entry's (index) chunk; offset/length are taken from md. *out (len bytes,
 * *len) is owned by the caller (dcp_free). Bounded by the context's
 * value limit (DCP_ELIMIT). Returns DCP_OK, DCP_EINVAL, DCP_ELIMIT,
 * DCP_ECORRUPT, DCP_EIO, DCP_ENOMEM.
 */
DCP_API int dcp_metadata_read_record(dcp_ctx *ctx, const dcp_metadata *md,
                                     size_t index, size_t chunk,
                                     uint8_t **out, size_t *len);

/* The save id recorded in md (storage_meta.save_id), "" when none. */
DCP_API const char *dcp_metadata_save_id(const dcp_metadata *md);

/* One box of a batch read (dcp_metadata_read_boxes). */
typedef struct dcp_box_read {
    size_t index;           /* a tensor entry of md */
    const int64_t *offsets; /* the box in the global tensor: ndim each */
    const int64_t *sizes;
    void *buf;              /* C-contiguous, the stored dtype */
    size_t len;             /* its bytes: must equal the box's */
} dcp_box_read;

/*
 * Reads n boxes as dcp_metadata_read_box reads one, in one sorted,
 * coalesced batch (each stored chunk's bytes read once for all the boxes
 * it overlaps, straight into buf where they lie contiguously, files in
 * parallel through the I/O engine). verify: CRCs checked (per block where
 * the record has block CRCs). Returns DCP_OK or the first problem's code
 * (as dcp_metadata_read_box); on failure the buffers' contents are
 * unspecified.
 */
DCP_API int dcp_metadata_read_boxes(dcp_ctx *ctx, const dcp_metadata *md,
                                    const dcp_box_read *reads, size_t n,
                                    int verify);

#ifdef __cplusplus
}
#endif

#endif /* DCP_DCP_PARTS_H */
