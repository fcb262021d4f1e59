/*
 * The checkpoint manager's internal pieces (dcp_manager.h is the API):
 * step names, the root's listing, crash-safe removal and retention, for the
 * manager itself and for white-box tests. Errors go to ctx->err.
 */
#ifndef DCP_MANAGER_H
#define DCP_MANAGER_H

#include <stdint.h>

#include "dcp/dcp_manager.h"
#include "util.h"

/* The name pattern of o (NULL: defaults), checked. */
int dcp__mgr_pattern(const dcp_manager_options *o, const char **prefix,
                     const char **suffix, struct dcp_err *err);
/* 1 and *step when name is prefix + decimal (no leading zero) + suffix. */
int dcp__mgr_parse(const char *name, const char *prefix, const char *suffix,
                   int64_t *step);
/* dcp_manager_list with a checked pattern. newest: statuses only from the
 * newest step down to the first complete one (each check decodes a
 * .metadata); the older entries keep DCP__MGR_UNCHECKED. */
#define DCP__MGR_UNCHECKED (-1)
int dcp__mgr_list(dcp_ctx *ctx, const char *root, const char *prefix,
                  const char *suffix, int newest, dcp_manager_entry **out,
                  size_t *n);
/* dcp_manager_remove without the argument checks. */
int dcp__mgr_remove(dcp_ctx *ctx, const char *dir);
/* Retention of dcp_manager_prune; protect[0 .. nprotect): steps never
 * removed (entries -1 ignored). */
int dcp__mgr_prune(dcp_ctx *ctx, const char *root, const char *prefix,
                   const char *suffix, uint32_t keep_last, int64_t keep_every,
                   const int64_t *protect, size_t nprotect, size_t *removed);

/*
 * Test hook (tests/fault/test_manager_crash.c): fn(what, arg) is called
 * before each change a removal makes (unlink .metadata, sync, unlink a
 * file, rmdir, sync the parent), so that a test can kill the process
 * there. NULL fn: none (the default). Not thread safe.
 */
void dcp__mgr_set_remove_hook(void (*fn)(const char *what, void *arg),
                              void *arg);

#endif /* DCP_MANAGER_H */
