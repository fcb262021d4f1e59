/*
 * torchzip: the torch.save zip archive that holds one DCP item.
 *
 * The writer reproduces what PyTorchStreamWriter produces through miniz in
 * zip64 mode, byte for byte: every local header has version 0, flags 0x0808
 * (0x0800 for an empty record, which also gets no data descriptor), DOS time
 * and date 0 and CRC/sizes 0; a zip64 extra (id 1) when the record's length
 * or its header offset reaches 0xFFFFFFFF, holding [size, 0] (the
 * compressed size is not known yet) and/or [offset]; then PyTorch's "FB" extra
 * whose 'Z' padding puts the data on an alignment boundary; the data; a 16-byte
 * data descriptor (24 bytes with 64-bit sizes when the record had a zip64
 * extra). The central directory repeats the zip64 extra (without FB) with
 * 0xFFFFFFFF placeholders, and is always followed by a zip64 end record, a
 * zip64 locator and the classic end record. The only deviation from torch: the
 * padding aligns the absolute file offset (item_offset + position), not the
 * item-relative one.
 *
 * The reader never holds more of the item than the end records (at most
 * 64 KiB + 22 bytes), the central directory (bounded by TZ_MAX_ENTRIES) and
 * one local header at a time. Every offset is checked against the item with
 * overflow-checked arithmetic before it is used.
 *
 * data.pkl is decoded by the safe pickle decoder with an allow-list of the
 * globals torch writes for one tensor; the result is interpreted the way
 * torch.load's persistent_load and _rebuild_tensor_v2/_v3 would, and the
 * view is checked to lie inside its storage.
 */
#include "torchzip.h"

#include <stdio.h>  /* snprintf */
#include <stdlib.h> /* qsort */
#include <string.h>

#include "crc32.h"
#include "dtype.h"
#include "pickle.h"

#define SIG_LOCAL       0x04034b50u
#define SIG_CENTRAL     0x02014b50u
#define SIG_DESCRIPTOR  0x08074b50u
#define SIG_Z64_END     0x06064b50u
#define SIG_Z64_LOCATOR 0x07064b50u
#define SIG_END         0x06054b50u

#define LOCAL_LEN       30u
#define CENTRAL_LEN     46u
#define END_LEN         22u
#define Z64_END_LEN     56u
#define Z64_LOCATOR_LEN 20u
#define MAX_COMMENT     0xFFFFu

#define FLAG_DESCRIPTOR 0x0008u
#define FLAG_UTF8       0x0800u
#define FLAG_ENCRYPTED  0x2041u /* traditional, strong, central-dir masking */

#define U16_MARK 0xFFFFu
#define U32_MARK 0xFFFFFFFFu

/* Largest alignment: the FB padding must fit the 16-bit extra length. */
#define MAX_ALIGN 32768u

/* Per central-directory entry, what the reader allows beyond the name
 * (not counting a block-CRC field), and for all block-CRC fields of an
 * item together. */
#define MAX_CD_EXTRA 256u
#define MAX_CD_BLK   ((uint64_t)8 << 20)

typedef unsigned long long ull;

/* ------------------------------------------------------------------ */
/* Element types                                                      */
/* ------------------------------------------------------------------ */

struct dtype_info {
    dcp_dtype dt;
    const char *name;    /* torch.<name> */
    const char *storage; /* torch.<storage>, NULL for the "new" dtypes */
    uint32_t size;
};

/* From the one dtype table (common/dtype.c); 0 for an unknown dtype. */
static int dtype_find(dcp_dtype dt, struct dtype_info *out)
{
    out->dt = dt;
    out->name = dcp_dtype_name(dt);
    out->storage = dcp__dtype_storage(dt);
    out->size = (uint32_t)dcp_dtype_size(dt);
    return out->name != NULL;
}

/* ------------------------------------------------------------------ */
/* Writer                                                             */
/* ------------------------------------------------------------------ */

/* miniz sets "sizes in the descriptor" only when there is data (and so a
 * descriptor); UTF-8 names always. */
static uint16_t record_flags(uint64_t len)
{
    return (uint16_t)(len ? FLAG_UTF8 | FLAG_DESCRIPTOR : FLAG_UTF8);
}

int dcp__tz_writer_init(struct tz_writer *w, uint64_t item_offset, uint32_t align)
{
    if (!w)
        return DCP_EINVAL;
    memset(w, 0, sizeof(*w));
    if (align == 0 || (align & (align - 1)) != 0 || align > MAX_ALIGN)
        return DCP_EINVAL;
    w->item_offset = item_offset;
    w->align = align;
    w->max = TZ_MAX_ENTRIES;
    return DCP_OK;
}

int dcp__tz_writer_save_id(struct tz_writer *w, const char *id)
{
    size_t i, n = id ? strlen(id) : 0;
    if (!w || n > TZ_SID_MAX)
        return DCP_EINVAL;
    for (i = 0; i < n; i++)
        if (id[i] < 0x21 || id[i] > 0x7e)
            return DCP_EINVAL;
    if (n)
        memcpy(w->sid, id, n);
    w->sid[n] = '\0';
    return DCP_OK;
}

int dcp__tz_writer_set_max(struct tz_writer *w, size_t max)
{
    if (!w || max == 0 || max < w->n || max > SIZE_MAX / sizeof(*w->ent))
        return DCP_EINVAL;
    w->max = max;
    return DCP_OK;
}

int dcp__tz_writer_stream_align(struct tz_writer *w, uint32_t stream_align)
{
    if (!w || stream_align < w->align ||
        (stream_align & (stream_align - 1)) != 0 || stream_align > MAX_ALIGN)
        return DCP_EINVAL;
    w->stream_align = stream_align;
    return DCP_OK;
}

void dcp__tz_writer_release(struct tz_writer *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->n; i++) {
        dcp__free(w->ent[i].name);
        dcp__free(w->ent[i].blk);
    }
    dcp__free(w->ent);
    w->ent = NULL;
    w->n = 0;
    w->cap = 0;
    w->streaming = 0;
    dcp__buf_free(&w->out);
}

/*
 * Appends a local header for a record of len bytes at w->pos and registers
 * the entry. Reserves room for `more` further bytes so that the caller's
 * appends after it cannot fail. On failure nothing has changed.
 */
static int put_local_header(struct tz_writer *w, const char *name, uint64_t len,
                            size_t more, uint32_t align, uint64_t *data_off)
{
    uint64_t c = w->pos, start, data, end;
    size_t nlen, hdr_len;
    uint32_t z64_len, pad, extra_len;
    int big_len = len >= U32_MARK, big_off = c >= U32_MARK;
    struct tz_wentry *e;
    char *copy;

    if (w->streaming || !name)
        return DCP_EINVAL;
    nlen = strlen(name);
    if (nlen == 0 || nlen > TZ_MAX_NAME)
        return DCP_EINVAL;
    if (w->n >= w->max)
        return DCP_ELIMIT;
    if (w->n == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 8;
        struct tz_wentry *ent;
        if (cap > w->max)
            cap = w->max;
        ent = dcp__realloc(w->ent, cap * sizeof(*ent));
        if (!ent)
            return DCP_ENOMEM;
        w->ent = ent;
        w->cap = cap;
    }

    z64_len = (big_len || big_off) ? 4u + 16u * big_len + 8u * big_off : 0u;
    /* PyTorch's getPadding(): the data would start at `start` without FB
     * padding; here aligned against the absolute file offset. */
    start = c + LOCAL_LEN + nlen + 4u + z64_len;
    pad = (uint32_t)((0u - (w->item_offset + start)) & (align - 1u));
    extra_len = z64_len + 4u + pad;
    if (dcp__add_overflow_u64(start, pad, &data) ||
        dcp__add_overflow_u64(data, len, &end))
        return DCP_EINVAL;

    hdr_len = LOCAL_LEN + nlen + extra_len;
    if (more > SIZE_MAX - hdr_len)
        return DCP_ENOMEM;
    copy = dcp__strdup(name);
    if (!copy)
        return DCP_ENOMEM;
    if (dcp__buf_reserve(&w->out, hdr_len + more) != DCP_OK) {
        dcp__free(copy);
        return DCP_ENOMEM;
    }

    /* Cannot fail from here on: the room is reserved. */
    (void)dcp__buf_put_le32(&w->out, SIG_LOCAL);
    (void)dcp__buf_put_le16(&w->out, 0); /* version needed (miniz, stored) */
    (void)dcp__buf_put_le16(&w->out, record_flags(len));
    (void)dcp__buf_put_le16(&w->out, 0); /* method: stored */
    (void)dcp__buf_put_le16(&w->out, 0); /* DOS time */
    (void)dcp__buf_put_le16(&w->out, 0); /* DOS date */
    (void)dcp__buf_put_le32(&w->out, 0); /* CRC: in the descriptor */
    (void)dcp__buf_put_le32(&w->out, 0);
    (void)dcp__buf_put_le32(&w->out, 0);
    (void)dcp__buf_put_le16(&w->out, (uint16_t)nlen);
    (void)dcp__buf_put_le16(&w->out, (uint16_t)extra_len);
    (void)dcp__buf_put(&w->out, name, nlen);
    if (z64_len) {
        (void)dcp__buf_put_le16(&w->out, 1);
        (void)dcp__buf_put_le16(&w->out, (uint16_t)(z64_len - 4u));
        if (big_len) {
            /* miniz writes the compressed size before it knows it */
            (void)dcp__buf_put_le64(&w->out, len);
            (void)dcp__buf_put_le64(&w->out, 0);
        }
        if (big_off)
            (void)dcp__buf_put_le64(&w->out, c);
    }
    (void)dcp__buf_put(&w->out, "FB", 2);
    (void)dcp__buf_put_le16(&w->out, (uint16_t)pad);
    (void)dcp__buf_fill(&w->out, 'Z', pad);

    e = &w->ent[w->n++];
    e->name = copy;
    e->header_off = c;
    e->size = len;
    e->crc = 0;
    e->zip64 = z64_len != 0;
    e->blk_size = 0;
    e->nblk = 0;
    e->blk = NULL;
    w->pos = data;
    if (data_off)
        *data_off = data;
    return DCP_OK;
}

/* The descriptor of the last entry; room for it must be reserved. */
static void put_descriptor(struct tz_writer *w, uint32_t crc)
{
    struct tz_wentry *e = &w->ent[w->n - 1];

    e->crc = crc;
    if (e->size == 0)
        return; /* miniz writes none for an empty record */
    (void)dcp__buf_put_le32(&w->out, SIG_DESCRIPTOR);
    (void)dcp__buf_put_le32(&w->out, crc);
    if (e->zip64) {
        (void)dcp__buf_put_le64(&w->out, e->size);
        (void)dcp__buf_put_le64(&w->out, e->size);
        w->pos += 24;
    } else {
        (void)dcp__buf_put_le32(&w->out, (uint32_t)e->size);
        (void)dcp__buf_put_le32(&w->out, (uint32_t)e->size);
        w->pos += 16;
    }
}

int dcp__tz_add(struct tz_writer *w, const char *name, const void *data, size_t len)
{
    int rc;

    if (!w || (len > 0 && !data) || len > SIZE_MAX - 24)
        return DCP_EINVAL;
    rc = put_local_header(w, name, len, len + 24, w->align, NULL);
    if (rc != DCP_OK)
        return rc;
    (void)dcp__buf_put(&w->out, data, len);
    w->pos += len;
    put_descriptor(w, dcp__crc32(0, data, len));
    return DCP_OK;
}

int dcp__tz_stream_begin(struct tz_writer *w, const char *name, uint64_t len,
                    uint64_t *data_off)
{
    int rc;

    if (!w)
        return DCP_EINVAL;
    rc = put_local_header(w, name, len, 0,
                          w->stream_align ? w->stream_align : w->align,
                          data_off);
    if (rc == DCP_OK)
        w->streaming = 1;
    return rc;
}

int dcp__tz_stream_end(struct tz_writer *w, uint32_t crc)
{
    if (!w || !w->streaming)
        return DCP_EINVAL;
    if (dcp__buf_reserve(&w->out, 24) != DCP_OK)
        return DCP_ENOMEM; /* still streaming: the call may be repeated */
    w->streaming = 0;
    w->pos += w->ent[w->n - 1].size; /* the caller's bytes */
    put_descriptor(w, crc);
    return DCP_OK;
}

uint64_t dcp__tz_block_count(uint64_t nbytes, uint64_t bsize)
{
    return bsize ? nbytes / bsize + (nbytes % bsize != 0) : 0;
}

uint64_t dcp__tz_block_size(uint64_t nbytes)
{
    uint64_t b = TZ_BLK_DEFAULT;
    if (nbytes == 0)
        return 0;
    while (b < TZ_BLK_MAX && dcp__tz_block_count(nbytes, b) > TZ_BLK_WCOUNT)
        b <<= 1;
    return b;
}

uint64_t dcp__tz_block_layout(uint64_t nbytes, uint64_t *bsize)
{
    uint64_t n;
    *bsize = dcp__tz_block_size(nbytes);
    n = dcp__tz_block_count(nbytes, *bsize);
    if (n > TZ_BLK_WCOUNT)
        *bsize = n = 0;
    return n;
}

int dcp__tz_stream_end_blocks(struct tz_writer *w, uint32_t crc,
                              uint64_t bsize, const uint32_t *blk, size_t n)
{
    struct tz_wentry *e;
    uint32_t *copy = NULL;
    int rc;

    if (!w || !w->streaming)
        return DCP_EINVAL;
    e = &w->ent[w->n - 1];
    if (n && bsize) {
        if (!blk || bsize < TZ_BLK_MIN || bsize > TZ_BLK_MAX ||
            (bsize & (bsize - 1)) || n > TZ_BLK_RCOUNT ||
            dcp__tz_block_count(e->size, bsize) != n)
            return DCP_EINVAL;
        copy = dcp__malloc(n * sizeof(*copy));
        if (!copy)
            return DCP_ENOMEM;
        memcpy(copy, blk, n * sizeof(*copy));
    }
    rc = dcp__tz_stream_end(w, crc);
    if (rc != DCP_OK) {
        dcp__free(copy);
        return rc;
    }
    if (copy) {
        e->blk = copy;
        e->nblk = n;
        e->blk_size = (uint32_t)bsize;
    }
    return DCP_OK;
}

/* The save-id field's length on entry i (0: none). */
static uint32_t sid_len(const struct tz_writer *w, size_t i)
{
    return i == 0 && w->sid[0] ? 6u + (uint32_t)strlen(w->sid) : 0u;
}

static uint32_t central_extra_len(const struct tz_writer *w, size_t i)
{
    const struct tz_wentry *e = &w->ent[i];
    uint32_t n = (e->nblk ? TZ_BLK_HEAD + 4u * (uint32_t)e->nblk : 0u) +
                 sid_len(w, i);
    if (!e->zip64)
        return n;
    return n + 4u + (e->size >= U32_MARK ? 16u : 0u) +
           (e->header_off >= U32_MARK ? 8u : 0u);
}

int dcp__tz_finish(struct tz_writer *w)
{
    uint64_t cd_off, cd_size = 0, z64_off;
    size_t total;

    if (!w || w->streaming)
        return DCP_EINVAL;
    for (size_t i = 0; i < w->n; i++)
        cd_size += CENTRAL_LEN + strlen(w->ent[i].name) +
                   central_extra_len(w, i);
    total = (size_t)cd_size + Z64_END_LEN + Z64_LOCATOR_LEN + END_LEN;
    if (dcp__buf_reserve(&w->out, total) != DCP_OK)
        return DCP_ENOMEM;

    cd_off = w->pos;
    for (size_t i = 0; i < w->n; i++) {
        const struct tz_wentry *e = &w->ent[i];
        size_t nlen = strlen(e->name);
        int big_len = e->size >= U32_MARK, big_off = e->header_off >= U32_MARK;
        uint32_t xlen = central_extra_len(w, i);
        uint32_t slen = sid_len(w, i);
        uint32_t blen =
            (e->nblk ? TZ_BLK_HEAD + 4u * (uint32_t)e->nblk : 0u) + slen;

        (void)dcp__buf_put_le32(&w->out, SIG_CENTRAL);
        (void)dcp__buf_put_le16(&w->out, 0); /* version made by */
        (void)dcp__buf_put_le16(&w->out, 0); /* version needed */
        (void)dcp__buf_put_le16(&w->out, record_flags(e->size));
        (void)dcp__buf_put_le16(&w->out, 0); /* method */
        (void)dcp__buf_put_le16(&w->out, 0); /* time */
        (void)dcp__buf_put_le16(&w->out, 0); /* date */
        (void)dcp__buf_put_le32(&w->out, e->crc);
        (void)dcp__buf_put_le32(&w->out,
                                big_len ? U32_MARK : (uint32_t)e->size);
        (void)dcp__buf_put_le32(&w->out,
                                big_len ? U32_MARK : (uint32_t)e->size);
        (void)dcp__buf_put_le16(&w->out, (uint16_t)nlen);
        (void)dcp__buf_put_le16(&w->out, (uint16_t)xlen);
        (void)dcp__buf_put_le16(&w->out, 0); /* comment */
        (void)dcp__buf_put_le16(&w->out, 0); /* disk */
        (void)dcp__buf_put_le16(&w->out, 0); /* internal attributes */
        (void)dcp__buf_put_le32(&w->out, 0); /* external attributes */
        (void)dcp__buf_put_le32(&w->out,
                                big_off ? U32_MARK : (uint32_t)e->header_off);
        (void)dcp__buf_put(&w->out, e->name, nlen);
        if (xlen > blen) {
            (void)dcp__buf_put_le16(&w->out, 1);
            (void)dcp__buf_put_le16(&w->out, (uint16_t)(xlen - blen - 4u));
            if (big_len) {
                (void)dcp__buf_put_le64(&w->out, e->size);
                (void)dcp__buf_put_le64(&w->out, e->size);
            }
            if (big_off)
                (void)dcp__buf_put_le64(&w->out, e->header_off);
        }
        if (blen > slen) {
            (void)dcp__buf_put_le16(&w->out, TZ_BLK_ID);
            (void)dcp__buf_put_le16(&w->out, (uint16_t)(blen - slen - 4u));
            (void)dcp__buf_put_le32(&w->out, TZ_BLK_VERSION);
            (void)dcp__buf_put_le32(&w->out, e->blk_size);
            (void)dcp__buf_put_le64(&w->out, e->size);
            for (size_t k = 0; k < e->nblk; k++)
                (void)dcp__buf_put_le32(&w->out, e->blk[k]);
        }
        if (slen) {
            (void)dcp__buf_put_le16(&w->out, TZ_SID_ID);
            (void)dcp__buf_put_le16(&w->out, (uint16_t)(slen - 4u));
            (void)dcp__buf_put_le16(&w->out, TZ_SID_VERSION);
            (void)dcp__buf_put(&w->out, w->sid, slen - 6u);
        }
    }
    z64_off = cd_off + cd_size;

    (void)dcp__buf_put_le32(&w->out, SIG_Z64_END);
    (void)dcp__buf_put_le64(&w->out, Z64_END_LEN - 12u);
    (void)dcp__buf_put_le16(&w->out, 0x031E); /* made by: unix, 3.0 */
    (void)dcp__buf_put_le16(&w->out, 0x002D); /* needed: 4.5 */
    (void)dcp__buf_put_le32(&w->out, 0);
    (void)dcp__buf_put_le32(&w->out, 0);
    (void)dcp__buf_put_le64(&w->out, w->n);
    (void)dcp__buf_put_le64(&w->out, w->n);
    (void)dcp__buf_put_le64(&w->out, cd_size);
    (void)dcp__buf_put_le64(&w->out, cd_off);

    (void)dcp__buf_put_le32(&w->out, SIG_Z64_LOCATOR);
    (void)dcp__buf_put_le32(&w->out, 0);
    (void)dcp__buf_put_le64(&w->out, z64_off);
    (void)dcp__buf_put_le32(&w->out, 1);

    (void)dcp__buf_put_le32(&w->out, SIG_END);
    (void)dcp__buf_put_le16(&w->out, 0);
    (void)dcp__buf_put_le16(&w->out, 0);
    (void)dcp__buf_put_le16(&w->out, (uint16_t)w->n); /* n <= 64 */
    (void)dcp__buf_put_le16(&w->out, (uint16_t)w->n);
    (void)dcp__buf_put_le32(&w->out,
                            cd_size >= U32_MARK ? U32_MARK : (uint32_t)cd_size);
    (void)dcp__buf_put_le32(&w->out,
                            cd_off >= U32_MARK ? U32_MARK : (uint32_t)cd_off);
    (void)dcp__buf_put_le16(&w->out, 0);
    w->pos += total;
    return DCP_OK;
}

/* Element count of a shape; DCP_EINVAL for a bad shape or an overflow. */
static int shape_numel(int ndim, const int64_t *sizes, int64_t *numel)
{
    if (ndim < 0 || ndim > DCP_MAX_NDIM || (ndim > 0 && !sizes))
        return DCP_EINVAL;
    *numel = dcp__shape_numel(ndim, sizes);
    return *numel < 0 ? DCP_EINVAL : DCP_OK;
}

/* A tuple of ints the way Python's pickler writes one, memoized unless
 * empty. */
static int put_int_tuple(struct pk_writer *pw, int n, const int64_t *v)
{
    int rc = DCP_OK;

    if (n > 3)
        rc = dcp__pkw_mark(pw);
    for (int i = 0; rc == DCP_OK && i < n; i++)
        rc = dcp__pkw_int(pw, v[i]);
    if (rc == DCP_OK)
        rc = dcp__pkw_tuple(pw, (size_t)n);
    if (rc == DCP_OK && n > 0)
        rc = dcp__pkw_put(pw, NULL);
    return rc;
}

/* A string or global followed by its BINPUT, as Python's pickler memoizes
 * them. */
static int put_str_memo(struct pk_writer *pw, const char *s)
{
    int rc = dcp__pkw_str(pw, s, strlen(s));
    return rc == DCP_OK ? dcp__pkw_put(pw, NULL) : rc;
}

static int put_global_memo(struct pk_writer *pw, const char *module,
                           const char *name)
{
    int rc = dcp__pkw_global(pw, module, name);
    return rc == DCP_OK ? dcp__pkw_put(pw, NULL) : rc;
}

static int put_op_memo(struct pk_writer *pw, uint8_t op)
{
    int rc = dcp__pkw_op(pw, op);
    return rc == DCP_OK ? dcp__pkw_put(pw, NULL) : rc;
}

/*
 * The opcodes of torch's data.pkl for one contiguous tensor:
 *   rebuild((("storage", <storage type>, "0", "cpu", numel) as persistent
 *            id, 0, size, stride, False, OrderedDict()[, dtype]))
 * with the memo numbering of Python's pickler: every global, string and
 * non-empty tuple is memoized in the order it is written.
 */
/* Strings and globals: memoized at every use (a one-tensor pickle, as
 * Python writes it), or interned (written once, then BINGET) when several
 * tensors share one pickle. */
static int put_str_m(struct pk_writer *pw, const char *s, int intern)
{
    return intern ? dcp__pkw_str_memo(pw, s, strlen(s), NULL) : put_str_memo(pw, s);
}

static int put_global_m(struct pk_writer *pw, const char *module,
                        const char *name, int intern)
{
    return intern ? dcp__pkw_global_memo(pw, module, name, NULL)
                  : put_global_memo(pw, module, name);
}

static int emit_tensor_expr(struct pk_writer *pw, const struct dtype_info *info,
                            int ndim, const int64_t *sizes,
                            const int64_t *stride, int64_t storage_numel,
                            const char *key, int intern)
{
    int v3 = info->storage == NULL;
    int rc =
        put_global_m(pw, "torch._utils",
                     v3 ? "_rebuild_tensor_v3" : "_rebuild_tensor_v2", intern);

    if (rc == DCP_OK)
        rc = dcp__pkw_mark(pw); /* the argument tuple */
    if (rc == DCP_OK)
        rc = dcp__pkw_mark(pw); /* the persistent id */
    if (rc == DCP_OK)
        rc = put_str_m(pw, "storage", intern);
    if (rc == DCP_OK)
        rc = v3 ? put_global_m(pw, "torch.storage", "UntypedStorage", intern)
                : put_global_m(pw, "torch", info->storage, intern);
    if (rc == DCP_OK)
        rc = put_str_memo(pw, key);
    if (rc == DCP_OK)
        rc = put_str_m(pw, "cpu", intern);
    if (rc == DCP_OK)
        rc = dcp__pkw_int(pw, storage_numel);
    if (rc == DCP_OK)
        rc = put_op_memo(pw, PK_OP_TUPLE);
    if (rc == DCP_OK)
        rc = dcp__pkw_op(pw, PK_OP_BINPERSID);
    if (rc == DCP_OK)
        rc = dcp__pkw_int(pw, 0); /* storage_offset */
    if (rc == DCP_OK)
        rc = put_int_tuple(pw, ndim, sizes);
    if (rc == DCP_OK)
        rc = put_int_tuple(pw, ndim, stride);
    if (rc == DCP_OK)
        rc = dcp__pkw_bool(pw, 0); /* requires_grad */
    if (rc == DCP_OK)
        rc = put_global_m(pw, "collections", "OrderedDict", intern);
    if (rc == DCP_OK)
        rc = dcp__pkw_empty_tuple(pw);
    if (rc == DCP_OK)
        rc = put_op_memo(pw, PK_OP_REDUCE); /* backward_hooks */
    if (rc == DCP_OK && v3)
        rc = put_global_m(pw, "torch", info->name, intern);
    if (rc == DCP_OK)
        rc = put_op_memo(pw, PK_OP_TUPLE);
    if (rc == DCP_OK)
        rc = put_op_memo(pw, PK_OP_REDUCE);
    return rc;
}

static int emit_tensor_pickle(struct pk_writer *pw,
                              const struct dtype_info *info, int ndim,
                              const int64_t *sizes, const int64_t *stride,
                              int64_t storage_numel)
{
    int rc = dcp__pkw_proto(pw);

    if (rc == DCP_OK)
        rc = emit_tensor_expr(pw, info, ndim, sizes, stride, storage_numel, "0",
                              0);
    if (rc == DCP_OK)
        rc = dcp__pkw_stop(pw);
    return rc;
}

/* Contiguous strides as torch computes them (empty dims count as 1) and
 * the storage size (elements, or bytes for UntypedStorage). */
static int tensor_layout(const struct dtype_info *info, int ndim,
                         const int64_t *sizes, int64_t *stride,
                         int64_t *storage_numel)
{
    int64_t numel;
    int rc = shape_numel(ndim, sizes, &numel);

    if (rc != DCP_OK)
        return rc;
    for (int i = ndim - 1; i >= 0; i--) {
        if (i == ndim - 1)
            stride[i] = 1;
        else if (dcp__mul_overflow_i64(stride[i + 1],
                                       sizes[i + 1] > 1 ? sizes[i + 1] : 1,
                                       &stride[i]))
            return DCP_EINVAL;
    }
    *storage_numel = numel;
    if (!info->storage &&
        dcp__mul_overflow_i64(numel, (int64_t)info->size, storage_numel))
        return DCP_EINVAL;
    return DCP_OK;
}

int dcp__tz_tensor_emit(struct pk_writer *pw, dcp_dtype dt, int ndim,
                   const int64_t *sizes, const char *key)
{
    struct dtype_info di, *info = dtype_find(dt, &di) ? &di : NULL;
    int64_t storage_numel, stride[DCP_MAX_NDIM];
    int rc;

    if (!pw || !info || !key)
        return DCP_EINVAL;
    rc = tensor_layout(info, ndim, sizes, stride, &storage_numel);
    if (rc == DCP_OK)
        rc = emit_tensor_expr(pw, info, ndim, sizes, stride, storage_numel, key,
                              1);
    return rc;
}

int dcp__tz_tensor_pickle(struct dcp_buf *out, dcp_dtype dt, int ndim,
                     const int64_t *sizes)
{
    struct dtype_info di, *info = dtype_find(dt, &di) ? &di : NULL;
    int64_t storage_numel, stride[DCP_MAX_NDIM];
    struct pk_writer pw;
    size_t mark;
    int rc;

    if (!out || !info)
        return DCP_EINVAL;
    rc = tensor_layout(info, ndim, sizes, stride, &storage_numel);
    if (rc != DCP_OK)
        return rc;
    mark = out->len;
    dcp__pk_writer_init(&pw, out);
    rc = emit_tensor_pickle(&pw, info, ndim, sizes, stride, storage_numel);
    dcp__pk_writer_release(&pw);
    if (rc != DCP_OK)
        out->len = mark;
    return rc;
}

/* The records torch writes before the storages, in its order. */
static int add_leading_records(struct tz_writer *w, const void *pkl, size_t len)
{
    int rc = dcp__tz_add(w, "archive/data.pkl", pkl, len);

    if (rc == DCP_OK)
        rc = dcp__tz_add(w, "archive/.format_version", "1", 1);
    if (rc == DCP_OK)
        rc = dcp__tz_add(w, "archive/.storage_alignment", "64", 2);
    if (rc == DCP_OK)
        rc = dcp__tz_add(w, "archive/byteorder", "little", 6);
    return rc;
}

int dcp__tz_tensor_item_begin(struct tz_writer *w, dcp_dtype dt, int ndim,
                         const int64_t *sizes, uint64_t nbytes,
                         uint64_t *data_off)
{
    struct dtype_info di, *info = dtype_find(dt, &di) ? &di : NULL;
    struct dcp_buf pkl = {0};
    int64_t numel;
    uint64_t want;
    int rc;

    if (!w || !info)
        return DCP_EINVAL;
    rc = shape_numel(ndim, sizes, &numel);
    if (rc != DCP_OK)
        return rc;
    if (dcp__mul_overflow_u64((uint64_t)numel, info->size, &want) ||
        want != nbytes)
        return DCP_EINVAL;
    rc = dcp__tz_tensor_pickle(&pkl, dt, ndim, sizes);
    if (rc == DCP_OK)
        rc = add_leading_records(w, pkl.p, pkl.len);
    if (rc == DCP_OK)
        rc = dcp__tz_stream_begin(w, "archive/data/0", nbytes, data_off);
    dcp__buf_free(&pkl);
    return rc;
}

int dcp__tz_tensor_item_end(struct tz_writer *w, uint32_t crc)
{
    return dcp__tz_tensor_item_end_blocks(w, crc, 0, NULL, 0);
}

int dcp__tz_tensor_item_end_blocks(struct tz_writer *w, uint32_t crc,
                                   uint64_t bsize, const uint32_t *blk,
                                   size_t n)
{
    int rc = dcp__tz_stream_end_blocks(w, crc, bsize, blk, n);

    if (rc == DCP_OK)
        rc = dcp__tz_add(w, "archive/version", "3\n", 2);
    if (rc == DCP_OK)
        rc = dcp__tz_finish(w);
    return rc;
}

int dcp__tz_value_item(struct tz_writer *w, const void *pickle, size_t len)
{
    int rc;

    if (!w || (len > 0 && !pickle))
        return DCP_EINVAL;
    rc = add_leading_records(w, pickle, len);
    if (rc == DCP_OK)
        rc = dcp__tz_add(w, "archive/version", "3\n", 2);
    if (rc == DCP_OK)
        rc = dcp__tz_finish(w);
    return rc;
}

/* ------------------------------------------------------------------ */
/* Reader                                                             */
/* ------------------------------------------------------------------ */

struct reader {
    tz_read_fn read;
    void *opaque;
    struct dcp_err *err;
    uint64_t len;
};

/* A name made printable for a message. */
static const char *printable(char *dst, size_t cap, const uint8_t *s, size_t n)
{
    size_t i;

    for (i = 0; i < n && i + 1 < cap; i++)
        dst[i] = (s[i] >= 0x20 && s[i] < 0x7f) ? (char)s[i] : '?';
    dst[i] = '\0';
    return dst;
}

/* Reads [off, off + n), which the caller has checked to be in the item. */
static int rd(struct reader *r, uint64_t off, void *buf, size_t n)
{
    if (n == 0)
        return DCP_OK;
    return r->read(r->opaque, off, buf, n, r->err);
}

/* 1 when [off, off + n) lies inside [0, limit). */
static int inside(uint64_t off, uint64_t n, uint64_t limit)
{
    uint64_t end;
    return !dcp__add_overflow_u64(off, n, &end) && end <= limit;
}

struct dir_info {
    uint64_t n;
    uint64_t cd_off;
    uint64_t cd_size;
    uint64_t limit; /* first byte of the end records: the CD ends by it */
};

/* Finds the classic end record in the item's tail, scanning back over a
 * possible comment as zip readers do. *pos is its offset in tail. */
static int find_end_record(const uint8_t *tail, size_t tail_len, size_t *pos)
{
    size_t i = tail_len - END_LEN;

    for (;;) {
        if (dcp__le32(tail + i) == SIG_END &&
            dcp__le16(tail + i + 20) == tail_len - END_LEN - i) {
            *pos = i;
            return 1;
        }
        if (i == 0)
            return 0;
        i--;
    }
}

/* Parses the zip64 locator and end record that precede the classic end
 * record at end_off, overriding the classic fields in *d. */
static int read_zip64_end(struct reader *r, const uint8_t *loc,
                          uint64_t end_off, const uint8_t *end,
                          struct dir_info *d)
{
    uint64_t loc_off = end_off - Z64_LOCATOR_LEN, z64_off, rec_size;
    uint8_t z[Z64_END_LEN];
    int rc;

    z64_off = dcp__le64(loc + 8);
    if (dcp__le32(loc + 4) != 0 || dcp__le32(loc + 16) > 1)
        return dcp__err(r->err, DCP_EFORMAT,
                        "zip: multi-disk zip64 locator at byte %llu",
                        (ull)loc_off);
    if (!inside(z64_off, Z64_END_LEN, loc_off))
        return dcp__err(r->err, DCP_EFORMAT,
                        "zip: zip64 end record at byte %llu (locator at "
                        "byte %llu) is outside the item",
                        (ull)z64_off, (ull)loc_off);
    rc = rd(r, z64_off, z, sizeof(z));
    if (rc != DCP_OK)
        return rc;
    if (dcp__le32(z) != SIG_Z64_END)
        return dcp__err(r->err, DCP_EFORMAT,
                        "zip: bad zip64 end record signature at byte %llu",
                        (ull)z64_off);
    rec_size = dcp__le64(z + 4);
    if (rec_size < Z64_END_LEN - 12u ||
        !inside(z64_off + 12u, rec_size, loc_off))
        return dcp__err(r->err, DCP_EFORMAT,
                        "zip: bad zip64 end record size %llu at byte %llu",
                        (ull)rec_size, (ull)z64_off);
    if (dcp__le32(z + 16) != 0 || dcp__le32(z + 20) != 0)
        return dcp__err(r->err, DCP_EFORMAT,
                        "zip: multi-disk zip64 end record at byte %llu",
                        (ull)z64_off);
    if (dcp__le64(z + 24) != dcp__le64(z + 32))
        return dcp__err(r->err, DCP_EFORMAT,
                        "zip: zip64 end record at byte %llu counts %llu "
                        "entries on this disk of %llu",
                        (ull)z64_off, (ull)dcp__le64(z + 24),
                        (ull)dcp__le64(z + 32));
    /* The classic fields must agree unless they are placeholders, so that
     * no two readers can see different directories. */
    if ((dcp__le16(end + 8) != U16_MARK &&
         dcp__le16(end + 8) != dcp__le64(z + 24)) ||
        (dcp__le16(end + 10) != U16_MARK &&
         dcp__le16(end + 10) != dcp__le64(z + 32)) ||
        (dcp__le32(end + 12) != U32_MARK &&
         dcp__le32(end + 12) != dcp__le64(z + 40)) ||
        (dcp__le32(end + 16) != U32_MARK &&
         dcp__le32(end + 16) != dcp__le64(z + 48)))
        return dcp__err(r->err, DCP_EFORMAT,
                        "zip: end record at byte %llu disagrees with the "
                        "zip64 end record at byte %llu",
                        (ull)end_off, (ull)z64_off);
    d->n = dcp__le64(z + 32);
    d->cd_size = dcp__le64(z + 40);
    d->cd_off = dcp__le64(z + 48);
    d->limit = z64_off;
    return DCP_OK;
}

/* Reads the end records: where the central directory is and its count. */
static int read_end_records(struct reader *r, struct dir_info *d)
{
    size_t tail_len, pos;
    uint64_t tail_off, end_off;
    uint8_t *tail, locbuf[Z64_LOCATOR_LEN];
    const uint8_t *end, *loc = NULL;
    int rc;

    tail_len =
        r->len < MAX_COMMENT + END_LEN ? (size_t)r->len : MAX_COMMENT + END_LEN;
    tail_off = r->len - tail_len;
    tail = dcp__malloc(tail_len);
    if (!tail)
        return dcp__err(r->err, DCP_ENOMEM, "zip: out of memory");
    rc = rd(r, tail_off, tail, tail_len);
    if (rc != DCP_OK)
        goto out_free;
    if (!find_end_record(tail, tail_len, &pos)) {
        rc = dcp__err(r->err, DCP_EFORMAT,
                      "zip: bad end record signature at byte %llu",
                      (ull)(r->len - END_LEN));
        goto out_free;
    }
    end = tail + pos;
    end_off = tail_off + pos;
    if (dcp__le16(end + 4) != 0 && dcp__le16(end + 4) != U16_MARK) {
        rc = dcp__err(r->err, DCP_EFORMAT,
                      "zip: multi-disk archive (end record at byte %llu)",
                      (ull)end_off);
        goto out_free;
    }
    if (end_off >= Z64_LOCATOR_LEN) {
        if (pos >= Z64_LOCATOR_LEN) {
            loc = end - Z64_LOCATOR_LEN;
        } else {
            rc = rd(r, end_off - Z64_LOCATOR_LEN, locbuf, sizeof(locbuf));
            if (rc != DCP_OK)
                goto out_free;
            loc = locbuf;
        }
        if (dcp__le32(loc) != SIG_Z64_LOCATOR)
            loc = NULL;
    }
    if (loc) {
        rc = read_zip64_end(r, loc, end_off, end, d);
        goto out_free;
    }
    if (dcp__le16(end + 4) == U16_MARK || dcp__le16(end + 6) == U16_MARK ||
        dcp__le16(end + 8) == U16_MARK || dcp__le16(end + 10) == U16_MARK ||
        dcp__le32(end + 12) == U32_MARK || dcp__le32(end + 16) == U32_MARK) {
        rc = dcp__err(r->err, DCP_EFORMAT,
                      "zip: end record at byte %llu has zip64 placeholders "
                      "but no zip64 locator",
                      (ull)end_off);
        goto out_free;
    }
    if (dcp__le16(end + 6) != 0 || dcp__le16(end + 8) != dcp__le16(end + 10)) {
        rc = dcp__err(r->err, DCP_EFORMAT,
                      "zip: multi-disk archive (end record at byte %llu)",
                      (ull)end_off);
        goto out_free;
    }
    d->n = dcp__le16(end + 10);
    d->cd_size = dcp__le32(end + 12);
    d->cd_off = dcp__le32(end + 16);
    d->limit = end_off;
out_free:
    dcp__free(tail);
    return rc;
}

/* Takes the 64-bit values that a central entry's placeholders stand for
 * from its zip64 extra field (id 1), in the order the format fixes. */
static int apply_zip64_extra(struct reader *r, const uint8_t *x, size_t xlen,
                             uint64_t ent_off, uint64_t *uncomp, uint64_t *comp,
                             uint64_t *hdr, uint32_t *disk)
{
    size_t i = 0;

    while (i + 4 <= xlen) {
        uint16_t id = dcp__le16(x + i), len = dcp__le16(x + i + 2);
        const uint8_t *v = x + i + 4;
        size_t need = 0;

        if (len > xlen - i - 4)
            break;
        if (id == 1) {
            need = 8u * ((*uncomp == U32_MARK) + (*comp == U32_MARK) +
                         (*hdr == U32_MARK)) +
                   4u * (*disk == U16_MARK);
            if (len < need)
                break;
            if (*uncomp == U32_MARK) {
                *uncomp = dcp__le64(v);
                v += 8;
            }
            if (*comp == U32_MARK) {
                *comp = dcp__le64(v);
                v += 8;
            }
            if (*hdr == U32_MARK) {
                *hdr = dcp__le64(v);
                v += 8;
            }
            if (*disk == U16_MARK)
                *disk = dcp__le32(v);
            return DCP_OK;
        }
        i += 4u + len;
    }
    return dcp__err(r->err, DCP_EFORMAT,
                    "zip: central directory entry at byte %llu lacks the "
                    "zip64 extra its placeholders need",
                    (ull)ent_off);
}

/*
 * Finds the block-CRC field (TZ_BLK_ID) among a central entry's extra
 * fields x (xlen bytes); *at and *flen get its offset in x and whole
 * length (0: none). Fields are walked as zip readers do: another field
 * running past the end stops the walk (as apply_zip64_extra does); a
 * block-CRC field doing so, or a second one, is refused. check_blk_field checks the contents.
 */
static int find_blk_field(struct reader *r, const uint8_t *x, size_t xlen,
                          uint64_t ent_off, size_t *at, size_t *flen)
{
    size_t i = 0;

    *flen = 0;
    while (i + 4 <= xlen) {
        uint16_t id = dcp__le16(x + i), len = dcp__le16(x + i + 2);
        if (len > xlen - i - 4 && id == TZ_BLK_ID)
            return dcp__err(r->err, DCP_EFORMAT,
                            "zip: central directory entry at byte %llu has "
                            "a block-CRC field of %u bytes running past its "
                            "extra fields",
                            (ull)ent_off, (unsigned)len);
        if (len > xlen - i - 4)
            break;
        if (id == TZ_BLK_ID) {
            if (*flen)
                return dcp__err(r->err, DCP_EFORMAT,
                                "zip: central directory entry at byte %llu "
                                "has two block-CRC fields",
                                (ull)ent_off);
            *at = i;
            *flen = 4u + len;
        }
        i += 4u + len;
    }
    return DCP_OK;
}

/*
 * Checks a block-CRC field f (flen bytes, at item offset f_off) of entry e
 * (size and CRC known) and records it in e: version 1, zero reserved
 * bytes, a power-of-two block size in [TZ_BLK_MIN, TZ_BLK_MAX], the data
 * size equal to the entry's, exactly ceil(size / block) CRCs filling the
 * field (DCP_EFORMAT), and the CRCs combining to the entry's CRC
 * (DCP_ECORRUPT: the field or the CRC was damaged).
 */
static int check_blk_field(struct reader *r, struct tz_entry *e,
                           const uint8_t *f, size_t flen, uint64_t f_off,
                           const char *shown)
{
    uint64_t bsize, dsize, n, left;
    struct crc_blocks cb;

    if (flen < TZ_BLK_HEAD)
        return dcp__err(r->err, DCP_EFORMAT,
                        "zip: entry '%s': block-CRC field at byte %llu is "
                        "%zu bytes (at least %u)",
                        shown, (ull)f_off, flen, TZ_BLK_HEAD);
    if (dcp__le32(f + 4) != TZ_BLK_VERSION)
        return dcp__err(r->err, DCP_EFORMAT,
                        "zip: entry '%s': block-CRC field at byte %llu has "
                        "version/reserved word 0x%08x (1 expected)",
                        shown, (ull)f_off, (unsigned)dcp__le32(f + 4));
    bsize = dcp__le32(f + 8);
    dsize = dcp__le64(f + 12);
    if (bsize < TZ_BLK_MIN || bsize > TZ_BLK_MAX || (bsize & (bsize - 1)))
        return dcp__err(r->err, DCP_EFORMAT,
                        "zip: entry '%s': block-CRC field at byte %llu has "
                        "block size %llu (a power of two from %llu to %llu "
                        "expected)",
                        shown, (ull)f_off, (ull)bsize, (ull)TZ_BLK_MIN,
                        (ull)TZ_BLK_MAX);
    if (dsize != e->size)
        return dcp__err(r->err, DCP_EFORMAT,
                        "zip: entry '%s': block-CRC field at byte %llu "
                        "covers %llu bytes, the entry has %llu",
                        shown, (ull)f_off, (ull)dsize, (ull)e->size);
    n = dcp__tz_block_count(dsize, bsize);
    if ((flen - TZ_BLK_HEAD) % 4u || (flen - TZ_BLK_HEAD) / 4u != n)
        return dcp__err(r->err, DCP_EFORMAT,
                        "zip: entry '%s': block-CRC field at byte %llu holds "
                        "%zu bytes of CRCs, %llu blocks of %llu bytes need "
                        "%llu",
                        shown, (ull)f_off, flen - TZ_BLK_HEAD, (ull)n,
                        (ull)bsize, (ull)(4u * n));
    /* The CRCs must combine to the entry's CRC, so that checking every
     * block is checking the whole record. */
    dcp__crcb_init(&cb, bsize, NULL, 0);
    left = dsize;
    for (uint64_t k = 0; k < n; k++) {
        uint64_t len = left < bsize ? left : bsize;
        dcp__crcb_add_block(&cb, dcp__le32(f + TZ_BLK_HEAD + 4u * k), len);
        left -= len;
    }
    if (dcp__crcb_finish(&cb) != e->crc)
        return dcp__err(r->err, DCP_ECORRUPT,
                        "zip: entry '%s': the block CRCs at byte %llu do not "
                        "combine to the entry's CRC 0x%08x",
                        shown, (ull)f_off, (unsigned)e->crc);
    e->blk_size = bsize;
    e->blk_n = n;
    e->blk_at = f_off + TZ_BLK_HEAD;
    return DCP_OK;
}

/* The entries being parsed: a tz_archive's fixed array or a tz_file's. */
struct tz_list {
    char *sid; /* TZ_SID_MAX + 1 bytes, or NULL: save-id field ignored */
    char *prefix;
    struct tz_entry *ent;
    size_t n;
};

/* Checks a full record name and stores it, without the prefix, in e. */
static int take_name(struct reader *r, struct tz_list *a, struct tz_entry *e,
                     const uint8_t *name, size_t nlen, uint64_t ent_off)
{
    char shown[TZ_MAX_NAME + 1];
    size_t plen;
    const uint8_t *slash;

    printable(shown, sizeof(shown), name, nlen);
    if (nlen == 0 || nlen > TZ_MAX_NAME)
        return dcp__err(r->err, DCP_EFORMAT,
                        "zip: entry name of %zu bytes at byte %llu (limit %d)",
                        nlen, (ull)ent_off, TZ_MAX_NAME);
    if (memchr(name, '\0', nlen) || memchr(name, '\\', nlen))
        return dcp__err(r->err, DCP_EFORMAT,
                        "zip: entry name '%s' at byte %llu contains a NUL or "
                        "a backslash",
                        shown, (ull)ent_off);
    for (size_t i = 0; i + 1 < nlen; i++)
        if (name[i] == '.' && name[i + 1] == '.')
            return dcp__err(r->err, DCP_EFORMAT,
                            "zip: entry name '%s' at byte %llu contains '..'",
                            shown, (ull)ent_off);
    if (a->n == 0) {
        /* torch: the text before the first '/' of entry 0 is the prefix */
        slash = memchr(name, '/', nlen);
        if (!slash || slash == name)
            return dcp__err(r->err, DCP_EFORMAT,
                            "zip: first entry '%s' at byte %llu has no "
                            "archive prefix",
                            shown, (ull)ent_off);
        plen = (size_t)(slash - name);
        memcpy(a->prefix, name, plen);
        a->prefix[plen] = '\0';
    }
    plen = strlen(a->prefix);
    if (nlen <= plen + 1 || memcmp(name, a->prefix, plen) != 0 ||
        name[plen] != '/')
        return dcp__err(r->err, DCP_EFORMAT,
                        "zip: entry '%s' at byte %llu is outside the "
                        "archive prefix '%s'",
                        shown, (ull)ent_off, a->prefix);
    memcpy(e->name, name + plen + 1, nlen - plen - 1);
    e->name[nlen - plen - 1] = '\0';
    return DCP_OK;
}

/*
 * Takes the save-id field (TZ_SID_ID) among a central entry's extra fields
 * x (xlen bytes) into a->sid, walking as find_blk_field does: version 1,
 * 1 to TZ_SID_MAX printable ASCII bytes, the same id in every entry that
 * carries one (DCP_EFORMAT otherwise). A field running past the end stops
 * the walk.
 */
static int take_sid_field(struct reader *r, struct tz_list *a, const uint8_t *x,
                          size_t xlen, uint64_t ent_off)
{
    size_t i = 0, k, n;
    char id[TZ_SID_MAX + 1];
    while (a->sid && i + 4 <= xlen) {
        uint16_t fid = dcp__le16(x + i), len = dcp__le16(x + i + 2);
        if (len > xlen - i - 4)
            break;
        if (fid == TZ_SID_ID) {
            n = len >= 2 ? len - 2u : 0u;
            if (len < 3 || n > TZ_SID_MAX ||
                dcp__le16(x + i + 4) != TZ_SID_VERSION)
                return dcp__err(r->err, DCP_EFORMAT,
                                "zip: central directory entry at byte %llu "
                                "has a malformed save-id field",
                                (ull)ent_off);
            for (k = 0; k < n; k++) {
                id[k] = (char)x[i + 6 + k];
                if (x[i + 6 + k] < 0x21 || x[i + 6 + k] > 0x7e)
                    return dcp__err(r->err, DCP_EFORMAT,
                                    "zip: central directory entry at byte "
                                    "%llu has a save-id field that is not "
                                    "printable",
                                    (ull)ent_off);
            }
            id[n] = '\0';
            if (a->sid[0] && strcmp(a->sid, id) != 0)
                return dcp__err(r->err, DCP_EFORMAT,
                                "zip: central directory entry at byte %llu "
                                "has save id '%s', another entry '%s'",
                                (ull)ent_off, id, a->sid);
            memcpy(a->sid, id, n + 1);
        }
        i += 4u + len;
    }
    return DCP_OK;
}

/* Parses one central directory entry at cd[*pos], advancing *pos. */
static int parse_central_entry(struct reader *r, struct tz_list *a,
                               const uint8_t *cd, uint64_t cd_size,
                               uint64_t cd_off, size_t *pos)
{
    struct tz_entry *e = &a->ent[a->n];
    const uint8_t *p = cd + *pos;
    uint64_t ent_off = cd_off + *pos, uncomp, comp, hdr;
    uint32_t disk;
    size_t nlen, xlen, clen, blk_at = 0, blk_len = 0;
    uint16_t flags, method;
    char shown[TZ_MAX_NAME + 1];
    int rc;

    if (cd_size - *pos < CENTRAL_LEN)
        return dcp__err(r->err, DCP_EFORMAT,
                        "zip: central directory entry at byte %llu is "
                        "truncated",
                        (ull)ent_off);
    if (dcp__le32(p) != SIG_CENTRAL)
        return dcp__err(r->err, DCP_EFORMAT,
                        "zip: bad central directory signature at byte %llu",
                        (ull)ent_off);
    flags = dcp__le16(p + 8);
    method = dcp__le16(p + 10);
    nlen = dcp__le16(p + 28);
    xlen = dcp__le16(p + 30);
    clen = dcp__le16(p + 32);
    if (cd_size - *pos - CENTRAL_LEN < nlen + xlen + clen)
        return dcp__err(r->err, DCP_EFORMAT,
                        "zip: central directory entry at byte %llu runs past "
                        "the directory's end",
                        (ull)ent_off);
    rc = find_blk_field(r, p + CENTRAL_LEN + nlen, xlen, ent_off, &blk_at,
                        &blk_len);
    if (rc == DCP_OK)
        rc = take_sid_field(r, a, p + CENTRAL_LEN + nlen, xlen, ent_off);
    if (rc != DCP_OK)
        return rc;
    if (xlen + clen - blk_len > MAX_CD_EXTRA)
        return dcp__err(r->err, DCP_EFORMAT,
                        "zip: central directory entry at byte %llu has %zu "
                        "bytes of extra fields and comment (limit %u)",
                        (ull)ent_off, xlen + clen - blk_len, MAX_CD_EXTRA);
    rc = take_name(r, a, e, p + CENTRAL_LEN, nlen, ent_off);
    if (rc != DCP_OK)
        return rc;
    printable(shown, sizeof(shown), p + CENTRAL_LEN, nlen);
    if (flags & FLAG_ENCRYPTED)
        return dcp__err(r->err, DCP_EFORMAT,
                        "zip: entry '%s' at byte %llu is encrypted", shown,
                        (ull)ent_off);
    if (method != 0)
        return dcp__err(r->err, DCP_EFORMAT,
                        "zip: entry '%s' at byte %llu is compressed "
                        "(method %u)",
                        shown, (ull)ent_off, method);
    uncomp = dcp__le32(p + 24);
    comp = dcp__le32(p + 20);
    hdr = dcp__le32(p + 42);
    disk = dcp__le16(p + 34);
    if (uncomp == U32_MARK || comp == U32_MARK || hdr == U32_MARK ||
        disk == U16_MARK) {
        rc = apply_zip64_extra(r, p + CENTRAL_LEN + nlen, xlen, ent_off,
                               &uncomp, &comp, &hdr, &disk);
        if (rc != DCP_OK)
            return rc;
    }
    if (disk != 0)
        return dcp__err(r->err, DCP_EFORMAT,
                        "zip: entry '%s' at byte %llu is on disk %u", shown,
                        (ull)ent_off, disk);
    if (comp != uncomp)
        return dcp__err(r->err, DCP_EFORMAT,
                        "zip: entry '%s' at byte %llu has compressed size "
                        "%llu but size %llu",
                        shown, (ull)ent_off, (ull)comp, (ull)uncomp);
    e->header_off = hdr;
    e->size = uncomp;
    e->crc = dcp__le32(p + 16);
    e->blk_size = e->blk_n = e->blk_at = 0;
    if (blk_len) {
        rc = check_blk_field(r, e, p + CENTRAL_LEN + nlen + blk_at, blk_len,
                             ent_off + CENTRAL_LEN + nlen + blk_at, shown);
        if (rc != DCP_OK)
            return rc;
    }
    *pos += CENTRAL_LEN + nlen + xlen + clen;
    a->n++;
    return DCP_OK;
}

/* Reads the local header of e (whose full name is full, nlen bytes) and
 * sets e->data_off; the record must end before the central directory. */
static int read_local_header(struct reader *r, struct tz_entry *e,
                             const char *full, size_t nlen, uint64_t cd_off)
{
    uint8_t h[LOCAL_LEN + TZ_MAX_NAME];
    char shown[TZ_MAX_NAME + 1];
    uint64_t end;
    int rc;

    printable(shown, sizeof(shown), (const uint8_t *)full, nlen);
    if (!inside(e->header_off, LOCAL_LEN + nlen, cd_off))
        return dcp__err(r->err, DCP_EFORMAT,
                        "zip: local header of '%s' at byte %llu is outside "
                        "the records (central directory at byte %llu)",
                        shown, (ull)e->header_off, (ull)cd_off);
    rc = rd(r, e->header_off, h, LOCAL_LEN + nlen);
    if (rc != DCP_OK)
        return rc;
    if (dcp__le32(h) != SIG_LOCAL)
        return dcp__err(r->err, DCP_EFORMAT,
                        "zip: bad local header signature at byte %llu",
                        (ull)e->header_off);
    if (dcp__le16(h + 26) != nlen || memcmp(h + LOCAL_LEN, full, nlen) != 0) {
        char local[TZ_MAX_NAME + 1];
        size_t ln = dcp__le16(h + 26) < nlen ? dcp__le16(h + 26) : nlen;
        return dcp__err(r->err, DCP_EFORMAT,
                        "zip: local header at byte %llu names '%s', the "
                        "central directory '%s'",
                        (ull)e->header_off,
                        printable(local, sizeof(local), h + LOCAL_LEN, ln),
                        shown);
    }
    if ((dcp__le16(h + 6) & FLAG_ENCRYPTED) || dcp__le16(h + 8) != 0)
        return dcp__err(r->err, DCP_EFORMAT,
                        "zip: local header of '%s' at byte %llu says the "
                        "entry is encrypted or compressed",
                        shown, (ull)e->header_off);
    e->data_off = e->header_off + LOCAL_LEN + nlen + dcp__le16(h + 28);
    if (dcp__add_overflow_u64(e->data_off, e->size, &end) || end > cd_off)
        return dcp__err(r->err, DCP_EFORMAT,
                        "zip: data of '%s' at byte %llu (%llu bytes) runs "
                        "past byte %llu",
                        shown, (ull)e->data_off, (ull)e->size, (ull)cd_off);
    return DCP_OK;
}

static int cmp_ent_name(const void *x, const void *y)
{
    const struct tz_entry *a = *(const struct tz_entry *const *)x;
    const struct tz_entry *b = *(const struct tz_entry *const *)y;
    int c = strcmp(a->name, b->name);
    return c ? c : (a < b ? -1 : a > b);
}

static int cmp_ent_off(const void *x, const void *y)
{
    const struct tz_entry *a = *(const struct tz_entry *const *)x;
    const struct tz_entry *b = *(const struct tz_entry *const *)y;
    if (a->header_off != b->header_off)
        return a->header_off < b->header_off ? -1 : 1;
    return a < b ? -1 : a > b;
}

/* No two records (local header through data) may share a byte, and names
 * must be unique (the first entry, in directory order, that repeats an
 * earlier name is reported). O(n log n). */
static int check_disjoint(struct reader *r, const struct tz_list *a)
{
    const struct tz_entry **o, *dup = NULL;
    int rc = DCP_OK;

    if (a->n < 2)
        return DCP_OK;
    o = dcp__malloc(a->n * sizeof(*o));
    if (!o)
        return dcp__err(r->err, DCP_ENOMEM, "zip: out of memory");
    for (size_t i = 0; i < a->n; i++)
        o[i] = &a->ent[i];
    qsort((void *)o, a->n, sizeof(*o), cmp_ent_name);
    for (size_t i = 1; i < a->n; i++)
        if (strcmp(o[i - 1]->name, o[i]->name) == 0 && (!dup || o[i] < dup))
            dup = o[i];
    if (dup) {
        rc = dcp__err(r->err, DCP_EFORMAT,
                      "zip: duplicate entry '%s/%s' at byte %llu", a->prefix,
                      dup->name, (ull)dup->header_off);
        goto out;
    }
    qsort((void *)o, a->n, sizeof(*o), cmp_ent_off);
    for (size_t i = 1; i < a->n; i++) {
        const struct tz_entry *p = o[i - 1], *q = o[i];
        if (p->data_off + p->size > q->header_off) {
            rc = dcp__err(r->err, DCP_EFORMAT,
                          "zip: records '%s' and '%s' overlap at byte %llu",
                          p->name, q->name, (ull)q->header_off);
            break;
        }
    }
out:
    dcp__free((void *)o);
    return rc;
}

/*
 * Parses the directory of an item of r->len bytes into l: at most max
 * entries; with alloc, l->ent is allocated for the count the end record
 * gives (the caller frees it, also on failure).
 */
static int open_core(struct reader *r, struct tz_list *l, size_t max, int alloc)
{
    struct dir_info d = {0};
    struct dcp_err *err = r->err;
    uint64_t max_cd;
    uint8_t *cd = NULL;
    size_t pos = 0;
    int rc;

    if (r->len < END_LEN)
        return dcp__err(err, DCP_ECORRUPT,
                        "zip: item of %llu bytes is shorter than an end "
                        "record",
                        (ull)r->len);
    rc = read_end_records(r, &d);
    if (rc != DCP_OK)
        goto out;
    if (d.n == 0 || d.n > max) {
        rc = dcp__err(err, DCP_EFORMAT,
                      "zip: %llu entries in the central directory at byte "
                      "%llu (limit %zu)",
                      (ull)d.n, (ull)d.cd_off, max);
        goto out;
    }
    if (!inside(d.cd_off, d.cd_size, d.limit)) {
        rc = dcp__err(err, DCP_EFORMAT,
                      "zip: central directory at byte %llu (%llu bytes) runs "
                      "past byte %llu",
                      (ull)d.cd_off, (ull)d.cd_size, (ull)d.limit);
        goto out;
    }
    max_cd = (uint64_t)max * (CENTRAL_LEN + TZ_MAX_NAME + MAX_CD_EXTRA) +
             MAX_CD_BLK;
    if (d.cd_size > max_cd) {
        rc = dcp__err(err, DCP_EFORMAT,
                      "zip: central directory at byte %llu is %llu bytes "
                      "(limit %llu)",
                      (ull)d.cd_off, (ull)d.cd_size, (ull)max_cd);
        goto out;
    }
    if (alloc) {
        l->ent = dcp__calloc((size_t)d.n, sizeof(*l->ent));
        if (!l->ent) {
            rc = dcp__err(err, DCP_ENOMEM, "zip: out of memory");
            goto out;
        }
    }
    cd = dcp__malloc(d.cd_size ? (size_t)d.cd_size : 1);
    if (!cd) {
        rc = dcp__err(err, DCP_ENOMEM, "zip: out of memory");
        goto out;
    }
    rc = rd(r, d.cd_off, cd, (size_t)d.cd_size);
    if (rc != DCP_OK)
        goto out;
    while (rc == DCP_OK && l->n < d.n)
        rc = parse_central_entry(r, l, cd, d.cd_size, d.cd_off, &pos);
    if (rc != DCP_OK)
        goto out;
    if (pos != d.cd_size) {
        rc = dcp__err(err, DCP_EFORMAT,
                      "zip: %llu stray bytes after the central directory "
                      "entries at byte %llu",
                      (ull)(d.cd_size - pos), (ull)(d.cd_off + pos));
        goto out;
    }
    pos = 0;
    for (size_t i = 0; rc == DCP_OK && i < l->n; i++) {
        const uint8_t *p = cd + pos;
        size_t nlen = dcp__le16(p + 28);
        rc = read_local_header(r, &l->ent[i], (const char *)p + CENTRAL_LEN,
                               nlen, d.cd_off);
        pos += CENTRAL_LEN + nlen + dcp__le16(p + 30) + dcp__le16(p + 32);
    }
    if (rc == DCP_OK)
        rc = check_disjoint(r, l);
out:
    dcp__free(cd);
    if (rc != DCP_OK)
        l->n = 0;
    return rc;
}

int dcp__tz_open(struct tz_archive *a, uint64_t item_len, tz_read_fn read,
            void *opaque, struct dcp_err *err)
{
    struct reader r = {read, opaque, err, item_len};
    struct tz_list l;
    int rc;

    if (!a || !read)
        return dcp__err(err, DCP_EINVAL, "zip: invalid argument");
    memset(a, 0, sizeof(*a));
    a->item_len = item_len;
    l.sid = a->save_id;
    l.prefix = a->prefix;
    l.ent = a->ent;
    l.n = 0;
    rc = open_core(&r, &l, TZ_MAX_ENTRIES, 0);
    a->n = l.n;
    return rc;
}

int dcp__tz_file_open(struct tz_file *f, uint64_t len, size_t max_entries,
                 tz_read_fn read, void *opaque, struct dcp_err *err)
{
    struct reader r = {read, opaque, err, len};
    struct tz_list l;
    int rc;

    if (!f || !read || max_entries == 0)
        return dcp__err(err, DCP_EINVAL, "zip: invalid argument");
    memset(f, 0, sizeof(*f));
    f->item_len = len;
    l.sid = NULL;
    l.prefix = f->prefix;
    l.ent = NULL;
    l.n = 0;
    rc = open_core(&r, &l, max_entries, 1);
    f->ent = l.ent;
    f->n = l.n;
    if (rc == DCP_OK) {
        f->byname = dcp__malloc((f->n ? f->n : 1) * sizeof(*f->byname));
        if (!f->byname) {
            rc = dcp__err(err, DCP_ENOMEM, "zip: out of memory");
        } else {
            for (size_t i = 0; i < f->n; i++)
                f->byname[i] = &f->ent[i];
            qsort((void *)f->byname, f->n, sizeof(*f->byname), cmp_ent_name);
        }
    }
    if (rc != DCP_OK)
        dcp__tz_file_release(f);
    return rc;
}

void dcp__tz_file_release(struct tz_file *f)
{
    if (!f)
        return;
    dcp__free(f->ent);
    dcp__free((void *)f->byname);
    memset(f, 0, sizeof(*f));
}

const struct tz_entry *dcp__tz_file_find(const struct tz_file *f, const char *name)
{
    size_t lo = 0, hi;
    if (!f || !name)
        return NULL;
    hi = f->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(f->byname[mid]->name, name);
        if (c == 0)
            return f->byname[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

int dcp__tz_read_block_crcs(const struct tz_entry *e, uint64_t first,
                            size_t n, tz_read_fn read, void *opaque,
                            uint32_t *out, struct dcp_err *err)
{
    uint8_t buf[1024];
    size_t done = 0;

    if (!e || !read || (n && !out) || first > e->blk_n || n > e->blk_n - first)
        return dcp__err(err, DCP_EINVAL, "zip: block CRCs out of range");
    while (done < n) {
        size_t k = n - done > sizeof(buf) / 4 ? sizeof(buf) / 4 : n - done;
        int rc = read(opaque, e->blk_at + 4u * (first + done), buf, 4u * k,
                      err);
        if (rc != DCP_OK)
            return rc;
        for (size_t i = 0; i < k; i++)
            out[done + i] = dcp__le32(buf + 4u * i);
        done += k;
    }
    return DCP_OK;
}

const struct tz_entry *dcp__tz_find(const struct tz_archive *a, const char *name)
{
    if (!a || !name)
        return NULL;
    for (size_t i = 0; i < a->n; i++)
        if (strcmp(a->ent[i].name, name) == 0)
            return &a->ent[i];
    return NULL;
}

static int read_entry(const char *prefix, uint64_t item_len,
                      const struct tz_entry *e, size_t max, int verify,
                      tz_read_fn read, void *opaque, uint8_t **out,
                      struct dcp_err *err)
{
    uint8_t *buf;
    uint32_t crc;
    int rc;

    if (out)
        *out = NULL;
    if (!e || !read || !out)
        return dcp__err(err, DCP_EINVAL, "zip: invalid argument");
    if (e->size > max)
        return dcp__err(err, DCP_ELIMIT,
                        "zip: entry '%s/%s' is %llu bytes (limit %zu)", prefix,
                        e->name, (ull)e->size, max);
    if (!inside(e->data_off, e->size, item_len))
        return dcp__err(err, DCP_EFORMAT,
                        "zip: data of '%s/%s' at byte %llu runs past the "
                        "item's end",
                        prefix, e->name, (ull)e->data_off);
    buf = dcp__malloc(e->size ? (size_t)e->size : 1);
    if (!buf)
        return dcp__err(err, DCP_ENOMEM, "zip: out of memory");
    rc =
        e->size ? read(opaque, e->data_off, buf, (size_t)e->size, err) : DCP_OK;
    if (rc == DCP_OK && verify) {
        crc = dcp__crc32(0, buf, (size_t)e->size);
        if (crc != e->crc)
            rc = dcp__err(err, DCP_ECORRUPT,
                          "zip: crc mismatch in '%s/%s' at byte %llu: "
                          "recorded %08x, computed %08x",
                          prefix, e->name, (ull)e->data_off, (unsigned)e->crc,
                          (unsigned)crc);
    }
    if (rc != DCP_OK) {
        dcp__free(buf);
        return rc;
    }
    *out = buf;
    return DCP_OK;
}

int dcp__tz_read_entry(const struct tz_archive *a, const struct tz_entry *e,
                  size_t max, int verify, tz_read_fn read, void *opaque,
                  uint8_t **out, struct dcp_err *err)
{
    if (out)
        *out = NULL;
    if (!a)
        return dcp__err(err, DCP_EINVAL, "zip: invalid argument");
    return read_entry(a->prefix, a->item_len, e, max, verify, read, opaque, out,
                      err);
}

int dcp__tz_file_read_entry(const struct tz_file *f, const struct tz_entry *e,
                       size_t max, int verify, tz_read_fn read, void *opaque,
                       uint8_t **out, struct dcp_err *err)
{
    if (out)
        *out = NULL;
    if (!f)
        return dcp__err(err, DCP_EINVAL, "zip: invalid argument");
    return read_entry(f->prefix, f->item_len, e, max, verify, read, opaque, out,
                      err);
}

/* ------------------------------------------------------------------ */
/* data.pkl of one tensor                                             */
/* ------------------------------------------------------------------ */

enum g_role {
    G_REBUILD_V2,
    G_REBUILD_V3,
    G_REBUILD_QTENSOR,
    G_QSCHEME,
    G_STORAGE, /* a typed storage class: global_dt */
    G_UNTYPED, /* bytes */
    G_DTYPE,   /* torch.<dtype>: global_dt */
    G_ORDERED_DICT,
    G_SIZE
};

/* The allow-list, with what each global means here. Unsupported dtypes and
 * storages are listed so that they fail as DCP_ENOTSUP, not DCP_EUNSAFE. */
#define TZ_GLOBALS(XX)                                        \
    XX("torch._utils", "_rebuild_tensor_v2", G_REBUILD_V2)    \
    XX("torch._utils", "_rebuild_tensor_v3", G_REBUILD_V3)    \
    XX("torch._utils", "_rebuild_qtensor", G_REBUILD_QTENSOR) \
    XX("torch", "per_tensor_affine", G_QSCHEME)               \
    XX("torch", "per_channel_affine", G_QSCHEME)              \
    XX("torch", "per_tensor_symmetric", G_QSCHEME)            \
    XX("torch", "per_channel_symmetric", G_QSCHEME)           \
    XX("torch", "per_channel_affine_float_qparams", G_QSCHEME)\
    XX("collections", "OrderedDict", G_ORDERED_DICT)          \
    XX("torch", "Size", G_SIZE)                               \
    XX("torch.storage", "UntypedStorage", G_UNTYPED)          \
    XX("torch", "UntypedStorage", G_UNTYPED)                  \
    XX("torch", "DoubleStorage", G_STORAGE)                   \
    XX("torch", "FloatStorage", G_STORAGE)                    \
    XX("torch", "HalfStorage", G_STORAGE)                     \
    XX("torch", "BFloat16Storage", G_STORAGE)                 \
    XX("torch", "LongStorage", G_STORAGE)                     \
    XX("torch", "IntStorage", G_STORAGE)                      \
    XX("torch", "ShortStorage", G_STORAGE)                    \
    XX("torch", "CharStorage", G_STORAGE)                     \
    XX("torch", "ByteStorage", G_STORAGE)                     \
    XX("torch", "BoolStorage", G_STORAGE)                     \
    XX("torch", "ComplexDoubleStorage", G_STORAGE)            \
    XX("torch", "ComplexFloatStorage", G_STORAGE)             \
    XX("torch", "QUInt8Storage", G_STORAGE)                   \
    XX("torch", "QInt8Storage", G_STORAGE)                    \
    XX("torch", "QInt32Storage", G_STORAGE)                   \
    XX("torch", "QUInt4x2Storage", G_STORAGE)                 \
    XX("torch", "QUInt2x4Storage", G_STORAGE)                 \
    XX("torch", "float64", G_DTYPE)                           \
    XX("torch", "float32", G_DTYPE)                           \
    XX("torch", "float16", G_DTYPE)                           \
    XX("torch", "bfloat16", G_DTYPE)                          \
    XX("torch", "float8_e4m3fn", G_DTYPE)                     \
    XX("torch", "float8_e5m2", G_DTYPE)                       \
    XX("torch", "int64", G_DTYPE)                             \
    XX("torch", "int32", G_DTYPE)                             \
    XX("torch", "int16", G_DTYPE)                             \
    XX("torch", "int8", G_DTYPE)                              \
    XX("torch", "uint8", G_DTYPE)                             \
    XX("torch", "bool", G_DTYPE)                              \
    XX("torch", "float8_e4m3fnuz", G_DTYPE)                   \
    XX("torch", "float8_e5m2fnuz", G_DTYPE)                   \
    XX("torch", "float8_e8m0fnu", G_DTYPE)                    \
    XX("torch", "float4_e2m1fn_x2", G_DTYPE)                  \
    XX("torch", "complex32", G_DTYPE)                         \
    XX("torch", "complex64", G_DTYPE)                         \
    XX("torch", "complex128", G_DTYPE)                        \
    XX("torch", "uint16", G_DTYPE)                            \
    XX("torch", "uint32", G_DTYPE)                            \
    XX("torch", "uint64", G_DTYPE)                            \
    XX("torch", "qint8", G_DTYPE)                             \
    XX("torch", "quint8", G_DTYPE)                            \
    XX("torch", "qint32", G_DTYPE)                            \
    XX("torch", "quint4x2", G_DTYPE)                          \
    XX("torch", "quint2x4", G_DTYPE)                          \
    XX("torch", "bits1x8", G_DTYPE)                           \
    XX("torch", "bits2x4", G_DTYPE)                           \
    XX("torch", "bits4x2", G_DTYPE)                           \
    XX("torch", "bits8", G_DTYPE)                             \
    XX("torch", "bits16", G_DTYPE)

#define TZ_GLOBAL_ENTRY(mod, name, role) {mod, name},
static const struct pk_global tensor_allow[] = {TZ_GLOBALS(TZ_GLOBAL_ENTRY)};
#undef TZ_GLOBAL_ENTRY

static const int tensor_roles[] = {
#define TZ_GLOBAL_ROLE(mod, name, role) role,
    TZ_GLOBALS(TZ_GLOBAL_ROLE)
#undef TZ_GLOBAL_ROLE
};

/* The role of a global node, or -1. */
static int global_role(const struct pk_node *n)
{
    if (!n || n->kind != PK_GLOBAL || n->u.g.id < 0 ||
        (size_t)n->u.g.id >= DCP_ARRAY_LEN(tensor_roles))
        return -1;
    return tensor_roles[n->u.g.id];
}

/* The element type a storage class or dtype global names (from the one
 * dtype table), bytes for UntypedStorage, or 0 when dcp does not hold it. */
static int global_dt(const struct pk_node *n)
{
    dcp_dtype dt;
    switch (global_role(n)) {
    case G_UNTYPED:
        return DCP_U8;
    case G_STORAGE:
        return dcp__dtype_from_storage(n->u.g.name, &dt) ? (int)dt : 0;
    case G_DTYPE:
        return dcp__dtype_from_torch(n->u.g.name, strlen(n->u.g.name), &dt)
                   ? (int)dt
                   : 0;
    default:
        return 0;
    }
}

static int is_seq(const struct pk_node *n)
{
    return n && (n->kind == PK_TUPLE || n->kind == PK_LIST);
}

/* A shape or stride argument: a tuple or list of ints, possibly wrapped
 * in torch.Size(...). Returns the sequence node or NULL. */
static const struct pk_node *int_seq(const struct pk_node *n)
{
    if (n && n->kind == PK_OBJ && global_role(n->u.obj.callable) == G_SIZE &&
        n->u.obj.args && n->u.obj.args->kind == PK_TUPLE &&
        n->u.obj.args->u.seq.n == 1)
        n = n->u.obj.args->u.seq.v[0];
    if (!is_seq(n))
        return NULL;
    for (size_t i = 0; i < n->u.seq.n; i++)
        if (n->u.seq.v[i]->kind != PK_INT)
            return NULL;
    return n;
}

static int is_str(const struct pk_node *n, const char *s)
{
    return n && (n->kind == PK_STR || n->kind == PK_BYTES) &&
           n->u.s.len == strlen(s) && memcmp(n->u.s.p, s, n->u.s.len) == 0;
}

static size_t elem_size(int dt)
{
    return dcp_dtype_size((dcp_dtype)dt);
}

static const char *global_text(char *buf, size_t cap, const struct pk_node *g)
{
    (void)snprintf(buf, cap, "%s.%s", g->u.g.module, g->u.g.name);
    return buf;
}

/* The persistent id ("storage", type, key, location, numel): the storage's
 * element type, key and byte count. */
static int parse_storage(const struct pk_node *st, struct tz_tensor *t,
                         int *storage_dt, uint64_t *storage_bytes,
                         struct dcp_err *err)
{
    const struct pk_node *pid, *type, *key, *numel;
    char what[128];

    if (!st || st->kind != PK_PERSID || !st->u.pid ||
        st->u.pid->kind != PK_TUPLE || st->u.pid->u.seq.n != 5)
        return dcp__err(err, DCP_EFORMAT,
                        "data.pkl: the storage is not a persistent id "
                        "('storage', type, key, location, numel)");
    pid = st->u.pid;
    type = pid->u.seq.v[1];
    key = pid->u.seq.v[2];
    numel = pid->u.seq.v[4];
    if (!is_str(pid->u.seq.v[0], "storage") ||
        (global_role(type) != G_STORAGE && global_role(type) != G_UNTYPED) ||
        key->kind != PK_STR || pid->u.seq.v[3]->kind != PK_STR ||
        numel->kind != PK_INT)
        return dcp__err(err, DCP_EFORMAT,
                        "data.pkl: malformed storage persistent id");
    if (key->u.s.len == 0 || key->u.s.len > TZ_MAX_NAME ||
        memchr(key->u.s.p, '\0', key->u.s.len))
        return dcp__err(err, DCP_EFORMAT,
                        "data.pkl: bad storage key of %zu bytes", key->u.s.len);
    if (global_dt(type) == 0)
        return dcp__err(err, DCP_ENOTSUP,
                        "data.pkl: storage type '%s' is not supported",
                        global_text(what, sizeof(what), type));
    if (numel->u.i < 0 ||
        dcp__mul_overflow_u64((uint64_t)numel->u.i, elem_size(global_dt(type)),
                              storage_bytes))
        return dcp__err(err, DCP_EFORMAT, "data.pkl: bad storage size %lld",
                        (long long)numel->u.i);
    memcpy(t->key, key->u.s.p, key->u.s.len);
    t->key[key->u.s.len] = '\0';
    *storage_dt = global_dt(type);
    return DCP_OK;
}

/* Shape, strides and offset, and whether the view fits the storage. */
static int parse_view(const struct pk_node *const *args, struct tz_tensor *t,
                      struct dcp_err *err)
{
    const struct pk_node *size = int_seq(args[2]), *stride = int_seq(args[3]);
    int64_t numel, last;

    if (args[1]->kind != PK_INT || !size || !stride)
        return dcp__err(err, DCP_EFORMAT,
                        "data.pkl: storage offset, size or stride is not "
                        "made of ints");
    if (size->u.seq.n > DCP_MAX_NDIM)
        return dcp__err(err, DCP_ELIMIT,
                        "data.pkl: tensor of %zu dimensions (limit %d)",
                        size->u.seq.n, DCP_MAX_NDIM);
    if (stride->u.seq.n != size->u.seq.n)
        return dcp__err(err, DCP_EFORMAT, "data.pkl: %zu sizes but %zu strides",
                        size->u.seq.n, stride->u.seq.n);
    t->ndim = (int)size->u.seq.n;
    t->storage_offset = args[1]->u.i;
    if (t->storage_offset < 0)
        return dcp__err(err, DCP_EFORMAT,
                        "data.pkl: negative storage offset %lld",
                        (long long)t->storage_offset);
    last = t->storage_offset;
    for (int i = 0; i < t->ndim; i++) {
        t->size[i] = size->u.seq.v[i]->u.i;
        t->stride[i] = stride->u.seq.v[i]->u.i;
        if (t->size[i] < 0 || t->stride[i] < 0)
            return dcp__err(err, DCP_EFORMAT,
                            "data.pkl: negative size or stride in dimension "
                            "%d (%lld, %lld)",
                            i, (long long)t->size[i], (long long)t->stride[i]);
    }
    numel = dcp__shape_numel(t->ndim, t->size);
    if (numel < 0)
        return dcp__err(err, DCP_EFORMAT, "data.pkl: element count overflows");
    if (numel > 0) {
        for (int i = 0; i < t->ndim; i++) {
            int64_t step;
            if (dcp__mul_overflow_i64(t->size[i] - 1, t->stride[i], &step) ||
                dcp__add_overflow_i64(last, step, &last))
                return dcp__err(err, DCP_EFORMAT,
                                "data.pkl: view extent overflows");
        }
    }
    if ((uint64_t)t->storage_offset > t->storage_numel ||
        (numel > 0 && (uint64_t)last >= t->storage_numel))
        return dcp__err(err, DCP_EFORMAT,
                        "data.pkl: view (offset %lld, last element %lld) "
                        "runs outside its storage of %llu elements",
                        (long long)t->storage_offset, (long long)last,
                        (ull)t->storage_numel);
    return DCP_OK;
}

static int interpret_tensor(const struct pk_node *root, struct tz_tensor *t,
                            struct dcp_err *err)
{
    const struct pk_node *args, *meta = NULL;
    const struct pk_node *const *v;
    int role, storage_dt = 0, dt;
    uint64_t storage_bytes = 0;
    size_t nargs, esize;
    char what[128];
    int rc;

    role = root && root->kind == PK_OBJ && !root->newobj
               ? global_role(root->u.obj.callable)
               : -1;
    if (role == G_REBUILD_QTENSOR)
        return dcp__err(err, DCP_ENOTSUP,
                        "data.pkl: quantized tensors are not supported");
    if (role != G_REBUILD_V2 && role != G_REBUILD_V3)
        return dcp__err(err, DCP_EFORMAT,
                        "data.pkl: not a tensor (no _rebuild_tensor_v2/v3 "
                        "call at the top)");
    args = root->u.obj.args;
    nargs = args && args->kind == PK_TUPLE ? args->u.seq.n : 0;
    if ((role == G_REBUILD_V2 && (nargs < 6 || nargs > 7)) ||
        (role == G_REBUILD_V3 && (nargs < 7 || nargs > 8)))
        return dcp__err(err, DCP_EFORMAT, "data.pkl: %s with %zu arguments",
                        role == G_REBUILD_V2 ? "_rebuild_tensor_v2"
                                             : "_rebuild_tensor_v3",
                        nargs);
    v = (const struct pk_node *const *)args->u.seq.v;
    if (nargs == (role == G_REBUILD_V2 ? 7u : 8u))
        meta = v[nargs - 1];
    rc = parse_storage(v[0], t, &storage_dt, &storage_bytes, err);
    if (rc != DCP_OK)
        return rc;
    dt = storage_dt;
    if (role == G_REBUILD_V3) {
        if (global_role(v[6]) != G_DTYPE)
            return dcp__err(err, DCP_EFORMAT,
                            "data.pkl: _rebuild_tensor_v3 without a dtype");
        dt = global_dt(v[6]);
        if (dt == 0)
            return dcp__err(err, DCP_ENOTSUP,
                            "data.pkl: dtype '%s' is not supported",
                            global_text(what, sizeof(what), v[6]));
    }
    /* conj/neg bits would change the values' meaning */
    if (meta && meta->kind != PK_NONE &&
        !(meta->kind == PK_DICT && meta->u.seq.n == 0))
        return dcp__err(err, DCP_ENOTSUP,
                        "data.pkl: tensor metadata (conj or neg bits) is "
                        "not supported");
    esize = elem_size(dt);
    if (storage_bytes % esize != 0)
        return dcp__err(err, DCP_EFORMAT,
                        "data.pkl: storage of %llu bytes is not a whole "
                        "number of %zu-byte elements",
                        (ull)storage_bytes, esize);
    t->dtype = (dcp_dtype)dt;
    t->storage_numel = storage_bytes / esize;
    return parse_view(v, t, err);
}

size_t dcp__tz_tensor_globals(const struct pk_global **out)
{
    *out = tensor_allow;
    return DCP_ARRAY_LEN(tensor_allow);
}

int dcp__tz_tensor_from_node(const struct pk_node *n, struct tz_tensor *t,
                        struct dcp_err *err)
{
    int rc;

    if (!t)
        return dcp__err(err, DCP_EINVAL, "data.pkl: invalid argument");
    memset(t, 0, sizeof(*t));
    rc = interpret_tensor(n, t, err);
    if (rc != DCP_OK)
        memset(t, 0, sizeof(*t));
    return rc;
}

int dcp__tz_parse_tensor_pickle(const void *pkl, size_t len, struct tz_tensor *t,
                           struct dcp_err *err)
{
    struct pk_limits lim;
    struct pk_arena *arena = NULL;
    struct pk_node *root = NULL;
    int rc;

    if (!t || (len > 0 && !pkl))
        return dcp__err(err, DCP_EINVAL, "data.pkl: invalid argument");
    memset(t, 0, sizeof(*t));
    /* One tensor's pickle is a few hundred bytes of shallow structure. */
    dcp__pk_limits_default(&lim);
    lim.max_depth = 16;
    lim.max_nodes = 4096;
    lim.max_str = 4096;
    lim.max_memo = 4096;
    lim.max_stack = 4096;
    rc = dcp__pk_decode(pkl, len, tensor_allow, DCP_ARRAY_LEN(tensor_allow), &lim, 0,
                   &arena, &root, err);
    if (rc != DCP_OK) {
        (void)dcp__err_prefix(err, "data.pkl");
        goto out;
    }
    rc = interpret_tensor(root, t, err);
out:
    dcp__pk_arena_free(arena);
    if (rc != DCP_OK)
        memset(t, 0, sizeof(*t));
    return rc;
}
