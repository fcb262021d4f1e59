/*
 * Observability, single process: dcp_ctx_phase_report after a sync save,
 * an async save and a load (non-negative times, each operation's phases
 * only, summing to at most the wall time, bytes where meaningful), and the
 * event callback (each phase's START and END matched and in order,
 * PROGRESS bytes monotone within WRITE, WRITE and FSYNC on the writer
 * thread and the others on the caller's, for sync and async saves).
 */
#include <dcp/dcp.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test.h"

#define NEL (1 << 20) /* 4 MiB of floats */

static char root[256];
static float *buf;
static const dcp_save_options nosync = {sizeof(dcp_save_options), 1, 0, NULL};

static const char *dirpath(const char *name)
{
    static char b[512];
    struct stat sb;
    if (!root[0]) {
        strcpy(root, stat("/dev/shm", &sb) == 0 ? "/dev/shm/dcp-phases-XXXXXX"
                                                : "/tmp/dcp-phases-XXXXXX");
        if (!mkdtemp(root))
            abort();
    }
    snprintf(b, sizeof b, "%s/%s", root, name);
    return b;
}

static dcp_state *make_state(void)
{
    dcp_state *st = NULL;
    int64_t shape[1] = {NEL}, off[1] = {0};
    if (dcp_state_create(&st) ||
        dcp_state_add_tensor(st, "w", DCP_F32, 1, shape, off, shape, buf,
                             DCP_MEM_HOST) ||
        dcp_state_add_value(st, "step", dcp_value_int(3)))
        abort();
    return st;
}

/* Recorded events. */
#define MAXEV 4096
static struct rec {
    dcp_event ev;
    int on_main;
} evs[MAXEV];
static int nev;
static pthread_t main_thread;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;

static void on_event(const dcp_event *ev, void *arg)
{
    (void)arg;
    pthread_mutex_lock(&mu);
    if (nev < MAXEV) {
        evs[nev].ev = *ev;
        evs[nev].on_main = pthread_equal(pthread_self(), main_thread);
        nev++;
    }
    pthread_mutex_unlock(&mu);
}

/* Checks the report of op: phases of op >= 0, others 0, sum <= wall. */
static int check_report(dcp_ctx *ctx, int op, dcp_phase_report *r)
{
    static const int save_ph[] = {DCP_PHASE_PLAN,  DCP_PHASE_STAGE,
                                  DCP_PHASE_WRITE, DCP_PHASE_FSYNC,
                                  DCP_PHASE_AGREE, DCP_PHASE_COMMIT};
    double sum = 0;
    memset(r, 0, sizeof *r);
    r->struct_size = sizeof *r;
    if (dcp_ctx_phase_report(ctx, op, r) != DCP_OK || !r->complete)
        return 0;
    for (int p = 0; p < DCP_PHASE_MAX; p++) {
        int mine = 0;
        for (size_t i = 0; i < 6; i++)
            mine |= save_ph[i] == p;
        if (op == DCP_IO_LOAD)
            mine = p >= DCP_PHASE_METADATA && p <= DCP_PHASE_COPY;
        if (r->seconds[p] < 0 || (!mine && (r->seconds[p] || r->bytes[p]))) {
            fprintf(stderr, "phase %s: %g s, %llu bytes\n", dcp_phase_name(p),
                    r->seconds[p], (unsigned long long)r->bytes[p]);
            return 0;
        }
        sum += r->seconds[p];
    }
    if (!(r->wall_seconds > 0) || sum > r->wall_seconds + 1e-9) {
        fprintf(stderr, "phases sum to %g s, wall %g s\n", sum,
                r->wall_seconds);
        return 0;
    }
    return 1;
}

/* The events from index from on: START/END matched per phase, in the
 * order want (n phases), PROGRESS only in WRITE and monotone. Returns 1. */
static int check_events(int from, int op, const int *want, int n,
                        int write_on_worker)
{
    int k = 0, open = -1;
    uint64_t last = 0;
    for (int i = from; i < nev; i++) {
        const struct rec *e = &evs[i];
        if (e->ev.op != op || e->ev.struct_size != sizeof(dcp_event)) {
            fprintf(stderr, "event %d: op %d\n", i, e->ev.op);
            return 0;
        }
        int worker_phase =
            e->ev.phase == DCP_PHASE_WRITE || e->ev.phase == DCP_PHASE_FSYNC;
        if (e->on_main == (worker_phase && write_on_worker)) {
            fprintf(stderr, "event %d (%s): on the %s thread\n", i,
                    dcp_phase_name(e->ev.phase),
                    e->on_main ? "caller's" : "writer");
            return 0;
        }
        switch (e->ev.kind) {
        case DCP_EVENT_START:
            if (open != -1 || k >= n || e->ev.phase != want[k]) {
                fprintf(stderr, "event %d: start of %s, want %s\n", i,
                        dcp_phase_name(e->ev.phase),
                        k < n ? dcp_phase_name(want[k]) : "none");
                return 0;
            }
            open = e->ev.phase;
            last = 0;
            break;
        case DCP_EVENT_PROGRESS:
            if ((open != DCP_PHASE_WRITE && open != DCP_PHASE_VERIFY) ||
                e->ev.phase != open || e->ev.bytes < last) {
                fprintf(stderr, "event %d: progress out of place\n", i);
                return 0;
            }
            last = e->ev.bytes;
            break;
        case DCP_EVENT_END:
            if (open != e->ev.phase || e->ev.seconds < 0 ||
                (open == DCP_PHASE_WRITE && e->ev.bytes != last) ||
                (open == DCP_PHASE_VERIFY && op == DCP_IO_LOAD &&
                 e->ev.bytes != last && last)) {
                fprintf(stderr, "event %d: end of %s unmatched\n", i,
                        dcp_phase_name(e->ev.phase));
                return 0;
            }
            open = -1;
            k++;
            break;
        default:
            return 0;
        }
    }
    if (open != -1 || k != n) {
        fprintf(stderr, "%d of %d phases seen\n", k, n);
        return 0;
    }
    return 1;
}

TEST(names)
{
    ASSERT_STR_EQ(dcp_phase_name(DCP_PHASE_PLAN), "plan");
    ASSERT_STR_EQ(dcp_phase_name(DCP_PHASE_COMMIT), "commit");
    ASSERT_STR_EQ(dcp_phase_name(DCP_PHASE_METADATA), "metadata");
    ASSERT_STR_EQ(dcp_phase_name(DCP_PHASE_COPY), "copy");
    ASSERT_STR_EQ(dcp_phase_name(DCP_PHASE_EXCHANGE), "exchange");
    ASSERT_STR_EQ(dcp_phase_name(11), "unknown");
    ASSERT_STR_EQ(dcp_phase_name(-1), "unknown");
    dcp_ctx *ctx = NULL;
    dcp_phase_report r;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    r.struct_size = sizeof r;
    ASSERT_OK(dcp_ctx_phase_report(ctx, DCP_IO_SAVE, &r));
    ASSERT_EQ(r.complete, 0);
    ASSERT(r.wall_seconds == 0);
    ASSERT_RC(dcp_ctx_phase_report(ctx, 2, &r), DCP_EINVAL);
    r.struct_size = 4;
    ASSERT_RC(dcp_ctx_phase_report(ctx, DCP_IO_SAVE, &r), DCP_EINVAL);
    ASSERT_RC(dcp_ctx_phase_report(NULL, DCP_IO_SAVE, &r), DCP_EINVAL);
    ASSERT_RC(dcp_ctx_set_event_callback(NULL, on_event, NULL), DCP_EINVAL);
    dcp_ctx_free(ctx);
}

TEST(sync_save_and_load)
{
    dcp_ctx *ctx = NULL;
    dcp_phase_report r;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT_OK(dcp_ctx_set_event_callback(ctx, on_event, NULL));
    dcp_state *st = make_state();
    nev = 0;
    ASSERT_OK(dcp_save(ctx, st, dirpath("sync"), NULL)); /* durable */
    ASSERT(check_report(ctx, DCP_IO_SAVE, &r));
    ASSERT(r.seconds[DCP_PHASE_WRITE] > 0);
    ASSERT(r.bytes[DCP_PHASE_WRITE] >= (uint64_t)NEL * 4);
    ASSERT_U64_EQ(r.bytes[DCP_PHASE_FSYNC], r.bytes[DCP_PHASE_WRITE]);
    ASSERT_U64_EQ(r.bytes[DCP_PHASE_STAGE], 0); /* host tensors: no copy */
    static const int want_save[] = {DCP_PHASE_PLAN, DCP_PHASE_WRITE,
                                    DCP_PHASE_FSYNC, DCP_PHASE_AGREE,
                                    DCP_PHASE_COMMIT};
    ASSERT(check_events(0, DCP_IO_SAVE, want_save, 5, 1));
    int nprog = 0;
    for (int i = 0; i < nev; i++)
        nprog += evs[i].ev.kind == DCP_EVENT_PROGRESS;
    ASSERT(nprog >= 2); /* one per record: the value and the tensor */

    nev = 0;
    memset(buf, 0, (size_t)NEL * 4);
    ASSERT_OK(dcp_load(ctx, st, dirpath("sync"), NULL));
    ASSERT(buf[NEL - 1] == (float)(NEL - 1));
    ASSERT(check_report(ctx, DCP_IO_LOAD, &r));
    ASSERT(r.bytes[DCP_PHASE_METADATA] > 0);
    ASSERT(r.bytes[DCP_PHASE_READ] >= (uint64_t)NEL * 4);
    ASSERT(r.seconds[DCP_PHASE_READ] > 0);
    static const int want_load[] = {DCP_PHASE_METADATA, DCP_PHASE_VERIFY,
                                    DCP_PHASE_READ, DCP_PHASE_COPY};
    ASSERT(check_events(0, DCP_IO_LOAD, want_load, 4, 1));
    /* dcp_verify: one VERIFY phase, progress per entry up to every byte;
     * the load's report unchanged. */
    dcp_phase_report before = r;
    nev = 0;
    ASSERT_OK(dcp_verify(ctx, dirpath("sync")));
    static const int want_verify[] = {DCP_PHASE_VERIFY};
    ASSERT(check_events(0, DCP_IO_LOAD, want_verify, 1, 1));
    ASSERT(nev == 4); /* start, two entries, end */
    ASSERT_U64_EQ(evs[nev - 1].ev.bytes, (uint64_t)NEL * 4 + evs[1].ev.bytes);
    ASSERT(check_report(ctx, DCP_IO_LOAD, &r));
    ASSERT(r.wall_seconds == before.wall_seconds);
    /* The save's report is still there; removing the callback stops
     * events. */
    ASSERT(check_report(ctx, DCP_IO_SAVE, &r));
    ASSERT_OK(dcp_ctx_set_event_callback(ctx, NULL, NULL));
    nev = 0;
    ASSERT_OK(dcp_save(ctx, st, dirpath("sync2"), &nosync));
    ASSERT_EQ(nev, 0);
    dcp_state_free(st);
    dcp_ctx_free(ctx);
}

TEST(async_save)
{
    dcp_ctx *ctx = NULL;
    dcp_request *req = NULL;
    dcp_phase_report r;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT_OK(dcp_ctx_set_event_callback(ctx, on_event, NULL));
    dcp_state *st = make_state();
    nev = 0;
    ASSERT_OK(dcp_save_async(ctx, st, dirpath("async"), &nosync, &req));
    /* In flight: no callback change, the report not complete. */
    ASSERT_RC(dcp_ctx_set_event_callback(ctx, NULL, NULL), DCP_EBUSY);
    r.struct_size = sizeof r;
    ASSERT_OK(dcp_ctx_phase_report(ctx, DCP_IO_SAVE, &r));
    ASSERT_EQ(r.complete, 0);
    ASSERT_OK(dcp_request_wait(req));
    dcp_request_free(req);
    ASSERT(check_report(ctx, DCP_IO_SAVE, &r));
    ASSERT_U64_EQ(r.bytes[DCP_PHASE_STAGE], (uint64_t)NEL * 4);
    ASSERT(r.bytes[DCP_PHASE_WRITE] >= (uint64_t)NEL * 4);
    static const int want[] = {DCP_PHASE_PLAN,  DCP_PHASE_STAGE,
                               DCP_PHASE_WRITE, DCP_PHASE_FSYNC,
                               DCP_PHASE_AGREE, DCP_PHASE_COMMIT};
    /* No budget: the staging finishes before the writer starts, so the
     * events come in this order. WRITE and FSYNC on the writer thread. */
    ASSERT(check_events(0, DCP_IO_SAVE, want, 6, 1));
    dcp_state_free(st);
    dcp_ctx_free(ctx);
}

int main(void)
{
    main_thread = pthread_self();
    buf = malloc((size_t)NEL * 4);
    if (!buf)
        abort();
    for (int i = 0; i < NEL; i++)
        buf[i] = (float)i;
    RUN(names);
    RUN(sync_save_and_load);
    RUN(async_save);
    free(buf);
    if (root[0]) {
        char cmd[600];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
        if (system(cmd) != 0)
            fprintf(stderr, "could not remove %s\n", root);
    }
    return TEST_SUMMARY();
}
