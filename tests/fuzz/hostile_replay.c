/*
 * The hostile-file regression set (tests/fuzz/hostile/, made by
 * make_hostile.py): for every case of manifest.txt, after its setup
 * (symbolic links, FIFOs), dcp_verify and a strict dcp_load of every entry
 * (or of nothing, when the metadata cannot be opened) must both fail with
 * exactly the expected code and a message that names its subject (a
 * quoted file, key or path). A single-file case (setup "file:NAME", a
 * safetensors file, an index or a torch.save file) is given to dcp_import
 * and to dcp_load_file instead, which must both fail so; the import must
 * leave no checkpoint behind. Setup directives are separated by commas.
 * Prints one line per case with the message (-v), then "hostile files: N
 * refused with the expected code of N".
 *   hostile_replay HOSTILE_DIR [-v]
 */
#include <dcp/dcp_convert.h>
#include <dcp/dcp.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Applies one setup directive to the staged case dst. */
static int apply(const char *dst, const char *setup)
{
    if (!strcmp(setup, "-") || !strncmp(setup, "file:", 5))
        return 0;
    if (!strncmp(setup, "symlink:", 8)) {
        char name[256], target[512], path[2048];
        const char *eq = strchr(setup + 8, '=');
        if (!eq)
            return -1;
        snprintf(name, sizeof(name), "%.*s", (int)(eq - setup - 8), setup + 8);
        snprintf(target, sizeof(target), "%s", eq + 1);
        snprintf(path, sizeof(path), "%s/%s", dst, name);
        (void)unlink(path);
        return symlink(target, path);
    }
    if (!strncmp(setup, "fifo:", 5)) {
        char path[2048];
        snprintf(path, sizeof(path), "%s/%s", dst, setup + 5);
        (void)unlink(path);
        return mkfifo(path, 0644);
    }
    return -1;
}

/* Copies the case into a scratch directory (the source tree stays
 * untouched) and applies its setup directives (comma-separated). */
static int stage(const char *src, const char *dst, const char *setup)
{
    char cmd[4096], one[512];
    const char *p = setup;
    snprintf(cmd, sizeof(cmd), "rm -rf '%s' && cp -r '%s' '%s'", dst, src, dst);
    if (system(cmd) != 0)
        return -1;
    while (*p) {
        size_t n = strcspn(p, ",");
        snprintf(one, sizeof(one), "%.*s", (int)n, p);
        if (apply(dst, one) != 0)
            return -1;
        p += n + (p[n] == ',');
    }
    return 0;
}

/* The NAME of a "file:NAME" directive in setup, into out; 0 if none. */
static int file_case(const char *setup, char *out, size_t cap)
{
    const char *f = strstr(setup, "file:");
    if (!f || (f != setup && f[-1] != ','))
        return 0;
    snprintf(out, cap, "%.*s", (int)strcspn(f + 5, ","), f + 5);
    return 1;
}

/* dcp_import of file into a fresh directory, which must not end up
 * holding a checkpoint; *committed is set when it does. */
static int import_file(dcp_ctx *ctx, const char *file, const char *out,
                       int *committed)
{
    char meta[1300];
    int rc = dcp_import(ctx, file, out, NULL, NULL);
    snprintf(meta, sizeof(meta), "%s/.metadata", out);
    *committed = access(meta, F_OK) == 0;
    return rc;
}

/* dcp_load_file into an empty state (the file is parsed before any key is
 * matched). */
static int load_file(dcp_ctx *ctx, const char *file)
{
    dcp_load_options lo = {sizeof(lo), DCP_LOAD_PARTIAL, NULL};
    dcp_state *st = NULL;
    int rc;
    if (dcp_state_create(&st) != DCP_OK)
        return DCP_ENOMEM;
    rc = dcp_load_file(ctx, st, file, &lo);
    dcp_state_free(st);
    return rc;
}

/* A strict load of every entry the metadata lists (tensors whole), those
 * of dtypes dcp cannot read too (dcp_metadata_unsupported). */
static int load_everything(dcp_ctx *ctx, const char *dir)
{
    dcp_metadata *md = NULL;
    dcp_state *st = NULL;
    void *bufs[64];
    size_t n = 0, i;
    int rc = dcp_metadata_open(ctx, dir, &md);
    if (rc == DCP_OK)
        rc = dcp_state_create(&st);
    if (rc != DCP_OK) {
        /* Nothing to ask for: load must still refuse the checkpoint. */
        dcp_load_options lo = {sizeof(lo), DCP_LOAD_PARTIAL, NULL};
        dcp_metadata_free(md);
        if (dcp_state_create(&st) != DCP_OK)
            return DCP_ENOMEM;
        rc = dcp_load(ctx, st, dir, &lo);
        dcp_state_free(st);
        return rc;
    }
    for (i = 0; i < dcp_metadata_count(md) && n < 64; i++) {
        dcp_entry_info e;
        (void)dcp_metadata_entry(md, i, &e);
        if (!e.is_tensor) {
            (void)dcp_state_add_value(st, e.key, dcp_value_none());
            continue;
        }
        bufs[n] = calloc(1, e.nbytes ? (size_t)e.nbytes : 1);
        if (!bufs[n])
            abort();
        (void)dcp_state_add_tensor(st, e.key, e.dtype, e.ndim, e.shape, NULL,
                                   NULL, bufs[n], DCP_MEM_HOST);
        n++;
    }
    /* Keys of dtypes dcp cannot read, asked for as int8: refused by
     * name (DCP_ENOTSUP). */
    for (i = 0; i < dcp_metadata_unsupported_count(md) && n < 64; i++) {
        dcp_entry_info e;
        size_t k, numel = 1;
        (void)dcp_metadata_unsupported(md, i, &e, NULL);
        for (k = 0; k < (size_t)e.ndim; k++)
            numel *= (size_t)e.shape[k];
        if (!(bufs[n] = calloc(1, numel ? numel : 1)))
            abort();
        (void)dcp_state_add_tensor(st, e.key, DCP_I8, e.ndim, e.shape, NULL,
                                   NULL, bufs[n], DCP_MEM_HOST);
        n++;
    }
    rc = dcp_load(ctx, st, dir, NULL);
    dcp_state_free(st);
    for (i = 0; i < n; i++)
        free(bufs[i]);
    dcp_metadata_free(md);
    return rc;
}

int main(int argc, char **argv)
{
    char line[2048], path[1024], scratch[256], dst[600];
    int verbose = argc > 2 && !strcmp(argv[2], "-v");
    int ncases = 0, nok = 0;
    FILE *f;
    dcp_ctx *ctx;
    if (argc < 2) {
        fprintf(stderr, "usage: hostile_replay HOSTILE_DIR [-v]\n");
        return 2;
    }
    snprintf(path, sizeof(path), "%s/manifest.txt", argv[1]);
    f = fopen(path, "r");
    if (!f || dcp_ctx_create(&ctx, NULL, NULL) != DCP_OK) {
        fprintf(stderr, "cannot read %s\n", path);
        return 1;
    }
    strcpy(scratch, "/tmp/dcp-hostile-XXXXXX");
    if (!mkdtemp(scratch))
        return 1;
    while (fgets(line, sizeof(line), f)) {
        char name[256], code[64], setup[512], fname[256];
        int rcv, rcl, ok, committed;
        char msg[1024];
        if (line[0] == '#' ||
            sscanf(line, "%255s %63s %511s", name, code, setup) != 3)
            continue;
        ncases++;
        snprintf(path, sizeof(path), "%s/%s", argv[1], name);
        snprintf(dst, sizeof(dst), "%s/%s", scratch, name);
        if (stage(path, dst, setup) != 0) {
            printf("FAIL %-32s setup failed (%s)\n", name, strerror(errno));
            continue;
        }
        committed = 0;
        fname[0] = '\0';
        if (file_case(setup, fname, sizeof(fname))) {
            char file[1200], out[1200];
            snprintf(file, sizeof(file), "%s/%s", dst, fname);
            snprintf(out, sizeof(out), "%s.import", dst);
            rcv = import_file(ctx, file, out, &committed);
            snprintf(msg, sizeof(msg), "%s", dcp_errmsg(ctx));
            rcl = load_file(ctx, file);
        } else {
            rcv = dcp_verify(ctx, dst);
            snprintf(msg, sizeof(msg), "%s", dcp_errmsg(ctx));
            rcl = load_everything(ctx, dst);
        }
        ok = !committed && !strcmp(dcp_err_name(rcv), code) &&
             !strcmp(dcp_err_name(rcl), code) && strchr(msg, '\'') &&
             strchr(dcp_errmsg(ctx), '\'');
        nok += ok;
        if (!ok || verbose)
            printf("%s %-32s %-12s %s %s, load %s%s: %s\n",
                   ok ? "ok  " : "FAIL", name, code,
                   fname[0] ? "import" : "verify", dcp_err_name(rcv),
                   dcp_err_name(rcl), committed ? " (committed!)" : "", msg);
    }
    fclose(f);
    dcp_ctx_free(ctx);
    snprintf(line, sizeof(line), "rm -rf '%s'", scratch);
    if (system(line) != 0)
        fprintf(stderr, "cannot remove %s\n", scratch);
    printf("hostile files: %d refused with the expected code of %d\n", nok,
           ncases);
    printf("%d passed, %d failed\n", nok, ncases - nok);
    return nok == ncases && ncases > 0 ? 0 : 1;
}
