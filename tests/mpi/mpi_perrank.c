/*
 * Per-rank data (PyTorch issue #120356): state that differs from rank to
 * rank under one logical name is saved under per-rank keys
 * (dcp_state_push_rank -> "rank<r>.rng"), next to shared state, and each
 * rank loads its own back; a rank can also read another rank's entry.
 */
#include <dcp/dcp.h>
#include <dcp/dcp_mpi.h>

#include "mpitest.h"

static dcp_comm *comm;
static dcp_ctx *ctx;
static char root[256];

/* Per-rank tensor "buf" [8] (seeded by the rank) and value "rng". */
static void add_rank_entries(dcp_state *st, int r, float *buf, int save)
{
    int64_t n = 8;
    char rng[32];
    snprintf(rng, sizeof(rng), "rng-state-of-%d", r);
    if (save)
        mt_fill((unsigned char *)buf, 1, &n, (const int64_t[]){0}, &n, 4,
                100u + (unsigned)r);
    CHECK(dcp_state_push_rank(st, r) == 0);
    CHECK(dcp_state_add_tensor(st, "buf", DCP_F32, 1, &n, NULL, NULL, buf,
                               DCP_MEM_HOST) == 0);
    CHECK(dcp_state_add_value(
              st, "rng",
              dcp_value_bytes(save ? rng : "", save ? strlen(rng) : 0)) == 0);
    CHECK(dcp_state_pop(st) == 0);
}

static void check_rank_entries(const dcp_state *st, int r, const float *buf)
{
    int64_t n = 8;
    float want[8];
    char key[32], rng[32];
    const dcp_value *v;
    const void *p;
    size_t len = 0;
    mt_fill((unsigned char *)want, 1, &n, (const int64_t[]){0}, &n, 4,
            100u + (unsigned)r);
    CHECK(memcmp(buf, want, sizeof(want)) == 0);
    snprintf(key, sizeof(key), "rank%d.rng", r);
    snprintf(rng, sizeof(rng), "rng-state-of-%d", r);
    v = dcp_state_value(st, key);
    p = dcp_value_as_bytes(v, &len);
    CHECK(p && len == strlen(rng) && memcmp(p, rng, len) == 0);
}

static void test_per_rank_keys(void)
{
    const char *dir = root;
    float mine[8], got[8], other[8];
    dcp_state *st, *ld;
    const dcp_value *v;
    int next = (mt_rank + 1) % mt_size;
    CHECK(dcp_state_create(&st) == 0);
    add_rank_entries(st, mt_rank, mine, 1);
    CHECK(dcp_state_add_value(st, "step", dcp_value_int(42)) == 0);
    CHECK(dcp_state_push_rank(st, -1) == DCP_EINVAL);
    CHECK(dcp_state_push_rank(NULL, 0) == DCP_EINVAL);
    CHECK_OK(ctx, dcp_save(ctx, st, dir, NULL));
    dcp_state_free(st);

    /* Each rank loads its own entries (strict: together the ranks ask for
     * every key). */
    CHECK(dcp_state_create(&ld) == 0);
    add_rank_entries(ld, mt_rank, got, 0);
    CHECK(dcp_state_add_value(ld, "step", dcp_value_none()) == 0);
    memset(got, 0, sizeof(got));
    CHECK_OK(ctx, dcp_load(ctx, ld, dir, NULL));
    check_rank_entries(ld, mt_rank, got);
    v = dcp_state_value(ld, "step");
    CHECK(v && dcp_value_as_int(v) == 42);
    dcp_state_free(ld);

    /* And its neighbour's. */
    CHECK(dcp_state_create(&ld) == 0);
    add_rank_entries(ld, next, other, 0);
    CHECK(dcp_state_add_value(ld, "step", dcp_value_none()) == 0);
    CHECK_OK(ctx, dcp_load(ctx, ld, dir, NULL));
    check_rank_entries(ld, next, other);
    dcp_state_free(ld);
}

int main(int argc, char **argv)
{
    int rc;
    mt_init(&argc, &argv);
    mt_tmpdir(root, sizeof(root), "perrank");
    rc = dcp_comm_mpi(&comm, MPI_COMM_WORLD);
    if (rc == DCP_OK)
        rc = dcp_ctx_create(&ctx, comm, NULL);
    if (rc != DCP_OK)
        MPI_Abort(MPI_COMM_WORLD, 1);
    RUN(per_rank_keys);
    dcp_ctx_free(ctx);
    dcp_comm_free(comm);
    return mt_finish();
}
