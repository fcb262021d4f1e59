/*
 * Fuzz target: the torch.save zip reader. The input is one record (a
 * torch.save archive as a DCP data file holds it): parse its directory,
 * read and CRC-check every small entry, and parse data.pkl as a tensor
 * description and check the storage against it, as dcp_load does; an
 * entry with dcp's block-CRC field (docs/FORMAT.md §4) has its block CRCs
 * read and, when small, each block checked as a partial load does.
 */
#include <dcp/dcp.h>

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "crc32.h"
#include "torchzip.h"
#include "util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

struct mem {
    const uint8_t *p;
    size_t n;
};

static int mem_read(void *opaque, uint64_t off, void *buf, size_t len,
                    struct dcp_err *err)
{
    const struct mem *m = opaque;
    if (off > m->n || len > m->n - off)
        return dcp__err(err, DCP_ECORRUPT, "read past the end");
    memcpy(buf, m->p + off, len);
    return DCP_OK;
}

/* The block CRCs of e (checked by dcp__tz_open), and each block of a small
 * entry against its CRC. */
static void check_blocks(const struct tz_archive *a, const struct tz_entry *e,
                         struct mem *m, struct dcp_err *err)
{
    static uint32_t want[TZ_BLK_RCOUNT], got[TZ_BLK_RCOUNT];
    uint8_t *bytes = NULL;
    struct crc_blocks b;
    if (!e->blk_size || e->blk_n > TZ_BLK_RCOUNT)
        return;
    if (dcp__tz_read_block_crcs(e, 0, (size_t)e->blk_n, mem_read, m, want,
                                err) != DCP_OK)
        return;
    (void)dcp__tz_read_block_crcs(e, e->blk_n, 1, mem_read, m, want, err);
    if (e->size > (1u << 20) ||
        dcp__tz_read_entry(a, e, 1u << 20, 0, mem_read, m, &bytes, err) !=
            DCP_OK)
        return;
    dcp__crcb_init(&b, e->blk_size, got, TZ_BLK_RCOUNT);
    dcp__crcb_update(&b, NULL, bytes, (size_t)e->size);
    (void)dcp__crcb_finish(&b);
    for (uint64_t k = 0; k < e->blk_n && k < b.n; k++)
        if (got[k] != want[k])
            break;
    dcp__free(bytes);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct tz_archive a;
    struct mem m = {data, size};
    struct dcp_err err;
    size_t i;
    if (dcp__tz_open(&a, size, mem_read, &m, &err) != DCP_OK)
        return 0;
    for (i = 0; i < a.n; i++) {
        uint8_t *out = NULL;
        struct tz_tensor t;
        check_blocks(&a, &a.ent[i], &m, &err);
        if (a.ent[i].size > (1u << 20))
            continue;
        if (dcp__tz_read_entry(&a, &a.ent[i], 1u << 20, 1, mem_read, &m, &out,
                          &err) == DCP_OK &&
            strcmp(a.ent[i].name, "data.pkl") == 0 &&
            dcp__tz_parse_tensor_pickle(out, (size_t)a.ent[i].size, &t, &err) ==
                DCP_OK) {
            char name[TZ_MAX_NAME + 8];
            const struct tz_entry *d;
            (void)snprintf(name, sizeof(name), "data/%s", t.key);
            d = dcp__tz_find(&a, name);
            if (d && d->size == t.storage_numel * dcp_dtype_size(t.dtype) &&
                d->size <= (1u << 20)) {
                uint8_t *bytes = NULL;
                (void)dcp__tz_read_entry(&a, d, 1u << 20, 1, mem_read, &m, &bytes,
                                    &err);
                dcp__free(bytes);
            }
        }
        dcp__free(out);
    }
    return 0;
}
