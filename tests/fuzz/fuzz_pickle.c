/*
 * Fuzz target: the restricted pickle decoder, through its three users of
 * untrusted pickles: the raw decoder (dcp__pk_decode, tight limits, an
 * allow-list mixing the metadata, tensor and value globals), the value
 * decoder (a torch.save'd Python object, with a round-trip property: what
 * decodes must pickle again and decode to an equal value) and the tensor
 * data.pkl parser.
 */
#include <dcp/dcp.h>

#include <stdint.h>
#include <stdlib.h>

#include "pickle.h"
#include "torchzip.h"
#include "value.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

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
    return 0;
}
