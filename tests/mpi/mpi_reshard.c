/*
 * Save on N ranks, load on M: `mpi_reshard save DIR` under mpiexec -n N
 * writes one checkpoint holding every sharding pattern; `mpi_reshard load
 * DIR` under mpiexec -n M loads it with M-rank shardings (often along
 * another dimension) and checks every byte. Patterns: row, column, 2-D
 * block, uneven and empty shards, a tensor held by some ranks only,
 * replicated tensors (dedup: one chunk each, spread over the ranks), 0-d,
 * nested keys and values (replicated and single-rank), records of several
 * CRC blocks. `--user-comm` runs
 * the same through a communicator the test implements itself over MPI
 * (dcp_comm_create), instead of dcp_comm_mpi; `--user-v1` through a
 * version-1 one (no point-to-point operations).
 *
 * Read once (dcp_load): by default chunks that several ranks need are
 * read by one and forwarded (checked: some bytes are received over the
 * communicator when M > 1); `--per-rank` passes DCP_LOAD_PER_RANK_READS
 * (checked: none are); `--read-once` passes DCP_LOAD_READ_ONCE (with
 * `--user-v1`: refused with DCP_ENOTSUP). `mpi_reshard replicated DIR` loads
 * every tensor whole on every rank and checks that the bytes read from storage,
 * summed over the ranks, are exactly the checkpoint's tensor bytes (read once),
 * or at least M times them with `--per-rank`. `--zstd` saves with
 * DCP_SAVE_ZSTD (compressed records: the loads, forwarded chunks included,
 * must decompress them).
 */
#include <dcp/dcp.h>
#include <dcp/dcp_comm.h>
#include <dcp/dcp_mpi.h>

#include "mpitest.h"
#include "mt_usercomm.h"

enum shard { ROW, COL, BLOCK, FULL, SOME, MANY };

struct tspec {
    const char *name;
    dcp_dtype dt;
    int ndim;
    int64_t shape[2];
    unsigned seed;
    enum shard save, load;
};

static const struct tspec specs[] = {
    {"row", DCP_F32, 2, {12, 7}, 1, ROW, COL},
    {"col", DCP_BF16, 2, {5, 11}, 2, COL, ROW},
    {"block", DCP_I64, 2, {9, 10}, 3, BLOCK, BLOCK},
    {"uneven", DCP_U8, 2, {10, 3}, 4, ROW, ROW},
    {"tiny", DCP_I16, 2, {2, 5}, 5, ROW, ROW},
    {"empty", DCP_F32, 2, {0, 4}, 6, FULL, FULL},
    {"some", DCP_F64, 2, {6, 4}, 7, SOME, ROW},
    {"rep", DCP_F64, 2, {4, 4}, 8, FULL, FULL},
    {"rep1", DCP_I32, 1, {64}, 9, FULL, FULL},
    {"rep2", DCP_I32, 1, {64}, 10, FULL, FULL},
    {"rep3", DCP_I32, 1, {64}, 11, FULL, FULL},
    {"rep4", DCP_I32, 1, {64}, 12, FULL, FULL},
    {"scalar", DCP_F32, 0, {0}, 13, FULL, FULL},
    {"vec", DCP_F16, 1, {10}, 14, ROW, ROW},
    {"exp_avg", DCP_F32, 2, {12, 7}, 15, ROW, COL}, /* nested, see below */
    /* 2200 one-element boxes dealt round-robin: several boxes per rank,
     * more than 1000 chunks (batched pickle containers). */
    {"many", DCP_U8, 1, {2200}, 16, MANY, ROW},
    /* Records of several 1 MiB blocks (block CRCs, docs/FORMAT.md §4):
     * loads that overlap part of a stored chunk read and check only its
     * blocks they touch, through the batched path (rows) and the copying
     * one (columns). */
    {"bigrow", DCP_F32, 2, {1104, 1024}, 17, ROW, ROW},
    {"bigcol", DCP_F32, 2, {1032, 600}, 18, ROW, COL},
};
#define NSPECS (sizeof(specs) / sizeof(specs[0]))

/* The box rank r of n holds under sharding s; 0 when it holds none. */
static int box_of(const struct tspec *t, enum shard s, int r, int n,
                  int64_t *off, int64_t *size)
{
    int d, pr = n, pc = 1;
    for (d = 0; d < t->ndim; d++) {
        off[d] = 0;
        size[d] = t->shape[d];
    }
    switch (s) {
    case ROW:
        mt_split(t->shape[0], n, r, &off[0], &size[0]);
        return 1;
    case COL:
        mt_split(t->shape[1], n, r, &off[1], &size[1]);
        return 1;
    case BLOCK:
        if (n == 4)
            pr = pc = 2;
        mt_split(t->shape[0], pr, r / pc, &off[0], &size[0]);
        mt_split(t->shape[1], pc, r % pc, &off[1], &size[1]);
        return 1;
    case SOME: /* FSDP-style: only the first two ranks hold the key */
        if (r >= 2)
            return 0;
        mt_split(t->shape[0], n < 2 ? n : 2, r, &off[0], &size[0]);
        return 1;
    case FULL:
    case MANY: /* the boxes are added one by one, see add_spec */
        return 1;
    }
    return 0;
}

struct held {
    unsigned char *buf;
    int64_t off[2], size[2];
    int have;
};

static int add_spec(dcp_state *st, const struct tspec *t, struct held *h,
                    enum shard s, int r, int n, int fill)
{
    size_t es = dcp_dtype_size(t->dt), nb;
    int rc, nested = strcmp(t->name, "exp_avg") == 0;
    h->have = box_of(t, s, r, n, h->off, h->size);
    if (!h->have)
        return 0;
    if (s == MANY) {
        int64_t i, k = 0;
        h->buf = calloc((size_t)t->shape[0], 1);
        mt_fill(h->buf, 1, t->shape, h->off, h->size, 1, t->seed);
        for (i = r, rc = 0; i < t->shape[0] && rc == 0; i += n, k++) {
            int64_t one = 1;
            h->buf[k] = h->buf[i]; /* element i, packed */
            rc = dcp_state_add_tensor(st, t->name, t->dt, 1, t->shape, &i,
                                      &one, h->buf + k, DCP_MEM_HOST);
        }
        return rc;
    }
    nb = mt_numel(t->ndim, h->size) * es;
    h->buf = calloc(nb ? nb : 1, 1);
    if (fill)
        mt_fill(h->buf, t->ndim, t->shape, h->off, h->size, es, t->seed);
    if (nested) {
        (void)dcp_state_push(st, "opt");
        (void)dcp_state_push(st, "state");
        (void)dcp_state_push_index(st, 0);
    }
    rc = dcp_state_add_tensor(st, t->name, t->dt, t->ndim, t->shape, h->off,
                              h->size, h->buf, DCP_MEM_HOST);
    if (nested) {
        (void)dcp_state_pop(st);
        (void)dcp_state_pop(st);
        (void)dcp_state_pop(st);
    }
    return rc;
}

/* ------------------------------------------------- a user communicator */

static int make_comm(dcp_comm **out, int user)
{
    return user ? mt_user_comm(out) : dcp_comm_mpi(out, MPI_COMM_WORLD);
}

/* ---------------------------------------------------------------- save */

static const char *dir;
static int user_comm, per_rank, replicated, read_once, zstd;

static void add_values(dcp_state *st, int r, int n, int save)
{
    dcp_value *cfg = dcp_value_dict();
    (void)dcp_value_dict_set(cfg, "lr", dcp_value_float(save ? 0.5 : 0));
    (void)dcp_value_dict_set(cfg, "name", dcp_value_str(save ? "adamw" : ""));
    CHECK(dcp_state_add_value(st, "step", dcp_value_int(save ? 1000 : 0)) == 0);
    CHECK(dcp_state_add_value(st, "cfg", cfg) == 0);
    /* only0 is saved by rank 0 and loaded by the last rank; lastrank the
     * other way round. */
    if (save ? r == 0 : r == n - 1)
        CHECK(dcp_state_add_value(
                  st, "only0", dcp_value_str(save ? "from rank 0" : "")) == 0);
    if (save ? r == n - 1 : r == 0)
        CHECK(dcp_state_add_value(st, "lastrank",
                                  dcp_value_bytes(save ? "\x01\x02\x00" : "",
                                                  save ? 3 : 0)) == 0);
}

static void check_saved(dcp_ctx *ctx, int n)
{
    static const char *reps[] = {"rep", "rep1", "rep2", "rep3", "rep4"};
    dcp_metadata *md;
    dcp_entry_info ei;
    dcp_chunk_info ci;
    const char *files[5];
    size_t i, j, distinct = 0;
    CHECK_OK(ctx, dcp_verify(ctx, dir));
    CHECK_OK(ctx, dcp_metadata_open(ctx, dir, &md));
    if (!md)
        return;
    for (i = 0; i < 5; i++) {
        long k = dcp_metadata_find(md, reps[i]);
        CHECK(k >= 0 && dcp_metadata_entry(md, (size_t)k, &ei) == 0);
        CHECK(ei.nchunks == 1); /* replicated: written once */
        CHECK(dcp_metadata_chunk(md, (size_t)k, 0, &ci) == 0);
        files[i] = ci.file;
        for (j = 0; j < i && strcmp(files[j], files[i]) != 0; j++)
            ;
        distinct += j == i;
    }
    /* Spread by size over the holders, not all on rank 0. */
    CHECK(distinct >= (size_t)(n < 2 ? 1 : 2));
    CHECK(dcp_metadata_entry(md, (size_t)dcp_metadata_find(md, "tiny"), &ei) ==
          0);
    /* Two rows over n ranks: the empty shards dedup into one chunk. */
    CHECK(ei.nchunks == (size_t)((n < 2 ? n : 2) + (n > 2)));
    CHECK(dcp_metadata_entry(md, (size_t)dcp_metadata_find(md, "empty"), &ei) ==
          0);
    CHECK(ei.nchunks == 1);
    CHECK(dcp_metadata_find(md, "opt.state.0.exp_avg") >= 0);
    dcp_metadata_free(md);
}

static void test_save(void)
{
    struct held h[NSPECS];
    dcp_comm *comm = NULL;
    dcp_ctx *ctx = NULL;
    dcp_state *st;
    dcp_save_options so;
    size_t i;
    memset(h, 0, sizeof(h));
    memset(&so, 0, sizeof(so));
    so.struct_size = sizeof(so);
    so.no_fsync = 1;
    so.flags = zstd ? DCP_SAVE_ZSTD : 0;
    CHECK(make_comm(&comm, user_comm) == 0);
    CHECK(dcp_ctx_create(&ctx, comm, NULL) == 0);
    CHECK(dcp_ctx_rank(ctx) == mt_rank && dcp_ctx_size(ctx) == mt_size);
    CHECK(dcp_state_create(&st) == 0);
    for (i = 0; i < NSPECS; i++)
        CHECK(add_spec(st, &specs[i], &h[i], specs[i].save, mt_rank, mt_size,
                       1) == 0);
    add_values(st, mt_rank, mt_size, 1);
    CHECK_OK(ctx, dcp_save(ctx, st, dir, &so));
    if (mt_rank == 0) {
        dcp_ctx *solo;
        CHECK(dcp_ctx_create(&solo, NULL, NULL) == 0);
        check_saved(solo, mt_size);
        dcp_ctx_free(solo);
    }
    for (i = 0; i < NSPECS; i++)
        free(h[i].buf);
    dcp_state_free(st);
    dcp_ctx_free(ctx);
    dcp_comm_free(comm);
}

/* ---------------------------------------------------------------- load */

static void check_values(const dcp_state *st, int r, int n)
{
    const dcp_value *v;
    size_t len;
    v = dcp_state_value(st, "step");
    CHECK(v && dcp_value_as_int(v) == 1000);
    v = dcp_state_value(st, "cfg.lr");
    CHECK(v && dcp_value_as_float(v) == 0.5);
    v = dcp_state_value(st, "cfg.name");
    CHECK(v && strcmp(dcp_value_as_str(v, NULL), "adamw") == 0);
    if (r == n - 1) {
        v = dcp_state_value(st, "only0");
        CHECK(v && strcmp(dcp_value_as_str(v, NULL), "from rank 0") == 0);
    }
    if (r == 0) {
        const void *p;
        v = dcp_state_value(st, "lastrank");
        p = dcp_value_as_bytes(v, &len);
        CHECK(v && p && len == 3 && memcmp(p, "\x01\x02\x00", 3) == 0);
    }
}

static void test_load(void)
{
    struct held h[NSPECS];
    dcp_comm *comm = NULL;
    dcp_ctx *ctx = NULL;
    dcp_state *st;
    size_t i;
    memset(h, 0, sizeof(h));
    CHECK(make_comm(&comm, user_comm) == 0);
    CHECK(dcp_ctx_create(&ctx, comm, NULL) == 0);
    CHECK(dcp_state_create(&st) == 0);
    uint64_t total = 0, mine[2], sum[2];
    dcp_load_options lo;
    dcp_phase_report pr;
    memset(&lo, 0, sizeof(lo));
    lo.struct_size = sizeof(lo);
    lo.flags = (per_rank ? DCP_LOAD_PER_RANK_READS : 0) |
               (read_once ? DCP_LOAD_READ_ONCE : 0);
    for (i = 0; i < NSPECS; i++) {
        CHECK(add_spec(st, &specs[i], &h[i], replicated ? FULL : specs[i].load,
                       mt_rank, mt_size, 0) == 0);
        total += mt_numel(specs[i].ndim, specs[i].shape) *
                 dcp_dtype_size(specs[i].dt);
    }
    add_values(st, mt_rank, mt_size, 0);
    if (read_once && user_comm == 2) {
        /* Required, and the version-1 communicator cannot: refused on
         * every rank before anything is read. */
        CHECK_RC(ctx, dcp_load(ctx, st, dir, &lo), DCP_ENOTSUP);
        CHECK_MSG(ctx, "DCP_LOAD_READ_ONCE");
        lo.flags |= DCP_LOAD_PER_RANK_READS;
        CHECK_RC(ctx, dcp_load(ctx, st, dir, &lo), DCP_EINVAL);
        for (i = 0; i < NSPECS; i++)
            free(h[i].buf);
        dcp_state_free(st);
        dcp_ctx_free(ctx);
        dcp_comm_free(comm);
        return;
    }
    CHECK_OK(ctx, dcp_load(ctx, st, dir, &lo));
    /* Bytes read from storage and received from other ranks, over all. */
    memset(&pr, 0, sizeof(pr));
    pr.struct_size = sizeof(pr);
    CHECK(dcp_ctx_phase_report(ctx, DCP_IO_LOAD, &pr) == DCP_OK);
    mine[0] = pr.bytes[DCP_PHASE_READ];
    mine[1] = pr.bytes[DCP_PHASE_EXCHANGE];
    MPI_Allreduce(mine, sum, 2, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    if (per_rank || mt_size == 1 || user_comm == 2)
        CHECK(sum[1] == 0);
    else
        CHECK(sum[1] > 0);
    if (replicated) {
        /* Per-rank reads: every rank reads everything, and the I/O engine
         * reads whole 4 KiB pages with O_DIRECT (the 2200 one-byte chunks
         * of "many" cost a page each), so at least M times the bytes. */
        int per = per_rank || user_comm == 2;
        uint64_t want = per ? total * (uint64_t)mt_size : total;
        CHECK(!per || mine[0] >= total);
        if (per ? sum[0] < want : sum[0] != want) {
            fprintf(stderr,
                    "[rank %d] read %llu bytes from storage in all, want "
                    "%llu (%llu tensor bytes)\n",
                    mt_rank, (unsigned long long)sum[0],
                    (unsigned long long)want, (unsigned long long)total);
            mt_fail++;
        }
        CHECK(
            sum[1] ==
            (per_rank || user_comm == 2 ? 0 : total * (uint64_t)(mt_size - 1)));
    }
    for (i = 0; i < NSPECS; i++) {
        const struct tspec *t = &specs[i];
        size_t es = dcp_dtype_size(t->dt);
        size_t nb = mt_numel(t->ndim, h[i].size) * es;
        unsigned char *want = calloc(nb ? nb : 1, 1);
        mt_fill(want, t->ndim, t->shape, h[i].off, h[i].size, es, t->seed);
        if (memcmp(want, h[i].buf, nb) != 0) {
            fprintf(stderr, "[rank %d] '%s': loaded bytes differ\n", mt_rank,
                    t->name);
            mt_fail++;
        }
        free(want);
        free(h[i].buf);
    }
    check_values(st, mt_rank, mt_size);
    dcp_state_free(st);
    dcp_ctx_free(ctx);
    dcp_comm_free(comm);
}

int main(int argc, char **argv)
{
    int i, save = 0;
    mt_init(&argc, &argv);
    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "save") == 0)
            save = 1;
        else if (strcmp(argv[i], "load") == 0)
            save = 0;
        else if (strcmp(argv[i], "replicated") == 0)
            replicated = 1;
        else if (strcmp(argv[i], "--user-comm") == 0)
            user_comm = 1;
        else if (strcmp(argv[i], "--user-v1") == 0)
            user_comm = mt_user_v1 = 2;
        else if (strcmp(argv[i], "--per-rank") == 0)
            per_rank = 1;
        else if (strcmp(argv[i], "--read-once") == 0)
            read_once = 1;
        else if (strcmp(argv[i], "--zstd") == 0)
            zstd = 1;
        else
            dir = argv[i];
    }
    if (!dir) {
        if (mt_rank == 0)
            fprintf(stderr, "usage: mpi_reshard save|load|replicated DIR "
                            "[--user-comm|--user-v1] "
                            "[--per-rank|--read-once] [--zstd]\n");
        MPI_Finalize();
        return 2;
    }
    if (save)
        RUN(save);
    else
        RUN(load);
    return mt_finish();
}
