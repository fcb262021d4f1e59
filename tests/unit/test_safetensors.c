/*
 * The safetensors header parser and the JSON parser under it, with hostile
 * headers: every check of safetensors.h fails with its code and a message,
 * and random mutations of a valid header never crash (under ASan in the
 * sanitizer build).
 */
#include "test.h"

#include "json.h"
#include "safetensors.h"

static int parse(const char *hdr, uint64_t data_len, struct sf_file *f,
                 struct dcp_err *err)
{
    size_t n = strlen(hdr);
    return dcp__sf_parse_header(hdr, n, 8 + n + data_len, f, err);
}

static int rc_of(const char *hdr, uint64_t data_len, const char *needle)
{
    struct sf_file f;
    struct dcp_err err = {0, ""};
    int rc = parse(hdr, data_len, &f, &err);
    if (rc == DCP_OK)
        dcp__sf_release(&f);
    else if (needle && !strstr(err.msg, needle))
        fprintf(stderr, "message \"%s\" lacks \"%s\"\n", err.msg, needle);
    return needle && rc != DCP_OK && !strstr(err.msg, needle) ? 999 : rc;
}

TEST(json_grammar)
{
    static const char *const bad[] = {
        "",
        "{",
        "[1,]",
        "{\"a\":1,}",
        "01",
        "1.",
        "-",
        "\"\\x\"",
        "\"\\ud800\"",
        "\"\\udc00\"",
        "\"a\nb\"",
        "tru",
        "{\"a\" 1}",
        "[1 2]",
        "{} x",
        "\"\xff\"",
        "\"\xc0\x80\"",
        "1e",
        "{1:2}",
        "[\"\\u12\"]",
    };
    static const char *const good[] = {
        "{}",
        "[]",
        " [1, -2, 3.5e3, true, false, null] ",
        "{\"a\":{\"b\":[\"\\u00e9\\ud83d\\ude80\\n\\\"\"]}}",
        "-0",
        "\"\"",
    };
    static const char ints[] =
        "[9223372036854775807, -9223372036854775808, 9223372036854775808]";
    struct json_doc *doc;
    struct json_node *root;
    struct dcp_err err;
    size_t i;
    for (i = 0; i < DCP_ARRAY_LEN(bad); i++) {
        int rc = dcp__json_parse(bad[i], strlen(bad[i]), 16, 100, &doc, &root, &err);
        if (rc != DCP_EFORMAT)
            fprintf(stderr, "bad[%zu] = '%s'\n", i, bad[i]);
        ASSERT_RC(rc, DCP_EFORMAT);
    }
    for (i = 0; i < DCP_ARRAY_LEN(good); i++) {
        ASSERT_OK(
            dcp__json_parse(good[i], strlen(good[i]), 16, 100, &doc, &root, &err));
        dcp__json_free(doc);
    }
    ASSERT_OK(dcp__json_parse(good[3], strlen(good[3]), 16, 100, &doc, &root, &err));
    ASSERT_STR_EQ(dcp__json_get(dcp__json_get(root, "a"), "b")->v[0]->s,
                  "\xc3\xa9\xf0\x9f\x9a\x80\n\"");
    dcp__json_free(doc);
    /* integers: int64 range exactly */
    ASSERT_OK(dcp__json_parse(ints, strlen(ints), 4, 10, &doc, &root, &err));
    ASSERT(root->v[0]->is_int && root->v[0]->i == INT64_MAX);
    ASSERT(root->v[1]->is_int && root->v[1]->i == INT64_MIN);
    ASSERT(!root->v[2]->is_int);
    dcp__json_free(doc);
}

TEST(json_limits)
{
    char deep[400];
    struct json_doc *doc;
    struct json_node *root;
    struct dcp_err err;
    memset(deep, '[', 200);
    memset(deep + 200, ']', 200);
    ASSERT_RC(dcp__json_parse(deep, 400, 64, 1000, &doc, &root, &err), DCP_ELIMIT);
    ASSERT_RC(dcp__json_parse("[1,2,3,4,5]", 11, 4, 3, &doc, &root, &err),
              DCP_ELIMIT);
    ASSERT_OK(
        dcp__json_parse("{\"a\":1,\"b\":2,\"a\":3}", 19, 4, 10, &doc, &root, &err));
    ASSERT_STR_EQ(dcp__json_dup_key(root), "a");
    dcp__json_free(doc);
}

TEST(header_good)
{
    struct sf_file f;
    struct dcp_err err;
    const char *h = "{\"__metadata__\":{\"format\":\"pt\"},"
                    "\"b\":{\"dtype\":\"BF16\",\"shape\":[2,0],"
                    "\"data_offsets\":[24,24]},"
                    "\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],"
                    "\"data_offsets\":[0,24]},"
                    "\"c\":{\"dtype\":\"I64\",\"shape\":[],"
                    "\"data_offsets\":[24,32],\"extra\":1}}";
    ASSERT_OK(parse(h, 32, &f, &err));
    ASSERT_EQ(f.n, 3);
    ASSERT_STR_EQ(f.t[1].name, "a");
    ASSERT_EQ(f.t[1].dtype, DCP_F32);
    ASSERT_EQ(f.t[1].ndim, 2);
    ASSERT_EQ(f.t[2].ndim, 0);
    ASSERT_EQ(f.nmeta, 1);
    ASSERT_STR_EQ(f.meta[1], "pt");
    ASSERT_U64_EQ(f.data_off, 8 + strlen(h));
    dcp__sf_release(&f);
}

TEST(header_hostile)
{
    const char *T = "\"dtype\":\"F32\",\"shape\":[2]";
    char h[512];
    ASSERT_RC(rc_of("[]", 0, "not a JSON object"), DCP_EFORMAT);
    ASSERT_RC(rc_of("{\"a\":1}", 0, "not an object"), DCP_EFORMAT);
    (void)snprintf(h, sizeof(h),
                   "{\"a\":{%s,\"data_offsets\":[0,8]},"
                   "\"a\":{%s,\"data_offsets\":[8,16]}}",
                   T, T);
    ASSERT_RC(rc_of(h, 16, "named twice"), DCP_EFORMAT);
    (void)snprintf(h, sizeof(h), "{\"\":{%s,\"data_offsets\":[0,8]}}", T);
    ASSERT_RC(rc_of(h, 8, "empty"), DCP_EFORMAT);
    (void)snprintf(h, sizeof(h), "{\"a\\u0000b\":{%s,\"data_offsets\":[0,8]}}",
                   T);
    ASSERT_RC(rc_of(h, 8, "NUL"), DCP_EFORMAT);
    ASSERT_RC(rc_of("{\"a\":{\"dtype\":\"F33\",\"shape\":[2],"
                    "\"data_offsets\":[0,8]}}",
                    8, "unknown dtype"),
              DCP_EFORMAT);
    ASSERT_RC(rc_of("{\"a\":{\"dtype\":\"F6_E2M3\",\"shape\":[4],"
                    "\"data_offsets\":[0,8]}}",
                    8, "does not support"),
              DCP_ENOTSUP);
    ASSERT_RC(rc_of("{\"a\":{\"dtype\":\"U16\",\"shape\":[4],"
                    "\"data_offsets\":[0,8]}}",
                    8, NULL),
              DCP_OK);
    ASSERT_RC(rc_of("{\"a\":{\"dtype\":\"C64\",\"shape\":[4],"
                    "\"data_offsets\":[0,8]}}",
                    8, "need 32"),
              DCP_EFORMAT); /* 4 complex64 need 32 bytes */
    ASSERT_RC(rc_of("{\"a\":{\"dtype\":7,\"shape\":[4],"
                    "\"data_offsets\":[0,8]}}",
                    8, "no dtype"),
              DCP_EFORMAT);
    ASSERT_RC(rc_of("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],"
                    "\"data_offsets\":[0,8]}}",
                    8, "non-negative"),
              DCP_EFORMAT);
    ASSERT_RC(rc_of("{\"a\":{\"dtype\":\"F32\",\"shape\":[2.0],"
                    "\"data_offsets\":[0,8]}}",
                    8, "non-negative"),
              DCP_EFORMAT);
    ASSERT_RC(rc_of("{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],"
                    "\"data_offsets\":[0,1]}}",
                    1, "dimensions"),
              DCP_ELIMIT);
    ASSERT_RC(rc_of("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],"
                    "\"data_offsets\":[8,0]}}",
                    8, "bad data_offsets"),
              DCP_EFORMAT);
    ASSERT_RC(rc_of("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],"
                    "\"data_offsets\":[0]}}",
                    8, "bad data_offsets"),
              DCP_EFORMAT);
    ASSERT_RC(rc_of("{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", 8,
                    "bad data_offsets"),
              DCP_EFORMAT);
    ASSERT_RC(rc_of("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],"
                    "\"data_offsets\":[0,8]}}",
                    8, "need 12"),
              DCP_EFORMAT);
    /* element count overflow: 2^32 * 2^32 */
    ASSERT_RC(rc_of("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,"
                    "4294967296],\"data_offsets\":[0,8]}}",
                    8, "overflows"),
              DCP_EFORMAT);
    (void)snprintf(h, sizeof(h),
                   "{\"a\":{%s,\"data_offsets\":[0,8]},"
                   "\"b\":{%s,\"data_offsets\":[4,12]}}",
                   T, T);
    ASSERT_RC(rc_of(h, 12, "overlaps"), DCP_EFORMAT);
    (void)snprintf(h, sizeof(h),
                   "{\"a\":{%s,\"data_offsets\":[0,8]},"
                   "\"b\":{%s,\"data_offsets\":[12,20]}}",
                   T, T);
    ASSERT_RC(rc_of(h, 20, "gap"), DCP_EFORMAT);
    (void)snprintf(h, sizeof(h), "{\"a\":{%s,\"data_offsets\":[0,8]}}", T);
    ASSERT_RC(rc_of(h, 7, "truncated"), DCP_ECORRUPT);
    ASSERT_RC(rc_of(h, 9, "after the last"), DCP_EFORMAT);
    ASSERT_RC(rc_of("{\"__metadata__\":{\"k\":1}}", 0, "not a string"),
              DCP_EFORMAT);
    ASSERT_RC(rc_of("{\"__metadata__\":[]}", 0, "not an object"), DCP_EFORMAT);
    /* A field given twice: the safetensors library refuses it ("duplicate
     * field"); taking either copy would read the file differently. */
    ASSERT_RC(rc_of("{\"a\":{\"dtype\":\"F32\",\"dtype\":\"I32\",\"shape\":"
                    "[2],\"data_offsets\":[0,8]}}",
                    8, "field 'dtype' twice"),
              DCP_EFORMAT);
    ASSERT_RC(rc_of("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":"
                    "[0,8],\"data_offsets\":[0,4]}}",
                    8, "field 'data_offsets' twice"),
              DCP_EFORMAT);
    ASSERT_RC(rc_of("{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}}", 0,
                    "key 'k' twice"),
              DCP_EFORMAT);
    /* dtype x shape overflows 2^64 bytes (the element count does not) */
    ASSERT_RC(rc_of("{\"a\":{\"dtype\":\"F64\",\"shape\":[4611686018427387904]"
                    ",\"data_offsets\":[0,8]}}",
                    8, "more than 2^64 bytes"),
              DCP_EFORMAT);
    /* unknown fields are ignored, as by the safetensors library */
    ASSERT_RC(rc_of("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":"
                    "[0,8],\"x\":[1]}}",
                    8, NULL),
              DCP_OK);
}

TEST(header_length_prefix)
{
    struct sf_file f;
    struct dcp_err err;
    const char *h = "{}";
    /* the header claims more bytes than the file has, or than the limit */
    ASSERT_RC(dcp__sf_parse_header(h, 2, 9, &f, &err), DCP_EFORMAT);
    ASSERT_RC(dcp__sf_parse_header(h, 2, 4, &f, &err), DCP_EFORMAT);
    ASSERT_OK(dcp__sf_parse_header(h, 2, 10, &f, &err));
    dcp__sf_release(&f);
}

TEST(build_then_parse)
{
    int64_t s1[2] = {3, 5}, s2[1] = {7};
    struct sf_out t[3] = {{"w\"q", DCP_F64, 2, s1},
                          {"b", DCP_BF16, 1, s2},
                          {"s", DCP_BOOL, 0, NULL}};
    const char *meta[2] = {"format", "pt"};
    struct dcp_buf b = {0};
    struct sf_file f;
    struct dcp_err err;
    uint64_t dl = 0;
    ASSERT_OK(dcp__sf_header_build(t, 3, meta, 1, &b, &dl));
    ASSERT_U64_EQ(dl, 3 * 5 * 8 + 7 * 2 + 1);
    ASSERT_EQ(b.len % 8, 0);
    ASSERT_U64_EQ(dcp__le64(b.p), b.len - 8);
    ASSERT_OK(dcp__sf_parse_header(b.p + 8, b.len - 8, b.len + dl, &f, &err));
    ASSERT_EQ(f.n, 3);
    ASSERT_STR_EQ(f.t[0].name, "w\"q");
    ASSERT_U64_EQ(f.t[1].begin, 120);
    ASSERT_U64_EQ(f.t[2].end, dl);
    dcp__sf_release(&f);
    dcp__buf_free(&b);
}

/* Random byte mutations of a valid header: always a clean return. */
TEST(mutations)
{
    const char *h = "{\"__metadata__\":{\"format\":\"pt\"},"
                    "\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],"
                    "\"data_offsets\":[0,24]},"
                    "\"b\":{\"dtype\":\"I8\",\"shape\":[4],"
                    "\"data_offsets\":[24,28]}}";
    size_t n = strlen(h), i;
    char buf[256];
    uint32_t x = 12345;
    int ok = 0;
    for (i = 0; i < 5000; i++) {
        struct sf_file f;
        struct dcp_err err;
        int k, m = 1 + (int)(i % 4), rc;
        memcpy(buf, h, n);
        for (k = 0; k < m; k++) {
            x = x * 1103515245u + 12345u;
            buf[(x >> 8) % n] = (char)(x >> 20);
        }
        rc = dcp__sf_parse_header(buf, n, 8 + n + 28, &f, &err);
        if (rc == DCP_OK) {
            ok++;
            dcp__sf_release(&f);
        } else {
            ASSERT(err.msg[0] != '\0');
        }
    }
    ASSERT(ok > 0);
}

int main(void)
{
    RUN(json_grammar);
    RUN(json_limits);
    RUN(header_good);
    RUN(header_hostile);
    RUN(header_length_prefix);
    RUN(build_then_parse);
    RUN(mutations);
    return TEST_SUMMARY();
}
