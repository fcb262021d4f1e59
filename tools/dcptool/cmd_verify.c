/* dcptool verify DIR: every tensor tiled by its chunks, every record
 * present, parsed and matching its CRC. Progress on stderr when it is a
 * terminal. */
#include <stdio.h>
#include <unistd.h>

#include "dcptool.h"

struct vprogress {
    unsigned long long total;
    int last; /* last percentage shown, -1 before the first */
};

/* dcp_verify's PROGRESS events as "verify: NN%" rewritten in place. */
static void on_event(const dcp_event *ev, void *arg)
{
    struct vprogress *p = arg;
    int pct;
    if (ev->phase != DCP_PHASE_VERIFY || ev->kind != DCP_EVENT_PROGRESS)
        return;
    pct = p->total ? (int)(ev->bytes * 100 / p->total) : 100;
    if (pct > 100)
        pct = 100;
    if (pct == p->last)
        return;
    p->last = pct;
    fprintf(stderr, "\rverify: %3d%%", pct);
    fflush(stderr);
}

int cmd_verify(int argc, char **argv)
{
    dcp_ctx *ctx = NULL;
    dcp_metadata *md = NULL;
    unsigned long long bytes = 0;
    size_t i, n, records = 0;
    struct vprogress pr = {0, -1};
    int rc;
    if (argc != 2)
        return tool_usage("verify DIR");
    rc = tool_open(argv[1], &ctx, &md);
    if (rc)
        return rc;
    if (isatty(STDERR_FILENO)) {
        n = dcp_metadata_count(md);
        for (i = 0; i < n; i++) {
            dcp_entry_info e;
            (void)dcp_metadata_entry(md, i, &e);
            pr.total += e.nbytes;
        }
        (void)dcp_ctx_set_event_callback(ctx, on_event, &pr);
    }
    rc = dcp_verify(ctx, argv[1]);
    if (pr.last >= 0)
        fputs("\r\033[K", stderr);
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
