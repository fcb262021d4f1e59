/*
 * The background worker: one thread per context, started at the first job,
 * joined when the context is freed. It runs one job at a time (a save's
 * file writing); it never calls the communicator.
 */
#ifndef DCP_WORKER_H
#define DCP_WORKER_H

#include "util.h"

struct dcp_worker;

/* A job: fn(arg) runs on the worker thread. */
typedef void (*dcp_job_fn)(void *arg);

/*
 * Hands fn(arg) to the worker of *w, creating the worker (and its thread)
 * first when *w is NULL, its niceness raised by nice (0..19; Linux: the
 * thread's own; a failure to set it is ignored). The worker must be idle
 * (dcp__worker_wait). Returns DCP_OK, DCP_ENOMEM, DCP_EIO (no thread could
 * be created); on failure fn is not run.
 */
int dcp__worker_post(struct dcp_worker **w, int nice, dcp_job_fn fn,
                     void *arg, struct dcp_err *err);

/* 1 when the last job posted has returned (or none was), else 0. Does not
 * block. */
int dcp__worker_idle(struct dcp_worker *w);

/* Blocks until the last job posted has returned. NULL is a no-op. */
void dcp__worker_wait(struct dcp_worker *w);

/* Waits for the job, stops and joins the thread, frees w. NULL: no-op. */
void dcp__worker_free(struct dcp_worker *w);

#endif /* DCP_WORKER_H */
