/*
 * The .metadata fast path (src/meta_fast.c) against the general decoder:
 * on what dcp__meta_encode writes (every int width, ndim 0..5, values,
 * paths, batches past 1000 items, memo indices past 255) both decode to
 * the same dcp_metadata; on 5,000 mutations of it (DCP_META_MUTATIONS), the fast path never
 * accepts what the general decoder refuses and never decodes differently;
 * other writers' files (torch's) go to the general decoder.
 */
#include <dcp/dcp.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meta.h"
#include "test.h"
#include "util.h"

static char *xstrdup(const char *s)
{
    char *p = dcp__strdup(s);
    if (!p)
        abort();
    return p;
}

/* Adds a tensor entry with chunks from (off, size) pairs, all in file f. */
static struct md_entry *add_tensor(struct dcp_metadata *md, const char *key,
                                   dcp_dtype dt, int ndim,
                                   const int64_t *shape, size_t nchunks,
                                   const int64_t *boxes, uint32_t file)
{
    struct md_entry *e = &md->e[md->n++];
    size_t j;
    int slot = ndim ? ndim : 1;
    memset(e, 0, sizeof(*e));
    e->key = xstrdup(key);
    e->is_tensor = 1;
    e->dtype = dt;
    e->ndim = ndim;
    if (ndim) /* shape may be NULL for 0-d */
        memcpy(e->shape, shape, (size_t)ndim * sizeof(*shape));
    e->chunks = dcp__calloc(nchunks ? nchunks : 1, sizeof(*e->chunks));
    e->nchunks = nchunks;
    for (j = 0; j < nchunks; j++) {
        struct md_chunk *c = &e->chunks[j];
        c->off = dcp__calloc(2 * (size_t)slot, sizeof(int64_t));
        c->size = c->off + slot;
        if (ndim) {
            memcpy(c->off, boxes + 2 * (size_t)ndim * j,
                   (size_t)ndim * sizeof(int64_t));
            memcpy(c->size, boxes + 2 * (size_t)ndim * j + ndim,
                   (size_t)ndim * sizeof(int64_t));
        }
        c->file = file;
        c->offset = 64 + 4096 * (uint64_t)j;
        c->length = 4096;
    }
    return e;
}

static void add_value(struct dcp_metadata *md, const char *key)
{
    struct md_entry *e = &md->e[md->n++];
    memset(e, 0, sizeof(*e));
    e->key = xstrdup(key);
    e->chunks = dcp__calloc(1, sizeof(*e->chunks));
    e->nchunks = 1;
    e->chunks[0].file = 0;
    e->chunks[0].offset = 7;
    e->chunks[0].length = 300;
}

static void set_path(struct md_entry *e, int n, ...)
{
    va_list ap;
    int i;
    e->path = dcp__calloc((size_t)n, sizeof(*e->path));
    e->npath = (size_t)n;
    va_start(ap, n);
    for (i = 0; i < n; i++) {
        const char *s = va_arg(ap, const char *);
        if (s[0] == '#')
            e->path[i].i = atoll(s + 1);
        else
            e->path[i].s = xstrdup(s);
    }
    va_end(ap);
}

/* A metadata exercising the encoder's every branch; nbig extra entries
 * and a tensor of nrows one-row chunks push batches and memo indices. */
static struct dcp_metadata *make_md(size_t nbig, size_t nrows)
{
    struct dcp_metadata *md = dcp__calloc(1, sizeof(*md));
    static const int64_t s2[] = {10, 7}, b2[] = {0, 0, 4, 7, 4, 0, 3, 7,
                                                 7, 0, 3, 7};
    static const int64_t s5[] = {2, 1, 3, 1, 2},
                         b5[] = {0, 0, 0, 0, 0, 1, 1, 3, 1, 2,
                                 1, 0, 0, 0, 0, 1, 1, 3, 1, 2};
    static const int64_t s4[] = {4, 4, 4, 4};
    static const int64_t s1[] = {3000000000LL}, b1[] = {0, 70000, 70000,
                                                        2999930000LL};
    static const int64_t s0[] = {0}, b0[] = {0, 0};
    int64_t b4[16 * 8], *rows;
    struct md_entry *e;
    size_t i, k = 0;
    char key[64];
    md->e = dcp__calloc(16 + nbig, sizeof(*md->e));
    md->nfiles = 3;
    md->files = dcp__calloc(3, sizeof(*md->files));
    md->files[0] = xstrdup("__0_0.distcp");
    md->files[1] = xstrdup("__1_0.distcp");
    md->files[2] = xstrdup("f\xc3\xa9 2.distcp");
    md->version = xstrdup("1.0.0");
    md->save_id = xstrdup("save-1");
    md->checkpoint_id = xstrdup("/ckpt/step-7");
    e = add_tensor(md, "a.w", DCP_F32, 2, s2, 3, b2, 1);
    set_path(e, 2, "a", "w");
    e->requires_grad = 1;
    add_tensor(md, "b", DCP_BF16, 0, NULL, 1, NULL, 0);
    for (i = 0; i < 16; i++) { /* 2x2x2x2 blocks of a 4-d tensor */
        int d;
        for (d = 0; d < 4; d++) {
            b4[8 * i + d] = (int64_t)((i >> d) & 1) * 2;
            b4[8 * i + 4 + d] = 2;
        }
    }
    add_tensor(md, "blocks", DCP_I8, 4, s4, 16, b4, 2);
    e = add_tensor(md, "big", DCP_F32, 1, s1, 2, b1, 1);
    e->chunks[1].offset = (uint64_t)1 << 40;
    e->chunks[1].length = 3000000000ULL * 4;
    add_tensor(md, "c", DCP_I64, 5, s5, 2, b5, 0);
    add_value(md, "d");
    add_tensor(md, "empty", DCP_F8_E4M3FN, 1, s0, 1, b0, 0);
    rows = dcp__calloc(2 * (nrows ? nrows : 1), sizeof(*rows));
    for (i = 0; i < nrows; i++) {
        rows[2 * i] = (int64_t)i;
        rows[2 * i + 1] = 1;
    }
    {
        int64_t sr[1];
        sr[0] = (int64_t)nrows;
        add_tensor(md, "rows", DCP_U8, 1, sr, nrows, rows, 2);
    }
    dcp__free(rows);
    add_value(md, "x.0.y.1.z");
    set_path(&md->e[md->n - 1], 5, "x", "#0", "y", "#1", "z");
    for (i = 0; i < nbig; i++, k++) {
        (void)snprintf(key, sizeof(key), "z.%05zu", i);
        if (i % 3)
            add_value(md, key);
        else
            add_tensor(md, key, DCP_BOOL, 1, (const int64_t[]){2}, 1,
                       (const int64_t[]){0, 2}, (uint32_t)(i % 3));
    }
    return md;
}

/* "" when equal, else what differs. */
static const char *md_diff(const struct dcp_metadata *a,
                           const struct dcp_metadata *b)
{
    static char why[256];
    size_t i, j, d;
#define DIFF(...)                                                              \
    do {                                                                       \
        (void)snprintf(why, sizeof(why), __VA_ARGS__);                         \
        return why;                                                            \
    } while (0)
    if (a->n != b->n)
        DIFF("n %zu vs %zu", a->n, b->n);
    if (strcmp(a->version, b->version) != 0)
        DIFF("version");
    if (!a->save_id != !b->save_id ||
        (a->save_id && strcmp(a->save_id, b->save_id) != 0))
        DIFF("save_id");
    if (!a->checkpoint_id != !b->checkpoint_id ||
        (a->checkpoint_id && strcmp(a->checkpoint_id, b->checkpoint_id)))
        DIFF("checkpoint_id");
    for (i = 0; i < a->n; i++) {
        const struct md_entry *x = &a->e[i], *y = &b->e[i];
        if (strcmp(x->key, y->key) != 0 || x->is_tensor != y->is_tensor ||
            x->dtype != y->dtype || x->ndim != y->ndim ||
            x->requires_grad != y->requires_grad ||
            x->nchunks != y->nchunks || x->npath != y->npath)
            DIFF("entry %zu ('%s' vs '%s')", i, x->key, y->key);
        for (d = 0; d < (size_t)x->ndim; d++)
            if (x->shape[d] != y->shape[d])
                DIFF("'%s' shape", x->key);
        for (j = 0; j < x->npath; j++)
            if (!x->path[j].s != !y->path[j].s ||
                (x->path[j].s ? strcmp(x->path[j].s, y->path[j].s) != 0
                              : x->path[j].i != y->path[j].i))
                DIFF("'%s' path %zu", x->key, j);
        for (j = 0; j < x->nchunks; j++) {
            const struct md_chunk *c = &x->chunks[j], *e = &y->chunks[j];
            if (c->offset != e->offset || c->length != e->length ||
                c->has_storage != e->has_storage ||
                strcmp(a->files[c->file], b->files[e->file]) != 0)
                DIFF("'%s' chunk %zu storage", x->key, j);
            for (d = 0; d < (size_t)x->ndim; d++)
                if (c->off[d] != e->off[d] || c->size[d] != e->size[d])
                    DIFF("'%s' chunk %zu box", x->key, j);
        }
    }
    return "";
#undef DIFF
}

static int encode(struct dcp_metadata *md, struct dcp_buf *out)
{
    return dcp__meta_encode(md, out);
}

static void check_same(const uint8_t *p, size_t len, int want_fast,
                       int *failed)
{
    struct dcp_metadata *f = NULL, *g = NULL;
    struct dcp_err err;
    int rf, rg;
    memset(&err, 0, sizeof(err));
    rf = dcp__meta_decode_fast(p, len, &f);
    rg = dcp__meta_decode_general(p, len, &g, &err);
    if (want_fast >= 0 && (rf == DCP_OK) != want_fast) {
        fprintf(stderr, "fast path: got %d, want %s\n", rf,
                want_fast ? "accept" : "decline");
        *failed = 1;
    }
    if (rf == DCP_OK && rg != DCP_OK) {
        fprintf(stderr, "fast accepted what general refuses: %s\n", err.msg);
        *failed = 1;
    }
    if (rf == DCP_OK && rg == DCP_OK && *md_diff(f, g)) {
        fprintf(stderr, "decoded differently: %s\n", md_diff(f, g));
        *failed = 1;
    }
    if (rf != DCP_OK && rf != META_FAST_DECLINE) {
        fprintf(stderr, "fast path returned %d\n", rf);
        *failed = 1;
    }
    dcp__meta_free(f);
    dcp__meta_free(g);
}

TEST(same_as_general)
{
    struct dcp_metadata *md = make_md(0, 3), *back = NULL;
    struct dcp_buf out = {0};
    int failed = 0;
    ASSERT_OK(encode(md, &out));
    check_same(out.p, out.len, 1, &failed);
    ASSERT_EQ(failed, 0);
    /* And through the public entry point, against what was encoded. */
    {
        struct dcp_err err;
        memset(&err, 0, sizeof(err));
        ASSERT_OK(dcp__meta_decode(out.p, out.len, &back, &err));
        ASSERT_OK(dcp__meta_sort(md, &err));
        /* decode sets has_storage, and a flat path where none was */
        {
            size_t i, j;
            for (i = 0; i < md->n; i++) {
                for (j = 0; j < md->e[i].nchunks; j++)
                    md->e[i].chunks[j].has_storage = 1;
                if (!md->e[i].npath) /* written as a flat path */
                    set_path(&md->e[i], 1, md->e[i].key);
            }
        }
        ASSERT_STR_EQ(md_diff(md, back), "");
    }
    dcp__meta_free(back);
    dcp__meta_free(md);
    dcp__buf_free(&out);
}

TEST(batches_and_long_memo)
{
    /* 1500 more entries (> 1000 per batch, > 255 memo slots) and a tensor
     * of 2500 chunks. */
    struct dcp_metadata *md = make_md(1500, 2500);
    struct dcp_buf out = {0};
    int failed = 0;
    ASSERT_OK(encode(md, &out));
    check_same(out.p, out.len, 1, &failed);
    ASSERT_EQ(failed, 0);
    dcp__meta_free(md);
    dcp__buf_free(&out);
}

TEST(mutations_never_accepted_wrongly)
{
    struct dcp_metadata *md = make_md(4, 5);
    struct dcp_buf out = {0};
    uint8_t *m;
    unsigned seed = 12345;
    int failed = 0, i, accepted = 0;
    /* 5000 by default (a few seconds under ASan); more with
     * DCP_META_MUTATIONS=N. */
    const char *env = getenv("DCP_META_MUTATIONS");
    int nmut = env ? atoi(env) : 5000;
    ASSERT_OK(encode(md, &out));
    m = malloc(out.len);
    ASSERT(m != NULL);
    for (i = 0; i < nmut && !failed; i++) {
        size_t len = out.len, k, nflip;
        memcpy(m, out.p, out.len);
        seed = seed * 1103515245u + 12345u;
        nflip = 1 + (seed >> 16) % 3;
        for (k = 0; k < nflip; k++) {
            seed = seed * 1103515245u + 12345u;
            if ((seed >> 8) % 16 == 0) { /* truncate */
                len = len ? (seed >> 12) % len : 0;
                continue;
            }
            if (len) /* a truncation may have left nothing */
                m[(seed >> 12) % len] ^= (uint8_t)(1u << ((seed >> 4) % 8));
        }
        {
            struct dcp_metadata *f = NULL;
            if (dcp__meta_decode_fast(m, len, &f) == DCP_OK)
                accepted++;
            dcp__meta_free(f);
        }
        check_same(m, len, -1, &failed);
    }
    fprintf(stderr, "  %d mutations, %d accepted by the fast path\n", i,
            accepted);
    ASSERT_EQ(failed, 0);
    free(m);
    dcp__meta_free(md);
    dcp__buf_free(&out);
}

/* torch's own .metadata files: whatever the fast path does, the result
 * is the general decoder's. */
TEST(torch_files)
{
    static const char *files[] = {"torch_metadata_small.bin",
                                  "torch_small/.metadata",
                                  "torch_sharded/.metadata",
                                  "torch_mixed/.metadata"};
    const char *dir = getenv("DCP_TEST_DATA");
    size_t i;
    int failed = 0;
    ASSERT(dir != NULL);
    for (i = 0; i < DCP_ARRAY_LEN(files); i++) {
        char path[512];
        FILE *fp;
        uint8_t *buf;
        long n;
        (void)snprintf(path, sizeof(path), "%s/%s", dir, files[i]);
        fp = fopen(path, "rb");
        ASSERT(fp != NULL);
        ASSERT(fseek(fp, 0, SEEK_END) == 0);
        n = ftell(fp);
        ASSERT(n > 0 && fseek(fp, 0, SEEK_SET) == 0);
        buf = malloc((size_t)n);
        ASSERT(buf && fread(buf, 1, (size_t)n, fp) == (size_t)n);
        fclose(fp);
        check_same(buf, (size_t)n, -1, &failed);
        free(buf);
    }
    ASSERT_EQ(failed, 0);
}

int main(void)
{
    RUN(same_as_general);
    RUN(batches_and_long_memo);
    RUN(mutations_never_accepted_wrongly);
    RUN(torch_files);
    return TEST_SUMMARY();
}
