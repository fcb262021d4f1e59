/*
 * The coordinator's global plan (src/plan.c) on layouts its fast paths
 * treat differently: boxes listed out of offset order (a 2-D mesh whose
 * ranks go column-major: radix sort), shapes too large for the radix key
 * (qsort), grids, bricks and irregular tilings in the tiling check (the
 * grid check and the pairwise sweep it falls back to), replicated boxes,
 * and ranks that agree with the first holder's bytes but for one field.
 * Also the box geometry helpers beneath them (strided box copies, element
 * counts, the shape text).
 */
#include <dcp/dcp.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meta.h"
#include "reshard.h"
#include "plan.h"
#include "test.h"

#define MAXR 8

static char buf[1];

/* The global plan of the ranks' states. */
static int plan(int nranks, dcp_state **st, struct pl_global *g,
                struct dcp_err *err)
{
    struct dcp_buf all = {0};
    size_t lens[MAXR], displs[MAXR];
    int r, rc = DCP_OK;
    memset(err, 0, sizeof(*err));
    for (r = 0; rc == DCP_OK && r < nranks; r++) {
        struct pl_local lp;
        rc = dcp__plan_local(st[r], &lp, err);
        if (rc != DCP_OK)
            break;
        displs[r] = all.len;
        rc = dcp__buf_put(&all, lp.blob.p, lp.blob.len);
        lens[r] = all.len - displs[r];
        dcp__plan_local_release(&lp);
    }
    if (rc == DCP_OK)
        rc = dcp__plan_global(all.p, lens, displs, nranks, g, err);
    dcp__buf_free(&all);
    return rc;
}

static void states(int n, dcp_state **st)
{
    int r;
    for (r = 0; r < n; r++)
        if (dcp_state_create(&st[r]) != DCP_OK)
            abort();
}

static void free_states(int n, dcp_state **st)
{
    int r;
    for (r = 0; r < n; r++)
        dcp_state_free(st[r]);
}

static int add(dcp_state *st, const char *key, int ndim, const int64_t *shape,
               int64_t o0, int64_t o1, int64_t s0, int64_t s1)
{
    int64_t off[DCP_MAX_NDIM] = {o0, o1}, size[DCP_MAX_NDIM] = {s0, s1};
    int d;
    for (d = 2; d < ndim; d++)
        size[d] = shape[d];
    return dcp_state_add_tensor(st, key, DCP_F32, ndim, shape, off, size, buf,
                                DCP_MEM_HOST);
}

/* The record rank r writes for its entry lent, or NULL. */
static const struct pl_rec *rec_of(const struct pl_global *g, int r,
                                   uint32_t lent, uint32_t lbox)
{
    size_t i;
    for (i = g->recbase[r]; i < g->recbase[r + 1]; i++)
        if (g->recs[i].lent == lent && g->recs[i].lbox == lbox)
            return &g->recs[i];
    return NULL;
}

TEST(mesh_out_of_order)
{
    /* A 3 x 2 grid of blocks; rank r holds block (r % 3, r / 3), so the
     * ranks list the boxes column by column. */
    static const int64_t shape[2] = {6, 4};
    dcp_state *st[6];
    struct pl_global g;
    struct dcp_err err;
    const struct md_entry *e;
    int r;
    size_t j;
    states(6, st);
    for (r = 0; r < 6; r++)
        ASSERT_OK(add(st[r], "w", 2, shape, 2 * (r % 3), 2 * (r / 3), 2, 2));
    ASSERT_OK(plan(6, st, &g, &err));
    ASSERT_EQ(g.md->n, 1);
    e = &g.md->e[0];
    ASSERT_EQ(e->nchunks, 6);
    for (j = 0; j < 6; j++) { /* by offsets: row block, then column */
        ASSERT_EQ(e->chunks[j].off[0], 2 * (int64_t)(j / 2));
        ASSERT_EQ(e->chunks[j].off[1], 2 * (int64_t)(j % 2));
    }
    for (r = 0; r < 6; r++) { /* each writes its own block */
        const struct pl_rec *rec = rec_of(&g, r, 0, 0);
        ASSERT(rec != NULL);
        ASSERT_EQ(g.recbase[r + 1] - g.recbase[r], 1);
        ASSERT_EQ(rec->j, 2 * (r % 3) + r / 3);
        ASSERT_EQ(g.bytes[r], 2 * 2 * 4 + 1);
    }
    dcp__plan_global_release(&g);
    free_states(6, st);
}

TEST(huge_shape_out_of_order)
{
    /* 2^31 x 2^31 x 1 ... x 1: the offsets' mixed-radix value would not
     * fit 64 bits, so the boxes are sorted by qsort. */
    int64_t shape[8] = {(int64_t)1 << 31, (int64_t)1 << 31, 1, 1, 1, 1, 1, 1};
    int64_t h = (int64_t)1 << 30;
    dcp_state *st[2];
    struct pl_global g;
    struct dcp_err err;
    const struct md_entry *e;
    int64_t o0[8] = {h}, o1[8] = {0},
            size[8] = {h, (int64_t)1 << 31, 1, 1, 1, 1, 1, 1};
    states(2, st);
    ASSERT_OK(dcp_state_add_tensor(st[0], "w", DCP_U8, 8, shape, o0, size, buf,
                                   DCP_MEM_HOST));
    ASSERT_OK(dcp_state_add_tensor(st[1], "w", DCP_U8, 8, shape, o1, size, buf,
                                   DCP_MEM_HOST));
    ASSERT_OK(plan(2, st, &g, &err));
    e = &g.md->e[0];
    ASSERT_EQ(e->nchunks, 2);
    ASSERT_EQ(e->chunks[0].off[0], 0);
    ASSERT_EQ(e->chunks[1].off[0], h);
    ASSERT_EQ(rec_of(&g, 0, 0, 0)->j, 1);
    ASSERT_EQ(rec_of(&g, 1, 0, 0)->j, 0);
    dcp__plan_global_release(&g);
    free_states(2, st);
}

/* Plans four boxes of a 4 x 4 tensor, one per rank: rc, and the message
 * must contain want. */
static int four(const int64_t (*b)[4], const char *want)
{
    static const int64_t shape[2] = {4, 4};
    dcp_state *st[4];
    struct pl_global g;
    struct dcp_err err;
    int r, rc;
    states(4, st);
    for (r = 0; r < 4; r++)
        if (add(st[r], "w", 2, shape, b[r][0], b[r][1], b[r][2], b[r][3]))
            abort();
    rc = plan(4, st, &g, &err);
    if (rc == DCP_OK)
        dcp__plan_global_release(&g);
    else if (!strstr(err.msg, want))
        rc = -1000;
    free_states(4, st);
    return rc;
}

TEST(tiling_layouts)
{
    static const int64_t
        grid[4][4] = {{0, 0, 2, 2}, {0, 2, 2, 2}, {2, 0, 2, 2}, {2, 2, 2, 2}},
        /* rows of bricks, the second row's offset */
        bricks[4][4] = {{0, 0, 2, 3}, {0, 3, 2, 1}, {2, 0, 2, 1}, {2, 1, 2, 3}},
        /* left half whole, right half cut in rows: not a
         * grid along either dimension */
        kd[4][4] = {{0, 0, 4, 2}, {0, 2, 1, 2}, {1, 2, 2, 2}, {3, 2, 1, 2}},
        grid_overlap[4][4] = {{0, 0, 2, 2},
                              {1, 2, 2, 2},
                              {2, 0, 2, 2},
                              {2, 2, 2, 2}},
        kd_overlap[4][4] = {{0, 0, 4, 2},
                            {0, 2, 2, 2},
                            {1, 2, 2, 2},
                            {3, 2, 1, 2}},
        gap[4][4] = {{0, 0, 2, 2}, {0, 2, 2, 2}, {2, 0, 2, 2}, {3, 2, 1, 2}};
    ASSERT_OK(four(grid, ""));
    ASSERT_OK(four(bricks, ""));
    ASSERT_OK(four(kd, ""));
    ASSERT_RC(four(grid_overlap, "'w': stored chunks overlap"), DCP_EPLAN);
    ASSERT_RC(four(kd_overlap, "'w': stored chunks overlap"), DCP_EPLAN);
    ASSERT_RC(four(gap, "cover 14 of 16"), DCP_EPLAN);
}

/* The tiling check straight on chunks: a grid with one chunk twice, the
 * same out of order. */
TEST(tiling_check_direct)
{
    int64_t ints[5][4] = {
        {0, 0, 2, 2}, {0, 2, 2, 2}, {2, 0, 2, 2}, {2, 2, 2, 2}, {2, 2, 2, 2}};
    static char key[] = "t";
    struct md_chunk ch[5];
    struct md_entry e;
    struct dcp_err err;
    size_t i;
    memset(&e, 0, sizeof(e));
    memset(ch, 0, sizeof(ch));
    e.key = key;
    e.is_tensor = 1;
    e.ndim = 2;
    e.shape[0] = e.shape[1] = 4;
    e.chunks = ch;
    for (i = 0; i < 5; i++) {
        ch[i].off = ints[i];
        ch[i].size = ints[i] + 2;
    }
    e.nchunks = 4;
    ASSERT_OK(dcp__meta_check_tiling(&e, &err));
    e.nchunks = 5;
    ASSERT_RC(dcp__meta_check_tiling(&e, &err), DCP_EFORMAT);
    ASSERT(strstr(err.msg, "overlap") != NULL);
    ch[0].off = ints[4]; /* duplicate first */
    ch[0].size = ints[4] + 2;
    ch[4].off = ints[0];
    ch[4].size = ints[0] + 2;
    ASSERT_RC(dcp__meta_check_tiling(&e, &err), DCP_EFORMAT);
    ASSERT(strstr(err.msg, "overlap") != NULL);
}

/* Element-by-element reference for dcp__box_copy (elements of 4 bytes). */
static void naive_copy(int nd, const int64_t *size, const uint32_t *src,
                       int64_t soff, const int64_t *ss, uint32_t *dst,
                       int64_t doff, const int64_t *ds)
{
    int64_t idx[DCP_MAX_NDIM] = {0};
    int d;
    if (dcp__box_numel(nd, size) == 0)
        return;
    for (;;) {
        int64_t so = soff, dof = doff;
        for (d = 0; d < nd; d++) {
            so += idx[d] * ss[d];
            dof += idx[d] * ds[d];
        }
        dst[dof] = src[so];
        for (d = nd - 1; d >= 0; d--) {
            if (++idx[d] < size[d])
                break;
            idx[d] = 0;
        }
        if (d < 0)
            return;
    }
}

/* Strided box copies, against the element-by-element loop: sub-boxes of
 * C-contiguous, transposed and broadcast (stride 0) layouts; and the run
 * count where rows are whole in both layouts (one run) or not. */
TEST(box_copy_layouts)
{
    enum { N = 4096 };
    static uint32_t src[N], got[N], want[N];
    int64_t shape[4] = {3, 4, 5, 6}, cs[4], ts[4], size[4], off[4], ds[4];
    struct box_runs r;
    int trial, d, n;
    unsigned seed = 7;
    for (d = 0; d < N; d++)
        src[d] = (uint32_t)d * 2654435761u;
    dcp__box_cstrides(4, shape, cs);
    ASSERT_EQ(cs[0], 120);
    ASSERT_EQ(cs[3], 1);
    ts[0] = 1; /* the same shape stored transposed */
    ts[1] = 3;
    ts[2] = 12;
    ts[3] = 60;
    for (trial = 0; trial < 400; trial++) {
        const int64_t *ss = trial % 3 == 0 ? cs : ts;
        int64_t bs[4] = {0, 0, 0, 0};
        for (d = 0; d < 4; d++) {
            seed = seed * 1103515245u + 12345u;
            off[d] = (int64_t)((seed >> 8) % (unsigned)shape[d]);
            seed = seed * 1103515245u + 12345u;
            size[d] =
                1 + (int64_t)((seed >> 8) % (unsigned)(shape[d] - off[d]));
        }
        if (trial % 3 == 2)
            ss = bs; /* every element from one */
        dcp__box_cstrides(4, size, ds);
        memset(got, 0, sizeof(got));
        memset(want, 0, sizeof(want));
        naive_copy(4, size, src, dcp__box_at(4, off, NULL, ss), ss, want, 5,
                   ds);
        dcp__box_copy(4, 4, size, src, dcp__box_at(4, off, NULL, ss), ss, got,
                      5, ds);
        ASSERT_MEM_EQ(got, want, sizeof(got));
    }
    /* Rows whole in both: the box [1..2] x all is one run of 2*4*5*6. */
    off[0] = 1;
    size[0] = 2;
    for (d = 1; d < 4; d++) {
        off[d] = 0;
        size[d] = shape[d];
    }
    dcp__box_runs_init(&r, 4, size, dcp__box_at(4, off, NULL, cs), cs, 0, cs);
    for (n = 0; dcp__box_runs_next(&r); n++) {
        ASSERT_EQ(r.src, 120);
        ASSERT_EQ(r.run, 240);
    }
    ASSERT_EQ(n, 1);
    /* A column of 6 of the last dim cut to 3: 2*4*5 runs of 3. */
    size[3] = 3;
    dcp__box_runs_init(&r, 4, size, 0, cs, 0, cs);
    for (n = 0; dcp__box_runs_next(&r); n++)
        ASSERT_EQ(r.run, 3);
    ASSERT_EQ(n, 40);
    /* Transposed source: runs of one element; empty box: no runs. */
    dcp__box_runs_init(&r, 4, size, 0, ts, 0, cs);
    for (n = 0; dcp__box_runs_next(&r); n++)
        ASSERT_EQ(r.run, 1);
    ASSERT_EQ(n, 120);
    size[2] = 0;
    dcp__box_runs_init(&r, 4, size, 0, cs, 0, cs);
    ASSERT_EQ(dcp__box_runs_next(&r), 0);
    /* 0-d: one run of one element. */
    dcp__box_runs_init(&r, 0, size, 9, cs, 2, cs);
    ASSERT_EQ(dcp__box_runs_next(&r), 1);
    ASSERT_EQ(r.src, 9);
    ASSERT_EQ(r.dst, 2);
    ASSERT_EQ(r.run, 1);
    ASSERT_EQ(dcp__box_runs_next(&r), 0);
}

/* The shape text, the element counts. */
TEST(shape_helpers)
{
    int64_t s[DCP_MAX_NDIM], big[2] = {INT64_MAX, 2}, neg[2] = {3, -1};
    char text[DCP_SHAPE_TEXT_MAX], small[5];
    int d;
    for (d = 0; d < DCP_MAX_NDIM; d++)
        s[d] = INT64_MIN;
    ASSERT_OK(dcp_shape_format(text, sizeof(text), DCP_MAX_NDIM, s));
    ASSERT_EQ(strlen(text), sizeof(text) - 1);
    s[0] = 4;
    s[1] = 1024;
    ASSERT_OK(dcp_shape_format(text, sizeof(text), 2, s));
    ASSERT_STR_EQ(text, "[4,1024]");
    ASSERT_OK(dcp_shape_format(text, sizeof(text), 0, NULL));
    ASSERT_STR_EQ(text, "[]");
    ASSERT_RC(dcp_shape_format(small, sizeof(small), 2, s), DCP_ELIMIT);
    ASSERT_STR_EQ(small, "[4,1");
    ASSERT_RC(dcp_shape_format(text, sizeof(text), DCP_MAX_NDIM + 1, s),
              DCP_EINVAL);
    ASSERT_STR_EQ(text, "");
    ASSERT_RC(dcp_shape_format(NULL, 4, 1, s), DCP_EINVAL);
    ASSERT_U64_EQ(dcp__box_numel(2, s), 4096);
    ASSERT_U64_EQ(dcp__box_numel(0, NULL), 1);
    ASSERT_EQ(dcp__shape_numel(2, s), 4096);
    ASSERT_EQ(dcp__shape_numel(2, big), -1);
    ASSERT_EQ(dcp__shape_numel(2, neg), -1);
}

TEST(replicated_spread)
{
    /* Three tensors held whole by all of three ranks: one record each,
     * one per rank. */
    static const int64_t shape[2] = {4, 4};
    static const char *keys[3] = {"a", "b", "c"};
    dcp_state *st[3];
    struct pl_global g;
    struct dcp_err err;
    int r, k;
    states(3, st);
    for (r = 0; r < 3; r++)
        for (k = 0; k < 3; k++)
            ASSERT_OK(add(st[r], keys[k], 2, shape, 0, 0, 4, 4));
    ASSERT_OK(plan(3, st, &g, &err));
    ASSERT_EQ(g.md->n, 3);
    for (k = 0; k < 3; k++)
        ASSERT_EQ(g.md->e[k].nchunks, 1);
    for (r = 0; r < 3; r++) {
        ASSERT_EQ(g.recbase[r + 1] - g.recbase[r], 1);
        ASSERT_EQ(g.bytes[r], 4 * 4 * 4 + 1);
    }
    dcp__plan_global_release(&g);
    free_states(3, st);
}

TEST(disagreement_after_agreement)
{
    /* Ranks 0 and 1 send the same bytes; rank 2 another dtype, then
     * another shape. */
    static const int64_t shape[2] = {3, 2}, other[2] = {4, 2};
    dcp_state *st[3];
    struct pl_global g;
    struct dcp_err err;
    int r;
    states(3, st);
    for (r = 0; r < 3; r++)
        ASSERT_OK(dcp_state_add_tensor(st[r], "w", r == 2 ? DCP_F64 : DCP_F32,
                                       2, shape, (const int64_t[]){r, 0},
                                       (const int64_t[]){1, 2}, buf,
                                       DCP_MEM_HOST));
    ASSERT_RC(plan(3, st, &g, &err), DCP_EPLAN);
    ASSERT_STR_EQ(err.msg,
                  "'w': ranks 0 and 2 disagree on the dtype (float32 vs "
                  "float64)");
    free_states(3, st);
    states(3, st);
    for (r = 0; r < 3; r++)
        ASSERT_OK(add(st[r], "w", 2, r == 2 ? other : shape, r, 0, 1, 2));
    ASSERT_RC(plan(3, st, &g, &err), DCP_EPLAN);
    ASSERT(strstr(err.msg, "ranks 0 and 2 disagree on the global shape") !=
           NULL);
    free_states(3, st);
}

TEST(key_on_some_ranks)
{
    static const int64_t shape[1] = {4};
    dcp_state *st[3];
    struct pl_global g;
    struct dcp_err err;
    int r;
    states(3, st);
    for (r = 0; r < 3; r++) {
        ASSERT_OK(add(st[r], "all", 1, shape, 0, 0, 4, 0));
        if (r < 2)
            ASSERT_OK(add(st[r], "some", 1, shape, 2 * r, 0, 1, 0));
    }
    ASSERT_RC(plan(3, st, &g, &err), DCP_EPLAN);
    ASSERT(strstr(err.msg, "key held by 2 of 3 ranks") != NULL);
    ASSERT(strstr(err.msg, "'some'") != NULL);
    free_states(3, st);
}

int main(void)
{
    RUN(mesh_out_of_order);
    RUN(huge_shape_out_of_order);
    RUN(tiling_layouts);
    RUN(tiling_check_direct);
    RUN(box_copy_layouts);
    RUN(shape_helpers);
    RUN(replicated_spread);
    RUN(disagreement_after_agreement);
    RUN(key_on_some_ranks);
    return TEST_SUMMARY();
}
