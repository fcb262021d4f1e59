/*
 * DESIGN. The worker is a thread with a mailbox of one job.
 *  - Queue: at most one job at a time. dcp__worker_post stores (fn, arg)
 *    and wakes the thread; the caller (request.c) waits for the previous job
 *    before it posts the next, so FIFO order is trivially kept.
 *  - Completion: the thread clears `busy` under the lock once fn returns
 *    and broadcasts; dcp__worker_idle reads it, dcp__worker_wait sleeps on
 *    it. The job's own results live in its argument, written before fn
 *    returns, so everything the job wrote happens before `busy` is seen
 *    clear (the lock orders them).
 *  - Cancel: not the worker's business; a job watches its own stop flag
 *    (stage.c) and returns early.
 *  - Shutdown: dcp__worker_free waits for the job, sets `quit`, wakes the
 *    thread and joins it.
 * Lock order: the worker's lock is a leaf (no other lock is taken while it
 * is held). The thread blocks every signal, so the application's handlers
 * never run on it. On Linux it runs under SCHED_BATCH: same CPU share as
 * any thread, but its wake-ups (a job posted, a write completed) never
 * preempt the caller's thread, whose blocking time is what an asynchronous
 * save is for. With a niceness (dcp_ctx_options.worker_nice) it also
 * yields the CPU to the program's threads: setpriority on its own thread
 * id, which Linux applies to that thread alone.
 */
#include "worker.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h> /* SCHED_BATCH */
#include <signal.h>
#include <string.h>
#include <sys/resource.h> /* setpriority */
#if defined(__linux__)
#include <sys/syscall.h> /* SYS_gettid */
#include <unistd.h>
#endif

#if defined(__linux__) && !defined(SCHED_BATCH)
#define SCHED_BATCH 3 /* <linux/sched.h>; glibc shows it with _GNU_SOURCE */
#endif

struct dcp_worker {
    pthread_t th;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    dcp_job_fn fn; /* the job posted, NULL once taken */
    void *arg;
    int busy; /* a job is posted or running */
    int quit;
    int nice; /* added to the thread's niceness when it starts */
};

static void *worker_main(void *p)
{
    struct dcp_worker *w = p;
#ifdef SCHED_BATCH
    {
        struct sched_param sp;
        memset(&sp, 0, sizeof(sp));
        (void)pthread_setschedparam(pthread_self(), SCHED_BATCH, &sp);
    }
#endif
#if defined(__linux__)
    if (w->nice > 0) {
        /* getpriority's -1 is also a valid niceness: errno tells */
        id_t tid = (id_t)syscall(SYS_gettid);
        int cur;
        errno = 0;
        cur = getpriority(PRIO_PROCESS, tid);
        if (errno == 0)
            (void)setpriority(PRIO_PROCESS, tid,
                              cur + w->nice > 19 ? 19 : cur + w->nice);
    }
#endif
    (void)pthread_mutex_lock(&w->mu);
    for (;;) {
        dcp_job_fn fn;
        void *arg;
        while (!w->fn && !w->quit)
            (void)pthread_cond_wait(&w->cv, &w->mu);
        if (!w->fn)
            break; /* quit, and no job left */
        fn = w->fn;
        arg = w->arg;
        w->fn = NULL;
        (void)pthread_mutex_unlock(&w->mu);
        fn(arg);
        (void)pthread_mutex_lock(&w->mu);
        w->busy = 0;
        (void)pthread_cond_broadcast(&w->cv);
    }
    (void)pthread_mutex_unlock(&w->mu);
    return NULL;
}

static int worker_create(struct dcp_worker **out, int nice,
                         struct dcp_err *err)
{
    struct dcp_worker *w = dcp__calloc(1, sizeof(*w));
    sigset_t all, old;
    int e;
    if (!w)
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    w->nice = nice;
    if (pthread_mutex_init(&w->mu, NULL) != 0) {
        dcp__free(w);
        return dcp__err(err, DCP_ENOMEM, "cannot create a mutex");
    }
    if (pthread_cond_init(&w->cv, NULL) != 0) {
        (void)pthread_mutex_destroy(&w->mu);
        dcp__free(w);
        return dcp__err(err, DCP_ENOMEM, "cannot create a condition variable");
    }
    (void)sigfillset(&all);
    (void)pthread_sigmask(SIG_SETMASK, &all, &old);
    e = pthread_create(&w->th, NULL, worker_main, w);
    (void)pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (e != 0) {
        (void)pthread_cond_destroy(&w->cv);
        (void)pthread_mutex_destroy(&w->mu);
        dcp__free(w);
        return dcp__err(err, DCP_EIO,
                        "cannot start the background writer thread "
                        "(error %d)",
                        e);
    }
    *out = w;
    return DCP_OK;
}

int dcp__worker_post(struct dcp_worker **wp, int nice, dcp_job_fn fn,
                     void *arg, struct dcp_err *err)
{
    struct dcp_worker *w;
    if (!*wp) {
        int rc = worker_create(wp, nice, err);
        if (rc != DCP_OK)
            return rc;
    }
    w = *wp;
    (void)pthread_mutex_lock(&w->mu);
    w->fn = fn;
    w->arg = arg;
    w->busy = 1;
    (void)pthread_cond_broadcast(&w->cv);
    (void)pthread_mutex_unlock(&w->mu);
    return DCP_OK;
}

int dcp__worker_idle(struct dcp_worker *w)
{
    int busy;
    if (!w)
        return 1;
    (void)pthread_mutex_lock(&w->mu);
    busy = w->busy;
    (void)pthread_mutex_unlock(&w->mu);
    return !busy;
}

void dcp__worker_wait(struct dcp_worker *w)
{
    if (!w)
        return;
    (void)pthread_mutex_lock(&w->mu);
    while (w->busy)
        (void)pthread_cond_wait(&w->cv, &w->mu);
    (void)pthread_mutex_unlock(&w->mu);
}

void dcp__worker_free(struct dcp_worker *w)
{
    if (!w)
        return;
    dcp__worker_wait(w);
    (void)pthread_mutex_lock(&w->mu);
    w->quit = 1;
    (void)pthread_cond_broadcast(&w->cv);
    (void)pthread_mutex_unlock(&w->mu);
    (void)pthread_join(w->th, NULL);
    (void)pthread_cond_destroy(&w->cv);
    (void)pthread_mutex_destroy(&w->mu);
    dcp__free(w);
}
