/*
 * Checkpoints that live safely (issue 14 items 1-3): one writer per path,
 * no mixed loads, no leftovers.
 *  - two_writers: two forked processes save to one path at once (an old
 *    checkpoint there): each gets DCP_OK or DCP_EBUSY naming the holder;
 *    afterwards the path loads bit-exact one successful save, holds no
 *    leftover and no lock.
 *  - import_race: two `dcptool import`s into one new directory at once:
 *    one wins, the other fails (DCP_EBUSY, or "already holds a
 *    checkpoint" when it came strictly after); the result equals the
 *    source.
 *  - refused_import: an import into a directory holding a checkpoint, or
 *    locked by a live writer, changes no byte of it.
 *  - readers_during_overwrites: a forked 2-rank writer overwrites one path
 *    again and again while this process loads it through a back end whose
 *    open sleeps: every load is DCP_OK with the data of exactly one save,
 *    or a clean error, never mixed data with DCP_OK.
 *  - kill9_leftovers: a forked saver killed (SIGKILL) at random points of
 *    its saves: the path still loads one committed save bit-exact; the
 *    next save (or dcp_clean, or dcptool clean) takes the dead writer's
 *    lock over and removes the debris, never a committed file.
 *  - stale_locks: a lock of a dead process is taken over (also by two
 *    takers at once), one of a live process or another host is DCP_EBUSY,
 *    dcp_clean --force removes what cannot be checked.
 *  - foreign_record: a data file of another save under the name .metadata
 *    gives: load and verify are DCP_ECORRUPT naming the file.
 *  - clean_filter: dcp_clean removes only dcp's own leftover names, never
 *    a committed file, a user's file or a symbolic link.
 * Usage: test_lifecycle [--full]: the rounds of docs/RELIABILITY.md
 * (scripts/reliability.sh); the default, for make check, fewer.
 */
#define _GNU_SOURCE
#include <dcp/dcp.h>
#include <dcp/dcp_convert.h>
#include <dcp/dcp_manager.h>
#include <dcp/dcp_storage.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "forkcomm.h"
#include "test.h"

#define NEL 16384 /* int32 elements per rank: 64 KiB */
#define NB  16

static char root[512];
static int full;
static const dcp_save_options nosync = {sizeof(dcp_save_options), 1, 0, NULL};

static const char *sub(const char *name)
{
    static char buf[8][700];
    static int k;
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof(buf[k]), "%s/%s", root, name);
    return buf[k];
}

/* ---------------------------------------------------------- state */

/* w: int32 [n * NEL], element i = wval(seed, i); b: int32 [n * NB],
 * every element = seed. Rank r of n holds its rows. */
struct data {
    int32_t *w, *b;
    dcp_state *st;
};

/* Element i of seed's w: distinct per seed, no overflow (unsigned). */
static int32_t wval(int seed, int64_t i)
{
    return (int32_t)(((uint32_t)seed * 2654435761u + (uint32_t)i) & 0x7fffffffu);
}

static int data_make(struct data *d, int rank, int n, int seed, int whole)
{
    int64_t sw[1] = {(int64_t)n * NEL}, sb[1] = {(int64_t)n * NB};
    int64_t ow[1] = {whole ? 0 : (int64_t)rank * NEL};
    int64_t ob[1] = {whole ? 0 : (int64_t)rank * NB};
    int64_t lw[1] = {whole ? sw[0] : NEL}, lb[1] = {whole ? sb[0] : NB};
    int64_t i;
    d->w = malloc((size_t)lw[0] * 4);
    d->b = malloc((size_t)lb[0] * 4);
    if (!d->w || !d->b || dcp_state_create(&d->st) != DCP_OK)
        return -1;
    for (i = 0; i < lw[0]; i++)
        d->w[i] = wval(seed, ow[0] + i);
    for (i = 0; i < lb[0]; i++)
        d->b[i] = seed;
    if (dcp_state_add_tensor(d->st, "w", DCP_I32, 1, sw, ow, lw, d->w,
                             DCP_MEM_HOST) != DCP_OK ||
        dcp_state_add_tensor(d->st, "b", DCP_I32, 1, sb, ob, lb, d->b,
                             DCP_MEM_HOST) != DCP_OK)
        return -1;
    return 0;
}

static void data_free(struct data *d)
{
    dcp_state_free(d->st);
    free(d->w);
    free(d->b);
}

/* The seed whose data d (whole, n ranks) holds, -1 when it is not exactly
 * one save's. */
static int data_seed(const struct data *d, int n)
{
    int32_t s = d->b[0];
    int64_t i;
    for (i = 0; i < (int64_t)n * NB; i++)
        if (d->b[i] != s)
            return -1;
    for (i = 0; i < (int64_t)n * NEL; i++)
        if (d->w[i] != wval(s, i))
            return -1;
    return s;
}

/* Saves seed into dir from one process, n ranks' worth (ctx may be NULL:
 * a fresh one). */
static int save_seed_n(dcp_ctx *ctx, const char *dir, int seed, int n)
{
    struct data d;
    dcp_ctx *own = NULL;
    int rc;
    if (!ctx && dcp_ctx_create(&own, NULL, NULL) != DCP_OK)
        return DCP_ENOMEM;
    if (data_make(&d, 0, n, seed, 1) != 0)
        return DCP_ENOMEM;
    rc = dcp_save(ctx ? ctx : own, d.st, dir, &nosync);
    data_free(&d);
    dcp_ctx_free(own);
    return rc;
}

static int save_seed(dcp_ctx *ctx, const char *dir, int seed)
{
    return save_seed_n(ctx, dir, seed, 1);
}

/* Loads dir (n ranks' worth) into one process: the seed, or -1 when the
 * data is mixed; *rc the load's code. */
static int load_seed(dcp_ctx *ctx, const char *dir, int n, int *rc)
{
    struct data d;
    int s = -1;
    if (data_make(&d, 0, n, 0, 1) != 0) {
        *rc = DCP_ENOMEM;
        return -1;
    }
    memset(d.w, 0xA5, (size_t)n * NEL * 4);
    memset(d.b, 0xA5, (size_t)n * NB * 4);
    *rc = dcp_load(ctx, d.st, dir, NULL);
    if (*rc == DCP_OK)
        s = data_seed(&d, n);
    data_free(&d);
    return s;
}

/* ------------------------------------------------------ directory */

/* Names in dir that start with prefix and end with suffix. */
static int count_names(const char *dir, const char *prefix, const char *suffix)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;
    while (d && (e = readdir(d)) != NULL) {
        size_t l = strlen(e->d_name), ls = strlen(suffix);
        n += strncmp(e->d_name, prefix, strlen(prefix)) == 0 && l >= ls &&
             strcmp(e->d_name + l - ls, suffix) == 0 &&
             strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    }
    if (d)
        closedir(d);
    return n;
}

/* Bytes of the files in dir whose names start with "__". */
static long long data_bytes(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    long long n = 0;
    char p[1400];
    struct stat sb;
    while (d && (e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "__", 2) != 0)
            continue;
        snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
        if (lstat(p, &sb) == 0)
            n += sb.st_size;
    }
    if (d)
        closedir(d);
    return n;
}

static void rm_rf(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[1400];
    while (d && (e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
        if (unlink(p) != 0)
            rm_rf(p);
    }
    if (d)
        closedir(d);
    (void)rmdir(dir);
}

/* The distinct data files .metadata names (at most 8) into names. */
static size_t committed_files(dcp_ctx *ctx, const char *dir,
                              char names[8][300])
{
    dcp_metadata *md = NULL;
    size_t n = 0, i, c, k;
    if (dcp_metadata_open(ctx, dir, &md) != DCP_OK)
        return 0;
    for (i = 0; i < dcp_metadata_count(md); i++) {
        dcp_entry_info info;
        if (dcp_metadata_entry(md, i, &info) != DCP_OK)
            continue;
        for (c = 0; c < info.nchunks; c++) {
            dcp_chunk_info ci;
            if (dcp_metadata_chunk(md, i, c, &ci) != DCP_OK)
                continue;
            for (k = 0; k < n && strcmp(names[k], ci.file); k++)
                ;
            if (k == n && n < 8)
                snprintf(names[n++], 300, "%s", ci.file);
        }
    }
    dcp_metadata_free(md);
    return n;
}

/* The files .metadata names: exactly these data files are there, no
 * temporary, no lock. */
static int only_committed(dcp_ctx *ctx, const char *dir)
{
    char names[8][300];
    size_t nfiles = committed_files(ctx, dir, names);
    int ok;
    if (!nfiles)
        return 0;
    ok = count_names(dir, "__", "") == (int)nfiles &&
         count_names(dir, "", ".tmp") == 0 &&
         count_names(dir, ".lock", "") == 0;
    if (!ok)
        fprintf(stderr, "  %s: %d data files (%zu named), %d .tmp, %d .lock*\n",
                dir, count_names(dir, "__", ""), nfiles,
                count_names(dir, "", ".tmp"), count_names(dir, ".lock", ""));
    return ok;
}

/* ------------------------------------------------ shared results */

struct result {
    int rc;
    int seed[2]; /* the overwriting writer's ranks (res[6]) */
    char msg[512];
};
static struct result *res; /* 8, shared with the children */

static void keep(int i, dcp_ctx *ctx, int rc)
{
    res[i].rc = rc;
    snprintf(res[i].msg, sizeof(res[i].msg), "%s", ctx ? dcp_errmsg(ctx) : "");
}

/* Waits until the byte at the read end of go arrives (the start gun). */
static void wait_go(int fd)
{
    char c;
    while (read(fd, &c, 1) < 0 && errno == EINTR)
        ;
}

/* ------------------------------------------------------ two writers */

TEST(two_writers)
{
    const char *dir = sub("race");
    dcp_ctx *ctx;
    int rounds = full ? 1000 : 100, r, ok1 = 0, ok2 = 0, busy = 0;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT_OK(save_seed(ctx, dir, 1)); /* the old checkpoint */
    for (r = 0; r < rounds; r++) {
        int go[2], k, nok = 0, seed, lrc;
        pid_t pid[2];
        ASSERT_EQ(pipe(go), 0);
        for (k = 0; k < 2; k++) {
            pid[k] = fork();
            ASSERT(pid[k] >= 0);
            if (pid[k] == 0) {
                dcp_ctx *c = NULL;
                close(go[1]);
                if (dcp_ctx_create(&c, NULL, NULL) != DCP_OK)
                    _exit(3);
                wait_go(go[0]);
                keep(k, c, save_seed(c, dir, 10 + 2 * r + k));
                dcp_ctx_free(c);
                _exit(0);
            }
        }
        close(go[0]);
        close(go[1]); /* go */
        for (k = 0; k < 2; k++) {
            int status;
            ASSERT_EQ(waitpid(pid[k], &status, 0), pid[k]);
            ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        }
        for (k = 0; k < 2; k++) {
            if (res[k].rc == DCP_OK) {
                nok++;
            } else {
                ASSERT_RC(res[k].rc, DCP_EBUSY);
                ASSERT(strstr(res[k].msg, "locked by another writer"));
                ASSERT(strstr(res[k].msg, "pid "));
                ASSERT(strstr(res[k].msg, dir));
                busy++;
            }
        }
        ASSERT(nok >= 1); /* never both refused */
        ok1 += nok == 1;
        ok2 += nok == 2;
        seed = load_seed(ctx, dir, 1, &lrc);
        ASSERT_OK(lrc);
        /* One successful save's data, bit-exact. */
        ASSERT((seed == 10 + 2 * r && res[0].rc == DCP_OK) ||
               (seed == 11 + 2 * r && res[1].rc == DCP_OK));
        ASSERT(only_committed(ctx, dir));
    }
    printf("    two writers, %d rounds: %d with one save and one DCP_EBUSY, "
           "%d with both saves (one after the other); every round loads "
           "one successful save bit-exact, no leftover, no lock\n",
           rounds, ok1, ok2);
    ASSERT(busy > 0);
    dcp_ctx_free(ctx);
}

/* ------------------------------------------------------ import race */

static int run_tool(const char *const argv[], char *err, size_t errcap)
{
    int ep[2], status;
    pid_t pid;
    ssize_t n = 0, k;
    if (pipe(ep) != 0)
        return -1;
    pid = fork();
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        dup2(null, 1);
        dup2(ep[1], 2);
        close(ep[0]);
        char *av[16];
        int i;
        for (i = 0; i < 15 && argv[i]; i++)
            av[i] = strdup(argv[i]);
        av[i] = NULL;
        execv(av[0], av);
        _exit(127);
    }
    close(ep[1]);
    while (err && (size_t)n + 1 < errcap &&
           (k = read(ep[0], err + n, errcap - 1 - (size_t)n)) > 0)
        n += k;
    if (err)
        err[n] = '\0';
    close(ep[0]);
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
        return -1;
    return WEXITSTATUS(status);
}

TEST(import_race)
{
    const char *tool = getenv("DCPTOOL");
    char src[700], st[700], ref[700]; /* sub()'s buffers are reused */
    dcp_ctx *ctx;
    int rounds = full ? 100 : 20, r, after = 0, busy = 0;
    if (!tool) {
        printf("    import_race: DCPTOOL not set, skipped\n");
        return;
    }
    snprintf(src, sizeof(src), "%s", sub("imp-src"));
    snprintf(st, sizeof(st), "%s", sub("imp.safetensors"));
    snprintf(ref, sizeof(ref), "%s", sub("imp-ref"));
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    /* 8 MiB: long enough for the two imports to overlap. */
    ASSERT_OK(save_seed_n(ctx, src, 7, 128));
    ASSERT_OK(dcp_export(ctx, src, st, NULL, NULL));
    ASSERT_OK(dcp_import(ctx, st, ref, NULL, NULL));
    for (r = 0; r < rounds; r++) {
        char dir[700], name[64];
        const char *argv[] = {tool, "import", st, dir, "--no-fsync",
                              "--quiet", NULL};
        const char *diff[] = {tool, "diff", ref, dir, NULL};
        int go[2], k, nok = 0, lrc;
        pid_t pid[2];
        snprintf(name, sizeof(name), "imp-%d", r);
        snprintf(dir, sizeof(dir), "%s", sub(name));
        ASSERT_EQ(pipe(go), 0);
        for (k = 0; k < 2; k++) {
            pid[k] = fork();
            ASSERT(pid[k] >= 0);
            if (pid[k] == 0) {
                close(go[1]);
                wait_go(go[0]);
                res[k].rc = run_tool(argv, res[k].msg, sizeof(res[k].msg));
                _exit(0);
            }
        }
        close(go[0]);
        close(go[1]);
        for (k = 0; k < 2; k++) {
            int status;
            ASSERT_EQ(waitpid(pid[k], &status, 0), pid[k]);
        }
        for (k = 0; k < 2; k++) {
            if (res[k].rc == 0) {
                nok++;
                continue;
            }
            ASSERT_EQ(res[k].rc, 1);
            if (strstr(res[k].msg, "locked by another writer")) {
                busy++;
            } else {
                if (!strstr(res[k].msg, "already holds a checkpoint"))
                    fprintf(stderr, "  import %d: %s\n", k, res[k].msg);
                ASSERT(strstr(res[k].msg, "already holds a checkpoint"));
                after++;
            }
        }
        ASSERT_EQ(nok, 1);
        ASSERT_EQ(run_tool(diff, NULL, 0), 0);
        ASSERT_EQ(load_seed(ctx, dir, 128, &lrc), 7);
        ASSERT_OK(lrc);
        ASSERT_OK(dcp_verify(ctx, dir));
        ASSERT(only_committed(ctx, dir));
    }
    printf("    two dcptool imports into one new directory, %d rounds: one "
           "import each round, the other refused (%d DCP_EBUSY, %d "
           "strictly after: already a checkpoint); every result equals the "
           "source\n",
           rounds, busy, after);
    dcp_ctx_free(ctx);
}

/* --------------------------------------------------- refused import */

static unsigned char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    unsigned char *p = NULL;
    long len;
    if (!f)
        return NULL;
    if (fseek(f, 0, SEEK_END) == 0 && (len = ftell(f)) >= 0 &&
        fseek(f, 0, SEEK_SET) == 0 && (p = malloc((size_t)len + 1)) &&
        fread(p, 1, (size_t)len, f) != (size_t)len) {
        free(p);
        p = NULL;
    }
    if (p)
        *n = (size_t)len;
    fclose(f);
    return p;
}

TEST(refused_import)
{
    const char *dir = sub("keep"), *src = sub("keep-src");
    const char *st = sub("keep.safetensors");
    char data[800], meta[800], lock[800];
    unsigned char *d0, *m0, *d1, *m1;
    size_t nd0 = 0, nm0 = 0, nd1 = 0, nm1 = 0;
    dcp_ctx *ctx;
    int lrc;
    FILE *f;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT_OK(save_seed(ctx, src, 3));
    ASSERT_OK(dcp_export(ctx, src, st, NULL, NULL));
    ASSERT_OK(save_seed(ctx, dir, 4));
    snprintf(data, sizeof(data), "%s/__0_0.distcp", dir);
    snprintf(meta, sizeof(meta), "%s/.metadata", dir);
    d0 = slurp(data, &nd0);
    m0 = slurp(meta, &nm0);
    ASSERT(d0 && m0);
    /* The documented refusal: nothing of the checkpoint touched. */
    ASSERT_RC(dcp_import(ctx, st, dir, NULL, NULL), DCP_EEXIST);
    ASSERT(strstr(dcp_errmsg(ctx), "already holds a checkpoint"));
    /* A live writer's lock (this process's parent: alive, this host). */
    snprintf(lock, sizeof(lock), "%s/.lock", dir);
    f = fopen(lock, "w");
    ASSERT(f);
    {
        char host[256] = "";
        (void)gethostname(host, sizeof(host) - 1);
        fprintf(f, "dcp-lock 1\nhost=%s\nboot=-\npid=1\nstart=0\n"
                   "token=feedface\ntime=0\n",
                host);
    }
    fclose(f);
    ASSERT_RC(dcp_import(ctx, st, dir, NULL, NULL), DCP_EBUSY);
    ASSERT(strstr(dcp_errmsg(ctx), "pid 1"));
    ASSERT_EQ(unlink(lock), 0);
    d1 = slurp(data, &nd1);
    m1 = slurp(meta, &nm1);
    ASSERT(d1 && m1 && nd1 == nd0 && nm1 == nm0);
    ASSERT(memcmp(d0, d1, nd0) == 0 && memcmp(m0, m1, nm0) == 0);
    ASSERT_EQ(load_seed(ctx, dir, 1, &lrc), 4);
    ASSERT_OK(lrc);
    printf("    refused import (a checkpoint there, a live writer's lock): "
           "the checkpoint bit-exact, loads\n");
    free(d0);
    free(m0);
    free(d1);
    free(m1);
    dcp_ctx_free(ctx);
}

/* -------------------------------------- readers during overwrites */

/* The POSIX back end whose open for reading sleeps (a busy network file
 * system): the window between reading .metadata and opening the data
 * files that a reader racing an overwrite falls into. */
static long slow_us;
static dcp_storage_ops slow_ops;

static int slow_open_read(void *impl, void *dir, const char *name,
                          void **file, uint64_t *size, struct dcp_err *err)
{
    struct timespec ts = {0, slow_us * 1000};
    (void)nanosleep(&ts, NULL);
    return dcp_storage_posix()->open_read(impl, dir, name, file, size, err);
}

struct writer_arg {
    const char *dir;
    int first;
    volatile int *seed; /* [2]: each rank's current seed (shared) */
    volatile int *stop; /* shared: the seed at which every rank stops */
};

/* A rank of the overwriting writer: seeds first, first + 1, ... until
 * *stop (set by the parent to a seed no rank has reached: the ranks are
 * within one save of each other, so every rank stops at the same one). */
static int writer_rank(int rank, dcp_comm *comm, void *arg)
{
    struct writer_arg *a = arg;
    dcp_ctx *ctx = NULL;
    int seed, rc = 0;
    if (dcp_ctx_create(&ctx, comm, NULL) != DCP_OK)
        return 3;
    for (seed = a->first; rc == 0; seed++) {
        struct data d;
        a->seed[rank] = seed;
        __sync_synchronize();
        if (*a->stop && seed >= *a->stop)
            break;
        if (data_make(&d, rank, 2, seed, 0) != 0)
            return 5;
        rc = dcp_save(ctx, d.st, a->dir, &nosync) == DCP_OK ? 0 : 6;
        data_free(&d);
    }
    dcp_ctx_free(ctx);
    return rc;
}

TEST(readers_during_overwrites)
{
    const char *dir = sub("readers");
    struct writer_arg wa;
    dcp_ctx_options o;
    dcp_ctx *ctx;
    pid_t pids[2];
    int loads = 1000, i, k, ok = 0, err = 0, status;
    int seen[64] = {0};
    volatile int *stop = (volatile int *)&res[7].rc;
    slow_us = full ? 20000 : 500;
    slow_ops = *dcp_storage_posix();
    slow_ops.open_read = slow_open_read;
    memset(&o, 0, sizeof(o));
    o.struct_size = sizeof(o);
    o.storage = &slow_ops;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, &o));
    wa.dir = dir;
    wa.seed = res[6].seed;
    wa.stop = stop;
    /* A first checkpoint (seed 100), then the writer overwrites it
     * continuously (101, ...). */
    {
        pid_t p0[2];
        wa.first = 100;
        *stop = 101;
        ASSERT_EQ(fc_spawn(2, writer_rank, &wa, p0), 0);
        for (k = 0; k < 2; k++) {
            ASSERT_EQ(waitpid(p0[k], &status, 0), p0[k]);
            ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        }
    }
    wa.first = 101;
    wa.seed[0] = wa.seed[1] = 101;
    *stop = 0;
    ASSERT_EQ(fc_spawn(2, writer_rank, &wa, pids), 0);
    for (i = 0; i < loads; i++) {
        int rc, seed = load_seed(ctx, dir, 2, &rc);
        /* Never DCP_OK with data that is not exactly one save's. */
        ASSERT(rc != DCP_OK || seed >= 100);
        if (rc == DCP_OK) {
            ok++;
        } else {
            err++;
            if (-rc >= 0 && -rc < 64)
                seen[-rc]++;
        }
    }
    {
        int hi = wa.seed[0] > wa.seed[1] ? wa.seed[0] : wa.seed[1];
        *stop = hi + 2;
    }
    for (k = 0; k < 2; k++) {
        ASSERT_EQ(waitpid(pids[k], &status, 0), pids[k]);
        ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    printf("    %d loads during overwrites by 2 ranks (open sleeps %ld us): "
           "%d DCP_OK with exactly one save's data, %d clean errors (",
           loads, slow_us, ok, err);
    for (k = 0; k < 64; k++)
        if (seen[k])
            printf(" %s: %d", dcp_strerror(-k), seen[k]);
    printf(" ), 0 mixed\n");
    ASSERT(ok > 0);
    ASSERT(only_committed(ctx, dir));
    dcp_ctx_free(ctx);
}

/* ---------------------------------------------------- kill -9 debris */

TEST(kill9_leftovers)
{
    const char *dir = sub("kill");
    dcp_ctx *ctx;
    int rounds = full ? 60 : 12, r, lrc, by_save = 0, by_clean = 0,
        by_tool = 0, prev = 1;
    long long debris = 0, most = 0;
    const char *tool = getenv("DCPTOOL");
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT_OK(save_seed(ctx, dir, 1));
    srand(14);
    for (r = 0; r < rounds; r++) {
        pid_t pid;
        int status, seed;
        long long b;
        struct timespec ts = {0, (long)(rand() % 30000) * 1000L};
        pid = fork();
        ASSERT(pid >= 0);
        if (pid == 0) {
            dcp_ctx *c = NULL;
            int s;
            if (dcp_ctx_create(&c, NULL, NULL) != DCP_OK)
                _exit(3);
            for (s = 1000 * (r + 1);; s++)
                if (save_seed(c, dir, s) != DCP_OK)
                    _exit(4);
        }
        (void)nanosleep(&ts, NULL);
        ASSERT_EQ(kill(pid, SIGKILL), 0);
        ASSERT_EQ(waitpid(pid, &status, 0), pid);
        ASSERT(WIFSIGNALED(status));
        /* A committed save loads bit-exact: the first, or one of the
         * child's. */
        seed = load_seed(ctx, dir, 1, &lrc);
        ASSERT_OK(lrc);
        ASSERT(seed == prev ||
               (seed >= 1000 * (r + 1) && seed < 1000 * (r + 2)));
        b = data_bytes(dir);
        {
            char names[8][300];
            size_t f, nf = committed_files(ctx, dir, names);
            long long committed = 0;
            ASSERT(nf > 0);
            for (f = 0; f < nf; f++) {
                struct stat sb;
                char p[3200];
                snprintf(p, sizeof(p), "%s/%s", dir, names[f]);
                ASSERT_EQ(stat(p, &sb), 0);
                committed += sb.st_size;
            }
            debris += b - committed;
            if (b - committed > most)
                most = b - committed;
        }
        /* The debris goes: by the next save (which takes the dead
         * writer's lock over), by dcp_clean or by dcptool clean. */
        if (r % 3 == 0) {
            ASSERT_OK(save_seed(ctx, dir, 1));
            by_save++;
        } else if (r % 3 == 1 || !tool) {
            dcp_clean_result cr;
            memset(&cr, 0, sizeof(cr));
            cr.struct_size = sizeof(cr);
            ASSERT_OK(dcp_clean(ctx, dir, 0, &cr));
            by_clean++;
        } else {
            const char *argv[] = {tool, "clean", dir, "--json", NULL};
            char msg[256];
            ASSERT_EQ(run_tool(argv, msg, sizeof(msg)), 0);
            by_tool++;
        }
        ASSERT(only_committed(ctx, dir));
        prev = load_seed(ctx, dir, 1, &lrc);
        ASSERT_OK(lrc);
        ASSERT(prev == 1 || prev == seed);
    }
    printf("    kill -9 of a saver, %d rounds: every round loads a committed "
           "save bit-exact; %lld bytes of debris in all (at most %lld at "
           "once), all removed (%d by the next save, %d by dcp_clean, %d by "
           "dcptool clean), committed files kept\n",
           rounds, debris, most, by_save, by_clean, by_tool);
    dcp_ctx_free(ctx);
}

/* ------------------------------------------------------ stale locks */

static void write_lock(const char *dir, const char *host, long pid,
                       unsigned long long start, const char *token)
{
    char p[800];
    FILE *f;
    snprintf(p, sizeof(p), "%s/.lock", dir);
    f = fopen(p, "w");
    if (!f)
        return;
    fprintf(f, "dcp-lock 1\nhost=%s\nboot=-\npid=%ld\nstart=%llu\n"
               "token=%s\ntime=1\n",
            host, pid, start, token);
    fclose(f);
}

static int has(const char *dir, const char *name)
{
    char p[800];
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    return access(p, F_OK) == 0;
}

TEST(stale_locks)
{
    const char *dir = sub("stale");
    char host[256] = "", marker[64];
    dcp_ctx *ctx;
    dcp_clean_result cr;
    pid_t dead;
    int status, r, lrc, rounds = full ? 500 : 100, both = 0;
    (void)gethostname(host, sizeof(host) - 1);
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT_OK(save_seed(ctx, dir, 1));
    /* A dead process's lock: taken over. */
    dead = fork();
    if (dead == 0)
        _exit(0);
    ASSERT_EQ(waitpid(dead, &status, 0), dead);
    write_lock(dir, host, (long)dead, 0, "0123456789abcdef");
    ASSERT_OK(save_seed(ctx, dir, 2));
    ASSERT(!has(dir, ".lock"));
    ASSERT_EQ(load_seed(ctx, dir, 1, &lrc), 2);
    /* A live process (its pid runs, same start time: unknown start 0 is
     * taken as the holder's): DCP_EBUSY naming it. */
    write_lock(dir, host, 1, 0, "00000000000000aa");
    ASSERT_RC(save_seed(ctx, dir, 3), DCP_EBUSY);
    ASSERT(strstr(dcp_errmsg(ctx), "pid 1"));
    ASSERT(strstr(dcp_errmsg(ctx), "save 00000000000000aa"));
    ASSERT_RC(dcp_clean(ctx, dir, 0, NULL), DCP_EBUSY);
    /* dcp_manager_remove (dcptool rm) takes the lock too: nothing
     * removed while a live writer holds it. */
    ASSERT_RC(dcp_manager_remove(ctx, dir), DCP_EBUSY);
    ASSERT(strstr(dcp_errmsg(ctx), "pid 1"));
    ASSERT(has(dir, ".metadata"));
    ASSERT_EQ(load_seed(ctx, dir, 1, &lrc), 2);
    /* Another host: cannot be checked; only --force removes it. */
    write_lock(dir, "elsewhere.example", 42, 7, "00000000000000bb");
    ASSERT_RC(save_seed(ctx, dir, 3), DCP_EBUSY);
    ASSERT(strstr(dcp_errmsg(ctx), "another host"));
    ASSERT(strstr(dcp_errmsg(ctx), "clean --force"));
    memset(&cr, 0, sizeof(cr));
    cr.struct_size = sizeof(cr);
    ASSERT_OK(dcp_clean(ctx, dir, DCP_CLEAN_FORCE, &cr));
    ASSERT(!has(dir, ".lock"));
    ASSERT_OK(save_seed(ctx, dir, 3));
    /* A lock that names no holder: DCP_EBUSY; --force removes it. */
    write_lock(dir, host, 1, 0, "");
    ASSERT_RC(save_seed(ctx, dir, 4), DCP_EBUSY);
    ASSERT_OK(dcp_clean(ctx, dir, DCP_CLEAN_FORCE, NULL));
    /* A hostile token (it would name the take-over marker) of a dead
     * holder: no marker outside the directory, DCP_EBUSY until --force. */
    write_lock(dir, host, (long)dead, 0, "../../escape");
    ASSERT_RC(save_seed(ctx, dir, 4), DCP_EBUSY);
    ASSERT(strstr(dcp_errmsg(ctx), "names no holder"));
    ASSERT_OK(dcp_clean(ctx, dir, DCP_CLEAN_FORCE, NULL));
    ASSERT(!has(dir, ".lock"));
    /* A take-over marker left by a killed taker: DCP_EBUSY until
     * --force. */
    write_lock(dir, host, (long)dead, 0, "00000000000000cc");
    snprintf(marker, sizeof(marker), "%s/.lock.takeover-00000000000000cc",
             dir);
    {
        FILE *f = fopen(marker, "w");
        ASSERT(f);
        fclose(f);
    }
    ASSERT_RC(save_seed(ctx, dir, 4), DCP_EBUSY);
    ASSERT(strstr(dcp_errmsg(ctx), "taking the lock over"));
    ASSERT_OK(dcp_clean(ctx, dir, DCP_CLEAN_FORCE, NULL));
    ASSERT(!has(dir, ".lock.takeover-00000000000000cc"));
    ASSERT_OK(save_seed(ctx, dir, 4));
    ASSERT_EQ(load_seed(ctx, dir, 1, &lrc), 4);
    /* A dead writer's lock does not stop a removal; then the path is
     * saved afresh. */
    write_lock(dir, host, (long)dead, 0, "00000000000000ee");
    ASSERT_OK(dcp_manager_remove(ctx, dir));
    ASSERT(access(dir, F_OK) != 0);
    ASSERT_OK(save_seed(ctx, dir, 4));
    /* Two takers of one dead lock at once. */
    for (r = 0; r < rounds; r++) {
        int go[2], k, nok = 0, seed;
        pid_t pid[2];
        write_lock(dir, host, (long)dead, 0, "00000000000000dd");
        ASSERT_EQ(pipe(go), 0);
        for (k = 0; k < 2; k++) {
            pid[k] = fork();
            ASSERT(pid[k] >= 0);
            if (pid[k] == 0) {
                dcp_ctx *c = NULL;
                close(go[1]);
                if (dcp_ctx_create(&c, NULL, NULL) != DCP_OK)
                    _exit(3);
                wait_go(go[0]);
                keep(k, c, save_seed(c, dir, 10 + 2 * r + k));
                dcp_ctx_free(c);
                _exit(0);
            }
        }
        close(go[0]);
        close(go[1]);
        for (k = 0; k < 2; k++) {
            ASSERT_EQ(waitpid(pid[k], &status, 0), pid[k]);
            nok += res[k].rc == DCP_OK;
            if (res[k].rc != DCP_OK)
                ASSERT_RC(res[k].rc, DCP_EBUSY);
        }
        ASSERT(nok >= 1);
        both += nok == 2;
        seed = load_seed(ctx, dir, 1, &lrc);
        ASSERT_OK(lrc);
        ASSERT((seed == 10 + 2 * r && res[0].rc == DCP_OK) ||
               (seed == 11 + 2 * r && res[1].rc == DCP_OK));
        ASSERT(only_committed(ctx, dir));
    }
    printf("    stale locks: a dead holder's taken over, a live one's and "
           "another host's DCP_EBUSY, --force clean; two takers of one "
           "dead lock, %d rounds: always one save at least (%d both, one "
           "after the other), never a stolen lock\n",
           rounds, both);
    dcp_ctx_free(ctx);
}

/* --------------------------------------------------- foreign record */

TEST(foreign_record)
{
    const char *a = sub("own"), *b = sub("other");
    char pa[800], pb[800], cmd[2200];
    unsigned char *bytes;
    size_t n = 0;
    dcp_ctx *ctx;
    FILE *f;
    int lrc;
    const char *tool = getenv("DCPTOOL");
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT_OK(save_seed(ctx, a, 5));
    ASSERT_OK(save_seed(ctx, b, 6)); /* the same layout, another save */
    snprintf(pa, sizeof(pa), "%s/__0_0.distcp", a);
    snprintf(pb, sizeof(pb), "%s/__0_0.distcp", b);
    bytes = slurp(pb, &n);
    ASSERT(bytes);
    f = fopen(pa, "wb");
    ASSERT(f && fwrite(bytes, 1, n, f) == n);
    fclose(f);
    free(bytes);
    ASSERT_EQ(load_seed(ctx, a, 1, &lrc), -1);
    ASSERT_RC(lrc, DCP_ECORRUPT);
    ASSERT(strstr(dcp_errmsg(ctx), "__0_0.distcp"));
    ASSERT(strstr(dcp_errmsg(ctx), "another save"));
    ASSERT_RC(dcp_verify(ctx, a), DCP_ECORRUPT);
    ASSERT(strstr(dcp_errmsg(ctx), "__0_0.distcp"));
    ASSERT(strstr(dcp_errmsg(ctx), "another save"));
    if (tool) {
        snprintf(cmd, sizeof(cmd), "'%s' verify '%s' 2>&1 | grep -q 'another save'",
                 tool, a);
        ASSERT_EQ(system(cmd), 0);
        snprintf(cmd, sizeof(cmd), "'%s' verify '%s' >/dev/null 2>&1", tool, a);
        ASSERT(system(cmd) != 0);
    }
    printf("    a record of another save under .metadata's name: load and "
           "verify DCP_ECORRUPT naming the file\n");
    dcp_ctx_free(ctx);
}

/* ----------------------------------------------------- clean filter */

static void touch(const char *dir, const char *name, int bytes)
{
    char p[800];
    FILE *f;
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    f = fopen(p, "w");
    while (f && bytes-- > 0)
        fputc('x', f);
    if (f)
        fclose(f);
}

TEST(clean_filter)
{
    const char *dir = sub("filter"), *out = sub("outside");
    /* Rank-local metadata beside the committed .metadata is dead too, for
     * any rank number. */
    static const char *gone[] = {"__5_0.distcp", "__0_0.0123abcd.distcp",
                                 ".metadata.tmp", ".metadata.77-3.tmp",
                                 ".lock.1-2.tmp", "__3.metadata",
                                 "__1234567890123.metadata"};
    static const char *kept[] = {"notes.txt", "__0_0.distcp.bak",
                                 "__x_0.distcp", "__0_0.XYZ.distcp",
                                 "metadata.tmp", ".lock.takeover-ab",
                                 "__12.metadata.bak", "__01.metadata",
                                 "__70000_0.distcp.x"};
    char lnk[800];
    dcp_ctx *ctx;
    dcp_clean_result cr;
    size_t i;
    int lrc;
    ASSERT_OK(dcp_ctx_create(&ctx, NULL, NULL));
    ASSERT_OK(save_seed(ctx, dir, 8)); /* __0_0.distcp, committed */
    for (i = 0; i < sizeof(gone) / sizeof(gone[0]); i++)
        touch(dir, gone[i], 100);
    for (i = 0; i < sizeof(kept) / sizeof(kept[0]); i++)
        touch(dir, kept[i], 10);
    ASSERT_EQ(mkdir(out, 0755), 0);
    touch(out, "__7_0.distcp", 10);
    snprintf(lnk, sizeof(lnk), "%s/__9_0.distcp", dir);
    {
        char target[800];
        snprintf(target, sizeof(target), "%s/__7_0.distcp", out);
        ASSERT_EQ(symlink(target, lnk), 0);
    }
    memset(&cr, 0, sizeof(cr));
    cr.struct_size = sizeof(cr);
    ASSERT_OK(dcp_clean(ctx, dir, 0, &cr));
    ASSERT_U64_EQ(cr.files, 7);
    ASSERT_U64_EQ(cr.bytes, 700);
    for (i = 0; i < sizeof(gone) / sizeof(gone[0]); i++)
        ASSERT(!has(dir, gone[i]));
    for (i = 0; i < sizeof(kept) / sizeof(kept[0]); i++)
        ASSERT(has(dir, kept[i]));
    ASSERT(has(dir, "__0_0.distcp"));
    ASSERT(has(dir, "__9_0.distcp")); /* the link stays, and its target */
    ASSERT(has(out, "__7_0.distcp"));
    ASSERT_EQ(load_seed(ctx, dir, 1, &lrc), 8);
    /* The same when the next save cleans. */
    touch(dir, "__3_0.distcp", 100);
    ASSERT_OK(save_seed(ctx, dir, 9));
    ASSERT(!has(dir, "__3_0.distcp"));
    ASSERT(has(dir, "notes.txt") && has(dir, "__9_0.distcp"));
    ASSERT_EQ(load_seed(ctx, dir, 1, &lrc), 9);
    /* No directory: DCP_ENOENT. */
    ASSERT_RC(dcp_clean(ctx, sub("none"), 0, NULL), DCP_ENOENT);
    /* More names than one listing takes (4096): user files sorting first
     * do not hide the leftovers (listed again by kind). */
    for (i = 0; i < 4200; i++) {
        char nm[32];
        snprintf(nm, sizeof(nm), ".a%04zu", i); /* sorts first */
        touch(dir, nm, 1);
    }
    for (i = 0; i < sizeof(gone) / sizeof(gone[0]); i++)
        touch(dir, gone[i], 100);
    memset(&cr, 0, sizeof(cr));
    cr.struct_size = sizeof(cr);
    ASSERT_OK(dcp_clean(ctx, dir, 0, &cr));
    ASSERT_U64_EQ(cr.files, 7);
    for (i = 0; i < sizeof(gone) / sizeof(gone[0]); i++)
        ASSERT(!has(dir, gone[i]));
    ASSERT(has(dir, ".a4199") && has(dir, "notes.txt"));
    ASSERT_EQ(load_seed(ctx, dir, 1, &lrc), 9);
    dcp_ctx_free(ctx);
}

int main(int argc, char **argv)
{
    full = argc > 1 && !strcmp(argv[1], "--full");
    signal(SIGPIPE, SIG_IGN);
    snprintf(root, sizeof(root), "/tmp/dcp-lifecycle-%ld", (long)getpid());
    rm_rf(root);
    if (mkdir(root, 0755) != 0)
        return 1;
    res = mmap(NULL, 8 * sizeof(*res), PROT_READ | PROT_WRITE,
               MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (res == MAP_FAILED)
        return 1;
    printf("lifecycle%s\n", full ? " (--full)" : " (--full for the rounds of "
                                                  "docs/RELIABILITY.md)");
    RUN(two_writers);
    RUN(import_race);
    RUN(refused_import);
    RUN(readers_during_overwrites);
    RUN(kill9_leftovers);
    RUN(stale_locks);
    RUN(foreign_record);
    RUN(clean_filter);
    rm_rf(root);
    return TEST_SUMMARY();
}
