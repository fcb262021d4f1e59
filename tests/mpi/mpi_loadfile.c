/*
 * dcp_load_file over N ranks: a checkpoint made here is exported to a
 * torch.save and a safetensors file (dcp_export), then every rank loads
 * boxes of it (rows, columns, two boxes per rank, 0-d, empty) straight from
 * the file, in "own" mode (every rank reads) and "root" mode (rank 0 reads
 * and scatters; forced with DCP_LOAD_FILE_ROOT_READS, and chosen by itself
 * when only rank 0 sees the file), and checks every byte. Errors (missing
 * and unexpected keys, a shape mismatch) fail every rank with one code.
 *
 *   mpi_loadfile DIR            the tests above, in DIR (created)
 *   mpi_loadfile model FILE A B  the real-model round trip: load checkpoint
 *        A row-sharded over the ranks, save it to checkpoint B (sharded),
 *        and load FILE (the original safetensors) into the same boxes in
 *        both modes: every byte must equal the checkpoint's
 */
#include <dcp/dcp_convert.h>

#include <sys/stat.h>
#include <unistd.h>

#include "mpitest.h"

static dcp_comm *comm;
static const char *dir;
static char path_pt[512], path_sf[512];

/* Element i of tensor t, as bytes of dtype dt. */
static void pattern(void *buf, dcp_dtype dt, int64_t n, int t)
{
    int64_t i;
    for (i = 0; i < n; i++) {
        double v = (double)((i * 7 + t * 13) % 101) - 50.0 + 0.25 * t;
        switch ((int)dt) {
        case DCP_F32: {
            float f = (float)v;
            memcpy((char *)buf + 4 * i, &f, 4);
            break;
        }
        case DCP_F64:
            memcpy((char *)buf + 8 * i, &v, 8);
            break;
        case DCP_I64: {
            int64_t x = (int64_t)v * 1000003;
            memcpy((char *)buf + 8 * i, &x, 8);
            break;
        }
        case DCP_BF16: {
            float f = (float)v;
            uint32_t b;
            memcpy(&b, &f, 4);
            ((uint16_t *)buf)[i] = (uint16_t)(b >> 16);
            break;
        }
        default:
            break;
        }
    }
}

static const struct {
    const char *key;
    dcp_dtype dt;
    int ndim;
    int64_t shape[3];
} T[] = {
    {"model.w", DCP_F32, 2, {7, 5}},     {"model.b", DCP_BF16, 3, {4, 3, 2}},
    {"model.idx", DCP_I64, 1, {10}},     {"scale", DCP_F64, 0, {0}},
    {"model.empty", DCP_F32, 2, {0, 4}},
};
#define NT (sizeof(T) / sizeof(T[0]))

static int64_t numel(int t)
{
    int64_t n = 1;
    int d;
    for (d = 0; d < T[t].ndim; d++)
        n *= T[t].shape[d];
    return n;
}

/* Rank 0 alone saves the checkpoint and exports both files. */
static void make_files(void)
{
    char ck[512];
    int rc = DCP_OK;
    (void)snprintf(ck, sizeof(ck), "%s/ckpt", dir);
    (void)snprintf(path_pt, sizeof(path_pt), "%s/state.pt", dir);
    (void)snprintf(path_sf, sizeof(path_sf), "%s/state.safetensors", dir);
    if (mt_rank == 0) {
        dcp_ctx *ctx = NULL;
        dcp_state *st = NULL;
        dcp_convert_options o;
        void *bufs[NT];
        size_t t;
        (void)mkdir(dir, 0755);
        CHECK_OK(NULL, dcp_ctx_create(&ctx, NULL, NULL));
        CHECK_OK(ctx, dcp_state_create(&st));
        for (t = 0; t < NT; t++) {
            bufs[t] = calloc((size_t)numel((int)t) + 1, 8);
            pattern(bufs[t], T[t].dt, numel((int)t), (int)t);
            CHECK_OK(ctx, dcp_state_add_tensor(st, T[t].key, T[t].dt, T[t].ndim,
                                               T[t].shape, NULL, NULL, bufs[t],
                                               DCP_MEM_HOST));
        }
        CHECK_OK(ctx, dcp_state_add_value(st, "step", dcp_value_int(42)));
        rc = dcp_save(ctx, st, ck, NULL);
        CHECK_OK(ctx, rc);
        memset(&o, 0, sizeof(o));
        o.struct_size = sizeof(o);
        o.flags = DCP_CONVERT_NO_FSYNC;
        CHECK_OK(ctx, dcp_export(ctx, ck, path_pt, &o, NULL));
        CHECK_OK(ctx, dcp_export(ctx, ck, path_sf, &o, NULL));
        for (t = 0; t < NT; t++)
            free(bufs[t]);
        dcp_state_free(st);
        dcp_ctx_free(ctx);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

/* How rank r shards tensor t: rows (scheme 0), columns (1), or two row
 * boxes per rank (2). Returns the number of boxes, with their extents. */
static int boxes_of(int t, int scheme, int64_t off[2][3], int64_t size[2][3])
{
    int nd = T[t].ndim, d, nb = 1;
    for (d = 0; d < nd; d++) {
        off[0][d] = 0;
        size[0][d] = T[t].shape[d];
    }
    if (nd == 0)
        return 1;
    if (scheme == 1 && nd >= 2) {
        mt_split(T[t].shape[1], mt_size, mt_rank, &off[0][1], &size[0][1]);
    } else if (scheme == 2) {
        int64_t o, s;
        mt_split(T[t].shape[0], 2 * mt_size, 2 * mt_rank, &o, &s);
        off[0][0] = o;
        size[0][0] = s;
        memcpy(off[1], off[0], sizeof(off[1]));
        memcpy(size[1], size[0], sizeof(size[1]));
        mt_split(T[t].shape[0], 2 * mt_size, 2 * mt_rank + 1, &o, &s);
        off[1][0] = o;
        size[1][0] = s;
        nb = 2;
    } else {
        mt_split(T[t].shape[0], mt_size, mt_rank, &off[0][0], &size[0][0]);
    }
    return nb;
}

/* Checks box (off, size) of tensor t in buf (dtype want, cast from the
 * stored dtype when they differ). */
static void check_box(int t, const int64_t *off, const int64_t *size,
                      const void *buf, dcp_dtype want)
{
    int64_t n = numel(t), bn = 1, i, idx[3] = {0, 0, 0};
    size_t es = dcp_dtype_size(T[t].dt), ws = dcp_dtype_size(want);
    int nd = T[t].ndim, d;
    char *full = calloc((size_t)n + 1, es), *exp = calloc(1, 8);
    pattern(full, T[t].dt, n, t);
    for (d = 0; d < nd; d++)
        bn *= size[d];
    for (i = 0; i < bn; i++) {
        int64_t lin = 0, rem = i;
        for (d = nd - 1; d >= 0; d--) {
            idx[d] = rem % size[d];
            rem /= size[d];
        }
        for (d = 0; d < nd; d++)
            lin = lin * T[t].shape[d] + off[d] + idx[d];
        (void)dcp_convert_elements(exp, want, full + lin * (int64_t)es, T[t].dt,
                                   1);
        if (memcmp(exp, (const char *)buf + i * (int64_t)ws, ws) != 0) {
            fprintf(stderr, "[rank %d] '%s' element %lld differs\n", mt_rank,
                    T[t].key, (long long)i);
            mt_fail++;
            break;
        }
    }
    free(full);
    free(exp);
}

/* Loads file with scheme into a fresh state; checks the result. */
static void load_and_check(const char *file, int scheme, unsigned flags,
                           int cast)
{
    dcp_ctx *ctx = NULL;
    dcp_state *st = NULL;
    dcp_load_options lo;
    void *bufs[NT][2];
    int64_t off[NT][2][3], size[NT][2][3];
    int nb[NT];
    size_t t;
    int b, rc;
    memset(bufs, 0, sizeof(bufs));
    CHECK_OK(NULL, dcp_ctx_create(&ctx, comm, NULL));
    CHECK_OK(ctx, dcp_state_create(&st));
    for (t = 0; t < NT; t++) {
        dcp_dtype dt = cast && T[t].dt == DCP_F32 ? DCP_F64 : T[t].dt;
        nb[t] = boxes_of((int)t, scheme, off[t], size[t]);
        for (b = 0; b < nb[t]; b++) {
            int64_t n = 1;
            int d;
            for (d = 0; d < T[t].ndim; d++)
                n *= size[t][b][d];
            bufs[t][b] = calloc((size_t)n + 1, 8);
            CHECK_OK(ctx, dcp_state_add_tensor(
                              st, T[t].key, dt, T[t].ndim, T[t].shape,
                              off[t][b], size[t][b], bufs[t][b], DCP_MEM_HOST));
        }
    }
    if (strstr(file, ".pt"))
        CHECK_OK(ctx, dcp_state_add_value(st, "step", dcp_value_int(0)));
    memset(&lo, 0, sizeof(lo));
    lo.struct_size = sizeof(lo);
    lo.flags = flags | (cast ? DCP_LOAD_CAST : 0);
    rc = dcp_load_file(ctx, st, file, &lo);
    CHECK_OK(ctx, rc);
    CHECK(mt_same(rc));
    for (t = 0; rc == DCP_OK && t < NT; t++)
        for (b = 0; b < nb[t]; b++)
            check_box((int)t, off[t][b], size[t][b], bufs[t][b],
                      cast && T[t].dt == DCP_F32 ? DCP_F64 : T[t].dt);
    if (rc == DCP_OK && strstr(file, ".pt"))
        CHECK(dcp_value_as_int(dcp_state_value(st, "step")) == 42);
    for (t = 0; t < NT; t++)
        for (b = 0; b < 2; b++)
            free(bufs[t][b]);
    dcp_state_free(st);
    dcp_ctx_free(ctx);
}

static void test_own_rows(void)
{
    load_and_check(path_sf, 0, 0, 0);
    load_and_check(path_pt, 0, 0, 0);
}

static void test_own_columns_and_two_boxes(void)
{
    load_and_check(path_sf, 1, 0, 0);
    load_and_check(path_pt, 2, 0, 0);
}

static void test_root_reads(void)
{
    load_and_check(path_sf, 0, DCP_LOAD_FILE_ROOT_READS, 0);
    load_and_check(path_pt, 1, DCP_LOAD_FILE_ROOT_READS, 0);
    load_and_check(path_sf, 2, DCP_LOAD_FILE_ROOT_READS, 0);
}

static void test_cast(void)
{
    load_and_check(path_sf, 0, 0, 1);
    load_and_check(path_pt, 1, DCP_LOAD_FILE_ROOT_READS, 1);
}

/* Only rank 0 sees the file (a relative name, each rank in its own
 * directory): the load falls back to rank 0 reading. */
static void test_only_root_sees(void)
{
    char here[512], mine[600];
    CHECK(getcwd(here, sizeof(here)) != NULL);
    (void)snprintf(mine, sizeof(mine), "%s/rank%d", dir, mt_rank);
    (void)mkdir(mine, 0755);
    if (mt_rank == 0) {
        char link[700];
        (void)snprintf(link, sizeof(link), "%s/state.safetensors", mine);
        (void)unlink(link);
        CHECK(symlink(path_sf, link) == 0);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(chdir(mine) == 0);
    load_and_check("state.safetensors", 0, 0, 0);
    CHECK(chdir(here) == 0);
}

static void test_errors(void)
{
    dcp_ctx *ctx = NULL;
    dcp_state *st = NULL;
    int64_t shape[2] = {7, 6}, off[2], size[2];
    float buf[64];
    int rc;
    CHECK_OK(NULL, dcp_ctx_create(&ctx, comm, NULL));
    /* a key the file lacks, on the last rank only */
    CHECK_OK(ctx, dcp_state_create(&st));
    if (mt_rank == mt_size - 1)
        CHECK_OK(ctx, dcp_state_add_tensor(st, "nope", DCP_F32, 0, NULL, NULL,
                                           NULL, buf, DCP_MEM_HOST));
    rc = dcp_load_file(ctx, st, path_sf, NULL);
    CHECK(mt_same(rc));
    CHECK_RC(ctx, rc, DCP_EKEY);
    dcp_state_free(st);
    /* a shape mismatch */
    CHECK_OK(ctx, dcp_state_create(&st));
    mt_split(7, mt_size, mt_rank, &off[0], &size[0]);
    off[1] = 0;
    size[1] = 6;
    CHECK_OK(ctx, dcp_state_add_tensor(st, "model.w", DCP_F32, 2, shape, off,
                                       size, buf, DCP_MEM_HOST));
    rc = dcp_load_file(ctx, st, path_sf, NULL);
    CHECK(mt_same(rc));
    CHECK_RC(ctx, rc, DCP_EMISMATCH);
    CHECK_MSG(ctx, "shape mismatch");
    /* partial: the unexpected keys are reported on every rank */
    {
        dcp_load_options lo = {sizeof(lo), DCP_LOAD_PARTIAL, NULL};
        const char *const *keys;
        dcp_state_free(st);
        CHECK_OK(ctx, dcp_state_create(&st));
        rc = dcp_load_file(ctx, st, path_sf, &lo);
        CHECK_OK(ctx, rc);
        CHECK(dcp_load_report(ctx, 1, &keys) == NT);
    }
    /* a file that does not exist */
    rc = dcp_load_file(ctx, st, "/nonexistent/x.safetensors", NULL);
    CHECK(mt_same(rc));
    CHECK_RC(ctx, rc, DCP_ENOENT);
    dcp_state_free(st);
    dcp_ctx_free(ctx);
}

/* ---------------------------------------------------- real model */

static int model(const char *file, const char *a, const char *b)
{
    dcp_ctx *ctx = NULL;
    dcp_metadata *md = NULL;
    dcp_state *st = NULL, *st2 = NULL;
    void **bufs, **bufs2;
    size_t i, n;
    int mode;
    CHECK_OK(NULL, dcp_ctx_create(&ctx, comm, NULL));
    CHECK_OK(ctx, dcp_metadata_open(ctx, a, &md));
    n = dcp_metadata_count(md);
    bufs = calloc(n + 1, sizeof(void *));
    bufs2 = calloc(n + 1, sizeof(void *));
    CHECK_OK(ctx, dcp_state_create(&st));
    CHECK_OK(ctx, dcp_state_create(&st2));
    for (i = 0; i < n; i++) {
        dcp_entry_info e;
        int64_t off[DCP_MAX_NDIM] = {0}, size[DCP_MAX_NDIM];
        uint64_t bytes;
        int d;
        CHECK_OK(ctx, dcp_metadata_entry(md, i, &e));
        for (d = 0; d < e.ndim; d++)
            size[d] = e.shape[d];
        if (e.ndim)
            mt_split(e.shape[0], mt_size, mt_rank, &off[0], &size[0]);
        bytes = dcp_dtype_size(e.dtype);
        for (d = 0; d < e.ndim; d++)
            bytes *= (uint64_t)size[d];
        bufs[i] = calloc(bytes + 1, 1);
        bufs2[i] = calloc(bytes + 1, 1);
        CHECK_OK(ctx, dcp_state_add_tensor(st, e.key, e.dtype, e.ndim, e.shape,
                                           off, size, bufs[i], DCP_MEM_HOST));
        CHECK_OK(ctx, dcp_state_add_tensor(st2, e.key, e.dtype, e.ndim, e.shape,
                                           off, size, bufs2[i], DCP_MEM_HOST));
    }
    CHECK_OK(ctx, dcp_load(ctx, st, a, NULL));
    CHECK_OK(ctx, dcp_save(ctx, st, b, NULL));
    for (mode = 0; mode < 2; mode++) {
        dcp_load_options lo = {sizeof(lo), mode ? DCP_LOAD_FILE_ROOT_READS : 0, NULL};
        CHECK_OK(ctx, dcp_load_file(ctx, st2, file, &lo));
        for (i = 0; i < n; i++) {
            dcp_entry_info e;
            uint64_t bytes;
            int d;
            (void)dcp_metadata_entry(md, i, &e);
            bytes = dcp_dtype_size(e.dtype);
            for (d = 0; d < e.ndim; d++) {
                int64_t o, s;
                if (d == 0) {
                    mt_split(e.shape[0], mt_size, mt_rank, &o, &s);
                    bytes *= (uint64_t)s;
                } else {
                    bytes *= (uint64_t)e.shape[d];
                }
            }
            if (memcmp(bufs[i], bufs2[i], bytes) != 0) {
                fprintf(stderr, "[rank %d] '%s' differs (mode %d)\n", mt_rank,
                        e.key, mode);
                mt_fail++;
            }
            memset(bufs2[i], 0, bytes);
        }
    }
    for (i = 0; i < n; i++) {
        free(bufs[i]);
        free(bufs2[i]);
    }
    free(bufs);
    free(bufs2);
    dcp_state_free(st);
    dcp_state_free(st2);
    dcp_metadata_free(md);
    dcp_ctx_free(ctx);
    return mt_fail;
}

int main(int argc, char **argv)
{
    mt_init(&argc, &argv);
    if (dcp_comm_mpi(&comm, MPI_COMM_WORLD) != DCP_OK) {
        fprintf(stderr, "dcp_comm_mpi failed\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    if (argc == 5 && strcmp(argv[1], "model") == 0) {
        int f = model(argv[2], argv[3], argv[4]), all;
        MPI_Allreduce(&f, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        if (all)
            mt_nfail++;
        else
            mt_npass++;
    } else if (argc == 2) {
        dir = argv[1];
        make_files();
        RUN(own_rows);
        RUN(own_columns_and_two_boxes);
        RUN(root_reads);
        RUN(cast);
        RUN(only_root_sees);
        RUN(errors);
    } else {
        if (mt_rank == 0)
            fprintf(stderr, "usage: mpi_loadfile DIR | model FILE A B\n");
        MPI_Finalize();
        return 2;
    }
    dcp_comm_free(comm);
    return mt_finish();
}
