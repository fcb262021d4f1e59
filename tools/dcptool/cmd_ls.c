/* dcptool ls DIR [--json]: one tab-separated line per entry, sorted by
 * key: key (control characters and backslashes escaped, tool_text),
 * dtype (or "value"), global shape (or "-"), chunks, bytes; with --json,
 * an array of objects with the same fields (keys as JSON strings). A
 * tensor of a dtype dcp cannot read (dcp_metadata_unsupported) is listed
 * with torch's dtype name and "(unsupported)", bytes "-" (JSON:
 * "unsupported": true, "bytes": null). */
#include <stdio.h>
#include <string.h>

#include "dcptool.h"

int cmd_ls(int argc, char **argv)
{
    dcp_ctx *ctx = NULL;
    dcp_metadata *md = NULL;
    size_t i, j, n, nu;
    int rc, json = 0;
    const char *dir = NULL;
    for (i = 1; i < (size_t)argc; i++) {
        if (strcmp(argv[i], "--json") == 0)
            json = 1;
        else if (!dir && argv[i][0] != '-')
            dir = argv[i];
        else
            return tool_usage("ls DIR [--json]");
    }
    if (!dir)
        return tool_usage("ls DIR [--json]");
    rc = tool_open(dir, &ctx, &md);
    if (rc)
        return rc;
    n = dcp_metadata_count(md);
    nu = dcp_metadata_unsupported_count(md);
    if (json)
        printf("[");
    /* The entries and those of dtypes dcp cannot read, merged by key. */
    for (i = 0, j = 0; i + j < n + nu;) {
        dcp_entry_info e;
        const char *dt = NULL;
        char shape[256] = "-";
        int unsup = 0;
        if (i < n)
            (void)dcp_metadata_entry(md, i, &e);
        if (j < nu) {
            dcp_entry_info u;
            (void)dcp_metadata_unsupported(md, j, &u, &dt);
            if (i >= n || strcmp(u.key, e.key) < 0) {
                e = u;
                unsup = 1;
            }
        }
        if (unsup)
            j++;
        else
            i++;
        if (e.is_tensor)
            (void)dcp_shape_format(shape, sizeof(shape), e.ndim, e.shape);
        if (!json) {
            tool_text(stdout, e.key);
            if (unsup)
                printf("\t%s (unsupported)\t%s\t%zu\t-\n", dt, shape,
                       e.nchunks);
            else
                printf("\t%s\t%s\t%zu\t%llu\n",
                       e.is_tensor ? dcp_dtype_name(e.dtype) : "value",
                       shape, e.nchunks, (unsigned long long)e.nbytes);
            continue;
        }
        printf("%s\n  {\"key\": ", i + j > 1 ? "," : "");
        tool_json_str(stdout, e.key);
        if (unsup)
            printf(", \"kind\": \"tensor\", \"dtype\": \"%s\", "
                   "\"unsupported\": true, \"shape\": %s, \"chunks\": %zu, "
                   "\"bytes\": null}",
                   dt, shape, e.nchunks);
        if (unsup)
            continue;
        if (e.is_tensor)
            printf(", \"kind\": \"tensor\", \"dtype\": \"%s\", "
                   "\"shape\": %s",
                   dcp_dtype_name(e.dtype), shape);
        else
            printf(", \"kind\": \"value\"");
        printf(", \"chunks\": %zu, \"bytes\": %llu}", e.nchunks,
               (unsigned long long)e.nbytes);
    }
    if (json)
        printf("%s]\n", n + nu ? "\n" : "");
    dcp_metadata_free(md);
    dcp_ctx_free(ctx);
    return 0;
}
