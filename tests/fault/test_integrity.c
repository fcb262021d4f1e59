/*
 * Integrity: corruptions of a committed checkpoint, applied in memory and
 * loaded through the real read path (dcp_load over an in-memory storage
 * back end, so 10^5 trials take seconds):
 *  - exhaustive single-bit flips of every .metadata byte;
 *  - random corruptions of the data files: 1 to 8 bit flips, bursts of up
 *    to 32 bits, 4 KiB sectors zeroed or randomised, truncations;
 *  - every single-bit flip and truncation point of the tensor bytes of
 *    one record (exhaustive);
 *  - files swapped between the two ranks of a checkpoint, and a data file
 *    replaced by the one of an older checkpoint with the same layout.
 * A load may fail (any error) or succeed bit-exact; "silent" is a load
 * that succeeds with different data. Every corruption that touches tensor
 * bytes must be detected (by the CRC: DCP_ECORRUPT), and silent outcomes
 * must be 0 for all corruptions within a file. Swaps and stale files keep
 * every record self-consistent: the DCP format's .metadata carries no
 * checksum or identity for the records, so a swap between files of
 * identical layout cannot be detected; the test counts those outcomes and
 * reports them without failing (docs/RELIABILITY.md explains).
 * Finally the cost of checking: load throughput with and without CRC
 * verification, and raw CRC-32 throughput, in GB/s.
 * Usage: test_integrity [TRIALS] (default 100000, 10000 under ASan;
 * DCP_INTEGRITY_TRIALS overrides).
 */
#include <dcp/dcp.h>
#include <dcp/dcp_storage.h>

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "crc32.h"
#include "forkcomm.h"
#include "refstate.h"
#include "test.h"

/* ---------------------------------------------- in-memory directory */

struct mfile {
    char name[64];
    uint8_t *p;
    size_t len;
};

struct mdir {
    struct mfile f[8];
    size_t n;
};

static int md_ro(struct dcp_err *err)
{
    return dcp_storage_set_error(err, DCP_EIO, "read-only");
}
static int m_mkdirs(void *i, const char *p, struct dcp_err *e)
{
    (void)i;
    (void)p;
    return md_ro(e);
}
static int m_open_dir(void *i, const char *p, void **d, struct dcp_err *e)
{
    (void)p;
    (void)e;
    *d = i;
    return DCP_OK;
}
static void m_close_dir(void *i, void *d)
{
    (void)i;
    (void)d;
}
static int m_create(void *i, void *d, const char *n, void **f,
                    struct dcp_err *e)
{
    (void)i;
    (void)d;
    (void)n;
    (void)f;
    return md_ro(e);
}
static int m_open_read(void *i, void *d, const char *n, void **f,
                       uint64_t *size, struct dcp_err *e)
{
    struct mdir *m = i;
    size_t k;
    (void)d;
    for (k = 0; k < m->n; k++)
        if (!strcmp(m->f[k].name, n)) {
            *f = &m->f[k];
            *size = m->f[k].len;
            return DCP_OK;
        }
    return dcp_storage_set_error(e, DCP_ENOENT, "cannot open '%s'", n);
}
static int m_write_at(void *i, void *f, const char *n, const void *p,
                      size_t len, uint64_t off, struct dcp_err *e)
{
    (void)i;
    (void)f;
    (void)n;
    (void)p;
    (void)len;
    (void)off;
    return md_ro(e);
}
static int m_read_at(void *i, void *f, const char *n, void *p, size_t len,
                     uint64_t off, struct dcp_err *e)
{
    struct mfile *mf = f;
    (void)i;
    if (off > mf->len || len > mf->len - off)
        return dcp_storage_set_error(e, DCP_ECORRUPT, "'%s' is truncated", n);
    memcpy(p, mf->p + off, len);
    return DCP_OK;
}
static int m_sync(void *i, void *f, const char *n, struct dcp_err *e)
{
    (void)i;
    (void)f;
    (void)n;
    return md_ro(e);
}
static int m_close(void *i, void *f, const char *n, struct dcp_err *e)
{
    (void)i;
    (void)f;
    (void)n;
    (void)e;
    return DCP_OK;
}
static int m_rename(void *i, void *d, const char *a, const char *b,
                    struct dcp_err *e)
{
    (void)i;
    (void)d;
    (void)a;
    (void)b;
    return md_ro(e);
}
static int m_sync_dir(void *i, void *d, const char *p, struct dcp_err *e)
{
    (void)i;
    (void)d;
    (void)p;
    return md_ro(e);
}
static int m_unlink(void *i, void *d, const char *n, struct dcp_err *e)
{
    (void)i;
    (void)d;
    (void)n;
    return md_ro(e);
}
static int m_exists(void *i, void *d, const char *n, int *found,
                    struct dcp_err *e)
{
    struct mdir *m = i;
    size_t k;
    (void)d;
    (void)e;
    *found = 0;
    for (k = 0; k < m->n; k++)
        *found |= !strcmp(m->f[k].name, n);
    return DCP_OK;
}

/* A version-1 table (served through dcp's adapters). */
static const dcp_storage_ops mem_ops = {
    .version = 1,
    .mkdirs = m_mkdirs,
    .open_dir = m_open_dir,
    .close_dir = m_close_dir,
    .create = m_create,
    .open_read = m_open_read,
    .write_at = m_write_at,
    .read_at = m_read_at,
    .sync = m_sync,
    .close = m_close,
    .rename = m_rename,
    .sync_dir = m_sync_dir,
    .unlink = m_unlink,
    .exists = m_exists,
};

/* Reads every file of a checkpoint directory into m. */
static int mdir_load(struct mdir *m, const char *dir)
{
    static const char *names[] = {".metadata", "__0_0.distcp", "__1_0.distcp"};
    size_t k;
    memset(m, 0, sizeof(*m));
    for (k = 0; k < (sizeof(names) / sizeof(names[0])); k++) {
        char path[600];
        FILE *f;
        long n;
        snprintf(path, sizeof(path), "%s/%s", dir, names[k]);
        f = fopen(path, "rb");
        if (!f)
            continue;
        fseek(f, 0, SEEK_END);
        n = ftell(f);
        fseek(f, 0, SEEK_SET);
        snprintf(m->f[m->n].name, sizeof(m->f[m->n].name), "%s", names[k]);
        m->f[m->n].p = malloc((size_t)n + 1);
        m->f[m->n].len = (size_t)n;
        if (!m->f[m->n].p || fread(m->f[m->n].p, 1, (size_t)n, f) != (size_t)n)
            abort();
        fclose(f);
        m->n++;
    }
    return m->n >= 2 ? 0 : -1;
}

static void mdir_copy(struct mdir *dst, const struct mdir *src)
{
    size_t k;
    for (k = 0; k < src->n; k++) {
        memcpy(dst->f[k].p, src->f[k].p, src->f[k].len);
        dst->f[k].len = src->f[k].len;
    }
}

static void mdir_clone(struct mdir *dst, const struct mdir *src)
{
    size_t k;
    *dst = *src;
    for (k = 0; k < src->n; k++) {
        dst->f[k].p = malloc(src->f[k].len + 1);
        if (!dst->f[k].p)
            abort();
    }
    mdir_copy(dst, src);
}

static void mdir_free(struct mdir *m)
{
    size_t k;
    for (k = 0; k < m->n; k++)
        free(m->f[k].p);
}

/* ------------------------------------------------------------ trials */

static struct mdir pristine, work;
static dcp_ctx *ctx;
static struct refstate want, got;
static unsigned nranks_saved = 1;

/* Outcome of a load of work: 0 bit-exact, 1 refused, 2 silent (loaded,
 * different data); *code receives the error. */
static int trial(int *code)
{
    int rc;
    memset(got.big, 0, (size_t)rs_big_rows * 160 * 2);
    memset(got.mat, 0, sizeof(got.mat));
    memset(got.vec, 0, sizeof(got.vec));
    rc = dcp_load(ctx, got.st, "mem", NULL);
    *code = rc;
    if (rc != 0)
        return 1;
    return rs_equal(&got, &want) ? 0 : 2;
}

static uint64_t rng = 0x9e3779b97f4a7c15ULL;
static uint64_t next(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* Byte ranges of tensor elements in the data files (found by content:
 * the shards of the 2-rank save, and the replicated vec once). */
struct range {
    size_t file, off, len;
};
static struct range ranges[8];
static size_t nranges;

static void find_ranges(void)
{
    const struct {
        const void *p;
        size_t len;
    } t[] = {
        {want.big, (size_t)rs_big_rows / 2 * 160 * 2},
        {want.big + rs_big_rows / 2 * 160, (size_t)rs_big_rows / 2 * 160 * 2},
        {want.mat, 16 * 17 * 4},
        {want.mat + 16 * 17, 17 * 17 * 4},
        {want.vec, sizeof(want.vec)}};
    size_t i, k, o;
    nranges = 0;
    for (i = 0; i < (sizeof(t) / sizeof(t[0])); i++)
        for (k = 1; k < pristine.n; k++)
            for (o = 0; o + t[i].len <= pristine.f[k].len; o++)
                if (!memcmp(pristine.f[k].p + o, t[i].p, t[i].len)) {
                    ranges[nranges].file = k;
                    ranges[nranges].off = o;
                    ranges[nranges].len = t[i].len;
                    nranges++;
                    k = pristine.n;
                    break;
                }
}

/* Whether the corruption of file k (work against pristine) reaches tensor
 * bytes. */
static int tensor_touched(size_t k)
{
    size_t i;
    for (i = 0; i < nranges; i++) {
        const struct range *r = &ranges[i];
        if (r->file != k)
            continue;
        if (work.f[k].len < r->off + r->len ||
            memcmp(work.f[k].p + r->off, pristine.f[k].p + r->off, r->len))
            return 1;
    }
    return 0;
}

struct tally {
    long trials, exact, refused, silent, tensor, tensor_detected, crc_codes;
};

static void count(struct tally *t, int outcome, int code, int tensor)
{
    t->trials++;
    t->exact += outcome == 0;
    t->refused += outcome == 1;
    t->silent += outcome == 2;
    if (tensor) {
        t->tensor++;
        t->tensor_detected += outcome == 1;
        t->crc_codes += code == DCP_ECORRUPT;
    }
}

static void report(const char *what, const struct tally *t)
{
    printf("integrity %-28s %7ld trials: %7ld refused, %6ld harmless "
           "(bit-exact), %ld silent; tensor-byte corruptions %ld, detected "
           "%ld (%ld by CRC)\n",
           what, t->trials, t->refused, t->exact, t->silent, t->tensor,
           t->tensor_detected, t->crc_codes);
}

/* 10^5 random trials; 10^4 under ASan (ten times slower), so the ASan run
 * stays within seconds: the plain build runs the full count. */
#define DEFAULT_TRIALS (RS_SANITIZED ? 10000 : 100000)
static long ntrials = DEFAULT_TRIALS;

TEST(metadata_every_bit)
{
    struct tally t = {0};
    size_t len = pristine.f[0].len, i;
    int b, code;
    for (i = 0; i < len; i++)
        for (b = 0; b < 8; b++) {
            int o;
            work.f[0].p[i] ^= (uint8_t)(1u << b);
            o = trial(&code);
            if (o == 2 && getenv("DCP_INTEGRITY_DUMP")) {
                FILE *f = fopen(getenv("DCP_INTEGRITY_DUMP"), "wb");
                fwrite(work.f[0].p, 1, len, f);
                fclose(f);
            }
            work.f[0].p[i] ^= (uint8_t)(1u << b);
            count(&t, o, code, 0);
        }
    for (i = 0; i < len; i++) {
        int o;
        work.f[0].len = i;
        o = trial(&code);
        count(&t, o, code, 0);
        ASSERT(o == 1);
    }
    work.f[0].len = len;
    report("metadata: every bit, cut", &t);
    /* Silent outcomes here are records redirected to another record of
     * the same size and kind (no checksum in .metadata): reported. */
    printf("integrity metadata single-bit flips undetected: %ld of %ld\n",
           t.silent, t.trials - (long)len);
}

TEST(record_every_bit)
{
    struct tally t = {0};
    const struct range *r = &ranges[nranges - 1]; /* vec, found last */
    size_t i;
    int b, code;
    for (i = r->off; i < r->off + r->len; i++)
        for (b = 0; b < 8; b++) {
            int o;
            work.f[r->file].p[i] ^= (uint8_t)(1u << b);
            o = trial(&code);
            work.f[r->file].p[i] ^= (uint8_t)(1u << b);
            count(&t, o, code, 1);
            if (o != 1 || code != DCP_ECORRUPT)
                FAIL_AT_("tensor byte %zu bit %d: outcome %d code %s", i, b, o,
                         dcp_err_name(code));
        }
    report("tensor bytes: every bit", &t);
}

TEST(random_corruptions)
{
    struct tally t = {0};
    long n;
    int code;
    for (n = 0; n < ntrials; n++) {
        size_t k = 1 + next() % (pristine.n - 1), len = pristine.f[k].len;
        size_t i;
        unsigned kind = (unsigned)(next() % 10);
        int o, touched;
        uint8_t *p = work.f[k].p;
        if (kind < 4) { /* 1..8 random bit flips */
            unsigned nb = 1 + (unsigned)(next() % 8), j;
            for (j = 0; j < nb; j++)
                p[next() % len] ^= (uint8_t)(1u << (next() % 8));
        } else if (kind < 6) { /* a burst of 1..32 bits */
            size_t at = next() % (len * 8), nb = 1 + next() % 32;
            for (i = 0; i < nb && at + i < len * 8; i++)
                p[(at + i) / 8] ^= (uint8_t)(1u << ((at + i) % 8));
        } else if (kind < 8) { /* a 4 KiB sector zeroed or randomised */
            size_t s0 = (next() % ((len + 4095) / 4096)) * 4096;
            size_t e = s0 + 4096 < len ? s0 + 4096 : len;
            int zero = (int)(next() & 1);
            for (i = s0; i < e; i++)
                p[i] = zero ? 0 : (uint8_t)next();
        } else { /* truncation */
            work.f[k].len = next() % len;
        }
        touched = tensor_touched(k);
        o = trial(&code);
        count(&t, o, code, touched);
        if (o == 2)
            FAIL_AT_("trial %ld (kind %u, file %zu): silent", n, kind, k);
        if (touched && o != 1)
            FAIL_AT_("trial %ld (kind %u): tensor bytes corrupted, not "
                     "detected",
                     n, kind);
        memcpy(work.f[k].p, pristine.f[k].p, len);
        work.f[k].len = len;
    }
    report("data files: random", &t);
    ASSERT_EQ(t.tensor_detected, t.tensor);
}

/* Swaps: counted, reported, not failed (see the top comment). */
static void swaps(const struct mdir *older)
{
    struct tally t = {0};
    int code, o;
    if (pristine.n == 3) {
        struct mfile tmp = work.f[1];
        work.f[1] = work.f[2];
        work.f[2] = tmp;
        snprintf(work.f[1].name, sizeof(work.f[1].name), "__0_0.distcp");
        snprintf(work.f[2].name, sizeof(work.f[2].name), "__1_0.distcp");
        o = trial(&code);
        count(&t, o, code, 0);
        tmp = work.f[1];
        work.f[1] = work.f[2];
        work.f[2] = tmp;
        snprintf(work.f[1].name, sizeof(work.f[1].name), "__0_0.distcp");
        snprintf(work.f[2].name, sizeof(work.f[2].name), "__1_0.distcp");
        mdir_copy(&work, &pristine);
    }
    {
        size_t k;
        for (k = 1; k < pristine.n && k < older->n; k++) {
            struct mfile keep = work.f[k];
            work.f[k] = older->f[k];
            o = trial(&code);
            count(&t, o, code, 0);
            work.f[k] = keep;
        }
        /* The older checkpoint's .metadata with the new data files. */
        {
            struct mfile keep = work.f[0];
            work.f[0] = older->f[0];
            o = trial(&code);
            count(&t, o, code, 0);
            work.f[0] = keep;
        }
    }
    report("swapped/stale files", &t);
    printf("integrity swapped/stale files: %ld of %ld undetected (the DCP "
           "format has no checksum in .metadata)\n",
           t.silent, t.trials);
}

/* Seconds since t0. */
static double since(const struct timespec *t0)
{
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0->tv_sec) +
           1e-9 * (double)(t1.tv_nsec - t0->tv_nsec);
}

/* Best of 5 of a load of lt from dir through c (flags: load flags). */
static double best_load(dcp_ctx *c, dcp_state *lt, const char *dir,
                        unsigned flags)
{
    dcp_load_options lo = {sizeof(lo), flags, NULL};
    struct timespec t0;
    double best = 1e9, s;
    int rep;
    for (rep = 0; rep < 5; rep++) {
        clock_gettime(CLOCK_MONOTONIC, &t0);
        if (dcp_load(c, lt, dir, &lo))
            abort();
        s = since(&t0);
        best = s < best ? s : best;
    }
    return best;
}

/*
 * Cost of checking, on a 64 MiB tensor: CRC-32 alone, a plain copy and the
 * copy with the CRC fused into it (what the I/O engine does when bytes go
 * through its buffers), and loads with and without CRC checks, from the
 * in-memory back end and from a file in the page cache (POSIX back end,
 * the I/O engine).
 */
static void cost(void)
{
    const size_t n = (size_t)64 << 20;
    int64_t shape[1] = {(int64_t)(n / 4)};
    char dir[128];
    uint8_t *buf = malloc(n), *dst = malloc(n);
    dcp_state *st, *lt;
    struct mdir big, saved;
    dcp_ctx *c2, *cf, *cb;
    dcp_ctx_options o = {0};
    dcp_io_report rep_d, rep_b;
    struct timespec t0;
    double tv, tn, fv, fn, bv, bn, tc = 1e9, tm = 1e9, tf = 1e9, s;
    int rep;
    uint32_t crc = 0, crc2 = 0;
    if (!buf || !dst)
        abort();
    rs_fill(buf, n, 77);
    strcpy(dir, "/tmp/dcp-integrity-cost-XXXXXX");
    if (!mkdtemp(dir) || dcp_ctx_create(&c2, NULL, NULL) ||
        dcp_state_create(&st) || dcp_state_create(&lt))
        abort();
    if (dcp_state_add_tensor(st, "t", DCP_F32, 1, shape, NULL, NULL, buf,
                             DCP_MEM_HOST) ||
        dcp_state_add_tensor(lt, "t", DCP_F32, 1, shape, NULL, NULL, dst,
                             DCP_MEM_HOST))
        abort();
    {
        dcp_save_options so = {sizeof(so), 1, 0, NULL};
        if (dcp_save(c2, st, dir, &so))
            abort();
    }
    if (mdir_load(&saved, dir))
        abort();
    big = saved;
    cf = c2; /* POSIX, for the loads from the file */
    o.struct_size = sizeof(o);
    o.storage = &mem_ops;
    o.storage_impl = &big;
    if (dcp_ctx_create(&c2, NULL, &o))
        abort();
    for (rep = 0; rep < 5; rep++) {
        clock_gettime(CLOCK_MONOTONIC, &t0);
        crc ^= dcp__crc32(0, buf, n);
        s = since(&t0);
        tc = s < tc ? s : tc;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        memcpy(dst, buf, n);
        s = since(&t0);
        tm = s < tm ? s : tm;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        crc2 ^= dcp__crc32_copy(0, dst, buf, n);
        s = since(&t0);
        tf = s < tf ? s : tf;
    }
    if (crc != crc2)
        abort();
    tv = best_load(c2, lt, "mem", 0);
    tn = best_load(c2, lt, "mem", DCP_LOAD_NO_VERIFY);
    fv = best_load(cf, lt, dir, 0);
    fn = best_load(cf, lt, dir, DCP_LOAD_NO_VERIFY);
    rep_d.struct_size = sizeof(rep_d);
    if (dcp_ctx_io_report(cf, DCP_IO_LOAD, &rep_d))
        abort();
    o.storage = NULL;
    o.storage_impl = NULL;
    o.io_flags = DCP_IO_NO_DIRECT;
    if (dcp_ctx_create(&cb, NULL, &o))
        abort();
    bv = best_load(cb, lt, dir, 0);
    bn = best_load(cb, lt, dir, DCP_LOAD_NO_VERIFY);
    rep_b.struct_size = sizeof(rep_b);
    if (dcp_ctx_io_report(cb, DCP_IO_LOAD, &rep_b))
        abort();
    if (memcmp(buf, dst, n) != 0)
        abort();
    rs_rmtree(dir);
    printf("integrity cost: CRC-32 %.2f GB/s (implementation level %d); "
           "copy %.2f GB/s, copy with the CRC fused %.2f GB/s\n",
           (double)n / tc / 1e9, dcp__crc32_impl(-1), (double)n / tm / 1e9,
           (double)n / tf / 1e9);
    printf("integrity cost: load from memory %.2f GB/s verified, %.2f GB/s "
           "unverified (checking adds %.0f%% to the time)\n",
           (double)n / tv / 1e9, (double)n / tn / 1e9, 100.0 * (tv - tn) / tn);
    printf("integrity cost: load from a file, O_DIRECT %d io_uring %d: %.2f "
           "GB/s verified, %.2f GB/s unverified (%+.0f%%)\n",
           rep_d.direct, rep_d.uring, (double)n / fv / 1e9,
           (double)n / fn / 1e9, 100.0 * (fv - fn) / fn);
    printf("integrity cost: load from a file, page cache (O_DIRECT %d, "
           "io_uring %d, %.0f%% through dcp's buffers): %.2f GB/s verified, "
           "%.2f GB/s unverified (%+.0f%%) [crc %08x]\n",
           rep_b.direct, rep_b.uring,
           100.0 * (double)rep_b.bounce_bytes / (double)(rep_b.bytes + 1),
           (double)n / bv / 1e9, (double)n / bn / 1e9, 100.0 * (bv - bn) / bn,
           crc);
    dcp_ctx_free(cb);
    dcp_ctx_free(cf);
    dcp_ctx_free(c2);
    dcp_state_free(st);
    dcp_state_free(lt);
    mdir_free(&saved);
    free(buf);
    free(dst);
}

/* Saves seed on 2 forked ranks (so there are two data files). */
static int save2_rank(int rank, dcp_comm *comm, void *arg)
{
    const char *dir = arg;
    struct refstate r;
    dcp_ctx *c;
    dcp_save_options so = {sizeof(so), 1, 0, NULL};
    int rc;
    if (dcp_ctx_create(&c, comm, NULL) ||
        rs_build_part(&r, nranks_saved, rank, 2))
        return 1;
    rc = dcp_save(c, r.st, dir, &so);
    rs_free(&r);
    dcp_ctx_free(c);
    return rc ? 1 : 0;
}

static int save2(char *dir, unsigned seed)
{
    pid_t pids[2];
    int st, r, bad = 0;
    nranks_saved = seed;
    if (fc_spawn(2, save2_rank, dir, pids))
        return -1;
    for (r = 0; r < 2; r++) {
        if (waitpid(pids[r], &st, 0) < 0 || st != 0)
            bad = 1;
    }
    return bad ? -1 : 0;
}

int main(int argc, char **argv)
{
    char dir[128], olddir[160];
    struct mdir older;
    dcp_ctx_options o = {0};
    int rc;
    const char *env = getenv("DCP_INTEGRITY_TRIALS");
    if (argc > 1 && !strcmp(argv[1], "cost")) { /* the cost alone */
        cost();
        return 0;
    }
    if (argc > 1)
        ntrials = atol(argv[1]);
    else if (env)
        ntrials = atol(env);
    signal(SIGPIPE, SIG_IGN);
    rs_big_rows = 8; /* a 2.5 KiB tensor: cheap trials */
    strcpy(dir, "/tmp/dcp-integrity-XXXXXX");
    if (!mkdtemp(dir))
        abort();
    snprintf(olddir, sizeof(olddir), "%s/old", dir);
    strcat(dir, "/new");
    /* A checkpoint of two ranks, and an older one with the same layout. */
    if (save2(olddir, RS_SEED_OLD) || save2(dir, RS_SEED_NEW) ||
        mdir_load(&pristine, dir) || mdir_load(&older, olddir)) {
        fprintf(stderr, "setup failed\n");
        return 1;
    }
    rs_rmtree(dir);
    rs_rmtree(olddir);
    dir[strlen(dir) - 4] = '\0';
    rs_rmtree(dir);
    mdir_clone(&work, &pristine);
    o.struct_size = sizeof(o);
    o.storage = &mem_ops;
    o.storage_impl = &work;
    if (dcp_ctx_create(&ctx, NULL, &o) || rs_build(&want, RS_SEED_NEW) ||
        rs_build(&got, 0))
        abort();
    {
        int code;
        if (trial(&code) != 0) {
            fprintf(stderr, "pristine load fails: %s\n", dcp_errmsg(ctx));
            return 1;
        }
    }
    find_ranges();
    printf("integrity setup: .metadata %zu bytes, data files %zu + %zu "
           "bytes, %zu tensor byte ranges\n",
           pristine.f[0].len, pristine.f[1].len,
           pristine.n > 2 ? pristine.f[2].len : 0, nranges);
    RUN(metadata_every_bit);
    RUN(record_every_bit);
    RUN(random_corruptions);
    swaps(&older);
    if (!RS_SANITIZED)
        cost(); /* a throughput under ASan would mean nothing */
    else
        printf("integrity cost: not measured under sanitizers\n");
    rs_free(&want);
    rs_free(&got);
    dcp_ctx_free(ctx);
    mdir_free(&work);
    mdir_free(&pristine);
    mdir_free(&older);
    rc = TEST_SUMMARY();
    return rc;
}
