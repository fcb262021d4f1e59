/*
 * torchzip: the torch.save zip archive that holds one DCP item.
 *
 * Writer: reproduces torch.save's layout (miniz in zip64 mode plus PyTorch's
 * "FB" padding extra field): local header with CRC and sizes 0 and flags
 * 0x0808, name, optional zip64 extra, FB padding so the record's data starts
 * on an alignment boundary, the data, a data descriptor; after the records
 * the central directory, a zip64 end record, a zip64 locator and the classic
 * end record. tests/data/torch_item_*.bin are real torch 2.13 items.
 *
 * Unlike torch, the alignment is computed against the absolute file offset
 * of the data (the item's own offset in the .distcp file plus the position
 * inside the item), so tensor bytes can start on 4096-byte file offsets.
 * With item_offset 0 and align 64 the bytes equal torch.save's (without
 * .data/serialization_id, which is optional).
 *
 * The writer produces bytes into w->out, which the caller drains (writes to
 * the file and resets len to 0) whenever it likes; a large record's data can
 * be streamed by the caller between dcp__tz_stream_begin and dcp__tz_stream_end.
 *
 * Reader: parses an item given a read callback over the item's byte range.
 * Every structure is bounds-checked against the item length: an entry or
 * directory outside it, overlapping records, a bad signature, a name count
 * or size beyond the limits, a compressed entry: DCP_EFORMAT with the byte
 * offset.
 */
#ifndef DCP_TORCHZIP_H
#define DCP_TORCHZIP_H

#include <stddef.h>
#include <stdint.h>

#include "util.h"

#define TZ_MAX_ENTRIES 64      /* records in one item (torch writes <= 8) */
#define TZ_MAX_NAME 256        /* bytes of one record name */

struct tz_wentry {
    char *name;
    uint64_t header_off; /* item-relative local header offset */
    uint64_t size;
    uint32_t crc;
    int zip64;           /* local header carried a zip64 extra */
    uint32_t blk_size;   /* block CRCs (dcp__tz_stream_end_blocks), 0: none */
    size_t nblk;
    uint32_t *blk;       /* owned */
};

/*
 * dcp's block-CRC extra field (docs/FORMAT.md §4), in the central directory
 * entry of a tensor's storage record: ID 0x4344 ("DC"), then version 1,
 * three zero bytes, u32 block size, u64 data size, u32 CRC-32 per block.
 * Block sizes are powers of two in [TZ_BLK_MIN, TZ_BLK_MAX]; the writer
 * uses TZ_BLK_DEFAULT, doubled until a record has at most TZ_BLK_WCOUNT
 * blocks.
 */
#define TZ_BLK_ID      0x4344u
#define TZ_BLK_VERSION 1u
#define TZ_BLK_HEAD    20u /* id, length, version, reserved, size, bytes */
#define TZ_BLK_MIN     ((uint64_t)4096)
#define TZ_BLK_MAX     ((uint64_t)1 << 30)
#define TZ_BLK_DEFAULT ((uint64_t)1 << 20)
#define TZ_BLK_WCOUNT  8192u
/* Blocks one field can hold: its length is a u16. */
#define TZ_BLK_RCOUNT  ((0xFFFFu - (TZ_BLK_HEAD - 4u)) / 4u)

/*
 * dcp's save-id extra field (docs/FORMAT.md §4), in the central directory
 * entry of an item's first record: ID 0x4953 ("SI"), then u16 version 1,
 * then the save id's bytes (1 to TZ_SID_MAX printable ASCII, no NUL): the
 * save_id of the .metadata that names the item. torch ignores it; a reader
 * compares it with the .metadata's (read.c).
 */
#define TZ_SID_ID      0x4953u
#define TZ_SID_VERSION 1u
#define TZ_SID_MAX     64u

struct tz_writer {
    char sid[TZ_SID_MAX + 1]; /* save id for entry 0, "" for none */
    struct dcp_buf out;    /* bytes produced and not yet drained */
    uint64_t pos;          /* item-relative offset of the next byte */
    uint64_t item_offset;  /* absolute file offset of the item's first byte */
    uint32_t align;        /* power of two, >= 1 */
    uint32_t stream_align; /* for dcp__tz_stream_begin's data; 0: align */
    struct tz_wentry *ent; /* grows as records are added */
    size_t n, cap;
    size_t max;            /* records allowed (TZ_MAX_ENTRIES by default) */
    int streaming;         /* inside dcp__tz_stream_begin/end */
};

/* align: power of two (64 for torch's layout, 4096 for O_DIRECT). */
int dcp__tz_writer_init(struct tz_writer *w, uint64_t item_offset, uint32_t align);

/* Gives the item the save-id field (TZ_SID_ID) with id (1 to TZ_SID_MAX
 * printable ASCII bytes; NULL or "" for none). Call before dcp__tz_finish.
 * Returns DCP_OK or DCP_EINVAL. */
int dcp__tz_writer_save_id(struct tz_writer *w, const char *id);

/* Aligns the data of streamed records (tensor storages) to stream_align
 * instead (a power of two >= align, at most 32768), so that a tensor's
 * bytes start on a 4096-byte file offset while the small records keep
 * torch's 64-byte padding. Returns DCP_OK or DCP_EINVAL. */
int dcp__tz_writer_stream_align(struct tz_writer *w, uint32_t stream_align);
void dcp__tz_writer_release(struct tz_writer *w);

/* Raises (or lowers) the number of records the writer accepts; a whole
 * torch.save file of a model has one per storage. DCP_EINVAL if max is 0
 * or below the records already written. */
int dcp__tz_writer_set_max(struct tz_writer *w, size_t max);

/* Adds a complete record: header, padding, data, descriptor. name is the full
 * zip name ("archive/data.pkl"). */
int dcp__tz_add(struct tz_writer *w, const char *name, const void *data,
           size_t len);

/*
 * Starts a record of len bytes whose data the caller writes itself, right
 * after the bytes now in w->out. *data_off receives the item-relative offset
 * of the data (aligned in the file as asked). Then the caller drains w->out,
 * writes exactly len bytes, and calls dcp__tz_stream_end with their CRC-32.
 */
int dcp__tz_stream_begin(struct tz_writer *w, const char *name, uint64_t len,
                    uint64_t *data_off);
int dcp__tz_stream_end(struct tz_writer *w, uint32_t crc);

/* The block size the writer uses for a record of nbytes (0 for 0 bytes),
 * and the number of blocks: ceil(nbytes / size). */
uint64_t dcp__tz_block_size(uint64_t nbytes);
uint64_t dcp__tz_block_count(uint64_t nbytes, uint64_t bsize);

/* The block CRCs a writer gives a record of nbytes (docs/FORMAT.md §4):
 * returns their count and sets *bsize; 0 and *bsize 0 when the record gets
 * none (empty, or more blocks than the field holds). */
uint64_t dcp__tz_block_layout(uint64_t nbytes, uint64_t *bsize);

/*
 * dcp__tz_stream_end that also records the streamed data's block CRCs
 * (crc32.h's crc_blocks): n = dcp__tz_block_count(len, bsize) CRCs of
 * bsize-byte blocks, bsize a power of two in [TZ_BLK_MIN, TZ_BLK_MAX];
 * they go into the record's central directory entry (the block-CRC extra
 * field). crc must be the whole data's CRC. n == 0 (an empty record) or
 * bsize == 0 writes no field. DCP_EINVAL, DCP_ENOMEM.
 */
int dcp__tz_stream_end_blocks(struct tz_writer *w, uint32_t crc,
                              uint64_t bsize, const uint32_t *blk, size_t n);

/* Appends the central directory and end records; after draining, w->pos is
 * the item's total length. */
int dcp__tz_finish(struct tz_writer *w);

/*
 * Builds the data.pkl pickle of a tensor record exactly as torch.save does
 * (protocol 2, _rebuild_tensor_v2 with a legacy typed storage, or
 * _rebuild_tensor_v3 with torch.storage.UntypedStorage and the dtype for the
 * float8 types): storage key "0", location "cpu", storage_offset 0,
 * contiguous strides, requires_grad False, empty OrderedDict hooks.
 * numel is the element count (the storage size is numel elements).
 */
int dcp__tz_tensor_pickle(struct dcp_buf *out, dcp_dtype dt, int ndim,
                     const int64_t *sizes);

struct pk_writer;
struct pk_node;
struct pk_global;

/*
 * Emits, inside a larger pickle (a whole torch.save file's data.pkl), the
 * expression that rebuilds one contiguous tensor whose storage is record
 * "data/<key>": no PROTO or STOP; globals and the constant strings are
 * interned in pw (pkw_*_memo), so many tensors share them.
 */
int dcp__tz_tensor_emit(struct pk_writer *pw, dcp_dtype dt, int ndim,
                   const int64_t *sizes, const char *key);

/*
 * Writes a whole tensor item whose data record "archive/data/0" is streamed:
 * records archive/data.pkl, archive/.format_version ("1"),
 * archive/.storage_alignment ("64"), archive/byteorder ("little"), then
 * data/0 (dcp__tz_stream_begin), and after dcp__tz_stream_end the record
 * archive/version ("3\n") and dcp__tz_finish. These two helpers split that into
 * the part before the data and the part after it.
 */
int dcp__tz_tensor_item_begin(struct tz_writer *w, dcp_dtype dt, int ndim,
                         const int64_t *sizes, uint64_t nbytes,
                         uint64_t *data_off);
int dcp__tz_tensor_item_end(struct tz_writer *w, uint32_t crc);
/* dcp__tz_tensor_item_end with the data's block CRCs
 * (dcp__tz_stream_end_blocks). */
int dcp__tz_tensor_item_end_blocks(struct tz_writer *w, uint32_t crc,
                                   uint64_t bsize, const uint32_t *blk,
                                   size_t n);

/* A whole value item, with torch's record set for values: archive/data.pkl
 * (the pickle), .format_version, .storage_alignment, byteorder, version. */
int dcp__tz_value_item(struct tz_writer *w, const void *pickle, size_t len);

/* ------------------------------------------------------------------ */
/* Reader                                                             */
/* ------------------------------------------------------------------ */

/* Reads exactly len bytes at item-relative offset off into buf; returns
 * DCP_OK or an error code (and sets err). */
typedef int (*tz_read_fn)(void *opaque, uint64_t off, void *buf, size_t len,
                          struct dcp_err *err);

struct tz_entry {
    char name[TZ_MAX_NAME + 1]; /* name without the archive prefix: "data.pkl",
                                   "data/0", "byteorder", ... */
    uint64_t header_off;        /* local header, item-relative */
    uint64_t data_off;          /* data, item-relative (from the local header) */
    uint64_t size;
    uint32_t crc;               /* from the central directory */
    uint64_t blk_size;          /* block-CRC field: block size, 0: none */
    uint64_t blk_n;             /* its CRCs: ceil(size / blk_size) */
    uint64_t blk_at;            /* item offset of the first CRC (LE u32s) */
};

struct tz_archive {
    uint64_t item_len;
    char save_id[TZ_SID_MAX + 1]; /* the save-id field's, "" when none */
    char prefix[TZ_MAX_NAME + 1]; /* text before the first '/' of entry 0 */
    struct tz_entry ent[TZ_MAX_ENTRIES];
    size_t n;
};

/*
 * Parses the item [0, item_len) through read: end records (classic and
 * zip64), central directory, and every local header (to compute data_off and
 * check it matches the central directory's name). Refuses: item shorter than
 * an end record, bad signatures, more than TZ_MAX_ENTRIES entries, a name
 * longer than TZ_MAX_NAME or without the common prefix, a compressed entry,
 * compressed size != size, data outside the item, overlapping data ranges,
 * duplicate names, a name containing "..", a backslash or a NUL; a
 * block-CRC field that is malformed (DCP_EFORMAT: version, length, block
 * size, count or data size wrong, or two of them) or whose CRCs do not
 * combine to the entry's CRC (DCP_ECORRUPT).
 * Returns DCP_OK, DCP_EFORMAT, DCP_ECORRUPT (truncated), DCP_EIO, DCP_ENOMEM.
 */
int dcp__tz_open(struct tz_archive *a, uint64_t item_len, tz_read_fn read,
            void *opaque, struct dcp_err *err);

/*
 * Reads n block CRCs of e, from block first on, into out. dcp__tz_open has
 * checked the field (sizes, count, and that the blocks' CRCs combine to
 * the entry's CRC, else DCP_ECORRUPT); this checks first + n <= blk_n
 * (DCP_EINVAL). Read errors as the callback returns them.
 */
int dcp__tz_read_block_crcs(const struct tz_entry *e, uint64_t first,
                            size_t n, tz_read_fn read, void *opaque,
                            uint32_t *out, struct dcp_err *err);

/* Entry by name without the prefix ("data.pkl"), or NULL. */
const struct tz_entry *dcp__tz_find(const struct tz_archive *a, const char *name);

/*
 * Reads a whole small entry into a new buffer (at most max bytes, else
 * DCP_ELIMIT), verifying its CRC when verify is nonzero (DCP_ECORRUPT).
 * *out is freed with dcp__free.
 */
int dcp__tz_read_entry(const struct tz_archive *a, const struct tz_entry *e,
                  size_t max, int verify, tz_read_fn read, void *opaque,
                  uint8_t **out, struct dcp_err *err);

/*
 * The tensor described by a data.pkl, as torch.load would rebuild it.
 * Accepts _rebuild_tensor_v2 (legacy typed storages) and _rebuild_tensor_v3
 * (UntypedStorage + dtype), any storage key, location "cpu" (or any
 * location string), any strides/offset that stay inside the storage.
 */
struct tz_tensor {
    dcp_dtype dtype;
    int ndim;
    int64_t size[DCP_MAX_NDIM];
    int64_t stride[DCP_MAX_NDIM];  /* in elements */
    int64_t storage_offset;        /* in elements */
    uint64_t storage_numel;        /* elements in the storage */
    char key[TZ_MAX_NAME + 1];     /* storage record is "data/<key>" */
};

/*
 * Decodes a tensor data.pkl with the safe decoder (allow-list: the rebuild
 * functions, the storage classes, torch dtypes, collections.OrderedDict,
 * torch.Size). Checks that the view fits in the storage with checked
 * arithmetic. Returns DCP_OK, DCP_EFORMAT, DCP_EUNSAFE, DCP_ELIMIT,
 * DCP_ENOTSUP (a dtype dcp does not support), DCP_ENOMEM.
 */
int dcp__tz_parse_tensor_pickle(const void *pkl, size_t len, struct tz_tensor *t,
                           struct dcp_err *err);

/*
 * For a decoder of a larger pickle (a whole torch.save file): the tensor
 * allow-list. A caller's allow-list must start with exactly these entries,
 * in this order, so that dcp__tz_tensor_from_node recognises the globals by
 * their index; more entries may follow.
 */
size_t dcp__tz_tensor_globals(const struct pk_global **out);

/* Interprets n, a node of such a pickle, as dcp__tz_parse_tensor_pickle does its
 * root. Same return codes. */
int dcp__tz_tensor_from_node(const struct pk_node *n, struct tz_tensor *t,
                        struct dcp_err *err);

/* ------------------------------------------------------------------ */
/* Whole torch.save files                                             */
/* ------------------------------------------------------------------ */

/*
 * A torch.save file of a whole state dict has one record per storage: the
 * same checks as dcp__tz_open, with up to max_entries records held in a heap
 * array (duplicates and overlaps found in O(n log n)) and a name index.
 */
struct tz_file {
    uint64_t item_len;
    char prefix[TZ_MAX_NAME + 1];
    struct tz_entry *ent;            /* directory order */
    const struct tz_entry **byname;  /* sorted by name */
    size_t n;
};

int dcp__tz_file_open(struct tz_file *f, uint64_t len, size_t max_entries,
                 tz_read_fn read, void *opaque, struct dcp_err *err);
void dcp__tz_file_release(struct tz_file *f);
/* Entry by name without the prefix, or NULL (binary search). */
const struct tz_entry *dcp__tz_file_find(const struct tz_file *f, const char *name);
/* dcp__tz_read_entry for a tz_file. */
int dcp__tz_file_read_entry(const struct tz_file *f, const struct tz_entry *e,
                       size_t max, int verify, tz_read_fn read, void *opaque,
                       uint8_t **out, struct dcp_err *err);

#endif /* DCP_TORCHZIP_H */
