/*
 * dcp checkpoint manager: a root directory of step-named checkpoints
 * ("step-100", "step-200", ... as torchtitan names them), the latest
 * complete one found for a restart, retention after each commit, a save
 * interval, a "save now" request a signal handler may make, and at most one
 * asynchronous save in flight.
 *
 * A checkpoint of the root is COMPLETE when its directory (a real
 * directory, not a symbolic link) holds a `.metadata` that decodes
 * (dcp_metadata_open). Anything else under the root is either a step
 * directory that is not complete (a save in flight or interrupted, a
 * half-removed one, a corrupt `.metadata`), reported by dcp_manager_list
 * and never loaded, retained or removed by the manager, or an entry whose
 * name is not a step name, ignored.
 *
 * Removal (retention, dcp_manager_prune, dcp_manager_remove) is crash safe:
 * `.metadata` is unlinked first and the directory synced, then the data
 * files, then the directory itself; a removal killed at any point leaves a
 * step that is not complete, never one that loads half. A removal never
 * goes through a symbolic link and never removes what is not a checkpoint
 * file: a step entry that is a link, or a directory holding a subdirectory
 * or a file other than `.metadata`, `.metadata.*`, `*.distcp`, `.lock` and
 * `.lock.*`, is refused (DCP_EUNSAFE naming it, nothing removed). A
 * removal takes the directory's one-writer lock first (as dcp_save does):
 * a save or import writing there makes it DCP_EBUSY, nothing removed.
 *
 * A local root is scanned and its steps removed with the POSIX file
 * system directly (not the context's storage back end: links and
 * directory syncs are POSIX notions); an "s3://bucket/prefix" root
 * through the S3 back end, where a step is the key prefix
 * "<root>/step-<N>/": listed from the bucket's keys, removed `.metadata`
 * first, then every other object under it, under its lock (an object that
 * is not a checkpoint file, or one lying deeper, is refused as above).
 * Saves and loads go through the context as dcp_save / dcp_load.
 *
 * A dcp_manager is used by one thread at a time, except
 * dcp_manager_request_save, which any thread or signal handler may call.
 */
#ifndef DCP_DCP_MANAGER_H
#define DCP_DCP_MANAGER_H

#include "dcp.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Manager options. Zero-initialise, set struct_size =
 * sizeof(dcp_manager_options); zero fields take the defaults. A caller
 * built against an older header passes its smaller struct_size and gets the
 * defaults for the fields it does not know.
 */
typedef struct dcp_manager_options {
    uint32_t struct_size;
    /* Step directory name: prefix, the step in decimal (no sign, no
     * leading zero), suffix. NULL prefix: "step-"; NULL suffix: "". Neither
     * may hold '/', and the prefix may not end, nor the suffix begin, with
     * a digit (DCP_EINVAL), so that a name has one reading. */
    const char *prefix;
    const char *suffix;
    /* dcp_manager_step saves when step % interval == 0 (0: only when a
     * save was requested). */
    int64_t interval;
    /* Retention, applied after each commit: keep the keep_last newest
     * complete checkpoints (0: keep all) and, beside them, every complete
     * checkpoint whose step is a multiple of keep_every (0: none). The
     * newest complete checkpoint is always kept. */
    uint32_t keep_last;
    int64_t keep_every;
    /* 1: saves are asynchronous (dcp_save_async), completed by the next
     * save, dcp_manager_wait, dcp_manager_latest/_load_latest or
     * dcp_manager_free; 0: dcp_save. */
    int async;
    /* Options passed to every save (NULL: defaults); copied.
     * DCP_SAVE_RANK_LOCAL is refused (DCP_EINVAL): a step is complete when
     * its .metadata exists. */
    const dcp_save_options *save_opts;
} dcp_manager_options;

typedef struct dcp_manager dcp_manager;

/*
 * Makes a manager over root for ctx (borrowed: it must outlive the
 * manager). Rank 0 creates root (and its parents) when missing (an s3://
 * root: checks that its bucket can be listed). Collective
 * over the context's communicator: every rank must pass the same root and
 * options; every rank returns the same code.
 * Returns DCP_OK, DCP_EINVAL (NULL argument, bad options, options or root
 * differing between ranks), DCP_EIO (root not creatable or not a
 * directory), DCP_ENOMEM; the message (dcp_errmsg(ctx)) names the root.
 * On failure *out is NULL.
 */
DCP_API int dcp_manager_create(dcp_manager **out, dcp_ctx *ctx,
                               const char *root,
                               const dcp_manager_options *opts);

/*
 * Completes a save in flight (as dcp_manager_wait, collectively), applies
 * retention and frees m; its result is lost (call dcp_manager_wait first
 * to see it). Collective when a save is in flight. NULL: no-op.
 */
DCP_API void dcp_manager_free(dcp_manager *m);

/*
 * Asks for a save at the next dcp_manager_step, whatever the interval (for
 * preemption: SIGTERM, SIGUSR1). Async-signal-safe: it only stores 1 into a
 * volatile sig_atomic_t of m; safe from any thread and from a signal
 * handler. Not collective: the ranks agree at the next step whether any of
 * them was asked.
 */
DCP_API void dcp_manager_request_save(dcp_manager *m);

/*
 * The step boundary of a training loop: saves state as step when step is a
 * multiple of the interval or when dcp_manager_request_save was called on
 * any rank since the last save (the ranks agree with one allreduce), and
 * sets *did_save (may be NULL) to 1 then, 0 otherwise. The save is
 * dcp_manager_save's. Collective: every rank passes the same step
 * (DCP_EINVAL otherwise, on every rank). Returns the codes of
 * dcp_manager_save.
 *
 * Step semantics: call it after step N's work, so that checkpoint N holds
 * the state after step N; a resumed loop then goes on from N + 1 (the
 * step dcp_manager_load_latest returns, plus one; 0 on DCP_ENOENT), and
 * no step runs twice. (The manager stores whatever state is passed under
 * the step given; this is the reading the README's loop and torchtitan
 * use.)
 */
DCP_API int dcp_manager_step(dcp_manager *m, const dcp_state *state,
                             int64_t step, int *did_save);

/*
 * Saves state into root/<prefix><step><suffix>. First completes the save
 * in flight, if any, and applies retention; then saves: with the async
 * option the call returns after staging (dcp_save_async: the buffers may
 * be changed on return) and the save commits at the next completion;
 * otherwise it commits before returning and retention is applied. Step
 * must be >= 0. Retention never removes the checkpoint in flight nor the
 * newest complete one, and counts only committed checkpoints. Collective.
 * Returns DCP_OK, the codes of dcp_save / dcp_request_wait (a failure of
 * the previous async save is returned here, and nothing new is started),
 * or a retention failure (DCP_EIO, DCP_EUNSAFE: the save itself is
 * committed; the message says which step could not be removed).
 */
DCP_API int dcp_manager_save(dcp_manager *m, const dcp_state *state,
                             int64_t step);

/*
 * Completes the save in flight, if any (dcp_request_wait), and applies
 * retention. Collective. Returns DCP_OK when none was in flight or it
 * committed, else its code; or a retention failure as dcp_manager_save.
 */
DCP_API int dcp_manager_wait(dcp_manager *m);

/*
 * The step of the newest complete checkpoint under root, found by rank 0
 * and broadcast, so that every rank sees the same answer. Completes a save
 * in flight first. Collective.
 * Returns DCP_OK with *step set, DCP_ENOENT (no complete checkpoint;
 * *step = -1), DCP_EIO (root unreadable), DCP_ENOMEM, or any code of
 * dcp_manager_list: a listing that fails (a cut-short or malformed answer
 * of an object store: DCP_EFORMAT) is never DCP_ENOENT.
 */
DCP_API int dcp_manager_latest(dcp_manager *m, int64_t *step);

/*
 * The path of step's checkpoint: root/<prefix><step><suffix> (what
 * dcp_manager_save writes and dcp_manager_load_latest loads), in *out, a
 * string the caller frees with dcp_free(). The step need not exist. Not
 * collective; touches no storage. Returns DCP_OK, DCP_EINVAL (NULL m or
 * out, step < 0; *out NULL), DCP_ENOMEM.
 */
DCP_API int dcp_manager_path(const dcp_manager *m, int64_t step, char **out);

/*
 * dcp_manager_latest, then dcp_load of that checkpoint into state (opts as
 * dcp_load's, may be NULL). *step (may be NULL) is the step loaded, -1 on
 * DCP_ENOENT. Collective. Returns the codes of dcp_manager_latest and
 * dcp_load.
 */
DCP_API int dcp_manager_load_latest(dcp_manager *m, dcp_state *state,
                                    int64_t *step,
                                    const dcp_load_options *opts);

/* What dcp_manager_list says of a step entry. Appended values only. */
enum dcp_manager_status {
    DCP_MANAGER_COMPLETE = 0,   /* a directory whose .metadata decodes */
    DCP_MANAGER_INCOMPLETE = 1, /* a directory without .metadata */
    DCP_MANAGER_CORRUPT = 2,    /* a .metadata that does not decode */
    DCP_MANAGER_LINK = 3,       /* a symbolic link (never followed) */
    DCP_MANAGER_NOTDIR = 4      /* a step name that is not a directory */
};

/* One step entry of a root. The library hands out arrays of it, so its
 * layout is fixed for this major version: new information comes through
 * new functions, never new fields. */
typedef struct dcp_manager_entry {
    int64_t step;
    int status;  /* enum dcp_manager_status */
    char *name;  /* the entry's name under root */
    char *error; /* CORRUPT: why the .metadata does not decode; else NULL */
} dcp_manager_entry;

/*
 * Lists the step entries of root (names matching opts' pattern; opts may
 * be NULL for the defaults; only prefix and suffix are read), sorted by
 * step. Entries whose name is not a step name are left out. Not
 * collective; ctx (may have any communicator) gives the limits and the
 * error message. *out is an array of *n entries freed with
 * dcp_manager_list_free (NULL when *n is 0).
 * Returns DCP_OK, DCP_ENOENT (no root), DCP_EIO (root unreadable or not a
 * directory), DCP_EINVAL, DCP_ENOMEM; the message names the root. On an
 * s3:// root: no DCP_ENOENT (an empty prefix lists no entries; a missing
 * bucket is DCP_EIO), DCP_EFORMAT for a listing answer that is cut short
 * or malformed (docs/RELIABILITY.md), and a step whose .metadata cannot be
 * read (DCP_EIO, DCP_ETIMEOUT, DCP_EINVAL) fails the call with that code
 * rather than be listed corrupt.
 */
DCP_API int dcp_manager_list(dcp_ctx *ctx, const char *root,
                             const dcp_manager_options *opts,
                             dcp_manager_entry **out, size_t *n);
DCP_API void dcp_manager_list_free(dcp_manager_entry *entries, size_t n);

/*
 * Retention by hand: removes the complete checkpoints of root that the
 * retention of opts (keep_last, keep_every; prefix, suffix) does not keep,
 * oldest first, crash safe. The newest complete checkpoint is always kept;
 * entries that are not complete are left alone. *removed (may be NULL)
 * gets the number removed. Not collective: run it where no save to root is
 * in flight (a manager applies retention itself).
 * Returns DCP_OK, the codes of dcp_manager_list, DCP_EIO, DCP_EUNSAFE.
 */
DCP_API int dcp_manager_prune(dcp_ctx *ctx, const char *root,
                              const dcp_manager_options *opts, size_t *removed);

/*
 * Removes one checkpoint directory, crash safe: `.metadata` first (and the
 * directory synced), then every other file, then the directory (and its
 * parent synced). Refuses (DCP_EUNSAFE, nothing removed) when dir is a
 * symbolic link, not a directory, or holds a subdirectory or a file other
 * than `.metadata`, `.metadata.*`, `*.distcp`, a data file's temporary
 * (`__<r>_<n>[.<tag>].distcp.<pid>-<n>-<hex>.tmp`: a killed peer
 * replication's, dcp_clean), `.lock` and `.lock.*`;
 * DCP_EBUSY (nothing removed, the message naming the writer) when a live
 * save or import holds the directory's lock. Not collective.
 * Returns DCP_OK, DCP_ENOENT, DCP_EUNSAFE, DCP_EBUSY, DCP_EIO, DCP_EINVAL;
 * the message names the path.
 */
DCP_API int dcp_manager_remove(dcp_ctx *ctx, const char *dir);

#ifdef __cplusplus
}
#endif

#endif /* DCP_DCP_MANAGER_H */
