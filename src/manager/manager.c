/*
 * The checkpoint manager (dcp_manager.h): step names, the root's listing,
 * the latest complete checkpoint (found on rank 0, broadcast), retention,
 * crash-safe removal, the save interval and the "save now" flag, one
 * asynchronous save in flight.
 *
 * A POSIX root is scanned and its steps removed with POSIX calls directly
 * (openat/fstatat/unlinkat with O_NOFOLLOW: symbolic links and directory
 * syncs are POSIX notions); an s3:// root through the storage layer
 * (dcp__fs_list_dirs for the steps, dcp__fs_list/dcp__fs_unlink inside
 * one), in the same order.
 */
#define _GNU_SOURCE /* O_DIRECTORY, O_NOFOLLOW, fdopendir */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dcp/dcp_manager.h"

#include "comm.h"
#include "ctx.h"
#include "lock.h"
#include "manager.h"
#include "meta.h"
#include "read.h"
#include "storage.h"
#include "util.h"

struct dcp_manager {
    dcp_ctx *ctx; /* borrowed */
    char *root;
    char *prefix;
    char *suffix;
    int64_t interval;
    uint32_t keep_last;
    int64_t keep_every;
    int async;
    int has_save_opts;
    dcp_save_options save_opts;
    dcp_request *req;      /* the save in flight, NULL when none */
    int64_t inflight_step; /* its step, -1 when none */
    volatile sig_atomic_t requested;
};

/* ---------------------------------------------------------------------- */
/* Names                                                                  */
/* ---------------------------------------------------------------------- */

static int is_digit(char c)
{
    return c >= '0' && c <= '9';
}

int dcp__mgr_pattern(const dcp_manager_options *o, const char **prefix,
                     const char **suffix, struct dcp_err *err)
{
    const char *p = "step-", *s = "";
    if (o && o->struct_size >=
                 offsetof(dcp_manager_options, suffix) + sizeof(o->suffix)) {
        if (o->prefix)
            p = o->prefix;
        if (o->suffix)
            s = o->suffix;
    }
    if (strchr(p, '/') || strchr(s, '/'))
        return dcp__err(err, DCP_EINVAL,
                        "step name prefix \"%s\" or suffix \"%s\" holds '/'", p,
                        s);
    if ((*p && is_digit(p[strlen(p) - 1])) || is_digit(s[0]))
        return dcp__err(err, DCP_EINVAL,
                        "step name prefix \"%s\" ends or suffix \"%s\" begins "
                        "with a digit",
                        p, s);
    *prefix = p;
    *suffix = s;
    return DCP_OK;
}

int dcp__mgr_parse(const char *name, const char *prefix, const char *suffix,
                   int64_t *step)
{
    size_t n = strlen(name), np = strlen(prefix), ns = strlen(suffix);
    if (n <= np + ns || strncmp(name, prefix, np) != 0 ||
        strcmp(name + n - ns, suffix) != 0)
        return 0;
    const char *d = name + np, *e = name + n - ns;
    if (*d == '0' && e - d > 1)
        return 0; /* one reading per step: no leading zero */
    int64_t v = 0;
    for (; d < e; d++) {
        if (!is_digit(*d) || v > (INT64_MAX - (*d - '0')) / 10)
            return 0;
        v = v * 10 + (*d - '0');
    }
    /* "step-" + "" with prefix "" and a name of all digits is fine; a
     * name like "." or ".." never parses (no digit). */
    *step = v;
    return 1;
}

/* How much of root to join a name to: an s3:// root without its trailing
 * slashes ("s3://b/r/" + "/step-1" would be the key "r//step-1/..."); a
 * local root whole, as the user gave it ("r//step-1" is "r/step-1"). */
static int root_len(const char *root)
{
    size_t n = strlen(root);
    if (dcp__path_is_s3(root))
        while (n > 5 && root[n - 1] == '/')
            n--;
    return n > INT_MAX ? INT_MAX : (int)n;
}

/* root/<prefix><step><suffix> into a new string, or NULL (ENOMEM). */
static char *step_path(const char *root, const char *prefix, const char *suffix,
                       int64_t step)
{
    size_t n = strlen(root) + strlen(prefix) + strlen(suffix) + 24;
    char *p = dcp__malloc(n);
    if (p)
        snprintf(p, n, "%.*s/%s%" PRId64 "%s", root_len(root), root, prefix,
                 step, suffix);
    return p;
}

/* ---------------------------------------------------------------------- */
/* Listing                                                                */
/* ---------------------------------------------------------------------- */

static int cmp_entry(const void *a, const void *b)
{
    const dcp_manager_entry *x = a, *y = b;
    return x->step < y->step ? -1 : x->step > y->step;
}

void dcp_manager_list_free(dcp_manager_entry *e, size_t n)
{
    if (!e)
        return;
    for (size_t i = 0; i < n; i++) {
        dcp__free(e[i].name);
        dcp__free(e[i].error);
    }
    dcp__free(e);
}

/* Status of the step entry name of root (open as rootfd). */
static int entry_status(dcp_ctx *ctx, int rootfd, const char *root,
                        const char *name, dcp_manager_entry *e)
{
    struct stat sb;
    /* rootfd -1: an s3:// root, whose steps are key prefixes (no links,
     * nothing but "directories"). */
    if (rootfd >= 0 && fstatat(rootfd, name, &sb, AT_SYMLINK_NOFOLLOW) != 0) {
        e->status = DCP_MANAGER_INCOMPLETE; /* vanished meanwhile */
        return DCP_OK;
    }
    if (rootfd >= 0 && S_ISLNK(sb.st_mode)) {
        e->status = DCP_MANAGER_LINK;
        return DCP_OK;
    }
    if (rootfd >= 0 && !S_ISDIR(sb.st_mode)) {
        e->status = DCP_MANAGER_NOTDIR;
        return DCP_OK;
    }
    size_t n = strlen(root) + strlen(name) + 2;
    char *path = dcp__malloc(n);
    if (!path)
        return dcp__err(&ctx->err, DCP_ENOMEM, "out of memory listing \"%s\"",
                        root);
    snprintf(path, n, "%.*s/%s", root_len(root), root, name);
    dcp_metadata *md = NULL;
    int rc = dcp_metadata_open(ctx, path, &md);
    dcp_metadata_free(md);
    dcp__free(path);
    if (rc == DCP_OK) {
        e->status = DCP_MANAGER_COMPLETE;
    } else if (rc == DCP_ENOENT) {
        e->status = DCP_MANAGER_INCOMPLETE;
    } else if (rc == DCP_ENOMEM ||
               (rootfd < 0 && (rc == DCP_EIO || rc == DCP_ETIMEOUT ||
                               rc == DCP_EINVAL))) {
        /* An object store that did not answer (or refused) says nothing
         * about the step: marked corrupt it would make an older step the
         * latest and be skipped by retention's count. */
        return rc;
    } else {
        e->status = DCP_MANAGER_CORRUPT;
        if (!(e->error = dcp__strdup(ctx->err.msg)))
            return dcp__err(&ctx->err, DCP_ENOMEM,
                            "out of memory listing \"%s\"", root);
    }
    dcp__err_clear(&ctx->err);
    return DCP_OK;
}

#define S3_STEPS_MAX 65536 /* steps listed under an s3:// root */

/* The step names under an s3:// root (dcp__mgr_list's first half). */
static int s3_steps(dcp_ctx *ctx, const char *root, const char *prefix,
                    const char *suffix, dcp_manager_entry **out, size_t *n)
{
    dcp_storage_entry *ent = dcp__malloc(S3_STEPS_MAX * sizeof(*ent));
    dcp_manager_entry *v = NULL;
    size_t cnt = 0, k = 0, i;
    int dfd = -1, rc;
    if (!ent)
        return dcp__err(&ctx->err, DCP_ENOMEM, "out of memory listing \"%s\"",
                        root);
    rc = dcp__fs_open_dir(root, &dfd, &ctx->err);
    if (rc == DCP_OK)
        rc = dcp__fs_list_dirs(dfd, prefix, S3_STEPS_MAX, ent, &k, &ctx->err);
    dcp__fs_release(dfd);
    if (rc == DCP_OK && k && !(v = dcp__calloc(k, sizeof(*v))))
        rc = dcp__err(&ctx->err, DCP_ENOMEM, "out of memory listing \"%s\"",
                      root);
    for (i = 0; rc == DCP_OK && i < k; i++) {
        int64_t step;
        if (!dcp__mgr_parse(ent[i].name, prefix, suffix, &step))
            continue;
        v[cnt].step = step;
        v[cnt].status = DCP__MGR_UNCHECKED;
        if (!(v[cnt].name = dcp__strdup(ent[i].name)))
            rc = dcp__err(&ctx->err, DCP_ENOMEM,
                          "out of memory listing \"%s\"", root);
        else
            cnt++;
    }
    dcp__free(ent);
    /* No bucket is no listing, not an empty root: DCP_ENOENT stays the
     * answer of a root without checkpoints only (dcp_manager_latest's
     * callers start afresh on it). */
    if (rc == DCP_ENOENT)
        rc = DCP_EIO;
    if (rc != DCP_OK && rc != DCP_ENOMEM && rc != DCP_ELIMIT)
        (void)dcp__err_prefix(&ctx->err, "cannot list checkpoint root \"%s\"",
                              root);
    if (rc != DCP_OK) {
        dcp_manager_list_free(v, cnt);
        return rc;
    }
    *out = v;
    *n = cnt;
    return DCP_OK;
}

/* The end of a listing (rc: the scan's): v sorted, statuses newest first
 * -- with newest, only down to the first complete one (each check decodes
 * a .metadata) -- and handed over in *out, or freed on failure. rootfd:
 * the open local root, -1 for an s3:// one. */
static int finish_list(dcp_ctx *ctx, int rootfd, const char *root,
                       int newest, int rc, dcp_manager_entry *v, size_t cnt,
                       dcp_manager_entry **out, size_t *n)
{
    if (rc == DCP_OK && cnt > 1)
        qsort(v, cnt, sizeof *v, cmp_entry);
    for (size_t i = cnt; rc == DCP_OK && i-- > 0;) {
        rc = entry_status(ctx, rootfd, root, v[i].name, &v[i]);
        if (newest && v[i].status == DCP_MANAGER_COMPLETE)
            break;
    }
    if (rc != DCP_OK) {
        dcp_manager_list_free(v, cnt);
        return rc;
    }
    if (!cnt) {
        dcp__free(v);
        v = NULL;
    }
    *out = v;
    *n = cnt;
    return DCP_OK;
}

int dcp__mgr_list(dcp_ctx *ctx, const char *root, const char *prefix,
                  const char *suffix, int newest, dcp_manager_entry **out,
                  size_t *n)
{
    *out = NULL;
    *n = 0;
    if (dcp__path_is_s3(root)) {
        dcp_manager_entry *v = NULL;
        size_t cnt = 0;
        int rc = s3_steps(ctx, root, prefix, suffix, &v, &cnt);
        return finish_list(ctx, -1, root, newest, rc, v, cnt, out, n);
    }
    int fd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return dcp__err(&ctx->err, errno == ENOENT ? DCP_ENOENT : DCP_EIO,
                        "cannot open checkpoint root \"%s\": %s", root,
                        strerror(errno));
    int dfd = dup(fd);
    DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
    if (!d) {
        int e = errno;
        if (dfd >= 0)
            close(dfd);
        close(fd);
        return dcp__err(&ctx->err, DCP_EIO, "cannot list \"%s\": %s", root,
                        strerror(e));
    }
    dcp_manager_entry *v = NULL;
    size_t cnt = 0, cap = 0;
    int rc = DCP_OK;
    struct dirent *de;
    for (;;) {
        errno = 0;
        if (!(de = readdir(d))) {
            if (errno)
                rc = dcp__err(&ctx->err, DCP_EIO, "cannot list \"%s\": %s",
                              root, strerror(errno));
            break;
        }
        int64_t step;
        if (!dcp__mgr_parse(de->d_name, prefix, suffix, &step))
            continue;
        if (cnt == cap) {
            size_t nc = cap ? 2 * cap : 16;
            dcp_manager_entry *nv = dcp__realloc(v, nc * sizeof *v);
            if (!nv) {
                rc = dcp__err(&ctx->err, DCP_ENOMEM,
                              "out of memory listing \"%s\"", root);
                break;
            }
            v = nv;
            cap = nc;
        }
        dcp_manager_entry *e = &v[cnt];
        memset(e, 0, sizeof *e);
        e->step = step;
        if (!(e->name = dcp__strdup(de->d_name))) {
            rc = dcp__err(&ctx->err, DCP_ENOMEM, "out of memory listing \"%s\"",
                          root);
            break;
        }
        e->status = DCP__MGR_UNCHECKED;
        cnt++;
    }
    closedir(d);
    rc = finish_list(ctx, fd, root, newest, rc, v, cnt, out, n);
    close(fd);
    return rc;
}

int dcp_manager_list(dcp_ctx *ctx, const char *root,
                     const dcp_manager_options *opts, dcp_manager_entry **out,
                     size_t *n)
{
    if (!ctx)
        return DCP_EINVAL;
    dcp__ctx_begin(ctx);
    if (!root || !out || !n)
        return dcp__err(&ctx->err, DCP_EINVAL,
                        "dcp_manager_list: NULL argument");
    *out = NULL;
    *n = 0;
    const char *p = NULL, *s = NULL;
    DCP_RETURN_IF(dcp__mgr_pattern(opts, &p, &s, &ctx->err));
    return dcp__mgr_list(ctx, root, p, s, 0, out, n);
}

/* ---------------------------------------------------------------------- */
/* Removal                                                                */
/* ---------------------------------------------------------------------- */

/* A file a checkpoint directory may hold: .metadata, its temporaries
 * (.metadata.*), data files (*.distcp, tagged or not) and their
 * temporaries (a killed peer replication's: dcp__leftover_name), the
 * one-writer lock (.lock, which the removal holds itself, and .lock.*:
 * lock.h). */
static int checkpoint_file(const char *name)
{
    size_t n = strlen(name);
    return !strcmp(name, ".metadata") || !strncmp(name, ".metadata.", 10) ||
           !strcmp(name, DCP__LOCK_NAME) || !strncmp(name, ".lock.", 6) ||
           (n > 7 && !strcmp(name + n - 7, ".distcp")) ||
           dcp__leftover_name(name);
}

/* The test hook: called before each change a removal makes. */
static void (*remove_hook)(const char *what, void *arg);
static void *remove_hook_arg;

void dcp__mgr_set_remove_hook(void (*fn)(const char *what, void *arg),
                              void *arg)
{
    remove_hook = fn;
    remove_hook_arg = arg;
}

static void hook(const char *what)
{
    if (remove_hook)
        remove_hook(what, remove_hook_arg);
}

#define S3_FILES_MAX 65536 /* objects of one s3:// step removed */

/*
 * An s3:// checkpoint, in the order of a POSIX one: under its one-writer
 * lock (a live writer: DCP_EBUSY, nothing removed), every object below the
 * prefix must be a checkpoint file and nothing may lie deeper (else
 * DCP_EUNSAFE, nothing removed); then .metadata first (from then on it is
 * not a checkpoint), then the other objects, the lock last (released).
 */
static int s3_remove(dcp_ctx *ctx, const char *dir)
{
    struct dcp_err *err = &ctx->err;
    dcp_storage_entry *ent = dcp__malloc(S3_FILES_MAX * sizeof(*ent));
    struct dcp__lock lk;
    char token[32];
    size_t k = 0, sub = 0, i;
    int dfd = -1, rc;
    lk.dirfd = -1;
    if (!ent)
        return dcp__err(err, DCP_ENOMEM, "out of memory removing \"%s\"",
                        dir);
    (void)snprintf(token, sizeof(token), "remove-%ld", (long)getpid());
    rc = dcp__fs_open_dir(dir, &dfd, err);
    if (rc == DCP_OK)
        rc = dcp__lock_acquire(dfd, dir, token, 0, &lk, err);
    if (rc == DCP_OK)
        rc = dcp__fs_list_dirs(dfd, "", 1, ent, &sub, err);
    if (rc == DCP_ELIMIT || (rc == DCP_OK && sub))
        rc = dcp__err(err, DCP_EUNSAFE,
                      "refusing to remove \"%s\": objects lie below \"%s/\" "
                      "(not a checkpoint); nothing removed",
                      dir, sub ? ent[0].name : "");
    if (rc == DCP_OK)
        rc = dcp__fs_list(dfd, "", S3_FILES_MAX, ent, &k, err);
    for (i = 0; rc == DCP_OK && i < k; i++)
        if (!checkpoint_file(ent[i].name))
            rc = dcp__err(err, DCP_EUNSAFE,
                          "refusing to remove \"%s\": it holds \"%s\", not "
                          "a checkpoint file (.metadata, .metadata.*, "
                          "*.distcp); nothing removed",
                          dir, ent[i].name);
    if (rc == DCP_OK && (!k || (k == 1 && !strcmp(ent[0].name,
                                                 DCP__LOCK_NAME))))
        rc = dcp__err(err, DCP_ENOENT, "cannot remove \"%s\": no such "
                      "checkpoint (no object under it)", dir);
    if (rc == DCP_OK) {
        hook("unlink .metadata");
        rc = dcp__fs_unlink(dfd, ".metadata", err);
        if (rc == DCP_ENOENT) {
            dcp__err_clear(err);
            rc = DCP_OK;
        }
    }
    for (i = 0; rc == DCP_OK && i < k; i++) {
        if (!strcmp(ent[i].name, ".metadata") ||
            !strcmp(ent[i].name, DCP__LOCK_NAME))
            continue;
        hook("unlink a file");
        rc = dcp__fs_unlink(dfd, ent[i].name, err);
        if (rc == DCP_ENOENT) {
            dcp__err_clear(err);
            rc = DCP_OK;
        }
    }
    if (rc != DCP_OK && rc != DCP_EBUSY && rc != DCP_EUNSAFE &&
        rc != DCP_ENOENT)
        (void)dcp__err_prefix(err, "cannot remove \"%s\"", dir);
    dcp__lock_release(&lk);
    dcp__fs_release(dfd);
    dcp__free(ent);
    return rc;
}

/* Removes dir (a path) crash safe; see dcp_manager_remove. */
int dcp__mgr_remove(dcp_ctx *ctx, const char *dir)
{
    struct dcp_err *err = &ctx->err;
    struct stat sb;
    if (dcp__path_is_s3(dir))
        return s3_remove(ctx, dir);
    if (lstat(dir, &sb) != 0)
        return dcp__err(err, errno == ENOENT ? DCP_ENOENT : DCP_EIO,
                        "cannot remove \"%s\": %s", dir, strerror(errno));
    if (S_ISLNK(sb.st_mode))
        return dcp__err(err, DCP_EUNSAFE,
                        "refusing to remove \"%s\": a symbolic link (removal "
                        "never goes through a link)",
                        dir);
    if (!S_ISDIR(sb.st_mode))
        return dcp__err(err, DCP_EUNSAFE,
                        "refusing to remove \"%s\": not a directory", dir);
    /* The parent, to sync after the directory goes. */
    char *parent = dcp__strdup(dir);
    if (!parent)
        return dcp__err(err, DCP_ENOMEM, "out of memory removing \"%s\"", dir);
    size_t pl = strlen(parent);
    while (pl > 1 && parent[pl - 1] == '/')
        parent[--pl] = '\0';
    char *slash = strrchr(parent, '/');
    const char *base;
    if (!slash) {
        base = parent;
    } else {
        *slash = '\0';
        base = slash + 1;
    }
    const char *pdir = !slash ? "." : (slash == parent ? "/" : parent);
    int pfd = open(pdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int fd = pfd < 0 ? -1
                     : openat(pfd, base,
                              O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int rc = DCP_OK, sfd = -1;
    struct dcp__lock lk;
    DIR *d = NULL;
    lk.dirfd = -1;
    if (fd < 0) {
        rc = dcp__err(err, errno == ELOOP ? DCP_EUNSAFE : DCP_EIO,
                      "cannot open \"%s\" for removal: %s", dir,
                      strerror(errno));
        goto out;
    }
    /* The directory's one-writer lock (lock.h): a save or import writing
     * there now makes the removal DCP_EBUSY, nothing removed; a dead
     * writer's lock is taken over. The removal then unlinks it with the
     * rest. */
    {
        char token[32];
        (void)snprintf(token, sizeof(token), "remove-%ld", (long)getpid());
        rc = dcp__fs_open_dir(dir, &sfd, err);
        if (rc == DCP_OK)
            rc = dcp__lock_acquire(sfd, dir, token, 0, &lk, err);
        if (rc != DCP_OK)
            goto out;
    }
    /* First pass: every entry must be a checkpoint file (a link is removed
     * as itself, never followed); a subdirectory or another name means
     * this is not a checkpoint, and nothing is removed. */
    int dfd = dup(fd);
    if (dfd < 0 || !(d = fdopendir(dfd))) {
        if (dfd >= 0)
            close(dfd);
        rc = dcp__err(err, DCP_EIO, "cannot list \"%s\": %s", dir,
                      strerror(errno));
        goto out;
    }
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        if (fstatat(fd, de->d_name, &sb, AT_SYMLINK_NOFOLLOW) == 0 &&
            S_ISDIR(sb.st_mode)) {
            rc = dcp__err(err, DCP_EUNSAFE,
                          "refusing to remove \"%s\": it holds the directory "
                          "\"%s\" (not a checkpoint)",
                          dir, de->d_name);
            goto out;
        }
        if (!checkpoint_file(de->d_name)) {
            rc = dcp__err(err, DCP_EUNSAFE,
                          "refusing to remove \"%s\": it holds \"%s\", not "
                          "a checkpoint file (.metadata, .metadata.*, "
                          "*.distcp); nothing removed",
                          dir, de->d_name);
            goto out;
        }
    }
    /* .metadata first: from here on the step is not complete. */
    hook("unlink .metadata");
    if (unlinkat(fd, ".metadata", 0) != 0 && errno != ENOENT) {
        rc = dcp__err(err, DCP_EIO, "cannot remove \"%s/.metadata\": %s", dir,
                      strerror(errno));
        goto out;
    }
    hook("sync the directory");
    if (fsync(fd) != 0) {
        rc = dcp__err(err, DCP_EIO, "cannot sync \"%s\": %s", dir,
                      strerror(errno));
        goto out;
    }
    rewinddir(d);
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        hook("unlink a file");
        if (unlinkat(fd, de->d_name, 0) != 0 && errno != ENOENT) {
            rc = dcp__err(err, DCP_EIO, "cannot remove \"%s/%s\": %s", dir,
                          de->d_name, strerror(errno));
            goto out;
        }
    }
    hook("remove the directory");
    if (unlinkat(pfd, base, AT_REMOVEDIR) != 0) {
        rc = dcp__err(err, DCP_EIO, "cannot remove the directory \"%s\": %s",
                      dir, strerror(errno));
        goto out;
    }
    hook("sync the parent");
    if (fsync(pfd) != 0)
        rc = dcp__err(err, DCP_EIO, "cannot sync \"%s\": %s", pdir,
                      strerror(errno));
out:
    dcp__lock_release(&lk); /* gone with the directory, or left as it was */
    dcp__fs_release(sfd);
    if (d)
        closedir(d);
    if (fd >= 0)
        close(fd);
    if (pfd >= 0)
        close(pfd);
    dcp__free(parent);
    return rc;
}

int dcp_manager_remove(dcp_ctx *ctx, const char *dir)
{
    if (!ctx)
        return DCP_EINVAL;
    dcp__ctx_begin(ctx);
    if (!dir || !*dir)
        return dcp__err(&ctx->err, DCP_EINVAL, "dcp_manager_remove: no path");
    return dcp__mgr_remove(ctx, dir);
}

/* ---------------------------------------------------------------------- */
/* Retention                                                              */
/* ---------------------------------------------------------------------- */

int dcp__mgr_prune(dcp_ctx *ctx, const char *root, const char *prefix,
                   const char *suffix, uint32_t keep_last, int64_t keep_every,
                   const int64_t *protect, size_t nprotect, size_t *removed)
{
    dcp_manager_entry *e = NULL;
    size_t n = 0, nrm = 0;
    if (removed)
        *removed = 0;
    int rc = dcp__mgr_list(ctx, root, prefix, suffix, 0, &e, &n);
    if (rc == DCP_ENOENT) {
        dcp__err_clear(&ctx->err);
        return DCP_OK; /* nothing to prune */
    }
    if (rc != DCP_OK)
        return rc;
    /* Walk from the newest: the first keep_last complete ones (at least
     * one: the newest) stay, so do multiples of keep_every and protect. */
    size_t seen = 0;
    uint32_t keep = keep_last ? keep_last : UINT32_MAX;
    for (size_t i = n; i-- > 0 && rc == DCP_OK;) {
        if (e[i].status != DCP_MANAGER_COMPLETE)
            continue;
        seen++;
        int kept = seen <= keep;
        for (size_t k = 0; k < nprotect; k++)
            kept |= e[i].step == protect[k];
        if (kept || (keep_every > 0 && e[i].step % keep_every == 0))
            continue;
        char *path = step_path(root, prefix, suffix, e[i].step);
        if (!path) {
            rc = dcp__err(&ctx->err, DCP_ENOMEM, "out of memory pruning \"%s\"",
                          root);
            break;
        }
        rc = dcp__mgr_remove(ctx, path);
        dcp__free(path);
        if (rc == DCP_OK)
            nrm++;
    }
    dcp_manager_list_free(e, n);
    if (removed)
        *removed = nrm;
    return rc;
}

int dcp_manager_prune(dcp_ctx *ctx, const char *root,
                      const dcp_manager_options *opts, size_t *removed)
{
    if (!ctx)
        return DCP_EINVAL;
    dcp__ctx_begin(ctx);
    if (removed)
        *removed = 0;
    if (!root)
        return dcp__err(&ctx->err, DCP_EINVAL, "dcp_manager_prune: no root");
    const char *p = NULL, *s = NULL;
    DCP_RETURN_IF(dcp__mgr_pattern(opts, &p, &s, &ctx->err));
    uint32_t keep_last = 0;
    int64_t keep_every = 0;
    if (opts && opts->struct_size >= offsetof(dcp_manager_options, keep_every) +
                                         sizeof(opts->keep_every)) {
        keep_last = opts->keep_last;
        keep_every = opts->keep_every;
    }
    if (keep_every < 0)
        return dcp__err(&ctx->err, DCP_EINVAL, "negative keep_every");
    return dcp__mgr_prune(ctx, root, p, s, keep_last, keep_every, NULL, 0,
                          removed);
}

/* ---------------------------------------------------------------------- */
/* The manager                                                            */
/* ---------------------------------------------------------------------- */

#define OPT_HAS(o, field) \
    ((o)->struct_size >=  \
     offsetof(dcp_manager_options, field) + sizeof((o)->field))

int dcp_manager_create(dcp_manager **out, dcp_ctx *ctx, const char *root,
                       const dcp_manager_options *opts)
{
    if (out)
        *out = NULL;
    if (!ctx)
        return DCP_EINVAL;
    dcp__ctx_begin(ctx);
    struct dcp_err *err = &ctx->err;
    int rc = DCP_OK;
    const char *p = NULL, *s = NULL;
    dcp_manager *m = NULL;
    if (!out || !root || !*root)
        rc = dcp__err(err, DCP_EINVAL, "dcp_manager_create: NULL argument");
    else if (opts && opts->struct_size < sizeof(uint32_t))
        rc = dcp__err(err, DCP_EINVAL, "dcp_manager_options: bad struct_size");
    if (rc == DCP_OK)
        rc = dcp__mgr_pattern(opts, &p, &s, err);
    if (rc == DCP_OK && !(m = dcp__calloc(1, sizeof *m)))
        rc = dcp__err(err, DCP_ENOMEM, "out of memory");
    if (rc == DCP_OK) {
        m->ctx = ctx;
        m->inflight_step = -1;
        if (opts) {
            if (OPT_HAS(opts, interval))
                m->interval = opts->interval;
            if (OPT_HAS(opts, keep_last))
                m->keep_last = opts->keep_last;
            if (OPT_HAS(opts, keep_every))
                m->keep_every = opts->keep_every;
            if (OPT_HAS(opts, async))
                m->async = opts->async != 0;
            if (OPT_HAS(opts, save_opts) && opts->save_opts) {
                size_t sz = opts->save_opts->struct_size;
                if (sz > sizeof m->save_opts)
                    sz = sizeof m->save_opts;
                memcpy(&m->save_opts, opts->save_opts, sz);
                m->save_opts.struct_size = (uint32_t)sz;
                m->has_save_opts = 1;
            }
        }
        if (m->interval < 0 || m->keep_every < 0)
            rc = dcp__err(err, DCP_EINVAL,
                          "negative interval or keep_every for \"%s\"", root);
        /* A step is complete when its .metadata exists: a rank-local
         * save writes none. */
        else if (m->has_save_opts &&
                 m->save_opts.struct_size >=
                     offsetof(dcp_save_options, flags) + sizeof(unsigned) &&
                 (m->save_opts.flags & DCP_SAVE_RANK_LOCAL))
            rc = dcp__err(err, DCP_EINVAL,
                          "DCP_SAVE_RANK_LOCAL in the save options of the "
                          "manager of \"%s\": a step is complete when its "
                          ".metadata exists, which a rank-local save does "
                          "not write",
                          root);
    }
    if (rc == DCP_OK &&
        (!(m->root = dcp__strdup(root)) || !(m->prefix = dcp__strdup(p)) ||
         !(m->suffix = dcp__strdup(s))))
        rc = dcp__err(err, DCP_ENOMEM, "out of memory");
    /* Every rank must manage the same root the same way. */
    rc = dcp__comm_agree_err(ctx->comm, rc, err);
    if (rc == DCP_OK) {
        char desc[128];
        snprintf(desc, sizeof desc, "%" PRId64 "/%u/%" PRId64 "/%d",
                 m->interval, m->keep_last, m->keep_every, m->async);
        rc = dcp__comm_same_string(ctx->comm, root, "manager root", err);
        if (rc == DCP_OK)
            rc = dcp__comm_same_string(ctx->comm, desc, "manager options", err);
        if (rc == DCP_OK)
            rc = dcp__comm_same_string(ctx->comm, p, "step name prefix", err);
        if (rc == DCP_OK)
            rc = dcp__comm_same_string(ctx->comm, s, "step name suffix", err);
    }
    if (rc == DCP_OK) {
        int r0 = DCP_OK;
        if (ctx->rank == 0 && dcp__path_is_s3(root)) {
            /* No directories to make: the bucket must be there and
             * readable (opening the root lists it). */
            int dfd = -1;
            dcp__ctx_begin(ctx);
            r0 = dcp__fs_open_dir(root, &dfd, err);
            dcp__fs_release(dfd);
        } else if (ctx->rank == 0) {
            dcp__ctx_begin(ctx);
            r0 = dcp__fs_mkdirs(root, err);
            struct stat sb;
            if (r0 == DCP_OK && (stat(root, &sb) != 0 || !S_ISDIR(sb.st_mode)))
                r0 =
                    dcp__err(err, DCP_EIO,
                             "checkpoint root \"%s\" is not a directory", root);
        }
        rc = dcp__comm_share_err(ctx->comm, r0, err, 0);
    }
    if (rc != DCP_OK) {
        if (m) {
            dcp__free(m->root);
            dcp__free(m->prefix);
            dcp__free(m->suffix);
            dcp__free(m);
        }
        return rc;
    }
    *out = m;
    return DCP_OK;
}

void dcp_manager_request_save(dcp_manager *m)
{
    if (m)
        m->requested = 1;
}

/* Retention on rank 0, its verdict shared. protect: a step never removed. */
static int retain(dcp_manager *m, int64_t protect)
{
    dcp_ctx *ctx = m->ctx;
    int rc = DCP_OK;
    if (m->keep_last == 0 && m->keep_every == 0)
        return DCP_OK; /* keep everything: no scan */
    if (ctx->rank == 0) {
        rc = dcp__mgr_prune(ctx, m->root, m->prefix, m->suffix, m->keep_last,
                            m->keep_every, &protect, 1, NULL);
        if (rc != DCP_OK)
            dcp__err_prefix(&ctx->err,
                            "retention after the commit under \"%s\"", m->root);
    }
    return dcp__comm_share_err(ctx->comm, rc, &ctx->err, 0);
}

/* Completes the save in flight, if any, then retention. */
static int complete(dcp_manager *m)
{
    if (!m->req)
        return DCP_OK;
    int64_t step = m->inflight_step;
    int rc = dcp_request_wait(m->req);
    if (rc != DCP_OK) {
        /* The request's message into the context, for dcp_errmsg. */
        dcp__err(&m->ctx->err, rc, "save of step %" PRId64 ": %s", step,
                 dcp_request_errmsg(m->req));
    }
    dcp_request_free(m->req);
    m->req = NULL;
    m->inflight_step = -1;
    if (rc != DCP_OK)
        return rc;
    return retain(m, step);
}

int dcp_manager_wait(dcp_manager *m)
{
    if (!m)
        return DCP_EINVAL;
    dcp__ctx_begin(m->ctx);
    return complete(m);
}

int dcp_manager_save(dcp_manager *m, const dcp_state *state, int64_t step)
{
    if (!m)
        return DCP_EINVAL;
    dcp_ctx *ctx = m->ctx;
    dcp__ctx_begin(ctx);
    int rc = complete(m);
    if (rc != DCP_OK)
        return rc;
    if (step < 0)
        return dcp__err(&ctx->err, DCP_EINVAL,
                        "negative step %" PRId64 " for \"%s\"", step, m->root);
    char *path = step_path(m->root, m->prefix, m->suffix, step);
    if (!path)
        return dcp__err(&ctx->err, DCP_ENOMEM, "out of memory");
    const dcp_save_options *so = m->has_save_opts ? &m->save_opts : NULL;
    if (m->async) {
        rc = dcp_save_async(ctx, state, path, so, &m->req);
        if (rc == DCP_OK)
            m->inflight_step = step;
    } else {
        rc = dcp_save(ctx, state, path, so);
    }
    dcp__free(path);
    if (rc != DCP_OK || m->async)
        return rc;
    return retain(m, step);
}

int dcp_manager_step(dcp_manager *m, const dcp_state *state, int64_t step,
                     int *did_save)
{
    if (did_save)
        *did_save = 0;
    if (!m)
        return DCP_EINVAL;
    dcp_ctx *ctx = m->ctx;
    dcp__ctx_begin(ctx);
    /* Read and clear the flag: a request arriving after this is kept for
     * the next step. */
    int64_t v[3] = {0, step, step == INT64_MIN ? INT64_MAX : -step};
    int asked = 0;
    if (m->requested) {
        m->requested = 0;
        asked = 1;
        v[0] = -1;
    }
    int rc = dcp__comm_allreduce_min(ctx->comm, v, 3, &ctx->err);
    if (rc != DCP_OK) {
        if (asked)
            m->requested = 1; /* not agreed: keep this rank's request */
        return rc;
    }
    /* Refused: the request stays for the next step. v[1] is the minimum,
     * the same on every rank. */
    if ((v[1] < 0 || v[1] != -v[2]) && asked)
        m->requested = 1;
    if (v[1] < 0)
        return dcp__err(&ctx->err, DCP_EINVAL,
                        "negative step %" PRId64 " for the manager of \"%s\"",
                        v[1], m->root);
    if (v[1] != -v[2])
        return dcp__err(&ctx->err, DCP_EINVAL,
                        "not every rank passed the same step (%" PRId64
                        " to %" PRId64 ") to the manager of \"%s\"",
                        v[1], -v[2], m->root);
    int want = v[0] < 0 || (m->interval > 0 && step % m->interval == 0);
    if (!want)
        return DCP_OK;
    rc = dcp_manager_save(m, state, step);
    if (rc == DCP_OK && did_save)
        *did_save = 1;
    return rc;
}

/* The newest complete step on rank 0, or -1 (rc DCP_OK); shared. */
static int find_latest(dcp_manager *m, int64_t *step)
{
    dcp_ctx *ctx = m->ctx;
    int64_t best = -1;
    int rc = DCP_OK;
    if (ctx->rank == 0) {
        dcp_manager_entry *e = NULL;
        size_t n = 0;
        rc = dcp__mgr_list(ctx, m->root, m->prefix, m->suffix, 1, &e, &n);
        if (rc == DCP_ENOENT) {
            dcp__err_clear(&ctx->err);
            rc = DCP_OK;
        }
        for (size_t i = n; rc == DCP_OK && i-- > 0;)
            if (e[i].status == DCP_MANAGER_COMPLETE &&
                e[i].step != m->inflight_step) {
                best = e[i].step;
                break;
            }
        dcp_manager_list_free(e, n);
    }
    rc = dcp__comm_share_err(ctx->comm, rc, &ctx->err, 0);
    if (rc == DCP_OK)
        rc = dcp__comm_bcast(ctx->comm, &best, sizeof best, 0, &ctx->err);
    *step = best;
    return rc;
}

int dcp_manager_path(const dcp_manager *m, int64_t step, char **out)
{
    if (out)
        *out = NULL;
    if (!m || !out || step < 0)
        return DCP_EINVAL;
    *out = step_path(m->root, m->prefix, m->suffix, step);
    return *out ? DCP_OK : DCP_ENOMEM;
}

int dcp_manager_latest(dcp_manager *m, int64_t *step)
{
    if (!m)
        return DCP_EINVAL;
    dcp_ctx *ctx = m->ctx;
    dcp__ctx_begin(ctx);
    int64_t s = -1;
    if (step)
        *step = -1;
    int rc = complete(m);
    if (rc == DCP_OK)
        rc = find_latest(m, &s);
    if (rc != DCP_OK)
        return rc;
    if (step)
        *step = s;
    if (s < 0)
        return dcp__err(&ctx->err, DCP_ENOENT,
                        "no complete checkpoint under \"%s\"", m->root);
    return DCP_OK;
}

int dcp_manager_load_latest(dcp_manager *m, dcp_state *state, int64_t *step,
                            const dcp_load_options *opts)
{
    int64_t s = -1;
    if (step)
        *step = -1;
    int rc = dcp_manager_latest(m, &s);
    if (rc != DCP_OK)
        return rc;
    char *path = step_path(m->root, m->prefix, m->suffix, s);
    if (!path)
        return dcp__err(&m->ctx->err, DCP_ENOMEM, "out of memory");
    rc = dcp_load(m->ctx, state, path, opts);
    dcp__free(path);
    if (rc == DCP_OK && step)
        *step = s;
    return rc;
}

void dcp_manager_free(dcp_manager *m)
{
    if (!m)
        return;
    if (m->req) {
        dcp__ctx_begin(m->ctx);
        (void)complete(m);
    }
    dcp__free(m->root);
    dcp__free(m->prefix);
    dcp__free(m->suffix);
    dcp__free(m);
}
