/* dcptool verify DIR: every tensor tiled by its chunks, every record
 * present, parsed and matching its CRC. */
#include <stdio.h>

#include "dcptool.h"

int cmd_verify(int argc, char **argv)
{
    dcp_ctx *ctx = NULL;
    dcp_metadata *md = NULL;
    unsigned long long bytes = 0;
    size_t i, n, records = 0;
    int rc;
    if (argc != 2)
        return tool_usage("verify DIR");
    rc = tool_open(argv[1], &ctx, &md);
    if (rc)
        return rc;
    rc = dcp_verify(ctx, argv[1]);
    if (rc != DCP_OK) {
        tool_fail(ctx, rc);
        dcp_metadata_free(md);
        dcp_ctx_free(ctx);
        return 1;
    }
    n = dcp_metadata_count(md);
    for (i = 0; i < n; i++) {
        dcp_entry_info e;
        (void)dcp_metadata_entry(md, i, &e);
        records += e.nchunks;
        bytes += e.nbytes;
    }
    printf("ok: %zu entries, %zu records, %llu bytes checked\n", n, records,
           bytes);
    dcp_metadata_free(md);
    dcp_ctx_free(ctx);
    return 0;
}
