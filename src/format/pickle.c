/*
 * Pickle decoder and emitter (contract in pickle.h).
 *
 * Decoder: a pickle virtual machine for protocols 0-5 that builds nodes and
 * runs nothing. Nodes and strings live in a chunked arena (blocks from
 * 64 KiB doubling to 64 MiB; big strings get a block of their own), so a
 * decode makes O(blocks) allocations and frees. The VM stack, mark stack and
 * memo are plain growable arrays freed when dcp__pk_decode returns. Leaves that
 * cannot change (None, booleans, the empty tuple) are shared, and so are
 * equal ints met close together (a small direct-mapped cache).
 *
 * Every operand length is checked against the remaining input before it is
 * used, then against limits.max_str, so nothing is sized from the input
 * beyond what the input itself holds. A memo index must be below max_memo
 * and below the input length (a pickler numbers memo slots densely, one per
 * put opcode, so a larger index only appears in hostile input).
 *
 * Depth: a container or object gets depth 1 + its deepest child as children
 * are attached; exceeding max_depth fails with DCP_ELIMIT. The depth of a
 * container is not propagated to containers that already hold it, and memo
 * references can build cycles (a list appended to itself), so the result is
 * a graph: consumers must walk it with their own depth bound.
 *
 * Stack discipline follows CPython's _pickle.c: MARK opens a fence, and an
 * opcode may only pop items above the innermost mark (POP at the fence pops
 * the mark itself). Deliberate differences from CPython:
 *  - STOP needs exactly one item on the stack and no open mark;
 *  - SETITEM(S) need a PK_DICT, APPEND(S) a PK_LIST, BUILD a PK_OBJ;
 *  - dict keys are kept as written, duplicates included (dcp__pk_dict_get returns
 *    the last value for a key, as the last assignment wins in Python);
 *  - sets (EMPTY_SET, ADDITEMS, FROZENSET), the protocol-0 STRING and FLOAT
 *    text forms, and NEWOBJ_EX with keyword arguments fail with
 *    DCP_ENOTSUP; INST, OBJ, EXT1/2/4, NEXT_BUFFER and READONLY_BUFFER fail
 *    with DCP_EUNSAFE;
 *  - BINSTRING/SHORT_BINSTRING (Python 2 str) decode as PK_BYTES and
 *    BYTEARRAY8 as PK_BYTES; INT/LONG text must be plain decimal.
 * A zero field in struct pk_limits means its default.
 *
 * Emitter: protocol 2, byte for byte what CPython's pickle module writes for
 * the same sequence of saves. Strings and globals can be interned through a
 * hash table whose keys live in an arena owned by the writer.
 */
#include "pickle.h"

#include <inttypes.h>
#include <string.h>

#include "hashtab.h"
#include "text.h"


#define PK_HIGHEST_PROTOCOL 5
#define PK_DEPTH_CAP        65534 /* depth is a uint16_t */
#define PK_ICACHE           4096  /* int cache slots, a power of two */

void dcp__pk_limits_default(struct pk_limits *l)
{
    l->max_depth = 64;
    l->max_nodes = (size_t)1 << 26;
    l->max_str = (size_t)1 << 26;
    l->max_memo = (size_t)1 << 26;
    l->max_stack = (size_t)1 << 20;
}

/* ------------------------------------------------------------------ */
/* Arena                                                              */
/* ------------------------------------------------------------------ */

struct pk_block {
    struct pk_block *next;
    size_t size; /* bytes after the header */
};

#define ARENA_HDR ((sizeof(struct pk_block) + 15) & ~(size_t)15)
#define ARENA_MIN ((size_t)64 * 1024)
#define ARENA_MAX ((size_t)64 * 1024 * 1024)

struct pk_arena {
    struct pk_block *blocks; /* head is the block cur/lim point into */
    unsigned char *cur, *lim;
    size_t next; /* size of the next shared block */
};

static struct pk_block *block_new(size_t size)
{
    struct pk_block *b;
    if (size > SIZE_MAX - ARENA_HDR)
        return NULL;
    b = dcp__malloc(ARENA_HDR + size);
    if (!b)
        return NULL;
    b->next = NULL;
    b->size = size;
    return b;
}

static struct pk_arena *arena_new(void)
{
    struct pk_arena *a = dcp__malloc(sizeof(*a));
    if (!a)
        return NULL;
    a->blocks = block_new(ARENA_MIN);
    if (!a->blocks) {
        dcp__free(a);
        return NULL;
    }
    a->cur = (unsigned char *)a->blocks + ARENA_HDR;
    a->lim = a->cur + ARENA_MIN;
    a->next = ARENA_MIN * 2;
    return a;
}

void dcp__pk_arena_free(struct pk_arena *a)
{
    struct pk_block *b, *next;
    if (!a)
        return;
    for (b = a->blocks; b; b = next) {
        next = b->next;
        dcp__free(b);
    }
    dcp__free(a);
}

static void *arena_alloc_slow(struct pk_arena *a, size_t n)
{
    struct pk_block *b;
    if (n > a->next / 4) {
        /* A block of its own, linked behind the current one. */
        b = block_new(n);
        if (!b)
            return NULL;
        b->next = a->blocks->next;
        a->blocks->next = b;
        return (unsigned char *)b + ARENA_HDR;
    }
    b = block_new(a->next);
    if (!b)
        return NULL;
    b->next = a->blocks;
    a->blocks = b;
    a->cur = (unsigned char *)b + ARENA_HDR;
    a->lim = a->cur + b->size;
    if (a->next < ARENA_MAX)
        a->next *= 2;
    a->cur += n;
    return (unsigned char *)b + ARENA_HDR;
}

/* 8-byte aligned memory; NULL when out of memory. */
static inline void *arena_alloc(struct pk_arena *a, size_t n)
{
    void *p;
    if (n > SIZE_MAX - 7)
        return NULL;
    n = (n + 7) & ~(size_t)7;
    if ((size_t)(a->lim - a->cur) >= n) {
        p = a->cur;
        a->cur += n;
        return p;
    }
    return arena_alloc_slow(a, n);
}

/* ------------------------------------------------------------------ */
/* Decoder state and primitives                                       */
/* ------------------------------------------------------------------ */

struct pk_dec {
    const uint8_t *base, *p, *end;
    size_t op_off; /* offset of the opcode being run */
    struct pk_arena *a;
    struct dcp_err *err;
    int rc;
    int done;
    struct pk_limits lim;
    const struct pk_global *allow;
    size_t nallow;
    struct pk_node **gcache; /* one PK_GLOBAL node per allow entry */
    long od_id, enc_id;      /* allow index of OrderedDict/_codecs.encode */
    struct pk_node **stack;
    size_t sp, stack_cap;
    size_t *marks;
    size_t nmarks, marks_cap;
    size_t fence; /* items below this belong to an outer mark */
    struct pk_node **memo;
    size_t memo_cap, memo_count;
    size_t nnodes;
    struct pk_node *none, *bools[2], *empty_tuple;
    struct pk_node **icache; /* PK_ICACHE slots, in the arena */
    struct pk_node *result;
};

static int fail(struct pk_dec *d, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int fail(struct pk_dec *d, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    (void)dcp__verr(d->err, code, fmt, ap);
    va_end(ap);
    d->rc = code;
    return code;
}

static int truncated(struct pk_dec *d)
{
    return fail(d, DCP_EFORMAT, "pickle: truncated at byte %zu", d->op_off);
}

static int underflow(struct pk_dec *d)
{
    return fail(d, DCP_EFORMAT, "pickle: stack underflow at byte %zu",
                d->op_off);
}

static int too_deep(struct pk_dec *d)
{
    return fail(d, DCP_ELIMIT, "pickle: nesting deeper than %zu at byte %zu",
                d->lim.max_depth, d->op_off);
}

static int no_memory(struct pk_dec *d)
{
    return fail(d, DCP_ENOMEM, "pickle: out of memory at byte %zu", d->op_off);
}

static inline size_t left(const struct pk_dec *d)
{
    return (size_t)(d->end - d->p);
}

/* Items above the innermost mark. */
static inline size_t avail(const struct pk_dec *d)
{
    return d->sp - d->fence;
}

static inline uint64_t rd_le(const uint8_t *p, size_t n)
{
    uint64_t v = 0;
    size_t i;
    for (i = 0; i < n; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static inline struct pk_node *node_new(struct pk_dec *d, uint8_t kind,
                                       size_t depth)
{
    struct pk_node *n;
    if (d->nnodes >= d->lim.max_nodes) {
        (void)fail(d, DCP_ELIMIT, "pickle: more than %zu nodes at byte %zu",
                   d->lim.max_nodes, d->op_off);
        return NULL;
    }
    if (depth > d->lim.max_depth) {
        (void)too_deep(d);
        return NULL;
    }
    n = arena_alloc(d->a, sizeof(*n));
    if (!n) {
        (void)no_memory(d);
        return NULL;
    }
    d->nnodes++;
    memset(n, 0, sizeof(*n));
    n->kind = kind;
    n->depth = (uint16_t)depth;
    return n;
}

/* Raises parent's depth to cover child. */
static inline int attach(struct pk_dec *d, struct pk_node *parent,
                         const struct pk_node *child)
{
    if (child->depth >= parent->depth) {
        if ((size_t)child->depth + 1 > d->lim.max_depth)
            return too_deep(d);
        parent->depth = (uint16_t)(child->depth + 1);
    }
    return DCP_OK;
}

static struct pk_node *str_new(struct pk_dec *d, uint8_t kind, const void *s,
                               size_t n)
{
    struct pk_node *node = node_new(d, kind, 0);
    char *p;
    if (!node)
        return NULL;
    p = arena_alloc(d->a, n + 1);
    if (!p) {
        (void)no_memory(d);
        return NULL;
    }
    if (n)
        memcpy(p, s, n);
    p[n] = '\0';
    node->u.s.p = p;
    node->u.s.len = n;
    return node;
}

/* Ints are shared through a direct-mapped cache: offsets and sizes repeat. */
static struct pk_node *int_new(struct pk_dec *d, int64_t v)
{
    struct pk_node **slot = &d->icache[(uint64_t)v & (PK_ICACHE - 1)];
    struct pk_node *n = *slot;
    if (n && n->u.i == v)
        return n;
    n = node_new(d, PK_INT, 0);
    if (!n)
        return NULL;
    n->u.i = v;
    *slot = n;
    return n;
}

static int push_slow(struct pk_dec *d, struct pk_node *n)
{
    size_t cap;
    struct pk_node **s;
    if (!n)
        return d->rc;
    if (d->sp + d->nmarks >= d->lim.max_stack)
        return fail(d, DCP_ELIMIT, "pickle: stack deeper than %zu at byte %zu",
                    d->lim.max_stack, d->op_off);
    if (d->sp == d->stack_cap) {
        cap = d->stack_cap * 2;
        if (cap > d->lim.max_stack)
            cap = d->lim.max_stack;
        s = dcp__realloc(d->stack, cap * sizeof(*s));
        if (!s)
            return no_memory(d);
        d->stack = s;
        d->stack_cap = cap;
    }
    d->stack[d->sp++] = n;
    return DCP_OK;
}

/* Pushes n; a NULL n is the failure of the call that made it. */
static inline int push(struct pk_dec *d, struct pk_node *n)
{
    if (n && d->sp < d->stack_cap && d->sp + d->nmarks < d->lim.max_stack) {
        d->stack[d->sp++] = n;
        return DCP_OK;
    }
    return push_slow(d, n);
}

static int op_mark(struct pk_dec *d)
{
    size_t cap, *m;
    if (d->sp + d->nmarks >= d->lim.max_stack)
        return fail(d, DCP_ELIMIT, "pickle: stack deeper than %zu at byte %zu",
                    d->lim.max_stack, d->op_off);
    if (d->nmarks == d->marks_cap) {
        cap = d->marks_cap ? d->marks_cap * 2 : 64;
        m = dcp__realloc(d->marks, cap * sizeof(*m));
        if (!m)
            return no_memory(d);
        d->marks = m;
        d->marks_cap = cap;
    }
    d->marks[d->nmarks++] = d->sp;
    d->fence = d->sp;
    return DCP_OK;
}

/* Pops the innermost mark; its items are stack[*start..sp). */
static int pop_mark(struct pk_dec *d, size_t *start)
{
    *start = d->sp;
    if (d->nmarks == 0)
        return fail(d, DCP_EFORMAT, "pickle: missing mark at byte %zu",
                    d->op_off);
    *start = d->marks[--d->nmarks];
    d->fence = d->nmarks ? d->marks[d->nmarks - 1] : 0;
    return DCP_OK;
}

/* ------------------------------------------------------------------ */
/* Text helpers                                                       */
/* ------------------------------------------------------------------ */

static size_t utf8_put(char *out, uint32_t c)
{
    if (c < 0x80) {
        out[0] = (char)c;
        return 1;
    }
    if (c < 0x800) {
        out[0] = (char)(0xc0 | (c >> 6));
        out[1] = (char)(0x80 | (c & 0x3f));
        return 2;
    }
    if (c < 0x10000) {
        out[0] = (char)(0xe0 | (c >> 12));
        out[1] = (char)(0x80 | ((c >> 6) & 0x3f));
        out[2] = (char)(0x80 | (c & 0x3f));
        return 3;
    }
    out[0] = (char)(0xf0 | (c >> 18));
    out[1] = (char)(0x80 | ((c >> 12) & 0x3f));
    out[2] = (char)(0x80 | ((c >> 6) & 0x3f));
    out[3] = (char)(0x80 | (c & 0x3f));
    return 4;
}

/* Copies s into out for an error message: printable ASCII, at most 96. */
static void printable(char *out, size_t cap, const char *s, size_t n)
{
    size_t i, o = 0;
    for (i = 0; i < n && o + 4 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        out[o++] = (c >= 0x20 && c < 0x7f) ? (char)c : '?';
    }
    if (i < n)
        out[o++] = '~';
    out[o] = '\0';
}

/* Reads a text operand up to '\n' (excluded from s, n). */
static int read_line(struct pk_dec *d, const uint8_t **s, size_t *n)
{
    const uint8_t *nl = left(d) ? memchr(d->p, '\n', left(d)) : NULL;
    *s = d->p;
    *n = 0;
    if (!nl)
        return truncated(d);
    *n = (size_t)(nl - d->p);
    if (*n > d->lim.max_str)
        return fail(d, DCP_ELIMIT,
                    "pickle: text operand longer than %zu at byte %zu",
                    d->lim.max_str, d->op_off);
    d->p = nl + 1;
    return DCP_OK;
}

/* Plain decimal with an optional sign. */
static int parse_dec(struct pk_dec *d, const uint8_t *s, size_t n, int64_t *out)
{
    uint64_t v = 0, max = INT64_MAX;
    size_t i = 0;
    int neg = 0;
    *out = 0;
    if (n && (s[0] == '-' || s[0] == '+')) {
        neg = s[0] == '-';
        i = 1;
    }
    if (i == n)
        return fail(d, DCP_EFORMAT, "pickle: bad integer at byte %zu",
                    d->op_off);
    if (neg)
        max = (uint64_t)INT64_MAX + 1;
    for (; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return fail(d, DCP_EFORMAT, "pickle: bad integer at byte %zu",
                        d->op_off);
        if (v > (max - (uint64_t)(s[i] - '0')) / 10)
            return fail(d, DCP_ELIMIT,
                        "pickle: integer out of int64 range at byte %zu",
                        d->op_off);
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    if (neg)
        *out = v == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)v;
    else
        *out = (int64_t)v;
    return DCP_OK;
}

/* ------------------------------------------------------------------ */
/* Scalars                                                            */
/* ------------------------------------------------------------------ */

static int push_string(struct pk_dec *d, uint8_t kind, uint64_t n)
{
    struct pk_node *s;
    if (n > left(d))
        return truncated(d);
    if (n > d->lim.max_str)
        return fail(d, DCP_ELIMIT,
                    "pickle: string of %" PRIu64 " bytes exceeds the limit "
                    "at byte %zu",
                    n, d->op_off);
    if (kind == PK_STR &&
        !dcp__utf8_valid(d->p, (size_t)n, DCP__UTF8_SURROGATES))
        return fail(d, DCP_EFORMAT, "pickle: invalid utf-8 at byte %zu",
                    d->op_off);
    s = str_new(d, kind, d->p, (size_t)n);
    d->p += n;
    return push(d, s);
}

/* Strings and bytes with an nlen-byte little-endian length. */
static int op_string(struct pk_dec *d, size_t nlen, uint8_t kind)
{
    uint64_t n;
    if (left(d) < nlen)
        return truncated(d);
    n = rd_le(d->p, nlen);
    d->p += nlen;
    return push_string(d, kind, n);
}

static int op_binstring(struct pk_dec *d)
{
    uint64_t n;
    if (left(d) < 4)
        return truncated(d);
    n = rd_le(d->p, 4);
    d->p += 4;
    if (n & 0x80000000u)
        return fail(d, DCP_EFORMAT, "pickle: negative length at byte %zu",
                    d->op_off);
    return push_string(d, PK_BYTES, n);
}

static int op_binint(struct pk_dec *d, size_t nb)
{
    uint64_t v;
    int64_t i;
    if (left(d) < nb)
        return truncated(d);
    v = rd_le(d->p, nb);
    d->p += nb;
    i = (int64_t)v;
    if (nb == 4 && (v & 0x80000000u))
        i -= (int64_t)1 << 32;
    return push(d, int_new(d, i));
}

/* Little-endian two's complement of any length that fits in int64. */
static int decode_long(struct pk_dec *d, const uint8_t *b, size_t n,
                       int64_t *out)
{
    uint8_t ext = (n && (b[n - 1] & 0x80)) ? 0xff : 0x00;
    size_t i, m = n < 8 ? n : 8;
    uint64_t v;
    *out = 0;
    for (i = 8; i < n; i++) {
        if (b[i] != ext)
            break;
    }
    if (i < n || (n > 8 && (b[7] & 0x80) != (ext & 0x80)))
        return fail(d, DCP_ELIMIT,
                    "pickle: integer out of int64 range at byte %zu",
                    d->op_off);
    v = rd_le(b, m);
    if (ext && m < 8)
        v |= ~(uint64_t)0 << (8 * m);
    *out = v > INT64_MAX ? -(int64_t)(~v) - 1 : (int64_t)v;
    return DCP_OK;
}

static int op_long(struct pk_dec *d, size_t nb)
{
    uint64_t n;
    int64_t v = 0;
    if (left(d) < nb)
        return truncated(d);
    n = rd_le(d->p, nb);
    d->p += nb;
    if (nb == 4 && (n & 0x80000000u))
        return fail(d, DCP_EFORMAT, "pickle: negative length at byte %zu",
                    d->op_off);
    if (n > left(d))
        return truncated(d);
    if (n > d->lim.max_str)
        return fail(d, DCP_ELIMIT,
                    "pickle: integer of %" PRIu64 " bytes at byte %zu", n,
                    d->op_off);
    if (decode_long(d, d->p, (size_t)n, &v) != DCP_OK)
        return d->rc;
    d->p += n;
    return push(d, int_new(d, v));
}

static int op_binfloat(struct pk_dec *d)
{
    uint64_t v = 0;
    struct pk_node *n;
    size_t i;
    double f;
    if (left(d) < 8)
        return truncated(d);
    for (i = 0; i < 8; i++)
        v = (v << 8) | d->p[i];
    d->p += 8;
    memcpy(&f, &v, sizeof(f));
    n = node_new(d, PK_FLOAT, 0);
    if (n)
        n->u.f = f;
    return push(d, n);
}

static int push_shared(struct pk_dec *d, struct pk_node **slot, uint8_t kind,
                       int b)
{
    if (!*slot) {
        *slot = node_new(d, kind, kind == PK_TUPLE ? 1 : 0);
        if (!*slot)
            return d->rc;
        if (kind == PK_BOOL)
            (*slot)->u.b = b;
    }
    return push(d, *slot);
}

/* INT in text form: decimal, or 00/01 for False/True (protocol 0). */
static int op_int_text(struct pk_dec *d, int is_long)
{
    const uint8_t *s;
    size_t n;
    int64_t v = 0;
    if (read_line(d, &s, &n) != DCP_OK)
        return d->rc;
    if (!is_long && n == 2 && s[0] == '0' && (s[1] == '0' || s[1] == '1'))
        return push_shared(d, &d->bools[s[1] - '0'], PK_BOOL, s[1] - '0');
    if (is_long && n && s[n - 1] == 'L')
        n--;
    if (parse_dec(d, s, n, &v) != DCP_OK)
        return d->rc;
    return push(d, int_new(d, v));
}

static int hexval(uint8_t c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* UNICODE: raw-unicode-escape text (latin-1 plus \uXXXX, \UXXXXXXXX). */
static int op_unicode_text(struct pk_dec *d)
{
    const uint8_t *s;
    size_t n, i = 0, o = 0, bs, k;
    struct pk_node *node;
    uint32_t c;
    char *out;
    int h;
    if (read_line(d, &s, &n) != DCP_OK)
        return d->rc;
    if (n > (SIZE_MAX - 1) / 2)
        return no_memory(d);
    node = node_new(d, PK_STR, 0);
    out = node ? arena_alloc(d->a, 2 * n + 1) : NULL;
    if (!out)
        return node ? no_memory(d) : d->rc;
    while (i < n) {
        if (s[i] != '\\') {
            o += utf8_put(out + o, s[i++]);
            continue;
        }
        /* An escape needs an odd run of backslashes before u or U. */
        for (bs = i; i < n && s[i] == '\\'; i++)
            out[o++] = '\\';
        if (((i - bs) & 1) == 0 || i == n || (s[i] != 'u' && s[i] != 'U'))
            continue;
        o--;
        k = s[i++] == 'u' ? 4 : 8;
        for (c = 0; k > 0; k--, i++) {
            h = i < n ? hexval(s[i]) : -1;
            if (h < 0 || c > 0x10ffff)
                return fail(d, DCP_EFORMAT,
                            "pickle: bad unicode escape at byte %zu",
                            d->op_off);
            c = c << 4 | (uint32_t)h;
        }
        if (c > 0x10ffff)
            return fail(d, DCP_EFORMAT,
                        "pickle: bad unicode escape at byte %zu", d->op_off);
        o += utf8_put(out + o, c);
    }
    out[o] = '\0';
    node->u.s.p = out;
    node->u.s.len = o;
    return push(d, node);
}

/* ------------------------------------------------------------------ */
/* Memo                                                               */
/* ------------------------------------------------------------------ */

static int memo_put(struct pk_dec *d, uint64_t idx)
{
    size_t cap;
    struct pk_node **m;
    if (avail(d) == 0)
        return underflow(d);
    if (idx >= d->lim.max_memo || idx >= (uint64_t)(d->end - d->base))
        return fail(d, DCP_ELIMIT,
                    "pickle: memo index %" PRIu64 " out of range at byte %zu",
                    idx, d->op_off);
    if (idx >= d->memo_cap) {
        cap = d->memo_cap ? d->memo_cap * 2 : 1024;
        if (cap <= idx)
            cap = (size_t)idx + 1;
        if (cap > d->lim.max_memo)
            cap = d->lim.max_memo;
        if (cap > (size_t)(d->end - d->base))
            cap = (size_t)(d->end - d->base);
        m = dcp__realloc(d->memo, cap * sizeof(*m));
        if (!m)
            return no_memory(d);
        memset(m + d->memo_cap, 0, (cap - d->memo_cap) * sizeof(*m));
        d->memo = m;
        d->memo_cap = cap;
    }
    if (!d->memo[idx])
        d->memo_count++;
    d->memo[idx] = d->stack[d->sp - 1];
    return DCP_OK;
}

static int memo_get(struct pk_dec *d, uint64_t idx)
{
    if (idx >= d->memo_cap || !d->memo[idx])
        return fail(d, DCP_EFORMAT,
                    "pickle: memo index %" PRIu64 " not set at byte %zu", idx,
                    d->op_off);
    return push(d, d->memo[idx]);
}

/* BINPUT/LONG_BINPUT (put != 0) and BINGET/LONG_BINGET. */
static int op_memo(struct pk_dec *d, size_t nb, int put)
{
    uint64_t idx;
    if (left(d) < nb)
        return truncated(d);
    idx = rd_le(d->p, nb);
    d->p += nb;
    return put ? memo_put(d, idx) : memo_get(d, idx);
}

static int op_memo_text(struct pk_dec *d, int put)
{
    const uint8_t *s;
    size_t n;
    int64_t idx = 0;
    if (read_line(d, &s, &n) != DCP_OK)
        return d->rc;
    if (parse_dec(d, s, n, &idx) != DCP_OK)
        return d->rc;
    if (idx < 0)
        return fail(d, DCP_EFORMAT, "pickle: negative memo index at byte %zu",
                    d->op_off);
    return put ? memo_put(d, (uint64_t)idx) : memo_get(d, (uint64_t)idx);
}

/* ------------------------------------------------------------------ */
/* Containers                                                         */
/* ------------------------------------------------------------------ */

static struct pk_node *seq_new(struct pk_dec *d, uint8_t kind,
                               struct pk_node *const *items, size_t n)
{
    struct pk_node *s;
    size_t i, maxd = 0;
    for (i = 0; i < n; i++) {
        if (items[i]->depth > maxd)
            maxd = items[i]->depth;
    }
    s = node_new(d, kind, maxd + 1);
    if (!s || n == 0)
        return s;
    s->u.seq.v = arena_alloc(d->a, n * sizeof(*items));
    if (!s->u.seq.v) {
        (void)no_memory(d);
        return NULL;
    }
    memcpy(s->u.seq.v, items, n * sizeof(*items));
    s->u.seq.n = s->u.seq.cap = n;
    return s;
}

/* Appends items to a list or dict, growing its vector in the arena. */
static int seq_append(struct pk_dec *d, struct pk_node *s,
                      struct pk_node *const *items, size_t n)
{
    size_t i, need = s->u.seq.n + n, cap, old, grow;
    struct pk_node **v;
    if (need > s->u.seq.cap) {
        cap = s->u.seq.cap * 2;
        if (cap < need)
            cap = need;
        if (cap < 4)
            cap = 4;
        old = s->u.seq.cap * sizeof(*v);
        grow = cap * sizeof(*v) - old;
        if (s->u.seq.v && (unsigned char *)s->u.seq.v + old == d->a->cur &&
            (size_t)(d->a->lim - d->a->cur) >= grow) {
            d->a->cur += grow; /* the vector was the last allocation */
        } else {
            v = arena_alloc(d->a, cap * sizeof(*v));
            if (!v)
                return no_memory(d);
            if (s->u.seq.v)
                memcpy(v, s->u.seq.v, s->u.seq.n * sizeof(*v));
            s->u.seq.v = v;
        }
        s->u.seq.cap = cap;
    }
    for (i = 0; i < n; i++) {
        if (attach(d, s, items[i]) != DCP_OK)
            return d->rc;
        s->u.seq.v[s->u.seq.n++] = items[i];
    }
    return DCP_OK;
}

/* TUPLE, LIST, DICT: build from the items above the innermost mark. */
static int op_collect(struct pk_dec *d, uint8_t kind)
{
    size_t start = 0, n;
    struct pk_node *s;
    if (pop_mark(d, &start) != DCP_OK)
        return d->rc;
    n = d->sp - start;
    if (kind == PK_DICT && (n & 1))
        return fail(d, DCP_EFORMAT,
                    "pickle: odd number of dict items at byte %zu", d->op_off);
    s = seq_new(d, kind, d->stack + start, n);
    d->sp = start;
    return push(d, s);
}

static int op_tuple_n(struct pk_dec *d, size_t n)
{
    struct pk_node *s;
    if (avail(d) < n)
        return underflow(d);
    s = seq_new(d, PK_TUPLE, d->stack + d->sp - n, n);
    d->sp -= n;
    return push(d, s);
}

static int push_container(struct pk_dec *d, uint8_t kind)
{
    return push(d, node_new(d, kind, 1));
}

/*
 * SETITEM(S), APPEND(S): the target sits just below the first item at
 * stack[start - 1], and must not belong to an outer mark.
 */
static int add_items(struct pk_dec *d, size_t start, uint8_t kind)
{
    struct pk_node *target;
    size_t n = d->sp - start;
    if (start == 0 || start <= d->fence)
        return underflow(d);
    target = d->stack[start - 1];
    if (target->kind != kind)
        return fail(d, DCP_EFORMAT, "pickle: %s to a non-%s at byte %zu",
                    kind == PK_DICT ? "setitem" : "append",
                    kind == PK_DICT ? "dict" : "list", d->op_off);
    if (kind == PK_DICT && (n & 1))
        return fail(d, DCP_EFORMAT,
                    "pickle: odd number of dict items at byte %zu", d->op_off);
    if (seq_append(d, target, d->stack + start, n) != DCP_OK)
        return d->rc;
    d->sp = start;
    return DCP_OK;
}

static int op_add_items(struct pk_dec *d, uint8_t kind, int marked)
{
    size_t start = 0;
    size_t n = kind == PK_DICT ? 2 : 1;
    if (marked) {
        if (pop_mark(d, &start) != DCP_OK)
            return d->rc;
        return add_items(d, start, kind);
    }
    if (avail(d) < n + 1)
        return underflow(d);
    return add_items(d, d->sp - n, kind);
}

/* ------------------------------------------------------------------ */
/* Globals and objects                                                */
/* ------------------------------------------------------------------ */

static int name_eq(const char *want, const uint8_t *s, size_t n)
{
    return strlen(want) == n && memcmp(want, s, n) == 0;
}

static long allow_find(const struct pk_global *allow, size_t nallow,
                       const char *module, const char *name)
{
    size_t i;
    for (i = 0; i < nallow; i++) {
        if (strcmp(allow[i].module, module) == 0 &&
            strcmp(allow[i].name, name) == 0)
            return (long)i;
    }
    return -1;
}

static char *arena_strdup(struct pk_arena *a, const char *s)
{
    size_t n = strlen(s);
    char *p = arena_alloc(a, n + 1);
    if (p)
        memcpy(p, s, n + 1);
    return p;
}

static int push_global(struct pk_dec *d, const uint8_t *mod, size_t mlen,
                       const uint8_t *name, size_t nlen)
{
    char m[100], nm[100];
    struct pk_node *g;
    size_t i;
    for (i = 0; i < d->nallow; i++) {
        if (name_eq(d->allow[i].module, mod, mlen) &&
            name_eq(d->allow[i].name, name, nlen))
            break;
    }
    if (i == d->nallow) {
        printable(m, sizeof(m), (const char *)mod, mlen);
        printable(nm, sizeof(nm), (const char *)name, nlen);
        return fail(d, DCP_EUNSAFE,
                    "pickle: disallowed global '%s.%s' at byte %zu", m, nm,
                    d->op_off);
    }
    if (!d->gcache[i]) {
        g = node_new(d, PK_GLOBAL, 0);
        if (!g)
            return d->rc;
        g->u.g.module = arena_strdup(d->a, d->allow[i].module);
        g->u.g.name = arena_strdup(d->a, d->allow[i].name);
        g->u.g.id = (int)i;
        if (!g->u.g.module || !g->u.g.name)
            return no_memory(d);
        d->gcache[i] = g;
    }
    return push(d, d->gcache[i]);
}

static int op_global(struct pk_dec *d)
{
    const uint8_t *mod, *name;
    size_t mlen, nlen;
    if (read_line(d, &mod, &mlen) != DCP_OK ||
        read_line(d, &name, &nlen) != DCP_OK)
        return d->rc;
    return push_global(d, mod, mlen, name, nlen);
}

static int op_stack_global(struct pk_dec *d)
{
    struct pk_node *mod, *name;
    if (avail(d) < 2)
        return underflow(d);
    name = d->stack[--d->sp];
    mod = d->stack[--d->sp];
    if (mod->kind != PK_STR || name->kind != PK_STR)
        return fail(d, DCP_EFORMAT,
                    "pickle: stack_global needs two str at byte %zu",
                    d->op_off);
    return push_global(d, (const uint8_t *)mod->u.s.p, mod->u.s.len,
                       (const uint8_t *)name->u.s.p, name->u.s.len);
}

static int obj_push(struct pk_dec *d, struct pk_node *fn, struct pk_node *args,
                    int newobj)
{
    struct pk_node *o;
    if (args->kind != PK_TUPLE)
        return fail(d, DCP_EFORMAT,
                    "pickle: call arguments are not a tuple at byte %zu",
                    d->op_off);
    o = node_new(d, PK_OBJ, 1);
    if (!o)
        return d->rc;
    o->newobj = (uint8_t)newobj;
    o->u.obj.callable = fn;
    o->u.obj.args = args;
    if (attach(d, o, fn) != DCP_OK || attach(d, o, args) != DCP_OK)
        return d->rc;
    return push(d, o);
}

/* _codecs.encode(s, "latin1"): the bytes are the code points of s. */
static int push_latin1(struct pk_dec *d, const struct pk_node *s)
{
    const uint8_t *p = (const uint8_t *)s->u.s.p;
    struct pk_node *b = node_new(d, PK_BYTES, 0);
    size_t i = 0, o = 0;
    char *out = b ? arena_alloc(d->a, s->u.s.len + 1) : NULL;
    if (!out)
        return b ? no_memory(d) : d->rc;
    while (i < s->u.s.len) {
        if (p[i] < 0x80) {
            out[o++] = (char)p[i++];
        } else if ((p[i] == 0xc2 || p[i] == 0xc3) && i + 1 < s->u.s.len) {
            out[o++] = (char)(((p[i] & 0x1f) << 6) | (p[i + 1] & 0x3f));
            i += 2;
        } else {
            return fail(d, DCP_EFORMAT,
                        "pickle: code point above 0xff in latin1 bytes at "
                        "byte %zu",
                        d->op_off);
        }
    }
    out[o] = '\0';
    b->u.s.p = out;
    b->u.s.len = o;
    return push(d, b);
}

static int is_latin1_call(const struct pk_node *args)
{
    const struct pk_node *s, *enc;
    if (args->u.seq.n != 2)
        return 0;
    s = args->u.seq.v[0];
    enc = args->u.seq.v[1];
    return s->kind == PK_STR && enc->kind == PK_STR &&
           (name_eq("latin1", (const uint8_t *)enc->u.s.p, enc->u.s.len) ||
            name_eq("latin-1", (const uint8_t *)enc->u.s.p, enc->u.s.len));
}

static int op_reduce(struct pk_dec *d)
{
    struct pk_node *fn, *args;
    if (avail(d) < 2)
        return underflow(d);
    args = d->stack[--d->sp];
    fn = d->stack[--d->sp];
    if (fn->kind == PK_GLOBAL && args->kind == PK_TUPLE) {
        if (fn->u.g.id == d->od_id && args->u.seq.n == 0)
            return push_container(d, PK_DICT);
        if (fn->u.g.id == d->enc_id && is_latin1_call(args))
            return push_latin1(d, args->u.seq.v[0]);
    }
    return obj_push(d, fn, args, 0);
}

static int op_newobj(struct pk_dec *d, int ex)
{
    struct pk_node *cls, *args, *kw = NULL;
    if (avail(d) < (ex ? 3u : 2u))
        return underflow(d);
    if (ex)
        kw = d->stack[--d->sp];
    args = d->stack[--d->sp];
    cls = d->stack[--d->sp];
    if (kw && kw->kind != PK_DICT)
        return fail(d, DCP_EFORMAT,
                    "pickle: newobj_ex keywords are not a dict at byte %zu",
                    d->op_off);
    if (kw && kw->u.seq.n != 0)
        return fail(d, DCP_ENOTSUP,
                    "pickle: newobj_ex with keyword arguments at byte %zu",
                    d->op_off);
    return obj_push(d, cls, args, 1);
}

static int op_build(struct pk_dec *d)
{
    struct pk_node *obj, *state;
    if (avail(d) < 2)
        return underflow(d);
    state = d->stack[--d->sp];
    obj = d->stack[d->sp - 1];
    if (obj->kind != PK_OBJ)
        return fail(d, DCP_EFORMAT, "pickle: build on a non-object at byte %zu",
                    d->op_off);
    obj->u.obj.state = state;
    return attach(d, obj, state);
}

static int persid_push(struct pk_dec *d, struct pk_node *pid)
{
    struct pk_node *n;
    if (!pid)
        return d->rc;
    n = node_new(d, PK_PERSID, (size_t)pid->depth + 1);
    if (!n)
        return d->rc;
    n->u.pid = pid;
    return push(d, n);
}

static int op_persid_text(struct pk_dec *d)
{
    const uint8_t *s;
    size_t n, i;
    if (read_line(d, &s, &n) != DCP_OK)
        return d->rc;
    for (i = 0; i < n; i++) {
        if (s[i] >= 0x80)
            return fail(d, DCP_EFORMAT,
                        "pickle: persistent id is not ascii at byte %zu",
                        d->op_off);
    }
    return persid_push(d, str_new(d, PK_STR, s, n));
}

/* ------------------------------------------------------------------ */
/* The VM                                                             */
/* ------------------------------------------------------------------ */

static int op_stop(struct pk_dec *d)
{
    if (d->nmarks)
        return fail(d, DCP_EFORMAT, "pickle: unmatched mark at byte %zu",
                    d->op_off);
    if (d->sp != 1)
        return fail(d, DCP_EFORMAT,
                    "pickle: stop with %zu items on the stack at byte %zu",
                    d->sp, d->op_off);
    d->result = d->stack[0];
    d->done = 1;
    return DCP_OK;
}

static int op_pop(struct pk_dec *d)
{
    size_t start = 0;
    if (d->nmarks && d->marks[d->nmarks - 1] == d->sp)
        return pop_mark(d, &start);
    if (avail(d) == 0)
        return underflow(d);
    d->sp--;
    return DCP_OK;
}

static int op_frame(struct pk_dec *d)
{
    uint64_t n;
    if (left(d) < 8)
        return truncated(d);
    n = rd_le(d->p, 8);
    d->p += 8;
    if (n > left(d))
        return fail(d, DCP_EFORMAT,
                    "pickle: frame of %" PRIu64 " bytes exceeds the input at "
                    "byte %zu",
                    n, d->op_off);
    return DCP_OK;
}

static int op_proto(struct pk_dec *d)
{
    if (left(d) < 1)
        return truncated(d);
    if (*d->p > PK_HIGHEST_PROTOCOL)
        return fail(d, DCP_ENOTSUP,
                    "pickle: unsupported protocol %u at byte %zu",
                    (unsigned)*d->p, d->op_off);
    d->p++;
    return DCP_OK;
}

static const char *unsafe_name(unsigned op)
{
    switch (op) {
    case PK_OP_INST:
        return "inst";
    case PK_OP_OBJ:
        return "obj";
    case PK_OP_EXT1:
        return "ext1";
    case PK_OP_EXT2:
        return "ext2";
    case PK_OP_EXT4:
        return "ext4";
    case PK_OP_NEXT_BUFFER:
        return "next_buffer";
    case PK_OP_READONLY_BUFFER:
        return "readonly_buffer";
    default:
        return NULL;
    }
}

/* The opcodes torch never writes in .metadata or data.pkl. */
static int step_rare(struct pk_dec *d, unsigned op)
{
    size_t start = 0;
    switch (op) {
    case PK_OP_PROTO:
        return op_proto(d);
    case PK_OP_FRAME:
        return op_frame(d);
    case PK_OP_POP:
        return op_pop(d);
    case PK_OP_POP_MARK:
        if (pop_mark(d, &start) != DCP_OK)
            return d->rc;
        d->sp = start;
        return DCP_OK;
    case PK_OP_DUP:
        if (avail(d) == 0)
            return underflow(d);
        return push(d, d->stack[d->sp - 1]);
    case PK_OP_INT:
        return op_int_text(d, 0);
    case PK_OP_LONG:
        return op_int_text(d, 1);
    case PK_OP_PUT:
        return op_memo_text(d, 1);
    case PK_OP_GET:
        return op_memo_text(d, 0);
    case PK_OP_UNICODE:
        return op_unicode_text(d);
    case PK_OP_PERSID:
        return op_persid_text(d);
    case PK_OP_EMPTY_SET:
    case PK_OP_ADDITEMS:
    case PK_OP_FROZENSET:
        return fail(d, DCP_ENOTSUP,
                    "pickle: sets are not supported at byte "
                    "%zu",
                    d->op_off);
    case PK_OP_STRING:
    case PK_OP_FLOAT:
        return fail(d, DCP_ENOTSUP,
                    "pickle: unsupported opcode '%c' at byte %zu", (int)op,
                    d->op_off);
    default:
        break;
    }
    if (unsafe_name(op))
        return fail(d, DCP_EUNSAFE, "pickle: refused opcode %s at byte %zu",
                    unsafe_name(op), d->op_off);
    return fail(d, DCP_EFORMAT, "pickle: unknown opcode 0x%02x at byte %zu", op,
                d->op_off);
}

static int step(struct pk_dec *d, unsigned op)
{
    switch (op) {
    case PK_OP_BINGET:
        return op_memo(d, 1, 0);
    case PK_OP_MEMOIZE:
        return memo_put(d, d->memo_count);
    case PK_OP_BINPUT:
        return op_memo(d, 1, 1);
    case PK_OP_SHORT_BINUNICODE:
        return op_string(d, 1, PK_STR);
    case PK_OP_BININT1:
        return op_binint(d, 1);
    case PK_OP_MARK:
        return op_mark(d);
    case PK_OP_EMPTY_TUPLE:
        return push_shared(d, &d->empty_tuple, PK_TUPLE, 0);
    case PK_OP_NEWOBJ:
        return op_newobj(d, 0);
    case PK_OP_EMPTY_DICT:
        return push_container(d, PK_DICT);
    case PK_OP_SETITEMS:
        return op_add_items(d, PK_DICT, 1);
    case PK_OP_BUILD:
        return op_build(d);
    case PK_OP_REDUCE:
        return op_reduce(d);
    case PK_OP_TUPLE1:
    case PK_OP_TUPLE2:
    case PK_OP_TUPLE3:
        return op_tuple_n(d, op - PK_OP_TUPLE1 + 1);
    case PK_OP_LONG_BINGET:
        return op_memo(d, 4, 0);
    case PK_OP_LONG_BINPUT:
        return op_memo(d, 4, 1);
    case PK_OP_BINUNICODE:
        return op_string(d, 4, PK_STR);
    case PK_OP_BININT2:
        return op_binint(d, 2);
    case PK_OP_BININT:
        return op_binint(d, 4);
    case PK_OP_LONG1:
        return op_long(d, 1);
    case PK_OP_LONG4:
        return op_long(d, 4);
    case PK_OP_NONE:
        return push_shared(d, &d->none, PK_NONE, 0);
    case PK_OP_NEWTRUE:
        return push_shared(d, &d->bools[1], PK_BOOL, 1);
    case PK_OP_NEWFALSE:
        return push_shared(d, &d->bools[0], PK_BOOL, 0);
    case PK_OP_EMPTY_LIST:
        return push_container(d, PK_LIST);
    case PK_OP_APPEND:
        return op_add_items(d, PK_LIST, 0);
    case PK_OP_APPENDS:
        return op_add_items(d, PK_LIST, 1);
    case PK_OP_SETITEM:
        return op_add_items(d, PK_DICT, 0);
    case PK_OP_TUPLE:
        return op_collect(d, PK_TUPLE);
    case PK_OP_LIST:
        return op_collect(d, PK_LIST);
    case PK_OP_DICT:
        return op_collect(d, PK_DICT);
    case PK_OP_STACK_GLOBAL:
        return op_stack_global(d);
    case PK_OP_GLOBAL:
        return op_global(d);
    case PK_OP_BINFLOAT:
        return op_binfloat(d);
    case PK_OP_BINPERSID:
        if (avail(d) == 0)
            return underflow(d);
        return persid_push(d, d->stack[--d->sp]);
    case PK_OP_NEWOBJ_EX:
        return op_newobj(d, 1);
    case PK_OP_SHORT_BINBYTES:
    case PK_OP_SHORT_BINSTRING:
        return op_string(d, 1, PK_BYTES);
    case PK_OP_BINBYTES:
        return op_string(d, 4, PK_BYTES);
    case PK_OP_BINSTRING:
        return op_binstring(d);
    case PK_OP_BINUNICODE8:
        return op_string(d, 8, PK_STR);
    case PK_OP_BINBYTES8:
    case PK_OP_BYTEARRAY8:
        return op_string(d, 8, PK_BYTES);
    case PK_OP_STOP:
        return op_stop(d);
    default:
        return step_rare(d, op);
    }
}

static int run(struct pk_dec *d)
{
    int rc = DCP_OK;
    while (rc == DCP_OK && !d->done) {
        d->op_off = (size_t)(d->p - d->base);
        if (d->p == d->end)
            return truncated(d);
        rc = step(d, *d->p++);
    }
    return rc;
}

static void limits_fill(struct pk_limits *l, const struct pk_limits *in)
{
    struct pk_limits def;
    dcp__pk_limits_default(&def);
    *l = in ? *in : def;
    if (!l->max_depth)
        l->max_depth = def.max_depth;
    if (l->max_depth > PK_DEPTH_CAP)
        l->max_depth = PK_DEPTH_CAP;
    if (!l->max_nodes)
        l->max_nodes = def.max_nodes;
    if (!l->max_str)
        l->max_str = def.max_str;
    if (!l->max_memo)
        l->max_memo = def.max_memo;
    if (!l->max_stack)
        l->max_stack = def.max_stack;
}

int dcp__pk_decode(const void *data, size_t len, const struct pk_global *allow,
              size_t nallow, const struct pk_limits *limits, int allow_trailing,
              struct pk_arena **arena, struct pk_node **root,
              struct dcp_err *err)
{
    static const uint8_t empty[1];
    struct pk_dec d;
    int rc = DCP_OK;
    if (arena)
        *arena = NULL;
    if (root)
        *root = NULL;
    if (!arena || !root || (!data && len) || (!allow && nallow))
        return dcp__err(err, DCP_EINVAL, "pickle: invalid argument");
    memset(&d, 0, sizeof(d));
    d.base = data ? data : empty;
    d.p = d.base;
    d.end = d.base + len;
    d.err = err;
    d.allow = allow;
    d.nallow = nallow;
    limits_fill(&d.lim, limits);
    d.od_id = allow_find(allow, nallow, "collections", "OrderedDict");
    d.enc_id = allow_find(allow, nallow, "_codecs", "encode");
    d.stack_cap = d.lim.max_stack < 256 ? d.lim.max_stack : 256;
    d.a = arena_new();
    d.gcache = dcp__calloc(nallow ? nallow : 1, sizeof(*d.gcache));
    d.stack = dcp__malloc(d.stack_cap * sizeof(*d.stack));
    d.icache = d.a ? arena_alloc(d.a, PK_ICACHE * sizeof(*d.icache)) : NULL;
    if (!d.a || !d.gcache || !d.stack || !d.icache) {
        rc = dcp__err(err, DCP_ENOMEM, "pickle: out of memory");
        goto out;
    }
    memset(d.icache, 0, PK_ICACHE * sizeof(*d.icache));
    rc = run(&d);
    if (rc == DCP_OK && !allow_trailing && d.p != d.end)
        rc = fail(&d, DCP_EFORMAT, "pickle: trailing bytes at byte %zu",
                  (size_t)(d.p - d.base));
out:
    if (rc == DCP_OK) {
        *arena = d.a;
        *root = d.result;
    } else {
        dcp__pk_arena_free(d.a);
    }
    dcp__free(d.gcache);
    dcp__free(d.stack);
    dcp__free(d.marks);
    dcp__free(d.memo);
    return rc;
}

/* ------------------------------------------------------------------ */
/* Consumer helpers                                                   */
/* ------------------------------------------------------------------ */

int dcp__pk_obj_is(const struct pk_node *n, const char *module, const char *name)
{
    const struct pk_node *c;
    if (!n || n->kind != PK_OBJ || !module || !name)
        return 0;
    c = n->u.obj.callable;
    return c && c->kind == PK_GLOBAL && strcmp(c->u.g.module, module) == 0 &&
           strcmp(c->u.g.name, name) == 0;
}

struct pk_node *dcp__pk_dict_get(const struct pk_node *dict, const char *key)
{
    const struct pk_node *k;
    size_t i, klen;
    if (!dict || dict->kind != PK_DICT || !key)
        return NULL;
    klen = strlen(key);
    /* From the end: the last assignment of a key wins, as in Python. */
    for (i = dict->u.seq.n / 2; i > 0; i--) {
        k = dict->u.seq.v[2 * i - 2];
        if (k->kind == PK_STR && k->u.s.len == klen &&
            memcmp(k->u.s.p, key, klen) == 0)
            return dict->u.seq.v[2 * i - 1];
    }
    return NULL;
}

struct pk_node *dcp__pk_obj_attr(const struct pk_node *obj, const char *key)
{
    if (!obj || obj->kind != PK_OBJ)
        return NULL;
    return dcp__pk_dict_get(obj->u.obj.state, key);
}

/* ------------------------------------------------------------------ */
/* Emitter                                                            */
/* ------------------------------------------------------------------ */

struct pk_intern_ent {
    const char *key; /* tag byte + text; NULL for a free slot */
    size_t len;
    uint64_t hash;
    uint32_t idx;
};

struct pk_intern {
    struct pk_intern_ent *tab;
    size_t cap; /* power of two */
    size_t n;
    struct pk_arena *pool;
};

void dcp__pk_writer_init(struct pk_writer *w, struct dcp_buf *out)
{
    w->out = out;
    w->next_memo = 0;
    w->intern = NULL;
}

void dcp__pk_writer_release(struct pk_writer *w)
{
    if (!w || !w->intern)
        return;
    dcp__free(w->intern->tab);
    dcp__pk_arena_free(w->intern->pool);
    dcp__free(w->intern);
    w->intern = NULL;
}

static int put_bytes(struct pk_writer *w, const void *p, size_t n)
{
    return dcp__buf_put(w->out, p, n) == DCP_OK ? DCP_OK : DCP_ENOMEM;
}

static int put_op(struct pk_writer *w, uint8_t op)
{
    return put_bytes(w, &op, 1);
}

int dcp__pkw_proto(struct pk_writer *w)
{
    static const uint8_t b[2] = {PK_OP_PROTO, 2};
    return put_bytes(w, b, 2);
}

int dcp__pkw_stop(struct pk_writer *w)
{
    return put_op(w, PK_OP_STOP);
}

int dcp__pkw_mark(struct pk_writer *w)
{
    return put_op(w, PK_OP_MARK);
}

int dcp__pkw_none(struct pk_writer *w)
{
    return put_op(w, PK_OP_NONE);
}

int dcp__pkw_bool(struct pk_writer *w, int b)
{
    return put_op(w, b ? PK_OP_NEWTRUE : PK_OP_NEWFALSE);
}

int dcp__pkw_int(struct pk_writer *w, int64_t v)
{
    uint8_t b[10];
    uint64_t u = (uint64_t)v;
    size_t i, n;
    if (v >= 0 && v <= 0xff) {
        b[0] = PK_OP_BININT1;
        b[1] = (uint8_t)v;
        return put_bytes(w, b, 2);
    }
    if (v >= 0 && v <= 0xffff) {
        b[0] = PK_OP_BININT2;
        b[1] = (uint8_t)v;
        b[2] = (uint8_t)(v >> 8);
        return put_bytes(w, b, 3);
    }
    n = (v >= INT32_MIN && v <= INT32_MAX) ? 4 : 8;
    for (i = 0; i < n; i++)
        b[2 + i] = (uint8_t)(u >> (8 * i));
    if (n == 4) {
        b[1] = PK_OP_BININT;
        return put_bytes(w, b + 1, 5);
    }
    /* LONG1: the shortest two's complement, as Python's encode_long. */
    while (n > 1 && ((b[n + 1] == 0x00 && !(b[n] & 0x80)) ||
                     (b[n + 1] == 0xff && (b[n] & 0x80))))
        n--;
    b[0] = PK_OP_LONG1;
    b[1] = (uint8_t)n;
    return put_bytes(w, b, 2 + n);
}

int dcp__pkw_float(struct pk_writer *w, double d)
{
    uint8_t b[9];
    uint64_t u;
    size_t i;
    memcpy(&u, &d, sizeof(u));
    b[0] = PK_OP_BINFLOAT;
    for (i = 0; i < 8; i++)
        b[1 + i] = (uint8_t)(u >> (56 - 8 * i));
    return put_bytes(w, b, 9);
}

int dcp__pkw_str(struct pk_writer *w, const char *s, size_t len)
{
    uint8_t b[5];
    if (len > UINT32_MAX)
        return DCP_EINVAL;
    if (dcp__buf_reserve(w->out, 5 + len) != DCP_OK)
        return DCP_ENOMEM;
    b[0] = PK_OP_BINUNICODE;
    b[1] = (uint8_t)len;
    b[2] = (uint8_t)(len >> 8);
    b[3] = (uint8_t)(len >> 16);
    b[4] = (uint8_t)(len >> 24);
    (void)put_bytes(w, b, 5);
    return put_bytes(w, s, len);
}

int dcp__pkw_global(struct pk_writer *w, const char *module, const char *name)
{
    size_t ml = strlen(module), nl = strlen(name);
    if (memchr(module, '\n', ml) || memchr(name, '\n', nl))
        return DCP_EINVAL;
    if (ml > SIZE_MAX / 2 - 3 || nl > SIZE_MAX / 2 - 3 ||
        dcp__buf_reserve(w->out, ml + nl + 3) != DCP_OK)
        return DCP_ENOMEM;
    (void)put_op(w, PK_OP_GLOBAL);
    (void)put_bytes(w, module, ml);
    (void)put_op(w, '\n');
    (void)put_bytes(w, name, nl);
    return put_op(w, '\n');
}

int dcp__pkw_empty_tuple(struct pk_writer *w)
{
    return put_op(w, PK_OP_EMPTY_TUPLE);
}

int dcp__pkw_empty_list(struct pk_writer *w)
{
    return put_op(w, PK_OP_EMPTY_LIST);
}

int dcp__pkw_empty_dict(struct pk_writer *w)
{
    return put_op(w, PK_OP_EMPTY_DICT);
}

int dcp__pkw_tuple(struct pk_writer *w, size_t n)
{
    if (n == 0)
        return put_op(w, PK_OP_EMPTY_TUPLE);
    if (n <= 3)
        return put_op(w, (uint8_t)(PK_OP_TUPLE1 + n - 1));
    return put_op(w, PK_OP_TUPLE);
}

int dcp__pkw_op(struct pk_writer *w, uint8_t opcode)
{
    return put_op(w, opcode);
}

static int memo_op(struct pk_writer *w, uint8_t short_op, uint8_t long_op,
                   uint32_t idx)
{
    uint8_t b[5];
    if (idx < 256) {
        b[0] = short_op;
        b[1] = (uint8_t)idx;
        return put_bytes(w, b, 2);
    }
    b[0] = long_op;
    b[1] = (uint8_t)idx;
    b[2] = (uint8_t)(idx >> 8);
    b[3] = (uint8_t)(idx >> 16);
    b[4] = (uint8_t)(idx >> 24);
    return put_bytes(w, b, 5);
}

int dcp__pkw_put(struct pk_writer *w, uint32_t *idx)
{
    int rc;
    if (w->next_memo == UINT32_MAX)
        return DCP_ELIMIT;
    rc = memo_op(w, PK_OP_BINPUT, PK_OP_LONG_BINPUT, w->next_memo);
    if (rc != DCP_OK)
        return rc;
    if (idx)
        *idx = w->next_memo;
    w->next_memo++;
    return DCP_OK;
}

int dcp__pkw_get(struct pk_writer *w, uint32_t idx)
{
    return memo_op(w, PK_OP_BINGET, PK_OP_LONG_BINGET, idx);
}

/* Interning key: tag, a, and for globals '\n' + b. */
struct ikey {
    char tag;
    const char *a, *b;
    size_t alen, blen, len;
    uint64_t hash;
};

static void ikey_init(struct ikey *k, char tag, const char *a, size_t alen,
                      const char *b)
{
    k->tag = tag;
    k->a = a;
    k->alen = alen;
    k->b = b;
    k->blen = b ? strlen(b) : 0;
    k->len = 1 + alen + (b ? 1 + k->blen : 0);
    k->hash = dcp__fnv1a64(&tag, 1);
    k->hash = dcp__fnv1a64_add(k->hash, a, alen);
    if (b) {
        k->hash = dcp__fnv1a64_add(k->hash, "\n", 1);
        k->hash = dcp__fnv1a64_add(k->hash, b, k->blen);
    }
}

static int ikey_eq(const struct pk_intern_ent *e, const struct ikey *k)
{
    const char *p = e->key;
    if (e->hash != k->hash || e->len != k->len || p[0] != k->tag ||
        memcmp(p + 1, k->a, k->alen) != 0)
        return 0;
    return !k->b || memcmp(p + 2 + k->alen, k->b, k->blen) == 0;
}

/* Slot for k: its entry, or the free slot where it would go. */
static struct pk_intern_ent *intern_slot(struct pk_intern *t,
                                         const struct ikey *k)
{
    size_t i = (size_t)k->hash & (t->cap - 1);
    while (t->tab[i].key && !ikey_eq(&t->tab[i], k))
        i = (i + 1) & (t->cap - 1);
    return &t->tab[i];
}

static int intern_grow(struct pk_intern *t)
{
    size_t cap = t->cap ? t->cap * 2 : 256, i, j;
    struct pk_intern_ent *tab;
    if (cap > SIZE_MAX / sizeof(*tab))
        return DCP_ENOMEM;
    tab = dcp__calloc(cap, sizeof(*tab));
    if (!tab)
        return DCP_ENOMEM;
    for (i = 0; i < t->cap; i++) {
        if (!t->tab[i].key)
            continue;
        j = (size_t)t->tab[i].hash & (cap - 1);
        while (tab[j].key)
            j = (j + 1) & (cap - 1);
        tab[j] = t->tab[i];
    }
    dcp__free(t->tab);
    t->tab = tab;
    t->cap = cap;
    return DCP_OK;
}

static int intern_ready(struct pk_writer *w)
{
    struct pk_intern *t = w->intern;
    if (!t) {
        t = dcp__calloc(1, sizeof(*t));
        if (!t)
            return DCP_ENOMEM;
        t->pool = arena_new();
        if (!t->pool) {
            dcp__free(t);
            return DCP_ENOMEM;
        }
        w->intern = t;
    }
    if ((t->n + 1) * 4 > t->cap * 3)
        return intern_grow(t);
    return DCP_OK;
}

/*
 * The interned emission: BINGET when k was seen, else emit (string or
 * global) then BINPUT. Everything that can fail happens before the first
 * byte is written, so a failed call leaves out unchanged.
 */
static int memo_emit(struct pk_writer *w, const struct ikey *k,
                     uint32_t *idx)
{
    struct pk_intern_ent *e;
    char *key;
    size_t need = k->tag == 's' ? 5 + k->alen : k->len + 2;
    int rc = intern_ready(w);
    if (rc != DCP_OK)
        return rc;
    e = intern_slot(w->intern, k);
    if (e->key) {
        if (idx)
            *idx = e->idx;
        return dcp__pkw_get(w, e->idx);
    }
    if (w->next_memo == UINT32_MAX)
        return DCP_ELIMIT;
    if (k->tag == 's' && k->alen > UINT32_MAX)
        return DCP_EINVAL;
    if (k->tag == 'g' &&
        (memchr(k->a, '\n', k->alen) || memchr(k->b, '\n', k->blen)))
        return DCP_EINVAL;
    key = arena_alloc(w->intern->pool, k->len);
    if (!key || dcp__buf_reserve(w->out, need + 5) != DCP_OK)
        return DCP_ENOMEM;
    key[0] = k->tag;
    memcpy(key + 1, k->a, k->alen);
    if (k->b) {
        key[1 + k->alen] = '\n';
        memcpy(key + 2 + k->alen, k->b, k->blen);
    }
    rc = k->tag == 's' ? dcp__pkw_str(w, k->a, k->alen) : dcp__pkw_global(w, k->a, k->b);
    if (rc == DCP_OK)
        rc = dcp__pkw_put(w, &e->idx);
    if (rc != DCP_OK)
        return rc;
    e->key = key;
    e->len = k->len;
    e->hash = k->hash;
    w->intern->n++;
    if (idx)
        *idx = e->idx;
    return DCP_OK;
}

int dcp__pkw_str_memo(struct pk_writer *w, const char *s, size_t len,
                 uint32_t *idx)
{
    struct ikey k;
    ikey_init(&k, 's', s, len, NULL);
    return memo_emit(w, &k, idx);
}

int dcp__pkw_global_memo(struct pk_writer *w, const char *module, const char *name,
                    uint32_t *idx)
{
    struct ikey k;
    ikey_init(&k, 'g', module, strlen(module), name);
    return memo_emit(w, &k, idx);
}
