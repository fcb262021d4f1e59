/*
 * Pickle: a decoder that treats a pickle as data, and an emitter.
 *
 * The decoder runs a pickle virtual machine over protocols 2-5 and builds a
 * tree of nodes in an arena. It never imports or calls anything: a GLOBAL or
 * STACK_GLOBAL must name an entry of the caller's allow-list, otherwise the
 * decode fails with DCP_EUNSAFE naming the global and the byte offset.
 * REDUCE and NEWOBJ build PK_OBJ nodes recording the callable and its
 * arguments; BUILD attaches a state to a PK_OBJ node. Two calls are
 * interpreted because PyTorch's own pickles need them as values:
 *  - collections.OrderedDict() (REDUCE with an empty tuple) becomes a PK_DICT
 *    (later SETITEMS fill it);
 *  - _codecs.encode(str, "latin1") becomes PK_BYTES (protocol-2 bytes).
 * Both still have to be on the allow-list.
 *
 * Every length, count and the nesting depth are bounded (struct pk_limits).
 * Memo references (BINGET) share nodes, so the result is a DAG, possibly with
 * cycles (a list appended to itself): consumers must walk it with a depth
 * bound, and dcp__pk_decode already refuses nesting deeper than max_depth as it
 * builds containers.
 *
 * The emitter appends opcodes to a dcp_buf; structure is the caller's job.
 */
#ifndef DCP_PICKLE_H
#define DCP_PICKLE_H

#include <stddef.h>
#include <stdint.h>

#include "util.h"

enum pk_kind {
    PK_NONE = 0,
    PK_BOOL,
    PK_INT,
    PK_FLOAT,
    PK_STR,    /* UTF-8 as stored; NUL-terminated copy */
    PK_BYTES,  /* BINBYTES/SHORT_BINBYTES/BINBYTES8/_codecs.encode */
    PK_TUPLE,
    PK_LIST,
    PK_DICT,   /* items: key0, val0, key1, val1, ... in insertion order */
    PK_GLOBAL, /* an allow-listed global */
    PK_OBJ,    /* result of REDUCE or NEWOBJ, with optional BUILD state */
    PK_PERSID  /* result of BINPERSID/PERSID: the persistent id object */
};

struct pk_node {
    uint8_t kind;   /* enum pk_kind */
    uint8_t newobj; /* PK_OBJ: 1 when built by NEWOBJ, 0 by REDUCE */
    uint16_t depth; /* containers: 1 + deepest child seen (leaves 0) */
    union {
        int b;     /* PK_BOOL */
        int64_t i; /* PK_INT: LONG1/LONG4 beyond int64 fail with DCP_ELIMIT */
        double f;  /* PK_FLOAT */
        struct {
            const char *p; /* NUL-terminated */
            size_t len;
        } s; /* PK_STR, PK_BYTES */
        struct {
            struct pk_node **v;
            size_t n; /* PK_DICT: 2 * entries */
            size_t cap;
        } seq; /* PK_TUPLE, PK_LIST, PK_DICT */
        struct {
            const char *module;
            const char *name;
            int id; /* index of the entry in the allow-list */
        } g;        /* PK_GLOBAL */
        struct {
            struct pk_node *callable; /* PK_GLOBAL (or other node) */
            struct pk_node *args;     /* PK_TUPLE for REDUCE/NEWOBJ */
            struct pk_node *state;    /* from BUILD, or NULL */
        } obj;                        /* PK_OBJ */
        struct pk_node *pid;          /* PK_PERSID */
    } u;
};

/* An allow-list entry: module and qualified name, e.g. {"torch", "Size"}. */
struct pk_global {
    const char *module;
    const char *name;
};

struct pk_limits {
    size_t max_depth;  /* nesting of containers and objects (default 64) */
    size_t max_nodes;  /* nodes created (default 1 << 26) */
    size_t max_str;    /* one string or bytes object (default 1 << 26) */
    size_t max_memo;   /* memo slots (default 1 << 26) */
    size_t max_stack;  /* VM stack + mark stack depth (default 1 << 20) */
};

/* Fills *l with the defaults above. */
void dcp__pk_limits_default(struct pk_limits *l);

struct pk_arena;

/*
 * Decodes one pickle from data[0..len). The pickle must end with STOP at
 * exactly len, unless allow_trailing is nonzero. On success *arena owns every
 * node and string (free with dcp__pk_arena_free) and *root is the result.
 * allow/nallow: the allow-list. limits: NULL for defaults.
 * Returns DCP_OK, DCP_EFORMAT (malformed: unknown opcode, stack underflow,
 * missing MARK, bad memo index, truncated, trailing bytes, BUILD on a
 * non-object...), DCP_EUNSAFE (a global not on the allow-list, or opcodes
 * that would run code we cannot model: INST, OBJ, EXT*, NEXT_BUFFER...),
 * DCP_ELIMIT (a bound exceeded), DCP_ENOTSUP (sets, protocol-0 STRING and
 * FLOAT, protocols above 5), DCP_ENOMEM. Messages name the byte offset.
 */
int dcp__pk_decode(const void *data, size_t len, const struct pk_global *allow,
              size_t nallow, const struct pk_limits *limits,
              int allow_trailing, struct pk_arena **arena,
              struct pk_node **root, struct dcp_err *err);

void dcp__pk_arena_free(struct pk_arena *a);

/* Helpers for consumers. */
/* PK_GLOBAL callable of a PK_OBJ matches module.name. */
int dcp__pk_obj_is(const struct pk_node *n, const char *module, const char *name);
/* For a PK_DICT with str keys: the value for key, or NULL. */
struct pk_node *dcp__pk_dict_get(const struct pk_node *dict, const char *key);
/* For a PK_OBJ whose state is a dict: the attribute, or NULL. */
struct pk_node *dcp__pk_obj_attr(const struct pk_node *obj, const char *key);

/* ------------------------------------------------------------------ */
/* Emitter                                                            */
/* ------------------------------------------------------------------ */

/*
 * Appends opcodes to out. Protocol 2 only (what torch.save and the weights-
 * only unpickler accept: no STACK_GLOBAL, SHORT_BINUNICODE, MEMOIZE, FRAME).
 * The memo counter numbers BINPUTs in the order they are emitted, as
 * Python's pickler does.
 */
struct pk_writer {
    struct dcp_buf *out;
    uint32_t next_memo;
    /* Optional interning of strings and globals emitted with the *_memo
     * functions: a hash table owned by the writer (dcp__pk_writer_release). */
    struct pk_intern *intern;
};

void dcp__pk_writer_init(struct pk_writer *w, struct dcp_buf *out);
void dcp__pk_writer_release(struct pk_writer *w);

int dcp__pkw_proto(struct pk_writer *w);            /* 80 02 */
int dcp__pkw_stop(struct pk_writer *w);             /* . */
int dcp__pkw_mark(struct pk_writer *w);             /* ( */
int dcp__pkw_none(struct pk_writer *w);             /* N */
int dcp__pkw_bool(struct pk_writer *w, int b);      /* NEWTRUE / NEWFALSE */
/* BININT1 (0..255), BININT2 (256..65535), BININT (int32), else LONG1. */
int dcp__pkw_int(struct pk_writer *w, int64_t v);
int dcp__pkw_float(struct pk_writer *w, double d);  /* BINFLOAT, big-endian */
int dcp__pkw_str(struct pk_writer *w, const char *s, size_t len); /* BINUNICODE */
int dcp__pkw_global(struct pk_writer *w, const char *module, const char *name);
int dcp__pkw_empty_tuple(struct pk_writer *w);      /* ) */
int dcp__pkw_empty_list(struct pk_writer *w);       /* ] */
int dcp__pkw_empty_dict(struct pk_writer *w);       /* } */
/* Builds a tuple from the top n items: TUPLE1/2/3 for n = 1..3, EMPTY_TUPLE
 * for 0; for n > 3 the caller must have emitted a MARK before the items and
 * this emits TUPLE. */
int dcp__pkw_tuple(struct pk_writer *w, size_t n);
int dcp__pkw_op(struct pk_writer *w, uint8_t opcode); /* any single opcode:
                                                   APPEND(S), SETITEM(S),
                                                   REDUCE, NEWOBJ, BUILD,
                                                   BINPERSID, TUPLE */
/* BINPUT (or LONG_BINPUT) of the next memo index; returns it in *idx (may
 * be NULL). */
int dcp__pkw_put(struct pk_writer *w, uint32_t *idx);
int dcp__pkw_get(struct pk_writer *w, uint32_t idx); /* BINGET / LONG_BINGET */
/* Interned: the first time, emit and BINPUT; later, BINGET. *idx (may be
 * NULL) receives the memo index either way, so a caller emitting the same
 * item many times can cache it and emit dcp__pkw_get itself. */
int dcp__pkw_str_memo(struct pk_writer *w, const char *s, size_t len,
                 uint32_t *idx);
int dcp__pkw_global_memo(struct pk_writer *w, const char *module,
                    const char *name, uint32_t *idx);

/* Pickle opcodes (protocols 0 to 5): the decoder reads them all, the
 * writer and its callers emit a few. */
enum {
    PK_OP_MARK = '(',
    PK_OP_STOP = '.',
    PK_OP_POP = '0',
    PK_OP_POP_MARK = '1',
    PK_OP_DUP = '2',
    PK_OP_FLOAT = 'F',
    PK_OP_INT = 'I',
    PK_OP_BININT = 'J',
    PK_OP_BININT1 = 'K',
    PK_OP_LONG = 'L',
    PK_OP_BININT2 = 'M',
    PK_OP_NONE = 'N',
    PK_OP_PERSID = 'P',
    PK_OP_BINPERSID = 'Q',
    PK_OP_REDUCE = 'R',
    PK_OP_STRING = 'S',
    PK_OP_BINSTRING = 'T',
    PK_OP_SHORT_BINSTRING = 'U',
    PK_OP_UNICODE = 'V',
    PK_OP_BINUNICODE = 'X',
    PK_OP_APPEND = 'a',
    PK_OP_BUILD = 'b',
    PK_OP_GLOBAL = 'c',
    PK_OP_DICT = 'd',
    PK_OP_EMPTY_DICT = '}',
    PK_OP_APPENDS = 'e',
    PK_OP_GET = 'g',
    PK_OP_BINGET = 'h',
    PK_OP_INST = 'i',
    PK_OP_LONG_BINGET = 'j',
    PK_OP_LIST = 'l',
    PK_OP_EMPTY_LIST = ']',
    PK_OP_OBJ = 'o',
    PK_OP_PUT = 'p',
    PK_OP_BINPUT = 'q',
    PK_OP_LONG_BINPUT = 'r',
    PK_OP_SETITEM = 's',
    PK_OP_TUPLE = 't',
    PK_OP_EMPTY_TUPLE = ')',
    PK_OP_SETITEMS = 'u',
    PK_OP_BINFLOAT = 'G',
    PK_OP_BINBYTES = 'B',
    PK_OP_SHORT_BINBYTES = 'C',
    PK_OP_PROTO = 0x80,
    PK_OP_NEWOBJ = 0x81,
    PK_OP_EXT1 = 0x82,
    PK_OP_EXT2 = 0x83,
    PK_OP_EXT4 = 0x84,
    PK_OP_TUPLE1 = 0x85,
    PK_OP_TUPLE2 = 0x86,
    PK_OP_TUPLE3 = 0x87,
    PK_OP_NEWTRUE = 0x88,
    PK_OP_NEWFALSE = 0x89,
    PK_OP_LONG1 = 0x8a,
    PK_OP_LONG4 = 0x8b,
    PK_OP_SHORT_BINUNICODE = 0x8c,
    PK_OP_BINUNICODE8 = 0x8d,
    PK_OP_BINBYTES8 = 0x8e,
    PK_OP_EMPTY_SET = 0x8f,
    PK_OP_ADDITEMS = 0x90,
    PK_OP_FROZENSET = 0x91,
    PK_OP_NEWOBJ_EX = 0x92,
    PK_OP_STACK_GLOBAL = 0x93,
    PK_OP_MEMOIZE = 0x94,
    PK_OP_FRAME = 0x95,
    PK_OP_BYTEARRAY8 = 0x96,
    PK_OP_NEXT_BUFFER = 0x97,
    PK_OP_READONLY_BUFFER = 0x98
};

#endif /* DCP_PICKLE_H */
