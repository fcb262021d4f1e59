/*
 * uneven_sim: an MPI particle simulation that checkpoints with dcp and
 * restarts on another number of ranks, bit-exact.
 *
 *   mpiexec -n 3 uneven_sim save sim-ckpt 25    (25 steps, then save)
 *   mpiexec -n 2 uneven_sim load sim-ckpt       (restore, check, go on)
 *
 * What a newcomer's simulation holds, and how each piece is saved:
 *  - particles, split unevenly over the ranks (some hold none): one global
 *    1-D array per field ("particles.x", "particles.v", "particles.id"),
 *    each rank's part placed by dcp_uneven_1d (offset = the sum of the
 *    lower ranks' counts, global length = the sum of all). A restart on M
 *    ranks picks its own split and loads its part: dcp reshards.
 *  - the clock (step, time): a Stateful object (dcp_state_add_stateful),
 *    whose state_dict asks dcp_state_op whether it serves a save or a load;
 *  - each rank's random generator: per-rank keys (dcp_state_push_rank,
 *    "rank<r>.rng"), since a key shared by all ranks would keep one rank's
 *    copy. On M < N ranks the keys of ranks >= M are not asked for: the
 *    load passes DCP_LOAD_ALLOW_UNEXPECTED (missing keys still fail); a
 *    rank >= N starts a fresh generator.
 * The load recomputes every particle from its id and the restored step
 * and compares bits; it exits 1 on any difference.
 */
#include <dcp/dcp.h>
#include <dcp/dcp_mpi.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DT 0.01

/* The clock: a Stateful object. */
struct clock {
    int64_t step;
    double time;
    int last_op; /* what dcp_state_op said in the last state_dict */
};

static int clock_state_dict(void *ud, dcp_state *st)
{
    struct clock *c = ud;
    int rc;
    c->last_op = dcp_state_op(st);
    /* For a load these are templates that the load replaces. */
    rc = dcp_state_add_value(st, "step", dcp_value_int(c->step));
    if (rc == DCP_OK)
        rc = dcp_state_add_value(st, "time", dcp_value_float(c->time));
    return rc;
}

static int clock_load_state_dict(void *ud, const dcp_state *st)
{
    struct clock *c = ud;
    const dcp_value *step = dcp_state_value(st, "step");
    const dcp_value *time = dcp_state_value(st, "time");
    if (dcp_value_type_of(step) != DCP_VALUE_INT ||
        dcp_value_type_of(time) != DCP_VALUE_FLOAT)
        return DCP_EMISMATCH;
    c->step = dcp_value_as_int(step);
    c->time = dcp_value_as_float(time);
    return 0;
}

static const dcp_stateful_ops clock_ops = {
    DCP_STATEFUL_OPS_VERSION, clock_state_dict, clock_load_state_dict};

/* Particle g at step 0, and one step of its motion. */
static void particle_init(int64_t g, double *x, float *v)
{
    *x = (double)g * 0.25;
    *v = (float)(g % 7) - 3.0f + 0.125f * (float)(g % 3);
}

static void particle_step(double *x, float *v)
{
    *x += (double)*v * DT;
    if (*x > 100.0 || *x < -100.0)
        *v = -*v;
}

/* A rank's generator (xorshift64*), seeded by its rank. */
static uint64_t rng_seed(int rank)
{
    return 0x9e3779b97f4a7c15ULL * (uint64_t)(rank + 1);
}

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 0x2545f4914f6cdd1dULL;
}

struct sim {
    int rank, size;
    int64_t n, off, total; /* this rank's particles, placed globally */
    double *x;
    float *v;
    int64_t *id;
    uint64_t rng;
    struct clock clock;
};

/* Adds everything that is saved or loaded to st (the generator when
 * with_rng). */
static int describe(struct sim *s, dcp_state *st, int with_rng)
{
    int rc = dcp_state_add_stateful(st, "clock", &clock_ops, &s->clock);
    if (rc == DCP_OK)
        rc = dcp_state_push(st, "particles");
    if (rc == DCP_OK)
        rc = dcp_state_add_tensor(st, "x", DCP_F64, 1, &s->total, &s->off,
                                  &s->n, s->x, DCP_MEM_HOST);
    if (rc == DCP_OK)
        rc = dcp_state_add_tensor(st, "v", DCP_F32, 1, &s->total, &s->off,
                                  &s->n, s->v, DCP_MEM_HOST);
    if (rc == DCP_OK)
        rc = dcp_state_add_tensor(st, "id", DCP_I64, 1, &s->total, &s->off,
                                  &s->n, s->id, DCP_MEM_HOST);
    if (rc == DCP_OK)
        rc = dcp_state_pop(st);
    if (rc != DCP_OK || !with_rng)
        return rc;
    rc = dcp_state_push_rank(st, s->rank);
    if (rc == DCP_OK) {
        int64_t one = 1;
        rc = dcp_state_add_tensor(st, "rng", DCP_I64, 1, &one, NULL, NULL,
                                  &s->rng, DCP_MEM_HOST);
    }
    if (rc == DCP_OK)
        rc = dcp_state_pop(st);
    return rc;
}

static int alloc_particles(struct sim *s)
{
    size_t n = (size_t)s->n + 1;
    s->x = calloc(n, sizeof(*s->x));
    s->v = calloc(n, sizeof(*s->v));
    s->id = calloc(n, sizeof(*s->id));
    return s->x && s->v && s->id ? 0 : -1;
}

static int fail(dcp_ctx *ctx, const char *what, int rc)
{
    fprintf(stderr, "uneven_sim: %s: %s (%s)\n", what, dcp_strerror(rc),
            ctx ? dcp_errmsg(ctx) : "");
    return 1;
}

static int run_save(struct sim *s, dcp_comm *comm, dcp_ctx *ctx,
                    const char *dir, int64_t steps)
{
    dcp_state *st = NULL;
    int64_t i, k;
    int rc;
    /* Uneven on purpose: rank 1 holds no particle. */
    s->n = s->rank == 1 ? 0 : 40 + 13 * (int64_t)s->rank;
    rc = dcp_uneven_1d(comm, s->n, &s->off, &s->total);
    if (rc != DCP_OK)
        return fail(ctx, "dcp_uneven_1d", rc);
    if (alloc_particles(s))
        return fail(ctx, "particles", DCP_ENOMEM);
    s->rng = rng_seed(s->rank);
    for (i = 0; i < s->n; i++) {
        s->id[i] = s->off + i;
        particle_init(s->id[i], &s->x[i], &s->v[i]);
    }
    for (k = 0; k < steps; k++) {
        for (i = 0; i < s->n; i++)
            particle_step(&s->x[i], &s->v[i]);
        (void)rng_next(&s->rng);
        s->clock.step++;
        s->clock.time += DT;
    }
    rc = dcp_state_create(&st);
    if (rc == DCP_OK)
        rc = describe(s, st, 1);
    if (rc == DCP_OK)
        rc = dcp_save(ctx, st, dir, NULL);
    dcp_state_free(st);
    if (rc != DCP_OK)
        return fail(ctx, "save", rc);
    if (s->clock.last_op != DCP_IO_SAVE)
        return fail(ctx, "clock not told it serves a save", DCP_EINVAL);
    if (s->rank == 0)
        printf("saved step %" PRId64 ": %" PRId64 " particles on %d ranks\n",
               s->clock.step, s->total, s->size);
    return 0;
}

/* Every particle this rank restored, recomputed from its id. */
static int check_particles(const struct sim *s)
{
    int64_t i, k;
    for (i = 0; i < s->n; i++) {
        double x;
        float v;
        if (s->id[i] != s->off + i)
            return -1;
        particle_init(s->id[i], &x, &v);
        for (k = 0; k < s->clock.step; k++)
            particle_step(&x, &v);
        if (memcmp(&x, &s->x[i], sizeof(x)) || memcmp(&v, &s->v[i], sizeof(v)))
            return -1;
    }
    return 0;
}

static int run_load(struct sim *s, dcp_comm *comm, dcp_ctx *ctx,
                    const char *dir)
{
    dcp_load_options lo = {sizeof(lo), DCP_LOAD_ALLOW_UNEXPECTED, NULL};
    dcp_metadata *md = NULL;
    dcp_state *st = NULL;
    dcp_entry_info e;
    uint64_t want_rng;
    int64_t k, total = 0;
    char rngkey[32];
    long idx;
    int rc, bad, anybad = 0, has_rng = 0;
    /* The saved particle count, and whether the save had a rank of ours
     * (one with a generator to restore), from the metadata. */
    (void)snprintf(rngkey, sizeof(rngkey), "rank%d.rng", s->rank);
    rc = dcp_metadata_open(ctx, dir, &md);
    idx = rc == DCP_OK ? dcp_metadata_find(md, "particles.x") : -1;
    if (idx >= 0 && dcp_metadata_entry(md, (size_t)idx, &e) == DCP_OK)
        total = e.shape[0];
    if (rc == DCP_OK)
        has_rng = dcp_metadata_find(md, rngkey) >= 0;
    dcp_metadata_free(md);
    if (rc != DCP_OK || idx < 0)
        return fail(ctx, "metadata", rc != DCP_OK ? rc : DCP_EKEY);
    /* A split of our own: the first rank takes a double share. */
    s->n = total / (s->size + 1) * (s->rank == 0 ? 2 : 1);
    if (s->rank == s->size - 1)
        s->n = total - total / (s->size + 1) * s->size;
    rc = dcp_uneven_1d(comm, s->n, &s->off, &s->total);
    if (rc != DCP_OK || s->total != total)
        return fail(ctx, "dcp_uneven_1d", rc != DCP_OK ? rc : DCP_EMISMATCH);
    if (alloc_particles(s))
        return fail(ctx, "particles", DCP_ENOMEM);
    /* A rank the save did not have starts a fresh generator. */
    s->rng = has_rng ? 0 : rng_seed(s->rank);
    rc = dcp_state_create(&st);
    if (rc == DCP_OK)
        rc = describe(s, st, has_rng);
    if (rc == DCP_OK)
        rc = dcp_load(ctx, st, dir, &lo);
    dcp_state_free(st);
    if (rc != DCP_OK)
        return fail(ctx, "load", rc);
    bad = s->clock.last_op != DCP_IO_LOAD || check_particles(s) != 0;
    if (has_rng) {
        want_rng = rng_seed(s->rank);
        for (k = 0; k < s->clock.step; k++)
            (void)rng_next(&want_rng);
        bad |= s->rng != want_rng;
    }
    MPI_Allreduce(&bad, &anybad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (anybad) {
        if (s->rank == 0)
            fprintf(stderr, "uneven_sim: restored state differs\n");
        return 1;
    }
    if (s->rank == 0)
        printf("restored step %" PRId64 ": %" PRId64
               " particles on %d ranks, bit-exact (%zu unexpected keys "
               "ignored)\n",
               s->clock.step, s->total, s->size, dcp_load_report(ctx, 1, NULL));
    return 0;
}

int main(int argc, char **argv)
{
    struct sim s;
    dcp_comm *comm = NULL;
    dcp_ctx *ctx = NULL;
    int rc, load;
    memset(&s, 0, sizeof(s));
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &s.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &s.size);
    load = argc == 3 && strcmp(argv[1], "load") == 0;
    if (!load && !(argc == 4 && strcmp(argv[1], "save") == 0)) {
        if (s.rank == 0)
            fprintf(stderr, "usage: uneven_sim save DIR STEPS\n"
                            "       uneven_sim load DIR\n");
        MPI_Finalize();
        return 2;
    }
    rc = dcp_comm_mpi(&comm, MPI_COMM_WORLD);
    if (rc == DCP_OK)
        rc = dcp_ctx_create(&ctx, comm, NULL);
    if (rc != DCP_OK)
        rc = fail(ctx, "setup", rc);
    else if (load)
        rc = run_load(&s, comm, ctx, argv[2]);
    else
        rc = run_save(&s, comm, ctx, argv[2], atoll(argv[3]));
    free(s.x);
    free(s.v);
    free(s.id);
    dcp_ctx_free(ctx);
    dcp_comm_free(comm);
    MPI_Finalize();
    return rc;
}
