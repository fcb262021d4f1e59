/*
 * The one-writer lock of a checkpoint path and the removal of leftovers
 * (lock.h states the protocol).
 */
#include "lock.h"

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ctx.h"
#include "dcp/dcp_storage.h"
#include "ranklocal.h"
#include "read.h"
#include "storage.h"

#define LOCK_MAX   4096 /* bytes of a lock file read */
#define LIST_MAX   4096 /* names per listing */
#define TAKE_TRIES 4

/* The identity of a holder, as the lock file states it. */
struct holder {
    char host[128];
    char boot[64];
    long long pid;
    unsigned long long start;
    char token[72];
    long long time;
};

/* Reads a short text file into buf ("" when unreadable). */
static void read_text(const char *file, char *buf, size_t cap)
{
    FILE *f = fopen(file, "r");
    size_t n = 0;
    buf[0] = '\0';
    if (!f)
        return;
    n = fread(buf, 1, cap - 1, f);
    buf[n] = '\0';
    (void)fclose(f);
    while (n && (buf[n - 1] == '\n' || buf[n - 1] == ' '))
        buf[--n] = '\0';
}

/* The start time of process pid (field 22 of /proc/<pid>/stat, clock
 * ticks since boot); 0 when unknown. *state (may be NULL) gets field 3,
 * the process state ('Z': exited, not yet reaped), or 0 when unknown. */
static unsigned long long proc_start(long long pid, char *state)
{
    char file[64], buf[1024], *p;
    unsigned long long v = 0;
    int field;
    if (state)
        *state = 0;
    (void)snprintf(file, sizeof(file), "/proc/%lld/stat", pid);
    read_text(file, buf, sizeof(buf));
    p = strrchr(buf, ')'); /* the command name may hold spaces */
    if (!p)
        return 0;
    if (state && p[1] == ' ')
        *state = p[2];
    /* After ") " comes field 3 (state); start time is field 22. */
    for (field = 2; *p && field < 22; p++)
        if (*p == ' ')
            field++;
    if (field == 22)
        v = strtoull(p, NULL, 10);
    return v;
}

static void self_identity(struct holder *h, const char *token)
{
    memset(h, 0, sizeof(*h));
    if (gethostname(h->host, sizeof(h->host) - 1) != 0)
        (void)snprintf(h->host, sizeof(h->host), "unknown");
    read_text("/proc/sys/kernel/random/boot_id", h->boot, sizeof(h->boot));
    h->pid = (long long)getpid();
    h->start = proc_start(h->pid, NULL);
    (void)snprintf(h->token, sizeof(h->token), "%s", token);
    h->time = (long long)time(NULL);
}

/* Keeps the printable ASCII of a value, without spaces (a hostile lock
 * file must not put control characters into a message). */
static void take_value(char *dst, size_t cap, const char *v, size_t n)
{
    size_t i, k = 0;
    for (i = 0; i < n && k + 1 < cap; i++)
        if (v[i] > 0x20 && v[i] < 0x7f)
            dst[k++] = v[i];
    dst[k] = '\0';
}

/* Parses a lock file; returns 0 unless it has the header and a token. */
static int parse_holder(const uint8_t *p, size_t n, struct holder *h)
{
    const char *s = (const char *)p, *end = s + n;
    char num[32];
    memset(h, 0, sizeof(*h));
    if (n < 10 || memcmp(s, "dcp-lock 1", 10) != 0)
        return 0;
    while (s < end) {
        const char *nl = memchr(s, '\n', (size_t)(end - s));
        const char *eq = memchr(s, '=', (size_t)((nl ? nl : end) - s));
        const char *v = eq ? eq + 1 : NULL;
        size_t vlen = eq ? (size_t)((nl ? nl : end) - v) : 0;
        size_t klen = eq ? (size_t)(eq - s) : 0;
        if (eq && klen == 4 && !memcmp(s, "host", 4))
            take_value(h->host, sizeof(h->host), v, vlen);
        else if (eq && klen == 4 && !memcmp(s, "boot", 4))
            take_value(h->boot, sizeof(h->boot), v, vlen);
        else if (eq && klen == 5 && !memcmp(s, "token", 5))
            take_value(h->token, sizeof(h->token), v, vlen);
        else if (eq && klen == 3 && !memcmp(s, "pid", 3)) {
            take_value(num, sizeof(num), v, vlen);
            h->pid = strtoll(num, NULL, 10);
        } else if (eq && klen == 5 && !memcmp(s, "start", 5)) {
            take_value(num, sizeof(num), v, vlen);
            h->start = strtoull(num, NULL, 10);
        } else if (eq && klen == 4 && !memcmp(s, "time", 4)) {
            take_value(num, sizeof(num), v, vlen);
            h->time = strtoll(num, NULL, 10);
        }
        s = nl ? nl + 1 : end;
    }
    if (!strcmp(h->boot, "-"))
        h->boot[0] = '\0'; /* unknown: the boot id is not compared */
    /* The token names the take-over marker: letters, digits, '-', '_'
     * only (a hostile lock must not put '/' or ".." into a name). */
    for (p = (const uint8_t *)h->token; *p; p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'z') ||
              (*p >= 'A' && *p <= 'Z') || *p == '-' || *p == '_'))
            return 0;
    return h->token[0] != '\0';
}

static int format_holder(const struct holder *h, char *buf, size_t cap)
{
    int n = snprintf(buf, cap,
                     "dcp-lock 1\nhost=%s\nboot=%s\npid=%lld\nstart=%llu\n"
                     "token=%s\ntime=%lld\n",
                     h->host, h->boot[0] ? h->boot : "-", h->pid, h->start,
                     h->token, h->time);
    return n > 0 && (size_t)n < cap ? n : -1;
}

/* 1 when h's process is known to be gone, 0 when alive or unknown (*why
 * gets the reason it is unknown: another host). */
static int holder_dead(const struct holder *h, const struct holder *me,
                       int *other_host)
{
    *other_host = 0;
    if (strcmp(h->host, me->host) != 0) {
        *other_host = 1;
        return 0;
    }
    if (h->boot[0] && me->boot[0] && strcmp(h->boot, me->boot) != 0)
        return 1; /* this host rebooted since */
    if (h->pid <= 0 || h->pid > INT32_MAX)
        return 0;
    if (h->pid == me->pid && h->start == me->start)
        return 0; /* this process: another context of ours */
    if (kill((pid_t)h->pid, 0) != 0 && errno == ESRCH)
        return 1;
    /* The pid runs a process: the holder unless it started at another
     * time (the pid was reused) or has exited and waits to be reaped (a
     * zombie: a rank killed under mpiexec stays one for a moment). */
    char state = 0;
    unsigned long long start = proc_start(h->pid, &state);
    if (state == 'Z' || state == 'X')
        return 1;
    return h->start && start != h->start;
}

static int busy(struct dcp_err *err, const char *path, const struct holder *h,
                const char *why)
{
    return dcp__err(err, DCP_EBUSY,
                    "'%s' is locked by another writer (host %s, pid %lld, "
                    "save %s, since %lld)%s",
                    path, h->host, h->pid, h->token, h->time, why);
}

/* One take-over attempt of the dead holder h's lock. DCP_OK: the lock is
 * gone (try publishing again); DCP_EBUSY: another taker is at it. */
static int take_over(int dirfd, const char *path, const struct holder *h,
                     const char *mine, size_t minelen, unsigned flags,
                     struct dcp_err *err)
{
    char marker[128];
    uint8_t *p = NULL;
    size_t n = 0;
    struct holder now;
    int visible = 0, rc;
    (void)snprintf(marker, sizeof(marker), DCP__LOCK_NAME ".takeover-%.64s",
                   h->token);
    rc = dcp__fs_publish(dirfd, path, marker, mine, minelen,
                         DCP_PUBLISH_EXCLUSIVE | DCP_PUBLISH_NOSYNC, &visible,
                         err);
    if (rc == DCP_EEXIST && (flags & DCP__LOCK_FORCE)) {
        /* dcptool clean --force: the user says the taker is gone. */
        dcp__err_clear(err);
        rc = dcp__fs_unlink(dirfd, marker, err);
        if (rc == DCP_OK)
            rc = dcp__fs_publish(dirfd, path, marker, mine, minelen,
                                 DCP_PUBLISH_EXCLUSIVE | DCP_PUBLISH_NOSYNC,
                                 &visible, err);
    }
    if (rc == DCP_ENOENT) { /* our temporary went: try again */
        dcp__err_clear(err);
        return DCP_OK;
    }
    if (rc == DCP_EEXIST)
        return busy(err, path, h,
                    ": its holder is gone and another writer is taking the "
                    "lock over (a marker '" DCP__LOCK_NAME ".takeover-*' left "
                    "by a writer killed meanwhile is removed by 'dcptool "
                    "clean --force')");
    if (rc != DCP_OK)
        return rc;
    /* Only the marker's holder removes a lock with h's token: if .lock
     * still holds it, it is still the dead holder's. */
    rc = dcp__fs_read_all(dirfd, DCP__LOCK_NAME, LOCK_MAX, &p, &n, err);
    if (rc == DCP_OK && parse_holder(p, n, &now) &&
        strcmp(now.token, h->token) == 0)
        rc = dcp__fs_unlink(dirfd, DCP__LOCK_NAME, err);
    else if (rc == DCP_ENOENT || rc == DCP_OK)
        rc = DCP_OK; /* gone, or another writer's by now: publish again */
    dcp__free(p);
    (void)dcp__fs_unlink(dirfd, marker, NULL);
    return rc;
}

int dcp__lock_acquire(int dirfd, const char *path, const char *token,
                      unsigned flags, struct dcp__lock *lk,
                      struct dcp_err *err)
{
    struct holder me, h;
    char mine[512];
    int n, tries, rc = DCP_OK;
    size_t i;
    lk->dirfd = -1;
    lk->token[0] = '\0';
    if (!token || !*token || strlen(token) > 64)
        return dcp__err(err, DCP_EINVAL, "bad lock token");
    for (i = 0; token[i]; i++)
        if (token[i] < 0x21 || token[i] > 0x7e)
            return dcp__err(err, DCP_EINVAL, "bad lock token");
    self_identity(&me, token);
    n = format_holder(&me, mine, sizeof(mine));
    if (n < 0)
        return dcp__err(err, DCP_EINVAL, "lock identity too long");
    for (tries = 0; tries < TAKE_TRIES; tries++) {
        uint8_t *p = NULL;
        size_t len = 0;
        int visible = 0, other = 0, parsed;
        rc = dcp__fs_publish(dirfd, path, DCP__LOCK_NAME, mine, (size_t)n,
                             DCP_PUBLISH_EXCLUSIVE | DCP_PUBLISH_NOSYNC,
                             &visible, err);
        if (rc == DCP_OK || (rc != DCP_OK && visible)) {
            lk->dirfd = dirfd;
            (void)snprintf(lk->token, sizeof(lk->token), "%s", token);
            if (rc != DCP_OK) /* only the directory sync failed: held */
                dcp__err_clear(err);
            return DCP_OK;
        }
        if (rc == DCP_ENOTSUP) {
            dcp__err_clear(err); /* no exclusion on this back end */
            return DCP_OK;
        }
        if (rc == DCP_ENOENT && tries + 1 < TAKE_TRIES) {
            /* Our temporary was removed as a dead writer's by the holder
             * cleaning (dcp__clean_leftovers): the lock is held. (Every
             * time: the place itself is gone, a missing bucket on S3.) */
            dcp__err_clear(err);
            continue;
        }
        if (rc != DCP_EEXIST)
            return rc;
        rc = dcp__fs_read_all(dirfd, DCP__LOCK_NAME, LOCK_MAX, &p, &len, err);
        if (rc == DCP_ENOENT) {
            dcp__err_clear(err);
            continue; /* released meanwhile */
        }
        if (rc != DCP_OK)
            return dcp__err_prefix(err, "cannot read the lock of '%s'", path);
        parsed = parse_holder(p, len, &h);
        dcp__free(p);
        if (!parsed) {
            if (!(flags & DCP__LOCK_FORCE))
                return dcp__err(err, DCP_EBUSY,
                                "'%s' is locked by another writer ('%s' "
                                "exists but names no holder; 'dcptool clean "
                                "--force' removes it)",
                                path, DCP__LOCK_NAME);
            rc = dcp__fs_unlink(dirfd, DCP__LOCK_NAME, err);
            if (rc != DCP_OK)
                return rc;
            continue;
        }
        if (holder_dead(&h, &me, &other) ||
            (other && (flags & DCP__LOCK_FORCE))) {
            rc = take_over(dirfd, path, &h, mine, (size_t)n, flags, err);
            if (rc != DCP_OK)
                return rc;
            continue;
        }
        return busy(err, path, &h,
                    other ? ": a holder on another host cannot be checked; "
                            "if it is gone, 'dcptool clean --force' removes "
                            "the lock"
                          : "");
    }
    return dcp__err(err, DCP_EBUSY,
                    "'%s' is locked: the lock changed hands %d times while "
                    "this writer tried to take it",
                    path, TAKE_TRIES);
}

/* Releases without allocating on files (it runs on failure paths, out of
 * memory included): the lock is read into a stack buffer. */
void dcp__lock_release(struct dcp__lock *lk)
{
    uint8_t buf[1024];
    size_t size = 0;
    struct holder h;
    if (!lk || lk->dirfd < 0)
        return;
    if (dcp__fs_read_into(lk->dirfd, DCP__LOCK_NAME, buf, sizeof(buf), &size,
                          NULL) == DCP_OK &&
        size > 0 && parse_holder(buf, size, &h) &&
        strcmp(h.token, lk->token) == 0)
        (void)dcp__fs_unlink(lk->dirfd, DCP__LOCK_NAME, NULL);
    lk->dirfd = -1;
}

static int all_digits(const char *s, size_t n)
{
    size_t i;
    if (!n || n > 9)
        return 0;
    for (i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9')
            return 0;
    return 1;
}

static int all_hex(const char *s, size_t n)
{
    size_t i;
    if (!n || n > 64)
        return 0;
    for (i = 0; i < n; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return 0;
    return 1;
}

/* Whether name[0..n) is "<pid>-<n>-<8 hex>", the tail dcp__unique_tmp
 * puts between a file's name and ".tmp". */
static int unique_tail(const char *s, size_t n)
{
    const char *d1 = memchr(s, '-', n), *d2;
    if (!d1 || !all_digits(s, (size_t)(d1 - s)))
        return 0;
    d2 = memchr(d1 + 1, '-', n - (size_t)(d1 + 1 - s));
    return d2 && all_digits(d1 + 1, (size_t)(d2 - d1 - 1)) &&
           s + n - (d2 + 1) == 8 && all_hex(d2 + 1, 8);
}

int dcp__leftover_name(const char *name)
{
    size_t n = strlen(name);
    const char *u, *dot;
    /* A data file's temporary "<data file>.<pid>-<n>-<hex>.tmp": a peer
     * replica or restore copy (tiers/replica.c) not yet renamed. */
    if (n > 11 && !strcmp(name + n - 4, ".tmp") && !strncmp(name, "__", 2) &&
        (u = strstr(name, ".distcp.")) != NULL && u + 8 < name + n - 4 &&
        unique_tail(u + 8, (size_t)(name + n - 4 - (u + 8)))) {
        char data[DCP_STORAGE_NAME_MAX + 1];
        size_t dl = (size_t)(u + 7 - name);
        if (dl < sizeof(data)) {
            memcpy(data, name, dl);
            data[dl] = '\0';
            if (dcp__leftover_name(data))
                return 1;
        }
    }
    if (n > 9 && !strcmp(name + n - 4, ".tmp") &&
        !strncmp(name, ".metadata.", 10))
        return 1; /* .metadata.tmp, .metadata.<pid>-<n>...tmp */
    if (n > 16 && !strcmp(name + n - 4, ".tmp") && !strncmp(name, "__", 2)) {
        /* a rank-local commit's __<r>.metadata.<pid>-<n>...tmp (save.c) */
        u = strchr(name + 2, '.');
        return u && all_digits(name + 2, (size_t)(u - name - 2)) &&
               !strncmp(u, ".metadata.", 10);
    }
    if (n < 11 || strncmp(name, "__", 2) != 0 ||
        strcmp(name + n - 7, ".distcp") != 0)
        return 0;
    /* __<r>_<n>[.<hex>].distcp */
    u = strchr(name + 2, '_');
    if (!u || !all_digits(name + 2, (size_t)(u - name - 2)))
        return 0;
    dot = strchr(u + 1, '.');
    if (!dot || !all_digits(u + 1, (size_t)(dot - u - 1)))
        return 0;
    if (dot == name + n - 7)
        return 1;
    return all_hex(dot + 1, (size_t)(name + n - 7 - dot - 1));
}

static int named_by(const struct dcp_metadata *md, const char *name)
{
    size_t i;
    for (i = 0; md && i < md->nfiles; i++)
        if (!strcmp(md->files[i], name))
            return 1;
    return 0;
}

/* Whether name is a leftover to remove: a data file or metadata
 * temporary no committed checkpoint names (not data files when keep_data:
 * torch's rank-local checkpoint), rank-local metadata beside a committed
 * .metadata, or the lock's own temporaries (with force, its take-over
 * markers too). */
static int is_leftover(const char *name, const struct dcp_metadata *md,
                       int keep_data, int force)
{
    size_t len = strlen(name);
    if (!strncmp(name, DCP__LOCK_NAME ".", 6)) {
        /* Its publication temporaries (a contender whose temporary goes
         * retries, lock.c), and with force the take-over markers too. */
        return force || (len > 10 && !strcmp(name + len - 4, ".tmp") &&
                         strncmp(name, DCP__LOCK_NAME ".takeover-", 15) != 0);
    }
    if (keep_data && !strncmp(name, "__", 2))
        return 0;
    /* A rank-local checkpoint's __<k>.metadata beside a committed
     * .metadata, which readers prefer, is dead (a plain save over it). */
    return (dcp__leftover_name(name) ||
            (md && dcp__rl_name_rank(name) >= 0)) &&
           !named_by(md, name);
}

/* Removes the leftovers among the names starting with prefix. Returns
 * DCP_ELIMIT (error cleared) when there were more than LIST_MAX names:
 * the first LIST_MAX were handled. */
static int clean_list(int dirfd, const char *prefix,
                      const struct dcp_metadata *md, int keep_data, int force,
                      dcp_storage_entry *ent, uint64_t *files,
                      uint64_t *bytes, struct dcp_err *err)
{
    size_t i, count = 0;
    int rc = dcp__fs_list(dirfd, prefix, LIST_MAX, ent, &count, err), more;
    more = rc == DCP_ELIMIT;
    if (more) {
        dcp__err_clear(err);
        rc = DCP_OK;
    }
    for (i = 0; rc == DCP_OK && i < count; i++) {
        if (!is_leftover(ent[i].name, md, keep_data, force))
            continue;
        rc = dcp__fs_unlink(dirfd, ent[i].name, err);
        if (rc == DCP_OK && files)
            ++*files;
        if (rc == DCP_OK && bytes)
            *bytes += ent[i].size;
    }
    return rc == DCP_OK && more ? DCP_ELIMIT : rc;
}

int dcp__clean_leftovers(int dirfd, const char *path,
                         const struct dcp_metadata *md, int force,
                         uint64_t *files, uint64_t *bytes,
                         struct dcp_err *err)
{
    dcp_storage_entry *ent = dcp__malloc(LIST_MAX * sizeof(*ent));
    size_t i;
    int rc, keep_data;
    if (!ent)
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    /* No .metadata but torch's rank-local __0.metadata: the data files
     * belong to that checkpoint (docs/FORMAT.md §9.2), not leftovers. */
    keep_data = !md && dcp__fs_exists(dirfd, "__0.metadata");
    /* One listing of the directory (one request on an object store);
     * past LIST_MAX names, one per kind of leftover, so that many other
     * files cannot hide them. */
    rc = clean_list(dirfd, "", md, keep_data, force, ent, files, bytes, err);
    if (rc == DCP_ELIMIT) {
        static const char *const kinds[3] = {"__", ".metadata.",
                                             DCP__LOCK_NAME "."};
        rc = DCP_OK;
        for (i = 0; rc == DCP_OK && i < 3; i++) {
            rc = clean_list(dirfd, kinds[i], md, keep_data, force, ent, files,
                            bytes, err);
            if (rc == DCP_ELIMIT) /* the first LIST_MAX now, the rest later */
                rc = DCP_OK;
        }
    }
    /* An object store's incomplete uploads of killed writers' data files
     * and temporaries (never objects: no bytes to count). */
    if (rc == DCP_OK) {
        uint64_t n = 0;
        rc = dcp__fs_abort_uploads(dirfd, dcp__leftover_name, &n, err);
        if (files)
            *files += n;
    }
    dcp__free(ent);
    if (rc != DCP_OK && rc != DCP_ENOTSUP)
        (void)dcp__err_prefix(err, "cannot remove the leftovers in '%s'",
                              path);
    return rc;
}

/* dcp_clean (dcp.h). */
int dcp_clean(dcp_ctx *ctx, const char *dir, unsigned flags,
              dcp_clean_result *res)
{
    struct dcp_metadata *md = NULL;
    struct dcp__lock lk;
    char token[24];
    uint64_t files = 0, bytes = 0;
    int dirfd = -1, rc;
    if (!ctx)
        return DCP_EINVAL;
    dcp__ctx_begin(ctx);
    if (!dir || !*dir || (flags & ~DCP_CLEAN_FORCE))
        return dcp__err(&ctx->err, DCP_EINVAL,
                        "clean: a directory and flags 0 or "
                        "DCP_CLEAN_FORCE needed");
    if (res && res->struct_size < sizeof(*res))
        return dcp__err(&ctx->err, DCP_EINVAL,
                        "clean: result struct_size too small");
    lk.dirfd = -1;
    (void)snprintf(token, sizeof(token), "clean-%08lx",
                   (unsigned long)((unsigned long)getpid() ^
                                   (unsigned long)time(NULL)));
    rc = dcp__fs_open_dir(dir, &dirfd, &ctx->err);
    if (rc == DCP_OK)
        rc = dcp__lock_acquire(dirfd, dir, token,
                               (flags & DCP_CLEAN_FORCE) ? DCP__LOCK_FORCE
                                                         : 0u,
                               &lk, &ctx->err);
    if (rc == DCP_OK && dcp__fs_exists(dirfd, ".metadata"))
        rc = dcp__rd_metadata(dirfd, dir, ctx->max_metadata_bytes, &md,
                              &ctx->err);
    if (rc == DCP_OK)
        rc = dcp__clean_leftovers(dirfd, dir, md,
                                  (flags & DCP_CLEAN_FORCE) != 0, &files,
                                  &bytes, &ctx->err);
    dcp__lock_release(&lk);
    dcp__fs_release(dirfd);
    dcp__meta_free(md);
    if (res) {
        res->files = files;
        res->bytes = bytes;
    }
    return rc;
}
