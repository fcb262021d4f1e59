/*
 * tmpfs_limit: what plain system calls achieve writing the bytes of the
 * benchmark state (bench/gpt2_state.h, this rank's row shards) into fresh
 * files, on however many MPI ranks it is started with: the limit a
 * 4-rank dcp save into /dev/shm is measured against (tmpfs_write_limit_gbps
 * in bench/run_bench.py --issue16). One JSON object per timed run on rank
 * 0's stdout, as io_bench prints them.
 *
 *   mpirun -n N tmpfs_limit DIR [--runs R] [--op OP] [--block BYTES]
 *          [--fallocate 0|1] [--threads T] [--scale small|medium]
 *
 * Each rank writes its shards, tensor after tensor, into its own new file
 * DIR/__<rank>_0.limit (removed before each run, not timed) with write()
 * of at most BYTES at a time, then fsyncs and closes it. --fallocate 1
 * allocates the file's length first (timed), as dcp's engine does.
 * --threads T splits a rank's shards into T runs of about equal bytes,
 * each written by its own thread into its own file (__<rank>_<t>.limit:
 * tmpfs serialises the writes into one file), as dcp's save has a second
 * thread per rank copying (the io_uring worker) beside the one hashing.
 * OP:
 *   write      the above (the limit);
 *   write_crc  the same, each piece's CRC-32 computed just before its
 *              write() (the library's routine): the least a save that
 *              checksums every byte has to do;
 *   memcpy     the shards copied into a new allocation of the same size
 *              (its pages faulted in by the copy), for reference;
 *   memcpy_warm  the same into memory faulted in beforehand.
 * Without --op every op runs, R runs each: write with blocks of 1, 4, 16
 * and 64 MiB, with and without --fallocate, on 1, 2 and 4 threads; write_crc
 * the same on 1 thread; memcpy and memcpy_warm.
 * A run's time is the slowest rank's, between barriers; its CPU time is
 * the sum over ranks.
 */
#define _GNU_SOURCE /* fallocate */
#include <errno.h>
#include <fcntl.h>
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h> /* mkdir */
#include <unistd.h>

#include "crc32.h"
#include "gpt2_state.h"

static double cpu_seconds(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return 0;
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

static void die(const char *what, int rank)
{
    fprintf(stderr, "tmpfs_limit: rank %d: %s: %s\n", rank, what,
            strerror(errno));
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* The bytes of tensor k, kind m (this rank's rows). */
static size_t shard_bytes(const struct g2_state *s, size_t k)
{
    return (size_t)s->t[k].rows * g2_row_elems(&s->t[k]) * sizeof(float);
}

/* One thread's part of a rank's write: shards [from, to) (numbered
 * 3 k + m) into path, bytes long. */
struct wpart {
    const struct g2_state *s;
    char path[4096];
    size_t from, to, block;
    uint64_t bytes;
    int falloc, crc, rank;
    pthread_t thr;
};

static void *write_file(void *arg)
{
    const struct wpart *w = arg;
    const struct g2_state *s = w->s;
    size_t block = w->block, i;
    uint32_t sum = 0;
    int rank = w->rank, crc = w->crc;
    int fd = open(w->path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        die("open", rank);
    if (w->falloc && w->bytes && fallocate(fd, 0, 0, (off_t)w->bytes) != 0)
        die("fallocate", rank);
    for (i = w->from; i < w->to; i++) {
        const char *p = (const char *)s->t[i / 3].buf[i % 3];
        size_t n = shard_bytes(s, i / 3);
        while (n > 0) {
            size_t c = n < block ? n : block;
            ssize_t k;
            if (crc)
                sum = dcp__crc32(sum, p, c);
            k = write(fd, p, c);
            if (k < 0 && errno == EINTR)
                continue;
            if (k <= 0)
                die("write", rank);
            p += k;
            n -= (size_t)k;
        }
    }
    if (fsync(fd) != 0 || close(fd) != 0)
        die("fsync", rank);
    if (crc && sum == 1) /* keeps the CRC from being optimised away */
        fputc(' ', stderr);
    return NULL;
}

#define MAX_THREADS 8

/* A rank's shards split into nt parts of about equal bytes. */
static void split(const struct g2_state *s, struct wpart *w, int nt,
                  const char *dir, int rank)
{
    size_t i, n = 3 * s->n;
    uint64_t acc = 0;
    int t = 0;
    w[0].from = 0;
    w[0].bytes = 0;
    for (i = 0; i < n; i++) {
        uint64_t b = shard_bytes(s, i / 3);
        if (t + 1 < nt && acc + b / 2 > s->local_bytes * (uint64_t)(t + 1) /
                                           (uint64_t)nt) {
            w[t].to = i;
            w[++t].from = i;
            w[t].bytes = 0;
        }
        acc += b;
        w[t].bytes += b;
    }
    w[t].to = n;
    for (t++; t < nt; t++) { /* fewer shards than threads */
        w[t].from = w[t].to = n;
        w[t].bytes = 0;
    }
    for (t = 0; t < nt; t++) {
        w[t].s = s;
        w[t].rank = rank;
        (void)snprintf(w[t].path, sizeof(w[t].path), "%s/__%d_%d.limit", dir,
                       rank, t);
    }
}

/* One rank's copy of its shards into dst (NULL: a new allocation). */
static void copy_shards(const struct g2_state *s, uint8_t *dst, int rank)
{
    uint8_t *d = dst ? dst : malloc(s->local_bytes ? s->local_bytes : 1);
    size_t k, off = 0;
    int m;
    if (!d)
        die("malloc", rank);
    for (k = 0; k < s->n; k++)
        for (m = 0; m < 3; m++) {
            memcpy(d + off, s->t[k].buf[m], shard_bytes(s, k));
            off += shard_bytes(s, k);
        }
    if (!dst)
        free(d);
}

struct conf {
    const char *op;
    size_t block;
    int falloc;
    int threads;
};

static void run_conf(const struct g2_state *s, const struct conf *c,
                     const char *dir, int rank, int world, int runs)
{
    struct wpart w[MAX_THREADS];
    uint8_t *warm = NULL;
    int i, t, nt = c->threads, wr = strncmp(c->op, "write", 5) == 0;
    split(s, w, nt, dir, rank);
    for (t = 0; t < nt; t++) {
        w[t].block = c->block;
        w[t].falloc = c->falloc;
        w[t].crc = strcmp(c->op, "write_crc") == 0;
    }
    if (strcmp(c->op, "memcpy_warm") == 0) {
        warm = malloc(s->local_bytes ? s->local_bytes : 1);
        if (!warm)
            die("malloc", rank);
        memset(warm, 1, s->local_bytes);
    }
    for (i = 0; i < runs; i++) {
        double t0, t1, cpu, allcpu = 0;
        for (t = 0; wr && t < nt; t++)
            (void)unlink(w[t].path);
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = MPI_Wtime();
        cpu = cpu_seconds();
        for (t = 1; wr && t < nt; t++)
            if (pthread_create(&w[t].thr, NULL, write_file, &w[t]) != 0)
                die("pthread_create", rank);
        if (wr)
            (void)write_file(&w[0]);
        for (t = 1; wr && t < nt; t++)
            (void)pthread_join(w[t].thr, NULL);
        if (!wr)
            copy_shards(s, warm, rank);
        cpu = cpu_seconds() - cpu;
        MPI_Barrier(MPI_COMM_WORLD);
        t1 = MPI_Wtime();
        MPI_Reduce(&cpu, &allcpu, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
        if (rank == 0) {
            printf("{\"op\": \"%s\", \"ranks\": %d, \"run\": %d, "
                   "\"block\": %zu, \"fallocate\": %d, \"threads\": %d, "
                   "\"seconds\": %.6f, \"cpu_seconds\": %.4f, "
                   "\"bytes\": %llu, \"gbps\": %.4f}\n",
                   c->op, world, i, wr ? c->block : 0, wr ? c->falloc : 0,
                   wr ? nt : 1, t1 - t0, allcpu,
                   (unsigned long long)s->total_bytes,
                   (double)s->total_bytes / (t1 - t0) / 1e9);
            fflush(stdout);
        }
    }
    for (t = 0; wr && t < nt; t++)
        (void)unlink(w[t].path);
    free(warm);
}

int main(int argc, char **argv)
{
    struct g2_cfg cfg = {12, 50257, 768, 1024};
    struct g2_state s = {0};
    struct conf one = {NULL, (size_t)4 << 20, 0, 1};
    static const char *const ops[] = {"write", "write_crc"};
    static const size_t mib[] = {1, 4, 16, 64};
    const char *dir;
    int rank, world, runs = 3, i, t;
    size_t o, b;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    if (argc < 2) {
        if (rank == 0)
            fprintf(stderr, "usage: tmpfs_limit DIR [options]\n");
        MPI_Finalize();
        return 2;
    }
    dir = argv[1];
    for (i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--runs"))
            runs = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--op"))
            one.op = argv[i + 1];
        else if (!strcmp(argv[i], "--block"))
            one.block = (size_t)atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--fallocate"))
            one.falloc = atoi(argv[i + 1]) != 0;
        else if (!strcmp(argv[i], "--threads"))
            one.threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--scale") &&
                 !strcmp(argv[i + 1], "small")) {
            cfg.layers = 2; /* as io_bench */
            cfg.vocab = 1000;
            cfg.dim = 128;
            cfg.ctx = 256;
        } else if (!strcmp(argv[i], "--scale") &&
                   !strcmp(argv[i + 1], "medium")) {
            cfg.layers = 4;
            cfg.vocab = 4096;
            cfg.dim = 384;
            cfg.ctx = 1024;
        }
    }
    if (one.block == 0)
        one.block = (size_t)4 << 20;
    if (one.threads < 1 || one.threads > MAX_THREADS)
        one.threads = 1;
    if (g2_params(&s, &cfg) != 0 || g2_alloc(&s, rank, world, 1, 0) != 0) {
        fprintf(stderr, "tmpfs_limit: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    if (rank == 0)
        (void)mkdir(dir, 0755);
    MPI_Barrier(MPI_COMM_WORLD);
    if (one.op) {
        run_conf(&s, &one, dir, rank, world, runs);
    } else {
        for (o = 0; o < sizeof(ops) / sizeof(*ops); o++)
            for (t = 1; t <= (o == 0 ? 4 : 1); t *= 2)
                for (b = 0; b < sizeof(mib) / sizeof(*mib); b++)
                    for (i = 0; i < 2; i++) {
                        struct conf c = {ops[o], mib[b] << 20, i, t};
                        run_conf(&s, &c, dir, rank, world, runs);
                    }
        one.op = "memcpy";
        run_conf(&s, &one, dir, rank, world, runs);
        one.op = "memcpy_warm";
        run_conf(&s, &one, dir, rank, world, runs);
    }
    g2_free(&s);
    MPI_Finalize();
    return 0;
}
