/*
 * io_bench: dcp_save and dcp_load throughput on the GPT-2 small + AdamW
 * state (bench/gpt2_state.h), on however many MPI ranks it is started
 * with. bench/run_bench.py drives it (make bench); it prints one JSON
 * object per timed run on rank 0's stdout.
 *
 *   mpirun -n N io_bench save|load|async DIR [--runs R] [--misalign B]
 *          [--io-flags F] [--depth D] [--block BYTES] [--scale small|medium]
 *          [--no-verify 1] [--replicated 1] [--per-rank 1]
 *
 * save: builds this rank's row shards and saves them R times into DIR,
 *       emptied before each run (not timed), so every save writes new
 *       files.
 * load: builds empty shards for the current world size (any N: loading a
 *       checkpoint saved on another number of ranks reshards it), evicts
 *       DIR's files from the page cache before each run
 *       (posix_fadvise DONTNEED), loads, and checks every element once.
 * --replicated 1: every rank loads the whole state (the read-once load
 *       reads each stored byte once and forwards it); --per-rank 1 adds
 *       DCP_LOAD_PER_RANK_READS. Each load run reports storage_bytes (the
 *       bytes read from storage, summed over ranks: phase report READ)
 *       and exchange_bytes (received from other ranks: EXCHANGE).
 * A run's time is the slowest rank's, between barriers; its CPU time is
 * the sum over ranks (getrusage: threads and io_uring workers included).
 * Per rank it also
 * reports the peak RSS (VmHWM) and, for a save, the peak beyond the RSS
 * just before the call (the memory the save itself used on top of the
 * state: /proc/self/clear_refs resets the peak first), and the slowest
 * rank's seconds in each phase (dcp_ctx_phase_report: phase_max_seconds).
 */
#define _GNU_SOURCE /* posix_fadvise, DT_REG */
#include <dirent.h>
#include <fcntl.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <dcp/dcp.h>
#include <dcp/dcp_mpi.h>

#include "gpt2_state.h"

/* The phases reported per run (the slowest rank's seconds in each). */
#define NPH (DCP_PHASE_EXCHANGE + 1)

static long status_kib(const char *field)
{
    char line[256];
    size_t n = strlen(field);
    long v = -1;
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return -1;
    while (fgets(line, sizeof(line), f))
        if (strncmp(line, field, n) == 0 && line[n] == ':')
            v = strtol(line + n + 1, NULL, 10);
    fclose(f);
    return v;
}

/* CPU seconds (user + system) this process has used, its threads and the
 * kernel's io_uring workers included. */
static double cpu_seconds(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return 0;
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

static void reset_peak(void)
{
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (f) {
        fputs("5", f);
        fclose(f);
    }
}

/* Removes the files of the checkpoint in dir (a flat directory), so that
 * each save writes new files, as fio writes a new file. */
static void clear_dir(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    if (!d)
        return;
    while ((de = readdir(d))) {
        char p[4096];
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        (void)snprintf(p, sizeof(p), "%s/%s", dir, de->d_name);
        (void)unlink(p);
    }
    closedir(d);
    sync();
}

/* Drops dir's regular files from the page cache. */
static void evict(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    if (!d)
        return;
    while ((de = readdir(d))) {
        char p[4096];
        int fd;
        if (de->d_name[0] == '.' && strcmp(de->d_name, ".metadata") != 0)
            continue;
        (void)snprintf(p, sizeof(p), "%s/%s", dir, de->d_name);
        fd = open(p, O_RDONLY);
        if (fd >= 0) {
            (void)fdatasync(fd);
            (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
            close(fd);
        }
    }
    closedir(d);
}

/*
 * async: how long dcp_save_async blocks each rank against a memcpy of the
 * same bytes (this rank's tensors into a buffer faulted in beforehand),
 * per run; the slowest rank of each. A warm-up save allocates the staging
 * buffers first, as a training loop's first checkpoint does.
 */
static void run_async(dcp_ctx *ctx, dcp_state *st, struct g2_state *s,
                      const char *dir, int rank, int world, int runs)
{
    dcp_save_options so;
    dcp_request *req = NULL;
    uint8_t *dst = malloc(s->local_bytes ? s->local_bytes : 1);
    int i, rc;
    if (!dst) {
        fprintf(stderr, "io_bench: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    memset(dst, 1, s->local_bytes); /* faulted in */
    memset(&so, 0, sizeof(so));
    so.struct_size = sizeof(so);
    if (rank == 0)
        clear_dir(dir);
    rc = dcp_save_async(ctx, st, dir, &so, &req);
    if (rc == DCP_OK)
        rc = dcp_request_wait(req);
    dcp_request_free(req);
    for (i = 0; rc == DCP_OK && i < runs; i++) {
        double t, v[3], mx[3];
        size_t k, m, off = 0;
        MPI_Barrier(MPI_COMM_WORLD);
        t = MPI_Wtime();
        for (k = 0; k < s->n; k++)
            for (m = 0; m < 3; m++) {
                size_t n = (size_t)s->t[k].rows * g2_row_elems(&s->t[k]) *
                           sizeof(float);
                memcpy(dst + off, s->t[k].buf[m], n);
                off += n;
            }
        v[0] = MPI_Wtime() - t;
        if (rank == 0)
            clear_dir(dir);
        MPI_Barrier(MPI_COMM_WORLD);
        t = MPI_Wtime();
        rc = dcp_save_async(ctx, st, dir, &so, &req);
        v[1] = MPI_Wtime() - t;
        if (rc == DCP_OK)
            rc = dcp_request_wait(req);
        v[2] = MPI_Wtime() - t;
        dcp_request_free(req);
        req = NULL;
        MPI_Reduce(v, mx, 3, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
        if (rank == 0 && rc == DCP_OK) {
            printf("{\"op\": \"async\", \"ranks\": %d, \"run\": %d, "
                   "\"memcpy_seconds\": %.6f, \"block_seconds\": %.6f, "
                   "\"seconds\": %.6f, \"bytes\": %llu, \"gbps\": %.4f, "
                   "\"block_ratio\": %.4f}\n",
                   world, i, mx[0], mx[1], mx[2],
                   (unsigned long long)s->total_bytes,
                   (double)s->total_bytes / mx[2] / 1e9, mx[1] / mx[0]);
            fflush(stdout);
        }
    }
    if (rc != DCP_OK) {
        fprintf(stderr, "io_bench: rank %d: async save failed: %s\n", rank,
                dcp_errmsg(ctx));
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    free(dst);
}

int main(int argc, char **argv)
{
    struct g2_cfg cfg = {12, 50257, 768, 1024};
    struct g2_state s = {0};
    dcp_ctx_options o;
    dcp_save_options so;
    dcp_load_options lo;
    dcp_io_report rep;
    dcp_comm *comm = NULL;
    dcp_ctx *ctx = NULL;
    dcp_state *st = NULL;
    const char *mode, *dir;
    size_t misalign = 0;
    int rank, world, runs = 3, i, rc, save, verify = 1, replicated = 0;
    int per_rank = 0;
    long *peaks;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    memset(&o, 0, sizeof(o));
    o.struct_size = sizeof(o);
    if (argc < 3) {
        if (rank == 0)
            fprintf(stderr, "usage: io_bench save|load DIR [options]\n");
        MPI_Finalize();
        return 2;
    }
    mode = argv[1];
    dir = argv[2];
    save = strcmp(mode, "save") == 0 || strcmp(mode, "async") == 0;
    for (i = 3; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--runs"))
            runs = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--no-verify"))
            verify = atoi(argv[i + 1]) == 0;
        else if (!strcmp(argv[i], "--replicated"))
            replicated = atoi(argv[i + 1]) != 0;
        else if (!strcmp(argv[i], "--per-rank"))
            per_rank = atoi(argv[i + 1]) != 0;
        else if (!strcmp(argv[i], "--misalign"))
            misalign = (size_t)atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--io-flags"))
            o.io_flags = (uint32_t)atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--depth"))
            o.io_depth = (uint32_t)atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--block"))
            o.io_block_bytes = (uint32_t)atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--scale") && !strcmp(argv[i + 1], "small")) {
            cfg.layers = 2; /* about 12 MB: a smoke test */
            cfg.vocab = 1000;
            cfg.dim = 128;
            cfg.ctx = 256;
        } else if (!strcmp(argv[i], "--scale") &&
                   !strcmp(argv[i + 1], "medium")) {
            cfg.layers = 4; /* about 110 MB with AdamW state */
            cfg.vocab = 4096;
            cfg.dim = 384;
            cfg.ctx = 1024;
        }
    }

    if (g2_params(&s, &cfg) != 0 ||
        g2_alloc(&s, replicated && !save ? 0 : rank,
                 replicated && !save ? 1 : world, save, misalign) != 0) {
        fprintf(stderr, "io_bench: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    rc = dcp_comm_mpi(&comm, MPI_COMM_WORLD);
    if (rc == DCP_OK)
        rc = dcp_ctx_create(&ctx, comm, &o);
    if (rc == DCP_OK)
        rc = dcp_state_create(&st);
    if (rc == DCP_OK)
        rc = g2_add_to(st, &s);
    if (rc != DCP_OK) {
        fprintf(stderr, "io_bench: setup: %s\n", dcp_strerror(rc));
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    memset(&so, 0, sizeof(so));
    so.struct_size = sizeof(so);
    memset(&lo, 0, sizeof(lo));
    lo.struct_size = sizeof(lo);
    lo.flags = (verify ? 0 : DCP_LOAD_NO_VERIFY) |
               (per_rank ? DCP_LOAD_PER_RANK_READS : 0);
    peaks = calloc((size_t)world * 2, sizeof(*peaks));
    if (strcmp(mode, "async") == 0) {
        run_async(ctx, st, &s, dir, rank, world, runs);
        runs = 0;
    }

    for (i = 0; i < runs; i++) {
        long mine[2], before;
        double t0, t1, cpu, allcpu = 0;
        uint64_t bad = 0, allbad = 0, moved[2] = {0, 0}, allmoved[2] = {0, 0};
        dcp_phase_report pr;
        double phmax[NPH];
        if (save && rank == 0)
            clear_dir(dir);
        if (!save && rank == 0)
            evict(dir);
        reset_peak();
        before = status_kib("VmRSS");
        MPI_Barrier(MPI_COMM_WORLD);
        t0 = MPI_Wtime();
        cpu = cpu_seconds();
        rc = save ? dcp_save(ctx, st, dir, &so) : dcp_load(ctx, st, dir, &lo);
        cpu = cpu_seconds() - cpu;
        MPI_Barrier(MPI_COMM_WORLD);
        t1 = MPI_Wtime();
        MPI_Reduce(&cpu, &allcpu, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
        if (rc != DCP_OK) {
            fprintf(stderr, "io_bench: rank %d: %s failed: %s\n", rank, mode,
                    dcp_errmsg(ctx));
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
        mine[0] = status_kib("VmHWM");
        mine[1] = mine[0] - before;
        MPI_Gather(mine, 2, MPI_LONG, peaks, 2, MPI_LONG, 0, MPI_COMM_WORLD);
        if (!save && i == 0) {
            bad = g2_check(&s);
            MPI_Reduce(&bad, &allbad, 1, MPI_UINT64_T, MPI_SUM, 0,
                       MPI_COMM_WORLD);
        }
        memset(&pr, 0, sizeof(pr));
        pr.struct_size = sizeof(pr);
        if (!save && dcp_ctx_phase_report(ctx, DCP_IO_LOAD, &pr) == DCP_OK) {
            moved[0] = pr.bytes[DCP_PHASE_READ];
            moved[1] = pr.bytes[DCP_PHASE_EXCHANGE];
        }
        MPI_Reduce(moved, allmoved, 2, MPI_UINT64_T, MPI_SUM, 0,
                   MPI_COMM_WORLD);
        if (save && dcp_ctx_phase_report(ctx, DCP_IO_SAVE, &pr) != DCP_OK)
            memset(pr.seconds, 0, sizeof(pr.seconds));
        MPI_Reduce(pr.seconds, phmax, NPH, MPI_DOUBLE, MPI_MAX, 0,
                   MPI_COMM_WORLD);
        rep.struct_size = sizeof(rep);
        (void)dcp_ctx_io_report(ctx, save ? DCP_IO_SAVE : DCP_IO_LOAD, &rep);
        if (rank == 0) {
            int r;
            printf("{\"op\": \"%s\", \"ranks\": %d, \"run\": %d, "
                   "\"misalign\": %zu, \"verify\": %d, \"seconds\": %.6f, "
                   "\"cpu_seconds\": %.4f, \"bytes\": %llu, "
                   "\"gbps\": %.4f, \"bad_elements\": %llu, "
                   "\"replicated\": %d, \"per_rank\": %d, "
                   "\"storage_bytes\": %llu, \"exchange_bytes\": %llu, "
                   "\"peak_rss_mib\": [",
                   mode, world, i, misalign, verify, t1 - t0, allcpu,
                   (unsigned long long)s.total_bytes,
                   (double)s.total_bytes / (t1 - t0) / 1e9,
                   (unsigned long long)allbad, replicated, per_rank,
                   (unsigned long long)allmoved[0],
                   (unsigned long long)allmoved[1]);
            for (r = 0; r < world; r++)
                printf("%s%.1f", r ? ", " : "", (double)peaks[2 * r] / 1024);
            printf("], \"extra_rss_mib\": [");
            for (r = 0; r < world; r++)
                printf("%s%.1f", r ? ", " : "",
                       (double)peaks[2 * r + 1] / 1024);
            printf("], \"phase_max_seconds\": {");
            for (r = 0; r < NPH; r++)
                printf("%s\"%s\": %.4f", r ? ", " : "", dcp_phase_name(r),
                       phmax[r]);
            printf("}, \"io\": {\"direct\": %d, \"uring\": %d, "
                   "\"bytes\": %llu, \"zero_copy_bytes\": %llu, "
                   "\"bounce_bytes\": %llu, \"requests\": %llu, "
                   "\"max_in_flight\": %u, \"buffer_bytes\": %llu, "
                   "\"fallback\": \"%s\"}}\n",
                   rep.direct, rep.uring, (unsigned long long)rep.bytes,
                   (unsigned long long)rep.zero_copy_bytes,
                   (unsigned long long)rep.bounce_bytes,
                   (unsigned long long)rep.requests, rep.max_in_flight,
                   (unsigned long long)rep.buffer_bytes, rep.fallback);
            fflush(stdout);
        }
    }
    free(peaks);
    dcp_state_free(st);
    g2_free(&s);
    dcp_ctx_free(ctx);
    dcp_comm_free(comm);
    MPI_Finalize();
    return 0;
}
