/*
 * .metadata encoding: struct dcp_metadata as a protocol-2 pickle (readable
 * by every Python 3 pickle), with strings and classes memoized, in the
 * object shapes torch itself produces (NEWOBJ + BUILD of the dataclass
 * __dict__, TensorProperties' 5-tuple state, torch.Size by REDUCE).
 */
#include "meta.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "pickle.h"
#include "value.h"
#include "zframe.h"


/*
 * The encoder emits what Python's pickler would for the same objects
 * (protocol 2, strings and classes memoized). At scale almost all of the
 * output is two item kinds repeated millions of times: a
 * ChunkStorageMetadata in a tensor's chunk list and a (MetadataIndex,
 * _StorageInfo) pair in storage_data. Their strings and classes are memoized
 * after the first occurrence, so the encoder remembers the memo indices
 * (struct enc) and writes those items with one reservation and no lookups.
 * The bytes are exactly those the general path would produce.
 */
#define ENC_NONE UINT32_MAX

enum {
    EG_SIZE, /* torch.Size */
    EG_CHUNK,
    EG_MDINDEX,
    EG_SINFO,
    EK_OFFSETS,
    EK_SIZES,
    EK_FQN,
    EK_OFFSET,
    EK_INDEX,
    EK_RELPATH,
    EK_LENGTH,
    E_NSLOTS
};

struct enc {
    struct pk_writer w;
    uint32_t slot[E_NSLOTS];
    uint32_t *ekey; /* per entry: memo index of its key */
    uint32_t *fkey; /* per file: memo index of its name */
    uint32_t layout, memfmt;
    int have_props;
};

static int enc_str(struct enc *x, const char *s, uint32_t *slot)
{
    if (*slot != ENC_NONE)
        return dcp__pkw_get(&x->w, *slot);
    return dcp__pkw_str_memo(&x->w, s, strlen(s), slot);
}

static int enc_glob(struct enc *x, const char *module, const char *name,
                    uint32_t *slot)
{
    if (slot && *slot != ENC_NONE)
        return dcp__pkw_get(&x->w, *slot);
    return dcp__pkw_global_memo(&x->w, module, name, slot);
}

static int enc_key(struct enc *x, const char *s)
{
    return dcp__pkw_str_memo(&x->w, s, strlen(s), NULL);
}

static int enc_size(struct enc *x, const int64_t *v, int n)
{
    int i, rc = enc_glob(x, "torch", "Size", &x->slot[EG_SIZE]);
    if (rc == DCP_OK && n > 3)
        rc = dcp__pkw_mark(&x->w);
    for (i = 0; rc == DCP_OK && i < n; i++)
        rc = dcp__pkw_int(&x->w, v[i]);
    if (rc == DCP_OK)
        rc = dcp__pkw_tuple(&x->w, (size_t)n);
    if (rc == DCP_OK)
        rc = dcp__pkw_tuple(&x->w, 1);
    return rc == DCP_OK ? dcp__pkw_op(&x->w, PK_OP_REDUCE) : rc;
}

/* cls() with an empty __dict__ filled by BUILD: opens the state dict. */
static int enc_obj_open(struct enc *x, const char *module, const char *name,
                        uint32_t *slot)
{
    int rc = enc_glob(x, module, name, slot);
    if (rc == DCP_OK)
        rc = dcp__pkw_empty_tuple(&x->w);
    if (rc == DCP_OK)
        rc = dcp__pkw_op(&x->w, PK_OP_NEWOBJ);
    if (rc == DCP_OK)
        rc = dcp__pkw_empty_dict(&x->w);
    return rc == DCP_OK ? dcp__pkw_mark(&x->w) : rc;
}

static int enc_obj_close(struct enc *x)
{
    int rc = dcp__pkw_op(&x->w, PK_OP_SETITEMS);
    return rc == DCP_OK ? dcp__pkw_op(&x->w, PK_OP_BUILD) : rc;
}

/* ---- raw writers for the fast paths: the caller reserved the room. */

#define ENC_ITEM_MAX 512 /* bytes of one fast item, ndim <= DCP_MAX_NDIM */

static inline uint8_t *raw_get(uint8_t *p, uint32_t idx)
{
    if (idx < 256) {
        p[0] = 'h'; /* BINGET */
        p[1] = (uint8_t)idx;
        return p + 2;
    }
    p[0] = 'j'; /* LONG_BINGET */
    p[1] = (uint8_t)idx;
    p[2] = (uint8_t)(idx >> 8);
    p[3] = (uint8_t)(idx >> 16);
    p[4] = (uint8_t)(idx >> 24);
    return p + 5;
}

/* The same encoding as dcp__pkw_int. */
static inline uint8_t *raw_int(uint8_t *p, int64_t v)
{
    uint64_t u = (uint64_t)v;
    size_t n, i;
    if (v >= 0 && v <= 0xff) {
        p[0] = 'K';
        p[1] = (uint8_t)v;
        return p + 2;
    }
    if (v >= 0 && v <= 0xffff) {
        p[0] = 'M';
        p[1] = (uint8_t)v;
        p[2] = (uint8_t)(v >> 8);
        return p + 3;
    }
    if (v >= INT32_MIN && v <= INT32_MAX) {
        p[0] = 'J';
        for (i = 0; i < 4; i++)
            p[1 + i] = (uint8_t)(u >> (8 * i));
        return p + 5;
    }
    for (n = 8; n > 1; n--) { /* LONG1: shortest two's complement */
        uint8_t top = (uint8_t)(u >> (8 * (n - 1)));
        uint8_t next = (uint8_t)(u >> (8 * (n - 2)));
        if (!((top == 0x00 && !(next & 0x80)) ||
              (top == 0xff && (next & 0x80))))
            break;
    }
    p[0] = 0x8a;
    p[1] = (uint8_t)n;
    for (i = 0; i < n; i++)
        p[2 + i] = (uint8_t)(u >> (8 * i));
    return p + 2 + n;
}

static inline uint8_t *raw_size(uint8_t *p, uint32_t g, const int64_t *v,
                                int n)
{
    int i;
    p = raw_get(p, g);
    if (n > 3)
        *p++ = '(';
    for (i = 0; i < n; i++)
        p = raw_int(p, v[i]);
    *p++ = n == 0 ? ')' : n <= 3 ? (uint8_t)(0x85 + n - 1) : 't';
    *p++ = 0x85; /* TUPLE1 */
    *p++ = 'R';  /* REDUCE */
    return p;
}

static inline uint8_t *raw_obj_open(uint8_t *p, uint32_t g)
{
    p = raw_get(p, g);
    p[0] = ')';
    p[1] = 0x81; /* NEWOBJ */
    p[2] = '}';
    p[3] = '(';
    return p + 4;
}

static inline uint8_t *raw_obj_close(uint8_t *p)
{
    p[0] = 'u'; /* SETITEMS */
    p[1] = 'b'; /* BUILD */
    return p + 2;
}

/* Room for one fast item; returns where to write, or NULL. */
static inline uint8_t *raw_begin(struct enc *x)
{
    struct dcp_buf *o = x->w.out;
    if (o->cap - o->len < ENC_ITEM_MAX &&
        dcp__buf_reserve(o, ENC_ITEM_MAX) != DCP_OK)
        return NULL;
    return o->p + o->len;
}

static void raw_end(struct enc *x, const uint8_t *p)
{
    x->w.out->len = (size_t)(p - x->w.out->p);
}

static int enc_props(struct enc *x, const struct md_entry *e)
{
    struct pk_writer *w = &x->w;
    int rc = enc_glob(x, MD_MOD_DCP, "TensorProperties", NULL);
    if (rc == DCP_OK)
        rc = dcp__pkw_empty_tuple(w);
    if (rc == DCP_OK)
        rc = dcp__pkw_op(w, PK_OP_NEWOBJ);
    if (rc == DCP_OK)
        rc = dcp__pkw_mark(w);
    if (rc == DCP_OK)
        rc = enc_glob(x, "torch", dcp_dtype_name(e->dtype), NULL);
    if (rc != DCP_OK)
        return rc;
    if (x->have_props) {
        rc = dcp__pkw_get(w, x->layout);
        if (rc == DCP_OK)
            rc = dcp__pkw_bool(w, e->requires_grad);
        if (rc == DCP_OK)
            rc = dcp__pkw_get(w, x->memfmt);
    } else {
        rc = enc_glob(x, "torch.serialization", "_get_layout", NULL);
        if (rc == DCP_OK)
            rc = enc_key(x, "torch.strided");
        if (rc == DCP_OK)
            rc = dcp__pkw_tuple(w, 1);
        if (rc == DCP_OK)
            rc = dcp__pkw_op(w, PK_OP_REDUCE);
        if (rc == DCP_OK)
            rc = dcp__pkw_put(w, &x->layout);
        if (rc == DCP_OK)
            rc = dcp__pkw_bool(w, e->requires_grad);
        if (rc == DCP_OK)
            rc = enc_glob(x, MD_MOD_DCP, "_MEM_FORMAT_ENCODING", NULL);
        if (rc == DCP_OK)
            rc = dcp__pkw_int(w, 0);
        if (rc == DCP_OK)
            rc = dcp__pkw_tuple(w, 1);
        if (rc == DCP_OK)
            rc = dcp__pkw_op(w, PK_OP_REDUCE);
        if (rc == DCP_OK)
            rc = dcp__pkw_put(w, &x->memfmt);
        x->have_props = rc == DCP_OK;
    }
    if (rc == DCP_OK)
        rc = dcp__pkw_bool(w, 0); /* pin_memory */
    if (rc == DCP_OK)
        rc = dcp__pkw_op(w, PK_OP_TUPLE);
    return rc == DCP_OK ? dcp__pkw_op(w, PK_OP_BUILD) : rc;
}

/*
 * Containers are filled in batches of ENC_BATCH items, MARK ... SETITEMS
 * (or APPENDS), as Python's pickle does: a reader's stack then never holds
 * more than one batch, whatever the number of chunks (a 4096-rank x
 * 2000-tensor checkpoint has 8 Mi storage_data items). Called before item i;
 * enc_batch_end after the last of n items.
 */
#define ENC_BATCH 1000

static int enc_batch(struct enc *x, size_t i, uint8_t op)
{
    int rc = DCP_OK;
    if (i % ENC_BATCH == 0) {
        if (i)
            rc = dcp__pkw_op(&x->w, op);
        if (rc == DCP_OK)
            rc = dcp__pkw_mark(&x->w);
    }
    return rc;
}

static int enc_batch_end(struct enc *x, size_t n, uint8_t op)
{
    return n ? dcp__pkw_op(&x->w, op) : DCP_OK;
}

/* ChunkStorageMetadata(offsets=Size(..), sizes=Size(..)). */
static int enc_chunk(struct enc *x, const struct md_entry *e,
                     const struct md_chunk *c)
{
    const uint32_t *s = x->slot;
    int rc;
    if (s[EG_CHUNK] != ENC_NONE && s[EK_OFFSETS] != ENC_NONE &&
        s[EK_SIZES] != ENC_NONE && s[EG_SIZE] != ENC_NONE) {
        uint8_t *p = raw_begin(x);
        if (!p)
            return DCP_ENOMEM;
        p = raw_obj_open(p, s[EG_CHUNK]);
        p = raw_get(p, s[EK_OFFSETS]);
        p = raw_size(p, s[EG_SIZE], c->off, e->ndim);
        p = raw_get(p, s[EK_SIZES]);
        p = raw_size(p, s[EG_SIZE], c->size, e->ndim);
        raw_end(x, raw_obj_close(p));
        return DCP_OK;
    }
    rc = enc_obj_open(x, MD_MOD_DCP, "ChunkStorageMetadata", &x->slot[EG_CHUNK]);
    if (rc == DCP_OK)
        rc = enc_str(x, "offsets", &x->slot[EK_OFFSETS]);
    if (rc == DCP_OK)
        rc = enc_size(x, c->off, e->ndim);
    if (rc == DCP_OK)
        rc = enc_str(x, "sizes", &x->slot[EK_SIZES]);
    if (rc == DCP_OK)
        rc = enc_size(x, c->size, e->ndim);
    return rc == DCP_OK ? enc_obj_close(x) : rc;
}

static int enc_tensor_md(struct enc *x, const struct md_entry *e)
{
    size_t i;
    int rc = enc_obj_open(x, MD_MOD_DCP, "TensorStorageMetadata", NULL);
    if (rc == DCP_OK)
        rc = enc_key(x, "properties");
    if (rc == DCP_OK)
        rc = enc_props(x, e);
    if (rc == DCP_OK)
        rc = enc_key(x, "size");
    if (rc == DCP_OK)
        rc = enc_size(x, e->shape, e->ndim);
    if (rc == DCP_OK)
        rc = enc_key(x, "chunks");
    if (rc == DCP_OK)
        rc = dcp__pkw_empty_list(&x->w);
    for (i = 0; rc == DCP_OK && i < e->nchunks; i++) {
        rc = enc_batch(x, i, PK_OP_APPENDS);
        if (rc == DCP_OK)
            rc = enc_chunk(x, e, &e->chunks[i]);
    }
    if (rc == DCP_OK)
        rc = enc_batch_end(x, e->nchunks, PK_OP_APPENDS);
    return rc == DCP_OK ? enc_obj_close(x) : rc;
}

static int enc_state_dict_md(struct enc *x, const struct dcp_metadata *md)
{
    size_t i;
    int rc = enc_key(x, "state_dict_metadata");
    if (rc == DCP_OK)
        rc = dcp__pkw_empty_dict(&x->w);
    for (i = 0; rc == DCP_OK && i < md->n; i++) {
        const struct md_entry *e = &md->e[i];
        rc = enc_batch(x, i, PK_OP_SETITEMS);
        if (rc == DCP_OK)
            rc = dcp__pkw_str_memo(&x->w, e->key, strlen(e->key), &x->ekey[i]);
        if (rc != DCP_OK)
            break;
        if (e->is_tensor) {
            rc = enc_tensor_md(x, e);
        } else {
            rc = enc_glob(x, MD_MOD_DCP, "BytesStorageMetadata", NULL);
            if (rc == DCP_OK)
                rc = dcp__pkw_empty_tuple(&x->w);
            if (rc == DCP_OK)
                rc = dcp__pkw_op(&x->w, PK_OP_NEWOBJ);
        }
    }
    return rc == DCP_OK ? enc_batch_end(x, md->n, PK_OP_SETITEMS) : rc;
}

static int enc_planner_data(struct enc *x, const struct dcp_metadata *md)
{
    size_t i, j;
    int rc = enc_key(x, "planner_data");
    if (rc == DCP_OK)
        rc = dcp__pkw_empty_dict(&x->w);
    for (i = 0; rc == DCP_OK && i < md->n; i++) {
        const struct md_entry *e = &md->e[i];
        rc = enc_batch(x, i, PK_OP_SETITEMS);
        if (rc == DCP_OK)
            rc = enc_str(x, e->key, &x->ekey[i]);
        if (rc == DCP_OK && e->npath > 3)
            rc = dcp__pkw_mark(&x->w);
        for (j = 0; rc == DCP_OK && j < e->npath; j++)
            rc = e->path[j].s ? enc_key(x, e->path[j].s)
                              : dcp__pkw_int(&x->w, e->path[j].i);
        if (rc == DCP_OK && e->npath == 0)
            rc = enc_str(x, e->key, &x->ekey[i]); /* no path: flat */
        if (rc == DCP_OK)
            rc = dcp__pkw_tuple(&x->w, e->npath ? e->npath : 1);
    }
    if (rc == DCP_OK)
        rc = enc_batch_end(x, md->n, PK_OP_SETITEMS);
    /* A planner's data: MD_PDATA_PREFIX + key -> the value, which torch's
     * readers never look up (they look up state keys only). */
    for (i = 0; rc == DCP_OK && i < md->n; i++) {
        const struct md_entry *e = &md->e[i];
        struct dcp_buf k = {NULL, 0, 0};
        if (!e->pdata)
            continue;
        rc = dcp__buf_printf(&k, "%s%s", MD_PDATA_PREFIX, e->key);
        if (rc == DCP_OK)
            rc = dcp__pkw_str(&x->w, (const char *)k.p, k.len);
        dcp__buf_free(&k);
        if (rc == DCP_OK)
            rc = dcp__value_emit(&x->w, e->pdata);
        if (rc == DCP_OK)
            rc = dcp__pkw_op(&x->w, PK_OP_SETITEM);
    }
    return rc;
}

/* MetadataIndex(fqn, offset, index): _StorageInfo(path, offset, length). */
static int enc_storage_item(struct enc *x, const struct dcp_metadata *md,
                            size_t i, size_t j)
{
    const struct md_entry *e = &md->e[i];
    const struct md_chunk *c = &e->chunks[j];
    const uint32_t *s = x->slot;
    int k, rc;
    for (k = EG_SIZE; k < E_NSLOTS; k++)
        if (s[k] == ENC_NONE)
            break;
    if (k == E_NSLOTS && x->ekey[i] != ENC_NONE &&
        x->fkey[c->file] != ENC_NONE && c->xform == MD_XFORM_NONE) {
        uint8_t *p = raw_begin(x);
        if (!p)
            return DCP_ENOMEM;
        p = raw_obj_open(p, s[EG_MDINDEX]);
        p = raw_get(p, s[EK_FQN]);
        p = raw_get(p, x->ekey[i]);
        if (e->is_tensor) {
            p = raw_get(p, s[EK_OFFSET]);
            p = raw_size(p, s[EG_SIZE], c->off, e->ndim);
        }
        p = raw_get(p, s[EK_INDEX]);
        if (e->is_tensor)
            p = raw_int(p, (int64_t)j);
        else
            *p++ = 'N';
        p = raw_obj_close(p);
        p = raw_obj_open(p, s[EG_SINFO]);
        p = raw_get(p, s[EK_RELPATH]);
        p = raw_get(p, x->fkey[c->file]);
        p = raw_get(p, s[EK_OFFSET]);
        p = raw_int(p, (int64_t)c->offset);
        p = raw_get(p, s[EK_LENGTH]);
        p = raw_int(p, (int64_t)c->length);
        raw_end(x, raw_obj_close(p));
        return DCP_OK;
    }
    /* The MetadataIndex key is fully built (BUILD) before SETITEMS hashes
     * it. */
    rc = enc_obj_open(x, MD_MOD_DCP, "MetadataIndex", &x->slot[EG_MDINDEX]);
    if (rc == DCP_OK)
        rc = enc_str(x, "fqn", &x->slot[EK_FQN]);
    if (rc == DCP_OK)
        rc = enc_str(x, e->key, &x->ekey[i]);
    if (rc == DCP_OK && e->is_tensor) {
        rc = enc_str(x, "offset", &x->slot[EK_OFFSET]);
        if (rc == DCP_OK)
            rc = enc_size(x, c->off, e->ndim);
    }
    if (rc == DCP_OK)
        rc = enc_str(x, "index", &x->slot[EK_INDEX]);
    if (rc == DCP_OK)
        rc = e->is_tensor ? dcp__pkw_int(&x->w, (int64_t)j) : dcp__pkw_none(&x->w);
    if (rc == DCP_OK)
        rc = enc_obj_close(x);
    if (rc == DCP_OK)
        rc = enc_obj_open(x, MD_MOD_FS, "_StorageInfo", &x->slot[EG_SINFO]);
    if (rc == DCP_OK)
        rc = enc_str(x, "relative_path", &x->slot[EK_RELPATH]);
    if (rc == DCP_OK)
        rc = enc_str(x, md->files[c->file], &x->fkey[c->file]);
    if (rc == DCP_OK)
        rc = enc_str(x, "offset", &x->slot[EK_OFFSET]);
    if (rc == DCP_OK)
        rc = dcp__pkw_int(&x->w, (int64_t)c->offset);
    if (rc == DCP_OK)
        rc = enc_str(x, "length", &x->slot[EK_LENGTH]);
    if (rc == DCP_OK)
        rc = dcp__pkw_int(&x->w, (int64_t)c->length);
    /* A transformed record (docs/FORMAT.md §9.1), as torch writes it:
     * transform_descriptors: ["stream.zstd/1"]. */
    if (rc == DCP_OK && c->xform == MD_XFORM_ZSTD) {
        rc = enc_key(x, "transform_descriptors");
        if (rc == DCP_OK)
            rc = dcp__pkw_empty_list(&x->w);
        if (rc == DCP_OK)
            rc = enc_key(x, ZSTD_DESCRIPTOR);
        if (rc == DCP_OK)
            rc = dcp__pkw_op(&x->w, PK_OP_APPEND);
    }
    return rc == DCP_OK ? enc_obj_close(x) : rc;
}

static int enc_storage_data(struct enc *x, const struct dcp_metadata *md)
{
    size_t i, j, item = 0;
    int rc = enc_key(x, "storage_data");
    if (rc == DCP_OK)
        rc = dcp__pkw_empty_dict(&x->w);
    for (i = 0; rc == DCP_OK && i < md->n; i++) {
        for (j = 0; rc == DCP_OK && j < md->e[i].nchunks; j++) {
            if (md->e[i].chunks[j].file >= md->nfiles)
                return DCP_EINVAL;
            rc = enc_batch(x, item++, PK_OP_SETITEMS);
            if (rc == DCP_OK)
                rc = enc_storage_item(x, md, i, j);
        }
    }
    return rc == DCP_OK ? enc_batch_end(x, item, PK_OP_SETITEMS) : rc;
}

static int enc_storage_meta(struct enc *x, const struct dcp_metadata *md)
{
    int rc = enc_key(x, "storage_meta");
    if (rc == DCP_OK)
        rc = enc_obj_open(x, MD_MOD_DCP, "StorageMeta", NULL);
    if (rc == DCP_OK)
        rc = enc_key(x, "checkpoint_id");
    if (rc == DCP_OK)
        rc = md->checkpoint_id ? enc_key(x, md->checkpoint_id)
                               : dcp__pkw_none(&x->w);
    if (rc == DCP_OK)
        rc = enc_key(x, "save_id");
    if (rc == DCP_OK)
        rc = md->save_id ? enc_key(x, md->save_id) : dcp__pkw_none(&x->w);
    if (rc == DCP_OK)
        rc = enc_key(x, "load_id");
    if (rc == DCP_OK)
        rc = dcp__pkw_none(&x->w);
    if (rc == DCP_OK)
        rc = enc_key(x, "modules");
    if (rc == DCP_OK)
        rc = dcp__pkw_empty_list(&x->w);
    return rc == DCP_OK ? enc_obj_close(x) : rc;
}

/*
 * An upper bound of the encoding's size. Reserved at once, the output
 * never moves: grown by doubling, 887 MiB of .metadata (8 Mi chunks) was
 * copied and faulted in about twice over. Pages not written stay virtual.
 * Per chunk: a ChunkStorageMetadata of at most 39 + 20 * ndim bytes and a
 * storage_data item of at most 110 + 10 * ndim (a GET is at most 5 bytes,
 * an int 10), and a batch mark; per entry, its strings and a few hundred
 * bytes of objects.
 */
static size_t enc_bound(const struct dcp_metadata *md)
{
    size_t n = 4096, i, j;
    n += md->checkpoint_id ? strlen(md->checkpoint_id) : 0;
    n += md->save_id ? strlen(md->save_id) : 0;
    n += md->version ? strlen(md->version) : 0;
    for (i = 0; i < md->nfiles; i++)
        n += strlen(md->files[i]) + 16;
    for (i = 0; i < md->n; i++) {
        const struct md_entry *e = &md->e[i];
        n += 3 * strlen(e->key) + 1024 +
             e->nchunks * (152 + 30 * (size_t)e->ndim);
        for (j = 0; j < e->npath; j++)
            n += (e->path[j].s ? strlen(e->path[j].s) : 0) + 16;
    }
    return n;
}

int dcp__meta_encode(const struct dcp_metadata *md, struct dcp_buf *out)
{
    struct enc x;
    size_t i;
    int rc;
    /* Only a hint: without it the output grows as it goes. */
    (void)dcp__buf_reserve(out, enc_bound(md));
    memset(&x, 0, sizeof(x));
    for (i = 0; i < E_NSLOTS; i++)
        x.slot[i] = ENC_NONE;
    x.ekey = dcp__malloc((md->n ? md->n : 1) * sizeof(*x.ekey));
    x.fkey = dcp__malloc((md->nfiles ? md->nfiles : 1) * sizeof(*x.fkey));
    if (!x.ekey || !x.fkey) {
        dcp__free(x.ekey);
        dcp__free(x.fkey);
        return DCP_ENOMEM;
    }
    for (i = 0; i < md->n; i++)
        x.ekey[i] = ENC_NONE;
    for (i = 0; i < md->nfiles; i++)
        x.fkey[i] = ENC_NONE;
    dcp__pk_writer_init(&x.w, out);
    rc = dcp__pkw_proto(&x.w);
    if (rc == DCP_OK)
        rc = enc_obj_open(&x, MD_MOD_DCP, "Metadata", NULL);
    if (rc == DCP_OK)
        rc = enc_state_dict_md(&x, md);
    if (rc == DCP_OK)
        rc = enc_planner_data(&x, md);
    if (rc == DCP_OK)
        rc = enc_storage_data(&x, md);
    if (rc == DCP_OK)
        rc = enc_storage_meta(&x, md);
    if (rc == DCP_OK)
        rc = enc_key(&x, "version");
    if (rc == DCP_OK)
        rc = enc_key(&x, md->version && *md->version ? md->version
                                                     : "1.0.0");
    if (rc == DCP_OK)
        rc = enc_obj_close(&x);
    if (rc == DCP_OK)
        rc = dcp__pkw_stop(&x.w);
    dcp__pk_writer_release(&x.w);
    dcp__free(x.ekey);
    dcp__free(x.fkey);
    return rc;
}

