/*
 * Records stored through a stream transform (docs/FORMAT.md §9.1): torch's
 * ZStandard() extension compresses each record's torch.save archive as a
 * whole, so such a record is read whole and decompressed before it is
 * parsed, with the decompressed size bounded by what the metadata admits.
 */
#include "read.h"

#include <inttypes.h>
#include <string.h>

#include "dtype.h"
#include "reshard.h"
#include "storage.h"
#include "zframe.h"

int dcp__rd_inflate(int fd, const char *file, const struct md_entry *e,
                    const struct md_chunk *c, uint64_t value_max,
                    uint8_t **out, size_t *out_len, struct dcp_err *err)
{
    uint64_t bound = value_max;
    uint8_t *z;
    int rc;
    *out = NULL;
    *out_len = 0;
    if (c->xform != MD_XFORM_ZSTD)
        return dcp__err(err, DCP_ENOTSUP, "'%s': unknown record transform",
                        e->key);
    if (e->is_tensor &&
        dcp__mul_overflow_u64(dcp__box_numel(e->ndim, c->size),
                              dcp_dtype_size(e->dtype), &bound))
        return dcp__err(err, DCP_EFORMAT, "'%s': chunk size overflows",
                        e->key);
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
        return dcp__fs_pread(loc->fd, buf, n, loc->data + pos, loc->file,
                             err);
    if (n)
        memcpy(buf, loc->mem + loc->data + pos, n);
    return DCP_OK;
}

void dcp__rd_loc_free(struct rd_loc *loc)
{
    dcp__free(loc->mem);
    loc->mem = NULL;
}
