/*
 * dcp_parts.h: a save planned elsewhere (what dcp_torch's StorageWriter
 * runs): begin under the lock with a fresh tag over a committed
 * checkpoint, data files of records, the commit of another planner's
 * metadata (its save id checked), the old files removed; raw records and
 * batch box reads. White-box only to make the metadata bytes (meta.h).
 */
#include "dcp/dcp.h"
#include "dcp/dcp_parts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "meta.h"
#include "torchzip.h"
#include "test.h"
#include "util.h"

#define N 3000

static char root[256];

static const char *dirpath(const char *name)
{
    static char buf[512];
    if (!root[0]) {
        strcpy(root, "/tmp/dcp-test-parts-XXXXXX");
        if (!mkdtemp(root))
            abort();
    }
    snprintf(buf, sizeof(buf), "%s/%s", root, name);
    return buf;
}

static int exists(const char *dir, const char *name)
{
    char p[1024];
    struct stat sb;
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    return stat(p, &sb) == 0;
}

static struct dcp_metadata *read_md(const char *dir)
{
    char p[1024];
    FILE *f;
    static uint8_t buf[1 << 16];
    size_t n;
    struct dcp_metadata *md = NULL;
    struct dcp_err err;
    snprintf(p, sizeof(p), "%s/.metadata", dir);
    f = fopen(p, "rb");
    if (!f)
        return NULL;
    n = fread(buf, 1, sizeof(buf), f);
    fclose(f);
    dcp__err_clear(&err);
    if (dcp__meta_decode(buf, n, &md, &err) != DCP_OK)
        return NULL;
    return md;
}

TEST(save_in_parts)
{
    static float w[N], w2[N], back[N];
    int64_t shape[1] = {N};
    dcp_ctx *ctx = NULL;
    dcp_state *st = NULL;
    dcp_part_save *s = NULL, *s2 = NULL;
    dcp_part_file *f = NULL;
    dcp_metadata *om = NULL;
    struct dcp_metadata *md;
    struct dcp_buf enc = {0};
    uint8_t *rec = NULL;
    size_t reclen = 0, i;
    uint64_t toff, tlen, voff, vlen;
    char name[96];
    const char *dir = dirpath("a");
    long wi, vi;
    for (i = 0; i < N; i++) {
        w[i] = (float)i;
        w2[i] = (float)(2 * i + 1);
    }
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT_OK(dcp_state_create(&st));
    ASSERT_OK(dcp_state_add_tensor(st, "w", DCP_F32, 1, shape, NULL, NULL, w,
                                   DCP_MEM_HOST));
    ASSERT_OK(dcp_state_add_value(st, "step", dcp_value_int(7)));
    ASSERT_OK(dcp_save(ctx, st, dir, NULL));
    ASSERT(exists(dir, "__0_0.distcp"));

    ASSERT_OK(dcp_part_save_begin(ctx, dir, 0, &s));
    ASSERT_EQ(dcp_part_save_had_checkpoint(s), 1);
    ASSERT_EQ(strlen(dcp_part_save_id(s)), 16);
    ASSERT_STR_EQ(dcp_part_save_tag(s), dcp_part_save_id(s));
    /* one writer per path */
    ASSERT_EQ(dcp_part_save_begin(ctx, dir, 0, &s2), DCP_EBUSY);
    ASSERT(strstr(dcp_errmsg(ctx), "lock") || strstr(dcp_errmsg(ctx), "held"));
    ASSERT_EQ(dcp_part_save_begin(ctx, dir, DCP_PART_NO_OVERWRITE, &s2),
              DCP_EBUSY);

    /* the value's record as stored, copied into the new file */
    ASSERT_OK(dcp_metadata_open(ctx, dir, &om));
    vi = dcp_metadata_find(om, "step");
    wi = dcp_metadata_find(om, "w");
    ASSERT(vi >= 0 && wi >= 0);
    ASSERT_OK(dcp_metadata_read_record(ctx, om, (size_t)vi, 0, &rec, &reclen));
    ASSERT(reclen > 22 && rec[0] == 'P' && rec[1] == 'K');
    {
        /* it carries the old save's id (a reader would refuse it under the
         * new .metadata): the new record is a fresh torch.save of 7 */
        static const uint8_t pkl[] = {0x80, 0x02, 'K', 0x07, '.'};
        struct tz_writer z;
        ASSERT_OK(dcp__tz_writer_init(&z, 0, 64));
        ASSERT_OK(dcp__tz_value_item(&z, pkl, sizeof(pkl)));
        dcp_free(rec);
        reclen = z.out.len;
        rec = malloc(reclen);
        memcpy(rec, z.out.p, reclen);
        dcp__tz_writer_release(&z);
    }

    ASSERT_EQ(dcp_part_file_open(ctx, dir, "../x.distcp", NULL, 0, &f),
              DCP_EINVAL);
    ASSERT_EQ(dcp_part_file_open(ctx, dir, ".metadata", NULL, 0, &f),
              DCP_EINVAL);
    snprintf(name, sizeof(name), "__0_0.%s.distcp", dcp_part_save_tag(s));
    ASSERT_OK(dcp_part_file_open(ctx, dir, name, dcp_part_save_id(s),
                                 dcp_part_record_bound(sizeof(w2)) +
                                     dcp_part_record_bound(reclen),
                                 &f));
    ASSERT_OK(dcp_part_file_bytes(f, rec, reclen, &voff, &vlen));
    ASSERT_EQ(dcp_part_file_tensor(f, DCP_F32, 1, shape, w2, sizeof(w2) - 4,
                                   &toff, &tlen),
              DCP_EINVAL);
    ASSERT_OK(dcp_part_file_tensor(f, DCP_F32, 1, shape, w2, sizeof(w2),
                                   &toff, &tlen));
    ASSERT_OK(dcp_part_file_close(f, DCP_PART_SYNC));
    ASSERT_U64_EQ(voff, 0);
    ASSERT_U64_EQ(vlen, reclen);
    ASSERT(toff >= vlen && toff % 64 == 0);

    /* the metadata another planner made: dcp's, pointed at the new file */
    md = read_md(dir);
    ASSERT(md != NULL);
    dcp__free(md->files[0]);
    md->files[0] = dcp__strdup(name);
    for (i = 0; i < md->n; i++) {
        struct md_chunk *c = &md->e[i].chunks[0];
        c->offset = md->e[i].is_tensor ? toff : voff;
        c->length = md->e[i].is_tensor ? tlen : vlen;
    }
    ASSERT_OK(dcp__meta_encode(md, &enc));
    /* not this save's id: refused, nothing published */
    ASSERT_EQ(dcp_part_save_commit(s, NULL, enc.p, enc.len, 1), DCP_EINVAL);
    ASSERT(strstr(dcp_errmsg(ctx), "save id") != NULL);
    ASSERT_EQ(dcp_part_save_commit(s, NULL, "garbage", 7, 1), DCP_EFORMAT);
    dcp__free(md->save_id);
    md->save_id = dcp__strdup(dcp_part_save_id(s));
    enc.len = 0;
    ASSERT_OK(dcp__meta_encode(md, &enc));
    ASSERT_OK(dcp_part_save_commit(s, NULL, enc.p, enc.len, 1));
    ASSERT_EQ(dcp_part_save_commit(s, NULL, enc.p, enc.len, 1), DCP_EINVAL);
    dcp_part_save_free(s);
    s = NULL;
    ASSERT(!exists(dir, "__0_0.distcp")); /* the old file removed */
    ASSERT(exists(dir, name));
    ASSERT(!exists(dir, ".lock"));
    if (dcp_verify(ctx, dir) != DCP_OK)
        fprintf(stderr, "verify: %s\n", dcp_errmsg(ctx));
    ASSERT_OK(dcp_verify(ctx, dir));

    /* batch reads: two boxes of w and the whole of it */
    dcp_metadata_free(om);
    ASSERT_OK(dcp_metadata_open(ctx, dir, &om));
    ASSERT_STR_EQ(dcp_metadata_save_id(om), md->save_id);
    {
        int64_t o1[1] = {5}, z1[1] = {10}, o2[1] = {2000}, z2[1] = {1000},
                o3[1] = {0};
        float a[10], b[1000];
        dcp_box_read r[3] = {
            {(size_t)wi, o1, z1, a, sizeof(a)},
            {(size_t)wi, o2, z2, b, sizeof(b)},
            {(size_t)wi, o3, shape, back, sizeof(back)},
        };
        ASSERT_OK(dcp_metadata_read_boxes(ctx, om, r, 3, 1));
        ASSERT_MEM_EQ(a, w2 + 5, sizeof(a));
        ASSERT_MEM_EQ(b, w2 + 2000, sizeof(b));
        ASSERT_MEM_EQ(back, w2, sizeof(back));
        r[0].len = 8;
        ASSERT_EQ(dcp_metadata_read_boxes(ctx, om, r, 1, 1), DCP_EINVAL);
        r[0].len = sizeof(a);
        r[0].index = (size_t)vi;
        ASSERT_EQ(dcp_metadata_read_boxes(ctx, om, r, 1, 1), DCP_EINVAL);
    }
    {
        dcp_value *v = NULL;
        ASSERT_OK(dcp_metadata_read_value(ctx, om, (size_t)vi, &v));
        ASSERT_EQ(dcp_value_as_int(v), 7);
        dcp_value_free(v);
    }

    /* overwrite refused when asked; a save freed without a commit
     * releases the lock and publishes nothing */
    ASSERT_EQ(dcp_part_save_begin(ctx, dir, DCP_PART_NO_OVERWRITE, &s),
              DCP_EEXIST);
    ASSERT_OK(dcp_part_save_begin(ctx, dir, 0, &s));
    dcp_part_save_free(s);
    s = NULL;
    ASSERT_OK(dcp_part_save_begin(ctx, dir, 0, &s));
    dcp_part_save_free(s);
    ASSERT_OK(dcp_verify(ctx, dir));

    /* a fresh directory: no tag */
    ASSERT_OK(dcp_part_save_begin(ctx, dirpath("b/c"), 0, &s));
    ASSERT_EQ(dcp_part_save_had_checkpoint(s), 0);
    ASSERT_STR_EQ(dcp_part_save_tag(s), "");
    /* a discarded file is removed */
    ASSERT_OK(dcp_part_file_open(ctx, dirpath("b/c"), "__3_0.distcp", NULL, 0,
                                 &f));
    ASSERT_OK(dcp_part_file_tensor(f, DCP_F32, 1, shape, w, sizeof(w), NULL,
                                   NULL));
    ASSERT_OK(dcp_part_file_close(f, DCP_PART_DISCARD));
    ASSERT(!exists(dirpath("b/c"), "__3_0.distcp"));
    dcp_part_save_free(s);

    dcp__buf_free(&enc);
    dcp__meta_free(md);
    free(rec);
    dcp_metadata_free(om);
    dcp_state_free(st);
    dcp_ctx_free(ctx);
}

int main(void)
{
    RUN(save_in_parts);
    return TEST_SUMMARY();
}
