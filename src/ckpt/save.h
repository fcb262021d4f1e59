/*
 * The collective save, cut into the parts that dcp_save and dcp_save_async
 * (request.c) run on different threads:
 *   begin    caller's thread, collective: plans (steps 1-2 of save.c) and
 *            prepares this rank's records;
 *   staging  caller's thread, local: the staging pipe copies the tensors
 *            that must not be read later (all of them for an asynchronous
 *            save, CUDA ones always) into the context's staging buffers;
 *   write    worker thread, local, no communication: the data file;
 *   finish   caller's thread, collective: agreement and commit.
 * A failure after begin is the job's (first error wins, any thread) and is
 * agreed on by finish, so begin and finish are the only collective calls.
 */
#ifndef DCP_SAVE_H
#define DCP_SAVE_H

#include "ctx.h"

struct sv_job;

/*
 * Steps 1-2 and the local preparation. rc is a failure found before (it
 * joins the first agreement). Collective; returns the agreed code. On
 * DCP_OK *job is set (it may already hold a local failure).
 */
int dcp__save_begin(dcp_ctx *ctx, const dcp_state *st, const char *path,
                    const dcp_save_options *opts, int rc, struct sv_job **job);

/* Sets up staging through ctx's arena for the records that need it (every
 * tensor when copy_all). Local; a failure is the job's (returned too). */
int dcp__save_prepare_staging(dcp_ctx *ctx, struct sv_job *job, int copy_all);

/* 1 when the staging buffers hold every staged byte at once (or nothing
 * is staged): staging then needs no writer, so it can run before the
 * worker starts; 0 when the writer must drain pieces while staging runs. */
int dcp__save_stage_alone(const struct sv_job *job);

/* Runs the stager (caller's thread); a failure is the job's. Returns when
 * every staged byte is in the staging buffers, or the job failed. Timed as
 * phase STAGE in ctx's report. */
void dcp__save_stage(dcp_ctx *ctx, struct sv_job *job);

/* The worker's part: writes and fsyncs this rank's data file (a
 * dcp_job_fn). Timed as phases WRITE and FSYNC in the job's own recorder
 * (events on the worker thread), merged into the context's report by
 * dcp__save_finish. */
void dcp__save_write(void *job);

/* Agreement and commit; the worker must be done. Collective; the agreed
 * code, with the message in ctx's err. */
int dcp__save_finish(dcp_ctx *ctx, struct sv_job *job);

/* Records a failure (first one wins; thread safe) and stops the staging
 * pipe. Returns rc. */
int dcp__save_fail(struct sv_job *job, int rc, const struct dcp_err *e);

/* The job's failure code so far (DCP_OK when none). */
int dcp__save_failed(struct sv_job *job);

const char *dcp__save_path(const struct sv_job *job);

/* Frees the context's cached save plan (save.c, "plan cache"), if any. */
void dcp__save_cache_drop(dcp_ctx *ctx);

/* Frees the job (the worker must be done with it); a job that did not
 * finish removes the data file it wrote. NULL: no-op. */
void dcp__save_job_free(struct sv_job *job);

/*
 * Test hook: makes the k-th data file write from now on fail with DCP_EIO
 * (k >= 1), or none (k = 0). Returns the writes counted since the last
 * call. (A failing storage back end replaces it once storage has a
 * vtable.)
 */
uint64_t dcp__save_write_fail_after(uint64_t k);

/* Pieces shared with parts.c (a save planned elsewhere, dcp_parts.h). */
struct io_writer;
struct dcp_metadata;
/* A tensor record of nbytes packed bytes at src (borrowed until the
 * writer finishes), with the save id sid ("" for none); *off and *len get
 * its extent. */
int dcp__save_rec_tensor(struct io_writer *w, const char *key, dcp_dtype dt,
                         int ndim, const int64_t *size, const void *src,
                         uint64_t nbytes, const char *sid, uint64_t *off,
                         uint64_t *len);
/* A record of n bytes given whole (copied). */
int dcp__save_rec_bytes(struct io_writer *w, const void *p, size_t n,
                        uint64_t *off, uint64_t *len);
/* An upper bound of a record's bytes in a data file. */
uint64_t dcp__save_rec_bound(uint64_t nbytes);
/* Removes the data files of the checkpoint old that md does not name
 * (after md's commit; best effort). */
void dcp__save_remove_old(int dirfd, const struct dcp_metadata *old,
                          const struct dcp_metadata *md);
/* 16 hex digits of a fresh random id. */
void dcp__save_random_tag(char *out, size_t n);

#endif /* DCP_SAVE_H */
