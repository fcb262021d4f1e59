/* dcptool ls DIR: one tab-separated line per entry, sorted by key:
 * key, dtype (or "value"), global shape (or "-"), chunks, bytes. */
#include <stdio.h>

#include "dcptool.h"

int cmd_ls(int argc, char **argv)
{
    dcp_ctx *ctx = NULL;
    dcp_metadata *md = NULL;
    size_t i, n;
    int rc;
    if (argc != 2)
        return tool_usage("ls DIR");
    rc = tool_open(argv[1], &ctx, &md);
    if (rc)
        return rc;
    n = dcp_metadata_count(md);
    for (i = 0; i < n; i++) {
        dcp_entry_info e;
        char shape[256] = "-";
        (void)dcp_metadata_entry(md, i, &e);
        if (e.is_tensor)
            tool_shape(shape, sizeof(shape), e.ndim, e.shape);
        printf("%s\t%s\t%s\t%zu\t%llu\n", e.key,
               e.is_tensor ? dcp_dtype_name(e.dtype) : "value", shape,
               e.nchunks, (unsigned long long)e.nbytes);
    }
    dcp_metadata_free(md);
    dcp_ctx_free(ctx);
    return 0;
}
