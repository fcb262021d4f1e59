/*
 * dcptool: shared declarations of the command table. Each command is a
 * cmd_<verb>.c using only the public API. Exit codes: 0 success, 1 error,
 * 2 bad usage.
 */
#ifndef DCPTOOL_H
#define DCPTOOL_H

#include <stdio.h>

#include <dcp/dcp.h>

#define EXIT_USAGE 2

int cmd_info(int argc, char **argv);
int cmd_ls(int argc, char **argv);
int cmd_verify(int argc, char **argv);
int cmd_cat(int argc, char **argv);
int cmd_export(int argc, char **argv);
int cmd_import(int argc, char **argv);
int cmd_diff(int argc, char **argv);
int cmd_list(int argc, char **argv);
int cmd_latest(int argc, char **argv);
int cmd_prune(int argc, char **argv);
int cmd_rm(int argc, char **argv);
int cmd_clean(int argc, char **argv);

/* Prints "dcptool: <detail or strerror>" for a failed call; returns 1. */
int tool_fail(const dcp_ctx *ctx, int rc);
/* Prints usage for the command to stderr; returns EXIT_USAGE. */
int tool_usage(const char *fmt);
/* Opens a context and the metadata of dir; returns 0 or the exit code. */
int tool_open(const char *dir, dcp_ctx **ctx, dcp_metadata **md);
/* "5GB" (10^9), "5GiB" (2^30) or a plain byte count; 0 or -1. */
int tool_parse_size(const char *s, uint64_t *out);
/*
 * Writes a key (or other text from a checkpoint) for text output, on one
 * line: a backslash as "\\", newline, tab and carriage return as "\n",
 * "\t", "\r", any other C0 control character and DEL as "\xNN"; other
 * bytes (UTF-8 text) as they are. JSON output uses tool_json_str.
 */
void tool_text(FILE *f, const char *s);
/* Writes s as a JSON string literal. */
void tool_json_str(FILE *f, const char *s);

#endif /* DCPTOOL_H */
