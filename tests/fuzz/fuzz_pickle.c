/*
 * Fuzz target: the restricted pickle decoder, through its three users of
 * untrusted pickles: the raw decoder (dcp__pk_decode, tight limits, an
 * allow-list mixing the metadata, tensor and value globals), the value
 * decoder (a torch.save'd Python object, with a round-trip property: what
 * decodes must pickle again and decode to an equal value) and the tensor
 * data.pkl parser; and the nested-state walk of a value holding tensors
 * (nested.c: every leaf named, found again by its path, tensors parsed).
 */
#include <dcp/dcp.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "nested.h"
#include "pickle.h"
#include "torchzip.h"
#include "value.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A leaf: its name, the node found again by its path (the first of
 * several of one name), the tensor it rebuilds. */
static int leaf(void *arg, const struct nest_el *path, size_t npath,
                const struct pk_node *n, struct dcp_err *err)
{
    const struct pk_node *root = arg;
    struct md_pathel p[NEST_MAX_DEPTH];
    char keys[NEST_MAX_DEPTH][24];
    struct dcp_buf name = {0};
    struct tz_tensor t;
    size_t i;
    (void)dcp__nest_name(path, npath, &name);
    dcp__buf_free(&name);
    for (i = 0; i < npath && i < NEST_MAX_DEPTH; i++) {
        p[i].s = NULL;
        p[i].i = path[i].i;
        if (path[i].s) {
            size_t l = strlen(path[i].s);
            if (l >= sizeof(keys[i]))
                return DCP_OK; /* long keys: only the name */
            memcpy(keys[i], path[i].s, l + 1);
            p[i].s = keys[i];
        }
    }
    if (!dcp__nest_find(root, p, npath))
        abort(); /* every leaf must be found by its path */
    if (dcp__nest_is_tensor(n))
        (void)dcp__tz_tensor_from_node(n, &t, err);
    return DCP_OK;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const struct pk_global allow[] = {
        {"collections", "OrderedDict"},
        {"torch", "Size"},
        {"torch._utils", "_rebuild_tensor_v2"},
        {"torch", "FloatStorage"},
        {"_codecs", "encode"},
        {"builtins", "bytes"},
        {"torch.distributed.checkpoint.metadata", "Metadata"},
        {"torch.distributed.checkpoint.metadata", "ChunkStorageMetadata"},
    };
    struct pk_limits lim;
    struct pk_arena *arena = NULL;
    struct pk_node *root = NULL;
    struct dcp_err err;
    struct tz_tensor t;
    dcp_value *v = NULL;
    if (size > (1u << 20))
        return 0;
    dcp__pk_limits_default(&lim);
    lim.max_nodes = 1u << 16;
    lim.max_str = 1u << 20;
    lim.max_memo = 1u << 16;
    lim.max_stack = 1u << 16;
    if (dcp__pk_decode(data, size, allow, sizeof(allow) / sizeof(allow[0]), &lim,
                  (size & 1) != 0, &arena, &root, &err) == DCP_OK) {
        (void)dcp__pk_obj_attr(root, "x");
        (void)dcp__pk_dict_get(root, "x");
    }
    dcp__pk_arena_free(arena);

    if (dcp__value_unpickle(data, size, &v, &err) == DCP_OK) {
        struct dcp_buf b = {0};
        dcp_value *w = NULL;
        char *json = NULL;
        if (dcp_value_to_json(v, &json) == DCP_OK)
            dcp_free(json);
        if (dcp__value_pickle(v, &b) != DCP_OK ||
            dcp__value_unpickle(b.p, b.len, &w, &err) != DCP_OK ||
            !dcp_value_equal(v, w))
            abort(); /* the round trip must hold */
        dcp_value_free(w);
        dcp__buf_free(&b);
    }
    dcp_value_free(v);

    (void)dcp__tz_parse_tensor_pickle(data, size, &t, &err);

    arena = NULL;
    root = NULL;
    if (dcp__nest_decode(data, size, &arena, &root, &err) == DCP_OK)
        (void)dcp__nest_walk(root, leaf, root, &err);
    dcp__pk_arena_free(arena);
    return 0;
}
