/*
 * JSON parser (see json.h). Recursive descent with an explicit depth bound;
 * every node, item array and decoded string lives in one arena of blocks
 * freed together. The input is never trusted: every read checks the end,
 * numbers are parsed with overflow checks, strings are validated as UTF-8.
 */
#include "json.h"

#include <stdlib.h>
#include <string.h>

#define BLOCK_MIN ((size_t)64 << 10)

struct json_blk {
    struct json_blk *next;
    size_t used, cap;
    max_align_t data[]; /* aligned storage */
};

struct json_doc {
    struct json_blk *head;
    size_t nodes;
};

struct parser {
    const char *p;
    size_t len, pos;
    size_t max_depth, max_nodes;
    struct json_doc *doc;
    struct dcp_err *err;
    int nrc; /* why new_node last failed */
};

static void *arena_alloc(struct json_doc *d, size_t n)
{
    struct json_blk *b = d->head;
    size_t need = (n + sizeof(max_align_t) - 1) & ~(sizeof(max_align_t) - 1);
    void *r;
    if (need < n)
        return NULL;
    if (!b || b->cap - b->used < need) {
        size_t cap = need > BLOCK_MIN ? need : BLOCK_MIN;
        if (cap > SIZE_MAX - sizeof(*b))
            return NULL;
        b = dcp__malloc(sizeof(*b) + cap);
        if (!b)
            return NULL;
        b->next = d->head;
        b->used = 0;
        b->cap = cap;
        d->head = b;
    }
    r = (char *)b->data + b->used;
    b->used += need;
    return r;
}

void dcp__json_free(struct json_doc *doc)
{
    struct json_blk *b, *n;
    if (!doc)
        return;
    for (b = doc->head; b; b = n) {
        n = b->next;
        dcp__free(b);
    }
    dcp__free(doc);
}

static int fail(struct parser *ps, const char *what)
{
    return dcp__err(ps->err, DCP_EFORMAT, "json: %s at byte %zu", what,
                    ps->pos);
}

static void skip_ws(struct parser *ps)
{
    while (ps->pos < ps->len) {
        char c = ps->p[ps->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r')
            break;
        ps->pos++;
    }
}

static struct json_node *new_node(struct parser *ps, enum json_kind k)
{
    struct json_node *n;
    if (++ps->doc->nodes > ps->max_nodes) {
        ps->nrc = dcp__err(ps->err, DCP_ELIMIT,
                           "json: more than %zu values at byte %zu",
                           ps->max_nodes, ps->pos);
        return NULL;
    }
    n = arena_alloc(ps->doc, sizeof(*n));
    if (!n) {
        ps->nrc = dcp__err(ps->err, DCP_ENOMEM, "json: out of memory");
        return NULL;
    }
    memset(n, 0, sizeof(*n));
    n->kind = (uint8_t)k;
    n->off = ps->pos;
    return n;
}

static int hex4(struct parser *ps, uint32_t *out)
{
    uint32_t v = 0;
    int i;
    if (ps->len - ps->pos < 4)
        return fail(ps, "truncated \\u escape");
    for (i = 0; i < 4; i++) {
        char c = ps->p[ps->pos++];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (uint32_t)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (uint32_t)(c - 'A' + 10);
        else
            return fail(ps, "bad \\u escape");
    }
    *out = v;
    return DCP_OK;
}

static int put_utf8(struct dcp_buf *b, uint32_t cp)
{
    uint8_t u[4];
    size_t n;
    if (cp < 0x80) {
        u[0] = (uint8_t)cp;
        n = 1;
    } else if (cp < 0x800) {
        u[0] = (uint8_t)(0xC0 | (cp >> 6));
        u[1] = (uint8_t)(0x80 | (cp & 0x3F));
        n = 2;
    } else if (cp < 0x10000) {
        u[0] = (uint8_t)(0xE0 | (cp >> 12));
        u[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        u[2] = (uint8_t)(0x80 | (cp & 0x3F));
        n = 3;
    } else {
        u[0] = (uint8_t)(0xF0 | (cp >> 18));
        u[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
        u[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        u[3] = (uint8_t)(0x80 | (cp & 0x3F));
        n = 4;
    }
    return dcp__buf_put(b, u, n);
}

/* Length of the valid UTF-8 sequence at s (n bytes available), or 0. */
static size_t utf8_len(const uint8_t *s, size_t n)
{
    uint32_t cp;
    size_t k, i;
    if (s[0] < 0x80)
        return 1;
    if (s[0] >= 0xC2 && s[0] <= 0xDF)
        k = 2, cp = s[0] & 0x1Fu;
    else if (s[0] >= 0xE0 && s[0] <= 0xEF)
        k = 3, cp = s[0] & 0x0Fu;
    else if (s[0] >= 0xF0 && s[0] <= 0xF4)
        k = 4, cp = s[0] & 0x07u;
    else
        return 0;
    if (n < k)
        return 0;
    for (i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3Fu);
    }
    if ((k == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
        (k == 4 && (cp < 0x10000 || cp > 0x10FFFF)))
        return 0;
    return k;
}

static int escape(struct parser *ps, struct dcp_buf *b)
{
    uint32_t cp, lo;
    char c;
    int rc;
    if (ps->pos >= ps->len)
        return fail(ps, "truncated escape");
    c = ps->p[ps->pos++];
    switch (c) {
    case '"':
    case '\\':
    case '/':
        return dcp__buf_put_u8(b, (uint8_t)c);
    case 'b':
        return dcp__buf_put_u8(b, '\b');
    case 'f':
        return dcp__buf_put_u8(b, '\f');
    case 'n':
        return dcp__buf_put_u8(b, '\n');
    case 'r':
        return dcp__buf_put_u8(b, '\r');
    case 't':
        return dcp__buf_put_u8(b, '\t');
    case 'u':
        break;
    default:
        return fail(ps, "bad escape");
    }
    rc = hex4(ps, &cp);
    if (rc != DCP_OK)
        return rc;
    if (cp >= 0xDC00 && cp <= 0xDFFF)
        return fail(ps, "lone low surrogate");
    if (cp >= 0xD800 && cp <= 0xDBFF) {
        if (ps->len - ps->pos < 2 || ps->p[ps->pos] != '\\' ||
            ps->p[ps->pos + 1] != 'u')
            return fail(ps, "lone high surrogate");
        ps->pos += 2;
        rc = hex4(ps, &lo);
        if (rc != DCP_OK)
            return rc;
        if (lo < 0xDC00 || lo > 0xDFFF)
            return fail(ps, "bad surrogate pair");
        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
    }
    return put_utf8(b, cp);
}

static int parse_str(struct parser *ps, struct json_node **out)
{
    struct dcp_buf b = {0};
    struct json_node *n = new_node(ps, JSON_STR);
    char *s;
    int rc = DCP_OK;
    if (!n)
        return ps->nrc;
    ps->pos++; /* opening quote */
    for (;;) {
        uint8_t c;
        size_t k;
        if (ps->pos >= ps->len) {
            rc = fail(ps, "unterminated string");
            break;
        }
        c = (uint8_t)ps->p[ps->pos];
        if (c == '"') {
            ps->pos++;
            break;
        }
        if (c < 0x20) {
            rc = fail(ps, "control character in a string");
            break;
        }
        if (c == '\\') {
            ps->pos++;
            rc = escape(ps, &b);
            if (rc == DCP_ENOMEM)
                rc = dcp__err(ps->err, DCP_ENOMEM, "json: out of memory");
            if (rc != DCP_OK)
                break;
            continue;
        }
        k = utf8_len((const uint8_t *)ps->p + ps->pos, ps->len - ps->pos);
        if (k == 0) {
            rc = fail(ps, "invalid UTF-8 in a string");
            break;
        }
        rc = dcp__buf_put(&b, ps->p + ps->pos, k);
        if (rc != DCP_OK) {
            rc = dcp__err(ps->err, DCP_ENOMEM, "json: out of memory");
            break;
        }
        ps->pos += k;
    }
    if (rc == DCP_OK) {
        s = arena_alloc(ps->doc, b.len + 1);
        if (!s) {
            rc = dcp__err(ps->err, DCP_ENOMEM, "json: out of memory");
        } else {
            if (b.len)
                memcpy(s, b.p, b.len);
            s[b.len] = '\0';
            n->s = s;
            n->len = b.len;
            *out = n;
        }
    }
    dcp__buf_free(&b);
    return rc;
}

static int parse_num(struct parser *ps, struct json_node **out)
{
    struct json_node *n = new_node(ps, JSON_NUM);
    size_t start = ps->pos;
    int neg = 0, integral = 1, overflow = 0;
    uint64_t mag = 0;
    if (!n)
        return ps->nrc;
    if (ps->p[ps->pos] == '-') {
        neg = 1;
        ps->pos++;
    }
    if (ps->pos >= ps->len || ps->p[ps->pos] < '0' || ps->p[ps->pos] > '9')
        return fail(ps, "bad number");
    if (ps->p[ps->pos] == '0' && ps->pos + 1 < ps->len &&
        ps->p[ps->pos + 1] >= '0' && ps->p[ps->pos + 1] <= '9')
        return fail(ps, "leading zero in a number");
    while (ps->pos < ps->len && ps->p[ps->pos] >= '0' &&
           ps->p[ps->pos] <= '9') {
        if (dcp__mul_overflow_u64(mag, 10, &mag) ||
            dcp__add_overflow_u64(mag, (uint64_t)(ps->p[ps->pos] - '0'), &mag))
            overflow = 1;
        ps->pos++;
    }
    if (ps->pos < ps->len && ps->p[ps->pos] == '.') {
        integral = 0;
        ps->pos++;
        if (ps->pos >= ps->len || ps->p[ps->pos] < '0' || ps->p[ps->pos] > '9')
            return fail(ps, "bad fraction");
        while (ps->pos < ps->len && ps->p[ps->pos] >= '0' &&
               ps->p[ps->pos] <= '9')
            ps->pos++;
    }
    if (ps->pos < ps->len && (ps->p[ps->pos] == 'e' || ps->p[ps->pos] == 'E')) {
        integral = 0;
        ps->pos++;
        if (ps->pos < ps->len &&
            (ps->p[ps->pos] == '+' || ps->p[ps->pos] == '-'))
            ps->pos++;
        if (ps->pos >= ps->len || ps->p[ps->pos] < '0' || ps->p[ps->pos] > '9')
            return fail(ps, "bad exponent");
        while (ps->pos < ps->len && ps->p[ps->pos] >= '0' &&
               ps->p[ps->pos] <= '9')
            ps->pos++;
    }
    n->off = start;
    if (integral && !overflow &&
        mag <= (neg ? (uint64_t)INT64_MAX + 1u : (uint64_t)INT64_MAX)) {
        n->is_int = 1;
        n->i = neg ? (int64_t)(0u - mag) : (int64_t)mag;
    }
    *out = n;
    return DCP_OK;
}

static int parse_lit(struct parser *ps, const char *lit, enum json_kind k,
                     int b, struct json_node **out)
{
    size_t n = strlen(lit);
    struct json_node *node;
    if (ps->len - ps->pos < n || memcmp(ps->p + ps->pos, lit, n) != 0)
        return fail(ps, "unexpected character");
    node = new_node(ps, k);
    if (!node)
        return ps->nrc;
    node->b = b;
    ps->pos += n;
    *out = node;
    return DCP_OK;
}

static int parse_value(struct parser *ps, size_t depth, struct json_node **out);

/* Arrays and objects: items are collected in a growable buffer of
 * pointers, then copied into the arena. */
static int parse_container(struct parser *ps, size_t depth, int obj,
                           struct json_node **out)
{
    struct dcp_buf items = {0};
    struct json_node *n = new_node(ps, obj ? JSON_OBJ : JSON_ARR), *v;
    char close = obj ? '}' : ']';
    int rc = DCP_OK;
    if (!n)
        return ps->nrc;
    if (depth >= ps->max_depth)
        return dcp__err(ps->err, DCP_ELIMIT,
                        "json: nesting deeper than %zu at byte %zu",
                        ps->max_depth, ps->pos);
    ps->pos++;
    skip_ws(ps);
    if (ps->pos < ps->len && ps->p[ps->pos] == close) {
        ps->pos++;
        *out = n;
        return DCP_OK;
    }
    for (;;) {
        skip_ws(ps);
        if (obj) {
            if (ps->pos >= ps->len || ps->p[ps->pos] != '"') {
                rc = fail(ps, "expected a string key");
                break;
            }
            rc = parse_str(ps, &v);
            if (rc == DCP_OK && dcp__buf_put(&items, &v, sizeof(v)) != DCP_OK)
                rc = dcp__err(ps->err, DCP_ENOMEM, "json: out of memory");
            if (rc != DCP_OK)
                break;
            skip_ws(ps);
            if (ps->pos >= ps->len || ps->p[ps->pos] != ':') {
                rc = fail(ps, "expected ':'");
                break;
            }
            ps->pos++;
        }
        rc = parse_value(ps, depth + 1, &v);
        if (rc == DCP_OK && dcp__buf_put(&items, &v, sizeof(v)) != DCP_OK)
            rc = dcp__err(ps->err, DCP_ENOMEM, "json: out of memory");
        if (rc != DCP_OK)
            break;
        skip_ws(ps);
        if (ps->pos < ps->len && ps->p[ps->pos] == ',') {
            ps->pos++;
            continue;
        }
        if (ps->pos < ps->len && ps->p[ps->pos] == close) {
            ps->pos++;
            break;
        }
        rc = fail(ps, obj ? "expected ',' or '}'" : "expected ',' or ']'");
        break;
    }
    if (rc == DCP_OK) {
        n->v = arena_alloc(ps->doc, items.len ? items.len : 1);
        if (!n->v) {
            rc = dcp__err(ps->err, DCP_ENOMEM, "json: out of memory");
        } else {
            if (items.len)
                memcpy((void *)n->v, items.p, items.len);
            n->len = items.len / sizeof(v) / (obj ? 2 : 1);
            *out = n;
        }
    }
    dcp__buf_free(&items);
    return rc;
}

static int parse_value(struct parser *ps, size_t depth, struct json_node **out)
{
    char c;
    skip_ws(ps);
    if (ps->pos >= ps->len)
        return fail(ps, "unexpected end");
    c = ps->p[ps->pos];
    switch (c) {
    case '{':
        return parse_container(ps, depth, 1, out);
    case '[':
        return parse_container(ps, depth, 0, out);
    case '"':
        return parse_str(ps, out);
    case 't':
        return parse_lit(ps, "true", JSON_BOOL, 1, out);
    case 'f':
        return parse_lit(ps, "false", JSON_BOOL, 0, out);
    case 'n':
        return parse_lit(ps, "null", JSON_NULL, 0, out);
    default:
        if (c == '-' || (c >= '0' && c <= '9'))
            return parse_num(ps, out);
        return fail(ps, "unexpected character");
    }
}

int dcp__json_parse(const char *p, size_t len, size_t max_depth, size_t max_nodes,
               struct json_doc **doc, struct json_node **root,
               struct dcp_err *err)
{
    struct parser ps;
    int rc;
    *doc = NULL;
    *root = NULL;
    if (!p && len)
        return dcp__err(err, DCP_EINVAL, "json: no input");
    memset(&ps, 0, sizeof(ps));
    ps.p = p;
    ps.len = len;
    ps.max_depth = max_depth;
    ps.max_nodes = max_nodes;
    ps.err = err;
    ps.doc = dcp__calloc(1, sizeof(*ps.doc));
    if (!ps.doc)
        return dcp__err(err, DCP_ENOMEM, "json: out of memory");
    rc = parse_value(&ps, 0, root);
    if (rc == DCP_OK) {
        skip_ws(&ps);
        if (ps.pos != len)
            rc = fail(&ps, "trailing characters");
    }
    if (rc != DCP_OK) {
        dcp__json_free(ps.doc);
        *root = NULL;
        return rc;
    }
    *doc = ps.doc;
    return DCP_OK;
}

const struct json_node *dcp__json_get(const struct json_node *obj, const char *key)
{
    size_t i, n;
    if (!obj || obj->kind != JSON_OBJ || !key)
        return NULL;
    n = strlen(key);
    for (i = 0; i < obj->len; i++) {
        const struct json_node *k = json_key(obj, i);
        if (k->len == n && memcmp(k->s, key, n) == 0)
            return json_val(obj, i);
    }
    return NULL;
}

static int cmp_keys(const void *a, const void *b)
{
    const struct json_node *x = *(const struct json_node *const *)a;
    const struct json_node *y = *(const struct json_node *const *)b;
    size_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->s, y->s, n);
    if (c)
        return c;
    return x->len < y->len ? -1 : x->len > y->len;
}

const char *dcp__json_dup_key(const struct json_node *obj)
{
    const struct json_node **k;
    const char *dup = NULL;
    size_t i;
    if (!obj || obj->kind != JSON_OBJ || obj->len < 2)
        return NULL;
    k = dcp__malloc(obj->len * sizeof(*k));
    if (!k) {
        /* Without memory, fall back to the quadratic check. */
        size_t j;
        for (i = 0; i < obj->len && !dup; i++)
            for (j = i + 1; j < obj->len && !dup; j++)
                if (cmp_keys(&obj->v[2 * i], &obj->v[2 * j]) == 0)
                    dup = obj->v[2 * i]->s;
        return dup;
    }
    for (i = 0; i < obj->len; i++)
        k[i] = json_key(obj, i);
    qsort((void *)k, obj->len, sizeof(*k), cmp_keys);
    for (i = 1; i < obj->len && !dup; i++)
        if (cmp_keys(&k[i - 1], &k[i]) == 0)
            dup = k[i]->s;
    dcp__free((void *)k);
    return dup;
}

int dcp__json_put_str(struct dcp_buf *b, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    size_t i;
    int rc = dcp__buf_put_u8(b, '"');
    for (i = 0; rc == DCP_OK && i < n; i++) {
        uint8_t c = (uint8_t)s[i];
        if (c == '"' || c == '\\') {
            uint8_t e[2] = {'\\', c};
            rc = dcp__buf_put(b, e, 2);
        } else if (c < 0x20) {
            uint8_t e[6] = {'\\',
                            'u',
                            '0',
                            '0',
                            (uint8_t)hex[c >> 4],
                            (uint8_t)hex[c & 15]};
            rc = dcp__buf_put(b, e, 6);
        } else {
            rc = dcp__buf_put_u8(b, c);
        }
    }
    return rc == DCP_OK ? dcp__buf_put_u8(b, '"') : rc;
}
