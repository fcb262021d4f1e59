/*
 * Harness for the MPI tests. Unlike tests/unit/test.h, a failed CHECK does
 * not return: every rank must keep making the same collective calls, or
 * the others would hang. Each test's failures are summed over the ranks
 * (MPI_Allreduce) after it ran; rank 0 prints "ok"/"FAIL" per test and the
 * final "N passed, N failed" line, and every rank exits with the same
 * status. Shared helpers: deterministic data, sharding, per-rank checks.
 */
#ifndef DCP_MPITEST_H
#define DCP_MPITEST_H

#include <dcp/dcp.h>
#include <dcp/dcp_mpi.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int mt_rank, mt_size, mt_fail, mt_npass, mt_nfail;

#define CHECK(c)                                                            \
    do {                                                                    \
        if (!(c)) {                                                         \
            fprintf(stderr, "[rank %d] %s:%d: check failed: %s\n", mt_rank, \
                    __FILE__, __LINE__, #c);                                \
            mt_fail++;                                                      \
        }                                                                   \
    } while (0)

/* rc is a dcp return code; prints both names and the context's message. */
#define CHECK_RC(ctx, rc, want)                                            \
    do {                                                                   \
        int rc_ = (rc), w_ = (want);                                       \
        if (rc_ != w_) {                                                   \
            fprintf(stderr, "[rank %d] %s:%d: %s: got %s, want %s (%s)\n", \
                    mt_rank, __FILE__, __LINE__, #rc, dcp_err_name(rc_),   \
                    dcp_err_name(w_), dcp_errmsg(ctx));                    \
            mt_fail++;                                                     \
        }                                                                  \
    } while (0)

#define CHECK_OK(ctx, rc) CHECK_RC(ctx, rc, 0)

/* The context's message contains needle. */
#define CHECK_MSG(ctx, needle)                                                \
    do {                                                                      \
        if (!strstr(dcp_errmsg(ctx), (needle))) {                             \
            fprintf(stderr, "[rank %d] %s:%d: message \"%s\" lacks \"%s\"\n", \
                    mt_rank, __FILE__, __LINE__, dcp_errmsg(ctx), (needle));  \
            mt_fail++;                                                        \
        }                                                                     \
    } while (0)

#define RUN(name)                                                              \
    do {                                                                       \
        int f_;                                                                \
        mt_fail = 0;                                                           \
        test_##name();                                                         \
        MPI_Allreduce(&mt_fail, &f_, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);     \
        if (f_)                                                                \
            mt_nfail++;                                                        \
        else                                                                   \
            mt_npass++;                                                        \
        if (mt_rank == 0)                                                      \
            fprintf(stderr, "%s %s (%d ranks)\n", f_ ? "FAIL" : "ok  ", #name, \
                    mt_size);                                                  \
    } while (0)

static void mt_init(int *argc, char ***argv)
{
    MPI_Init(argc, argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &mt_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &mt_size);
}

static int mt_finish(void)
{
    if (mt_rank == 0) {
        printf("%d passed, %d failed\n", mt_npass, mt_nfail);
        fflush(stdout);
    }
    MPI_Finalize();
    return mt_nfail ? 1 : 0;
}

/* The same int on every rank? (rc agreement checks) */
static inline int mt_same(int v)
{
    int lo, hi;
    MPI_Allreduce(&v, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&v, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    return lo == hi;
}

/* The same string on every rank? (compared by a 64-bit hash) */
static inline int mt_same_str(const char *s)
{
    uint64_t h = 1469598103934665603ULL;
    long long v[2], lo[2], hi[2];
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ULL;
    }
    v[0] = (long long)(h >> 1);
    v[1] = (long long)(h & 1);
    MPI_Allreduce(v, lo, 2, MPI_LONG_LONG, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(v, hi, 2, MPI_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
    return lo[0] == hi[0] && lo[1] == hi[1];
}

/* ceil split of n into p parts (torch.chunk): part i is [i*c, (i+1)*c)
 * clamped to n, so trailing parts may be empty (offset n, size 0). */
static inline void mt_split(int64_t n, int p, int i, int64_t *off,
                            int64_t *size)
{
    int64_t c = (n + p - 1) / p, o = c * i, e = c * (i + 1);
    if (o > n)
        o = n;
    if (e > n)
        e = n;
    *off = o;
    *size = e - o;
}

/* Byte b of the element at global linear index lin of a tensor seeded
 * seed: every rank can compute what any box must hold. */
static inline unsigned char mt_byte(unsigned seed, uint64_t lin, size_t b)
{
    uint64_t x = ((uint64_t)seed << 40) ^ (lin * 16 + b);
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return (unsigned char)x;
}

/* Fills the C-contiguous box (off, size) of a tensor of the given global
 * shape with its deterministic content. */
static inline void mt_fill(unsigned char *buf, int ndim, const int64_t *shape,
                           const int64_t *off, const int64_t *size, size_t es,
                           unsigned seed)
{
    int64_t idx[DCP_MAX_NDIM] = {0};
    uint64_t n = 1, k;
    int d;
    for (d = 0; d < ndim; d++)
        n *= (uint64_t)size[d];
    for (k = 0; k < n; k++) {
        uint64_t lin = 0;
        size_t b;
        for (d = 0; d < ndim; d++)
            lin = lin * (uint64_t)shape[d] + (uint64_t)(off[d] + idx[d]);
        for (b = 0; b < es; b++)
            buf[k * es + b] = mt_byte(seed, lin, b);
        for (d = ndim - 1; d >= 0; d--) {
            if (++idx[d] < size[d])
                break;
            idx[d] = 0;
        }
    }
}

static inline size_t mt_numel(int ndim, const int64_t *size)
{
    size_t n = 1;
    int d;
    for (d = 0; d < ndim; d++)
        n *= (size_t)size[d];
    return n;
}

/* A scratch directory shared by all ranks (rank 0 makes it). */
static inline void mt_tmpdir(char *out, size_t cap, const char *tag)
{
    char buf[256];
    if (mt_rank == 0) {
        snprintf(buf, sizeof(buf), "/tmp/dcp-mpi-%s-XXXXXX", tag);
        if (!mkdtemp(buf))
            MPI_Abort(MPI_COMM_WORLD, 2);
    }
    MPI_Bcast(buf, sizeof(buf), MPI_CHAR, 0, MPI_COMM_WORLD);
    snprintf(out, cap, "%s", buf);
}

#endif /* DCP_MPITEST_H */
