/*
 * memstore: an in-memory storage back end of version 2 (dcp_storage.h), the
 * shape of an object store: one flat namespace of objects (directory paths
 * are accepted and ignored), no rename needed by dcp (publish is native),
 * objects written through a handle become visible whole when it is closed
 * or completed, and read_at/write_at served concurrently from several
 * threads up to a declared max_inflight. It counts the requests in flight
 * at once (max_seen) so tests can check the I/O engine drives it in
 * parallel, each request held delay_us to make overlap observable, and can
 * fail publish with an injected code (nothing changes).
 */
#ifndef DCP_MEMSTORE_H
#define DCP_MEMSTORE_H

#include <dcp/dcp.h>
#include <dcp/dcp_storage.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define MS_MAX_OBJECTS 256

struct ms_object {
    char name[DCP_STORAGE_NAME_MAX + 1];
    uint8_t *p;
    size_t len;
};

struct memstore {
    /* ---- configuration ---- */
    uint32_t max_inflight; /* declared in the ops (ms_ops) */
    unsigned delay_us;     /* each read_at/write_at sleeps this long */
    int fail_publish;      /* a DCP_E* code: publish fails, changing nothing */
    int fail_write_at;     /* the k-th write_at (1-based) fails: DCP_ENOSPC */
    int fail_read_at;      /* the k-th read_at (1-based) fails: DCP_EIO */
    /* ---- state ---- */
    pthread_mutex_t mu;
    struct ms_object obj[MS_MAX_OBJECTS];
    size_t nobj;
    atomic_int inflight, max_seen;
    atomic_int reads, writes;
    int publishes, renames, puts; /* under mu */
    int open_handles;             /* under mu */
    dcp_storage_ops ops;          /* the table, max_inflight filled in */
};

void ms_init(struct memstore *m, uint32_t max_inflight);
void ms_free(struct memstore *m);
/* The table (version 2, every member set); impl is the memstore. */
const dcp_storage_ops *ms_ops(struct memstore *m);
/* The object called name, or NULL. Not thread safe against writers. */
const struct ms_object *ms_find(struct memstore *m, const char *name);

#endif /* DCP_MEMSTORE_H */
