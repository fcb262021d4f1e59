/*
 * Non-tensor values: the public dcp_value tree, its pickle form (what
 * torch.save writes for a Python object, protocol 2) and the conversion
 * from a decoded pickle.
 */
#ifndef DCP_VALUE_H
#define DCP_VALUE_H

#include "util.h"
#include "pickle.h"

struct dcp_value {
    dcp_value_type type;
    union {
        int b;
        int64_t i;
        double f;
        struct {
            char *p; /* NUL-terminated */
            size_t len;
        } s; /* STR, BYTES */
        struct {
            dcp_value **v; /* DICT: key0, val0, key1, val1, ... */
            size_t n;      /* items (2 * entries for DICT) */
            size_t cap;
        } seq;
    } u;
};

/* Appends the protocol-2 pickle of v (PROTO ... STOP) to out, as Python's
 * pickle module writes it. */
int dcp__value_pickle(const dcp_value *v, struct dcp_buf *out);

/* Emits v's pickle expression (no PROTO or STOP) into w, for a value
 * inside a larger pickle. */
int dcp__value_emit(struct pk_writer *w, const dcp_value *v);

/*
 * Converts a decoded pickle node to a new dcp_value (objects other than
 * bytes() are DCP_ENOTSUP). budget: objects and string bytes converted so
 * far, updated; start both at 0 and pass the same array for every value
 * of one pickle, so the bounds of dcp__value_unpickle (2^24 objects, 1 GiB
 * of strings) hold for the whole pickle, however its memo references share
 * them.
 */
int dcp__value_from_node(const struct pk_node *n, size_t budget[2],
                         dcp_value **out, struct dcp_err *err);

/*
 * Decodes a value pickle (data.pkl of a value item) with the value
 * allow-list (collections.OrderedDict, _codecs.encode, builtins.bytes,
 * builtins.set/frozenset are refused) into a new dcp_value. Shared memo
 * references are copied; depth and total size are bounded.
 * Returns DCP_OK, DCP_EFORMAT, DCP_EUNSAFE, DCP_ELIMIT, DCP_ENOTSUP,
 * DCP_ENOMEM.
 */
int dcp__value_unpickle(const void *p, size_t len, dcp_value **out,
                        struct dcp_err *err);

/* PyTorch's flatten rule: a list is expanded when it holds a dict or an
 * expandable list. */
int dcp__value_list_expands(const dcp_value *v);

#endif /* DCP_VALUE_H */
