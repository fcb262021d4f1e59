/*
 * dcptool: inspect, verify and read checkpoints in PyTorch DCP format.
 * A client of the public API only.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dcp/dcp_s3.h>

#include "dcptool.h"

static const struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
} commands[] = {
    {"info", cmd_info, "DIR [--json]           summary of a checkpoint"},
    {"ls", cmd_ls, "DIR [--json]             one line per entry"},
    {"verify", cmd_verify, "DIR                  check every chunk and CRC"},
    {"cat", cmd_cat,
     "DIR KEY [--offsets O --sizes S]  raw bytes of a tensor, or a value "
     "as JSON"},
    {"export", cmd_export,
     "DIR OUT [--format F --dtype D --max-shard-size S --keys P ...]\n"
     "                         to one torch.save or safetensors file"},
    {"import", cmd_import,
     "IN DIR [--keys P ...]  a torch.save, safetensors or index file into\n"
     "                         a new checkpoint"},
    {"diff", cmd_diff,
     "DIR1 DIR2 [--rtol R --atol A]  keys, dtypes, shapes, values\n"
     "                         (exit 1 on a difference)"},
    {"list", cmd_list,
     "ROOT [--json]          step checkpoints of a root and their status"},
    {"latest", cmd_latest,
     "ROOT [--json]        the newest complete step checkpoint"},
    {"prune", cmd_prune,
     "ROOT --keep K [--keep-every N] [--json]  remove older complete\n"
     "                         step checkpoints (.metadata first)"},
    {"rm", cmd_rm,
     "DIR [--json]             remove one checkpoint, crash safe"},
    {"clean", cmd_clean,
     "DIR [--force] [--json]  remove what interrupted saves left"},
};

static void usage(FILE *f)
{
    size_t i;
    fprintf(f, "usage: dcptool <command> [args]\n\ncommands:\n");
    for (i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        fprintf(f, "  %s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\n  --version              library and header versions\n");
}

/* s with control characters escaped; a backslash doubled when
 * backslash is set (not in the library's messages, which escape bad bytes
 * of the keys they name themselves). */
static void put_text(FILE *f, const char *s, int backslash)
{
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '\\' && backslash)
            fputs("\\\\", f);
        else if (c == '\n')
            fputs("\\n", f);
        else if (c == '\t')
            fputs("\\t", f);
        else if (c == '\r')
            fputs("\\r", f);
        else if (c < 0x20 || c == 0x7f)
            fprintf(f, "\\x%02x", c);
        else
            fputc(c, f);
    }
}

void tool_text(FILE *f, const char *s)
{
    put_text(f, s, 1);
}

int tool_fail(const dcp_ctx *ctx, int rc)
{
    const char *msg = ctx ? dcp_errmsg(ctx) : "";
    fputs("dcptool: ", stderr);
    put_text(stderr, msg && *msg ? msg : dcp_strerror(rc), 0);
    fputc('\n', stderr);
    return 1;
}

int tool_usage(const char *text)
{
    fprintf(stderr, "usage: dcptool %s\n", text);
    return EXIT_USAGE;
}

int tool_open(const char *dir, dcp_ctx **ctx, dcp_metadata **md)
{
    int rc = dcp_ctx_create(ctx, NULL, NULL);
    if (rc != DCP_OK)
        return tool_fail(NULL, rc);
    rc = dcp_metadata_open(*ctx, dir, md);
    if (rc != DCP_OK) {
        tool_fail(*ctx, rc);
        dcp_ctx_free(*ctx);
        *ctx = NULL;
        return 1;
    }
    return 0;
}

void tool_json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

/* The S3 limits from the environment (docs/dcptool.md "ENVIRONMENT"): a
 * decimal >= 1, else a usage error. 0: none set, 1: set, -1: bad. */
static int s3_limit(const char *name, long long max, long long *out)
{
    const char *v = getenv(name);
    char *end;
    if (!v)
        return 0;
    errno = 0;
    *out = strtoll(v, &end, 10);
    if (!*v || *end || errno || *out < 1 || *out > max) {
        fprintf(stderr,
                "dcptool: %s='%s' is not a whole number from 1 to %lld\n",
                name, v, max);
        return -1;
    }
    return 1;
}

static int s3_limits(void)
{
    static const struct {
        const char *env;
        long long max;
    } lim[] = {{"DCP_S3_MAX_ATTEMPTS", 1000},
               {"DCP_S3_RETRY_BUDGET_MS", 86400000},
               {"DCP_S3_CONNECT_TIMEOUT_MS", 3600000},
               {"DCP_S3_STALL_TIMEOUT_MS", 3600000}};
    long long v[4] = {0, 0, 0, 0};
    dcp_s3_config c;
    int any = 0, r;
    for (size_t i = 0; i < 4; i++) {
        r = s3_limit(lim[i].env, lim[i].max, &v[i]);
        if (r < 0)
            return EXIT_USAGE;
        any |= r;
    }
    if (!any)
        return 0;
    memset(&c, 0, sizeof(c));
    c.struct_size = sizeof(c);
    c.max_attempts = (uint32_t)v[0];
    c.retry_budget_ms = v[1];
    c.connect_timeout_ms = v[2];
    c.stall_timeout_ms = v[3];
    r = dcp_s3_configure(&c);
    if (r != DCP_OK && r != DCP_ENOTSUP)
        return tool_fail(NULL, r);
    return 0;
}

int main(int argc, char **argv)
{
    size_t i;
    int rc;
    if (argc < 2 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "--help") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? EXIT_USAGE : 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("dcptool %s (library %s)\n", DCP_VERSION_STRING,
               dcp_version_string());
        return 0;
    }
    rc = s3_limits();
    if (rc != 0)
        return rc;
    for (i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
        if (strcmp(argv[1], commands[i].name) == 0)
            return commands[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "dcptool: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return EXIT_USAGE;
}
