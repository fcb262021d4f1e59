/*
 * Records stored through a stream transform (docs/FORMAT.md §9.1): torch's
 * ZStandard() extension compresses each record's torch.save archive as a
 * whole, so such a record is read whole and decompressed before it is
 * parsed, with the decompressed size bounded by what the metadata admits.
 */
#include "read.h"

#include <inttypes.h>
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
 * §9.3): the chunk's storage entry points at the start of the one
 * safetensors file that ends the data file; the tensor is found there by
 * its key and re-made, in memory, as the plain record (§3), so that every
 * reader path takes it as it is.
 */
int dcp__rd_sf_record(int fd, const char *file, uint64_t file_size,
                      const struct md_entry *e, const struct md_chunk *c,
                      uint8_t **out, size_t *out_len, struct dcp_err *err)
{
    struct sf_file sf;
    struct tz_writer z;
    const struct sf_tensor *t = NULL;
    uint8_t pre[9];
    uint64_t nbytes = 0, hlen, data_off;
    size_t i, at;
    int rc;
    *out = NULL;
    *out_len = 0;
    if (!e->is_tensor || c->xform != MD_XFORM_NONE ||
        file_size - c->offset < sizeof(pre))
        return DCP_ENOENT;
    rc = dcp__fs_pread(fd, pre, sizeof(pre), c->offset, file, NULL);
    hlen = (uint64_t)pre[0] | (uint64_t)pre[1] << 8 | (uint64_t)pre[2] << 16 |
           (uint64_t)pre[3] << 24 | (uint64_t)pre[4] << 32 |
           (uint64_t)pre[5] << 40 | (uint64_t)pre[6] << 48 |
           (uint64_t)pre[7] << 56;
    if (rc != DCP_OK || pre[8] != '{' || hlen > SF_MAX_HEADER)
        return DCP_ENOENT; /* not safetensors: the caller's error stands */
    memset(&sf, 0, sizeof(sf));
    {
        uint8_t *h = dcp__malloc(hlen ? (size_t)hlen : 1);
        if (!h)
            return dcp__err(err, DCP_ENOMEM, "out of memory");
        rc = hlen + 8 > file_size - c->offset
                 ? dcp__err(err, DCP_ECORRUPT, "header past the file's end")
                 : dcp__fs_pread(fd, h, (size_t)hlen, c->offset + 8, file, err);
        if (rc == DCP_OK)
            rc = dcp__sf_parse_header(h, (size_t)hlen, file_size - c->offset,
                                      &sf, err);
        dcp__free(h);
    }
    if (rc != DCP_OK)
        return dcp__err_prefix(
            err, "'%s': safetensors record at byte %" PRIu64 " of '%s'", e->key,
            c->offset, file);
    for (i = 0; i < sf.n && !t; i++)
        if (!strcmp(sf.t[i].name, e->key))
            t = &sf.t[i];
    if (t)
        nbytes = t->end - t->begin;
    if (!t || t->dtype != e->dtype || t->ndim != e->ndim ||
        (e->ndim &&
         memcmp(t->shape, c->size, (size_t)e->ndim * sizeof(int64_t)) != 0) ||
        nbytes != c->length) {
        dcp__sf_release(&sf);
        return dcp__err(err, DCP_EFORMAT,
                        "'%s': the safetensors record at byte %" PRIu64
                        " of '%s' %s",
                        e->key, c->offset, file,
                        t ? "holds it with another dtype, shape or length "
                            "than the metadata's chunk"
                          : "does not hold it");
    }
    data_off = c->offset + sf.data_off + t->begin;
    dcp__sf_release(&sf);
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
