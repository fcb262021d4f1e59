/*
 * Non-tensor values: construction, access, JSON, and the pickle form.
 *
 * The pickle written is what CPython's pickle module writes at protocol 2
 * for the same Python object (torch.save uses protocol 2): str memoized with
 * BINPUT, bytes as _codecs.encode(str, 'latin1'), lists and dicts filled
 * with APPENDS/SETITEMS batches. Reading goes through the safe decoder with
 * a small allow-list; nothing is ever imported or called.
 */
#include "value.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "pickle.h"
#include "torchzip.h"

#define VALUE_MAX_DEPTH 64
#define VALUE_MAX_NODES ((size_t)1 << 24)
/* Shared memo references are copied, so a small pickle can describe a huge
 * value ((x, x) nested 40 deep: 2^40 leaves; a long string referenced a
 * million times). The copy is bounded by the pickle's size: at most
 * VALUE_EXPANSION bytes of value (objects and string bytes) per pickle
 * byte, plus VALUE_EXPANSION_MIN. Plain pickles stay well below (an object
 * costs about 48 bytes and takes at least one pickle byte). */
#define VALUE_EXPANSION     64
#define VALUE_EXPANSION_MIN ((size_t)1 << 20)

static dcp_value *value_new(dcp_value_type t)
{
    dcp_value *v = dcp__calloc(1, sizeof(*v));
    if (v)
        v->type = t;
    return v;
}

dcp_value *dcp_value_none(void)
{
    return value_new(DCP_VALUE_NONE);
}

dcp_value *dcp_value_bool(int b)
{
    dcp_value *v = value_new(DCP_VALUE_BOOL);
    if (v)
        v->u.b = b != 0;
    return v;
}

dcp_value *dcp_value_int(int64_t i)
{
    dcp_value *v = value_new(DCP_VALUE_INT);
    if (v)
        v->u.i = i;
    return v;
}

dcp_value *dcp_value_float(double d)
{
    dcp_value *v = value_new(DCP_VALUE_FLOAT);
    if (v)
        v->u.f = d;
    return v;
}

static dcp_value *value_blob(dcp_value_type t, const void *p, size_t len)
{
    dcp_value *v = value_new(t);
    if (!v)
        return NULL;
    v->u.s.p = dcp__malloc(len + 1);
    if (!v->u.s.p) {
        dcp__free(v);
        return NULL;
    }
    if (len)
        memcpy(v->u.s.p, p, len);
    v->u.s.p[len] = '\0';
    v->u.s.len = len;
    return v;
}

dcp_value *dcp_value_strn(const char *s, size_t len)
{
    if (!s && len)
        return NULL;
    return value_blob(DCP_VALUE_STR, s, len);
}

dcp_value *dcp_value_str(const char *s)
{
    if (!s)
        return NULL;
    return value_blob(DCP_VALUE_STR, s, strlen(s));
}

dcp_value *dcp_value_bytes(const void *p, size_t len)
{
    if (!p && len)
        return NULL;
    return value_blob(DCP_VALUE_BYTES, p, len);
}

dcp_value *dcp_value_list(void)
{
    return value_new(DCP_VALUE_LIST);
}

dcp_value *dcp_value_tuple(void)
{
    return value_new(DCP_VALUE_TUPLE);
}

dcp_value *dcp_value_dict(void)
{
    return value_new(DCP_VALUE_DICT);
}

static int seq_push(dcp_value *seq, dcp_value *item)
{
    if (seq->u.seq.n == seq->u.seq.cap) {
        size_t cap = seq->u.seq.cap ? seq->u.seq.cap * 2 : 4;
        dcp_value **nv = dcp__realloc(seq->u.seq.v, cap * sizeof(*nv));
        if (!nv)
            return DCP_ENOMEM;
        seq->u.seq.v = nv;
        seq->u.seq.cap = cap;
    }
    seq->u.seq.v[seq->u.seq.n++] = item;
    return DCP_OK;
}

static int is_seq(const dcp_value *v)
{
    return v && (v->type == DCP_VALUE_LIST || v->type == DCP_VALUE_TUPLE);
}

int dcp_value_append(dcp_value *seq, dcp_value *item)
{
    int rc;
    if (!is_seq(seq) || !item) {
        dcp_value_free(item);
        return item ? DCP_EINVAL : DCP_ENOMEM;
    }
    rc = seq_push(seq, item);
    if (rc != DCP_OK)
        dcp_value_free(item);
    return rc;
}

int dcp_value_dict_set(dcp_value *dict, const char *key, dcp_value *item)
{
    dcp_value *k;
    size_t i;
    int rc;
    if (!dict || dict->type != DCP_VALUE_DICT || !key || !item) {
        dcp_value_free(item);
        return item ? DCP_EINVAL : DCP_ENOMEM;
    }
    for (i = 0; i + 1 < dict->u.seq.n; i += 2) {
        k = dict->u.seq.v[i];
        if (k->type == DCP_VALUE_STR && strcmp(k->u.s.p, key) == 0) {
            dcp_value_free(dict->u.seq.v[i + 1]);
            dict->u.seq.v[i + 1] = item;
            return DCP_OK;
        }
    }
    k = dcp_value_str(key);
    if (!k) {
        dcp_value_free(item);
        return DCP_ENOMEM;
    }
    rc = seq_push(dict, k);
    if (rc == DCP_OK) {
        rc = seq_push(dict, item);
        if (rc != DCP_OK) {
            dict->u.seq.n--;
            dcp_value_free(k);
        }
    } else {
        dcp_value_free(k);
    }
    if (rc != DCP_OK)
        dcp_value_free(item);
    return rc;
}

void dcp_value_free(dcp_value *v)
{
    size_t i;
    if (!v)
        return;
    switch (v->type) {
    case DCP_VALUE_STR:
    case DCP_VALUE_BYTES:
        dcp__free(v->u.s.p);
        break;
    case DCP_VALUE_LIST:
    case DCP_VALUE_TUPLE:
    case DCP_VALUE_DICT:
        for (i = 0; i < v->u.seq.n; i++)
            dcp_value_free(v->u.seq.v[i]);
        dcp__free(v->u.seq.v);
        break;
    case DCP_VALUE_NONE:
    case DCP_VALUE_BOOL:
    case DCP_VALUE_INT:
    case DCP_VALUE_FLOAT:
        break;
    }
    dcp__free(v);
}

dcp_value *dcp_value_copy(const dcp_value *v)
{
    dcp_value *c;
    size_t i;
    if (!v)
        return NULL;
    switch (v->type) {
    case DCP_VALUE_STR:
    case DCP_VALUE_BYTES:
        return value_blob(v->type, v->u.s.p, v->u.s.len);
    case DCP_VALUE_LIST:
    case DCP_VALUE_TUPLE:
    case DCP_VALUE_DICT:
        c = value_new(v->type);
        if (!c)
            return NULL;
        for (i = 0; i < v->u.seq.n; i++) {
            dcp_value *item = dcp_value_copy(v->u.seq.v[i]);
            if (!item || seq_push(c, item) != DCP_OK) {
                dcp_value_free(item);
                dcp_value_free(c);
                return NULL;
            }
        }
        return c;
    case DCP_VALUE_NONE:
    case DCP_VALUE_BOOL:
    case DCP_VALUE_INT:
    case DCP_VALUE_FLOAT:
        break;
    }
    c = value_new(v->type);
    if (c)
        c->u = v->u;
    return c;
}

dcp_value_type dcp_value_type_of(const dcp_value *v)
{
    return v ? v->type : DCP_VALUE_NONE;
}

int dcp_value_as_bool(const dcp_value *v)
{
    return v && v->type == DCP_VALUE_BOOL ? v->u.b : 0;
}

int64_t dcp_value_as_int(const dcp_value *v)
{
    return v && v->type == DCP_VALUE_INT ? v->u.i : 0;
}

double dcp_value_as_float(const dcp_value *v)
{
    return v && v->type == DCP_VALUE_FLOAT ? v->u.f : 0.0;
}

const char *dcp_value_as_str(const dcp_value *v, size_t *len)
{
    if (!v || v->type != DCP_VALUE_STR) {
        if (len)
            *len = 0;
        return NULL;
    }
    if (len)
        *len = v->u.s.len;
    return v->u.s.p;
}

const void *dcp_value_as_bytes(const dcp_value *v, size_t *len)
{
    if (!v || v->type != DCP_VALUE_BYTES) {
        if (len)
            *len = 0;
        return NULL;
    }
    if (len)
        *len = v->u.s.len;
    return v->u.s.p;
}

size_t dcp_value_len(const dcp_value *v)
{
    if (is_seq(v))
        return v->u.seq.n;
    if (v && v->type == DCP_VALUE_DICT)
        return v->u.seq.n / 2;
    return 0;
}

const dcp_value *dcp_value_item(const dcp_value *v, size_t i)
{
    if (is_seq(v))
        return i < v->u.seq.n ? v->u.seq.v[i] : NULL;
    if (v && v->type == DCP_VALUE_DICT)
        return 2 * i + 1 < v->u.seq.n ? v->u.seq.v[2 * i + 1] : NULL;
    return NULL;
}

const dcp_value *dcp_value_dict_key(const dcp_value *v, size_t i)
{
    if (v && v->type == DCP_VALUE_DICT && 2 * i < v->u.seq.n)
        return v->u.seq.v[2 * i];
    return NULL;
}

const dcp_value *dcp_value_dict_get(const dcp_value *v, const char *key)
{
    size_t i;
    if (!v || v->type != DCP_VALUE_DICT || !key)
        return NULL;
    for (i = 0; i + 1 < v->u.seq.n; i += 2) {
        const dcp_value *k = v->u.seq.v[i];
        if (k->type == DCP_VALUE_STR && strcmp(k->u.s.p, key) == 0)
            return v->u.seq.v[i + 1];
    }
    return NULL;
}

int dcp_value_equal(const dcp_value *a, const dcp_value *b)
{
    size_t i;
    if (!a || !b)
        return a == b;
    if (a->type != b->type)
        return 0;
    switch (a->type) {
    case DCP_VALUE_NONE:
        return 1;
    case DCP_VALUE_BOOL:
        return a->u.b == b->u.b;
    case DCP_VALUE_INT:
        return a->u.i == b->u.i;
    case DCP_VALUE_FLOAT:
        return memcmp(&a->u.f, &b->u.f, sizeof(double)) == 0;
    case DCP_VALUE_STR:
    case DCP_VALUE_BYTES:
        return a->u.s.len == b->u.s.len &&
               memcmp(a->u.s.p, b->u.s.p, a->u.s.len) == 0;
    case DCP_VALUE_LIST:
    case DCP_VALUE_TUPLE:
    case DCP_VALUE_DICT:
        if (a->u.seq.n != b->u.seq.n)
            return 0;
        for (i = 0; i < a->u.seq.n; i++)
            if (!dcp_value_equal(a->u.seq.v[i], b->u.seq.v[i]))
                return 0;
        return 1;
    }
    return 0;
}

int dcp__value_list_expands(const dcp_value *v)
{
    size_t i;
    if (!v || v->type != DCP_VALUE_LIST)
        return 0;
    for (i = 0; i < v->u.seq.n; i++) {
        const dcp_value *c = v->u.seq.v[i];
        if (c->type == DCP_VALUE_DICT || dcp__value_list_expands(c))
            return 1;
    }
    return 0;
}

/* --------------------------------------------------------------- JSON */

static int json_str(struct dcp_buf *b, const char *s, size_t n)
{
    size_t i;
    int rc = dcp__buf_put_u8(b, '"');
    for (i = 0; rc == DCP_OK && i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            rc = dcp__buf_printf(b, "\\%c", c);
        else if (c == '\n')
            rc = dcp__buf_put(b, "\\n", 2);
        else if (c == '\t')
            rc = dcp__buf_put(b, "\\t", 2);
        else if (c < 0x20)
            rc = dcp__buf_printf(b, "\\u%04x", c);
        else
            rc = dcp__buf_put_u8(b, c);
    }
    if (rc == DCP_OK)
        rc = dcp__buf_put_u8(b, '"');
    return rc;
}

static int json_base64(struct dcp_buf *b, const uint8_t *p, size_t n)
{
    static const char tab[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t i;
    int rc = DCP_OK;
    for (i = 0; rc == DCP_OK && i < n; i += 3) {
        uint32_t x = (uint32_t)p[i] << 16;
        char o[4];
        if (i + 1 < n)
            x |= (uint32_t)p[i + 1] << 8;
        if (i + 2 < n)
            x |= p[i + 2];
        o[0] = tab[(x >> 18) & 63];
        o[1] = tab[(x >> 12) & 63];
        o[2] = i + 1 < n ? tab[(x >> 6) & 63] : '=';
        o[3] = i + 2 < n ? tab[x & 63] : '=';
        rc = dcp__buf_put(b, o, 4);
    }
    return rc;
}

static int json_value(struct dcp_buf *b, const dcp_value *v, int depth)
{
    size_t i;
    int rc = DCP_OK;
    if (depth > VALUE_MAX_DEPTH)
        return DCP_ELIMIT;
    switch (v->type) {
    case DCP_VALUE_NONE:
        return dcp__buf_put(b, "null", 4);
    case DCP_VALUE_BOOL:
        return v->u.b ? dcp__buf_put(b, "true", 4)
                      : dcp__buf_put(b, "false", 5);
    case DCP_VALUE_INT:
        return dcp__buf_printf(b, "%lld", (long long)v->u.i);
    case DCP_VALUE_FLOAT:
        if (isnan(v->u.f))
            return dcp__buf_put(b, "\"nan\"", 5);
        if (isinf(v->u.f))
            return v->u.f > 0 ? dcp__buf_put(b, "\"inf\"", 5)
                              : dcp__buf_put(b, "\"-inf\"", 6);
        return dcp__buf_printf(b, "%.17g", v->u.f);
    case DCP_VALUE_STR:
        return json_str(b, v->u.s.p, v->u.s.len);
    case DCP_VALUE_BYTES:
        rc = dcp__buf_put(b, "{\"__bytes__\": \"", 15);
        if (rc == DCP_OK)
            rc = json_base64(b, (const uint8_t *)v->u.s.p, v->u.s.len);
        if (rc == DCP_OK)
            rc = dcp__buf_put(b, "\"}", 2);
        return rc;
    case DCP_VALUE_LIST:
    case DCP_VALUE_TUPLE:
        rc = dcp__buf_put_u8(b, '[');
        for (i = 0; rc == DCP_OK && i < v->u.seq.n; i++) {
            if (i)
                rc = dcp__buf_put(b, ", ", 2);
            if (rc == DCP_OK)
                rc = json_value(b, v->u.seq.v[i], depth + 1);
        }
        return rc == DCP_OK ? dcp__buf_put_u8(b, ']') : rc;
    case DCP_VALUE_DICT:
        rc = dcp__buf_put_u8(b, '{');
        for (i = 0; rc == DCP_OK && i + 1 < v->u.seq.n; i += 2) {
            const dcp_value *k = v->u.seq.v[i];
            if (i)
                rc = dcp__buf_put(b, ", ", 2);
            if (rc != DCP_OK)
                break;
            if (k->type == DCP_VALUE_STR) {
                rc = json_str(b, k->u.s.p, k->u.s.len);
            } else {
                /* JSON keys are strings: render other keys as JSON text. */
                struct dcp_buf kb = {0};
                rc = json_value(&kb, k, depth + 1);
                if (rc == DCP_OK)
                    rc = json_str(b, (const char *)kb.p, kb.len);
                dcp__buf_free(&kb);
            }
            if (rc == DCP_OK)
                rc = dcp__buf_put(b, ": ", 2);
            if (rc == DCP_OK)
                rc = json_value(b, v->u.seq.v[i + 1], depth + 1);
        }
        return rc == DCP_OK ? dcp__buf_put_u8(b, '}') : rc;
    }
    return DCP_EINVAL;
}

int dcp_value_to_json(const dcp_value *v, char **out)
{
    struct dcp_buf b = {0};
    int rc;
    if (!out)
        return DCP_EINVAL;
    *out = NULL;
    if (!v)
        return DCP_EINVAL;
    rc = json_value(&b, v, 0);
    if (rc == DCP_OK)
        rc = dcp__buf_put_u8(&b, '\0');
    if (rc != DCP_OK) {
        dcp__buf_free(&b);
        return rc;
    }
    *out = (char *)b.p;
    return DCP_OK;
}

/* ------------------------------------------------------- pickle: emit */

/* Latin-1 bytes as the UTF-8 text of the equivalent Python str. */
static int latin1_to_utf8(const uint8_t *p, size_t n, struct dcp_buf *out)
{
    size_t i;
    int rc = DCP_OK;
    for (i = 0; rc == DCP_OK && i < n; i++) {
        if (p[i] < 0x80) {
            rc = dcp__buf_put_u8(out, p[i]);
        } else {
            uint8_t u[2] = {(uint8_t)(0xC0 | (p[i] >> 6)),
                            (uint8_t)(0x80 | (p[i] & 0x3F))};
            rc = dcp__buf_put(out, u, 2);
        }
    }
    return rc;
}

static int pickle_value(struct pk_writer *w, const dcp_value *v, int depth);

/* Python batches APPENDS/SETITEMS by 1000 items. */
static int pickle_items(struct pk_writer *w, const dcp_value *v, int depth,
                        size_t per, uint8_t one, uint8_t many)
{
    size_t n = v->u.seq.n / per, i = 0, j;
    int rc = DCP_OK;
    while (rc == DCP_OK && i < n) {
        size_t batch = n - i < 1000 ? n - i : 1000;
        if (batch > 1)
            rc = dcp__pkw_mark(w);
        for (j = 0; rc == DCP_OK && j < batch * per; j++)
            rc = pickle_value(w, v->u.seq.v[i * per + j], depth + 1);
        if (rc == DCP_OK)
            rc = dcp__pkw_op(w, batch > 1 ? many : one);
        i += batch;
    }
    return rc;
}

static int pickle_value(struct pk_writer *w, const dcp_value *v, int depth)
{
    struct dcp_buf tmp = {0};
    size_t i;
    int rc = DCP_OK;
    if (depth > VALUE_MAX_DEPTH)
        return DCP_ELIMIT;
    switch (v->type) {
    case DCP_VALUE_NONE:
        return dcp__pkw_none(w);
    case DCP_VALUE_BOOL:
        return dcp__pkw_bool(w, v->u.b);
    case DCP_VALUE_INT:
        return dcp__pkw_int(w, v->u.i);
    case DCP_VALUE_FLOAT:
        return dcp__pkw_float(w, v->u.f);
    case DCP_VALUE_STR:
        rc = dcp__pkw_str(w, v->u.s.p, v->u.s.len);
        return rc == DCP_OK ? dcp__pkw_put(w, NULL) : rc;
    case DCP_VALUE_BYTES:
        /* Protocol 2: _codecs.encode(bytes.decode('latin1'), 'latin1'). */
        rc = dcp__pkw_global(w, "_codecs", "encode");
        if (rc == DCP_OK)
            rc = dcp__pkw_put(w, NULL);
        if (rc == DCP_OK)
            rc = latin1_to_utf8((const uint8_t *)v->u.s.p, v->u.s.len, &tmp);
        if (rc == DCP_OK)
            rc = dcp__pkw_str(w, (const char *)tmp.p, tmp.len);
        dcp__buf_free(&tmp);
        if (rc == DCP_OK)
            rc = dcp__pkw_put(w, NULL);
        if (rc == DCP_OK)
            rc = dcp__pkw_str(w, "latin1", 6);
        if (rc == DCP_OK)
            rc = dcp__pkw_put(w, NULL);
        if (rc == DCP_OK)
            rc = dcp__pkw_tuple(w, 2);
        if (rc == DCP_OK)
            rc = dcp__pkw_put(w, NULL);
        if (rc == DCP_OK)
            rc = dcp__pkw_op(w, PK_OP_REDUCE);
        return rc == DCP_OK ? dcp__pkw_put(w, NULL) : rc;
    case DCP_VALUE_LIST:
        rc = dcp__pkw_empty_list(w);
        if (rc == DCP_OK)
            rc = dcp__pkw_put(w, NULL);
        if (rc == DCP_OK)
            rc = pickle_items(w, v, depth, 1, PK_OP_APPEND, PK_OP_APPENDS);
        return rc;
    case DCP_VALUE_DICT:
        rc = dcp__pkw_empty_dict(w);
        if (rc == DCP_OK)
            rc = dcp__pkw_put(w, NULL);
        if (rc == DCP_OK)
            rc = pickle_items(w, v, depth, 2, PK_OP_SETITEM, PK_OP_SETITEMS);
        return rc;
    case DCP_VALUE_TUPLE:
        if (v->u.seq.n == 0)
            return dcp__pkw_empty_tuple(w);
        if (v->u.seq.n > 3)
            rc = dcp__pkw_mark(w);
        for (i = 0; rc == DCP_OK && i < v->u.seq.n; i++)
            rc = pickle_value(w, v->u.seq.v[i], depth + 1);
        if (rc == DCP_OK)
            rc = dcp__pkw_tuple(w, v->u.seq.n);
        return rc == DCP_OK ? dcp__pkw_put(w, NULL) : rc;
    }
    return DCP_EINVAL;
}

int dcp__value_emit(struct pk_writer *w, const dcp_value *v)
{
    return pickle_value(w, v, 0);
}

int dcp__value_pickle(const dcp_value *v, struct dcp_buf *out)
{
    struct pk_writer w;
    int rc;
    dcp__pk_writer_init(&w, out);
    rc = dcp__pkw_proto(&w);
    if (rc == DCP_OK)
        rc = pickle_value(&w, v, 0);
    if (rc == DCP_OK)
        rc = dcp__pkw_stop(&w);
    dcp__pk_writer_release(&w);
    return rc;
}

/* ----------------------------------------------------- pickle: decode */

static const struct pk_global value_allow[] = {
    {"collections", "OrderedDict"},
    {"_codecs", "encode"},
    {"__builtin__", "bytes"},
    {"builtins", "bytes"},
};

/* Bounds on what one conversion builds: memo references share nodes and
 * strings, so a small pickle could otherwise expand without limit. */
struct conv {
    size_t nodes;
    size_t bytes; /* str and bytes content copied */
    struct dcp_err *err;
    size_t cost;   /* bytes of value built so far (approximate) */
    size_t budget; /* bound on cost, from the pickle's size */
};

#define VALUE_MAX_BYTES ((size_t)1 << 30)

static int conv_bytes(struct conv *c, size_t n)
{
    if (n > VALUE_MAX_BYTES - c->bytes)
        return dcp__err(c->err, DCP_ELIMIT,
                        "value: more than %zu bytes of strings (shared "
                        "references expand)",
                        VALUE_MAX_BYTES);
    c->bytes += n;
    return DCP_OK;
}

static int conv_node(struct conv *c, const struct pk_node *n, int depth,
                     dcp_value **out);

static int conv_seq(struct conv *c, const struct pk_node *n, int depth,
                    dcp_value_type t, dcp_value **out)
{
    dcp_value *v = value_new(t);
    size_t i;
    int rc = DCP_OK;
    if (!v)
        return DCP_ENOMEM;
    for (i = 0; rc == DCP_OK && i < n->u.seq.n; i++) {
        dcp_value *item = NULL;
        rc = conv_node(c, n->u.seq.v[i], depth + 1, &item);
        if (rc == DCP_OK) {
            rc = seq_push(v, item);
            if (rc != DCP_OK)
                dcp_value_free(item);
        }
    }
    if (rc != DCP_OK) {
        dcp_value_free(v);
        return rc;
    }
    *out = v;
    return DCP_OK;
}

static int conv_node(struct conv *c, const struct pk_node *n, int depth,
                     dcp_value **out)
{
    dcp_value *v = NULL;
    *out = NULL;
    if (depth > VALUE_MAX_DEPTH)
        return dcp__err(c->err, DCP_ELIMIT,
                        "value: nesting deeper than %d", VALUE_MAX_DEPTH);
    if (++c->nodes > VALUE_MAX_NODES)
        return dcp__err(c->err, DCP_ELIMIT, "value: more than %zu objects",
                        VALUE_MAX_NODES);
    c->cost += sizeof(dcp_value) +
               (n->kind == PK_STR || n->kind == PK_BYTES ? n->u.s.len : 0);
    if (c->cost > c->budget)
        return dcp__err(c->err, DCP_ELIMIT,
                        "value: shared references expand it beyond %zu bytes",
                        c->budget);
    switch ((enum pk_kind)n->kind) {
    case PK_NONE:
        v = dcp_value_none();
        break;
    case PK_BOOL:
        v = dcp_value_bool(n->u.b);
        break;
    case PK_INT:
        v = dcp_value_int(n->u.i);
        break;
    case PK_FLOAT:
        v = dcp_value_float(n->u.f);
        break;
    case PK_STR:
        if (conv_bytes(c, n->u.s.len) != DCP_OK)
            return c->err ? c->err->code : DCP_ELIMIT;
        v = dcp_value_strn(n->u.s.p, n->u.s.len);
        break;
    case PK_BYTES:
        if (conv_bytes(c, n->u.s.len) != DCP_OK)
            return c->err ? c->err->code : DCP_ELIMIT;
        v = dcp_value_bytes(n->u.s.p, n->u.s.len);
        break;
    case PK_TUPLE:
        return conv_seq(c, n, depth, DCP_VALUE_TUPLE, out);
    case PK_LIST:
        return conv_seq(c, n, depth, DCP_VALUE_LIST, out);
    case PK_DICT:
        return conv_seq(c, n, depth, DCP_VALUE_DICT, out);
    case PK_OBJ:
        /* bytes() with no arguments: protocol 2's empty bytes object. */
        if ((dcp__pk_obj_is(n, "__builtin__", "bytes") ||
             dcp__pk_obj_is(n, "builtins", "bytes")) &&
            n->u.obj.args && n->u.obj.args->kind == PK_TUPLE &&
            n->u.obj.args->u.seq.n == 0 && !n->u.obj.state) {
            v = dcp_value_bytes("", 0);
            break;
        }
        return dcp__err(c->err, DCP_ENOTSUP,
                        "value: object of class '%s.%s' is not a plain value",
                        n->u.obj.callable &&
                                n->u.obj.callable->kind == PK_GLOBAL
                            ? n->u.obj.callable->u.g.module
                            : "?",
                        n->u.obj.callable &&
                                n->u.obj.callable->kind == PK_GLOBAL
                            ? n->u.obj.callable->u.g.name
                            : "?");
    case PK_GLOBAL:
    case PK_PERSID:
        return dcp__err(c->err, DCP_ENOTSUP,
                        "value: a class or persistent reference is not a "
                        "plain value");
    }
    if (!v)
        return dcp__err(c->err, DCP_ENOMEM, "value: out of memory");
    *out = v;
    return DCP_OK;
}

int dcp__value_from_node(const struct pk_node *n, size_t budget[2],
                         dcp_value **out, struct dcp_err *err)
{
    struct conv c = {budget[0], budget[1], err, 0, SIZE_MAX};
    int rc = conv_node(&c, n, 0, out);
    budget[0] = c.nodes;
    budget[1] = c.bytes;
    return rc;
}

/* Whether a pickle the value allow-list refused decodes with the tensor
 * globals added: a torch.save of an object holding tensors. */
static int holds_tensors(const void *p, size_t len)
{
    struct pk_global allow[128];
    const struct pk_global *tg;
    struct pk_arena *arena = NULL;
    struct pk_node *root = NULL;
    size_t nt = dcp__tz_tensor_globals(&tg), i;
    int rc;
    if (nt + DCP_ARRAY_LEN(value_allow) > DCP_ARRAY_LEN(allow))
        return 0;
    for (i = 0; i < nt; i++)
        allow[i] = tg[i];
    for (i = 0; i < DCP_ARRAY_LEN(value_allow); i++)
        allow[nt + i] = value_allow[i];
    rc = dcp__pk_decode(p, len, allow, nt + DCP_ARRAY_LEN(value_allow), NULL,
                        0, &arena, &root, NULL);
    dcp__pk_arena_free(arena);
    return rc == DCP_OK;
}

int dcp__value_unpickle(const void *p, size_t len, dcp_value **out,
                        struct dcp_err *err)
{
    struct pk_arena *arena = NULL;
    struct pk_node *root = NULL;
    struct conv c = {0, 0, err, 0, VALUE_EXPANSION_MIN};
    int rc;
    *out = NULL;
    c.budget += len > (SIZE_MAX - c.budget) / VALUE_EXPANSION
                    ? SIZE_MAX - c.budget
                    : len * VALUE_EXPANSION;
    rc = dcp__pk_decode(p, len, value_allow, DCP_ARRAY_LEN(value_allow), NULL, 0,
                   &arena, &root, err);
    if (rc == DCP_OK)
        rc = conv_node(&c, root, 0, out);
    dcp__pk_arena_free(arena);
    if (rc == DCP_EUNSAFE && holds_tensors(p, len))
        return dcp__err(err, DCP_ENOTSUP,
                        "the value holds torch tensors (a nested state "
                        "saved with flatten_state_dict=False, docs/FORMAT.md "
                        "§9.4): tensors inside a value are not read");
    return rc;
}
