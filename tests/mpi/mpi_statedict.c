/*
 * dcp_statedict.h over MPI: every rank holds an uneven slice of one flat
 * parameter space (slices start and end inside rows and parameters), saves
 * it, and loads it back into other slices (each rank its neighbour's, and
 * all parameters on every rank), bit-exact; bad input fails the same way
 * on every rank before any buffer changes: a checkpoint of another model
 * (DCP_EKEY, the same message and report everywhere), ranks describing
 * different models (DCP_EINVAL). The same with a generic description
 * (RMSprop with momentum and centered, torch's flattened layout, a
 * frozen parameter): saved on uneven slices, loaded into the neighbours',
 * bit-exact, and ranks whose group values differ fail with DCP_EINVAL.
 *
 *   mpi_statedict DIR
 */
#include <dcp/dcp.h>
#include <dcp/dcp_mpi.h>
#include <dcp/dcp_statedict.h>

#include <sys/stat.h>

#include "mpitest.h"

static dcp_comm *comm;
static dcp_ctx *ctx;
static const char *root;

/* fc.weight [5,7], fc.bias [5], empty [0,4], conv [3,2,4], out.weight
 * [2,5]: 74. */
#define NUMEL 74
static const struct {
    const char *fqn;
    size_t group;
    int ndim;
    int64_t shape[3];
} net[] = {{"fc.weight", 0, 2, {5, 7}},
           {"fc.bias", 1, 1, {5}},
           {"empty", 1, 2, {0, 4}},
           {"conv", 0, 3, {3, 2, 4}},
           {"out.weight", 0, 2, {2, 5}}};

/* The model with nparam parameters; group 0's lr is lr. */
static dcp_sd *make_sd(size_t nparam, double lr)
{
    dcp_sd *sd = NULL;
    dcp_adamw hp;
    size_t i;
    CHECK(dcp_sd_create(&sd, DCP_F32) == 0);
    dcp_adamw_defaults(&hp);
    hp.lr = lr;
    CHECK(dcp_sd_add_group(sd, &hp) == 0);
    hp.weight_decay = 0;
    CHECK(dcp_sd_add_group(sd, &hp) == 0);
    for (i = 0; i < nparam; i++)
        CHECK(dcp_sd_add_param(sd, net[i].group, net[i].fqn, net[i].ndim,
                               net[i].shape) == 0);
    return sd;
}

/* Slice of rank r: uneven, cut at 74 * r^2 / n^2. */
static void slice(int r, int64_t *lo, int64_t *hi)
{
    int64_t n2 = (int64_t)mt_size * mt_size;
    *lo = NUMEL * r * r / n2;
    *hi = NUMEL * (r + 1) * (r + 1) / n2;
}

/* Element e of the flat space of kind k (0 params, 1 exp_avg, 2
 * exp_avg_sq). */
static float value(int k, int64_t e)
{
    return (float)k * 1000.0f + (float)e * 0.5f;
}

static void save_model(const char *dir, size_t nparam)
{
    float w[NUMEL], m[NUMEL], v[NUMEL];
    int64_t lo, hi, e;
    dcp_sd *sd = make_sd(nparam, 1e-3);
    dcp_state *st = NULL;
    slice(mt_rank, &lo, &hi);
    for (e = lo; e < hi; e++) {
        w[e - lo] = value(0, e);
        m[e - lo] = value(1, e);
        v[e - lo] = value(2, e);
    }
    /* Fewer parameters: the slice may reach past the flat space. */
    if (hi > dcp_sd_numel(sd))
        hi = dcp_sd_numel(sd);
    if (lo > hi)
        lo = hi;
    CHECK(dcp_state_create(&st) == 0);
    CHECK(dcp_sd_bind_model(sd, lo, hi, w) == 0);
    CHECK(dcp_sd_bind_optim(sd, lo, hi, m, v) == 0);
    CHECK(dcp_sd_set_step(sd, 12) == 0);
    CHECK(dcp_sd_add_to_state(sd, st, "model", "optim") == 0);
    CHECK_OK(ctx, dcp_save(ctx, st, dir, NULL));
    dcp_state_free(st);
    dcp_sd_free(sd);
}

static void test_save_and_reslice(void)
{
    char dir[512];
    float w[NUMEL], m[NUMEL], v[NUMEL];
    int64_t lo, hi, e;
    dcp_sd *sd = make_sd(5, 1e-3);
    dcp_state *st = NULL;
    snprintf(dir, sizeof(dir), "%s/sd", root);
    save_model(dir, 5);
    /* Every parameter, and the neighbour's slice of the moments. */
    slice((mt_rank + 1) % mt_size, &lo, &hi);
    memset(w, 0, sizeof(w));
    memset(m, 0, sizeof(m));
    memset(v, 0, sizeof(v));
    CHECK(dcp_state_create(&st) == 0);
    CHECK(dcp_sd_bind_model(sd, 0, NUMEL, w) == 0);
    CHECK(dcp_sd_bind_optim(sd, lo, hi, m, v) == 0);
    CHECK(dcp_sd_add_to_state(sd, st, "model", "optim") == 0);
    CHECK_OK(ctx, dcp_sd_load(ctx, sd, st, dir, NULL, 0));
    for (e = 0; e < NUMEL; e++)
        CHECK(w[e] == value(0, e));
    for (e = lo; e < hi; e++) {
        CHECK(m[e - lo] == value(1, e));
        CHECK(v[e - lo] == value(2, e));
    }
    CHECK(dcp_sd_step(sd) == 12);
    dcp_state_free(st);
    dcp_sd_free(sd);
}

static void test_other_model(void)
{
    char dir[512];
    float w[NUMEL], m[NUMEL], v[NUMEL];
    const char *const *keys = NULL;
    int64_t lo, hi;
    dcp_sd *sd = make_sd(5, 1e-3);
    dcp_state *st = NULL;
    size_t nm;
    int rc, i;
    snprintf(dir, sizeof(dir), "%s/three", root);
    save_model(dir, 4); /* without out.weight */
    slice(mt_rank, &lo, &hi);
    memset(w, 0x5a, sizeof(w));
    memset(m, 0x5a, sizeof(m));
    memset(v, 0x5a, sizeof(v));
    CHECK(dcp_state_create(&st) == 0);
    CHECK(dcp_sd_bind_model(sd, 0, NUMEL, w) == 0);
    CHECK(dcp_sd_bind_optim(sd, lo, hi, m, v) == 0);
    CHECK(dcp_sd_add_to_state(sd, st, "model", "optim") == 0);
    rc = dcp_sd_load(ctx, sd, st, dir, NULL, 0);
    CHECK_RC(ctx, rc, DCP_EKEY);
    CHECK(mt_same(rc));
    CHECK_MSG(ctx, "4 missing keys ('model.out.weight', "
                   "'optim.state.out.weight.step'");
    CHECK(mt_same_str(dcp_errmsg(ctx)));
    nm = dcp_load_report(ctx, 0, &keys);
    CHECK(nm == 4 && mt_same((int)nm));
    CHECK(keys && strcmp(keys[0], "model.out.weight") == 0);
    CHECK(dcp_load_report(ctx, 1, NULL) == 0);
    for (i = 0; i < NUMEL; i++)
        CHECK(((unsigned char *)w)[i] == 0x5a);
    CHECK(dcp_sd_step(sd) == 0);
    dcp_state_free(st);
    dcp_sd_free(sd);
}

static void test_ranks_disagree(void)
{
    char dir[512];
    float w[NUMEL];
    dcp_sd *sd = make_sd(5, mt_rank == mt_size - 1 ? 2e-3 : 1e-3);
    dcp_state *st = NULL;
    dcp_load_options partial = {sizeof(partial), DCP_LOAD_PARTIAL, NULL};
    int rc;
    snprintf(dir, sizeof(dir), "%s/sd", root);
    CHECK(dcp_state_create(&st) == 0);
    CHECK(dcp_sd_bind_model(sd, 0, NUMEL, w) == 0);
    CHECK(dcp_sd_add_to_state(sd, st, "model", NULL) == 0);
    /* Model only: the optimizer's keys are left out (partial). */
    rc = dcp_sd_load(ctx, sd, st, dir, &partial, 0);
    CHECK_RC(ctx, rc, mt_size > 1 ? DCP_EINVAL : DCP_OK);
    CHECK(mt_same(rc));
    dcp_state_free(st);
    dcp_sd_free(sd);
}

/* RMSprop (momentum, centered) in the flat layout, fc.bias frozen; group
 * 0's lr is lr. */
static dcp_sd *make_generic(double lr)
{
    dcp_sd_optim l;
    dcp_value *g[2];
    dcp_sd *sd = NULL;
    size_t i;
    for (i = 0; i < 2; i++)
        CHECK(dcp_sd_optim_preset(DCP_OPTIM_RMSPROP,
                                  DCP_OPTIM_MOMENTUM | DCP_OPTIM_CENTERED, &l,
                                  &g[i]) == 0);
    CHECK(dcp_value_dict_set(g[0], "lr", dcp_value_float(lr)) == 0);
    l.flags = DCP_SD_FLAT;
    CHECK(dcp_sd_create_optim(&sd, DCP_F32, &l) == 0);
    for (i = 0; i < 2; i++) {
        CHECK(dcp_sd_add_group_values(sd, g[i]) == 0);
        dcp_value_free(g[i]);
    }
    for (i = 0; i < 5; i++)
        CHECK(dcp_sd_add_param(sd, net[i].group, net[i].fqn, net[i].ndim,
                               net[i].shape) == 0);
    CHECK(dcp_sd_set_param_frozen(sd, 1, 1) == 0);
    return sd;
}

/* fc.bias, frozen, is [35, 40) of the flat space. */
static int frozen_elem(int64_t e)
{
    return e >= 35 && e < 40;
}

static void test_generic_reslice(void)
{
    char dir[512];
    float w[NUMEL], t[3][NUMEL];
    void *bufs[3] = {t[0], t[1], t[2]};
    int64_t lo, hi, e;
    dcp_sd *sd = make_generic(1e-2);
    dcp_state *st = NULL;
    int k;
    snprintf(dir, sizeof(dir), "%s/generic", root);
    slice(mt_rank, &lo, &hi);
    for (e = lo; e < hi; e++)
        for (k = 0; k < 3; k++)
            t[k][e - lo] = value(k + 1, e);
    for (e = 0; e < NUMEL; e++)
        w[e] = value(0, e);
    CHECK(dcp_state_create(&st) == 0);
    CHECK(dcp_sd_bind_model(sd, lo, hi, w + lo) == 0);
    CHECK(dcp_sd_bind_state(sd, lo, hi, bufs) == 0);
    CHECK(dcp_sd_set_step(sd, 9) == 0);
    CHECK(dcp_sd_add_to_state(sd, st, "model", "optim") == 0);
    CHECK_OK(ctx, dcp_save(ctx, st, dir, NULL));
    dcp_state_free(st);
    dcp_sd_free(sd);
    /* Every parameter, and the neighbour's slice of the state. */
    sd = make_generic(1e-2);
    slice((mt_rank + 1) % mt_size, &lo, &hi);
    memset(w, 0, sizeof(w));
    memset(t, 0x5a, sizeof(t));
    CHECK(dcp_state_create(&st) == 0);
    CHECK(dcp_sd_bind_model(sd, 0, NUMEL, w) == 0);
    CHECK(dcp_sd_bind_state(sd, lo, hi, bufs) == 0);
    CHECK(dcp_sd_add_to_state(sd, st, "model", "optim") == 0);
    CHECK_OK(ctx, dcp_sd_load(ctx, sd, st, dir, NULL, 0));
    for (e = 0; e < NUMEL; e++)
        CHECK(w[e] == value(0, e));
    for (e = lo; e < hi; e++)
        for (k = 0; k < 3; k++)
            CHECK(frozen_elem(e) ? ((unsigned char *)&t[k][e - lo])[0] == 0x5a
                                 : t[k][e - lo] == value(k + 1, e));
    CHECK(dcp_sd_step(sd) == 9);
    dcp_state_free(st);
    dcp_sd_free(sd);
}

static void test_generic_ranks_disagree(void)
{
    char dir[512];
    float w[NUMEL];
    dcp_sd *sd = make_generic(mt_rank == mt_size - 1 ? 2e-2 : 1e-2);
    dcp_state *st = NULL;
    dcp_load_options partial = {sizeof(partial), DCP_LOAD_PARTIAL, NULL};
    int rc;
    snprintf(dir, sizeof(dir), "%s/generic", root);
    CHECK(dcp_state_create(&st) == 0);
    CHECK(dcp_sd_bind_model(sd, 0, NUMEL, w) == 0);
    CHECK(dcp_sd_add_to_state(sd, st, "model", NULL) == 0);
    rc = dcp_sd_load(ctx, sd, st, dir, &partial, 0);
    CHECK_RC(ctx, rc, mt_size > 1 ? DCP_EINVAL : DCP_OK);
    CHECK(mt_same(rc));
    dcp_state_free(st);
    dcp_sd_free(sd);
}

int main(int argc, char **argv)
{
    mt_init(&argc, &argv);
    if (argc != 2) {
        if (mt_rank == 0)
            fprintf(stderr, "usage: mpi_statedict DIR\n");
        MPI_Finalize();
        return 2;
    }
    root = argv[1];
    if (mt_rank == 0)
        (void)mkdir(root, 0755);
    MPI_Barrier(MPI_COMM_WORLD);
    if (dcp_comm_mpi(&comm, MPI_COMM_WORLD) != 0 ||
        dcp_ctx_create(&ctx, comm, NULL) != 0)
        MPI_Abort(MPI_COMM_WORLD, 2);
    RUN(save_and_reslice);
    RUN(other_model);
    RUN(ranks_disagree);
    RUN(generic_reslice);
    RUN(generic_ranks_disagree);
    dcp_ctx_free(ctx);
    dcp_comm_free(comm);
    return mt_finish();
}
