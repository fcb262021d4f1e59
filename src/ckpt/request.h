/*
 * Requests and the one-save-in-flight rule of a context (request.c).
 */
#ifndef DCP_REQUEST_H
#define DCP_REQUEST_H

#include "ctx.h"

/* Completes the save in flight on ctx, if any (collective then: every rank
 * has the same save in flight); its result stays in its request. */
void dcp__async_settle(dcp_ctx *ctx);

/* For dcp_ctx_free: abandons a save in flight (nothing committed, this
 * rank's new data file removed), joins the worker, frees the staging
 * buffers. Not collective. */
void dcp__async_ctx_release(dcp_ctx *ctx);

#endif /* DCP_REQUEST_H */
