/*
 * The state: what one rank saves or loads. Entries in insertion order, each
 * a tensor (one or more boxes of a global tensor) or a value, with the
 * nested path PyTorch's flatten_state_dict would record.
 */
#ifndef DCP_STATE_H
#define DCP_STATE_H

#include "util.h"
#include "hashtab.h"
#include "value.h"
#include "meta.h"
#include "reshard.h"

struct st_box {
    int64_t off[DCP_MAX_NDIM];
    int64_t size[DCP_MAX_NDIM];
    void *buf;
    /* A strided box (dcp_state_add_tensor_strided): element strides of buf
     * per dimension; strided is 0 when the box is C-contiguous (stride
     * then unset), which every path takes as before. */
    int strided;
    int64_t stride[DCP_MAX_NDIM];
};

/* The box's strides: its own, or the C-contiguous ones of its sizes (into
 * tmp). */
const int64_t *dcp__box_strides(const struct st_box *b, int ndim,
                                int64_t tmp[DCP_MAX_NDIM]);

struct st_entry {
    char *key; /* path joined with '.' */
    struct md_pathel *path;
    size_t npath;
    int is_tensor;
    dcp_dtype dtype;
    int ndim;
    int64_t shape[DCP_MAX_NDIM];
    dcp_mem mem;
    struct st_box *boxes;
    size_t nboxes;
    size_t capboxes;
    dcp_value *value; /* values: owned */
    /* Stateful entries (is_tensor 0, value NULL): expanded by stateful.c
     * before a save or load plans anything. */
    int is_stateful;
    dcp_stateful_ops sops;
    void *userdata;
};

struct dcp_state {
    struct st_entry *e;
    size_t n;
    size_t cap;
    struct dcp_htab index; /* entries by key */
    struct md_pathel *cur; /* current nesting */
    size_t ncur;
    size_t capcur;
    /* For dcp_state_op: enum dcp_io_op + 1 on a sub-state handed to a
     * stateful callback, 0 on any other. */
    int op;
    /* dcp_state_fail: the code (0: not failed) and its message. */
    int fail_code;
    char *fail_msg;
};

/* Entry by key, or NULL. */
struct st_entry *dcp__state_find(const dcp_state *st, const char *key);

/* Replaces the nesting cursor with the n components of p (copied).
 * Returns DCP_OK or DCP_ENOMEM. */
int dcp__state_set_cursor(dcp_state *st, const struct md_pathel *p, size_t n);

#endif /* DCP_STATE_H */
