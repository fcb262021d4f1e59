/*
 * Fuzz target: the file reader of dcp_import and dcp_load_file
 * (src/srcfile.c) on one hostile file, a torch.save archive (zip, data.pkl
 * walked as a state dict, storages, views) or a safetensors file, told
 * apart by the content as DCP_FORMAT_AUTO does. The input is written to a
 * memfd and opened by its /proc/self/fd path, so the real open, sniff and
 * pread paths run.
 *  1. dcp__src_open; on success, properties: keys sorted and unique, every
 *     tensor's storage inside the file and its view inside its storage.
 *  2. Every tensor of at most 1 MiB read whole (dcp__src_read) and its
 *     second half of rows as a box (dcp__src_read_box); a contiguous
 *     tensor's bytes must be the file's bytes at its offset.
 * A violation aborts (a finding).
 */
#define _GNU_SOURCE
#include <dcp/dcp.h>
#include <dcp/dcp_convert.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "srcfile.h"

#define CAP ((uint64_t)1 << 20)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static int memfd = -1;
static char fdpath[64];

/* Element count of e, or UINT64_MAX on overflow. */
static uint64_t numel_of(const struct src_entry *e)
{
    uint64_t n = 1;
    int d;
    for (d = 0; d < e->ndim; d++)
        if (e->shape[d] < 0 ||
            dcp__mul_overflow_u64(n, (uint64_t)e->shape[d], &n))
            return UINT64_MAX;
    return n;
}

/* The view of e lies inside its storage, which lies inside the file. */
static void check_entry(const struct src_entry *e, size_t file_size)
{
    uint64_t es = dcp_dtype_size(e->dtype), numel = numel_of(e);
    int64_t last;
    int d;
    if (!e->is_tensor)
        return;
    if (es == 0 || numel == UINT64_MAX || e->ndim < 0 ||
        e->ndim > DCP_MAX_NDIM || e->base > file_size ||
        e->storage_bytes > file_size - e->base || e->storage_offset < 0)
        abort();
    if (numel == 0)
        return;
    last = e->storage_offset;
    for (d = 0; d < e->ndim; d++) {
        if (e->stride[d] < 0)
            abort();
        last += (e->shape[d] - 1) * e->stride[d];
    }
    if ((uint64_t)last >= e->storage_bytes / es)
        abort(); /* a view reaching outside its storage was accepted */
}

static void read_entry(struct src_index *ix, const struct src_entry *e,
                       const uint8_t *data)
{
    uint64_t es = dcp_dtype_size(e->dtype), numel = numel_of(e), nbytes;
    int64_t off[DCP_MAX_NDIM] = {0}, sz[DCP_MAX_NDIM];
    struct dcp_err err;
    uint8_t *buf;
    int d;
    if (!e->is_tensor || dcp__mul_overflow_u64(numel, es, &nbytes) ||
        nbytes > CAP)
        return;
    buf = malloc(nbytes ? (size_t)nbytes : 1);
    if (!buf)
        return;
    if (dcp__src_read(ix, e, 0, numel, buf, CAP, &err) == DCP_OK &&
        e->contiguous && nbytes &&
        memcmp(buf, data + e->base + (uint64_t)e->storage_offset * es,
               (size_t)nbytes) != 0)
        abort(); /* read other bytes than the file holds */
    if (e->ndim > 0 && e->shape[0] >= 2) {
        for (d = 0; d < e->ndim; d++)
            sz[d] = e->shape[d];
        off[0] = e->shape[0] / 2;
        sz[0] = e->shape[0] - off[0];
        (void)dcp__src_read_box(ix, e, off, sz, buf, CAP, &err);
    }
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct src_index ix;
    struct dcp_err err;
    size_t i, done = 0;
    if (memfd < 0) {
        memfd = memfd_create("fuzz_srcfile", MFD_CLOEXEC);
        if (memfd < 0)
            abort();
        (void)snprintf(fdpath, sizeof(fdpath), "/proc/self/fd/%d", memfd);
    }
    if (ftruncate(memfd, 0) != 0)
        abort();
    while (done < size) {
        ssize_t w = pwrite(memfd, data + done, size - done, (off_t)done);
        if (w <= 0)
            abort();
        done += (size_t)w;
    }
    if (dcp__src_open(fdpath, DCP_FORMAT_AUTO, CAP, &ix, &err) != DCP_OK)
        return 0;
    for (i = 0; i < ix.n; i++) {
        if (i && strcmp(ix.e[i - 1].key, ix.e[i].key) >= 0)
            abort(); /* keys not sorted or not unique */
        check_entry(&ix.e[i], size);
    }
    for (i = 0; i < ix.n; i++)
        read_entry(&ix, &ix.e[i], data);
    dcp__src_close(&ix);
    return 0;
}
