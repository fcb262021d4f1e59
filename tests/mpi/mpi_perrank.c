/*
 * Per-rank data (PyTorch issue #120356): state that differs from rank to
 * rank under one logical name is saved under per-rank keys
 * (dcp_state_push_rank -> "rank<r>.rng"), next to shared state, and each
 * rank loads its own back; a rank can also read another rank's entry; a
 * restart on more ranks loads with DCP_LOAD_MISSING_RANK_KEYS.
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

/*
 * A restart on more ranks than the save (size-1 ranks save, size load):
 * the new rank's per-rank keys are missing. Strict: DCP_EKEY on every
 * rank. DCP_LOAD_MISSING_RANK_KEYS: the old ranks load their own entries,
 * the new rank's "rank<r>.*" are reported missing (its buffer untouched),
 * the shared "step" loads everywhere; a missing key outside the rank's
 * prefix still fails.
 */
static void test_more_ranks(void)
{
    char dir[300];
    float mine[8], got[8], keep[8];
    dcp_state *st, *ld;
    dcp_load_options lo = {sizeof(lo), DCP_LOAD_MISSING_RANK_KEYS, NULL};
    const char *const *keys = NULL;
    const dcp_value *v;
    int old = mt_rank < mt_size - 1, rc;
    MPI_Comm sub = MPI_COMM_NULL;
    if (mt_size < 2)
        return;
    snprintf(dir, sizeof(dir), "%s/more", root);
    MPI_Comm_split(MPI_COMM_WORLD, old ? 0 : MPI_UNDEFINED, mt_rank, &sub);
    if (old) {
        dcp_comm *sc = NULL;
        dcp_ctx *sctx = NULL;
        CHECK(dcp_comm_mpi(&sc, sub) == DCP_OK);
        CHECK(dcp_ctx_create(&sctx, sc, NULL) == DCP_OK);
        CHECK(dcp_state_create(&st) == 0);
        add_rank_entries(st, mt_rank, mine, 1);
        CHECK(dcp_state_add_value(st, "step", dcp_value_int(42)) == 0);
        CHECK_OK(sctx, dcp_save(sctx, st, dir, NULL));
        dcp_state_free(st);
        dcp_ctx_free(sctx);
        dcp_comm_free(sc);
        MPI_Comm_free(&sub);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    CHECK(dcp_state_create(&ld) == 0);
    add_rank_entries(ld, mt_rank, got, 0);
    CHECK(dcp_state_add_value(ld, "step", dcp_value_none()) == 0);
    memset(got, 0x5a, sizeof(got));
    memcpy(keep, got, sizeof(got));
    rc = dcp_load(ctx, ld, dir, NULL);
    CHECK_RC(ctx, rc, DCP_EKEY);
    CHECK(mt_same(rc));
    CHECK_OK(ctx, dcp_load(ctx, ld, dir, &lo));
    if (old) {
        check_rank_entries(ld, mt_rank, got);
        CHECK(dcp_load_report(ctx, 0, &keys) == 0);
    } else {
        char k1[32], k2[32];
        snprintf(k1, sizeof(k1), "rank%d.buf", mt_rank);
        snprintf(k2, sizeof(k2), "rank%d.rng", mt_rank);
        CHECK(memcmp(got, keep, sizeof(got)) == 0);
        CHECK(dcp_load_report(ctx, 0, &keys) == 2);
        CHECK(keys && ((!strcmp(keys[0], k1) && !strcmp(keys[1], k2)) ||
                       (!strcmp(keys[0], k2) && !strcmp(keys[1], k1))));
    }
    v = dcp_state_value(ld, "step");
    CHECK(v && dcp_value_as_int(v) == 42);
    /* Only this rank's prefix is forgiven. */
    CHECK(dcp_state_add_value(ld, "nope", dcp_value_none()) == 0);
    rc = dcp_load(ctx, ld, dir, &lo);
    CHECK_RC(ctx, rc, DCP_EKEY);
    CHECK(mt_same(rc));
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
    RUN(more_ranks);
    dcp_ctx_free(ctx);
    dcp_comm_free(comm);
    return mt_finish();
}
