/*
 * I/O faults through the storage back end (faultfs), single process, at
 * every operation of a save over a committed checkpoint and of a load:
 *  - every operation failing with DCP_EIO or DCP_ENOSPC, transiently (that
 *    operation only) and persistently (it and all later ones);
 *  - every system call beneath the POSIX back end: EINTR and short
 *    transfers (which must be retried: the save succeeds, bit-exact),
 *    ENOSPC/EDQUOT/EIO from pwrite, EIO from fsync and close, EIO and
 *    EXDEV from rename, EIO from unlink, open failures.
 * After each case: the save returned the injected error (or success, when
 * the failed operation was one whose failure is harmless), the directory
 * loads the previous checkpoint bit-exact (the new one if success was
 * reported, or if the failure came after the commit rename and the message
 * says so), no debris after a transient fault, no handle or descriptor
 * leaked (memory leaks: LeakSanitizer in the ASan build), and no fsync was
 * retried on a file whose fsync had failed. The last line of output counts
 * the cases ("fault cases: N passed").
 */
#include <dcp/dcp.h>
#include <dcp/dcp_storage.h>

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "commit_rules.h"
#include "faultfs.h"
#include "refstate.h"
#include "storage.h"
#include "test.h"

static char root[256];
static struct faultfs ff;
static int base_fds;
static long ncases;

static const char *dirpath(const char *name)
{
    static char buf[512];
    if (!root[0]) {
        strcpy(root, "/tmp/dcp-fault-io-XXXXXX");
        if (!mkdtemp(root))
            abort();
    }
    snprintf(buf, sizeof(buf), "%s/%s", root, name);
    return buf;
}

/* Saves the new state into dir through faultfs as configured in ff. */
static int faulty_save(const char *dir, char *msg, size_t msglen)
{
    struct refstate r;
    dcp_ctx_options o = {0};
    dcp_ctx *ctx;
    int rc;
    o.struct_size = sizeof(o);
    o.storage = ff_ops();
    o.storage_impl = &ff;
    if (dcp_ctx_create(&ctx, NULL, &o))
        abort();
    rc = rs_build(&r, RS_SEED_NEW);
    if (!rc)
        rc = dcp_save(ctx, r.st, dir, NULL);
    (void)snprintf(msg, msglen, "%s", dcp_errmsg(ctx));
    rs_free(&r);
    dcp_ctx_free(ctx);
    return rc;
}

/* Loads dir through faultfs; 1 when it got the old state bit-exact. */
static int faulty_load(const char *dir, int *exact, char *msg, size_t msglen)
{
    struct refstate r, o;
    dcp_ctx_options opts = {0};
    dcp_ctx *ctx;
    int rc;
    opts.struct_size = sizeof(opts);
    opts.storage = ff_ops();
    opts.storage_impl = &ff;
    if (dcp_ctx_create(&ctx, NULL, &opts) || rs_build(&r, 0) ||
        rs_build(&o, RS_SEED_OLD))
        abort();
    rc = dcp_load(ctx, r.st, dir, NULL);
    *exact = rc == 0 && rs_equal(&r, &o);
    (void)snprintf(msg, msglen, "%s", dcp_errmsg(ctx));
    rs_free(&r);
    rs_free(&o);
    dcp_ctx_free(ctx);
    return rc;
}

/* What a case promises about the save's result. */
struct expect {
    int code;      /* the error code the fault must surface as */
    int must_fail; /* 0: success is acceptable (harmless operation) */
    int no_debris; /* a transient fault leaves no stray file (except when
                      it hit a removal, or came after the commit rename:
                      the old files then stay, in case the rename is lost) */
};

/*
 * Runs one save case: fresh committed old checkpoint, the faulty save,
 * then every check. Returns NULL or a description of what went wrong.
 */
/*
 * The index in ff's trace of the first operation that touched a file of
 * the committed checkpoint (names in old, "|a|b|") before the commit
 * rename, or -1: until .metadata is replaced, the old checkpoint's files
 * must not be created, written, renamed or removed.
 */
static long touched_old_files(const char *old)
{
    size_t i;
    char pat[100];
    for (i = 0; i < ff.ntrace; i++) {
        const struct ff_event *e = &ff.trace[i];
        if (e->op == FF_RENAME && e->rc == 0 &&
            cr_commit_rename(e->name))
            return -1;
        if (e->op != FF_CREATE && e->op != FF_WRITE && e->op != FF_UNLINK &&
            e->op != FF_RENAME)
            continue;
        snprintf(pat, sizeof(pat), "|%s|", e->name);
        if (strstr(old, pat))
            return (long)i;
    }
    return -1;
}

static int last_rc;

/* The fault hit the reading of the committed .metadata: the save then
 * cannot know the old files, writes under fresh names and leaves the old
 * files behind when it succeeds. */
static int fault_was_read(void)
{
    return ff.first_op == FF_EXISTS || ff.first_op == FF_OPEN_READ ||
           ff.first_op == FF_READ || ff.first_sys == FS_FSTATAT ||
           ff.first_sys == FS_FSTAT || ff.first_sys == FS_PREAD ||
           ff.first_sys == FS_OPENAT;
}

static const char *save_case(const char *label, const struct expect *x,
                             char *why, size_t whylen)
{
    const char *dir = dirpath("ckpt");
    char msg[1024], lmsg[1024], old[1024];
    int rc, got, debris;
    long touched;
    rs_rmtree(dir);
    if (rs_save(dir, RS_SEED_OLD, 0) != 0 ||
        rs_files(dir, old, sizeof(old)) != 0)
        return "setup failed";
    ff.tracing = 1;
    rc = faulty_save(dir, msg, sizeof(msg));
    last_rc = rc;
    ncases++;
    touched = touched_old_files(old);
    got = rs_check(dir, lmsg, sizeof(lmsg));
    debris = rs_debris(dir);
    if (dcp__fs_open_handles() != 0)
        snprintf(why, whylen, "%s: %zu storage handles leaked", label,
                 dcp__fs_open_handles());
    else if (rs_nfds() != base_fds)
        snprintf(why, whylen, "%s: %d descriptors leaked", label,
                 rs_nfds() - base_fds);
    else if (touched >= 0)
        snprintf(why, whylen,
                 "%s: %s of '%s', a file of the committed checkpoint, "
                 "before the commit",
                 label, ff_op_name(ff.trace[touched].op),
                 ff.trace[touched].name);
    else if (ff.sync_retried)
        snprintf(why, whylen, "%s: fsync retried after it failed", label);
    else if (rc == 0 && got != RS_SEED_NEW)
        snprintf(why, whylen, "%s: save succeeded but load gives %d (%.400s)",
                 label, got, lmsg);
    else if (rc == 0 && x->must_fail)
        snprintf(why, whylen, "%s: save succeeded despite the fault", label);
    else if (rc != 0 && rc != x->code)
        snprintf(why, whylen, "%s: save returned %s, want %s (%.400s)", label,
                 dcp_err_name(rc), dcp_err_name(x->code), msg);
    else if (rc != 0 && strstr(msg, "after .metadata was renamed") &&
             got != RS_SEED_NEW)
        snprintf(why, whylen, "%s: failed after the rename, load gives %d",
                 label, got);
    else if (rc != 0 && !strstr(msg, "after .metadata was renamed") &&
             got != RS_SEED_OLD)
        snprintf(why, whylen,
                 "%s: failed (%.400s) but the old checkpoint does not load "
                 "bit-exact: %d (%.400s)",
                 label, msg, got, lmsg);
    else if (rc != 0 && !strstr(msg, "nothing committed") &&
             !strstr(msg, "after .metadata was renamed"))
        snprintf(why, whylen, "%s: message does not say what happened: %.400s",
                 label, msg);
    else if (x->no_debris && debris != 0 && ff.first_op != FF_UNLINK &&
             ff.first_sys != FS_UNLINKAT && !(rc == 0 && fault_was_read()) &&
             !strstr(msg, "after .metadata was renamed"))
        snprintf(why, whylen, "%s: %d stray files left", label, debris);
    else
        return NULL;
    return why;
}

/* Operations of a clean save over a committed checkpoint, by kind. */
static uint64_t count_save_ops(uint64_t *per_op)
{
    char msg[1024], why[256];
    struct expect x = {0, 0, 1};
    ff_reset(&ff);
    if (save_case("clean", &x, why, sizeof(why)))
        abort();
    if (per_op)
        memcpy(per_op, ff.op_count, sizeof(ff.op_count));
    (void)msg;
    return ff.nops;
}

TEST(save_every_op_fails)
{
    static const int codes[2] = {DCP_EIO, DCP_ENOSPC};
    uint64_t m = count_save_ops(NULL), k;
    int c, pers;
    char why[1536], label[128];
    ASSERT(m > 10);
    for (c = 0; c < 2; c++)
        for (pers = 0; pers < 2; pers++)
            for (k = 1; k <= m; k++) {
                struct expect x = {codes[c], 0, !pers};
                const char *bad;
                ff_reset(&ff);
                ff.fail_at = k;
                ff.fail_persistent = pers;
                ff.fail_code = codes[c];
                snprintf(label, sizeof(label), "op %llu/%llu %s %s",
                         (unsigned long long)k, (unsigned long long)m,
                         dcp_err_name(codes[c]),
                         pers ? "persistent" : "transient");
                bad = save_case(label, &x, why, sizeof(why));
                if (bad)
                    FAIL_AT_("%s", bad);
                ASSERT_U64_EQ(ff.injected >= 1, 1);
            }
}

/* Entries in dir, "." and ".." not counted; -1 if it does not exist. */
static int nentries(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    int n = 0;
    if (!d)
        return -1;
    while ((de = readdir(d)))
        n += strcmp(de->d_name, ".") && strcmp(de->d_name, "..");
    closedir(d);
    return n;
}

/* A save into a directory that does not exist yet: on failure there is no
 * checkpoint (DCP_ENOENT, saying so) and no file left behind. */
TEST(save_fresh_dir_every_op_fails)
{
    const char *dir = dirpath("fresh/sub");
    char msg[1024], lmsg[1024];
    uint64_t m = 0, k;
    int pers, rc, got;
    for (pers = 0; pers < 2; pers++)
        for (k = 1; k == 1 || k <= m; k++) {
            rs_rmtree(dir);
            rs_rmtree(dirpath("fresh"));
            ff_reset(&ff);
            ff.fail_at = m ? k : 0;
            ff.fail_persistent = pers;
            ff.fail_code = DCP_EIO;
            rc = faulty_save(dir, msg, sizeof(msg));
            ncases += m != 0;
            if (!m) {
                ASSERT_OK(rc);
                m = ff.nops;
                k = 0;
                continue;
            }
            got = rs_check(dir, lmsg, sizeof(lmsg));
            ASSERT_EQ(dcp__fs_open_handles(), 0);
            ASSERT_EQ(rs_nfds(), base_fds);
            if (rc == 0) {
                ASSERT_EQ(got, RS_SEED_NEW);
                continue;
            }
            if (rc != DCP_EIO)
                FAIL_AT_("op %llu: %s (%.400s)", (unsigned long long)k,
                         dcp_err_name(rc), msg);
            if (strstr(msg, "after .metadata was renamed")) {
                ASSERT_EQ(got, RS_SEED_NEW);
                continue;
            }
            ASSERT_EQ(got, DCP_ENOENT);
            ASSERT(strstr(lmsg, "no checkpoint") || strstr(lmsg, "not exist"));
            if (!pers && ff.first_op != FF_UNLINK && nentries(dir) > 0)
                FAIL_AT_("op %llu (%s): %d files left", (unsigned long long)k,
                         ff_op_name(ff.first_op), nentries(dir));
        }
    ASSERT(m > 10);
}

/* EINTR and short transfers at every pread/pwrite: retried, success. */
TEST(save_eintr_and_short)
{
    static const enum ff_sys_fault kinds[2] = {FFS_EINTR, FFS_SHORT};
    uint64_t n, k;
    int i, pers;
    char why[1536], label[128];
    /* Count the pwrite/pread calls of a clean save. */
    ff_reset(&ff);
    ff.sys_fault = FFS_ERRNO;
    ff.sys_mask = (1u << FS_PWRITE) | (1u << FS_PREAD);
    {
        struct expect x = {0, 0, 1};
        ASSERT(save_case("count", &x, why, sizeof(why)) == NULL);
    }
    n = ff.nsys;
    ASSERT(n >= 5);
    for (i = 0; i < 2; i++)
        for (pers = 0; pers < 2; pers++)
            for (k = 1; k <= n; k++) {
                struct expect x = {0, 0, 1};
                const char *bad;
                if (pers && kinds[i] == FFS_EINTR)
                    continue; /* would never make progress */
                ff_reset(&ff);
                ff.sys_fault = kinds[i];
                ff.sys_mask = (1u << FS_PWRITE) | (1u << FS_PREAD);
                ff.sys_at = k;
                ff.sys_persistent = pers;
                snprintf(label, sizeof(label), "syscall %llu %s%s",
                         (unsigned long long)k,
                         kinds[i] == FFS_EINTR ? "EINTR" : "short",
                         pers ? " persistent" : "");
                bad = save_case(label, &x, why, sizeof(why));
                if (bad)
                    FAIL_AT_("%s", bad);
                /* Success, bit-exact: save_case checked the load. */
                ASSERT(rs_check(dirpath("ckpt"), NULL, 0) == RS_SEED_NEW);
            }
}

/* errno values of system calls, at every call of that kind. */
TEST(save_syscall_errors)
{
    static const struct {
        enum ff_sys sys;
        int err;
        int code;
        int must_fail;
    } cases[] = {
        {FS_PWRITE, ENOSPC, DCP_ENOSPC, 1}, {FS_PWRITE, EDQUOT, DCP_ENOSPC, 1},
        {FS_PWRITE, EIO, DCP_EIO, 1},       {FS_FSYNC, EIO, DCP_EIO, 1},
        {FS_FSYNC, EINTR, DCP_EIO, 1},      {FS_CLOSE, EIO, DCP_EIO, 0},
        {FS_RENAMEAT, EIO, DCP_EIO, 1},     {FS_RENAMEAT, EXDEV, DCP_EIO, 1},
        {FS_OPENAT, EMFILE, DCP_EIO, 0},    {FS_OPENAT, ENOSPC, DCP_ENOSPC, 0},
        {FS_UNLINKAT, EIO, DCP_EIO, 0},     {FS_MKDIR, EACCES, DCP_EIO, 0},
        {FS_FSTATAT, EIO, DCP_EIO, 0},      {FS_OPEN, EIO, DCP_EIO, 1},
        {FS_PREAD, EIO, DCP_EIO, 0},
    };
    size_t c;
    char why[1536], label[128];
    for (c = 0; c < DCP_ARRAY_LEN(cases); c++) {
        uint64_t n, k;
        int pers;
        /* How many calls of this kind a clean save makes. */
        ff_reset(&ff);
        ff.sys_fault = FFS_ERRNO;
        ff.sys_mask = 1u << cases[c].sys;
        {
            struct expect x = {0, 0, 1};
            ASSERT(save_case("count", &x, why, sizeof(why)) == NULL);
        }
        n = ff.nsys;
        for (pers = 0; pers < 2; pers++)
            for (k = 1; k <= n; k++) {
                /* A failing fsync or close of a written file, rename and
                 * write always fail the save; the others may hit calls
                 * whose failure is harmless (closing a file that was only
                 * read, removing the old checkpoint's files). */
                struct expect x = {cases[c].code, 0, !pers};
                const char *bad;
                ff_reset(&ff);
                ff.sys_fault = FFS_ERRNO;
                ff.sys_mask = 1u << cases[c].sys;
                ff.sys_errno = cases[c].err;
                ff.sys_at = k;
                ff.sys_persistent = pers;
                snprintf(label, sizeof(label), "syscall %d #%llu/%llu %s%s",
                         (int)cases[c].sys, (unsigned long long)k,
                         (unsigned long long)n, strerror(cases[c].err),
                         pers ? " persistent" : "");
                bad = save_case(label, &x, why, sizeof(why));
                if (bad)
                    FAIL_AT_("%s", bad);
                if (cases[c].must_fail && ff.injected)
                    ASSERT(last_rc != 0);
            }
    }
}

/* Every operation of a load failing: the error surfaces (or the load
 * succeeds bit-exact, for a harmless one), nothing leaks; EINTR and short
 * reads are retried. */
TEST(load_every_op_fails)
{
    const char *dir = dirpath("load");
    char msg[1024];
    uint64_t m, k;
    int pers, exact, rc;
    rs_rmtree(dir);
    ASSERT_OK(rs_save(dir, RS_SEED_OLD, 0));
    ff_reset(&ff);
    ASSERT_OK(faulty_load(dir, &exact, msg, sizeof(msg)));
    ASSERT(exact);
    m = ff.nops;
    ASSERT(m >= 5);
    for (pers = 0; pers < 2; pers++)
        for (k = 1; k <= m; k++) {
            ff_reset(&ff);
            ff.fail_at = k;
            ff.fail_persistent = pers;
            ff.fail_code = DCP_EIO;
            rc = faulty_load(dir, &exact, msg, sizeof(msg));
            ncases++;
            if (rc != 0 && rc != DCP_EIO)
                FAIL_AT_("load op %llu: %s (%.400s)", (unsigned long long)k,
                         dcp_err_name(rc), msg);
            if (rc == 0 && !exact)
                FAIL_AT_("load op %llu: success but not bit-exact",
                         (unsigned long long)k);
            ASSERT_EQ(dcp__fs_open_handles(), 0);
            ASSERT_EQ(rs_nfds(), base_fds);
        }
    for (pers = 0; pers < 2; pers++)
        for (k = 1; k <= 40; k++) {
            ff_reset(&ff);
            ff.sys_fault = pers ? FFS_SHORT : FFS_EINTR;
            ff.sys_mask = 1u << FS_PREAD;
            ff.sys_at = k;
            ff.sys_persistent = pers;
            rc = faulty_load(dir, &exact, msg, sizeof(msg));
            ncases++;
            ASSERT_OK(rc);
            ASSERT(exact);
            if (!ff.injected)
                break;
        }
}

/* A failed fsync is final: the save fails, the same file's fsync is never
 * called again, and nothing is committed. */
TEST(fsync_failure_is_final)
{
    char why[1536];
    struct expect x = {DCP_EIO, 1, 1};
    ff_reset(&ff);
    ff.sys_fault = FFS_ERRNO;
    ff.sys_mask = 1u << FS_FSYNC;
    ff.sys_errno = EIO;
    ff.sys_at = 1;
    {
        const char *bad = save_case("first fsync", &x, why, sizeof(why));
        if (bad)
            FAIL_AT_("%s", bad);
    }
    ASSERT_EQ(ff.injected, 1);
    ASSERT_EQ(ff.sync_retried, 0);
    /* Exactly one sync operation reached the back end: no retry. */
    ASSERT_EQ(ff.op_count[FF_SYNC], 1);
    ASSERT_EQ(rs_check(dirpath("ckpt"), NULL, 0), RS_SEED_OLD);
}

int main(void)
{
    int rc;
    ff_init(&ff);
    base_fds = rs_nfds();
    RUN(fsync_failure_is_final);
    RUN(save_every_op_fails);
    RUN(save_fresh_dir_every_op_fails);
    RUN(save_eintr_and_short);
    RUN(save_syscall_errors);
    RUN(load_every_op_fails);
    ff_release(&ff);
    printf("fault cases: %ld run\n", ncases);
    if (root[0])
        rs_rmtree(root);
    rc = TEST_SUMMARY();
    return rc;
}
