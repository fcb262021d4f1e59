/* dcptool info DIR [--json]: a summary of a checkpoint. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dcptool.h"

int cmd_info(int argc, char **argv)
{
    dcp_ctx *ctx = NULL;
    dcp_metadata *md = NULL;
    unsigned long long bytes = 0;
    size_t i, n, tensors = 0, nfiles = 0, cap = 0;
    const char **files = NULL;
    int rc, json = 0, a;
    const char *dir = NULL;
    for (a = 1; a < argc; a++) {
        if (strcmp(argv[a], "--json") == 0)
            json = 1;
        else if (!dir && argv[a][0] != '-')
            dir = argv[a];
        else
            return tool_usage("info DIR [--json]");
    }
    if (!dir)
        return tool_usage("info DIR [--json]");
    rc = tool_open(dir, &ctx, &md);
    if (rc)
        return rc;
    n = dcp_metadata_count(md);
    for (i = 0; i < n; i++) {
        dcp_entry_info e;
        size_t c, f;
        (void)dcp_metadata_entry(md, i, &e);
        if (e.is_tensor) {
            tensors++;
            bytes += e.nbytes;
        }
        for (c = 0; c < e.nchunks; c++) {
            dcp_chunk_info ci;
            (void)dcp_metadata_chunk(md, i, c, &ci);
            for (f = 0; f < nfiles; f++)
                if (files[f] == ci.file)
                    break;
            if (f < nfiles)
                continue;
            if (nfiles == cap) {
                const char **nf;
                cap = cap ? cap * 2 : 8;
                nf = realloc((void *)files, cap * sizeof(*files));
                if (!nf) {
                    free((void *)files);
                    dcp_metadata_free(md);
                    dcp_ctx_free(ctx);
                    return tool_fail(NULL, DCP_ENOMEM);
                }
                files = nf;
            }
            files[nfiles++] = ci.file;
        }
    }
    if (json) {
        printf("{\"checkpoint\": ");
        tool_json_str(stdout, dir);
        printf(", \"version\": ");
        tool_json_str(stdout, dcp_metadata_version(md));
        printf(", \"entries\": %zu, \"tensors\": %zu, \"values\": %zu, "
               "\"tensor_bytes\": %llu, \"files\": %zu}\n",
               n, tensors, n - tensors, bytes, nfiles);
        free((void *)files);
        dcp_metadata_free(md);
        dcp_ctx_free(ctx);
        return 0;
    }
    printf("checkpoint: %s\n", dir);
    printf("version: %s\n", *dcp_metadata_version(md)
                                ? dcp_metadata_version(md)
                                : "(none)");
    printf("entries: %zu (%zu tensors, %zu values)\n", n, tensors,
           n - tensors);
    printf("tensor bytes: %llu\n", bytes);
    printf("files: %zu\n", nfiles);
    free((void *)files);
    dcp_metadata_free(md);
    dcp_ctx_free(ctx);
    return 0;
}
