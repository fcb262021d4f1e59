/*
 * A stencil code's checkpoint without packing (dcp_state_add_tensor_strided).
 *
 * The grid is N x N doubles; each process owns a block of rows and keeps
 * it with one layer of ghost cells on every side, as a halo-exchange code
 * does: an (rows + 2) x (N + 2) array whose interior is the block. The
 * interior is added to the checkpoint as a strided box (row stride N + 2,
 * starting at element (1, 1)), so nothing is copied by hand before a save
 * and nothing is unpacked after a load, and the ghost cells are never
 * written by the load.
 *
 *   ghost_cells save DIR STEPS    runs STEPS Jacobi sweeps, then saves
 *   ghost_cells resume DIR STEPS  loads DIR, runs STEPS more sweeps, and
 *                                 prints the grid's checksum
 *   ghost_cells run STEPS         runs STEPS sweeps from the start and
 *                                 prints the checksum (to compare)
 *
 * Single process (a communicator would give each rank its row block; see
 * tests/mpi/mpi_strided.c). `ghost_cells save d 20 && ghost_cells resume d
 * 30` prints the checksum of `ghost_cells run 50`.
 */
#include <dcp/dcp.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N 96
#define W (N + 2) /* a row with its two ghost cells */

static double grid[W * W], next[W * W];

static void init(void)
{
    int i, j;
    for (i = 0; i < W; i++)
        for (j = 0; j < W; j++)
            grid[i * W + j] = (i == 0) ? 100.0 : 0.0; /* a hot top edge */
}

/* Ghost cells: fixed boundary values, kept as they are. */
static void sweep(int steps)
{
    int s, i, j;
    for (s = 0; s < steps; s++) {
        memcpy(next, grid, sizeof(grid));
        for (i = 1; i <= N; i++)
            for (j = 1; j <= N; j++)
                next[i * W + j] =
                    0.25 * (grid[(i - 1) * W + j] + grid[(i + 1) * W + j] +
                            grid[i * W + j - 1] + grid[i * W + j + 1]);
        memcpy(grid, next, sizeof(grid));
    }
}

static uint64_t checksum(void)
{
    uint64_t h = 1469598103934665603ULL;
    size_t i;
    const unsigned char *p = (const unsigned char *)grid;
    for (i = 0; i < sizeof(grid); i++) {
        h ^= p[i];
        h *= 1099511628211ULL;
    }
    return h;
}

/* The interior as a strided box, and the step count. */
static dcp_state *state(int64_t step)
{
    int64_t shape[2] = {N, N}, strides[2] = {W, 1};
    dcp_state *st = NULL;
    if (dcp_state_create(&st) ||
        dcp_state_add_tensor_strided(st, "u", DCP_F64, 2, shape, NULL, NULL,
                                     strides, &grid[1 * W + 1], DCP_MEM_HOST) ||
        dcp_state_add_value(st, "step", dcp_value_int(step))) {
        dcp_state_free(st);
        return NULL;
    }
    return st;
}

int main(int argc, char **argv)
{
    dcp_ctx *ctx = NULL;
    dcp_state *st;
    int steps, rc = DCP_OK, resume;
    if (argc == 3 && !strcmp(argv[1], "run")) {
        init();
        sweep(atoi(argv[2]));
        printf("%016llx\n", (unsigned long long)checksum());
        return 0;
    }
    if (argc != 4 || (strcmp(argv[1], "save") && strcmp(argv[1], "resume"))) {
        fprintf(stderr, "usage: ghost_cells save|resume DIR STEPS | run "
                        "STEPS\n");
        return 2;
    }
    resume = !strcmp(argv[1], "resume");
    steps = atoi(argv[3]);
    init();
    if (dcp_ctx_create(&ctx, NULL, NULL) != DCP_OK)
        return 1;
    st = state(0);
    if (!st)
        rc = DCP_ENOMEM;
    if (rc == DCP_OK && resume) {
        /* The interior lands in place; the ghost cells keep init()'s. */
        rc = dcp_load(ctx, st, argv[2], NULL);
        if (rc == DCP_OK)
            printf("resumed at step %lld\n",
                   (long long)dcp_value_as_int(dcp_state_value(st, "step")));
        sweep(steps);
        printf("%016llx\n", (unsigned long long)checksum());
    } else if (rc == DCP_OK) {
        sweep(steps);
        dcp_state_free(st);
        st = state(steps);
        rc = st ? dcp_save(ctx, st, argv[2], NULL) : DCP_ENOMEM;
    }
    if (rc != DCP_OK)
        fprintf(stderr, "ghost_cells: %s\n", dcp_errmsg(ctx));
    dcp_state_free(st);
    dcp_ctx_free(ctx);
    return rc == DCP_OK ? 0 : 1;
}
