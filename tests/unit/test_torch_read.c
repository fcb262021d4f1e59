/*
 * Reading a checkpoint that real torch 2.13 wrote (tests/data/torch_mixed,
 * made by tests/data/torch_mixed_gen.py): metadata, every tensor bit-exact,
 * every value, planner_data paths; then re-encoding the metadata and
 * decoding it again gives the same model.
 */
#include <dcp/dcp.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meta.h"
#include "test.h"

static char dir[1024];

static void setup(void)
{
    const char *d = getenv("DCP_TEST_DATA");
    snprintf(dir, sizeof(dir), "%s/torch_mixed", d ? d : "tests/data");
}

TEST(metadata)
{
    dcp_ctx *ctx;
    dcp_metadata *md;
    dcp_entry_info e;
    dcp_chunk_info c;
    const char *s;
    int64_t num;
    long i;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT_OK(dcp_metadata_open(ctx, dir, &md));
    ASSERT_EQ(dcp_metadata_count(md), 8);
    ASSERT_STR_EQ(dcp_metadata_version(md), "1.0.0");
    i = dcp_metadata_find(md, "w");
    ASSERT_OK(dcp_metadata_entry(md, (size_t)i, &e));
    ASSERT_EQ(e.is_tensor, 1);
    ASSERT_EQ(e.dtype, DCP_F32);
    ASSERT_EQ(e.ndim, 2);
    ASSERT_EQ(e.shape[0], 2);
    ASSERT_EQ(e.shape[1], 3);
    ASSERT_EQ(e.nchunks, 1);
    ASSERT_OK(dcp_metadata_chunk(md, (size_t)i, 0, &c));
    ASSERT_STR_EQ(c.file, "__0_0.distcp");
    ASSERT_EQ(c.offset, 5044);
    ASSERT_EQ(c.length, 1577);
    i = dcp_metadata_find(md, "s0");
    ASSERT_OK(dcp_metadata_entry(md, (size_t)i, &e));
    ASSERT_EQ(e.ndim, 0);
    i = dcp_metadata_find(md, "step");
    ASSERT_OK(dcp_metadata_entry(md, (size_t)i, &e));
    ASSERT_EQ(e.is_tensor, 0);
    ASSERT_OK(dcp_metadata_chunk(md, (size_t)i, 0, &c));
    ASSERT_EQ(c.offset, 0);
    ASSERT_EQ(c.length, 1261);
    i = dcp_metadata_find(md, "nested.a");
    ASSERT_OK(dcp_metadata_entry(md, (size_t)i, &e));
    ASSERT_EQ(e.dtype, DCP_BF16);
    ASSERT_EQ(e.npath, 2);
    ASSERT_OK(dcp_metadata_path(md, (size_t)i, 0, &s, &num));
    ASSERT_STR_EQ(s, "nested");
    ASSERT_OK(dcp_metadata_path(md, (size_t)i, 1, &s, &num));
    ASSERT_STR_EQ(s, "a");
    ASSERT_EQ(dcp_metadata_find(md, "nope"), -1);
    dcp_metadata_free(md);
    dcp_ctx_free(ctx);
}

TEST(load_everything)
{
    static const float w_want[6] = {0, 1, 2, 3, 4, 5};
    static const uint16_t a_want[2] = {0x3F80, 0x3F80};
    dcp_ctx *ctx;
    dcp_state *st;
    float w[6] = {0};
    uint8_t f8[3] = {9, 9, 9};
    uint16_t a[2] = {0};
    float s0 = 0;
    int64_t ws[2] = {2, 3}, f8s[1] = {3}, as[1] = {2};
    const dcp_value *v;
    size_t n;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT_OK(dcp_state_create(&st));
    ASSERT_OK(dcp_state_add_tensor(st, "w", DCP_F32, 2, ws, NULL, NULL, w,
                                   DCP_MEM_HOST));
    ASSERT_OK(dcp_state_add_tensor(st, "f8", DCP_F8_E4M3FN, 1, f8s, NULL, NULL,
                                   f8, DCP_MEM_HOST));
    ASSERT_OK(dcp_state_add_tensor(st, "s0", DCP_F32, 0, NULL, NULL, NULL, &s0,
                                   DCP_MEM_HOST));
    ASSERT_OK(dcp_state_add_value(st, "step", dcp_value_none()));
    ASSERT_OK(dcp_state_push(st, "nested"));
    ASSERT_OK(dcp_state_add_tensor(st, "a", DCP_BF16, 1, as, NULL, NULL, a,
                                   DCP_MEM_HOST));
    ASSERT_OK(dcp_state_add_value(st, "lst", dcp_value_none()));
    ASSERT_OK(dcp_state_add_value(st, "t", dcp_value_none()));
    ASSERT_OK(dcp_state_add_value(st, "b", dcp_value_none()));
    ASSERT_OK(dcp_state_pop(st));
    ASSERT_OK(dcp_load(ctx, st, dir, NULL));
    ASSERT_MEM_EQ(w, w_want, sizeof(w));
    ASSERT(f8[0] == 0 && f8[1] == 0 && f8[2] == 0);
    ASSERT_MEM_EQ(a, a_want, sizeof(a));
    ASSERT(s0 == 3.5f);
    ASSERT_EQ(dcp_value_as_int(dcp_state_value(st, "step")), 7);
    v = dcp_state_value(st, "nested.lst");
    ASSERT_EQ(dcp_value_type_of(v), DCP_VALUE_LIST);
    ASSERT_EQ(dcp_value_len(v), 2);
    ASSERT_EQ(dcp_value_as_int(dcp_value_item(v, 1)), 2);
    v = dcp_state_value(st, "nested.t");
    ASSERT_EQ(dcp_value_type_of(v), DCP_VALUE_TUPLE);
    ASSERT_STR_EQ(dcp_value_as_str(dcp_value_item(v, 1), NULL), "x");
    v = dcp_state_value(st, "nested.b");
    ASSERT_MEM_EQ(dcp_value_as_bytes(v, &n), "hi", 2);
    ASSERT_EQ(n, 2);
    ASSERT_OK(dcp_verify(ctx, dir));
    dcp_state_free(st);
    dcp_ctx_free(ctx);
}

TEST(reencode_roundtrip)
{
    struct dcp_metadata *md, *md2;
    struct dcp_err err;
    struct dcp_buf b = {0};
    char path[1100];
    FILE *f;
    long len;
    uint8_t *p;
    size_t i, j;
    snprintf(path, sizeof(path), "%s/.metadata", dir);
    f = fopen(path, "rb");
    ASSERT(f != NULL);
    fseek(f, 0, SEEK_END);
    len = ftell(f);
    fseek(f, 0, SEEK_SET);
    p = malloc((size_t)len);
    ASSERT_EQ(fread(p, 1, (size_t)len, f), len);
    fclose(f);
    ASSERT_OK(dcp__meta_decode(p, (size_t)len, &md, &err));
    free(p);
    ASSERT_OK(dcp__meta_encode(md, &b));
    ASSERT_OK(dcp__meta_decode(b.p, b.len, &md2, &err));
    ASSERT_EQ(md->n, md2->n);
    for (i = 0; i < md->n; i++) {
        ASSERT_STR_EQ(md->e[i].key, md2->e[i].key);
        ASSERT_EQ(md->e[i].is_tensor, md2->e[i].is_tensor);
        ASSERT_EQ(md->e[i].dtype, md2->e[i].dtype);
        ASSERT_EQ(md->e[i].ndim, md2->e[i].ndim);
        ASSERT_EQ(md->e[i].nchunks, md2->e[i].nchunks);
        ASSERT_EQ(md->e[i].npath, md2->e[i].npath);
        for (j = 0; j < md->e[i].nchunks; j++) {
            ASSERT_U64_EQ(md->e[i].chunks[j].offset,
                          md2->e[i].chunks[j].offset);
            ASSERT_U64_EQ(md->e[i].chunks[j].length,
                          md2->e[i].chunks[j].length);
        }
    }
    dcp__meta_free(md);
    dcp__meta_free(md2);
    dcp__buf_free(&b);
}

int main(void)
{
    setup();
    RUN(metadata);
    RUN(load_everything);
    RUN(reencode_roundtrip);
    return TEST_SUMMARY();
}
