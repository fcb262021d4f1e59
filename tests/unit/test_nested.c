/*
 * Tests for src/format/nested.c: the leaves of a torch.save value holding
 * tensors (flatten_state_dict=False, docs/FORMAT.md §9.4), named as torch's
 * flatten_state_dict names them, found by path, and bounded against hostile
 * pickles (memo-shared containers, deep nesting, odd keys, globals).
 */
#include "nested.h"

#include <stdint.h>

#include "pickle.h"
#include "test.h"
#include "torchzip.h"

#define OKP(x) ASSERT_EQ((x), DCP_OK)

/* Leaves collected by a walk: names joined in one buffer, '|' between. */
struct seen {
    struct dcp_buf names;
    size_t n, tensors;
    int stop_at; /* fail on this leaf (1-based), 0: never */
};

static int collect(void *arg, const struct nest_el *path, size_t npath,
                   const struct pk_node *leaf, struct dcp_err *err)
{
    struct seen *s = arg;
    s->n++;
    if (dcp__nest_is_tensor(leaf))
        s->tensors++;
    if (s->stop_at && (int)s->n == s->stop_at)
        return dcp__err(err, DCP_EFORMAT, "stopped");
    if (s->names.len)
        (void)dcp__buf_put_u8(&s->names, '|');
    return dcp__nest_name(path, npath, &s->names);
}

static int walk(const struct dcp_buf *pkl, struct seen *s, int *decode_rc)
{
    struct pk_arena *arena = NULL;
    struct pk_node *root = NULL;
    struct dcp_err err;
    int rc = dcp__nest_decode(pkl->p, pkl->len, &arena, &root, &err);
    *decode_rc = rc;
    if (rc == DCP_OK)
        rc = dcp__nest_walk(root, collect, s, &err);
    dcp__pk_arena_free(arena);
    if (s->names.len == 0 || s->names.p[s->names.len - 1] != 0)
        (void)dcp__buf_put_u8(&s->names, 0);
    return rc;
}

static void tensor(struct pk_writer *w, int64_t n, const char *key)
{
    int64_t sizes[1];
    sizes[0] = n;
    (void)dcp__tz_tensor_emit(w, DCP_F32, 1, sizes, key);
}

static void str(struct pk_writer *w, const char *s)
{
    (void)dcp__pkw_str(w, s, strlen(s));
}

/* {"w": T0, "lst": [T1, T2], "cfg": {"lr": 0.5, 3: "x", True: 1,
 *   None: 2}, "tup": (T3,), "plain": [1, [2]], "ld": [{"a": 1}],
 *   "e": {}, "ll": [[T4]]} */
static void torch_like(struct dcp_buf *out)
{
    struct pk_writer w;
    dcp__pk_writer_init(&w, out);
    (void)dcp__pkw_proto(&w);
    (void)dcp__pkw_empty_dict(&w);
    (void)dcp__pkw_mark(&w);
    str(&w, "w");
    tensor(&w, 2, "0");
    str(&w, "lst");
    (void)dcp__pkw_empty_list(&w);
    (void)dcp__pkw_mark(&w);
    tensor(&w, 1, "1");
    tensor(&w, 3, "2");
    (void)dcp__pkw_op(&w, PK_OP_APPENDS);
    str(&w, "cfg");
    (void)dcp__pkw_empty_dict(&w);
    (void)dcp__pkw_mark(&w);
    str(&w, "lr");
    (void)dcp__pkw_float(&w, 0.5);
    (void)dcp__pkw_int(&w, 3);
    str(&w, "x");
    (void)dcp__pkw_bool(&w, 1);
    (void)dcp__pkw_int(&w, 1);
    (void)dcp__pkw_none(&w);
    (void)dcp__pkw_int(&w, 2);
    (void)dcp__pkw_op(&w, PK_OP_SETITEMS);
    str(&w, "tup");
    tensor(&w, 1, "3");
    (void)dcp__pkw_tuple(&w, 1);
    str(&w, "plain");
    (void)dcp__pkw_empty_list(&w);
    (void)dcp__pkw_mark(&w);
    (void)dcp__pkw_int(&w, 1);
    (void)dcp__pkw_empty_list(&w);
    (void)dcp__pkw_int(&w, 2);
    (void)dcp__pkw_op(&w, PK_OP_APPEND);
    (void)dcp__pkw_op(&w, PK_OP_APPENDS);
    str(&w, "ld");
    (void)dcp__pkw_empty_list(&w);
    (void)dcp__pkw_empty_dict(&w);
    str(&w, "a");
    (void)dcp__pkw_int(&w, 1);
    (void)dcp__pkw_op(&w, PK_OP_SETITEM);
    (void)dcp__pkw_op(&w, PK_OP_APPEND);
    str(&w, "e");
    (void)dcp__pkw_empty_dict(&w);
    str(&w, "ll");
    (void)dcp__pkw_empty_list(&w);
    (void)dcp__pkw_empty_list(&w);
    tensor(&w, 4, "4");
    (void)dcp__pkw_op(&w, PK_OP_APPEND);
    (void)dcp__pkw_op(&w, PK_OP_APPEND);
    (void)dcp__pkw_op(&w, PK_OP_SETITEMS);
    (void)dcp__pkw_stop(&w);
    dcp__pk_writer_release(&w);
}

TEST(names_as_torch)
{
    struct dcp_buf b = {0};
    struct seen s = {{0}, 0, 0, 0};
    int drc;
    torch_like(&b);
    OKP(walk(&b, &s, &drc));
    ASSERT_STR_EQ((const char *)s.names.p,
                  "w|lst.0|lst.1|cfg.lr|cfg.3|cfg.True|cfg.None|tup|plain|"
                  "ld.0.a|ll.0.0");
    ASSERT_EQ(s.tensors, 4); /* the tuple's tensor is inside a leaf */
    dcp__buf_free(&b);
    dcp__buf_free(&s.names);
}

TEST(find_by_path)
{
    struct dcp_buf b = {0};
    struct pk_arena *arena = NULL;
    struct pk_node *root = NULL;
    struct md_pathel p[3];
    struct tz_tensor t;
    const struct pk_node *n;
    struct dcp_err err;
    char k_lst[] = "lst", k_cfg[] = "cfg", k_3[] = "3", k_true[] = "True",
         k_0[] = "0", k_w[] = "w", k_x[] = "x";
    torch_like(&b);
    OKP(dcp__nest_decode(b.p, b.len, &arena, &root, &err));
    p[0].s = k_lst;
    p[1].s = NULL;
    p[1].i = 1;
    n = dcp__nest_find(root, p, 2);
    ASSERT(n && dcp__nest_is_tensor(n));
    OKP(dcp__tz_tensor_from_node(n, &t, &err));
    ASSERT_EQ(t.size[0], 3);
    ASSERT_STR_EQ(t.key, "2");
    p[0].s = k_cfg;
    p[1].s = k_3; /* str() of the int key */
    n = dcp__nest_find(root, p, 2);
    ASSERT(n && n->kind == PK_STR && strcmp(n->u.s.p, "x") == 0);
    p[1].s = k_true;
    n = dcp__nest_find(root, p, 2);
    ASSERT(n && n->kind == PK_INT && n->u.i == 1);
    /* misses: index past the end, negative, a name on a list, an index
     * on a dict, a path through a leaf */
    p[0].s = k_lst;
    p[1].s = NULL;
    p[1].i = 2;
    ASSERT(!dcp__nest_find(root, p, 2));
    p[1].i = -1;
    ASSERT(!dcp__nest_find(root, p, 2));
    p[1].s = k_0;
    ASSERT(!dcp__nest_find(root, p, 2));
    p[0].s = NULL;
    p[0].i = 0;
    ASSERT(!dcp__nest_find(root, p, 1));
    p[0].s = k_w;
    p[1].s = k_x;
    ASSERT(!dcp__nest_find(root, p, 2));
    dcp__pk_arena_free(arena);
    dcp__buf_free(&b);
}

TEST(not_nested)
{
    struct dcp_buf b = {0};
    struct seen s = {{0}, 0, 0, 0};
    struct pk_writer w;
    int drc;
    /* a tuple of tensors (torch keeps it a leaf), a list of plain values */
    dcp__pk_writer_init(&w, &b);
    (void)dcp__pkw_proto(&w);
    tensor(&w, 2, "0");
    (void)dcp__pkw_tuple(&w, 1);
    (void)dcp__pkw_stop(&w);
    dcp__pk_writer_release(&w);
    ASSERT_EQ(walk(&b, &s, &drc), DCP_EINVAL);
    b.len = 0;
    dcp__pk_writer_init(&w, &b);
    (void)dcp__pkw_proto(&w);
    (void)dcp__pkw_empty_list(&w);
    (void)dcp__pkw_int(&w, 1);
    (void)dcp__pkw_op(&w, PK_OP_APPEND);
    (void)dcp__pkw_stop(&w);
    dcp__pk_writer_release(&w);
    ASSERT_EQ(walk(&b, &s, &drc), DCP_EINVAL);
    ASSERT_EQ(s.n, 0);
    dcp__buf_free(&b);
    dcp__buf_free(&s.names);
}

TEST(odd_keys_and_globals)
{
    struct dcp_buf b = {0};
    struct seen s = {{0}, 0, 0, 0};
    struct pk_writer w;
    int drc;
    /* a float key: torch would name it str(0.5); dcp refuses the value */
    dcp__pk_writer_init(&w, &b);
    (void)dcp__pkw_proto(&w);
    (void)dcp__pkw_empty_dict(&w);
    (void)dcp__pkw_float(&w, 0.5);
    tensor(&w, 1, "0");
    (void)dcp__pkw_op(&w, PK_OP_SETITEM);
    (void)dcp__pkw_stop(&w);
    dcp__pk_writer_release(&w);
    ASSERT_EQ(walk(&b, &s, &drc), DCP_ENOTSUP);
    /* a global off the allow-list: refused by the decoder */
    b.len = 0;
    dcp__pk_writer_init(&w, &b);
    (void)dcp__pkw_proto(&w);
    (void)dcp__pkw_empty_dict(&w);
    str(&w, "x");
    (void)dcp__pkw_global(&w, "os", "system");
    (void)dcp__pkw_op(&w, PK_OP_SETITEM);
    (void)dcp__pkw_stop(&w);
    dcp__pk_writer_release(&w);
    ASSERT_EQ(walk(&b, &s, &drc), DCP_EUNSAFE);
    ASSERT_EQ(drc, DCP_EUNSAFE);
    /* a key twice, and two keys of one str() (3 and "3"): torch's flatten
     * would refuse them, find could not tell them apart */
    b.len = 0;
    dcp__pk_writer_init(&w, &b);
    (void)dcp__pkw_proto(&w);
    (void)dcp__pkw_empty_dict(&w);
    (void)dcp__pkw_mark(&w);
    str(&w, "a");
    tensor(&w, 1, "0");
    str(&w, "a");
    (void)dcp__pkw_int(&w, 1);
    (void)dcp__pkw_op(&w, PK_OP_SETITEMS);
    (void)dcp__pkw_stop(&w);
    dcp__pk_writer_release(&w);
    ASSERT_EQ(walk(&b, &s, &drc), DCP_EFORMAT);
    b.len = 0;
    dcp__pk_writer_init(&w, &b);
    (void)dcp__pkw_proto(&w);
    (void)dcp__pkw_empty_dict(&w);
    (void)dcp__pkw_mark(&w);
    (void)dcp__pkw_int(&w, 3);
    tensor(&w, 1, "0");
    str(&w, "3");
    tensor(&w, 1, "1");
    (void)dcp__pkw_op(&w, PK_OP_SETITEMS);
    (void)dcp__pkw_stop(&w);
    dcp__pk_writer_release(&w);
    ASSERT_EQ(walk(&b, &s, &drc), DCP_EFORMAT);
    ASSERT_EQ(s.n, 0);
    /* the callback's error stops the walk */
    b.len = 0;
    torch_like(&b);
    s.stop_at = 2;
    s.n = 0;
    ASSERT_EQ(walk(&b, &s, &drc), DCP_EFORMAT);
    ASSERT_EQ(s.n, 2);
    dcp__buf_free(&b);
    dcp__buf_free(&s.names);
}

/* d0 = {"a": T} (or [[1]] when plain); d(k+1) = {"a": dk, "b": dk} (or
 * [lk, lk]), memo-shared: 2^levels leaves from a pickle of a few hundred
 * bytes. */
static void shared(struct dcp_buf *b, int levels, int plain)
{
    struct pk_writer w;
    uint32_t idx = 0;
    int k;
    dcp__pk_writer_init(&w, b);
    (void)dcp__pkw_proto(&w);
    if (plain) {
        (void)dcp__pkw_empty_list(&w);
        (void)dcp__pkw_int(&w, 1);
        (void)dcp__pkw_op(&w, PK_OP_APPEND);
    } else {
        (void)dcp__pkw_empty_dict(&w);
        str(&w, "a");
        tensor(&w, 1, "0");
        (void)dcp__pkw_op(&w, PK_OP_SETITEM);
    }
    (void)dcp__pkw_put(&w, &idx);
    for (k = 0; k < levels; k++) {
        (void)dcp__pkw_op(&w, PK_OP_POP); /* kept in the memo */
        if (plain) {
            (void)dcp__pkw_empty_list(&w);
            (void)dcp__pkw_mark(&w);
            (void)dcp__pkw_get(&w, idx);
            (void)dcp__pkw_get(&w, idx);
            (void)dcp__pkw_op(&w, PK_OP_APPENDS);
        } else {
            (void)dcp__pkw_empty_dict(&w);
            (void)dcp__pkw_mark(&w);
            str(&w, "a");
            (void)dcp__pkw_get(&w, idx);
            str(&w, "b");
            (void)dcp__pkw_get(&w, idx);
            (void)dcp__pkw_op(&w, PK_OP_SETITEMS);
        }
        (void)dcp__pkw_put(&w, &idx);
    }
    if (plain) { /* make it a nested state: {"p": [...], "t": T} */
        uint32_t top = idx;
        (void)dcp__pkw_op(&w, PK_OP_POP);
        (void)dcp__pkw_empty_dict(&w);
        str(&w, "p");
        (void)dcp__pkw_get(&w, top);
        (void)dcp__pkw_op(&w, PK_OP_SETITEM);
    }
    (void)dcp__pkw_stop(&w);
    dcp__pk_writer_release(&w);
}

TEST(shared_references_bounded)
{
    struct dcp_buf b = {0};
    struct seen s = {{0}, 0, 0, 0};
    int drc;
    shared(&b, 40, 0); /* 2^40 leaves */
    ASSERT_EQ(walk(&b, &s, &drc), DCP_ELIMIT);
    ASSERT(s.n <= NEST_MAX_LEAVES);
    b.len = 0;
    dcp__buf_free(&s.names);
    memset(&s, 0, sizeof(s));
    shared(&b, 40, 1); /* torch's _is_terminal would visit 2^40 lists */
    ASSERT_EQ(walk(&b, &s, &drc), DCP_ELIMIT);
    b.len = 0;
    dcp__buf_free(&s.names);
    memset(&s, 0, sizeof(s));
    shared(&b, 10, 0); /* 1024 leaves: fine */
    OKP(walk(&b, &s, &drc));
    ASSERT_EQ(s.n, 1024);
    ASSERT_EQ(s.tensors, 1024);
    dcp__buf_free(&b);
    dcp__buf_free(&s.names);
}

TEST(deep_nesting_bounded)
{
    struct dcp_buf b = {0};
    struct seen s = {{0}, 0, 0, 0};
    struct pk_writer w;
    int k, drc;
    dcp__pk_writer_init(&w, &b);
    (void)dcp__pkw_proto(&w);
    for (k = 0; k < 63; k++) {
        (void)dcp__pkw_empty_dict(&w);
        str(&w, "d");
    }
    tensor(&w, 1, "0");
    for (k = 0; k < 63; k++)
        (void)dcp__pkw_op(&w, PK_OP_SETITEM);
    (void)dcp__pkw_stop(&w);
    dcp__pk_writer_release(&w);
    ASSERT(walk(&b, &s, &drc) != DCP_OK); /* decoder's or walk's bound */
    ASSERT_EQ(s.n, 0);
    dcp__buf_free(&b);
    dcp__buf_free(&s.names);
}

int main(void)
{
    RUN(names_as_torch);
    RUN(find_by_path);
    RUN(not_nested);
    RUN(odd_keys_and_globals);
    RUN(shared_references_bounded);
    RUN(deep_nesting_bounded);
    return TEST_SUMMARY();
}
