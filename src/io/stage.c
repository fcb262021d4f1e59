/*
 * Staging arena and pipe (see stage.h for the design). Synchronisation:
 * the counters are C11 atomics (sequentially consistent); a side that must
 * sleep takes the pipe's lock, counts itself in `waiters`, re-checks its
 * condition and waits on the condition variable; a side that advances a
 * counter stores it and then, only if `waiters` is nonzero, takes the lock
 * and broadcasts. Either the sleeper sees the new counter or the advancer
 * sees the sleeper (both are sequentially consistent), so no wakeup is
 * lost, and the common case costs no lock at all. What the stager wrote
 * into a piece happens before its `published` store, which the writer
 * reads before it touches the piece; the writer's `consumed` store comes
 * after its last read of a piece, which the stager reads before it reuses
 * the space.
 */
#include "stage.h"

#include <string.h>
#include <sys/mman.h> /* mmap, MAP_POPULATE */
#include <unistd.h>

#include "cuda.h"

#define PIECE_ALIGN 64

static uint64_t align_up(uint64_t x, uint64_t a)
{
    return (x + a - 1) / a * a;
}

/* --------------------------------------------------------------- arena */

static void arena_unmap(struct stg_arena *a)
{
    if (!a->p)
        return;
    if (a->pinned)
        dcp__cuda_host_unregister(a->p);
    (void)munmap(a->p, a->cap);
    a->p = NULL;
    a->cap = 0;
    a->pinned = 0;
}

int dcp__stage_arena_reserve(struct stg_arena **ap, size_t need, int pinned,
                             struct dcp_err *err)
{
    struct stg_arena *a = *ap;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    int rc;
    if (!a) {
        a = dcp__calloc(1, sizeof(*a));
        if (!a)
            return dcp__err(err, DCP_ENOMEM, "out of memory");
        *ap = a;
    }
    if (a->cap < need) {
        size_t size = (size_t)align_up(need, page);
        void *p;
        arena_unmap(a);
        /* MAP_POPULATE faults every page in now, once: a save that reuses
         * the arena copies at memcpy speed, without first-touch faults. */
        p = mmap(NULL, size, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
        if (p == MAP_FAILED)
            return dcp__err(err, DCP_ENOMEM,
                            "cannot allocate %zu bytes of staging buffers",
                            size);
        a->p = p;
        a->cap = size;
    }
    if (pinned && !a->pinned) {
        rc = dcp__cuda_open(err);
        if (rc == DCP_OK)
            rc = dcp__cuda_host_register(a->p, a->cap, err);
        if (rc != DCP_OK)
            return dcp__err_prefix(err,
                                   "cannot page-lock %zu bytes of "
                                   "staging buffers",
                                   a->cap);
        a->pinned = 1;
    }
    return DCP_OK;
}

void dcp__stage_arena_free(struct stg_arena *a)
{
    if (!a)
        return;
    arena_unmap(a);
    dcp__free(a);
}

/* ---------------------------------------------------------------- pipe */

uint64_t dcp__stage_need(const struct stg_src *src, size_t n)
{
    uint64_t t = 0;
    size_t i;
    for (i = 0; i < n; i++)
        t = align_up(t, PIECE_ALIGN) + src[i].n;
    return align_up(t, PIECE_ALIGN);
}

/* The next piece of the sequence; 0 when there is none. */
static int iter_next(const struct stg_pipe *p, struct stg_iter *it,
                     struct stg_piece *pc)
{
    uint64_t len, pos;
    while (it->src < p->nsrc && it->off >= p->src[it->src].n) {
        it->src++;
        it->off = 0;
    }
    if (it->src >= p->nsrc)
        return 0;
    len = p->src[it->src].n - it->off;
    if (len > p->maxpiece)
        len = p->maxpiece;
    pos = align_up(it->end, PIECE_ALIGN);
    if (pos % p->cap + len > p->cap)
        pos = align_up(pos, p->cap); /* wrap: skip the ring's tail */
    pc->src = it->src;
    pc->off = it->off;
    pc->len = len;
    pc->pos = pos;
    pc->k = it->k;
    it->off += len;
    it->end = pos + len;
    it->k++;
    return 1;
}

int dcp__stage_pipe_init(struct stg_pipe *p, const struct stg_src *src,
                         size_t nsrc, uint8_t *ring, uint64_t cap,
                         struct dcp_err *err)
{
    memset(p, 0, sizeof(*p));
    p->src = src;
    p->nsrc = nsrc;
    p->ring = ring;
    p->cap = cap;
    if (dcp__stage_need(src, nsrc) <= cap) {
        p->maxpiece = UINT64_MAX;
    } else {
        /* A quarter of the ring: a piece plus the tail it may skip always
         * fit in an empty ring, and the writer drains while the stager
         * fills the rest. Page multiples when the ring is large enough. */
        p->maxpiece = cap / 4 >= 4096 ? cap / 4 / 4096 * 4096
                                      : cap / 4 / PIECE_ALIGN * PIECE_ALIGN;
        p->eager = 1;
    }
    atomic_init(&p->published, 0);
    atomic_init(&p->consumed, 0);
    atomic_init(&p->stop, 0);
    atomic_init(&p->waiters, 0);
    if (pthread_mutex_init(&p->mu, NULL) != 0)
        return dcp__err(err, DCP_ENOMEM, "cannot create a mutex");
    if (pthread_cond_init(&p->cv, NULL) != 0) {
        (void)pthread_mutex_destroy(&p->mu);
        return dcp__err(err, DCP_ENOMEM, "cannot create a condition variable");
    }
    return DCP_OK;
}

void dcp__stage_pipe_destroy(struct stg_pipe *p)
{
    (void)pthread_cond_destroy(&p->cv);
    (void)pthread_mutex_destroy(&p->mu);
}

static void wake(struct stg_pipe *p)
{
    if (atomic_load(&p->waiters)) {
        (void)pthread_mutex_lock(&p->mu);
        (void)pthread_cond_broadcast(&p->cv);
        (void)pthread_mutex_unlock(&p->mu);
    }
}

void dcp__stage_stop(struct stg_pipe *p)
{
    atomic_store(&p->stop, 1);
    (void)pthread_mutex_lock(&p->mu);
    (void)pthread_cond_broadcast(&p->cv);
    (void)pthread_mutex_unlock(&p->mu);
}

/* Sleeps until consumed >= want (returns 1) or the pipe stops (0). */
static int wait_consumed(struct stg_pipe *p, uint64_t want)
{
    int ok;
    if (atomic_load(&p->consumed) >= want)
        return 1;
    (void)pthread_mutex_lock(&p->mu);
    atomic_fetch_add(&p->waiters, 1);
    while (atomic_load(&p->consumed) < want && !atomic_load(&p->stop))
        (void)pthread_cond_wait(&p->cv, &p->mu);
    atomic_fetch_sub(&p->waiters, 1);
    ok = atomic_load(&p->consumed) >= want;
    (void)pthread_mutex_unlock(&p->mu);
    return ok;
}

/* Sleeps until published > k (returns 1) or the pipe stops (0). */
static int wait_published(struct stg_pipe *p, size_t k)
{
    int ok;
    if (atomic_load(&p->published) > k)
        return 1;
    (void)pthread_mutex_lock(&p->mu);
    atomic_fetch_add(&p->waiters, 1);
    while (atomic_load(&p->published) <= k && !atomic_load(&p->stop))
        (void)pthread_cond_wait(&p->cv, &p->mu);
    atomic_fetch_sub(&p->waiters, 1);
    ok = atomic_load(&p->published) > k;
    (void)pthread_mutex_unlock(&p->mu);
    return ok;
}

/* Makes pieces [0, k) visible to the writer, CUDA copies completed
 * first. */
static int publish(struct stg_pipe *p, size_t k, int *cuda_pending,
                   struct dcp_err *err)
{
    if (*cuda_pending) {
        int rc = dcp__cuda_sync(err);
        if (rc != DCP_OK)
            return rc;
        *cuda_pending = 0;
    }
    if (atomic_load(&p->published) < k) {
        atomic_store(&p->published, k);
        wake(p);
    }
    return DCP_OK;
}

int dcp__stage_run(struct stg_pipe *p, struct dcp_err *err)
{
    struct stg_iter it;
    struct stg_piece pc;
    int rc = DCP_OK, cuda_pending = 0;
    memset(&it, 0, sizeof(it));
    while (rc == DCP_OK && iter_next(p, &it, &pc)) {
        const struct stg_src *s = &p->src[pc.src];
        uint8_t *dst;
        if (pc.pos + pc.len > p->cap) {
            uint64_t want = pc.pos + pc.len - p->cap;
            if (atomic_load(&p->consumed) < want) {
                rc = publish(p, pc.k, &cuda_pending, err);
                if (rc == DCP_OK && !wait_consumed(p, want))
                    rc = dcp__err(err, DCP_EIO, "staging stopped");
                if (rc != DCP_OK)
                    break;
            }
        }
        dst = p->ring + pc.pos % p->cap;
        if (s->cuda) {
            rc = dcp__cuda_copy_async(dst, (const uint8_t *)s->p + pc.off,
                                      (size_t)pc.len, err);
            cuda_pending = 1;
        } else if (s->gather) {
            s->gather(s->ud, pc.off, pc.len, dst);
        } else {
            memcpy(dst, (const uint8_t *)s->p + pc.off, (size_t)pc.len);
        }
        if (rc == DCP_OK && p->eager)
            rc = publish(p, pc.k + 1, &cuda_pending, err);
        if (rc == DCP_OK && atomic_load(&p->stop))
            rc = dcp__err(err, DCP_EIO, "staging stopped");
    }
    if (rc == DCP_OK)
        rc = publish(p, it.k, &cuda_pending, err);
    if (rc != DCP_OK) {
        if (cuda_pending)
            (void)dcp__cuda_sync(NULL); /* no copy may land later */
        dcp__stage_stop(p);
    }
    return rc;
}

int dcp__stage_next(struct stg_pipe *p, const void **data, size_t *len,
                    size_t *src, uint64_t *off, struct dcp_err *err)
{
    struct stg_piece pc;
    if (atomic_load(&p->stop))
        return dcp__err(err, DCP_EIO, "staging stopped");
    if (!iter_next(p, &p->wit, &pc))
        return dcp__err(err, DCP_EIO, "staging: no piece left (internal)");
    if (!wait_published(p, pc.k))
        return dcp__err(err, DCP_EIO, "staging stopped");
    p->wcur = pc;
    *data = p->ring + pc.pos % p->cap;
    *len = (size_t)pc.len;
    *src = pc.src;
    *off = pc.off;
    return DCP_OK;
}

void dcp__stage_release(struct stg_pipe *p)
{
    atomic_store(&p->consumed, p->wcur.pos + p->wcur.len);
    wake(p);
}
