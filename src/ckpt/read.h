/*
 * Reading stored records: open a checkpoint's data files on demand, parse a
 * chunk's torch.save archive, verify CRCs, and copy the part of a stored
 * chunk that overlaps each destination box (with an optional dtype cast).
 * Shared by dcp_load, the inspection API and dcp_verify.
 */
#ifndef DCP_READ_H
#define DCP_READ_H

#include "util.h"
#include "ioengine.h"
#include "meta.h"
#include "reshard.h"
#include "pickle.h"
#include "torchzip.h"

struct rd_files {
    const char *path; /* checkpoint directory, for messages */
    int dirfd;
    const struct dcp_metadata *md;
    int *fds;         /* per md->files, -1 until opened */
    uint64_t *sizes;
    uint8_t *scratch; /* reused staging buffer */
    size_t scratch_cap;
    uint8_t *win; /* the record-parsing windows (read.c) */
    int hints;    /* the back end takes hints (dcp__fs_takes_hints: S3) */
    /* The last compressed record opened, decompressed (xform.c), and the
     * bound on a value record's decompressed size (dcp__rd_value sets it). */
    uint8_t *plain;
    uint64_t value_max;
    uint64_t data_read; /* tensor data bytes dcp__rd_chunk read */
    /* The last safetensors header parsed by dcp__rd_sf_record (xform.c),
     * kept for the next chunk of the same file; freed by dcp__rd_close. */
    struct rd_sfcache *sfc;
    /* The last value record holding tensors opened (docs/FORMAT.md §9.4),
     * cached for its next member: its archive (any number of storages),
     * valid when wide_open, the record's file, offset and length, and its
     * data.pkl decoded (wide_root, NULL until a member is read; its CRC
     * checked when wide_verified). */
    struct tz_file wide;
    int wide_open;
    uint32_t wide_file;
    uint64_t wide_off, wide_len;
    uint8_t *wide_pkl;
    struct pk_arena *wide_arena;
    struct pk_node *wide_root;
    int wide_verified;
};

/* A destination: a box of the global tensor, with its own buffer. */
struct rd_dest {
    const int64_t *off;  /* global offsets of the box */
    const int64_t *size; /* box sizes */
    void *buf;           /* the box's elements: C-contiguous, or */
    const int64_t *stride; /* these element strides (NULL: C order) */
    dcp_dtype dtype;     /* may differ from the stored dtype (cast) */
};

int dcp__rd_open(struct rd_files *f, const char *path,
                 const struct dcp_metadata *md, struct dcp_err *err);
void dcp__rd_close(struct rd_files *f);

/*
 * Reads chunk ci of tensor entry e, checks that the archive describes the
 * chunk (dtype, sizes), verifies CRCs when verify is nonzero, and copies the
 * overlap into each destination that overlaps the chunk (ndest may be 0:
 * check only: every block CRC and the whole CRC). *bytes_checked (may be NULL) is increased by the record's
 * data bytes. Returns DCP_OK, DCP_EFORMAT, DCP_ECORRUPT, DCP_EUNSAFE,
 * DCP_ENOTSUP, DCP_EIO, DCP_ENOMEM; the message names the key and file.
 */
int dcp__rd_chunk(struct rd_files *f, const struct md_entry *e, size_t ci,
                  const struct rd_dest *dest, size_t ndest, int verify,
                  uint64_t *bytes_checked, struct dcp_err *err);

/* Asks the kernel to start reading what parsing chunk ci's record will
 * read (its first and last kilobytes), so that the records of many chunks
 * are fetched in parallel before they are parsed one by one. Best effort:
 * errors show up when the chunk is read. On a back end that takes hints
 * (dcp__fs_takes_hints: S3) a record that will be read whole (whole
 * nonzero) is hinted whole, so that one request fetches its headers and
 * data together (neighbouring records in one); returns the bytes hinted
 * there (0 for other back ends), which stay held until
 * dcp__rd_hints_drop. */
uint64_t dcp__rd_prefetch(struct rd_files *f, const struct md_entry *e,
                          size_t ci, int whole);

/* Drops what dcp__rd_prefetch hinted on every open file of f. */
void dcp__rd_hints_drop(struct rd_files *f);

/*
 * As dcp__rd_chunk, but when the chunk is stored contiguously and its
 * overlap with each destination is one run of bytes both in the chunk and
 * in the destination (the same dtype, no two overlaps sharing bytes), its
 * data is not read here: a stream is added to batch with one part per
 * destination (with verify, also parts that read the rest of the chunk for
 * its CRC only), which dcp__io_rbatch_run reads later, straight into the
 * destinations where it can. A strided destination (rd_dest.stride) whose
 * overlap's contiguous runs are all at least 4 KiB gets one part per run.
 * Other chunks are read and copied at once.
 * A record with block CRCs (docs/FORMAT.md §4) is verified block by block,
 * and only the blocks the destinations overlap are read, in both cases.
 * Same return codes as dcp__rd_chunk.
 */
int dcp__rd_chunk_plan(struct rd_files *f, const struct md_entry *e, size_t ci,
                       const struct rd_dest *dest, size_t ndest, int verify,
                       struct io_rbatch *batch, struct dcp_err *err);

/*
 * Copies chunk ci of tensor entry e, given as its C-contiguous elements in
 * the stored dtype at src (what the read-once load forwards), into every
 * destination it overlaps, casting where a destination's dtype differs.
 */
void dcp__rd_copy_chunk(const struct md_entry *e, size_t ci, const uint8_t *src,
                        const struct rd_dest *dest, size_t ndest);

/* Reads value entry e; *out belongs to the caller. */
int dcp__rd_value(struct rd_files *f, const struct md_entry *e, int verify,
                  uint64_t max_bytes, dcp_value **out, struct dcp_err *err);

/* The bounds on a value record holding tensors (docs/FORMAT.md §9.4):
 * its data.pkl, and its archive's entries. */
#define RD_MEMBER_PKL_MAX ((size_t)64 << 20)
#define RD_MEMBER_MAX_ENTRIES ((size_t)1 << 18)

/*
 * For unflat.c: opens value entry e's record (its archive in f->wide, up
 * to RD_MEMBER_MAX_ENTRIES entries; a: scratch) and, when the archive
 * holds storages (a "data/..." record), reads its data.pkl (CRC checked,
 * at most RD_MEMBER_PKL_MAX bytes) into *pkl (*len bytes; freed with
 * dcp__free). DCP_ENOENT (err untouched) when it holds none; else as
 * dcp__rd_value.
 */
int dcp__rd_value_pickle(struct rd_files *f, const struct md_entry *e,
                         struct tz_archive *a, uint8_t **pkl, size_t *len,
                         struct dcp_err *err);

/* An entry of the archive dcp__rd_value_pickle opened last, or NULL. */
const struct tz_entry *dcp__rd_wide_find(const struct rd_files *f,
                                         const char *name);

/* Reads .metadata of an open directory and decodes it. */
int dcp__rd_metadata(int dirfd, const char *path, uint64_t max_bytes,
                     struct dcp_metadata **out, struct dcp_err *err);

/* Where a tensor chunk's stored bytes are, for ranged reads (export). */
struct rd_loc {
    int fd;               /* owned by the rd_files */
    const char *file;
    uint64_t data;        /* absolute file offset of the storage bytes */
    uint64_t size;        /* storage bytes (0: an empty chunk) */
    uint32_t crc;         /* CRC-32 of the storage bytes, from the zip */
    struct tz_tensor t;   /* the view: dtype, sizes, strides, offset */
    /* A compressed record (docs/FORMAT.md §9.1): the decompressed record,
     * owned by loc (dcp__rd_loc_free), and data is an offset into it;
     * NULL: data is a file offset of fd. */
    uint8_t *mem;
};

/* Reads n bytes at pos of the chunk's storage bytes (pos + n <= size),
 * from the file or the decompressed record. DCP_OK, DCP_EIO. */
int dcp__rd_loc_read(const struct rd_loc *loc, void *buf, size_t n,
                     uint64_t pos, struct dcp_err *err);

/* Frees what loc owns (the decompressed record); loc may be zeroed. */
void dcp__rd_loc_free(struct rd_loc *loc);

/*
 * Reads the compressed record of chunk c (its byte range of the open data
 * file fd) and decompresses it into *out (*out_len bytes; freed with
 * dcp__free), bounded by what the metadata admits: a tensor chunk's
 * elements plus RD_XFORM_SLACK bytes of archive, or value_max plus that
 * for a value (xform.c). Returns DCP_OK, DCP_ECORRUPT (damaged or
 * truncated frame, more bytes than the bound), DCP_ENOTSUP (an unknown
 * transform, or built without libzstd), DCP_EIO, DCP_ENOMEM; the message
 * names the key, file and record offset.
 */
/*
 * A tensor chunk of a data file written with torch's
 * serialization_format=SAFETENSORS (docs/FORMAT.md §9.3): when the chunk's
 * byte range starts a safetensors file (length prefix, '{'), finds the
 * tensor named e->key there, checks its dtype, shape (the chunk's sizes)
 * and byte length (the chunk's length), reads it and re-makes it in memory
 * as the plain record (*out, *out_len; freed with dcp__free). Returns
 * DCP_OK; DCP_ENOENT when the range does not start a safetensors file
 * (err untouched); DCP_EFORMAT, DCP_ECORRUPT, DCP_ELIMIT, DCP_ENOTSUP
 * (the header parser's), DCP_EIO, DCP_ENOMEM, naming key, file, offset.
 */
int dcp__rd_sf_record(struct rd_files *f, int fd, const char *file,
                      uint64_t file_size, const struct md_entry *e,
                      const struct md_chunk *c, uint8_t **out, size_t *out_len,
                      struct dcp_err *err);
void dcp__rd_sfcache_free(struct rd_sfcache *sfc);

#define RD_XFORM_SLACK ((uint64_t)4 << 20)
int dcp__rd_inflate(int fd, const char *file, const struct md_entry *e,
                    const struct md_chunk *c, uint64_t value_max,
                    uint8_t **out, size_t *out_len, struct dcp_err *err);

/*
 * Parses and checks the record of chunk ci of tensor entry e as
 * dcp__rd_chunk does (data.pkl CRC verified), without reading its data.
 * Same return codes.
 */
int dcp__rd_chunk_locate(struct rd_files *f, const struct md_entry *e,
                         size_t ci, struct rd_loc *loc, struct dcp_err *err);

#endif /* DCP_READ_H */
