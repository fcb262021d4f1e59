/*
 * tmpfs_limit: what plain system calls achieve writing the bytes of the
 * benchmark state (bench/gpt2_state.h, this rank's row shards) into fresh
 * files, on however many MPI ranks it is started with: the limit a
 * 4-rank dcp save into /dev/shm is measured against (tmpfs_write_limit_gbps
 * in bench/run_bench.py --issue16). One JSON object per timed run on rank
 * 0's stdout, as io_bench prints them.
 *
 *   mpirun -n N tmpfs_limit DIR [--runs R] [--op OP] [--block BYTES]
 *          [--fallocate 0|1] [--scale small|medium]
 *
 * Each rank writes its shards, tensor after tensor, into its own new file
 * DIR/__<rank>.limit (removed before each run, not timed) with write() of
 * at most BYTES at a time, then fsyncs and closes it. --fallocate 1
 * allocates the file's length first (timed), as dcp's engine does.
 * OP:
 *   write      the above (the limit);
 *   write_crc  the same, each piece's CRC-32 computed just before its
 *              write() (the library's routine): the least a save that
 *              checksums every byte has to do;
 *   memcpy     the shards copied into a new allocation of the same size
 *              (its pages faulted in by the copy), for reference;
 *   memcpy_warm  the same into memory faulted in beforehand.
 * Without --op every op runs, write and write_crc with blocks of 1, 4, 16
 * and 64 MiB, with and without --fallocate, R runs each.
 * A run's time is the slowest rank's, between barriers; its CPU time is
 * the sum over ranks.
 */
#define _GNU_SOURCE /* fallocate */
#include <errno.h>
#include <fcntl.h>
#include <mpi.h>
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

/* One rank's write of its shards into path. */
static void write_file(const struct g2_state *s, const char *path,
                       size_t block, int falloc, int crc, int rank)
{
    uint32_t sum = 0;
    size_t k;
    int m, fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        die("open", rank);
    if (falloc && s->local_bytes &&
        fallocate(fd, 0, 0, (off_t)s->local_bytes) != 0)
        die("fallocate", rank);
    for (k = 0; k < s->n; k++)
        for (m = 0; m < 3; m++) {
            const char *p = (const char *)s->t[k].buf[m];
            size_t n = shard_bytes(s, k);
            while (n > 0) {
                size_t c = n < block ? n : block;
                ssize_t w;
                if (crc)
                    sum = dcp__crc32(sum, p, c);
                w = write(fd, p, c);
                if (w < 0 && errno == EINTR)
                    continue;
                if (w <= 0)
                    die("write", rank);
                p += w;
                n -= (size_t)w;
            }
        }
    if (fsync(fd) != 0 || close(fd) != 0)
        die("fsync", rank);
    if (crc && sum == 1) /* keeps the CRC from being optimised away */
        fputc(' ', stderr);
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
};

static void run_conf(const struct g2_state *s, const struct conf *c,
                     const char *dir, int rank, int world, int runs)
{
    char path[4096];
    uint8_t *warm = NULL;
    int i, wr = strncmp(c->op, "write", 5) == 0;
    (void)snprintf(path, sizeof(path), "%s/__%d.limit", dir, rank);
    if (strcmp(c->op, "memcpy_warm") == 0) {
        warm = malloc(s->local_bytes ? s->local_bytes : 1);
        if (!warm)
            die("malloc", rank);
        memset(warm, 1, s->local_bytes);
    }
    for (i = 0; i < runs; i++) {
        double t0, t1, cpu, allcpu = 0;
        if (wr)
            (void)unlink(path);
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = MPI_Wtime();
        cpu = cpu_seconds();
        if (wr)
            write_file(s, path, c->block, c->falloc,
                       strcmp(c->op, "write_crc") == 0, rank);
        else
            copy_shards(s, warm, rank);
        cpu = cpu_seconds() - cpu;
        MPI_Barrier(MPI_COMM_WORLD);
        t1 = MPI_Wtime();
        MPI_Reduce(&cpu, &allcpu, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
        if (rank == 0) {
            printf("{\"op\": \"%s\", \"ranks\": %d, \"run\": %d, "
                   "\"block\": %zu, \"fallocate\": %d, \"seconds\": %.6f, "
                   "\"cpu_seconds\": %.4f, \"bytes\": %llu, "
                   "\"gbps\": %.4f}\n",
                   c->op, world, i, wr ? c->block : 0, wr ? c->falloc : 0,
                   t1 - t0, allcpu, (unsigned long long)s->total_bytes,
                   (double)s->total_bytes / (t1 - t0) / 1e9);
            fflush(stdout);
        }
    }
    if (wr)
        (void)unlink(path);
    free(warm);
}

int main(int argc, char **argv)
{
    struct g2_cfg cfg = {12, 50257, 768, 1024};
    struct g2_state s = {0};
    struct conf one = {NULL, (size_t)4 << 20, 0};
    static const char *const ops[] = {"write", "write_crc"};
    static const size_t mib[] = {1, 4, 16, 64};
    const char *dir;
    int rank, world, runs = 3, i;
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
        else if (!strcmp(argv[i], "--scale") && !strcmp(argv[i + 1], "small")) {
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
            for (b = 0; b < sizeof(mib) / sizeof(*mib); b++)
                for (i = 0; i < 2; i++) {
                    struct conf c = {ops[o], mib[b] << 20, i};
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
