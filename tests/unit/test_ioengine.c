/*
 * The I/O engine (src/ioengine.c): the writer and the batched reader on
 * their own, byte for byte against a model of the file, with unaligned
 * sizes, offsets and buffers, pieces smaller than a block, O_DIRECT
 * refused (at open, or by a request), no io_uring, short transfers and a
 * truncated file; then dcp_save / dcp_load with the same variations, the
 * 4096-byte alignment of tensor data in the files, and the I/O report.
 * Files go to a directory under the working directory (the build tree: a
 * disk that takes O_DIRECT, in CI), and to /dev/shm when it exists (tmpfs:
 * refuses O_DIRECT before Linux 6.6).
 */
#include <dcp/dcp.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "crc32.h"
#include "ioengine.h"
#include "storage.h"
#include "torchzip.h"
#include "test.h"

static char root[256];

static const char *path_in(const char *base, const char *name)
{
    static char buf[8][1200];
    static int k;
    k = (k + 1) % 8;
    if (strlen(base) + strlen(name) + 2 > sizeof(buf[k]))
        abort();
    memcpy(buf[k], base, strlen(base));
    buf[k][strlen(base)] = '/';
    memcpy(buf[k] + strlen(base) + 1, name, strlen(name) + 1);
    return buf[k];
}

static const char *dirpath(const char *name)
{
    if (!root[0]) {
        strcpy(root, "dcp-test-ioengine-XXXXXX");
        if (!mkdtemp(root))
            abort();
    }
    return path_in(root, name);
}

static uint64_t rng = 0x243F6A8885A308D3ull;

static uint32_t rnd(void)
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (uint32_t)((rng * 0x2545F4914F6CDD1Dull) >> 32);
}

static void fill(void *p, size_t n)
{
    uint8_t *b = p;
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        uint32_t v = rnd();
        memcpy(b + i, &v, 4);
    }
    for (; i < n; i++)
        b[i] = (uint8_t)rnd();
}

/* Memory aligned to 4096 plus mis bytes, n usable. */
static uint8_t *alloc_at(size_t n, size_t mis, void **base)
{
    if (posix_memalign(base, 4096, n + mis + 1))
        abort();
    return (uint8_t *)*base + mis;
}

static uint8_t *read_file(const char *p, size_t *len)
{
    struct stat sb;
    uint8_t *b;
    int fd = open(p, O_RDONLY);
    if (fd < 0 || fstat(fd, &sb) != 0)
        return NULL;
    b = malloc((size_t)sb.st_size + 1);
    if (b && pread(fd, b, (size_t)sb.st_size, 0) != (ssize_t)sb.st_size) {
        free(b);
        b = NULL;
    }
    close(fd);
    *len = (size_t)sb.st_size;
    return b;
}

static void reset_hooks(void)
{
    memset(&dcp__io_test, 0, sizeof(dcp__io_test));
}

/* ------------------------------------------------------------ writer */

/*
 * Writes a random sequence of headers (copied), zero padding and tensor
 * data (several sizes around the alignment and the block, from aligned
 * and unaligned memory) with engine flags `flags`, then compares the file
 * with the model and every CRC with dcp__crc32. Returns the engine's
 * statistics through st.
 */
static int write_case(const char *dir, unsigned flags, uint32_t depth,
                      size_t block, int nitems, struct io_stats *st)
{
    static const size_t sizes[] = {
        1,     7,     100,    4095,    4096,          4097,    65535,
        65536, 65537, 200000, 1 << 20, (1 << 20) + 5, 3 << 20, (5 << 20) + 17};
    static const size_t mis[] = {0, 0, 0, 1, 16, 512, 4095};
    struct dcp_err err = {0};
    struct io_eng *e = NULL;
    struct io_writer w;
    uint8_t *model, *got;
    void *bases[64];
    size_t cap = 64 << 20, len = 0, glen = 0, nb = 0;
    int dirfd = -1, fd = -1, rc, ok = 1, i;

    model = malloc(cap);
    if (!model || (rc = dcp__io_eng_create(&e, flags, depth, block, &err)))
        return 0;
    (void)mkdir(dir, 0755);
    rc = dcp__fs_open_dir(dir, &dirfd, &err);
    if (rc == DCP_OK)
        rc = dcp__fs_create(dirfd, "f.bin", &fd, &err);
    if (rc == DCP_OK)
        rc = dcp__iow_open(&w, e, dirfd, "f.bin", fd,
                           (uint64_t)(rnd() % 2) * (40u << 20), &err);
    if (rc != DCP_OK) {
        fprintf(stderr, "open: %s\n", err.msg);
        return 0;
    }
    for (i = 0; i < nitems && rc == DCP_OK && nb < 64; i++) {
        uint8_t hdr[5000];
        size_t n;
        int kind = (int)(rnd() % 3);
        if (kind == 0) { /* a header */
            n = 1 + rnd() % sizeof(hdr);
            fill(hdr, n);
            rc = dcp__iow_put(&w, hdr, n);
            memcpy(model + len, hdr, n);
        } else if (kind == 1) { /* padding */
            n = rnd() % 5000;
            rc = dcp__iow_zero(&w, n);
            memset(model + len, 0, n);
        } else { /* tensor data */
            uint32_t crc = rnd(), c0 = crc;
            uint8_t *p;
            n = sizes[rnd() % DCP_ARRAY_LEN(sizes)];
            if (len + n + 20000 > cap)
                break;
            /* Often start the data on an aligned offset, as records do. */
            if (rnd() % 2) {
                size_t pad = (4096 - len % 4096) % 4096;
                rc = dcp__iow_zero(&w, pad);
                memset(model + len, 0, pad);
                len += pad;
            }
            p = alloc_at(n, mis[rnd() % DCP_ARRAY_LEN(mis)], &bases[nb++]);
            fill(p, n);
            if (rc == DCP_OK)
                rc = dcp__iow_data(&w, p, n, &crc);
            memcpy(model + len, p, n);
            if (rc == DCP_OK && crc != dcp__crc32(c0, p, n)) {
                fprintf(stderr, "crc of %zu bytes wrong\n", n);
                ok = 0;
            }
        }
        len += n;
    }
    if (w.off != len) {
        fprintf(stderr, "writer at %llu, model at %zu\n",
                (unsigned long long)w.off, len);
        ok = 0;
    }
    if (dcp__iow_finish(&w) != DCP_OK || rc != DCP_OK) {
        fprintf(stderr, "write: %s\n", err.msg);
        ok = 0;
    }
    close(fd);
    got = read_file(path_in(dir, "f.bin"), &glen);
    if (!got || glen != len || memcmp(got, model, len) != 0) {
        fprintf(stderr, "file differs from the model (%zu vs %zu bytes)\n",
                glen, len);
        ok = 0;
    }
    dcp__io_stats_get(e, st);
    free(got);
    free(model);
    while (nb)
        free(bases[--nb]);
    close(dirfd);
    dcp__io_eng_free(e);
    return ok;
}

TEST(writer_matches_model)
{
    struct io_stats st;
    int r;
    for (r = 0; r < 6; r++) {
        ASSERT(write_case(dirpath("w-default"), 0, 0, 0, 60, &st));
        ASSERT(write_case(dirpath("w-small"), 0, 2, 64 << 10, 60, &st));
    }
    ASSERT(st.requests > 0);
    ASSERT_EQ(st.uring >= 0, 1);
    if (st.direct == 1)
        ASSERT(st.zero_copy_bytes > 0); /* aligned data went straight out */
    else
        ASSERT(st.fallback[0] != '\0');
    ASSERT(
        write_case(dirpath("w-buffered"), IO_NO_DIRECT, 4, 1 << 20, 60, &st));
    ASSERT_EQ(st.direct, 0);
    ASSERT(strstr(st.fallback, "DCP_IO_NO_DIRECT") != NULL);
    ASSERT(write_case(dirpath("w-sync"), IO_NO_URING, 0, 0, 60, &st));
    ASSERT_EQ(st.uring, 0);
    ASSERT(strstr(st.fallback, "DCP_IO_NO_URING") != NULL ||
           strstr(st.fallback, "without liburing") != NULL);
    ASSERT_EQ(st.max_in_flight, 1);
}

TEST(writer_direct_refused)
{
    struct io_stats st;
    reset_hooks();
    dcp__io_test.refuse_direct = 1; /* the open fails, as on old tmpfs */
    ASSERT(write_case(dirpath("w-refused"), 0, 4, 256 << 10, 40, &st));
    ASSERT_EQ(st.direct, 0);
    ASSERT(strstr(st.fallback, "O_DIRECT refused") != NULL);
    dcp__io_test.refuse_direct = 2; /* the open works, requests fail */
    ASSERT(write_case(dirpath("w-refused2"), 0, 4, 256 << 10, 40, &st));
    reset_hooks();
    if (st.files && st.fallback[0]) /* direct was tried and given up */
        ASSERT_EQ(st.direct, 0);
}

TEST(writer_short_and_sync)
{
    struct io_stats st;
    reset_hooks();
    dcp__io_test.short_io = 5000; /* every request completes in pieces */
    ASSERT(write_case(dirpath("w-short"), 0, 3, 128 << 10, 40, &st));
    ASSERT(write_case(dirpath("w-short-sync"), IO_NO_URING, 3, 128 << 10, 40,
                      &st));
    ASSERT(write_case(dirpath("w-short-buf"), IO_NO_DIRECT, 3, 128 << 10, 40,
                      &st));
    reset_hooks();
    dcp__io_test.no_uring = 1; /* the ring cannot be set up */
    ASSERT(write_case(dirpath("w-noring"), 0, 0, 0, 20, &st));
    ASSERT_EQ(st.uring, 0);
    ASSERT(strstr(st.fallback, "io_uring unavailable") != NULL ||
           strstr(st.fallback, "without liburing") != NULL);
    reset_hooks();
}

/* ------------------------------------------------------------ reader */

/*
 * A file of random bytes; random streams (some verified, with a wrong CRC
 * when bad) with random parts into aligned and unaligned memory, read in
 * one batch and compared.
 */
static int read_case(const char *dir, unsigned flags, uint32_t depth,
                     size_t block, int bad, uint64_t claimed_extra)
{
    struct dcp_err err = {0};
    struct io_eng *e = NULL;
    struct io_rbatch b;
    struct stat sb;
    size_t flen = (size_t)(6 << 20) + 1234, i;
    uint8_t *data = malloc(flen);
    void *bases[100];
    uint8_t *dsts[100], *exp[100];
    uint64_t lens[100];
    size_t nd = 0;
    int dirfd = -1, fd = -1, wfd, rc, ok = 1, s;

    fill(data, flen);
    (void)mkdir(dir, 0755);
    wfd = open(path_in(dir, "r.bin"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (wfd < 0 || write(wfd, data, flen) != (ssize_t)flen)
        return 0;
    close(wfd);
    if (dcp__io_eng_create(&e, flags, depth, block, &err) != DCP_OK ||
        dcp__fs_open_dir(dir, &dirfd, &err) != DCP_OK ||
        dcp__io_rbatch_init(&b, dirfd, 1, &err) != DCP_OK)
        return 0;
    fd = open(path_in(dir, "r.bin"), O_RDONLY);
    (void)fstat(fd, &sb);
    dcp__io_rbatch_file(&b, 0, "r.bin", fd,
                        (uint64_t)sb.st_size + claimed_extra);
    for (s = 0; s < 16; s++) {
        uint64_t off = rnd() % (flen - 1), len, at = 0, have;
        uint32_t id;
        int verify = (int)(rnd() % 2) || (bad && s == 5), k = 0;
        if (rnd() % 3 == 0)
            off &= ~(uint64_t)4095; /* as stored tensor data is */
        len = 1 + rnd() % (flen - off < (3u << 19) ? flen - off : (3u << 19));
        if (claimed_extra && s == 15) {
            off = flen - 10; /* runs past the real end */
            len = 10 + claimed_extra;
        }
        have = len < flen - off ? len : flen - off;
        rc = dcp__io_rbatch_stream(&b, 0, off, len,
                                   dcp__crc32(0, data + off, (size_t)have) ^
                                       (uint32_t)(bad && s == 5),
                                   verify, "k", off, &id, &err);
        while (rc == DCP_OK && at < len) {
            uint64_t n = 1 + rnd() % (len - at);
            int to_mem = !verify || rnd() % 4;
            if (rnd() % 4 == 0 || ++k == 6)
                n = len - at;
            if (!verify && rnd() % 3 == 0) { /* a hole: not read */
                at += n;
                continue;
            }
            if (to_mem) {
                size_t mis = rnd() % 2 ? 0 : rnd() % 4096;
                dsts[nd] = alloc_at((size_t)n, mis, &bases[nd]);
                memset(dsts[nd], 0xEE, (size_t)n);
                exp[nd] = data + off + at;
                lens[nd] = n;
                rc = dcp__io_rbatch_part(&b, id, at, n, dsts[nd], &err);
                nd++;
            } else {
                rc = dcp__io_rbatch_part(&b, id, at, n, NULL, &err);
            }
            at += n;
        }
        if (rc != DCP_OK)
            return 0;
    }
    rc = dcp__io_rbatch_run(&b, e, &err);
    if (bad || claimed_extra) {
        ok = rc == DCP_ECORRUPT;
        if (!ok)
            fprintf(stderr, "wanted DCP_ECORRUPT, got %d: %s\n", rc, err.msg);
        else if (claimed_extra && !strstr(err.msg, "truncated"))
            ok = 0;
        else if (bad && !strstr(err.msg, "CRC mismatch"))
            ok = 0;
    } else if (rc != DCP_OK) {
        fprintf(stderr, "read: %s\n", err.msg);
        ok = 0;
    } else {
        for (i = 0; i < nd; i++)
            if (memcmp(dsts[i], exp[i], (size_t)lens[i]) != 0) {
                fprintf(stderr, "part %zu (%llu bytes) differs\n", i,
                        (unsigned long long)lens[i]);
                ok = 0;
            }
    }
    for (i = 0; i < nd; i++)
        free(bases[i]);
    dcp__io_rbatch_release(&b);
    dcp__io_eng_free(e);
    close(fd);
    close(dirfd);
    free(data);
    return ok;
}

TEST(reader_matches_file)
{
    int r;
    for (r = 0; r < 5; r++) {
        ASSERT(read_case(dirpath("r"), 0, 0, 0, 0, 0));
        ASSERT(read_case(dirpath("r"), 0, 2, 64 << 10, 0, 0));
        ASSERT(read_case(dirpath("r"), IO_NO_DIRECT, 4, 1 << 20, 0, 0));
        ASSERT(read_case(dirpath("r"), IO_NO_URING, 4, 256 << 10, 0, 0));
    }
}

TEST(reader_faults)
{
    reset_hooks();
    ASSERT(read_case(dirpath("r"), 0, 4, 256 << 10, 1, 0));    /* CRC */
    ASSERT(read_case(dirpath("r"), 0, 4, 256 << 10, 0, 8192)); /* short */
    ASSERT(read_case(dirpath("r"), IO_NO_DIRECT, 4, 256 << 10, 0, 100));
    dcp__io_test.short_io = 3000;
    ASSERT(read_case(dirpath("r"), 0, 3, 128 << 10, 0, 0));
    ASSERT(read_case(dirpath("r"), IO_NO_URING, 3, 128 << 10, 0, 0));
    dcp__io_test.short_io = 0;
    dcp__io_test.refuse_direct = 1;
    ASSERT(read_case(dirpath("r"), 0, 3, 128 << 10, 0, 0));
    dcp__io_test.refuse_direct = 2;
    ASSERT(read_case(dirpath("r"), 0, 3, 128 << 10, 0, 0));
    reset_hooks();
}

/* --------------------------------------------------- save and load */

#define NT 9

struct tstate {
    void *base[NT];
    uint8_t *buf[NT];
    int64_t shape[NT][2];
    int ndim[NT];
    dcp_dtype dt[NT];
};

/* Tensors of awkward sizes (1 byte to a few MiB, not multiples of 4096)
 * in buffers misaligned by mis bytes (0: aligned). */
static void make_tensors(struct tstate *t, size_t mis, int fill_them)
{
    static const int64_t rows[NT] = {1, 3, 1, 1025, 333, 4097, 2, 777, 1};
    static const int64_t cols[NT] = {1, 1, 4096, 1, 1001, 257, 1 << 19, 1, 0};
    static const dcp_dtype dts[NT] = {DCP_U8,  DCP_F32,  DCP_F32,
                                      DCP_F64, DCP_F32,  DCP_I16,
                                      DCP_U8,  DCP_BF16, DCP_F32};
    for (int i = 0; i < NT; i++) {
        size_t n;
        t->dt[i] = dts[i];
        t->ndim[i] = cols[i] ? 2 : 0;
        t->shape[i][0] = rows[i];
        t->shape[i][1] = cols[i];
        n = (size_t)(cols[i] ? rows[i] * cols[i] : 1) * dcp_dtype_size(dts[i]);
        t->buf[i] = alloc_at(n, i % 2 ? mis : 0, &t->base[i]);
        if (fill_them)
            fill(t->buf[i], n);
        else
            memset(t->buf[i], 0, n);
    }
}

static size_t tbytes(const struct tstate *t, int i)
{
    return (size_t)(t->ndim[i] ? t->shape[i][0] * t->shape[i][1] : 1) *
           dcp_dtype_size(t->dt[i]);
}

static void free_tensors(struct tstate *t)
{
    for (int i = 0; i < NT; i++)
        free(t->base[i]);
}

static dcp_state *state_of(struct tstate *t)
{
    dcp_state *st = NULL;
    char name[16];
    if (dcp_state_create(&st) != DCP_OK)
        return NULL;
    for (int i = 0; i < NT; i++) {
        snprintf(name, sizeof(name), "t%d", i);
        if (dcp_state_add_tensor(st, name, t->dt[i], t->ndim[i], t->shape[i],
                                 NULL, NULL, t->buf[i], DCP_MEM_HOST) != DCP_OK)
            return NULL;
    }
    if (dcp_state_add_value(st, "step", dcp_value_int(7)) != DCP_OK)
        return NULL;
    return st;
}

static dcp_ctx *ctx_with(uint32_t flags, uint32_t depth, uint32_t block)
{
    dcp_ctx_options o;
    dcp_ctx *ctx = NULL;
    memset(&o, 0, sizeof(o));
    o.struct_size = sizeof(o);
    o.io_flags = flags;
    o.io_depth = depth;
    o.io_block_bytes = block;
    if (dcp_ctx_create(&ctx, NULL, &o) != DCP_OK)
        return NULL;
    return ctx;
}

/* Every tensor record's data starts on a 4096-byte file offset and every
 * record on a 64-byte one. */
struct recsrc {
    int fd;
    uint64_t base;
};

static int recsrc_read(void *opaque, uint64_t off, void *buf, size_t len,
                       struct dcp_err *err)
{
    const struct recsrc *r = opaque;
    return dcp__fs_pread(r->fd, buf, len, r->base + off, "data", err);
}

static int check_alignment(dcp_ctx *ctx, const char *dirp)
{
    dcp_metadata *md = NULL;
    char dir[512];
    int ok = 1;
    snprintf(dir, sizeof(dir), "%s", dirp);
    if (dcp_metadata_open(ctx, dir, &md) != DCP_OK)
        return 0;
    for (size_t i = 0; i < dcp_metadata_count(md); i++) {
        dcp_entry_info ei;
        dcp_chunk_info ci;
        struct tz_archive a;
        struct dcp_err err = {0};
        struct recsrc r;
        const struct tz_entry *d;
        (void)dcp_metadata_entry(md, i, &ei);
        if (!ei.is_tensor || dcp_metadata_chunk(md, i, 0, &ci) != DCP_OK)
            continue;
        r.fd = open(path_in(dir, ci.file), O_RDONLY);
        r.base = ci.offset;
        if (r.fd < 0 || dcp__tz_open(&a, ci.length, recsrc_read, &r, &err)) {
            fprintf(stderr, "'%s': cannot parse: %s\n", ei.key, err.msg);
            ok = 0;
        }
        d = ok ? dcp__tz_find(&a, "data/0") : NULL;
        if (ci.offset % 64 || (d && (ci.offset + d->data_off) % 4096)) {
            fprintf(stderr, "'%s': record at %llu, data at +%llu\n", ei.key,
                    (unsigned long long)ci.offset,
                    (unsigned long long)(d ? d->data_off : 0));
            ok = 0;
        }
        close(r.fd);
    }
    dcp_metadata_free(md);
    return ok;
}

/* Saves with one engine configuration, loads with another, compares. */
static int roundtrip(const char *dirp, size_t mis_save, size_t mis_load,
                     dcp_ctx *sctx, dcp_ctx *lctx, unsigned lflags)
{
    char dir[512];
    struct tstate a, b;
    dcp_state *sa, *sb;
    dcp_load_options lo;
    int ok = 1, rc;
    snprintf(dir, sizeof(dir), "%s", dirp);
    make_tensors(&a, mis_save, 1);
    make_tensors(&b, mis_load, 0);
    sa = state_of(&a);
    sb = state_of(&b);
    memset(&lo, 0, sizeof(lo));
    lo.struct_size = sizeof(lo);
    lo.flags = lflags;
    rc = dcp_save(sctx, sa, dir, NULL);
    if (rc != DCP_OK) {
        fprintf(stderr, "save: %s\n", dcp_errmsg(sctx));
        ok = 0;
    }
    if (ok && (rc = dcp_load(lctx, sb, dir, &lo)) != DCP_OK) {
        fprintf(stderr, "load: %s\n", dcp_errmsg(lctx));
        ok = 0;
    }
    for (int i = 0; ok && i < NT; i++)
        if (memcmp(a.buf[i], b.buf[i], tbytes(&a, i)) != 0) {
            fprintf(stderr, "t%d differs\n", i);
            ok = 0;
        }
    if (ok)
        ok = check_alignment(sctx, dir);
    dcp_state_free(sa);
    dcp_state_free(sb);
    free_tensors(&a);
    free_tensors(&b);
    return ok;
}

TEST(save_load_unaligned_and_small)
{
    static const size_t mis[] = {0, 1, 3, 16, 512, 4095};
    dcp_ctx *def = ctx_with(0, 0, 0), *tiny = ctx_with(0, 2, 64 << 10);
    dcp_ctx *buf = ctx_with(DCP_IO_NO_DIRECT, 0, 0);
    dcp_ctx *sync = ctx_with(DCP_IO_NO_URING, 1, 128 << 10);
    dcp_ctx *all[4] = {def, tiny, buf, sync};
    dcp_io_report rep;
    ASSERT(def && tiny && buf && sync);
    for (size_t i = 0; i < DCP_ARRAY_LEN(mis); i++)
        for (int s = 0; s < 4; s++)
            ASSERT(roundtrip(dirpath("rt"), mis[i], mis[(i + 1) % 6], all[s],
                             all[(s + i) % 4], i % 2 ? DCP_LOAD_NO_VERIFY : 0));
    rep.struct_size = sizeof(rep);
    ASSERT_OK(dcp_ctx_io_report(def, DCP_IO_SAVE, &rep));
    ASSERT_EQ(rep.files, 1);
    ASSERT(rep.bytes > 0);
    ASSERT(rep.direct == 1 || rep.fallback[0] != '\0');
    ASSERT_OK(dcp_ctx_io_report(buf, DCP_IO_LOAD, &rep));
    ASSERT_EQ(rep.direct, 0);
    ASSERT(strstr(rep.fallback, "DCP_IO_NO_DIRECT") != NULL);
    ASSERT_OK(dcp_ctx_io_report(sync, DCP_IO_SAVE, &rep));
    ASSERT_EQ(rep.uring, 0);
    ASSERT_EQ(rep.max_in_flight, 1);
    rep.struct_size = 4;
    ASSERT_RC(dcp_ctx_io_report(def, DCP_IO_SAVE, &rep), DCP_EINVAL);
    rep.struct_size = sizeof(rep);
    ASSERT_RC(dcp_ctx_io_report(def, 7, &rep), DCP_EINVAL);
    for (int s = 0; s < 4; s++)
        dcp_ctx_free(all[s]);
}

TEST(zero_copy_when_aligned)
{
    dcp_ctx *ctx = ctx_with(0, 0, 0);
    dcp_io_report rep;
    ASSERT(ctx);
    ASSERT(roundtrip(dirpath("zc"), 0, 0, ctx, ctx, 0));
    rep.struct_size = sizeof(rep);
    ASSERT_OK(dcp_ctx_io_report(ctx, DCP_IO_SAVE, &rep));
    if (rep.direct == 1) {
        /* t6 (1 MiB, aligned) is written from the caller's buffer and read
         * back into it; headers and small tensors are copied. */
        ASSERT(rep.zero_copy_bytes >= (1u << 20));
        ASSERT(rep.bounce_bytes > 0);
        ASSERT_OK(dcp_ctx_io_report(ctx, DCP_IO_LOAD, &rep));
        ASSERT(rep.zero_copy_bytes >= (1u << 20));
    }
    dcp_ctx_free(ctx);
}

TEST(bad_io_options)
{
    dcp_ctx_options o;
    dcp_ctx *ctx = NULL;
    memset(&o, 0, sizeof(o));
    o.struct_size = sizeof(o);
    o.io_depth = 1000;
    ASSERT_RC(dcp_ctx_create(&ctx, NULL, &o), DCP_EINVAL);
    o.io_depth = 0;
    o.io_block_bytes = 5000;
    ASSERT_RC(dcp_ctx_create(&ctx, NULL, &o), DCP_EINVAL);
    o.io_block_bytes = 0;
    o.io_flags = 1u << 7;
    ASSERT_RC(dcp_ctx_create(&ctx, NULL, &o), DCP_EINVAL);
    /* An old caller's smaller options: the I/O fields are not read. */
    o.struct_size = 24;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, &o));
    dcp_ctx_free(ctx);
}

/* tmpfs: O_DIRECT refused before Linux 6.6; either way the data is right
 * and the report says what happened. */
TEST(tmpfs)
{
    char dir[] = "/dev/shm/dcp-test-io-XXXXXX";
    dcp_ctx *ctx = ctx_with(0, 0, 0);
    dcp_io_report rep;
    struct stat sb;
    ASSERT(ctx);
    if (stat("/dev/shm", &sb) != 0 || !mkdtemp(dir)) {
        dcp_ctx_free(ctx);
        return; /* no tmpfs here: covered by the refuse_direct hook */
    }
    {
        char cmd[128];
        int ok = roundtrip(path_in(dir, "c"), 1, 0, ctx, ctx, 0);
        snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", dir);
        ASSERT(ok);
    }
    rep.struct_size = sizeof(rep);
    ASSERT_OK(dcp_ctx_io_report(ctx, DCP_IO_SAVE, &rep));
    ASSERT(rep.direct == 1 || strstr(rep.fallback, "O_DIRECT") != NULL);
    dcp_ctx_free(ctx);
}

/* Direct I/O refused by every request (a filesystem that takes the open):
 * the save and the load still work, buffered, and say so. */
TEST(save_load_direct_refused)
{
    dcp_ctx *ctx = ctx_with(0, 0, 0);
    dcp_io_report rep;
    ASSERT(ctx);
    reset_hooks();
    dcp__io_test.refuse_direct = 2;
    ASSERT(roundtrip(dirpath("refused"), 0, 0, ctx, ctx, 0));
    dcp__io_test.refuse_direct = 1;
    ASSERT(roundtrip(dirpath("refused1"), 0, 5, ctx, ctx, 0));
    reset_hooks();
    rep.struct_size = sizeof(rep);
    ASSERT_OK(dcp_ctx_io_report(ctx, DCP_IO_LOAD, &rep));
    ASSERT_EQ(rep.direct, 0);
    ASSERT(strstr(rep.fallback, "O_DIRECT refused") != NULL);
    dcp_ctx_free(ctx);
}

TEST(save_load_short_io)
{
    dcp_ctx *ctx = ctx_with(0, 3, 64 << 10);
    ASSERT(ctx);
    reset_hooks();
    dcp__io_test.short_io = 6000;
    ASSERT(roundtrip(dirpath("short"), 0, 0, ctx, ctx, 0));
    ASSERT(roundtrip(dirpath("short"), 7, 9, ctx, ctx, DCP_LOAD_NO_VERIFY));
    reset_hooks();
    dcp_ctx_free(ctx);
}

/* A box of a stored chunk: the load reads part of it (and, verifying, the
 * rest for the CRC only). */
TEST(partial_boxes)
{
    dcp_ctx *ctx = ctx_with(0, 2, 64 << 10);
    enum { R = 1000, C = 333 };
    int64_t shape[2] = {R, C};
    float *full = malloc(sizeof(float) * R * C);
    dcp_state *st = NULL;
    ASSERT(ctx && full);
    fill(full, sizeof(float) * R * C);
    ASSERT_OK(dcp_state_create(&st));
    ASSERT_OK(dcp_state_add_tensor(st, "w", DCP_F32, 2, shape, NULL, NULL, full,
                                   DCP_MEM_HOST));
    ASSERT_OK(dcp_save(ctx, st, dirpath("part"), NULL));
    dcp_state_free(st);
    for (int v = 0; v < 2; v++) {
        /* Rows [r0, r0+n) in two boxes, one of them unaligned. */
        int64_t o1[2] = {17, 0}, s1[2] = {400, C}, o2[2] = {600, 0},
                s2[2] = {399, C};
        void *b1, *b2;
        float *d1 = (float *)(void *)alloc_at(sizeof(float) * 400 * C, 0, &b1);
        float *d2 =
            (float *)(void *)alloc_at(sizeof(float) * 399 * C + 4, 4, &b2);
        dcp_load_options lo;
        memset(&lo, 0, sizeof(lo));
        lo.struct_size = sizeof(lo);
        lo.flags = DCP_LOAD_PARTIAL | (v ? DCP_LOAD_NO_VERIFY : 0);
        ASSERT_OK(dcp_state_create(&st));
        ASSERT_OK(dcp_state_add_tensor(st, "w", DCP_F32, 2, shape, o1, s1, d1,
                                       DCP_MEM_HOST));
        ASSERT_OK(dcp_state_add_tensor(st, "w", DCP_F32, 2, shape, o2, s2, d2,
                                       DCP_MEM_HOST));
        ASSERT_OK(dcp_load(ctx, st, dirpath("part"), &lo));
        ASSERT_MEM_EQ(d1, full + 17 * C, sizeof(float) * 400 * C);
        ASSERT_MEM_EQ(d2, full + 600 * C, sizeof(float) * 399 * C);
        dcp_state_free(st);
        free(b1);
        free(b2);
    }
    free(full);
    dcp_ctx_free(ctx);
}

int main(void)
{
    RUN(writer_matches_model);
    RUN(writer_direct_refused);
    RUN(writer_short_and_sync);
    RUN(reader_matches_file);
    RUN(reader_faults);
    RUN(save_load_unaligned_and_small);
    RUN(zero_copy_when_aligned);
    RUN(bad_io_options);
    RUN(tmpfs);
    RUN(save_load_direct_refused);
    RUN(save_load_short_io);
    RUN(partial_boxes);
    {
        char cmd[300];
        snprintf(cmd, sizeof(cmd), "rm -rf %s", root);
        if (root[0] && system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", root);
    }
    return TEST_SUMMARY();
}
