/*
 * The reference checkpoint of the fault and crash tests: a few tensors
 * (one large enough to be written straight from its buffer, one small, one
 * sharded into two boxes of one process) and two values, filled from a
 * seed. "Old" is what the directory holds committed before a faulty save,
 * "new" what the faulty save tries to write. rs_check loads a directory
 * and says which of the two it holds, bit for bit.
 */
#ifndef DCP_REFSTATE_H
#define DCP_REFSTATE_H

#include <dcp/dcp.h>

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* RS_SANITIZED: built with ASan, whose ten-fold slowdown makes some
 * tests run a sample instead of everything (the plain build runs all). */
#if defined(__SANITIZE_ADDRESS__)
#define RS_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RS_SANITIZED 1
#endif
#endif
#ifndef RS_SANITIZED
#define RS_SANITIZED 0
#endif

#define RS_SEED_OLD 1
#define RS_SEED_NEW 2

/* Rows of "big" (at most RS_MAX_ROWS): a test that wants a smaller
 * checkpoint (test_integrity) lowers it, one that wants a larger one
 * (test_crash's async series) raises it, before building any state. */
#define RS_MAX_ROWS 640
static int rs_big_rows = 256;

/* Shapes: big bf16 [256, 160] (80 KiB, direct write), f32 [33, 17] in two
 * row boxes, i64 [5]. */
struct refstate {
    uint16_t big[RS_MAX_ROWS * 160];
    float mat[33 * 17];
    int64_t vec[5];
    dcp_state *st;
};

static inline void rs_fill(void *p, size_t n, unsigned seed)
{
    unsigned char *b = p;
    size_t i;
    for (i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        b[i] = (unsigned char)(seed >> 16);
    }
}

/*
 * Builds rank's part of the state for seed (0: zeroed buffers and blank
 * values, for loading) on nranks ranks: "big" split by rows, "mat" by rows
 * (two boxes on one rank), "vec" and the values replicated. Returns 0 or a
 * dcp error.
 */
static inline int rs_build_part(struct refstate *r, unsigned seed, int rank,
                                int nranks)
{
    const int64_t R = rs_big_rows;
    int64_t bshape[2] = {R, 160}, mshape[2] = {33, 17}, vshape[1] = {5};
    int64_t o1[2] = {0, 0}, s1[2] = {20, 17}, o2[2] = {20, 0}, s2[2] = {13, 17};
    int64_t bo[2] = {R * rank / nranks, 0},
            bs[2] = {R * (rank + 1) / nranks - R * rank / nranks, 160};
    char note[64];
    int rc;
    if (nranks > 1) {
        o1[0] = 33 * rank / nranks;
        s1[0] = 33 * (rank + 1) / nranks - o1[0];
    }
    memset(r, 0, sizeof(*r));
    if (seed) {
        rs_fill(r->big, (size_t)R * 160 * 2, seed * 3 + 1);
        rs_fill(r->mat, sizeof(r->mat), seed * 5 + 2);
        rs_fill(r->vec, sizeof(r->vec), seed * 7 + 3);
    }
    rc = dcp_state_create(&r->st);
    if (rc)
        return rc;
    rc = dcp_state_push(r->st, "model");
    if (!rc)
        rc = dcp_state_add_tensor(r->st, "big", DCP_BF16, 2, bshape, bo, bs,
                                  r->big + bo[0] * 160, DCP_MEM_HOST);
    if (!rc)
        rc = dcp_state_add_tensor(r->st, "mat", DCP_F32, 2, mshape, o1, s1,
                                  r->mat + o1[0] * 17, DCP_MEM_HOST);
    if (!rc && nranks == 1)
        rc = dcp_state_add_tensor(r->st, "mat", DCP_F32, 2, mshape, o2, s2,
                                  r->mat + 20 * 17, DCP_MEM_HOST);
    if (!rc)
        rc = dcp_state_add_tensor(r->st, "vec", DCP_I64, 1, vshape, NULL, NULL,
                                  r->vec, DCP_MEM_HOST);
    if (!rc)
        rc = dcp_state_pop(r->st);
    (void)snprintf(note, sizeof(note), "checkpoint seed %u", seed);
    if (!rc)
        rc = dcp_state_add_value(r->st, "step", dcp_value_int(seed * 100));
    if (!rc)
        rc = dcp_state_add_value(r->st, "note", dcp_value_str(note));
    return rc;
}

static inline int rs_build(struct refstate *r, unsigned seed)
{
    return rs_build_part(r, seed, 0, 1);
}

static inline void rs_free(struct refstate *r)
{
    dcp_state_free(r->st);
    r->st = NULL;
}

/* 1 when a (loaded) and b (built from a seed) hold the same bytes. */
static inline int rs_equal(const struct refstate *a, const struct refstate *b)
{
    const dcp_value *sa = dcp_state_value(a->st, "step");
    const dcp_value *sb = dcp_state_value(b->st, "step");
    const dcp_value *na = dcp_state_value(a->st, "note");
    const dcp_value *nb = dcp_state_value(b->st, "note");
    return memcmp(a->big, b->big, (size_t)rs_big_rows * 160 * 2) == 0 &&
           memcmp(a->mat, b->mat, sizeof(a->mat)) == 0 &&
           memcmp(a->vec, b->vec, sizeof(a->vec)) == 0 && sa && sb &&
           dcp_value_equal(sa, sb) && na && nb && dcp_value_equal(na, nb);
}

/*
 * Loads dir with a plain POSIX context and says what it holds: RS_SEED_OLD
 * or RS_SEED_NEW (bit-exact), 0 when it loads but matches neither, or the
 * negative dcp code of the failed load (its message in msg, if not NULL).
 */
static inline int rs_check(const char *dir, char *msg, size_t msglen)
{
    struct refstate got, o, n;
    dcp_ctx *ctx;
    int rc, res = 0;
    if (dcp_ctx_create(&ctx, NULL, NULL))
        return -999;
    rc = rs_build(&got, 0);
    if (!rc)
        rc = rs_build(&o, RS_SEED_OLD);
    if (!rc)
        rc = rs_build(&n, RS_SEED_NEW);
    if (!rc)
        rc = dcp_load(ctx, got.st, dir, NULL);
    if (rc) {
        res = rc;
        if (msg)
            (void)snprintf(msg, msglen, "%s", dcp_errmsg(ctx));
    } else if (rs_equal(&got, &o)) {
        res = RS_SEED_OLD;
    } else if (rs_equal(&got, &n)) {
        res = RS_SEED_NEW;
    }
    rs_free(&got);
    rs_free(&o);
    rs_free(&n);
    dcp_ctx_free(ctx);
    return res;
}

/* dcp_ctx_options.io_flags of rs_save's context (DCP_IO_NO_URING makes
 * the data writes system calls that strace sees). */
static uint32_t rs_io_flags;

/* Saves the state of seed into dir with a plain POSIX context. */
static inline int rs_save(const char *dir, unsigned seed, int sync)
{
    struct refstate r;
    dcp_save_options so = {sizeof(so), !sync, 0, NULL};
    dcp_ctx_options co;
    dcp_ctx *ctx;
    int rc;
    memset(&co, 0, sizeof(co));
    co.struct_size = sizeof(co);
    co.io_flags = rs_io_flags;
    rc = dcp_ctx_create(&ctx, NULL, &co);
    if (rc)
        return rc;
    rc = rs_build(&r, seed);
    if (!rc)
        rc = dcp_save(ctx, r.st, dir, &so);
    rs_free(&r);
    dcp_ctx_free(ctx);
    return rc;
}

/*
 * Files in dir that the committed checkpoint does not name (debris), not
 * counting .metadata; -1 when dir has no readable checkpoint.
 */
static inline int rs_debris(const char *dir)
{
    dcp_metadata *md;
    dcp_ctx *ctx;
    DIR *d;
    struct dirent *de;
    int n = 0;
    if (dcp_ctx_create(&ctx, NULL, NULL))
        return -1;
    if (dcp_metadata_open(ctx, dir, &md)) {
        dcp_ctx_free(ctx);
        return -1;
    }
    d = opendir(dir);
    while (d && (de = readdir(d))) {
        size_t i, j, used = 0;
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") ||
            !strcmp(de->d_name, ".metadata"))
            continue;
        for (i = 0; !used && i < dcp_metadata_count(md); i++) {
            dcp_entry_info e;
            (void)dcp_metadata_entry(md, i, &e);
            for (j = 0; !used && j < e.nchunks; j++) {
                dcp_chunk_info c;
                (void)dcp_metadata_chunk(md, i, j, &c);
                used = !strcmp(c.file, de->d_name);
            }
        }
        n += !used;
    }
    if (d)
        closedir(d);
    dcp_metadata_free(md);
    dcp_ctx_free(ctx);
    return n;
}

/* The data files the committed checkpoint in dir names, as one string
 * "|a|b|c|" (empty when there is none); 0 or -1. */
static inline int rs_files(const char *dir, char *out, size_t cap)
{
    dcp_metadata *md;
    dcp_ctx *ctx;
    size_t i, j, len = 1;
    out[0] = '|';
    out[1] = '\0';
    if (dcp_ctx_create(&ctx, NULL, NULL))
        return -1;
    if (dcp_metadata_open(ctx, dir, &md)) {
        dcp_ctx_free(ctx);
        out[0] = '\0';
        return 0;
    }
    for (i = 0; i < dcp_metadata_count(md); i++) {
        dcp_entry_info e;
        (void)dcp_metadata_entry(md, i, &e);
        for (j = 0; j < e.nchunks; j++) {
            dcp_chunk_info c;
            char pat[300];
            (void)dcp_metadata_chunk(md, i, j, &c);
            (void)snprintf(pat, sizeof(pat), "|%s|", c.file);
            if (!strstr(out, pat) && len + strlen(c.file) + 2 < cap) {
                (void)snprintf(out + len, cap - len, "%s|", c.file);
                len += strlen(c.file) + 1;
            }
        }
    }
    dcp_metadata_free(md);
    dcp_ctx_free(ctx);
    return 0;
}

/* Removes dir and the files in it (a checkpoint is flat). */
static inline void rs_rmtree(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    char p[1024];
    while (d && (de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        (void)snprintf(p, sizeof(p), "%.700s/%.255s", dir, de->d_name);
        if (unlink(p) != 0)
            rs_rmtree(p);
    }
    if (d)
        closedir(d);
    (void)rmdir(dir);
}

/* Number of open descriptors of this process. */
static inline int rs_nfds(void)
{
    DIR *d = opendir("/proc/self/fd");
    struct dirent *de;
    int n = 0;
    while (d && (de = readdir(d)))
        n += de->d_name[0] != '.';
    if (d)
        closedir(d);
    return n;
}

#endif /* DCP_REFSTATE_H */
