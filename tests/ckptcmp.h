/*
 * For tests that compare two checkpoints of the same state byte for byte:
 * same_checkpoint(ctx, a, b) is 1 when the directories a and b (paths of
 * one length) hold the same .metadata and __0_0.distcp but for what every
 * save makes its own: the save id (in .metadata and in each record,
 * sidmask.h) and the path (.metadata's checkpoint_id). White-box: it reads
 * the save ids through the internal struct dcp_metadata (meta.h).
 */
#ifndef DCP_TEST_CKPTCMP_H
#define DCP_TEST_CKPTCMP_H

#include <dcp/dcp.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "meta.h"
#include "sidmask.h"

static int ckptcmp_read_file(const char *path, unsigned char **p, size_t *n)
{
    FILE *f = fopen(path, "rb");
    long len;
    if (!f)
        return -1;
    fseek(f, 0, SEEK_END);
    len = ftell(f);
    fseek(f, 0, SEEK_SET);
    *n = (size_t)len;
    *p = malloc(*n ? *n : 1);
    if (!*p || fread(*p, 1, *n, f) != *n) {
        fclose(f);
        free(*p);
        return -1;
    }
    fclose(f);
    return 0;
}

/* Replaces every occurrence of the n bytes a by b in p. */
static void ckptcmp_subst(unsigned char *p, size_t len, const char *a,
                          const char *b, size_t n)
{
    size_t i;
    for (i = 0; n && i + n <= len; i++)
        if (!memcmp(p + i, a, n))
            memcpy(p + i, b, n);
}

/* Whether the checkpoints in directories da and db (names of one length)
 * are the same bytes but for their save ids and paths. */
static int same_checkpoint(dcp_ctx *ctx, const char *da, const char *db)
{
    static const char *const files[] = {".metadata", "__0_0.distcp"};
    dcp_metadata *ma = NULL, *mb = NULL;
    int ok = dcp_metadata_open(ctx, da, &ma) == DCP_OK &&
             dcp_metadata_open(ctx, db, &mb) == DCP_OK &&
             strlen(da) == strlen(db) &&
             strlen(ma->save_id) == strlen(mb->save_id);
    size_t f;
    for (f = 0; ok && f < 2; f++) {
        unsigned char *pa = NULL, *pb = NULL;
        size_t na = 0, nb = 0;
        char fa[600], fb[600];
        snprintf(fa, sizeof fa, "%s/%s", da, files[f]);
        snprintf(fb, sizeof fb, "%s/%s", db, files[f]);
        ok = ckptcmp_read_file(fa, &pa, &na) == 0 &&
             ckptcmp_read_file(fb, &pb, &nb) == 0 && na == nb;
        if (ok && f == 0) {
            ckptcmp_subst(pa, na, da, db, strlen(da));
            ckptcmp_subst(pa, na, ma->save_id, mb->save_id,
                          strlen(ma->save_id));
        } else if (ok) {
            ok = dcp_test_mask_sids(pa, na) > 0 &&
                 dcp_test_mask_sids(pa, na) == dcp_test_mask_sids(pb, nb);
        }
        ok = ok && !memcmp(pa, pb, na);
        free(pa);
        free(pb);
    }
    dcp_metadata_free(ma);
    dcp_metadata_free(mb);
    return ok;
}

#endif /* DCP_TEST_CKPTCMP_H */
