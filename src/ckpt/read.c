/*
 * Reading stored records. A tensor chunk's archive is parsed through a read
 * callback bounded to the record's byte range, so a hostile offset inside
 * the archive can never reach outside it. Data is read once per chunk: when
 * the chunk lands contiguously in one destination with the same dtype (the
 * common case of loading with the sharding it was saved with, or rows of a
 * row-sharded tensor), straight into the caller's buffer; otherwise into a
 * reused scratch buffer and copied (strided) into every overlapping box.
 */
#include "read.h"

#include <fcntl.h> /* posix_fadvise */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h> /* qsort */
#include <string.h>
#include <unistd.h>

#include "dtype.h"
#include "hfdir.h"
#include "nested.h"
#include "ranklocal.h"
#include "crc32.h"
#include "storage.h"
#include "torchzip.h"
#include "value.h"

#define PKL_MAX ((size_t)1 << 20) /* a tensor's data.pkl is ~200 bytes */
/* Parsing windows (struct rec): the zip end-record search reads the last
 * 64 KiB + 22 bytes of a record. */
#define HEAD_WIN ((size_t)16 << 10)
#define TAIL_WIN (((size_t)64 << 10) + 64)
/* A record hinted whole (dcp__rd_prefetch) is at most this long: a longer
 * one is its own large read anyway. */
#define WHOLE_MAX ((uint64_t)32 << 20)

int dcp__rd_open(struct rd_files *f, const char *path,
                 const struct dcp_metadata *md, struct dcp_err *err)
{
    size_t i;
    int rc;
    memset(f, 0, sizeof(*f));
    f->path = path;
    f->md = md;
    f->dirfd = -1;
    f->fds = dcp__malloc((md->nfiles ? md->nfiles : 1) * sizeof(int));
    f->sizes = dcp__calloc(md->nfiles ? md->nfiles : 1, sizeof(uint64_t));
    if (!f->fds || !f->sizes) {
        dcp__rd_close(f);
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    }
    for (i = 0; i < md->nfiles; i++)
        f->fds[i] = -1;
    rc = dcp__fs_open_dir(path, &f->dirfd, err);
    if (rc != DCP_OK)
        dcp__rd_close(f);
    else
        f->hints = dcp__fs_takes_hints(f->dirfd);
    return rc;
}

/* Forgets the cached value record holding tensors. */
static void wide_drop(struct rd_files *f)
{
    if (f->wide_open)
        dcp__tz_file_release(&f->wide);
    dcp__pk_arena_free(f->wide_arena);
    dcp__free(f->wide_pkl);
    f->wide_open = 0;
    f->wide_arena = NULL;
    f->wide_root = NULL;
    f->wide_pkl = NULL;
    f->wide_verified = 0;
}

void dcp__rd_close(struct rd_files *f)
{
    size_t i;
    if (f->fds)
        for (i = 0; i < f->md->nfiles; i++)
            if (f->fds[i] >= 0)
                dcp__fs_release(f->fds[i]);
    if (f->dirfd >= 0)
        dcp__fs_release(f->dirfd);
    dcp__free(f->fds);
    dcp__free(f->sizes);
    dcp__free(f->scratch);
    dcp__free(f->win);
    dcp__free(f->plain);
    dcp__rd_sfcache_free(f->sfc);
    wide_drop(f);
    memset(f, 0, sizeof(*f));
    f->dirfd = -1;
}

static int rd_file(struct rd_files *f, uint32_t idx, struct dcp_err *err)
{
    int rc;
    if (f->fds[idx] >= 0)
        return DCP_OK;
    rc = dcp__fs_open_read(f->dirfd, f->md->files[idx], &f->fds[idx],
                           &f->sizes[idx], err);
    /* Reads through this descriptor are the windows below and whole
     * chunks: the kernel's read-ahead would only fetch tensor bytes that
     * the I/O engine then reads again. */
    if (rc == DCP_OK && dcp__fs_raw_fd(f->fds[idx]) >= 0)
        (void)posix_fadvise(dcp__fs_raw_fd(f->fds[idx]), 0, 0,
                            POSIX_FADV_RANDOM);
    return rc;
}

uint64_t dcp__rd_prefetch(struct rd_files *f, const struct md_entry *e,
                          size_t ci, int whole)
{
    const struct md_chunk *c = &e->chunks[ci];
    uint64_t n = c->length < TAIL_WIN ? c->length : TAIL_WIN;
    int fd;
    if (rd_file(f, c->file, NULL) != DCP_OK)
        return 0; /* the read reports it */
    fd = dcp__fs_raw_fd(f->fds[c->file]);
    if (fd < 0) { /* another storage back end: its own hints (S3) */
        if (!f->hints)
            return 0;
        if (whole && c->length <= WHOLE_MAX) {
            dcp__fs_hint(f->fds[c->file], c->offset, c->length);
            return c->length;
        }
        if (c->length > TAIL_WIN)
            dcp__fs_hint(f->fds[c->file], c->offset, HEAD_WIN);
        dcp__fs_hint(f->fds[c->file], c->offset + c->length - n, n);
        return n + (c->length > TAIL_WIN ? HEAD_WIN : 0);
    }
    (void)posix_fadvise(fd, (off_t)(c->offset + c->length - n), (off_t)n,
                        POSIX_FADV_WILLNEED);
    if (c->length > TAIL_WIN)
        (void)posix_fadvise(fd, (off_t)c->offset, (off_t)HEAD_WIN,
                            POSIX_FADV_WILLNEED);
    return 0;
}

void dcp__rd_hints_drop(struct rd_files *f)
{
    size_t i;
    for (i = 0; f->fds && i < f->md->nfiles; i++)
        if (f->fds[i] >= 0)
            dcp__fs_hint_drop(f->fds[i]);
}

/*
 * A record: a byte range of a data file, as tz_read_fn sees it. Parsing
 * reads the end records and the central directory near the record's end
 * and the local headers and data.pkl near its start: two windows, each
 * read whole on first use (small records: one), serve those reads, instead
 * of a dozen small preads per record.
 */

struct rec {
    int fd;
    uint64_t base;
    uint64_t len;
    const char *file;
    uint8_t *win[2];  /* head, tail (rd_files' buffers), or NULL */
    uint64_t woff[2]; /* record offset of each window */
    size_t wlen[2];   /* bytes held; 0: not read yet */
    const uint8_t *mem; /* a decompressed record (rd_files.plain) */
};

static int rec_read(void *opaque, uint64_t off, void *buf, size_t len,
                    struct dcp_err *err)
{
    struct rec *r = opaque;
    uint64_t end;
    int w, rc;
    if (dcp__add_overflow_u64(off, len, &end) || end > r->len)
        return dcp__err(err, DCP_EFORMAT,
                        "read of %zu bytes at %llu outside the record", len,
                        (unsigned long long)off);
    if (len == 0)
        return DCP_OK; /* buf may be NULL */
    if (r->mem) {
        memcpy(buf, r->mem + off, len);
        return DCP_OK;
    }
    for (w = 0; r->win[0] && w < 2; w++) {
        if (!r->wlen[w]) {
            /* The tail window ends with the record, the head one starts
             * with it; each is filled only by a read that it covers. */
            size_t n = w ? TAIL_WIN : HEAD_WIN;
            uint64_t at = w && r->len > n ? r->len - n : 0;
            if (n > r->len)
                n = (size_t)r->len;
            if (off < at || end > at + n)
                continue;
            rc = dcp__fs_pread(r->fd, r->win[w], n, r->base + at, r->file, err);
            if (rc != DCP_OK)
                return rc;
            r->woff[w] = at;
            r->wlen[w] = n;
        }
        if (off >= r->woff[w] && end <= r->woff[w] + r->wlen[w]) {
            memcpy(buf, r->win[w] + (off - r->woff[w]), len);
            return DCP_OK;
        }
    }
    return dcp__fs_pread(r->fd, buf, len, r->base + off, r->file, err);
}

/* Copies entry name of the wide archive into a, if it has it. */
static void wide_add(struct tz_archive *a, const struct tz_file *tf,
                     const char *name)
{
    const struct tz_entry *e = dcp__tz_file_find(tf, name);
    if (e && a->n < TZ_MAX_ENTRIES)
        a->ent[a->n++] = *e;
}

/* A value record holding tensors (wide): its archive may have any number
 * of storages (one per tensor), so it is parsed into f->wide, and a gets
 * data.pkl and byteorder; parse_chunk adds the member's storage. The
 * archive (and member_node's decoded pickle) stay cached for the next
 * member of the same record: a value's N leaves are read in O(N), not
 * O(N^2). */
static int open_wide(struct rd_files *f, const struct md_chunk *c,
                     struct rec *r, struct tz_archive *a, struct dcp_err *err)
{
    int rc;
    if (!f->wide_open || f->wide_file != c->file ||
        f->wide_off != c->offset || f->wide_len != c->length) {
        wide_drop(f);
        rc = dcp__tz_file_open(&f->wide, r->len, RD_MEMBER_MAX_ENTRIES,
                               rec_read, r, err);
        if (rc != DCP_OK)
            return rc;
        f->wide_open = 1;
        f->wide_file = c->file;
        f->wide_off = c->offset;
        f->wide_len = c->length;
    }
    a->item_len = r->len;
    a->save_id[0] = 0;
    memcpy(a->prefix, f->wide.prefix, sizeof(a->prefix));
    a->n = 0;
    wide_add(a, &f->wide, "data.pkl");
    wide_add(a, &f->wide, "byteorder");
    return DCP_OK;
}

/* Opens the record of chunk c and parses its archive (wide: open_wide). */
static int open_record(struct rd_files *f, const struct md_entry *e,
                       const struct md_chunk *c, struct rec *r,
                       struct tz_archive *a, int wide, struct dcp_err *err)
{
    const char *file = f->md->files[c->file];
    uint64_t end;
    int rc = rd_file(f, c->file, err);
    if (rc != DCP_OK)
        return dcp__err_prefix(err, "'%s'", e->key);
    end = c->offset + c->length; /* checked when the metadata was decoded */
    if (end > f->sizes[c->file])
        return dcp__err(err, DCP_ECORRUPT,
                        "'%s': record at byte %" PRIu64 " of '%s' (%" PRIu64
                        " bytes) runs past the end of the file (%" PRIu64
                        " bytes): truncated",
                        e->key, c->offset, file, c->length,
                        f->sizes[c->file]);
    memset(r, 0, sizeof(*r));
    r->fd = f->fds[c->file];
    r->base = c->offset;
    r->len = c->length;
    r->file = file;
    if (c->xform != MD_XFORM_NONE) {
        size_t n = 0;
        dcp__free(f->plain);
        f->plain = NULL;
        rc = dcp__rd_inflate(r->fd, file, e, c, f->value_max, &f->plain, &n,
                             err);
        if (rc != DCP_OK)
            return rc;
        r->mem = f->plain;
        r->len = n;
    }
    if (!f->win)
        f->win = dcp__malloc(HEAD_WIN + TAIL_WIN);
    if (f->win) { /* else: no windows, plain reads */
        r->win[0] = f->win;
        r->win[1] = f->win + HEAD_WIN;
    }
    if (wide) {
        rc = open_wide(f, c, r, a, err);
        if (rc != DCP_OK)
            return dcp__err_prefix(err,
                                   "'%s': record at byte %" PRIu64 " of '%s'",
                                   e->key, c->offset, file);
        return DCP_OK;
    }
    rc = dcp__tz_open(a, r->len, rec_read, r, err);
    if ((rc == DCP_EFORMAT || rc == DCP_ECORRUPT) && !r->mem) {
        /* safetensors-serialised? (FORMAT.md §9.3) */
        size_t n = 0;
        int src;
        dcp__free(f->plain);
        f->plain = NULL;
        src = dcp__rd_sf_record(f, r->fd, file, f->sizes[c->file], e, c,
                                &f->plain, &n, err);
        if (src != DCP_OK && src != DCP_ENOENT)
            return src;
        if (src == DCP_OK) {
            r->mem = f->plain;
            r->len = n;
            rc = dcp__tz_open(a, r->len, rec_read, r, err);
        }
    }
    if (rc != DCP_OK)
        return dcp__err_prefix(err, "'%s': record at byte %" PRIu64 " of '%s'",
                               e->key, c->offset, file);
    /* The record must be of the save that wrote this .metadata: one of
     * another save (a reader racing an overwrite, a file copied in) is
     * refused, never mixed in. Records without an id (torch, older dcp)
     * and metadata without one (torch) are not checked. */
    if (a->save_id[0] && f->md->save_id &&
        strcmp(a->save_id, f->md->save_id) != 0)
        return dcp__err(err, DCP_ECORRUPT,
                        "'%s': record at byte %" PRIu64 " of '%s' belongs to "
                        "save %s, not to save %.64s that .metadata names: a "
                        "data file of another save",
                        e->key, c->offset, file, a->save_id, f->md->save_id);
    return DCP_OK;
}

/*
 * Copies the intersection (global offsets ioff, sizes isize) from a stored
 * chunk (global offset coff; elements at src with strides and
 * storage_offset of t) into a destination box, converting the dtype.
 */
static void copy_overlap(const struct rd_dest *dst, const struct tz_tensor *t,
                         const uint8_t *src, const int64_t *coff,
                         const int64_t *ioff, const int64_t *isize)
{
    size_t ss = dcp_dtype_size(t->dtype), ds = dcp_dtype_size(dst->dtype);
    int64_t cstride[DCP_MAX_NDIM];
    const int64_t *dstride = dst->stride;
    struct box_runs r;
    if (!dstride) {
        dcp__box_cstrides(t->ndim, dst->size, cstride);
        dstride = cstride;
    }
    dcp__box_runs_init(
        &r, t->ndim, isize,
        t->storage_offset + dcp__box_at(t->ndim, ioff, coff, t->stride),
        t->stride, dcp__box_at(t->ndim, ioff, dst->off, dstride), dstride);
    while (dcp__box_runs_next(&r))
        dcp__convert((uint8_t *)dst->buf + (size_t)r.dst * ds, dst->dtype,
                     src + (size_t)r.src * ss, t->dtype, (size_t)r.run);
}

static int is_contiguous(const struct tz_tensor *t)
{
    int64_t s = 1;
    int d;
    if (t->storage_offset != 0)
        return 0;
    for (d = t->ndim - 1; d >= 0; d--) {
        if (t->size[d] != 1 && t->stride[d] != s)
            return 0;
        s *= t->size[d];
    }
    return 1;
}

/*
 * When the whole chunk lands contiguously in dest with no cast: the byte
 * offset in dest->buf, else -1.
 */
static int64_t direct_offset(const struct rd_dest *dest,
                             const struct tz_tensor *t,
                             const struct md_chunk *c, int ndim)
{
    int64_t row = (int64_t)dcp_dtype_size(t->dtype);
    int d;
    if (dest->dtype != t->dtype || dest->stride || !is_contiguous(t))
        return -1;
    for (d = 0; d < ndim; d++) {
        if (c->off[d] < dest->off[d] ||
            c->off[d] + c->size[d] > dest->off[d] + dest->size[d])
            return -1;
        if (d > 0 && (c->off[d] != dest->off[d] || c->size[d] != dest->size[d]))
            return -1;
        if (d > 0)
            row *= c->size[d];
    }
    return ndim ? (c->off[0] - dest->off[0]) * row : 0;
}

static int check_archive(const struct tz_archive *a, const struct md_entry *e,
                         const struct md_chunk *c, const char *file,
                         const struct tz_tensor *t,
                         const struct tz_entry **data, struct dcp_err *err)
{
    uint64_t want = dcp__box_numel(e->ndim, c->size) * dcp_dtype_size(e->dtype);
    char name[TZ_MAX_NAME + 8];
    int d;
    if (t->dtype != e->dtype || t->ndim != e->ndim)
        return dcp__err(err, DCP_EFORMAT,
                        "'%s': record in '%s' holds a %s tensor of %d "
                        "dimensions, the metadata says %s with %d",
                        e->key, file, dcp_dtype_name(t->dtype), t->ndim,
                        dcp_dtype_name(e->dtype), e->ndim);
    for (d = 0; d < e->ndim; d++)
        if (t->size[d] != c->size[d])
            return dcp__err(err, DCP_EFORMAT,
                            "'%s': record in '%s' has size %" PRId64
                            " in dimension %d, the chunk has %" PRId64,
                            e->key, file, t->size[d], d, c->size[d]);
    (void)snprintf(name, sizeof(name), "data/%s", t->key);
    *data = dcp__tz_find(a, name);
    if (!*data && want == 0)
        return DCP_OK;
    if (!*data)
        return dcp__err(err, DCP_EFORMAT,
                        "'%s': record in '%s' has no storage '%s'", e->key,
                        file, name);
    if ((*data)->size != t->storage_numel * dcp_dtype_size(t->dtype))
        return dcp__err(err, DCP_EFORMAT,
                        "'%s': storage in '%s' is %" PRIu64
                        " bytes, %" PRIu64 " expected",
                        e->key, file, (*data)->size,
                        t->storage_numel * dcp_dtype_size(t->dtype));
    {
        const struct tz_entry *bo = dcp__tz_find(a, "byteorder");
        if (bo && bo->size != 6)
            return dcp__err(err, DCP_ENOTSUP,
                            "'%s': record in '%s' is not little-endian",
                            e->key, file);
    }
    return DCP_OK;
}

static int ensure_scratch(struct rd_files *f, uint64_t n, struct dcp_err *err)
{
    uint8_t *p;
    if (n <= f->scratch_cap)
        return DCP_OK;
    if (n > SIZE_MAX)
        return dcp__err(err, DCP_ENOMEM, "record too large for memory");
    p = dcp__realloc(f->scratch, (size_t)n);
    if (!p)
        return dcp__err(err, DCP_ENOMEM, "out of memory for a %" PRIu64
                        "-byte record", n);
    f->scratch = p;
    f->scratch_cap = (size_t)n;
    return DCP_OK;
}

/* Opens the record of chunk c and finds its data.pkl entry, *pe. */
static int open_pkl(struct rd_files *f, const struct md_entry *e,
                    const struct md_chunk *c, struct rec *r,
                    struct tz_archive *a, const struct tz_entry **pe,
                    int wide, struct dcp_err *err)
{
    int rc = open_record(f, e, c, r, a, wide, err);
    if (rc != DCP_OK)
        return rc;
    *pe = dcp__tz_find(a, "data.pkl");
    if (!*pe)
        return dcp__err(err, DCP_EFORMAT, "'%s': record in '%s' has no "
                        "data.pkl", e->key, f->md->files[c->file]);
    return DCP_OK;
}

/* For an entry inside a value record (e->member): the record's data.pkl
 * read and decoded (cached in f: open_wide), and the member's node, *n. */
static int member_node(struct rd_files *f, const struct tz_archive *a,
                       const struct tz_entry *pe, const struct md_entry *e,
                       int verify, struct rec *r, const struct pk_node **n,
                       struct dcp_err *err)
{
    struct dcp_buf name = {0};
    int rc;
    if (!f->wide_root || (verify && !f->wide_verified)) {
        dcp__pk_arena_free(f->wide_arena);
        dcp__free(f->wide_pkl);
        f->wide_arena = NULL;
        f->wide_root = NULL;
        f->wide_pkl = NULL;
        rc = dcp__tz_read_entry(a, pe, RD_MEMBER_PKL_MAX, verify, rec_read, r,
                                &f->wide_pkl, err);
        if (rc == DCP_OK)
            rc = dcp__nest_decode(f->wide_pkl, pe->size, &f->wide_arena,
                                  &f->wide_root, err);
        if (rc != DCP_OK) {
            f->wide_root = NULL;
            return rc;
        }
        f->wide_verified = verify;
    }
    *n = dcp__nest_find(f->wide_root, e->member, e->nmember);
    if (*n)
        return DCP_OK;
    rc = dcp__path_repr(e->member, e->nmember, &name);
    rc = dcp__err(err, DCP_EFORMAT, "data.pkl holds no member %.*s",
                  rc == DCP_OK ? (int)name.len : 1,
                  rc == DCP_OK ? (const char *)name.p : "?");
    dcp__buf_free(&name);
    return rc;
}

/* Opens chunk ci's record and checks its archive against the metadata:
 * *t is the stored tensor, *data its storage record (NULL for an empty
 * chunk without one). */
static int parse_chunk(struct rd_files *f, const struct md_entry *e,
                       const struct md_chunk *c, int verify, struct rec *r,
                       struct tz_tensor *t, const struct tz_entry **data,
                       struct tz_archive *a, struct dcp_err *err)
{
    const char *file = f->md->files[c->file];
    const struct tz_entry *pe;
    uint8_t *pkl = NULL;
    int rc = open_pkl(f, e, c, r, a, &pe, e->member != NULL, err);
    if (rc != DCP_OK)
        return rc;
    if (e->member) { /* a tensor inside a value record (unflat.c) */
        const struct pk_node *n = NULL;
        char name[TZ_MAX_NAME + 8];
        rc = member_node(f, a, pe, e, verify, r, &n, err);
        if (rc == DCP_OK)
            rc = dcp__tz_tensor_from_node(n, t, err);
        if (rc == DCP_OK) { /* its storage joins a (open_wide) */
            (void)snprintf(name, sizeof(name), "data/%s", t->key);
            wide_add(a, &f->wide, name);
        }
    } else {
        rc = dcp__tz_read_entry(a, pe, PKL_MAX, verify, rec_read, r, &pkl,
                                err);
        if (rc == DCP_OK)
            rc = dcp__tz_parse_tensor_pickle(pkl, pe->size, t, err);
    }
    dcp__free(pkl);
    if (rc != DCP_OK)
        return dcp__err_prefix(err, "'%s': record in '%s'", e->key, file);
    return check_archive(a, e, c, file, t, data, err);
}

/* The block CRCs of data, first to first + n, into a new array. */
static int block_crcs(struct rec *r, const struct tz_entry *data,
                      uint64_t first, uint64_t n, uint32_t **out,
                      const char *key, struct dcp_err *err)
{
    int rc;
    *out = dcp__malloc(n ? (size_t)n * sizeof(**out) : 1);
    if (!*out)
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    rc = dcp__tz_read_block_crcs(data, first, (size_t)n, rec_read, r, *out,
                                 err);
    if (rc != DCP_OK) {
        dcp__free(*out);
        *out = NULL;
        return dcp__err_prefix(err, "'%s': block CRCs in '%s'", key,
                               r->file);
    }
    return DCP_OK;
}

/*
 * Checks the blocks of data that [lo, hi) covers (lo on a block boundary,
 * hi on one or at the data's end), whose bytes are at buf + lo, against
 * their CRCs: DCP_ECORRUPT naming the first bad block, the file and the
 * block's byte offset. When that is the whole data, the record's CRC is
 * checked too, derived from the blocks' (each byte is hashed once).
 */
static int check_blocks(struct rec *r, const struct tz_entry *data,
                        const uint8_t *buf, uint64_t lo, uint64_t hi,
                        const char *key, struct dcp_err *err)
{
    uint64_t bs = data->blk_size, first = lo / bs;
    uint64_t n = dcp__tz_block_count(hi - lo, bs), k;
    struct crc_blocks cb;
    uint32_t *crc, *got;
    int rc = block_crcs(r, data, first, n, &crc, key, err);
    if (rc != DCP_OK)
        return rc;
    got = dcp__malloc(n ? (size_t)n * sizeof(*got) : 1);
    if (!got) {
        dcp__free(crc);
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    }
    dcp__crcb_init(&cb, bs, got, (size_t)n);
    dcp__crcb_update(&cb, NULL, buf + lo, (size_t)(hi - lo));
    if (lo == 0 && hi == data->size && dcp__crcb_finish(&cb) != data->crc)
        rc = dcp__err(err, DCP_ECORRUPT,
                      "'%s': CRC mismatch in '%s' (record at byte %" PRIu64
                      ", data at byte %" PRIu64 ", %" PRIu64 " bytes)",
                      key, r->file, r->base, r->base + data->data_off,
                      data->size);
    else
        (void)dcp__crcb_finish(&cb);
    for (k = 0; k < n; k++) {
        uint64_t at = lo + k * bs, len = hi - at < bs ? hi - at : bs;
        if (got[k] != crc[k]) {
            rc = dcp__err(err, DCP_ECORRUPT,
                          "'%s': CRC mismatch in block %" PRIu64
                          " of the data in '%s' (record at byte %" PRIu64
                          ", block at byte %" PRIu64 ", %" PRIu64 " bytes)",
                          key, first + k, r->file, r->base,
                          r->base + data->data_off + at, len);
            break;
        }
    }
    dcp__free(got);
    dcp__free(crc);
    return rc;
}

/*
 * The bytes of the chunk's storage that the overlaps with the
 * destinations touch, as [*lo, *hi), widened to whole blocks of data;
 * 0 when no destination overlaps. Views with a negative stride (none that
 * dcp or torch writes): the whole storage.
 */
static int needed_span(const struct md_entry *e, const struct md_chunk *c,
                       const struct tz_tensor *t, const struct rd_dest *dest,
                       size_t ndest, const struct tz_entry *data,
                       uint64_t *lo, uint64_t *hi)
{
    int64_t ioff[DCP_MAX_NDIM], isize[DCP_MAX_NDIM];
    uint64_t es = dcp_dtype_size(t->dtype), bs = data->blk_size;
    size_t i;
    int d, any = 0;
    *lo = data->size;
    *hi = 0;
    for (d = 0; d < t->ndim; d++)
        if (t->stride[d] < 0) {
            *lo = 0;
            *hi = data->size;
            return 1;
        }
    for (i = 0; i < ndest; i++) {
        int64_t a = t->storage_offset, z = t->storage_offset;
        if (!dcp__box_intersect(e->ndim, c->off, c->size, dest[i].off,
                                dest[i].size, ioff, isize))
            continue;
        for (d = 0; d < t->ndim; d++) {
            a += (ioff[d] - c->off[d]) * t->stride[d];
            z += (ioff[d] - c->off[d] + isize[d] - 1) * t->stride[d];
        }
        if ((uint64_t)a * es < *lo)
            *lo = (uint64_t)a * es;
        if (((uint64_t)z + 1) * es > *hi)
            *hi = ((uint64_t)z + 1) * es;
        any = 1;
    }
    if (!any)
        return 0;
    *lo -= *lo % bs;
    if (*hi % bs)
        *hi += bs - *hi % bs;
    if (*hi > data->size)
        *hi = data->size;
    return 1;
}

int dcp__rd_chunk(struct rd_files *f, const struct md_entry *e, size_t ci,
                  const struct rd_dest *dest, size_t ndest, int verify,
                  uint64_t *bytes_checked, struct dcp_err *err)
{
    const struct md_chunk *c = &e->chunks[ci];
    const char *file = f->md->files[c->file];
    const struct tz_entry *data = NULL;
    int64_t ioff[DCP_MAX_NDIM], isize[DCP_MAX_NDIM];
    struct tz_archive a;
    struct tz_tensor t;
    struct rec r;
    uint8_t *dst = NULL;
    uint64_t lo = 0, hi;
    size_t i;
    int rc = parse_chunk(f, e, c, verify, &r, &t, &data, &a, err);
    if (rc != DCP_OK || !data)
        return rc;
    hi = data->size;
    if (bytes_checked)
        *bytes_checked += data->size;
    /* One destination that takes the chunk whole and contiguous: read
     * straight into it. */
    if (ndest == 1 && data->size > 0) {
        int64_t off = direct_offset(&dest[0], &t, c, e->ndim);
        if (off >= 0)
            dst = (uint8_t *)dest[0].buf + off;
    }
    if (!dst) {
        rc = ensure_scratch(f, data->size, err);
        if (rc != DCP_OK)
            return rc;
        dst = f->scratch;
        /* With block CRCs, only the blocks the boxes overlap are read and
         * checked. */
        if (verify && data->blk_size && ndest > 0 &&
            !needed_span(e, c, &t, dest, ndest, data, &lo, &hi))
            return DCP_OK;
    }
    /* An empty record has no scratch buffer: dst may be NULL, and NULL + 0
     * is undefined. */
    if (hi > lo)
        rc = rec_read(&r, data->data_off + lo, dst + lo, (size_t)(hi - lo),
                      err);
    if (rc == DCP_OK)
        f->data_read += hi - lo;
    if (rc != DCP_OK)
        return dcp__err_prefix(err, "'%s'", e->key);
    /* Every block checked is the whole record checked too: dcp__tz_open
     * made sure the block CRCs combine to the record's CRC. */
    if (verify && data->blk_size)
        rc = check_blocks(&r, data, dst, lo, hi, e->key, err);
    if (rc != DCP_OK)
        return rc;
    if (verify && !data->blk_size &&
        dcp__crc32(0, dst, (size_t)data->size) != data->crc)
        return dcp__err(err, DCP_ECORRUPT,
                        "'%s': CRC mismatch in '%s' (record at byte %" PRIu64
                        ", data at byte %" PRIu64 ", %" PRIu64 " bytes)",
                        e->key, file, c->offset, c->offset + data->data_off,
                        data->size);
    if (dst != f->scratch)
        return DCP_OK;
    for (i = 0; i < ndest; i++)
        if (dcp__box_intersect(e->ndim, c->off, c->size, dest[i].off,
                               dest[i].size, ioff, isize))
            copy_overlap(&dest[i], &t, dst, c->off, ioff, isize);
    return DCP_OK;
}

void dcp__rd_copy_chunk(const struct md_entry *e, size_t ci, const uint8_t *src,
                        const struct rd_dest *dest, size_t ndest)
{
    const struct md_chunk *c = &e->chunks[ci];
    int64_t ioff[DCP_MAX_NDIM], isize[DCP_MAX_NDIM];
    struct tz_tensor t;
    size_t i;
    memset(&t, 0, sizeof(t));
    t.dtype = e->dtype;
    t.ndim = e->ndim;
    for (i = 0; i < (size_t)e->ndim; i++)
        t.size[i] = c->size[i];
    dcp__box_cstrides(e->ndim, c->size, t.stride);
    for (i = 0; i < ndest; i++)
        if (dcp__box_intersect(e->ndim, c->off, c->size, dest[i].off,
                               dest[i].size, ioff, isize))
            copy_overlap(&dest[i], &t, src, c->off, ioff, isize);
}

int dcp__rd_value(struct rd_files *f, const struct md_entry *e, int verify,
                  uint64_t max_bytes, dcp_value **out, struct dcp_err *err)
{
    const struct md_chunk *c = &e->chunks[0];
    const struct tz_entry *pe;
    struct tz_archive a;
    struct rec r;
    uint8_t *pkl = NULL;
    int rc;
    *out = NULL;
    if (e->bad) /* a value holding tensors refused when expanded */
        return dcp__err(err, e->badrc, "%s", e->bad);
    f->value_max = max_bytes;
    rc = open_pkl(f, e, c, &r, &a, &pe, e->member != NULL, err);
    if (rc != DCP_OK)
        return rc;
    if (e->member) { /* a plain leaf inside a value record (unflat.c) */
        const struct pk_node *n = NULL;
        size_t budget[2] = {0, 0};
        rc = member_node(f, &a, pe, e, verify, &r, &n, err);
        if (rc == DCP_OK)
            rc = dcp__value_from_node(n, budget, out, err);
    } else {
        rc = dcp__tz_read_entry(&a, pe,
                                max_bytes > SIZE_MAX ? SIZE_MAX
                                                     : (size_t)max_bytes,
                                verify, rec_read, &r, &pkl, err);
        if (rc == DCP_OK)
            rc = dcp__value_unpickle(pkl, pe->size, out, err);
    }
    dcp__free(pkl);
    if (rc != DCP_OK)
        return dcp__err_prefix(err, "'%s': record in '%s'", e->key,
                               f->md->files[c->file]);
    return DCP_OK;
}

int dcp__rd_value_pickle(struct rd_files *f, const struct md_entry *e,
                         struct tz_archive *a, uint8_t **pkl, size_t *len,
                         struct dcp_err *err)
{
    const struct md_chunk *c = &e->chunks[0];
    const struct tz_entry *pe;
    struct rec r;
    size_t i;
    int rc, any = 0;
    *pkl = NULL;
    *len = 0;
    f->value_max = RD_MEMBER_PKL_MAX;
    rc = open_pkl(f, e, c, &r, a, &pe, 1, err);
    if (rc != DCP_OK)
        return rc;
    for (i = 0; !any && i < f->wide.n; i++)
        any = strncmp(f->wide.ent[i].name, "data/", 5) == 0;
    if (!any)
        return DCP_ENOENT;
    rc = dcp__tz_read_entry(a, pe, RD_MEMBER_PKL_MAX, 1, rec_read, &r, pkl,
                            err);
    if (rc == DCP_OK)
        *len = (size_t)pe->size;
    return rc;
}

const struct tz_entry *dcp__rd_wide_find(const struct rd_files *f,
                                         const char *name)
{
    return f->wide_open ? dcp__tz_file_find(&f->wide, name) : NULL;
}

int dcp__rd_metadata(int dirfd, const char *path, uint64_t max_bytes,
                     struct dcp_metadata **out, struct dcp_err *err)
{
    uint8_t *p = NULL;
    size_t len = 0;
    int rc = dcp__fs_read_all(dirfd, ".metadata", max_bytes, &p, &len, err);
    *out = NULL;
    /* No .metadata: a rank-local checkpoint (ranklocal.c)? */
    if (rc == DCP_ENOENT &&
        (rc = dcp__rl_metadata(dirfd, path, max_bytes, out, err)) !=
            DCP_ENOENT)
        return rc;
    /* Nor that: Hugging Face safetensors files (hfdir.c)? */
    if (rc == DCP_ENOENT &&
        (rc = dcp__hf_metadata(dirfd, path, out, err)) != DCP_ENOENT)
        return rc;
    if (rc == DCP_ENOENT)
        return dcp__err(err, DCP_ENOENT,
                        "no checkpoint in '%s': .metadata not found (an "
                        "interrupted save leaves none)",
                        path);
    if (rc != DCP_OK)
        return dcp__err_prefix(err, "'%s'", path);
    rc = dcp__meta_decode(p, len, out, err);
    dcp__free(p);
    if (rc != DCP_OK)
        return dcp__err_prefix(err, "'%s/.metadata'", path);
    return DCP_OK;
}

int dcp__rd_chunk_locate(struct rd_files *f, const struct md_entry *e,
                         size_t ci, struct rd_loc *loc, struct dcp_err *err)
{
    const struct md_chunk *c = &e->chunks[ci];
    const struct tz_entry *data = NULL;
    struct tz_archive a;
    struct rec r;
    int rc;
    memset(loc, 0, sizeof(*loc));
    rc = parse_chunk(f, e, c, 1, &r, &loc->t, &data, &a, err);
    if (rc != DCP_OK)
        return rc;
    loc->fd = r.fd;
    loc->file = r.file;
    if (r.mem) { /* the decompressed record moves to loc */
        loc->mem = f->plain;
        f->plain = NULL;
        r.base = 0;
    }
    if (data) {
        loc->data = r.base + data->data_off;
        loc->size = data->size;
        loc->crc = data->crc;
    }
    return DCP_OK;
}

/* ------------------------------------------------------------ batched */

/*
 * The byte offset of sub-box (ioff, isize) inside the C-contiguous box
 * (boff, bsize) when its elements form one contiguous run there (every
 * dimension after the first one longer than 1 is whole), else -1.
 */
static int64_t run_offset(int ndim, const int64_t *boff, const int64_t *bsize,
                          const int64_t *ioff, const int64_t *isize,
                          size_t esize)
{
    int64_t off = 0, stride = (int64_t)esize;
    int d, j = 0;
    while (j < ndim - 1 && isize[j] == 1)
        j++;
    for (d = j + 1; d < ndim; d++)
        if (isize[d] != bsize[d])
            return -1;
    for (d = ndim - 1; d >= 0; d--) {
        off += (ioff[d] - boff[d]) * stride;
        stride *= bsize[d];
    }
    return off;
}

struct target {
    uint64_t off, len; /* in the stored chunk's data */
    uint8_t *dst;
};

static int cmp_target(const void *pa, const void *pb)
{
    const struct target *a = pa, *b = pb;
    return a->off < b->off ? -1 : a->off > b->off;
}

/*
 * A strided destination's runs shorter than this are not read straight
 * into it: a read part per few hundred bytes (a ghost-cell block's rows)
 * costs more than reading the chunk once and copying.
 */
#define RUN_DIRECT_MIN ((uint64_t)4 << 10)

/*
 * The targets of the overlap (ioff, isize) of chunk c with the strided
 * destination d: one per run that is contiguous both in the chunk's bytes
 * and at d (the box copy's runs), appended to *tg (*n of *cap used, grown
 * as needed). Returns 0; -1 when a run is shorter than RUN_DIRECT_MIN
 * (copy instead); -2 when out of memory.
 */
static int strided_targets(int ndim, const struct md_chunk *c,
                           const struct rd_dest *d, const int64_t *ioff,
                           const int64_t *isize, size_t es,
                           struct target **tg, size_t *n, size_t *cap)
{
    int64_t cs[DCP_MAX_NDIM];
    uint64_t runs;
    struct box_runs r;
    dcp__box_cstrides(ndim, c->size, cs);
    dcp__box_runs_init(&r, ndim, isize, dcp__box_at(ndim, ioff, c->off, cs),
                       cs, dcp__box_at(ndim, ioff, d->off, d->stride),
                       d->stride);
    if ((uint64_t)r.run * es < RUN_DIRECT_MIN)
        return -1;
    runs = dcp__box_numel(ndim, isize) / (uint64_t)r.run;
    if (*n + runs > *cap) {
        size_t want = (size_t)(*n + runs) * 2;
        struct target *p = dcp__realloc(*tg, want * sizeof(*p));
        if (!p)
            return -2;
        *tg = p;
        *cap = want;
    }
    while (dcp__box_runs_next(&r)) {
        (*tg)[*n].off = (uint64_t)r.src * es;
        (*tg)[*n].len = (uint64_t)r.run * es;
        (*tg)[*n].dst = (uint8_t *)d->buf + (size_t)r.dst * es;
        (*n)++;
    }
    return 0;
}

/*
 * Where each destination overlapping chunk c takes its bytes from: one
 * target per destination when each overlap is a single run in the chunk
 * and in the destination, or one per run for a strided destination whose
 * runs are long enough; with no cast and no two overlaps sharing bytes.
 * *ptg (*cap entries, at least ndest) is grown as needed. Returns the
 * number of targets, -1 when the chunk must be copied element-wise
 * (dcp__rd_chunk), -2 when out of memory.
 */
static long plan_targets(const struct md_entry *e, const struct md_chunk *c,
                         const struct tz_tensor *t, const struct rd_dest *dest,
                         size_t ndest, struct target **ptg, size_t *cap)
{
    int64_t ioff[DCP_MAX_NDIM], isize[DCP_MAX_NDIM];
    size_t es = dcp_dtype_size(t->dtype), i, n = 0;
    struct target *tg;
    if (!is_contiguous(t))
        return -1;
    for (i = 0; i < ndest; i++) {
        int64_t so, dof;
        if (!dcp__box_intersect(e->ndim, c->off, c->size, dest[i].off,
                                dest[i].size, ioff, isize))
            continue;
        if (dest[i].dtype != t->dtype)
            return -1; /* a cast: copied */
        if (dest[i].stride) {
            int r = strided_targets(e->ndim, c, &dest[i], ioff, isize, es,
                                    ptg, &n, cap);
            if (r < 0)
                return r; /* short runs: copied */
            continue;
        }
        if (n == *cap) { /* strided targets used the room */
            tg = dcp__realloc(*ptg, 2 * *cap * sizeof(*tg));
            if (!tg)
                return -2;
            *ptg = tg;
            *cap *= 2;
        }
        tg = *ptg;
        so = run_offset(e->ndim, c->off, c->size, ioff, isize, es);
        dof = run_offset(e->ndim, dest[i].off, dest[i].size, ioff, isize, es);
        if (so < 0 || dof < 0)
            return -1;
        tg[n].off = (uint64_t)so;
        tg[n].len = dcp__box_numel(e->ndim, isize) * es;
        tg[n].dst = (uint8_t *)dest[i].buf + dof;
        n++;
    }
    tg = *ptg;
    if (n > 1)
        qsort(tg, n, sizeof(*tg), cmp_target);
    for (i = 1; i < n; i++)
        if (tg[i].off < tg[i - 1].off + tg[i - 1].len)
            return -1;
    return (long)n;
}

/*
 * Verified reads of a record with block CRCs: the targets (sorted,
 * disjoint), widened to whole blocks, make runs of blocks; each run is a
 * stream checked block by block, whose bytes no target takes are read for
 * the CRCs only. Blocks no target overlaps are not read.
 */
static int plan_blocks(struct rec *r, const struct md_entry *e,
                       const struct md_chunk *c, const struct tz_entry *data,
                       const struct target *tg, long n, struct io_rbatch *batch,
                       struct dcp_err *err)
{
    uint64_t bs = data->blk_size;
    long i = 0;
    int rc = DCP_OK;
    while (rc == DCP_OK && i < n) {
        uint64_t lo = tg[i].off - tg[i].off % bs, hi, at;
        uint32_t *crc = NULL, id;
        long j = i;
        /* The run: targets whose blocks touch or follow the run's last. */
        hi = tg[i].off;
        while (j < n && tg[j].off - tg[j].off % bs <= hi) {
            uint64_t end = tg[j].off + tg[j].len;
            if (end % bs)
                end += bs - end % bs;
            if (end > data->size)
                end = data->size;
            if (end > hi)
                hi = end;
            j++;
        }
        rc = block_crcs(r, data, lo / bs, dcp__tz_block_count(hi - lo, bs),
                        &crc, e->key, err);
        if (rc == DCP_OK)
            rc = dcp__io_rbatch_stream(batch, c->file,
                                       r->base + data->data_off + lo, hi - lo,
                                       0, 1, e->key, c->offset, &id, err);
        if (rc == DCP_OK)
            rc = dcp__io_rbatch_stream_blocks(
                batch, id, bs, lo / bs, crc,
                (size_t)dcp__tz_block_count(hi - lo, bs), err);
        dcp__free(crc);
        for (at = lo; rc == DCP_OK && i < j; i++) {
            if (tg[i].off > at)
                rc = dcp__io_rbatch_part(batch, id, at - lo, tg[i].off - at,
                                         NULL, err);
            if (rc == DCP_OK)
                rc = dcp__io_rbatch_part(batch, id, tg[i].off - lo, tg[i].len,
                                         tg[i].dst, err);
            at = tg[i].off + tg[i].len;
        }
        if (rc == DCP_OK && hi > at)
            rc = dcp__io_rbatch_part(batch, id, at - lo, hi - at, NULL, err);
    }
    return rc;
}

int dcp__rd_chunk_plan(struct rd_files *f, const struct md_entry *e, size_t ci,
                       const struct rd_dest *dest, size_t ndest, int verify,
                       struct io_rbatch *batch, struct dcp_err *err)
{
    const struct md_chunk *c = &e->chunks[ci];
    const struct tz_entry *data = NULL;
    struct tz_archive a;
    struct tz_tensor t;
    struct target *tg;
    struct rec r;
    uint64_t at = 0;
    uint32_t id;
    size_t cap = ndest ? ndest : 1;
    long n, i;
    int rc;
    /* A compressed record is decompressed whole: no ranged reads. */
    if (c->xform != MD_XFORM_NONE)
        return dcp__rd_chunk(f, e, ci, dest, ndest, verify, NULL, err);
    rc = parse_chunk(f, e, c, verify, &r, &t, &data, &a, err);
    if (rc != DCP_OK || !data || data->size == 0)
        return rc;
    if (r.mem) /* re-made in memory (safetensors-serialised) */
        return dcp__rd_chunk(f, e, ci, dest, ndest, verify, NULL, err);
    tg = dcp__malloc(cap * sizeof(*tg));
    if (!tg)
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    n = plan_targets(e, c, &t, dest, ndest, &tg, &cap);
    if (n == -2) {
        dcp__free(tg);
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    }
    if (n < 0) {
        dcp__free(tg);
        return dcp__rd_chunk(f, e, ci, dest, ndest, verify, NULL, err);
    }
    dcp__io_rbatch_file(batch, c->file, r.file, r.fd, f->sizes[c->file]);
    if (verify && data->blk_size) {
        rc = plan_blocks(&r, e, c, data, tg, n, batch, err);
        dcp__free(tg);
        return rc;
    }
    rc = dcp__io_rbatch_stream(batch, c->file, r.base + data->data_off,
                               data->size, data->crc, verify, e->key, c->offset,
                               &id, err);
    /* Verifying reads the whole chunk: the bytes no destination takes are
     * read for the CRC only. */
    for (i = 0; rc == DCP_OK && i < n; i++) {
        if (verify && tg[i].off > at)
            rc = dcp__io_rbatch_part(batch, id, at, tg[i].off - at, NULL, err);
        if (rc == DCP_OK)
            rc = dcp__io_rbatch_part(batch, id, tg[i].off, tg[i].len, tg[i].dst,
                                     err);
        at = tg[i].off + tg[i].len;
    }
    if (rc == DCP_OK && verify && data->size > at)
        rc = dcp__io_rbatch_part(batch, id, at, data->size - at, NULL, err);
    dcp__free(tg);
    return rc;
}
