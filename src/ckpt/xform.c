/*
 * Records stored through a stream transform (docs/FORMAT.md §9.1): torch's
 * ZStandard() extension compresses each record's torch.save archive as a
 * whole, so such a record is read whole and decompressed before it is
 * parsed, with the decompressed size bounded by what the metadata admits.
 */
#include "read.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "crc32.h"
#include "dtype.h"
#include "reshard.h"
#include "safetensors.h"
#include "storage.h"
#include "torchzip.h"
#include "zframe.h"

int dcp__rd_inflate(int fd, const char *file, const struct md_entry *e,
                    const struct md_chunk *c, uint64_t value_max, uint8_t **out,
                    size_t *out_len, struct dcp_err *err)
{
    uint64_t bound = value_max;
    uint8_t *z;
    int rc;
    *out = NULL;
    *out_len = 0;
    if (c->xform != MD_XFORM_ZSTD)
        return dcp__err(err, DCP_ENOTSUP, "'%s': unknown record transform",
                        e->key);
    if (e->is_tensor && dcp__mul_overflow_u64(dcp__box_numel(e->ndim, c->size),
                                              dcp_dtype_size(e->dtype), &bound))
        return dcp__err(err, DCP_EFORMAT, "'%s': chunk size overflows", e->key);
    if (dcp__add_overflow_u64(bound, RD_XFORM_SLACK, &bound))
        bound = UINT64_MAX;
    if (c->length > SIZE_MAX)
        return dcp__err(err, DCP_ENOMEM, "'%s': record too large for memory",
                        e->key);
    z = dcp__malloc(c->length ? (size_t)c->length : 1);
    if (!z)
        return dcp__err(err, DCP_ENOMEM,
                        "'%s': out of memory for a %" PRIu64
                        "-byte compressed record",
                        e->key, c->length);
    rc = dcp__fs_pread(fd, z, (size_t)c->length, c->offset, file, err);
    if (rc == DCP_OK)
        rc = dcp__zstd_decode(z, (size_t)c->length, bound, out, out_len, err);
    dcp__free(z);
    if (rc != DCP_OK)
        return dcp__err_prefix(err,
                               "'%s': compressed record at byte %" PRIu64
                               " of '%s' (%" PRIu64 " bytes)",
                               e->key, c->offset, file, c->length);
    return DCP_OK;
}

int dcp__rd_loc_read(const struct rd_loc *loc, void *buf, size_t n,
                     uint64_t pos, struct dcp_err *err)
{
    if (!loc->mem)
        return dcp__fs_pread(loc->fd, buf, n, loc->data + pos, loc->file, err);
    if (n)
        memcpy(buf, loc->mem + loc->data + pos, n);
    return DCP_OK;
}

void dcp__rd_loc_free(struct rd_loc *loc)
{
    dcp__free(loc->mem);
    loc->mem = NULL;
}

/*
 * Tensor records of serialization_format=SAFETENSORS (docs/FORMAT.md
 * §9.3), and the pieces of a Hugging Face directory (§9.5): the chunk's
 * storage entry points at the start of a safetensors file; the tensor is
 * found there by its key and re-made, in memory, as the plain record (§3),
 * so that every reader path takes it as it is. The parsed header is kept
 * (rd_files.sfc) with its names sorted: the next chunk of the same file
 * neither re-reads nor re-parses it, and finds its name by bisection.
 */
struct rd_sfcache {
    uint32_t file;   /* the metadata's file index */
    uint64_t offset; /* where the safetensors file starts in it */
    struct sf_file sf;
    const struct sf_tensor **byname; /* sf.t sorted by name */
};

void dcp__rd_sfcache_free(struct rd_sfcache *sfc)
{
    if (!sfc)
        return;
    dcp__sf_release(&sfc->sf);
    dcp__free(sfc->byname);
    dcp__free(sfc);
}

static int cmp_sf_name(const void *pa, const void *pb)
{
    const struct sf_tensor *const *a = pa, *const *b = pb;
    return strcmp((*a)->name, (*b)->name);
}

/* Parses the safetensors header at c->offset of the file into a new cache
 * entry *out. DCP_ENOENT (err untouched) when the bytes there are not
 * safetensors. */
static int sfc_load(int fd, const char *file, uint64_t file_size,
                    const struct md_chunk *c, struct rd_sfcache **out,
                    struct dcp_err *err)
{
    struct rd_sfcache *sc;
    uint8_t pre[9];
    uint64_t hlen;
    size_t i;
    int rc;
    *out = NULL;
    if (file_size - c->offset < sizeof(pre))
        return DCP_ENOENT;
    rc = dcp__fs_pread(fd, pre, sizeof(pre), c->offset, file, NULL);
    hlen = (uint64_t)pre[0] | (uint64_t)pre[1] << 8 | (uint64_t)pre[2] << 16 |
           (uint64_t)pre[3] << 24 | (uint64_t)pre[4] << 32 |
           (uint64_t)pre[5] << 40 | (uint64_t)pre[6] << 48 |
           (uint64_t)pre[7] << 56;
    if (rc != DCP_OK || pre[8] != '{' || hlen > SF_MAX_HEADER)
        return DCP_ENOENT; /* not safetensors: the caller's error stands */
    sc = dcp__calloc(1, sizeof(*sc));
    if (!sc)
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    sc->file = c->file;
    sc->offset = c->offset;
    {
        uint8_t *h = dcp__malloc(hlen ? (size_t)hlen : 1);
        rc = !h ? dcp__err(err, DCP_ENOMEM, "out of memory")
             : hlen + 8 > file_size - c->offset
                 ? dcp__err(err, DCP_ECORRUPT, "header past the file's end")
                 : dcp__fs_pread(fd, h, (size_t)hlen, c->offset + 8, file, err);
        if (rc == DCP_OK)
            rc = dcp__sf_parse_header(h, (size_t)hlen, file_size - c->offset,
                                      &sc->sf, err);
        dcp__free(h);
    }
    if (rc == DCP_OK) {
        sc->byname = dcp__calloc(sc->sf.n ? sc->sf.n : 1, sizeof(*sc->byname));
        if (!sc->byname)
            rc = dcp__err(err, DCP_ENOMEM, "out of memory");
    }
    if (rc != DCP_OK) {
        dcp__rd_sfcache_free(sc);
        return rc;
    }
    for (i = 0; i < sc->sf.n; i++)
        sc->byname[i] = &sc->sf.t[i];
    qsort(sc->byname, sc->sf.n, sizeof(*sc->byname), cmp_sf_name);
    *out = sc;
    return DCP_OK;
}
int dcp__rd_sf_record(struct rd_files *f, int fd, const char *file,
                      uint64_t file_size, const struct md_entry *e,
                      const struct md_chunk *c, uint8_t **out, size_t *out_len,
                      struct dcp_err *err)
{
    struct tz_writer z;
    const struct sf_tensor *t = NULL;
    uint64_t nbytes = 0, hlen, data_off;
    size_t lo, hi, at;
    int rc;
    *out = NULL;
    *out_len = 0;
    if (!e->is_tensor || c->xform != MD_XFORM_NONE)
        return DCP_ENOENT;
    if (!f->sfc || f->sfc->file != c->file || f->sfc->offset != c->offset) {
        struct rd_sfcache *sc = NULL;
        rc = sfc_load(fd, file, file_size, c, &sc, err);
        if (rc == DCP_ENOENT)
            return rc;
        if (rc != DCP_OK)
            return dcp__err_prefix(
                err, "'%s': safetensors record at byte %" PRIu64 " of '%s'",
                e->key, c->offset, file);
        dcp__rd_sfcache_free(f->sfc);
        f->sfc = sc;
    }
    for (lo = 0, hi = f->sfc->sf.n; lo < hi && !t;) {
        size_t mid = lo + (hi - lo) / 2;
        int cmp = strcmp(e->key, f->sfc->byname[mid]->name);
        if (cmp == 0)
            t = f->sfc->byname[mid];
        else if (cmp < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    if (t)
        nbytes = t->end - t->begin;
    if (!t || t->dtype != e->dtype || t->ndim != e->ndim ||
        (e->ndim &&
         memcmp(t->shape, c->size, (size_t)e->ndim * sizeof(int64_t)) != 0) ||
        nbytes != c->length)
        return dcp__err(err, DCP_EFORMAT,
                        "'%s': the safetensors record at byte %" PRIu64
                        " of '%s' %s",
                        e->key, c->offset, file,
                        t ? "holds it with another dtype, shape or length "
                            "than the metadata's chunk"
                          : "does not hold it");
    data_off = c->offset + f->sfc->sf.data_off + t->begin;
    rc = dcp__tz_writer_init(&z, 0, 64);
    if (rc == DCP_OK)
        rc = dcp__tz_tensor_item_begin(&z, e->dtype, e->ndim, c->size, nbytes,
                                       &hlen);
    at = z.out.len;
    if (rc == DCP_OK && (nbytes > SIZE_MAX - at ||
                         dcp__buf_reserve(&z.out, (size_t)nbytes) != DCP_OK))
        rc = DCP_ENOMEM;
    if (rc == DCP_OK)
        rc = dcp__fs_pread(fd, z.out.p + at, (size_t)nbytes, data_off, file,
                           err);
    if (rc == DCP_OK) {
        z.out.len += (size_t)nbytes;
        rc = dcp__tz_tensor_item_end(
            &z, dcp__crc32(0, z.out.p + at, (size_t)nbytes));
    }
    if (rc != DCP_OK) {
        dcp__tz_writer_release(&z);
        return rc == DCP_ENOMEM ? dcp__err(err, rc, "out of memory") : rc;
    }
    *out = z.out.p; /* the writer's buffer changes hands */
    *out_len = z.out.len;
    z.out.p = NULL;
    z.out.len = z.out.cap = 0;
    dcp__tz_writer_release(&z);
    return DCP_OK;
}
