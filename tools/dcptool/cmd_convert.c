/*
 * dcptool export DIR OUT [options] and dcptool import IN DIR [options]:
 * format conversion through dcp_export / dcp_import (dcp_convert.h).
 * Progress goes to stderr when stderr is a terminal.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <dcp/dcp_convert.h>

#include "dcptool.h"

static const char export_usage[] =
    "export DIR OUT [--format safetensors|torch] [--dtype DTYPE]\n"
    "         [--max-shard-size SIZE] [--keys PATTERN]... [--strip-prefix P]\n"
    "         [--add-prefix P] [--allow-overflow] [--no-verify] [--no-fsync]\n"
    "         [--mem-limit SIZE] [--quiet]";
static const char import_usage[] =
    "import IN DIR [--format safetensors|index|torch] [--dtype DTYPE]\n"
    "         [--keys PATTERN]... [--strip-prefix P] [--add-prefix P]\n"
    "         [--allow-overflow] [--dequant] [--no-fsync] [--mem-limit SIZE]\n"
    "         [--quiet]";

/* "5GB" (10^9), "5GiB" (2^30), "123" (bytes), as Hugging Face reads
 * max_shard_size. Returns 0 or -1. */
int tool_parse_size(const char *s, uint64_t *out)
{
    static const struct {
        const char *suffix;
        uint64_t mult;
    } units[] = {{"", 1},
                 {"B", 1},
                 {"KB", 1000ull},
                 {"MB", 1000000ull},
                 {"GB", 1000000000ull},
                 {"TB", 1000000000000ull},
                 {"KiB", 1ull << 10},
                 {"MiB", 1ull << 20},
                 {"GiB", 1ull << 30},
                 {"TiB", 1ull << 40}};
    char *end;
    unsigned long long v;
    size_t i;
    if (!*s || *s == '-')
        return -1;
    errno = 0;
    v = strtoull(s, &end, 10);
    if (end == s || errno)
        return -1;
    for (i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
        if (strcmp(end, units[i].suffix) == 0) {
            if (v > UINT64_MAX / units[i].mult)
                return -1;
            *out = v * units[i].mult;
            return 0;
        }
    }
    return -1;
}

struct progress {
    int last; /* last percentage printed, -1 before the first */
    const char *what;
};

/* n bytes as "12.3 MB" into buf. */
static const char *human(char *buf, size_t cap, uint64_t n)
{
    static const char *const unit[] = {"B", "kB", "MB", "GB", "TB"};
    double v = (double)n;
    int u = 0;
    while (v >= 1000.0 && u < 4) {
        v /= 1000.0;
        u++;
    }
    (void)snprintf(buf, cap, u ? "%.1f %s" : "%.0f %s", v, unit[u]);
    return buf;
}

static void show_progress(void *arg, uint64_t done, uint64_t total)
{
    struct progress *p = arg;
    int pct = total ? (int)(done * 100 / total) : 100;
    char a[32], b[32];
    if (pct == p->last)
        return;
    p->last = pct;
    fprintf(stderr, "\r%s: %3d%% (%s of %s)", p->what, pct,
            human(a, sizeof(a), done), human(b, sizeof(b), total));
    if (done >= total)
        fputc('\n', stderr);
    fflush(stderr);
}

/* Parses the options shared by export and import; argv[0] is the verb.
 * Returns 0, or EXIT_USAGE after printing the usage. */
static int parse_opts(int argc, char **argv, int is_export,
                      dcp_convert_options *o, const char **pos,
                      const char **keys, int *quiet)
{
    const char *usage = is_export ? export_usage : import_usage;
    int i, npos = 0;
    for (i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--allow-overflow") == 0) {
            o->flags |= DCP_CONVERT_ALLOW_OVERFLOW;
        } else if (strcmp(a, "--no-verify") == 0 && is_export) {
            o->flags |= DCP_CONVERT_NO_VERIFY;
        } else if (strcmp(a, "--no-fsync") == 0) {
            o->flags |= DCP_CONVERT_NO_FSYNC;
        } else if (strcmp(a, "--dequant") == 0 && !is_export) {
            o->flags |= DCP_CONVERT_DEQUANT;
        } else if (strcmp(a, "--quiet") == 0) {
            *quiet = 1;
        } else if (a[0] == '-' && a[1] == '-') {
            if (!v)
                return tool_usage(usage);
            i++;
            if (strcmp(a, "--format") == 0) {
                if (strcmp(v, "safetensors") == 0)
                    o->format = DCP_FORMAT_SAFETENSORS;
                else if (strcmp(v, "torch") == 0)
                    o->format = DCP_FORMAT_TORCH;
                else if (strcmp(v, "index") == 0 && !is_export)
                    o->format = DCP_FORMAT_SAFETENSORS_INDEX;
                else
                    return tool_usage(usage);
            } else if (strcmp(a, "--dtype") == 0) {
                if (dcp_dtype_from_name(v, &o->dtype) != DCP_OK)
                    return tool_usage(usage);
            } else if (strcmp(a, "--max-shard-size") == 0 && is_export) {
                if (tool_parse_size(v, &o->max_shard_bytes) != 0 ||
                    o->max_shard_bytes == 0)
                    return tool_usage(usage);
            } else if (strcmp(a, "--mem-limit") == 0) {
                if (tool_parse_size(v, &o->mem_limit) != 0)
                    return tool_usage(usage);
            } else if (strcmp(a, "--keys") == 0) {
                keys[o->nkeys++] = v;
            } else if (strcmp(a, "--strip-prefix") == 0) {
                o->strip_prefix = v;
            } else if (strcmp(a, "--add-prefix") == 0) {
                o->add_prefix = v;
            } else {
                return tool_usage(usage);
            }
        } else {
            if (npos == 2)
                return tool_usage(usage);
            pos[npos++] = a;
        }
    }
    if (npos != 2)
        return tool_usage(usage);
    o->keys = o->nkeys ? keys : NULL;
    return 0;
}

static int convert(int argc, char **argv, int is_export)
{
    dcp_convert_options o;
    dcp_convert_result res;
    struct progress pr = {-1, is_export ? "export" : "import"};
    const char *pos[2] = {NULL, NULL};
    const char **keys;
    dcp_ctx *ctx = NULL;
    int quiet = 0, rc;
    memset(&o, 0, sizeof(o));
    memset(&res, 0, sizeof(res));
    o.struct_size = sizeof(o);
    res.struct_size = sizeof(res);
    keys = calloc((size_t)argc + 1, sizeof(*keys));
    if (!keys)
        return tool_fail(NULL, DCP_ENOMEM);
    rc = parse_opts(argc, argv, is_export, &o, pos, keys, &quiet);
    if (rc) {
        free((void *)keys);
        return rc;
    }
    if (!quiet && isatty(STDERR_FILENO)) {
        o.progress = show_progress;
        o.progress_arg = &pr;
    }
    rc = dcp_ctx_create(&ctx, NULL, NULL);
    if (rc == DCP_OK)
        rc = is_export ? dcp_export(ctx, pos[0], pos[1], &o, &res)
                       : dcp_import(ctx, pos[0], pos[1], &o, &res);
    if (pr.last >= 0 && pr.last < 100)
        fputc('\n', stderr);
    free((void *)keys);
    if (rc != DCP_OK) {
        tool_fail(ctx, rc);
        dcp_ctx_free(ctx);
        return 1;
    }
    printf("%s: %zu tensors (%llu bytes), %zu values",
           is_export ? "exported" : "imported", res.tensors,
           (unsigned long long)res.bytes, res.values);
    if (res.cast || res.kept)
        printf("; cast %zu, kept %zu (not floating point)", res.cast, res.kept);
    if (res.skipped)
        printf("; left out %zu values (safetensors holds tensors only)",
               res.skipped);
    printf("; %zu file%s\n", res.files, res.files == 1 ? "" : "s");
    dcp_ctx_free(ctx);
    return 0;
}

int cmd_export(int argc, char **argv)
{
    return convert(argc, argv, 1);
}

int cmd_import(int argc, char **argv)
{
    return convert(argc, argv, 0);
}
