/*
 * dcp_comm_mpi_set_timeout: a rank that stops answering. Run on 3 ranks:
 * all save checkpoint A; then rank 2 hangs (sleeps) while ranks 0 and 1
 * load A and save B, each on a communicator with a 1 s timeout. Both calls
 * must fail with DCP_ETIMEOUT within a few seconds, B must not be
 * committed, A must still load bit-exact, and a call on the broken
 * communicator must fail at once. MPI cannot cancel the pending
 * collectives, so the test ends the job the documented way: rank 0 calls
 * MPI_Abort with 0 when ranks 0 and 1 passed (1 otherwise).
 */
#include <dcp/dcp.h>
#include <dcp/dcp_mpi.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int rank, fails;

#define CHECK(c)                                                               \
    do {                                                                       \
        if (!(c)) {                                                            \
            fprintf(stderr, "[rank %d] %s:%d: check failed: %s\n", rank,       \
                    __FILE__, __LINE__, #c);                                   \
            fails++;                                                           \
        }                                                                      \
    } while (0)

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* 12 x 4 floats, rows split over nranks; rank r's rows hold r*1000 + i. */
static dcp_state *make_state(int r, int n, float *buf, int fill)
{
    int64_t shape[2] = {12, 4}, off[2], size[2];
    dcp_state *st = NULL;
    int i;
    off[0] = 12 * r / n;
    size[0] = 12 * (r + 1) / n - off[0];
    off[1] = 0;
    size[1] = 4;
    for (i = 0; i < size[0] * 4; i++)
        buf[i] = fill ? (float)(off[0] * 4 + i) : -1.0f;
    if (dcp_state_create(&st) != DCP_OK ||
        dcp_state_add_tensor(st, "w", DCP_F32, 2, shape, off, size, buf,
                             DCP_MEM_HOST) != DCP_OK)
        abort();
    return st;
}

int main(int argc, char **argv)
{
    const char *dir = argc > 1 ? argv[1] : "timeout-ckpt";
    char a[512], b[512], bmeta[600];
    dcp_comm *c1 = NULL, *c2 = NULL;
    dcp_ctx *x1 = NULL, *x2 = NULL;
    dcp_state *st;
    MPI_Comm pair;
    float buf[48];
    int size, rc, other = 0;
    double t0, dt;
    struct stat sb;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != 3) {
        if (rank == 0)
            fprintf(stderr, "run on 3 ranks\n");
        MPI_Finalize();
        return 2;
    }
    (void)snprintf(a, sizeof(a), "%s/A", dir);
    (void)snprintf(b, sizeof(b), "%s/B", dir);
    (void)snprintf(bmeta, sizeof(bmeta), "%s/.metadata", b);
    MPI_Comm_split(MPI_COMM_WORLD, rank < 2 ? 0 : 1, rank, &pair);
    CHECK(dcp_comm_mpi(&c1, MPI_COMM_WORLD) == DCP_OK);
    CHECK(dcp_comm_mpi(&c2, MPI_COMM_WORLD) == DCP_OK);
    CHECK(dcp_comm_mpi_set_timeout(c1, 1.0) == DCP_OK);
    CHECK(dcp_comm_mpi_set_timeout(c2, 1.0) == DCP_OK);
    CHECK(dcp_comm_mpi_set_timeout(c1, -1.0) == DCP_EINVAL);
    CHECK(dcp_comm_mpi_set_timeout(NULL, 1.0) == DCP_EINVAL);
    CHECK(dcp_ctx_create(&x1, c1, NULL) == DCP_OK);
    CHECK(dcp_ctx_create(&x2, c2, NULL) == DCP_OK);

    /* Everyone answers: a normal save under the timeout. */
    st = make_state(rank, 3, buf, 1);
    rc = dcp_save(x1, st, a, NULL);
    if (rc != DCP_OK)
        fprintf(stderr, "[rank %d] save A: %s\n", rank, dcp_errmsg(x1));
    CHECK(rc == DCP_OK);
    dcp_state_free(st);
    MPI_Barrier(MPI_COMM_WORLD);

    if (rank == 2) { /* hangs: never calls dcp again */
        sleep(60);
        MPI_Finalize();
        return 1;
    }

    /* Ranks 0 and 1: a load and a save with rank 2 silent. */
    st = make_state(rank, 2, buf, 0);
    t0 = now();
    rc = dcp_load(x2, st, a, NULL);
    dt = now() - t0;
    fprintf(stderr, "[rank %d] load with a hung rank: %s after %.2f s: %s\n",
            rank, dcp_err_name(rc), dt, dcp_errmsg(x2));
    CHECK(rc == DCP_ETIMEOUT);
    CHECK(dt >= 0.9 && dt < 10.0);
    CHECK(strstr(dcp_errmsg(x2), "timed out") != NULL);
    dcp_state_free(st);

    st = make_state(rank, 2, buf, 1);
    t0 = now();
    rc = dcp_save(x1, st, b, NULL);
    dt = now() - t0;
    fprintf(stderr, "[rank %d] save with a hung rank: %s after %.2f s: %s\n",
            rank, dcp_err_name(rc), dt, dcp_errmsg(x1));
    CHECK(rc == DCP_ETIMEOUT);
    CHECK(dt >= 0.9 && dt < 10.0);
    CHECK(stat(bmeta, &sb) != 0); /* nothing committed */

    /* The broken communicator fails at once. */
    t0 = now();
    rc = dcp_save(x1, st, b, NULL);
    CHECK(rc == DCP_ETIMEOUT);
    CHECK(now() - t0 < 0.5);
    dcp_state_free(st);

    /* A still loads, bit-exact, in a single process. */
    if (rank == 0) {
        dcp_ctx *x0 = NULL;
        int64_t shape[2] = {12, 4}, off[2] = {0, 0};
        float all[48];
        int i;
        memset(all, 0, sizeof(all));
        CHECK(dcp_ctx_create(&x0, NULL, NULL) == DCP_OK);
        CHECK(dcp_state_create(&st) == DCP_OK);
        CHECK(dcp_state_add_tensor(st, "w", DCP_F32, 2, shape, off, shape,
                                   all, DCP_MEM_HOST) == DCP_OK);
        rc = dcp_load(x0, st, a, NULL);
        CHECK(rc == DCP_OK);
        for (i = 0; i < 48; i++)
            CHECK(all[i] == (float)i);
        dcp_state_free(st);
        dcp_ctx_free(x0);
    }
    dcp_ctx_free(x1);
    dcp_ctx_free(x2);
    dcp_comm_free(c1);
    dcp_comm_free(c2);

    /* Rank 1's verdict to rank 0, over a communicator without rank 2. */
    if (rank == 1) {
        MPI_Send(&fails, 1, MPI_INT, 0, 7, pair);
    } else {
        MPI_Recv(&other, 1, MPI_INT, 1, 7, pair, MPI_STATUS_IGNORE);
        printf("%s: rank 0 %d failures, rank 1 %d failures\n",
               fails + other ? "FAIL" : "ok", fails, other);
        fflush(stdout);
        fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, fails + other ? 1 : 0);
    }
    sleep(60); /* rank 1: ended by rank 0's MPI_Abort */
    return 1;
}
