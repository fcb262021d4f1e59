/*
 * Input that a save must refuse, and the small API a newcomer needs:
 *  - keys, path components, stateful sub-keys and str values that are not
 *    valid UTF-8 (overlong forms, surrogates, truncated sequences, 0xff)
 *    or keys holding NUL: DCP_EINVAL at save time naming the key, escaped,
 *    nothing written; valid multi-byte keys save and load bit-exact;
 *  - a data-file name holding NUL in .metadata: refused, not cut short;
 *  - DCP_LOAD_ALLOW_UNEXPECTED (dcp_load and dcp_load_file);
 *  - dcp_state_op inside stateful callbacks;
 *  - dcp_uneven_1d without a communicator.
 */
#include <dcp/dcp.h>
#include <dcp/dcp_convert.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test.h"
#include "text.h"
#include "value.h"

static char root[256];

static const char *dirpath(const char *name)
{
    static char buf[4][512];
    static int k;
    if (!root[0]) {
        strcpy(root, "/tmp/dcp-test-input-XXXXXX");
        if (!mkdtemp(root))
            abort();
    }
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof(buf[k]), "%s/%s", root, name);
    return buf[k];
}

static int exists_in(const char *dir, const char *name)
{
    char p[600];
    struct stat sb;
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    return stat(p, &sb) == 0;
}

/* The bad byte sequences, each inside a key or str. */
static const struct {
    const char *what;
    const char *s;
} bad[] = {
    {"0xff", "a\xff"},
    {"overlong '/'", "a\xc0\xaf"},
    {"overlong 3-byte", "a\xe0\x80\xaf"},
    {"surrogate U+D800", "a\xed\xa0\x80"},
    {"surrogate U+DFFF", "a\xed\xbf\xbf"},
    {"truncated 3-byte", "a\xe5\xb1"},
    {"truncated 2-byte at end", "a\xc3"},
    {"lone continuation", "a\x80z"},
    {"beyond U+10FFFF", "a\xf4\x90\x80\x80"},
};
#define NBAD (sizeof(bad) / sizeof(bad[0]))

TEST(utf8_rule)
{
    char out[64];
    size_t i;
    for (i = 0; i < NBAD; i++) {
        size_t n = strlen(bad[i].s);
        if (dcp__utf8_check(bad[i].s, n, DCP__TEXT_KEY) != 1)
            FAIL_AT_("%s: first bad byte not at offset 1", bad[i].what);
    }
    /* CPython's surrogatepass: the pickle decoder accepts surrogates. */
    ASSERT(dcp__utf8_valid("\xed\xa0\x80", 3, DCP__UTF8_SURROGATES));
    ASSERT(!dcp__utf8_valid("\xed\xa0\x80", 3, 0));
    ASSERT(dcp__utf8_valid("\xe5\xb1\xa4.weight", 10, DCP__TEXT_KEY));
    ASSERT(dcp__utf8_valid("\xf0\x9f\x9a\x80", 4, DCP__TEXT_KEY));
    ASSERT(dcp__utf8_valid("\xf4\x8f\xbf\xbf", 4, DCP__TEXT_KEY));
    /* NUL: refused in keys (also in the 8-byte fast path), fine in a str. */
    ASSERT_EQ(dcp__utf8_check("abc\0defgh", 9, DCP__TEXT_KEY), 3);
    ASSERT_EQ(dcp__utf8_check("abcdefghijklm\0o", 15, DCP__TEXT_KEY), 13);
    ASSERT_EQ(dcp__utf8_check("abc\0defgh", 9, DCP__TEXT_VALUE), 9);
    /* Escaping for messages. */
    ASSERT_STR_EQ(dcp__text_escape(out, sizeof(out), "a\xff\n\t\x1b\x7f\\", 7),
                  "a\\xff\\n\\t\\x1b\\x7f\\\\");
    ASSERT_STR_EQ(dcp__text_escape(out, sizeof(out), "\xe5\xb1\xa4\0x", 5),
                  "\xe5\xb1\xa4\\x00x");
    ASSERT_STR_EQ(dcp__text_escape(out, 8, "abcdefghij", 10), "abcd...");
    ASSERT_STR_EQ(dcp__text_escape(out, 8, "abcdefg", 7), "abcdefg");
    ASSERT_STR_EQ(dcp__text_escape(out, 8, "\xff\xff", 2), "\\xff...");
}

/* A save of st into dir must fail with DCP_EINVAL, a message holding
 * needle, and leave no checkpoint (no .metadata, no data file). */
static int refused(dcp_ctx *ctx, dcp_state *st, const char *dir,
                   const char *needle)
{
    dcp_request *req = (dcp_request *)1;
    int rc = dcp_save(ctx, st, dir, NULL);
    if (rc != DCP_EINVAL) {
        fprintf(stderr, "save: got %s, want DCP_EINVAL\n", dcp_err_name(rc));
        return 0;
    }
    if (!strstr(dcp_errmsg(ctx), needle)) {
        fprintf(stderr, "message \"%s\" lacks \"%s\"\n", dcp_errmsg(ctx),
                needle);
        return 0;
    }
    if (exists_in(dir, ".metadata") || exists_in(dir, "__0_0.distcp"))
        return 0;
    rc = dcp_save_async(ctx, st, dir, NULL, &req);
    if (rc != DCP_EINVAL || req != NULL || !strstr(dcp_errmsg(ctx), needle))
        return 0;
    return 1;
}

TEST(bad_keys_refused_at_save)
{
    dcp_ctx *ctx;
    float w[2] = {1, 2};
    int64_t n = 2;
    size_t i;
    int ep;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    for (i = 0; i < NBAD; i++) {
        /* The entry points a key comes through: a pushed component, a
         * tensor name, a value name, a dict key flattened into a key. */
        for (ep = 0; ep < 4; ep++) {
            dcp_state *st;
            char needle[64], esc[32];
            ASSERT_OK(dcp_state_create(&st));
            if (ep == 0) {
                ASSERT_OK(dcp_state_push(st, bad[i].s));
                ASSERT_OK(dcp_state_push_rank(st, 0));
                ASSERT_OK(dcp_state_add_tensor(st, "w", DCP_F32, 1, &n, NULL,
                                               NULL, w, DCP_MEM_HOST));
            } else if (ep == 1) {
                ASSERT_OK(dcp_state_add_tensor(st, bad[i].s, DCP_F32, 1, &n,
                                               NULL, NULL, w, DCP_MEM_HOST));
            } else if (ep == 2) {
                ASSERT_OK(dcp_state_add_value(st, bad[i].s, dcp_value_int(1)));
            } else {
                dcp_value *d = dcp_value_dict();
                ASSERT_OK(dcp_value_dict_set(d, bad[i].s, dcp_value_int(1)));
                ASSERT_OK(dcp_state_add_value(st, "opt", d));
            }
            (void)dcp__text_escape(esc, sizeof(esc), bad[i].s,
                                   strlen(bad[i].s));
            snprintf(needle, sizeof(needle), "key '%s%s", ep == 3 ? "opt." : "",
                     esc);
            if (!refused(ctx, st, dirpath("badkey"), needle))
                FAIL_AT_("%s through entry point %d: not refused", bad[i].what,
                         ep);
            dcp_state_free(st);
        }
    }
    dcp_ctx_free(ctx);
}

TEST(bad_str_values_refused_at_save)
{
    dcp_ctx *ctx;
    size_t i;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    for (i = 0; i < NBAD; i++) {
        int where;
        for (where = 0; where < 3; where++) {
            dcp_state *st;
            dcp_value *v;
            char needle[64], esc[32];
            ASSERT_OK(dcp_state_create(&st));
            if (where == 0) {
                v = dcp_value_str(bad[i].s); /* a str leaf */
            } else if (where == 1) {
                v = dcp_value_tuple(); /* a str inside a tuple */
                ASSERT_OK(dcp_value_append(v, dcp_value_int(3)));
                ASSERT_OK(dcp_value_append(v, dcp_value_str(bad[i].s)));
            } else {
                dcp_value *d = dcp_value_dict(); /* a dict key in a tuple */
                ASSERT_OK(dcp_value_dict_set(d, bad[i].s, dcp_value_none()));
                v = dcp_value_tuple();
                ASSERT_OK(dcp_value_append(v, d));
            }
            ASSERT_OK(dcp_state_add_value(st, "cfg", v));
            (void)dcp__text_escape(esc, sizeof(esc), bad[i].s,
                                   strlen(bad[i].s));
            snprintf(needle, sizeof(needle), "key 'cfg': str \"%s\"", esc);
            if (!refused(ctx, st, dirpath("badstr"), needle))
                FAIL_AT_("%s in a str (%d): not refused", bad[i].what, where);
            dcp_state_free(st);
        }
    }
    dcp_ctx_free(ctx);
}

/* A stateful object whose state_dict adds the key in userdata. */
static int bad_sd(void *ud, dcp_state *st)
{
    return dcp_state_add_value(st, (const char *)ud, dcp_value_int(1));
}

static int bad_lsd(void *ud, const dcp_state *st)
{
    (void)ud;
    (void)st;
    return 0;
}

TEST(bad_stateful_subkey_refused_at_save)
{
    static const dcp_stateful_ops ops = {DCP_STATEFUL_OPS_VERSION, bad_sd,
                                         bad_lsd};
    static char subkey[] = "pos\xff";
    dcp_ctx *ctx;
    dcp_state *st;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT_OK(dcp_state_create(&st));
    ASSERT_OK(dcp_state_add_stateful(st, "loader", &ops, subkey));
    ASSERT(refused(ctx, st, dirpath("badsf"), "key 'loader.pos\\xff'"));
    dcp_state_free(st);
    dcp_ctx_free(ctx);
}

TEST(nul_in_dict_key_refused)
{
    /* Only a dict that came from a load can hold such a key (dict_set
     * takes a C string): flattening it would cut the key short. */
    dcp_state *st;
    dcp_value *d = dcp_value_dict();
    ASSERT_OK(dcp_value_dict_set(d, "a", dcp_value_int(1)));
    dcp_value_free(d->u.seq.v[0]);
    d->u.seq.v[0] = dcp_value_strn("a\0b", 3);
    ASSERT_OK(dcp_state_create(&st));
    ASSERT_RC(dcp_state_add_value(st, "m", d), DCP_EINVAL);
    ASSERT_EQ(dcp_state_count(st), 0);
    dcp_state_free(st);
}

TEST(multibyte_keys_and_nul_str_roundtrip)
{
    static const char *keys[] = {"\xe5\xb1\xa4.weight", /* 層.weight */
                                 "\xd0\xba\xd0\xbb\xd1\x8e\xd1\x87",
                                 "\xf0\x9f\x9a\x80"};
    const char *dir = dirpath("multibyte");
    dcp_ctx *ctx;
    dcp_state *st;
    float w[3][4], got[3][4];
    int64_t n = 4;
    const dcp_value *v;
    size_t i, len;
    for (i = 0; i < 12; i++)
        w[i / 4][i % 4] = (float)i * 1.25f - 3.0f;
    memset(got, 0, sizeof(got));
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT_OK(dcp_state_create(&st));
    ASSERT_OK(dcp_state_push(st, "\xe6\xa8\xa1\xe5\x9e\x8b")); /* 模型 */
    for (i = 0; i < 3; i++)
        ASSERT_OK(dcp_state_add_tensor(st, keys[i], DCP_F32, 1, &n, NULL, NULL,
                                       w[i], DCP_MEM_HOST));
    ASSERT_OK(dcp_state_pop(st));
    ASSERT_OK(dcp_state_add_value(st, "s", dcp_value_strn("a\0\xc3\xa9", 4)));
    ASSERT_OK(dcp_save(ctx, st, dir, NULL));
    dcp_state_free(st);
    ASSERT_OK(dcp_verify(ctx, dir));
    ASSERT_OK(dcp_state_create(&st));
    ASSERT_OK(dcp_state_push(st, "\xe6\xa8\xa1\xe5\x9e\x8b"));
    for (i = 0; i < 3; i++)
        ASSERT_OK(dcp_state_add_tensor(st, keys[i], DCP_F32, 1, &n, NULL, NULL,
                                       got[i], DCP_MEM_HOST));
    ASSERT_OK(dcp_state_pop(st));
    ASSERT_OK(dcp_state_add_value(st, "s", dcp_value_none()));
    ASSERT_OK(dcp_load(ctx, st, dir, NULL));
    ASSERT_MEM_EQ(got, w, sizeof(w));
    v = dcp_state_value(st, "s");
    ASSERT(dcp_value_as_str(v, &len) != NULL);
    ASSERT_EQ(len, 4);
    ASSERT_MEM_EQ(dcp_value_as_str(v, NULL), "a\0\xc3\xa9", 4);
    dcp_state_free(st);
    dcp_ctx_free(ctx);
}

static long read_all(const char *path, unsigned char **out)
{
    FILE *f = fopen(path, "rb");
    long n;
    if (!f)
        return -1;
    (void)fseek(f, 0, SEEK_END);
    n = ftell(f);
    (void)fseek(f, 0, SEEK_SET);
    *out = malloc((size_t)n + 1);
    if (!*out || fread(*out, 1, (size_t)n, f) != (size_t)n)
        n = -1;
    fclose(f);
    return n;
}

static int write_all(const char *path, const unsigned char *p, long n)
{
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(p, 1, (size_t)n, f) == (size_t)n;
    if (f)
        ok = fclose(f) == 0 && ok;
    return ok ? 0 : -1;
}

TEST(nul_in_data_file_name_refused)
{
    /* .metadata names "__0_0\0distcp"; a file "__0_0" holds the data. A
     * reader that cut the name at the NUL would load it; it must refuse. */
    const char *dir = dirpath("nulname");
    char p[600], q[600];
    unsigned char *md, *data;
    long n, dn, i, hits = 0;
    float w[2] = {1, 2}, got[2] = {0};
    int64_t two = 2;
    dcp_ctx *ctx;
    dcp_state *st;
    dcp_metadata *m = (dcp_metadata *)1;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT_OK(dcp_state_create(&st));
    ASSERT_OK(dcp_state_add_tensor(st, "w", DCP_F32, 1, &two, NULL, NULL, w,
                                   DCP_MEM_HOST));
    ASSERT_OK(dcp_save(ctx, st, dir, NULL));
    snprintf(p, sizeof(p), "%s/.metadata", dir);
    n = read_all(p, &md);
    ASSERT(n > 0);
    for (i = 0; i + 12 <= n; i++) {
        if (memcmp(md + i, "__0_0.distcp", 12) == 0) {
            memcpy(md + i, "__0_0\0distcp", 12);
            hits++;
        }
    }
    ASSERT(hits > 0);
    ASSERT_OK(write_all(p, md, n));
    free(md);
    snprintf(q, sizeof(q), "%s/__0_0.distcp", dir);
    dn = read_all(q, &data);
    ASSERT(dn > 0);
    snprintf(q, sizeof(q), "%s/__0_0", dir);
    ASSERT_OK(write_all(q, data, dn));
    free(data);
    dcp_state_free(st);
    ASSERT_OK(dcp_state_create(&st));
    ASSERT_OK(dcp_state_add_tensor(st, "w", DCP_F32, 1, &two, NULL, NULL, got,
                                   DCP_MEM_HOST));
    ASSERT_RC(dcp_load(ctx, st, dir, NULL), DCP_EUNSAFE);
    ASSERT(strstr(dcp_errmsg(ctx), "'__0_0\\x00distcp'") != NULL);
    ASSERT(got[0] == 0.0f);
    ASSERT_RC(dcp_metadata_open(ctx, dir, &m), DCP_EUNSAFE);
    ASSERT(m == NULL);
    ASSERT_RC(dcp_verify(ctx, dir), DCP_EUNSAFE);
    dcp_state_free(st);
    dcp_ctx_free(ctx);
}

/* Saves w = [1, 2, 3] and step = 7 into dir. */
static int save_w_step(dcp_ctx *ctx, const char *dir)
{
    float w[3] = {1, 2, 3};
    int64_t n = 3;
    dcp_state *st;
    int rc = dcp_state_create(&st);
    if (rc == DCP_OK)
        rc = dcp_state_add_tensor(st, "w", DCP_F32, 1, &n, NULL, NULL, w,
                                  DCP_MEM_HOST);
    if (rc == DCP_OK)
        rc = dcp_state_add_value(st, "step", dcp_value_int(7));
    if (rc == DCP_OK)
        rc = dcp_save(ctx, st, dir, NULL);
    dcp_state_free(st);
    return rc;
}

TEST(load_allow_unexpected)
{
    const char *dir = dirpath("allow_unexpected");
    dcp_load_options lo = {sizeof(lo), DCP_LOAD_ALLOW_UNEXPECTED, NULL};
    const char *const *keys;
    float got[3] = {0}, want[3] = {1, 2, 3};
    int64_t n = 3;
    dcp_ctx *ctx;
    dcp_state *st;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT_OK(save_w_step(ctx, dir));
    /* Only w asked for: strict fails on "step", the flag loads w. */
    ASSERT_OK(dcp_state_create(&st));
    ASSERT_OK(dcp_state_add_tensor(st, "w", DCP_F32, 1, &n, NULL, NULL, got,
                                   DCP_MEM_HOST));
    ASSERT_RC(dcp_load(ctx, st, dir, NULL), DCP_EKEY);
    ASSERT(strstr(dcp_errmsg(ctx), "unexpected key 'step'") != NULL);
    ASSERT(got[0] == 0.0f);
    ASSERT_OK(dcp_load(ctx, st, dir, &lo));
    ASSERT_MEM_EQ(got, want, sizeof(want));
    ASSERT_EQ(dcp_load_report(ctx, 1, &keys), 1);
    ASSERT_STR_EQ(keys[0], "step");
    ASSERT_EQ(dcp_load_report(ctx, 0, &keys), 0);
    /* A missing key stays an error with the flag, and changes nothing. */
    memset(got, 0, sizeof(got));
    ASSERT_OK(dcp_state_add_value(st, "nope", dcp_value_none()));
    ASSERT_RC(dcp_load(ctx, st, dir, &lo), DCP_EKEY);
    ASSERT(strstr(dcp_errmsg(ctx), "missing key 'nope'") != NULL);
    ASSERT(got[0] == 0.0f);
    /* With PARTIAL too: both reported, no error. */
    lo.flags |= DCP_LOAD_PARTIAL;
    ASSERT_OK(dcp_load(ctx, st, dir, &lo));
    ASSERT_EQ(dcp_load_report(ctx, 0, &keys), 1);
    ASSERT_STR_EQ(keys[0], "nope");
    ASSERT_EQ(dcp_load_report(ctx, 1, &keys), 1);
    ASSERT_STR_EQ(keys[0], "step");
    ASSERT_MEM_EQ(got, want, sizeof(want));
    dcp_state_free(st);
    dcp_ctx_free(ctx);
}

TEST(load_file_allow_unexpected)
{
    /* The same rule for dcp_load_file, on a torch.save export. */
    const char *dir = dirpath("allow_unexpected_file");
    char file[600];
    dcp_load_options lo = {sizeof(lo), DCP_LOAD_ALLOW_UNEXPECTED, NULL};
    const char *const *keys;
    float got[3] = {0}, want[3] = {1, 2, 3};
    int64_t n = 3;
    dcp_ctx *ctx;
    dcp_state *st;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT_OK(save_w_step(ctx, dir));
    snprintf(file, sizeof(file), "%s.pt", dir);
    ASSERT_OK(dcp_export(ctx, dir, file, NULL, NULL));
    ASSERT_OK(dcp_state_create(&st));
    ASSERT_OK(dcp_state_add_tensor(st, "w", DCP_F32, 1, &n, NULL, NULL, got,
                                   DCP_MEM_HOST));
    ASSERT_RC(dcp_load_file(ctx, st, file, NULL), DCP_EKEY);
    ASSERT(got[0] == 0.0f);
    ASSERT_OK(dcp_load_file(ctx, st, file, &lo));
    ASSERT_MEM_EQ(got, want, sizeof(want));
    ASSERT_EQ(dcp_load_report(ctx, 1, &keys), 1);
    ASSERT_STR_EQ(keys[0], "step");
    ASSERT_OK(dcp_state_add_value(st, "nope", dcp_value_none()));
    ASSERT_RC(dcp_load_file(ctx, st, file, &lo), DCP_EKEY);
    dcp_state_free(st);
    dcp_ctx_free(ctx);
}

/* A stateful counter that records the op each callback was told. */
struct counter {
    int64_t n;
    int sd_op[4];
    int nsd;
    int lsd_op;
    int nlsd;
};

static int counter_sd(void *ud, dcp_state *st)
{
    struct counter *c = ud;
    c->sd_op[c->nsd++ & 3] = dcp_state_op(st);
    return dcp_state_add_value(st, "n", dcp_value_int(c->n));
}

static int counter_lsd(void *ud, const dcp_state *st)
{
    struct counter *c = ud;
    c->lsd_op = dcp_state_op(st);
    c->nlsd++;
    c->n = dcp_value_as_int(dcp_state_value(st, "n"));
    return 0;
}

TEST(stateful_told_save_or_load)
{
    static const dcp_stateful_ops ops = {DCP_STATEFUL_OPS_VERSION, counter_sd,
                                         counter_lsd};
    const char *dir = dirpath("stateful_op");
    struct counter c = {41, {0}, 0, -9, 0};
    dcp_request *req;
    dcp_ctx *ctx;
    dcp_state *st;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT_OK(dcp_state_create(&st));
    ASSERT_RC(dcp_state_op(st), DCP_EINVAL);
    ASSERT_RC(dcp_state_op(NULL), DCP_EINVAL);
    ASSERT_OK(dcp_state_add_stateful(st, "ctr", &ops, &c));
    ASSERT_OK(dcp_save(ctx, st, dir, NULL));
    ASSERT_EQ(c.nsd, 1);
    ASSERT_EQ(c.sd_op[0], DCP_IO_SAVE);
    ASSERT_OK(dcp_save_async(ctx, st, dir, NULL, &req));
    ASSERT_OK(dcp_request_wait(req));
    dcp_request_free(req);
    ASSERT_EQ(c.nsd, 2);
    ASSERT_EQ(c.sd_op[1], DCP_IO_SAVE);
    c.n = 0;
    ASSERT_OK(dcp_load(ctx, st, dir, NULL));
    ASSERT_EQ(c.nsd, 3);
    ASSERT_EQ(c.sd_op[2], DCP_IO_LOAD);
    ASSERT_EQ(c.nlsd, 1);
    ASSERT_EQ(c.lsd_op, DCP_IO_LOAD);
    ASSERT_EQ(c.n, 41);
    ASSERT_RC(dcp_state_op(st), DCP_EINVAL); /* the caller's own state */
    dcp_state_free(st);
    dcp_ctx_free(ctx);
}

TEST(uneven_1d_single_process)
{
    int64_t off = -1, len = -1;
    ASSERT_OK(dcp_uneven_1d(NULL, 5, &off, &len));
    ASSERT_EQ(off, 0);
    ASSERT_EQ(len, 5);
    ASSERT_OK(dcp_uneven_1d(NULL, 0, &off, &len));
    ASSERT_EQ(off, 0);
    ASSERT_EQ(len, 0);
    off = len = -1;
    ASSERT_RC(dcp_uneven_1d(NULL, -1, &off, &len), DCP_EINVAL);
    ASSERT_EQ(off, 0);
    ASSERT_EQ(len, 0);
    ASSERT_RC(dcp_uneven_1d(NULL, 3, NULL, &len), DCP_EINVAL);
    ASSERT_RC(dcp_uneven_1d(NULL, 3, &off, NULL), DCP_EINVAL);
}

int main(void)
{
    RUN(utf8_rule);
    RUN(bad_keys_refused_at_save);
    RUN(bad_str_values_refused_at_save);
    RUN(bad_stateful_subkey_refused_at_save);
    RUN(nul_in_dict_key_refused);
    RUN(multibyte_keys_and_nul_str_roundtrip);
    RUN(nul_in_data_file_name_refused);
    RUN(load_allow_unexpected);
    RUN(load_file_allow_unexpected);
    RUN(stateful_told_save_or_load);
    RUN(uneven_1d_single_process);
    return TEST_SUMMARY();
}
