/*
 * mpi_readonce DIR (3 ranks): failures of the read-once load, where every
 * rank loads the whole state (tests/fault/refstate.h) so that every chunk
 * is read by one rank and forwarded to the others.
 *  - read_error: rank 1's first chunk read fails (faultfs, DCP_EIO): every
 *    rank returns DCP_EIO with the same message, "rank 1 failed: ...";
 *    every byte on the other ranks is the saved one or the untouched
 *    sentinel (no partial or foreign bytes), and some are untouched (the
 *    chunks rank 1 was to forward).
 *  - crc: a byte of a stored chunk flipped on disk: every rank returns
 *    DCP_ECORRUPT with the same message naming one reading rank and the
 *    CRC mismatch; with DCP_LOAD_PER_RANK_READS every rank finds it
 *    ("ranks 0 to 2 failed"), again the same message everywhere.
 *  - ok: after the byte is restored, a bit-exact load.
 *  - small: DCP_LOAD_SMALL_PER_RANK (on every rank, on one rank only):
 *    bit-exact, fewer bytes exchanged.
 *  - cast: model.mat (saved F32) asked for as F64 on every rank, whole
 *    and in two row boxes on odd ranks (DCP_LOAD_CAST, DCP_LOAD_PARTIAL):
 *    forwarded chunks land through a buffer and are cast on copy.
 */
#include <dcp/dcp.h>
#include <dcp/dcp_mpi.h>

#include <stdio.h>

#include "mpitest.h"
#include "faultfs.h"
#include "refstate.h"

static const char *dir;
static struct faultfs ff;

#define SENT 0xAB

static dcp_ctx *make_ctx(dcp_comm **c)
{
    dcp_ctx_options o;
    dcp_ctx *x = NULL;
    memset(&o, 0, sizeof(o));
    o.struct_size = sizeof(o);
    o.storage = ff_ops();
    o.storage_impl = &ff;
    CHECK(dcp_comm_mpi(c, MPI_COMM_WORLD) == DCP_OK);
    CHECK(dcp_ctx_create(&x, *c, &o) == DCP_OK);
    if (!x)
        MPI_Abort(MPI_COMM_WORLD, 3);
    return x;
}

/* Every rank's message equals rank 0's. */
static void same_message(dcp_ctx *x)
{
    char mine[DCP_ERRMSG_MAX], root[DCP_ERRMSG_MAX];
    memset(mine, 0, sizeof(mine));
    snprintf(mine, sizeof(mine), "%s", dcp_errmsg(x));
    memcpy(root, mine, sizeof(root));
    MPI_Bcast(root, (int)sizeof(root), MPI_CHAR, 0, MPI_COMM_WORLD);
    if (strcmp(mine, root) != 0) {
        fprintf(stderr, "[rank %d] message \"%s\", rank 0's \"%s\"\n", mt_rank,
                mine, root);
        mt_fail++;
    }
}

/* Loads the whole state into sentinel-filled buffers; *r keeps them. */
static int load_whole(struct refstate *r, unsigned flags, dcp_ctx *x)
{
    dcp_load_options lo;
    memset(&lo, 0, sizeof(lo));
    lo.struct_size = sizeof(lo);
    lo.flags = flags;
    if (rs_build_part(r, 0, 0, 1))
        MPI_Abort(MPI_COMM_WORLD, 4);
    memset(r->big, SENT, sizeof(r->big));
    memset(r->mat, SENT, sizeof(r->mat));
    memset(r->vec, SENT, sizeof(r->vec));
    return dcp_load(x, r->st, dir, &lo);
}

/* Each byte of a is b's or the sentinel; returns the sentinel bytes. */
static size_t saved_or_sentinel(const void *a, const void *b, size_t n)
{
    const unsigned char *p = a, *q = b;
    size_t i, sent = 0;
    for (i = 0; i < n; i++) {
        if (p[i] == q[i])
            continue;
        if (p[i] != SENT) {
            fprintf(stderr,
                    "[rank %d] byte %zu is neither saved nor "
                    "untouched\n",
                    mt_rank, i);
            mt_fail++;
            return sent;
        }
        sent++;
    }
    return sent;
}

static void test_read_error(void)
{
    struct refstate r, want;
    dcp_comm *c = NULL;
    dcp_ctx *x = make_ctx(&c);
    size_t untouched;
    int rc;
    if (rs_build_part(&want, RS_SEED_OLD, 0, 1))
        MPI_Abort(MPI_COMM_WORLD, 4);
    ff_reset(&ff);
    if (mt_rank == 1) {
        /* The first two reads are the value records (each read whole);
         * the third is the first chunk rank 1 reads for everyone. */
        ff.fail_mask = 1u << FF_READ;
        ff.fail_at = 3;
        ff.fail_code = DCP_EIO;
    }
    rc = load_whole(&r, 0, x);
    CHECK_RC(x, rc, DCP_EIO);
    CHECK_MSG(x, "rank 1 failed: ");
    same_message(x);
    if (mt_rank != 1) {
        untouched =
            saved_or_sentinel(r.big, want.big, (size_t)rs_big_rows * 160 * 2) +
            saved_or_sentinel(r.mat, want.mat, sizeof(r.mat)) +
            saved_or_sentinel(r.vec, want.vec, sizeof(r.vec));
        CHECK(untouched > 0);
        /* Values are replaced only by a load that succeeds. */
        CHECK(dcp_value_as_int(dcp_state_value(r.st, "step")) == 0);
    }
    ff_reset(&ff);
    rs_free(&r);
    rs_free(&want);
    dcp_ctx_free(x);
    dcp_comm_free(c);
}

/* Flips (twice: restores) a byte in the middle of __1_0.distcp, inside
 * the data of its model.big chunk. */
static void flip(void)
{
    char path[4096];
    FILE *f;
    long n;
    int ch;
    MPI_Barrier(MPI_COMM_WORLD);
    if (mt_rank == 0) {
        snprintf(path, sizeof(path), "%s/__1_0.distcp", dir);
        f = fopen(path, "r+b");
        CHECK(f != NULL);
        if (f) {
            CHECK(fseek(f, 0, SEEK_END) == 0);
            n = ftell(f);
            CHECK(fseek(f, n / 2, SEEK_SET) == 0);
            ch = fgetc(f);
            CHECK(fseek(f, n / 2, SEEK_SET) == 0);
            CHECK(fputc(ch ^ 0x5a, f) != EOF);
            CHECK(fclose(f) == 0);
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

static void test_crc(void)
{
    struct refstate r;
    dcp_comm *c = NULL;
    dcp_ctx *x = make_ctx(&c);
    int rc;
    flip();
    rc = load_whole(&r, 0, x);
    CHECK_RC(x, rc, DCP_ECORRUPT);
    CHECK_MSG(x, "CRC mismatch");
    CHECK_MSG(x, "__1_0.distcp");
    /* One reader found it: "rank R failed", not "ranks R to S". */
    CHECK(strncmp(dcp_errmsg(x), "rank ", 5) == 0);
    same_message(x);
    rs_free(&r);
    rc = load_whole(&r, DCP_LOAD_PER_RANK_READS, x);
    CHECK_RC(x, rc, DCP_ECORRUPT);
    CHECK_MSG(x, "ranks 0 to 2 failed; rank 0: ");
    CHECK_MSG(x, "CRC mismatch");
    same_message(x);
    rs_free(&r);
    flip();
    dcp_ctx_free(x);
    dcp_comm_free(c);
}

static void test_ok(void)
{
    struct refstate r, want;
    dcp_phase_report pr;
    dcp_comm *c = NULL;
    dcp_ctx *x = make_ctx(&c);
    if (rs_build_part(&want, RS_SEED_OLD, 0, 1))
        MPI_Abort(MPI_COMM_WORLD, 4);
    CHECK_OK(x, load_whole(&r, 0, x));
    CHECK(rs_equal(&r, &want));
    memset(&pr, 0, sizeof(pr));
    pr.struct_size = sizeof(pr);
    CHECK(dcp_ctx_phase_report(x, DCP_IO_LOAD, &pr) == DCP_OK);
    CHECK(pr.bytes[DCP_PHASE_EXCHANGE] > 0);
    rs_free(&r);
    rs_free(&want);
    dcp_ctx_free(x);
    dcp_comm_free(c);
}

/* The exchange bytes of a whole load with flags (set on rank `on`, or on
 * every rank when on < 0), checked bit-exact. */
static uint64_t exchanged(dcp_ctx *x, unsigned flags, int on)
{
    struct refstate r, want;
    dcp_phase_report pr;
    if (rs_build_part(&want, RS_SEED_OLD, 0, 1))
        MPI_Abort(MPI_COMM_WORLD, 4);
    CHECK_OK(x, load_whole(&r, on < 0 || on == mt_rank ? flags : 0, x));
    CHECK(rs_equal(&r, &want));
    memset(&pr, 0, sizeof(pr));
    pr.struct_size = sizeof(pr);
    CHECK(dcp_ctx_phase_report(x, DCP_IO_LOAD, &pr) == DCP_OK);
    rs_free(&r);
    rs_free(&want);
    return pr.bytes[DCP_PHASE_EXCHANGE];
}

/* DCP_LOAD_SMALL_PER_RANK: chunks under 64 KiB read by every rank that
 * needs them, so fewer bytes arrive by message (none when every chunk is
 * small); set on one rank only, it applies to all (no rank waits for a
 * message another does not send). */
static void test_small(void)
{
    dcp_comm *c = NULL;
    dcp_ctx *x = make_ctx(&c);
    uint64_t all = exchanged(x, 0, -1);
    uint64_t small = exchanged(x, DCP_LOAD_SMALL_PER_RANK, -1);
    uint64_t one = exchanged(x, DCP_LOAD_SMALL_PER_RANK, 2);
    uint64_t tot_all = 0, tot_small = 0;
    MPI_Allreduce(&all, &tot_all, 1, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
    MPI_Allreduce(&small, &tot_small, 1, MPI_UINT64_T, MPI_SUM,
                  MPI_COMM_WORLD);
    CHECK(tot_all > 0);
    CHECK(tot_small < tot_all);
    CHECK(one == small);
    dcp_ctx_free(x);
    dcp_comm_free(c);
}

static void test_cast(void)
{
    struct refstate want;
    dcp_load_options lo;
    dcp_state *st = NULL;
    dcp_comm *c = NULL;
    dcp_ctx *x = make_ctx(&c);
    double got[33 * 17];
    int64_t shape[2] = {33, 17}, o1[2] = {0, 0}, s1[2] = {33, 17};
    int64_t o2[2] = {10, 0}, s2[2] = {23, 17};
    size_t i;
    int bad = 0;
    if (rs_build_part(&want, RS_SEED_OLD, 0, 1) || dcp_state_create(&st))
        MPI_Abort(MPI_COMM_WORLD, 4);
    memset(got, SENT, sizeof(got));
    if (mt_rank % 2)
        s1[0] = 10; /* rows 0..9 and 10..32: two boxes */
    CHECK(dcp_state_push(st, "model") == DCP_OK);
    CHECK(dcp_state_add_tensor(st, "mat", DCP_F64, 2, shape, o1, s1, got,
                               DCP_MEM_HOST) == DCP_OK);
    if (mt_rank % 2)
        CHECK(dcp_state_add_tensor(st, "mat", DCP_F64, 2, shape, o2, s2,
                                   got + 10 * 17, DCP_MEM_HOST) == DCP_OK);
    CHECK(dcp_state_pop(st) == DCP_OK);
    memset(&lo, 0, sizeof(lo));
    lo.struct_size = sizeof(lo);
    lo.flags = DCP_LOAD_CAST | DCP_LOAD_PARTIAL;
    CHECK_OK(x, dcp_load(x, st, dir, &lo));
    /* The saved bytes are random: NaNs compare as NaNs. */
    for (i = 0; i < 33 * 17; i++) {
        double w = (double)want.mat[i];
        bad += !(got[i] == w || (got[i] != got[i] && w != w));
    }
    CHECK(bad == 0);
    dcp_state_free(st);
    rs_free(&want);
    dcp_ctx_free(x);
    dcp_comm_free(c);
}

int main(int argc, char **argv)
{
    struct refstate r;
    dcp_comm *c = NULL;
    dcp_ctx *x;
    mt_init(&argc, &argv);
    dir = argc > 1 ? argv[1] : NULL;
    if (!dir || mt_size != 3) {
        if (mt_rank == 0)
            fprintf(stderr, "usage: mpiexec -n 3 mpi_readonce DIR\n");
        MPI_Finalize();
        return 2;
    }
    ff_init(&ff);
    if (mt_rank == 0)
        rs_rmtree(dir);
    MPI_Barrier(MPI_COMM_WORLD);
    x = make_ctx(&c);
    if (rs_build_part(&r, RS_SEED_OLD, mt_rank, mt_size))
        MPI_Abort(MPI_COMM_WORLD, 4);
    CHECK_OK(x, dcp_save(x, r.st, dir, NULL));
    rs_free(&r);
    dcp_ctx_free(x);
    dcp_comm_free(c);
    RUN(read_error);
    RUN(crc);
    RUN(ok);
    RUN(small);
    RUN(cast);
    ff_release(&ff);
    return mt_finish();
}
