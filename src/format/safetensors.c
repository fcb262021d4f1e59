/*
 * safetensors headers: hostile parsing and writing (see safetensors.h).
 * The data buffer itself is never read here: callers read tensor bytes at
 * data_off + begin with their own bounded buffers.
 */
#include "safetensors.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype.h"
#include "json.h"
#include "storage.h"

#define SF_MAX_NODES ((size_t)1 << 22)

/* safetensors dtypes dcp does not hold (the others come from the one dtype
 * table, common/dtype.c): named in a DCP_ENOTSUP message. F4 is one 4-bit
 * float per element, which is not torch's two-per-byte float4_e2m1fn_x2. */
static const char *const sf_unsupported[] = {"F4", "F6_E2M3", "F6_E3M2"};

const char *dcp__sf_dtype_name(dcp_dtype dt)
{
    return dcp__dtype_st_name(dt);
}

void dcp__sf_release(struct sf_file *f)
{
    size_t i;
    if (!f)
        return;
    for (i = 0; i < f->n; i++)
        dcp__free(f->t[i].name);
    dcp__free(f->t);
    for (i = 0; i < 2 * f->nmeta; i++)
        dcp__free(f->meta[i]);
    dcp__free(f->meta);
    memset(f, 0, sizeof(*f));
}

static int parse_dtype(const struct json_node *n, const char *name,
                       dcp_dtype *out, struct dcp_err *err)
{
    size_t i;
    if (!n || n->kind != JSON_STR)
        return dcp__err(err, DCP_EFORMAT,
                        "safetensors: tensor '%s' has no dtype string", name);
    if (dcp__dtype_from_st_name(n->s, out))
        return DCP_OK;
    for (i = 0; i < DCP_ARRAY_LEN(sf_unsupported); i++)
        if (strcmp(n->s, sf_unsupported[i]) == 0)
            return dcp__err(err, DCP_ENOTSUP,
                            "safetensors: tensor '%s' has dtype %s, which "
                            "dcp does not support",
                            name, n->s);
    return dcp__err(err, DCP_EFORMAT,
                    "safetensors: tensor '%s' has unknown dtype '%.32s'", name,
                    n->s);
}

static int parse_tensor(const struct json_node *key, const struct json_node *v,
                        struct sf_tensor *t, struct dcp_err *err)
{
    const struct json_node *shape, *offs;
    const char *dup;
    uint64_t numel = 1, nbytes;
    size_t d;
    int rc;
    if (v->kind != JSON_OBJ)
        return dcp__err(err, DCP_EFORMAT,
                        "safetensors: entry '%s' at byte %zu is not an object",
                        key->s, v->off);
    /* The safetensors library refuses a field given twice; taking the
     * first (or the last) would read the file differently from it. */
    dup = dcp__json_dup_key(v);
    if (dup)
        return dcp__err(err, DCP_EFORMAT,
                        "safetensors: tensor '%s' has field '%.32s' twice",
                        key->s, dup);
    rc = parse_dtype(dcp__json_get(v, "dtype"), key->s, &t->dtype, err);
    if (rc != DCP_OK)
        return rc;
    shape = dcp__json_get(v, "shape");
    offs = dcp__json_get(v, "data_offsets");
    if (!shape || shape->kind != JSON_ARR)
        return dcp__err(err, DCP_EFORMAT,
                        "safetensors: tensor '%s' has no shape array", key->s);
    if (shape->len > DCP_MAX_NDIM)
        return dcp__err(err, DCP_ELIMIT,
                        "safetensors: tensor '%s' has %zu dimensions (limit "
                        "%d)",
                        key->s, shape->len, DCP_MAX_NDIM);
    t->ndim = (int)shape->len;
    for (d = 0; d < shape->len; d++) {
        const struct json_node *x = shape->v[d];
        if (x->kind != JSON_NUM || !x->is_int || x->i < 0)
            return dcp__err(err, DCP_EFORMAT,
                            "safetensors: tensor '%s': shape element %zu is "
                            "not a non-negative integer",
                            key->s, d);
        t->shape[d] = x->i;
        if (dcp__mul_overflow_u64(numel, (uint64_t)x->i, &numel))
            return dcp__err(err, DCP_EFORMAT,
                            "safetensors: tensor '%s': element count "
                            "overflows",
                            key->s);
    }
    if (!offs || offs->kind != JSON_ARR || offs->len != 2 ||
        offs->v[0]->kind != JSON_NUM || !offs->v[0]->is_int ||
        offs->v[1]->kind != JSON_NUM || !offs->v[1]->is_int ||
        offs->v[0]->i < 0 || offs->v[1]->i < offs->v[0]->i)
        return dcp__err(err, DCP_EFORMAT,
                        "safetensors: tensor '%s' has bad data_offsets "
                        "(want [begin, end], 0 <= begin <= end)",
                        key->s);
    t->begin = (uint64_t)offs->v[0]->i;
    t->end = (uint64_t)offs->v[1]->i;
    if (dcp__mul_overflow_u64(numel, dcp_dtype_size(t->dtype), &nbytes))
        return dcp__err(err, DCP_EFORMAT,
                        "safetensors: tensor '%s': its dtype and shape need "
                        "more than 2^64 bytes",
                        key->s);
    if (nbytes != t->end - t->begin)
        return dcp__err(err, DCP_EFORMAT,
                        "safetensors: tensor '%s': data_offsets [%" PRIu64
                        ", %" PRIu64 ") hold %" PRIu64
                        " bytes, its dtype and shape need %" PRIu64,
                        key->s, t->begin, t->end, t->end - t->begin, nbytes);
    return DCP_OK;
}

static int parse_meta(const struct json_node *m, struct sf_file *f,
                      struct dcp_err *err)
{
    const char *dup;
    size_t i;
    if (m->kind != JSON_OBJ)
        return dcp__err(err, DCP_EFORMAT,
                        "safetensors: __metadata__ is not an object");
    dup = dcp__json_dup_key(m);
    if (dup)
        return dcp__err(err, DCP_EFORMAT,
                        "safetensors: __metadata__ has key '%.64s' twice", dup);
    f->meta = dcp__calloc(2 * m->len + 1, sizeof(char *));
    if (!f->meta)
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    for (i = 0; i < m->len; i++) {
        const struct json_node *k = json_key(m, i), *v = json_val(m, i);
        if (v->kind != JSON_STR)
            return dcp__err(err, DCP_EFORMAT,
                            "safetensors: __metadata__ value of '%s' is not "
                            "a string",
                            k->s);
        f->meta[2 * i] = dcp__strndup(k->s, k->len);
        f->meta[2 * i + 1] = dcp__strndup(v->s, v->len);
        f->nmeta = i + 1;
        if (!f->meta[2 * i] || !f->meta[2 * i + 1])
            return dcp__err(err, DCP_ENOMEM, "out of memory");
    }
    return DCP_OK;
}

static int cmp_begin(const void *a, const void *b)
{
    const struct sf_tensor *x = *(const struct sf_tensor *const *)a;
    const struct sf_tensor *y = *(const struct sf_tensor *const *)b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* The ranges must tile [0, data_len) exactly. */
static int check_layout(const struct sf_file *f, uint64_t data_len,
                        struct dcp_err *err)
{
    const struct sf_tensor **o;
    uint64_t pos = 0;
    size_t i;
    int rc = DCP_OK;
    o = dcp__malloc((f->n ? f->n : 1) * sizeof(*o));
    if (!o)
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    for (i = 0; i < f->n; i++)
        o[i] = &f->t[i];
    qsort((void *)o, f->n, sizeof(*o), cmp_begin);
    for (i = 0; rc == DCP_OK && i < f->n; i++) {
        if (o[i]->begin > pos)
            rc = dcp__err(
                err, DCP_EFORMAT,
                "safetensors: gap of %" PRIu64
                " bytes before tensor '%s' (data_offsets begin %" PRIu64 ")",
                o[i]->begin - pos, o[i]->name, o[i]->begin);
        else if (o[i]->begin < pos)
            rc = dcp__err(err, DCP_EFORMAT,
                          "safetensors: tensor '%s' (data_offsets [%" PRIu64
                          ", %" PRIu64 ")) overlaps the one before it",
                          o[i]->name, o[i]->begin, o[i]->end);
        pos = o[i]->end;
    }
    if (rc == DCP_OK && pos > data_len)
        rc = dcp__err(err, DCP_ECORRUPT,
                      "safetensors: the tensors need %" PRIu64
                      " data bytes, the file has %" PRIu64 ": truncated",
                      pos, data_len);
    else if (rc == DCP_OK && pos < data_len)
        rc = dcp__err(err, DCP_EFORMAT,
                      "safetensors: %" PRIu64
                      " bytes after the last tensor's data",
                      data_len - pos);
    dcp__free((void *)o);
    return rc;
}

static int parse_members(const struct json_node *root, struct sf_file *f,
                         struct dcp_err *err)
{
    size_t i;
    int rc = DCP_OK;
    f->t = dcp__calloc(root->len ? root->len : 1, sizeof(*f->t));
    if (!f->t)
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    for (i = 0; rc == DCP_OK && i < root->len; i++) {
        const struct json_node *k = json_key(root, i), *v = json_val(root, i);
        struct sf_tensor *t;
        if (strcmp(k->s, "__metadata__") == 0 && k->len == 12) {
            rc = parse_meta(v, f, err);
            continue;
        }
        if (k->len == 0 || strlen(k->s) != k->len)
            return dcp__err(err, DCP_EFORMAT,
                            "safetensors: tensor name at byte %zu is empty "
                            "or contains a NUL",
                            k->off);
        t = &f->t[f->n];
        t->name = dcp__strndup(k->s, k->len);
        if (!t->name)
            return dcp__err(err, DCP_ENOMEM, "out of memory");
        f->n++;
        rc = parse_tensor(k, v, t, err);
    }
    return rc;
}

int dcp__sf_parse_header(const void *hdr, size_t n, uint64_t file_size,
                    struct sf_file *f, struct dcp_err *err)
{
    struct json_doc *doc = NULL;
    struct json_node *root = NULL;
    const char *dup;
    int rc;
    memset(f, 0, sizeof(*f));
    if (n > SF_MAX_HEADER || file_size < 8 || n > file_size - 8)
        return dcp__err(err, DCP_EFORMAT,
                        "safetensors: header of %zu bytes does not fit a "
                        "file of %" PRIu64 " bytes",
                        n, file_size);
    f->data_off = 8 + (uint64_t)n;
    f->file_size = file_size;
    /* Every JSON value takes at least 2 bytes; the cap keeps a hostile
     * 100 MB header of tiny values below 256 MiB of nodes (2^22 values are
     * some 300,000 tensors). */
    rc = dcp__json_parse(hdr, n, 8,
                    n / 2 + 16 < SF_MAX_NODES ? n / 2 + 16 : SF_MAX_NODES, &doc,
                    &root, err);
    if (rc != DCP_OK) {
        (void)dcp__err_prefix(err, "safetensors header");
        return rc;
    }
    if (root->kind != JSON_OBJ) {
        rc = dcp__err(err, DCP_EFORMAT,
                      "safetensors: the header is not a JSON object");
        goto out;
    }
    dup = dcp__json_dup_key(root);
    if (dup) {
        rc = dcp__err(err, DCP_EFORMAT,
                      "safetensors: tensor '%s' is named twice in the header",
                      dup);
        goto out;
    }
    rc = parse_members(root, f, err);
    if (rc == DCP_OK)
        rc = check_layout(f, file_size - f->data_off, err);
out:
    dcp__json_free(doc);
    if (rc != DCP_OK)
        dcp__sf_release(f);
    return rc;
}

int dcp__sf_read(int fd, const char *name, uint64_t size, struct sf_file *f,
            struct dcp_err *err)
{
    uint8_t pre[8], *hdr;
    uint64_t n;
    int rc;
    memset(f, 0, sizeof(*f));
    if (size < 8)
        return dcp__err(err, DCP_EFORMAT,
                        "'%s': %" PRIu64 " bytes is too short for a "
                        "safetensors file",
                        name, size);
    rc = dcp__fs_pread(fd, pre, 8, 0, name, err);
    if (rc != DCP_OK)
        return rc;
    n = dcp__le64(pre);
    if (n > SF_MAX_HEADER || n > size - 8)
        return dcp__err(err, DCP_EFORMAT,
                        "'%s': safetensors header length %" PRIu64
                        " exceeds the file (%" PRIu64
                        " bytes) or the limit (%" PRIu64 ")",
                        name, n, size, SF_MAX_HEADER);
    hdr = dcp__malloc(n ? (size_t)n : 1);
    if (!hdr)
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    rc = dcp__fs_pread(fd, hdr, (size_t)n, 8, name, err);
    if (rc == DCP_OK)
        rc = dcp__sf_parse_header(hdr, (size_t)n, size, f, err);
    dcp__free(hdr);
    if (rc != DCP_OK)
        (void)dcp__err_prefix(err, "'%s'", name);
    return rc;
}

int dcp__sf_header_build(const struct sf_out *t, size_t n, const char *const *meta,
                    size_t nmeta, struct dcp_buf *out, uint64_t *data_len)
{
    struct dcp_buf j = {0};
    uint64_t pos = 0, nbytes;
    size_t i, start = out->len;
    char shape[DCP_SHAPE_TEXT_MAX];
    int rc;
    rc = dcp__buf_put_u8(&j, '{');
    if (rc == DCP_OK && nmeta) {
        rc = dcp__buf_printf(&j, "\"__metadata__\":{");
        for (i = 0; rc == DCP_OK && i < nmeta; i++) {
            if (i)
                rc = dcp__buf_put_u8(&j, ',');
            if (rc == DCP_OK)
                rc = dcp__json_put_str(&j, meta[2 * i], strlen(meta[2 * i]));
            if (rc == DCP_OK)
                rc = dcp__buf_put_u8(&j, ':');
            if (rc == DCP_OK)
                rc = dcp__json_put_str(&j, meta[2 * i + 1], strlen(meta[2 * i + 1]));
        }
        if (rc == DCP_OK)
            rc = dcp__buf_put_u8(&j, '}');
    }
    for (i = 0; rc == DCP_OK && i < n; i++) {
        const char *dn = dcp__sf_dtype_name(t[i].dtype);
        if (!dn)
            rc = DCP_EINVAL;
        if (rc == DCP_OK && (i || nmeta))
            rc = dcp__buf_put_u8(&j, ',');
        if (rc == DCP_OK)
            rc = dcp__json_put_str(&j, t[i].name, strlen(t[i].name));
        if (rc == DCP_OK)
            rc = dcp_shape_format(shape, sizeof(shape), t[i].ndim, t[i].shape);
        nbytes =
            dcp__box_numel(t[i].ndim, t[i].shape) * dcp_dtype_size(t[i].dtype);
        if (rc == DCP_OK)
            rc = dcp__buf_printf(&j,
                                 ":{\"dtype\":\"%s\",\"shape\":%s,"
                                 "\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}",
                                 dn, shape, pos, pos + nbytes);
        pos += nbytes;
    }
    if (rc == DCP_OK)
        rc = dcp__buf_put_u8(&j, '}');
    while (rc == DCP_OK && j.len % 8 != 0)
        rc = dcp__buf_put_u8(&j, ' ');
    if (rc == DCP_OK)
        rc = dcp__buf_put_le64(out, j.len);
    if (rc == DCP_OK)
        rc = dcp__buf_put(out, j.p, j.len);
    if (rc != DCP_OK)
        out->len = start;
    else if (data_len)
        *data_len = pos;
    dcp__buf_free(&j);
    return rc;
}
