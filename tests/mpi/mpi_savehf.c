/*
 * dcp_save_hf over MPI: each rank's piece of a tensor streamed into its
 * own shard file and read back whole on every rank; the refusals agreed on
 * every rank with nothing left in the directory: two boxes of a tensor on
 * one rank that are not neighbours in rank 0's sort order, bad options on
 * one rank only, a consolidated flag on one rank only.
 */
#include <dcp/dcp.h>
#include <dcp/dcp_convert.h>
#include <dcp/dcp_mpi.h>

#include <dirent.h>

#include "mpitest.h"

static dcp_comm *comm;
static char root[256];

#define N 30

/* The number of *.safetensors files and index files in dir. */
static int count_outputs(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;
    if (!d)
        return 0;
    while ((e = readdir(d)) != NULL) {
        size_t l = strlen(e->d_name);
        if ((l > 12 && !strcmp(e->d_name + l - 12, ".safetensors")) ||
            (l > 5 && !strcmp(e->d_name + l - 5, ".json")))
            n++;
    }
    closedir(d);
    return n;
}

static void opts_init(dcp_convert_options *o, unsigned flags)
{
    memset(o, 0, sizeof(*o));
    o->struct_size = sizeof(*o);
    o->flags = flags | DCP_CONVERT_NO_FSYNC;
}

static void test_sharded_read_back(void)
{
    static const int64_t shape[1] = {N};
    char dir[512];
    dcp_ctx *ctx;
    dcp_state *st;
    dcp_convert_options o;
    float w[N], all[N];
    int64_t off, len, i;
    snprintf(dir, sizeof(dir), "%s/sharded", root);
    for (i = 0; i < N; i++)
        w[i] = (float)i * 0.25f - 2.0f;
    mt_split(N, mt_size, mt_rank, &off, &len);
    CHECK(dcp_ctx_create(&ctx, comm, NULL) == DCP_OK);
    CHECK(dcp_state_create(&st) == DCP_OK);
    CHECK(dcp_state_add_tensor(st, "w", DCP_F32, 1, shape, &off, &len, w + off,
                               DCP_MEM_HOST) == DCP_OK);
    opts_init(&o, 0);
    CHECK_OK(ctx, dcp_save_hf(ctx, st, dir, &o));
    dcp_state_free(st);
    MPI_Barrier(MPI_COMM_WORLD);
    /* one file per rank that holds a piece */
    CHECK(count_outputs(dir) == (mt_size < N ? mt_size : N));
    /* every rank loads the whole tensor, bit-exact */
    memset(all, 0, sizeof(all));
    CHECK(dcp_state_create(&st) == DCP_OK);
    CHECK(dcp_state_add_tensor(st, "w", DCP_F32, 1, shape, NULL, NULL, all,
                               DCP_MEM_HOST) == DCP_OK);
    CHECK_OK(ctx, dcp_load(ctx, st, dir, NULL));
    CHECK(memcmp(all, w, sizeof(w)) == 0);
    dcp_state_free(st);
    dcp_ctx_free(ctx);
}

/* Rank 0 holds [0,10) and [20,30), rank 1 [10,20): sorted by offset, rank
 * 0's two boxes are not neighbours. */
static void test_two_boxes_not_adjacent(void)
{
    static const int64_t shape[1] = {N}, ten = 10;
    static const int64_t o0 = 0, o1 = 10, o2 = 20;
    char dir[512];
    dcp_ctx *ctx;
    dcp_state *st;
    dcp_convert_options o;
    float w[N];
    int rc, i;
    if (mt_size < 2)
        return;
    snprintf(dir, sizeof(dir), "%s/twoboxes", root);
    for (i = 0; i < N; i++)
        w[i] = (float)i;
    CHECK(dcp_ctx_create(&ctx, comm, NULL) == DCP_OK);
    CHECK(dcp_state_create(&st) == DCP_OK);
    if (mt_rank == 0) {
        CHECK(dcp_state_add_tensor(st, "w", DCP_F32, 1, shape, &o0, &ten, w,
                                   DCP_MEM_HOST) == DCP_OK);
        CHECK(dcp_state_add_tensor(st, "w", DCP_F32, 1, shape, &o2, &ten,
                                   w + 20, DCP_MEM_HOST) == DCP_OK);
    } else if (mt_rank == 1) {
        CHECK(dcp_state_add_tensor(st, "w", DCP_F32, 1, shape, &o1, &ten,
                                   w + 10, DCP_MEM_HOST) == DCP_OK);
    }
    opts_init(&o, 0);
    rc = dcp_save_hf(ctx, st, dir, &o);
    CHECK_RC(ctx, rc, DCP_ENOTSUP);
    CHECK(mt_same(rc));
    CHECK_MSG(ctx, "rank 0 holds two boxes of 'w'");
    CHECK(mt_same_str(dcp_errmsg(ctx)));
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(count_outputs(dir) == 0);
    dcp_state_free(st);
    dcp_ctx_free(ctx);
}

/* Bad options on the last rank only, then CONSOLIDATED on rank 0 only:
 * refused on every rank (no rank waits for the others), nothing
 * written. */
static void test_arguments_agreed(void)
{
    static const int64_t shape[1] = {N};
    char dir[512];
    dcp_ctx *ctx;
    dcp_state *st;
    dcp_convert_options o;
    float w[N];
    int rc, i;
    snprintf(dir, sizeof(dir), "%s/args", root);
    for (i = 0; i < N; i++)
        w[i] = (float)-i;
    CHECK(dcp_ctx_create(&ctx, comm, NULL) == DCP_OK);
    CHECK(dcp_state_create(&st) == DCP_OK);
    CHECK(dcp_state_add_tensor(st, "w", DCP_F32, 1, shape, NULL, NULL, w,
                               DCP_MEM_HOST) == DCP_OK);
    opts_init(&o, 0);
    if (mt_rank == mt_size - 1)
        o.struct_size = 0;
    rc = dcp_save_hf(ctx, st, dir, &o);
    CHECK_RC(ctx, rc, DCP_EINVAL);
    CHECK(mt_same(rc));
    CHECK(mt_same_str(dcp_errmsg(ctx)));
    opts_init(&o, mt_rank == 0 ? DCP_CONVERT_HF_CONSOLIDATED : 0);
    rc = dcp_save_hf(ctx, st, dir, &o);
    if (mt_size > 1) {
        CHECK_RC(ctx, rc, DCP_EINVAL);
        CHECK_MSG(ctx, "flags");
    } else {
        CHECK_OK(ctx, rc);
    }
    CHECK(mt_same(rc));
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(count_outputs(dir) == (mt_size > 1 ? 0 : 2));
    /* the same flags everywhere: consolidated, one file and the index */
    if (mt_size > 1) {
        opts_init(&o, DCP_CONVERT_HF_CONSOLIDATED);
        CHECK_OK(ctx, dcp_save_hf(ctx, st, dir, &o));
        MPI_Barrier(MPI_COMM_WORLD);
        CHECK(count_outputs(dir) == 2);
    }
    dcp_state_free(st);
    dcp_ctx_free(ctx);
}

int main(int argc, char **argv)
{
    mt_init(&argc, &argv);
    mt_tmpdir(root, sizeof(root), "savehf");
    if (dcp_comm_mpi(&comm, MPI_COMM_WORLD) != DCP_OK)
        MPI_Abort(MPI_COMM_WORLD, 1);
    RUN(sharded_read_back);
    RUN(two_boxes_not_adjacent);
    RUN(arguments_agreed);
    dcp_comm_free(comm);
    return mt_finish();
}
