/* dcptool cat DIR KEY [--offsets 0,4 --sizes 2,3]: the raw little-endian
 * C-order bytes of a tensor (or a box of it) on stdout; a value as JSON. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dcptool.h"

static const char usage_text[] =
    "cat DIR KEY [--offsets O1,O2,... --sizes S1,S2,...]";

/* Parses "1,2,3" into at most DCP_MAX_NDIM values; returns the count or -1. */
static int parse_list(const char *s, int64_t *out)
{
    int n = 0;
    while (*s) {
        char *end;
        long long v;
        if (n == DCP_MAX_NDIM)
            return -1;
        errno = 0;
        v = strtoll(s, &end, 10);
        if (end == s || errno || v < 0 || (*end && *end != ','))
            return -1;
        out[n++] = v;
        s = *end ? end + 1 : end;
    }
    return n;
}

static int cat_value(dcp_ctx *ctx, dcp_metadata *md, long idx)
{
    dcp_value *v = NULL;
    char *json = NULL;
    int rc = dcp_metadata_read_value(ctx, md, (size_t)idx, &v);
    if (rc == DCP_OK)
        rc = dcp_value_to_json(v, &json);
    dcp_value_free(v);
    if (rc != DCP_OK)
        return tool_fail(ctx, rc);
    printf("%s\n", json);
    dcp_free(json);
    return 0;
}

static int cat_tensor(dcp_ctx *ctx, dcp_metadata *md, long idx,
                      const int64_t *off, const int64_t *size, int nbox)
{
    dcp_entry_info e;
    int64_t o[DCP_MAX_NDIM], s[DCP_MAX_NDIM];
    unsigned long long n;
    void *buf;
    int d, rc;
    (void)dcp_metadata_entry(md, (size_t)idx, &e);
    if (nbox >= 0 && nbox != e.ndim) {
        fprintf(stderr, "dcptool: '%s' has %d dimensions, the box %d\n",
                e.key, e.ndim, nbox);
        return 1;
    }
    n = dcp_dtype_size(e.dtype);
    for (d = 0; d < e.ndim; d++) {
        o[d] = nbox >= 0 ? off[d] : 0;
        s[d] = nbox >= 0 ? size[d] : e.shape[d];
        if (o[d] > e.shape[d] || s[d] > e.shape[d] - o[d]) {
            fprintf(stderr, "dcptool: box outside '%s' in dimension %d\n",
                    e.key, d);
            return 1;
        }
        n *= (unsigned long long)s[d];
    }
    buf = malloc(n ? n : 1);
    if (!buf)
        return tool_fail(NULL, DCP_ENOMEM);
    rc = dcp_metadata_read_box(ctx, md, (size_t)idx, o, s, buf, n, 1);
    if (rc != DCP_OK) {
        free(buf);
        return tool_fail(ctx, rc);
    }
    if (n && fwrite(buf, 1, n, stdout) != n) {
        free(buf);
        fprintf(stderr, "dcptool: cannot write to stdout\n");
        return 1;
    }
    free(buf);
    return fflush(stdout) == 0 ? 0 : 1;
}

int cmd_cat(int argc, char **argv)
{
    int64_t off[DCP_MAX_NDIM], size[DCP_MAX_NDIM];
    int noff = -1, nsize = -1, i, rc;
    dcp_ctx *ctx = NULL;
    dcp_metadata *md = NULL;
    long idx;
    if (argc < 3)
        return tool_usage(usage_text);
    for (i = 3; i < argc; i++) {
        if (i + 1 < argc && strcmp(argv[i], "--offsets") == 0)
            noff = parse_list(argv[++i], off);
        else if (i + 1 < argc && strcmp(argv[i], "--sizes") == 0)
            nsize = parse_list(argv[++i], size);
        else
            return tool_usage(usage_text);
        if ((noff < 0 && strcmp(argv[i - 1], "--offsets") == 0) ||
            (nsize < 0 && strcmp(argv[i - 1], "--sizes") == 0))
            return tool_usage(usage_text);
    }
    if ((noff < 0) != (nsize < 0) || noff != nsize)
        return tool_usage(usage_text);
    rc = tool_open(argv[1], &ctx, &md);
    if (rc)
        return rc;
    idx = dcp_metadata_find(md, argv[2]);
    if (idx < 0 && dcp_metadata_check_key(ctx, md, argv[2]) == DCP_ENOTSUP) {
        rc = tool_fail(ctx, DCP_ENOTSUP); /* a dtype dcp cannot read */
    } else if (idx < 0) {
        fputs("dcptool: no key '", stderr);
        tool_text(stderr, argv[2]);
        fprintf(stderr, "' in '%s'\n", argv[1]);
        rc = 1;
    } else {
        dcp_entry_info e;
        (void)dcp_metadata_entry(md, (size_t)idx, &e);
        if (!e.is_tensor && noff >= 0) {
            fputs("dcptool: '", stderr);
            tool_text(stderr, argv[2]);
            fputs("' is a value, not a tensor\n", stderr);
            rc = 1;
        } else {
            rc = e.is_tensor ? cat_tensor(ctx, md, idx, off, size, noff)
                             : cat_value(ctx, md, idx);
        }
    }
    dcp_metadata_free(md);
    dcp_ctx_free(ctx);
    return rc;
}
