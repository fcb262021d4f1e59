/*
 * Fuzz target: a whole checkpoint from hostile bytes, .metadata decode to
 * load plan to reads. The input is split by memfs.h: part 0 is .metadata,
 * the next parts are the data files in the order they are opened.
 *  1. dcp__meta_decode, the tiling check of every tensor, and a round
 *     trip: what decodes must encode and decode again to the same keys.
 *  2. Through the public API on the in-memory storage back end:
 *     dcp_metadata_open, every entry read (tensors whole, capped at 64 KiB),
 *     dcp_verify, and a partial dcp_load that asks for every tensor as two
 *     boxes (rows split in half), so the load plan intersects stored chunks
 *     with boxes the saver never used.
 */
#include <dcp/dcp.h>
#include <dcp/dcp_storage.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "memfs.h"
#include "meta.h"
#include "reshard.h"

#define CAP ((uint64_t)1 << 16)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void decode_direct(const struct memfs *m)
{
    struct dcp_metadata *md = NULL, *md2 = NULL;
    struct dcp_buf b = {0};
    struct dcp_err err;
    size_t i;
    if (dcp__meta_decode(m->part[0], m->len[0], &md, &err) != DCP_OK)
        return;
    for (i = 0; i < md->n; i++)
        if (md->e[i].is_tensor)
            (void)dcp__meta_check_tiling(&md->e[i], &err);
    if (dcp__meta_encode(md, &b) != DCP_OK ||
        dcp__meta_decode(b.p, b.len, &md2, &err) != DCP_OK || md2->n != md->n)
        abort(); /* the round trip must hold */
    for (i = 0; i < md->n; i++)
        if (strcmp(md->e[i].key, md2->e[i].key) != 0)
            abort();
    dcp__meta_free(md2);
    dcp__buf_free(&b);
    dcp__meta_free(md);
}

static void load_all(dcp_ctx *ctx, const dcp_metadata *md)
{
    dcp_load_options lo = {sizeof(lo), DCP_LOAD_PARTIAL, NULL};
    dcp_state *st = NULL;
    void *bufs[64];
    size_t nbufs = 0, i;
    uint64_t total = 0;
    if (dcp_state_create(&st) != DCP_OK)
        return;
    for (i = 0; i < dcp_metadata_count(md) && nbufs < 64; i++) {
        dcp_entry_info e;
        int64_t off[DCP_MAX_NDIM] = {0}, sz[DCP_MAX_NDIM];
        int d;
        if (dcp_metadata_entry(md, i, &e) != DCP_OK)
            continue;
        if (!e.is_tensor) {
            (void)dcp_state_add_value(st, e.key, dcp_value_none());
            continue;
        }
        if (e.nbytes > CAP || total + e.nbytes > 4 * CAP)
            continue;
        bufs[nbufs] = calloc(1, e.nbytes ? (size_t)e.nbytes : 1);
        if (!bufs[nbufs])
            continue;
        total += e.nbytes;
        for (d = 0; d < e.ndim; d++)
            sz[d] = e.shape[d];
        if (e.ndim > 0 && e.shape[0] >= 2) {
            /* two boxes: rows [0, h) and [h, n) */
            int64_t h = e.shape[0] / 2;
            size_t row = (size_t)(e.nbytes / (uint64_t)e.shape[0]);
            sz[0] = h;
            (void)dcp_state_add_tensor(st, e.key, e.dtype, e.ndim, e.shape, off,
                                       sz, bufs[nbufs], DCP_MEM_HOST);
            off[0] = h;
            sz[0] = e.shape[0] - h;
            (void)dcp_state_add_tensor(
                st, e.key, e.dtype, e.ndim, e.shape, off, sz,
                (char *)bufs[nbufs] + (size_t)h * row, DCP_MEM_HOST);
        } else {
            (void)dcp_state_add_tensor(st, e.key, e.dtype, e.ndim, e.shape,
                                       NULL, NULL, bufs[nbufs], DCP_MEM_HOST);
        }
        nbufs++;
    }
    (void)dcp_load(ctx, st, "/fuzz", &lo);
    dcp_state_free(st);
    for (i = 0; i < nbufs; i++)
        free(bufs[i]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static struct memfs m;
    static dcp_ctx *ctx;
    dcp_metadata *md = NULL;
    size_t i;
    if (!ctx) {
        dcp_ctx_options o = {0};
        o.struct_size = sizeof(o);
        o.max_metadata_bytes = CAP;
        o.max_value_bytes = CAP;
        o.storage = memfs_ops();
        o.storage_impl = &m;
        if (dcp_ctx_create(&ctx, NULL, &o) != DCP_OK)
            abort();
    }
    memfs_init(&m, data, size);
    decode_direct(&m);
    if (dcp_metadata_open(ctx, "/fuzz", &md) != DCP_OK)
        return 0;
    for (i = 0; i < dcp_metadata_count(md); i++) {
        dcp_entry_info e;
        if (dcp_metadata_entry(md, i, &e) != DCP_OK)
            continue;
        if (!e.is_tensor) {
            dcp_value *v = NULL;
            (void)dcp_metadata_read_value(ctx, md, i, &v);
            dcp_value_free(v);
        } else if (e.nbytes <= CAP) {
            void *buf = malloc(e.nbytes ? (size_t)e.nbytes : 1);
            if (buf)
                (void)dcp_metadata_read_box(ctx, md, i, NULL, NULL, buf,
                                            (size_t)e.nbytes, 1);
            free(buf);
        }
    }
    memfs_init(&m, data, size);
    (void)dcp_verify(ctx, "/fuzz");
    memfs_init(&m, data, size);
    load_all(ctx, md);
    dcp_metadata_free(md);
    return 0;
}
