/*
 * Error texts, version, element types and the context.
 */
#include "ctx.h"

#include <stddef.h> /* offsetof */
#include <stdio.h>  /* snprintf */
#include <string.h>

#include "async.h"

const char *dcp_strerror(int code)
{
    switch (code) {
    case DCP_OK:
        return "success";
#define DCP_XX_TEXT(name, val, text)                                           \
    case DCP_##name:                                                           \
        return text;
        DCP_ERRNO_MAP(DCP_XX_TEXT)
#undef DCP_XX_TEXT
    default:
        return "unknown error";
    }
}

const char *dcp_err_name(int code)
{
    switch (code) {
    case DCP_OK:
        return "DCP_OK";
#define DCP_XX_NAME(name, val, text)                                           \
    case DCP_##name:                                                           \
        return "DCP_" #name;
        DCP_ERRNO_MAP(DCP_XX_NAME)
#undef DCP_XX_NAME
    default:
        return "DCP_UNKNOWN";
    }
}

unsigned dcp_version_number(void)
{
    return DCP_VERSION_NUMBER;
}

const char *dcp_version_string(void)
{
    return DCP_VERSION_STRING;
}

/* ------------------------------------------------------------- dtypes */

static const struct {
    dcp_dtype dt;
    size_t size;
    const char *name;
    const char *alias;
} dtypes[] = {
    {DCP_F64, 8, "float64", "f64"},
    {DCP_F32, 4, "float32", "f32"},
    {DCP_F16, 2, "float16", "f16"},
    {DCP_BF16, 2, "bfloat16", "bf16"},
    {DCP_F8_E4M3FN, 1, "float8_e4m3fn", "f8e4m3"},
    {DCP_F8_E5M2, 1, "float8_e5m2", "f8e5m2"},
    {DCP_I64, 8, "int64", "i64"},
    {DCP_I32, 4, "int32", "i32"},
    {DCP_I16, 2, "int16", "i16"},
    {DCP_I8, 1, "int8", "i8"},
    {DCP_U8, 1, "uint8", "u8"},
    {DCP_BOOL, 1, "bool", "bool"},
};

size_t dcp_dtype_size(dcp_dtype dt)
{
    size_t i;
    for (i = 0; i < DCP_ARRAY_LEN(dtypes); i++)
        if (dtypes[i].dt == dt)
            return dtypes[i].size;
    return 0;
}

const char *dcp_dtype_name(dcp_dtype dt)
{
    size_t i;
    for (i = 0; i < DCP_ARRAY_LEN(dtypes); i++)
        if (dtypes[i].dt == dt)
            return dtypes[i].name;
    return NULL;
}

int dcp_dtype_from_name(const char *name, dcp_dtype *out)
{
    static const struct {
        const char *name;
        dcp_dtype dt;
    } extra[] = {{"fp32", DCP_F32}, {"fp16", DCP_F16},   {"half", DCP_F16},
                 {"float", DCP_F32}, {"double", DCP_F64}, {"fp64", DCP_F64},
                 {"long", DCP_I64},  {"int", DCP_I32},    {"bfloat", DCP_BF16}};
    size_t i;
    if (!name || !out)
        return DCP_EINVAL;
    if (strncmp(name, "torch.", 6) == 0)
        name += 6;
    for (i = 0; i < DCP_ARRAY_LEN(dtypes); i++) {
        if (strcmp(name, dtypes[i].name) == 0 ||
            strcmp(name, dtypes[i].alias) == 0) {
            *out = dtypes[i].dt;
            return DCP_OK;
        }
    }
    for (i = 0; i < DCP_ARRAY_LEN(extra); i++) {
        if (strcmp(name, extra[i].name) == 0) {
            *out = extra[i].dt;
            return DCP_OK;
        }
    }
    return DCP_EINVAL;
}

/* ------------------------------------------------------------ context */

int dcp_ctx_create(dcp_ctx **out, dcp_comm *comm, const dcp_ctx_options *opts)
{
    dcp_ctx *ctx;
    if (!out)
        return DCP_EINVAL;
    *out = NULL;
    if (opts && opts->struct_size < sizeof(uint32_t))
        return DCP_EINVAL;
    ctx = dcp__calloc(1, sizeof(*ctx));
    if (!ctx)
        return DCP_ENOMEM;
    ctx->comm = comm;
    ctx->rank = comm ? comm->rank : 0;
    ctx->size = comm ? comm->size : 1;
    ctx->max_metadata_bytes = (uint64_t)4 << 30;
    ctx->max_value_bytes = (uint64_t)64 << 20;
    /* A field is read when struct_size covers it, so callers built against
     * an older, shorter struct keep working. */
#define HAS_OPT(field)            \
    (opts && opts->struct_size >= \
                 offsetof(dcp_ctx_options, field) + sizeof(opts->field))
    if (HAS_OPT(max_metadata_bytes) && opts->max_metadata_bytes)
        ctx->max_metadata_bytes = opts->max_metadata_bytes;
    if (HAS_OPT(max_value_bytes) && opts->max_value_bytes)
        ctx->max_value_bytes = opts->max_value_bytes;
    if (HAS_OPT(staging_budget))
        ctx->staging_budget = opts->staging_budget;
    if (ctx->staging_budget && ctx->staging_budget < DCP__STAGING_MIN) {
        dcp__free(ctx);
        return DCP_EINVAL;
    }
    if (HAS_OPT(io_block_bytes)) {
        ctx->io_flags = opts->io_flags & (DCP_IO_NO_DIRECT | DCP_IO_NO_URING);
        ctx->io_depth = opts->io_depth;
        ctx->io_block = opts->io_block_bytes;
        if ((opts->io_flags &
             ~(uint32_t)(DCP_IO_NO_DIRECT | DCP_IO_NO_URING)) ||
            ctx->io_depth > IO_MAX_DEPTH ||
            (ctx->io_block &&
             (ctx->io_block < IO_MIN_BLOCK || ctx->io_block > IO_MAX_BLOCK ||
              ctx->io_block % IO_DATA_ALIGN))) {
            dcp__free(ctx);
            return DCP_EINVAL;
        }
    }
    dcp__ctx_io_clear(ctx, DCP_IO_SAVE);
    dcp__ctx_io_clear(ctx, DCP_IO_LOAD);
    if (dcp__storage_init(
            &ctx->storage, HAS_OPT(storage) ? opts->storage : NULL,
            HAS_OPT(storage_impl) ? opts->storage_impl : NULL) != DCP_OK) {
        dcp__free(ctx);
        return DCP_EINVAL;
    }
#undef HAS_OPT
    *out = ctx;
    return DCP_OK;
}

int dcp__ctx_io_begin(dcp_ctx *ctx, struct io_eng **out)
{
    int rc = DCP_OK;
    if (!ctx->io)
        rc = dcp__io_eng_create(&ctx->io, ctx->io_flags, ctx->io_depth,
                                ctx->io_block, &ctx->err);
    if (rc == DCP_OK)
        dcp__io_stats_begin(ctx->io);
    *out = ctx->io;
    return rc;
}

void dcp__ctx_io_clear(dcp_ctx *ctx, int op)
{
    struct io_stats *s = &ctx->io_last[op ? 1 : 0];
    memset(s, 0, sizeof(*s));
    s->direct = s->uring = -1;
}

void dcp__ctx_io_end(dcp_ctx *ctx, int op)
{
    if (ctx->io)
        dcp__io_stats_get(ctx->io, &ctx->io_last[op ? 1 : 0]);
}

int dcp_ctx_io_report(const dcp_ctx *ctx, int op, dcp_io_report *out)
{
    const struct io_stats *s;
    if (!ctx || !out || (op != DCP_IO_SAVE && op != DCP_IO_LOAD) ||
        out->struct_size < sizeof(dcp_io_report))
        return DCP_EINVAL;
    s = &ctx->io_last[op];
    memset(out, 0, sizeof(*out));
    out->struct_size = sizeof(*out);
    out->direct = s->direct;
    out->uring = s->uring;
    (void)snprintf(out->fallback, sizeof(out->fallback), "%s", s->fallback);
    out->bytes = s->bytes;
    out->zero_copy_bytes = s->zero_copy_bytes;
    out->bounce_bytes = s->bounce_bytes;
    out->requests = s->requests;
    out->max_in_flight = s->max_in_flight;
    out->files = s->files;
    out->buffer_bytes = s->buffer_bytes;
    return DCP_OK;
}

void dcp__ctx_clear_report(dcp_ctx *ctx)
{
    size_t i;
    for (i = 0; i < ctx->nmissing; i++)
        dcp__free(ctx->missing[i]);
    for (i = 0; i < ctx->nunexpected; i++)
        dcp__free(ctx->unexpected[i]);
    dcp__free(ctx->missing);
    dcp__free(ctx->unexpected);
    ctx->missing = ctx->unexpected = NULL;
    ctx->nmissing = ctx->nunexpected = 0;
}

void dcp_ctx_free(dcp_ctx *ctx)
{
    if (!ctx)
        return;
    dcp__async_ctx_release(ctx);
    dcp__ctx_clear_report(ctx);
    dcp__io_eng_free(ctx->io);
    dcp__storage_forget(&ctx->storage);
    dcp__free(ctx);
}

void dcp__ctx_begin(dcp_ctx *ctx)
{
    dcp__err_clear(&ctx->err);
    dcp__storage_use(&ctx->storage);
}

int dcp_ctx_set_storage(dcp_ctx *ctx, const dcp_storage_ops *ops, void *impl)
{
    struct dcp__storage s;
    if (!ctx || dcp__storage_init(&s, ops, impl) != DCP_OK)
        return DCP_EINVAL;
    ctx->storage = s;
    return DCP_OK;
}

const char *dcp_errmsg(const dcp_ctx *ctx)
{
    if (!ctx)
        return "no context";
    return ctx->err.msg;
}

int dcp_ctx_rank(const dcp_ctx *ctx)
{
    return ctx ? ctx->rank : 0;
}

int dcp_ctx_size(const dcp_ctx *ctx)
{
    return ctx ? ctx->size : 1;
}

size_t dcp_load_report(const dcp_ctx *ctx, int which, const char *const **keys)
{
    if (!ctx) {
        if (keys)
            *keys = NULL;
        return 0;
    }
    if (which == 0) {
        if (keys)
            *keys = (const char *const *)ctx->missing;
        return ctx->nmissing;
    }
    if (keys)
        *keys = (const char *const *)ctx->unexpected;
    return ctx->nunexpected;
}

/* ---------------------------------------------------------- agreement */

int dcp__comm_agree(const dcp_comm *c, int rc, int *bad_rank)
{
    int64_t v[2];
    int trc;
    if (bad_rank)
        *bad_rank = rc == DCP_OK ? -1 : (c ? c->rank : 0);
    if (!c || c->size == 1)
        return rc;
    /* Min over ranks of the error code finds some failure; the second slot
     * finds the lowest failing rank. */
    v[0] = rc;
    v[1] = rc == DCP_OK ? INT64_MAX : c->rank;
    trc = dcp__comm_allreduce_min(c, v, 2, NULL);
    if (trc != DCP_OK)
        return trc;
    if (v[0] == DCP_OK)
        return DCP_OK;
    if (bad_rank)
        *bad_rank = (int)v[1];
    /* Every rank returns the same code: the lowest one seen. */
    return (int)v[0];
}
