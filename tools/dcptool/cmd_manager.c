/*
 * dcptool list ROOT, latest ROOT, prune ROOT --keep K, rm DIR: a root of
 * step-named checkpoints (dcp_manager.h); clean DIR: the leftovers of
 * interrupted writers in one checkpoint directory (dcp_clean, dcp.h).
 * Each takes --json.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <dcp/dcp_manager.h>

#include "dcptool.h"

static const char *status_name(int s)
{
    switch (s) {
    case DCP_MANAGER_COMPLETE:
        return "complete";
    case DCP_MANAGER_INCOMPLETE:
        return "incomplete";
    case DCP_MANAGER_CORRUPT:
        return "corrupt";
    case DCP_MANAGER_LINK:
        return "link";
    default:
        return "notdir";
    }
}

/* A count argument: a decimal >= 0 that fits, or -1. */
static int parse_count(const char *s, int64_t max, int64_t *out)
{
    char *end;
    if (!s || !*s || *s == '-' || *s == '+')
        return -1;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || v < 0 || v > max)
        return -1;
    *out = v;
    return 0;
}

/* Common options: ROOT, --json, --prefix P, --suffix S; extra handles the
 * command's own (returns 1 when it took argv[*a], -1 on bad usage). */
struct margs {
    const char *root;
    int json;
    dcp_manager_options o;
};

static int parse_common(int argc, char **argv, struct margs *m,
                        int (*extra)(int argc, char **argv, int *a,
                                     struct margs *m))
{
    memset(m, 0, sizeof *m);
    m->o.struct_size = sizeof m->o;
    for (int a = 1; a < argc; a++) {
        int r = extra ? extra(argc, argv, &a, m) : 0;
        if (r < 0)
            return -1;
        if (r > 0)
            continue;
        if (strcmp(argv[a], "--json") == 0)
            m->json = 1;
        else if (strcmp(argv[a], "--prefix") == 0 && a + 1 < argc)
            m->o.prefix = argv[++a];
        else if (strcmp(argv[a], "--suffix") == 0 && a + 1 < argc)
            m->o.suffix = argv[++a];
        else if (!m->root && argv[a][0] != '-')
            m->root = argv[a];
        else
            return -1;
    }
    return m->root ? 0 : -1;
}

#define LIST_USAGE   "list ROOT [--json] [--prefix P --suffix S]"
#define LATEST_USAGE "latest ROOT [--json] [--prefix P --suffix S]"
#define PRUNE_USAGE \
    "prune ROOT --keep K [--keep-every N] [--json] [--prefix P --suffix S]"
#define RM_USAGE "rm DIR [--json]"
#define CLEAN_USAGE "clean DIR [--force] [--json]"

static int list_root(struct margs *m, dcp_ctx **ctx, dcp_manager_entry **e,
                     size_t *n)
{
    int rc = dcp_ctx_create(ctx, NULL, NULL);
    if (rc != DCP_OK)
        return tool_fail(NULL, rc);
    rc = dcp_manager_list(*ctx, m->root, &m->o, e, n);
    if (rc != DCP_OK) {
        tool_fail(*ctx, rc);
        dcp_ctx_free(*ctx);
        *ctx = NULL;
        return 1;
    }
    return 0;
}

int cmd_list(int argc, char **argv)
{
    struct margs m;
    dcp_ctx *ctx = NULL;
    dcp_manager_entry *e = NULL;
    size_t n = 0;
    if (parse_common(argc, argv, &m, NULL) != 0)
        return tool_usage(LIST_USAGE);
    int rc = list_root(&m, &ctx, &e, &n);
    if (rc)
        return rc;
    if (m.json)
        printf("[");
    for (size_t i = 0; i < n; i++) {
        if (m.json) {
            printf("%s{\"step\": %" PRId64 ", \"status\": \"%s\", \"name\": ",
                   i ? ", " : "", e[i].step, status_name(e[i].status));
            tool_json_str(stdout, e[i].name);
            if (e[i].error) {
                printf(", \"error\": ");
                tool_json_str(stdout, e[i].error);
            }
            printf("}");
        } else {
            printf("%" PRId64 "\t%s\t", e[i].step, status_name(e[i].status));
            tool_text(stdout, e[i].name);
            if (e[i].error) {
                putchar('\t');
                tool_text(stdout, e[i].error);
            }
            putchar('\n');
        }
    }
    if (m.json)
        printf("]\n");
    dcp_manager_list_free(e, n);
    dcp_ctx_free(ctx);
    return 0;
}

int cmd_latest(int argc, char **argv)
{
    struct margs m;
    dcp_ctx *ctx = NULL;
    dcp_manager_entry *e = NULL;
    size_t n = 0, i;
    if (parse_common(argc, argv, &m, NULL) != 0)
        return tool_usage(LATEST_USAGE);
    int rc = list_root(&m, &ctx, &e, &n);
    if (rc)
        return rc;
    for (i = n; i-- > 0;)
        if (e[i].status == DCP_MANAGER_COMPLETE)
            break;
    if (i == (size_t)-1) {
        fputs("dcptool: no complete checkpoint under ", stderr);
        tool_text(stderr, m.root);
        fputc('\n', stderr);
        rc = 1;
    } else if (m.json) {
        printf("{\"step\": %" PRId64 ", \"name\": ", e[i].step);
        tool_json_str(stdout, e[i].name);
        printf("}\n");
    } else {
        printf("%" PRId64 "\t", e[i].step);
        tool_text(stdout, e[i].name);
        putchar('\n');
    }
    dcp_manager_list_free(e, n);
    dcp_ctx_free(ctx);
    return rc;
}

static int have_keep;

static int prune_opts(int argc, char **argv, int *a, struct margs *m)
{
    int64_t v;
    if (strcmp(argv[*a], "--keep") == 0) {
        /* 0 keeps them all, as keep_last = 0 in dcp_manager_options */
        if (*a + 1 >= argc || parse_count(argv[*a + 1], UINT32_MAX, &v))
            return -1;
        m->o.keep_last = (uint32_t)v;
        have_keep = 1;
        ++*a;
        return 1;
    }
    if (strcmp(argv[*a], "--keep-every") == 0) {
        if (*a + 1 >= argc || parse_count(argv[*a + 1], INT64_MAX, &v))
            return -1;
        m->o.keep_every = v;
        ++*a;
        return 1;
    }
    return 0;
}

int cmd_prune(int argc, char **argv)
{
    struct margs m;
    dcp_ctx *ctx = NULL;
    size_t removed = 0;
    have_keep = 0;
    if (parse_common(argc, argv, &m, prune_opts) != 0 || !have_keep)
        return tool_usage(PRUNE_USAGE);
    int rc = dcp_ctx_create(&ctx, NULL, NULL);
    if (rc != DCP_OK)
        return tool_fail(NULL, rc);
    rc = dcp_manager_prune(ctx, m.root, &m.o, &removed);
    if (rc != DCP_OK) {
        tool_fail(ctx, rc);
        dcp_ctx_free(ctx);
        return 1;
    }
    if (m.json)
        printf("{\"removed\": %zu}\n", removed);
    else
        printf("removed %zu\n", removed);
    dcp_ctx_free(ctx);
    return 0;
}

int cmd_rm(int argc, char **argv)
{
    const char *dir = NULL;
    int json = 0;
    dcp_ctx *ctx = NULL;
    for (int a = 1; a < argc; a++) {
        if (strcmp(argv[a], "--json") == 0)
            json = 1;
        else if (!dir && argv[a][0] != '-')
            dir = argv[a];
        else
            return tool_usage(RM_USAGE);
    }
    if (!dir)
        return tool_usage(RM_USAGE);
    int rc = dcp_ctx_create(&ctx, NULL, NULL);
    if (rc != DCP_OK)
        return tool_fail(NULL, rc);
    rc = dcp_manager_remove(ctx, dir);
    if (rc != DCP_OK) {
        tool_fail(ctx, rc);
        dcp_ctx_free(ctx);
        return 1;
    }
    if (json) {
        printf("{\"removed\": ");
        tool_json_str(stdout, dir);
        printf("}\n");
    } else {
        printf("removed ");
        tool_text(stdout, dir);
        putchar('\n');
    }
    dcp_ctx_free(ctx);
    return 0;
}

int cmd_clean(int argc, char **argv)
{
    const char *dir = NULL;
    int json = 0;
    unsigned flags = 0;
    dcp_ctx *ctx = NULL;
    dcp_clean_result res;
    for (int a = 1; a < argc; a++) {
        if (strcmp(argv[a], "--json") == 0)
            json = 1;
        else if (strcmp(argv[a], "--force") == 0)
            flags |= DCP_CLEAN_FORCE;
        else if (!dir && argv[a][0] != '-')
            dir = argv[a];
        else
            return tool_usage(CLEAN_USAGE);
    }
    if (!dir)
        return tool_usage(CLEAN_USAGE);
    int rc = dcp_ctx_create(&ctx, NULL, NULL);
    if (rc != DCP_OK)
        return tool_fail(NULL, rc);
    memset(&res, 0, sizeof(res));
    res.struct_size = sizeof(res);
    rc = dcp_clean(ctx, dir, flags, &res);
    if (rc != DCP_OK) {
        tool_fail(ctx, rc);
        dcp_ctx_free(ctx);
        return 1;
    }
    if (json)
        printf("{\"files\": %" PRIu64 ", \"bytes\": %" PRIu64 "}\n",
               res.files, res.bytes);
    else
        printf("removed %" PRIu64 " files, %" PRIu64 " bytes\n", res.files,
               res.bytes);
    dcp_ctx_free(ctx);
    return 0;
}
