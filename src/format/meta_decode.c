/*
 * .metadata decoding: PyTorch's pickled Metadata object into struct
 * dcp_metadata, validated.
 *
 * Decoding runs the safe pickle decoder with an allow-list of exactly the
 * classes DCP's FileSystemWriter pickles (and their older module paths),
 * then walks the resulting tree with explicit type checks; a tree of the
 * wrong shape is DCP_EFORMAT naming what was expected. Nothing is executed.
 * The layout dcp writes itself is decoded first by the fast path
 * (meta_fast.c), which declines anything else.
 */
#include "meta.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "pickle.h"
#include "value.h"
#include "text.h"
#include "zframe.h"



static const struct pk_global meta_allow[] = {
    {MD_MOD_DCP, "Metadata"},
    {MD_MOD_DCP, "TensorStorageMetadata"},
    {MD_MOD_DCP, "BytesStorageMetadata"},
    {MD_MOD_DCP, "ChunkStorageMetadata"},
    {MD_MOD_DCP, "TensorProperties"},
    {MD_MOD_DCP, "StorageMeta"},
    {MD_MOD_DCP, "MetadataIndex"},
    {MD_MOD_DCP, "_MEM_FORMAT_ENCODING"},
    {MD_MOD_OLD, "TensorProperties"},
    {MD_MOD_OLD, "MEM_FORMAT_ENCODING"},
    {MD_MOD_FS, "_StorageInfo"},
    {"torch", "Size"},
    {"torch.serialization", "_get_layout"},
    {"torch", "strided"},
    {"torch", "sparse_coo"},
    {"torch", "contiguous_format"},
    {"torch", "channels_last"},
    {"torch", "preserve_format"},
    {"collections", "OrderedDict"},
    {"pathlib", "PosixPath"},
    {"pathlib", "WindowsPath"},
    {"pathlib", "PurePosixPath"},
    {"pathlib", "PureWindowsPath"},
    {"pathlib", "Path"},
    {"pathlib._local", "PosixPath"},
    {"pathlib._local", "WindowsPath"},
    {"pathlib._local", "PurePosixPath"},
    {"pathlib._local", "PureWindowsPath"},
    {"pathlib._local", "Path"},
    /* dtypes: the supported ones, and others so they can be named in a
     * DCP_ENOTSUP message instead of being called unsafe */
    {"torch", "float64"},
    {"torch", "float32"},
    {"torch", "float16"},
    {"torch", "bfloat16"},
    {"torch", "float8_e4m3fn"},
    {"torch", "float8_e5m2"},
    {"torch", "int64"},
    {"torch", "int32"},
    {"torch", "int16"},
    {"torch", "int8"},
    {"torch", "uint8"},
    {"torch", "bool"},
    {"torch", "complex32"},
    {"torch", "complex64"},
    {"torch", "complex128"},
    {"torch", "uint16"},
    {"torch", "uint32"},
    {"torch", "uint64"},
    {"torch", "float8_e4m3fnuz"},
    {"torch", "float8_e5m2fnuz"},
    {"torch", "float8_e8m0fnu"},
    {"torch", "float4_e2m1fn_x2"},
    {"torch", "qint8"},
    {"torch", "quint8"},
    {"torch", "qint32"},
};

static int is_class(const struct pk_node *n, const char *name)
{
    return n && n->kind == PK_OBJ &&
           (dcp__pk_obj_is(n, MD_MOD_DCP, name) || dcp__pk_obj_is(n, MD_MOD_OLD, name) ||
            dcp__pk_obj_is(n, MD_MOD_FS, name));
}

/* A str as a C string; NULL for another kind or a str holding a NUL,
 * which a C string would cut short (a key, a data file name). */
static const char *str_of(const struct pk_node *n)
{
    return n && n->kind == PK_STR && !memchr(n->u.s.p, '\0', n->u.s.len)
               ? n->u.s.p
               : NULL;
}

/* torch.Size((a, b, ...)) or a plain tuple/list of ints. */
static int get_ints(const struct pk_node *n, int64_t *out, int *ndim)
{
    const struct pk_node *t = n;
    size_t i;
    if (!n)
        return DCP_EFORMAT;
    if (n->kind == PK_OBJ) {
        if (!dcp__pk_obj_is(n, "torch", "Size") || !n->u.obj.args ||
            n->u.obj.args->kind != PK_TUPLE || n->u.obj.args->u.seq.n != 1)
            return DCP_EFORMAT;
        t = n->u.obj.args->u.seq.v[0];
    }
    if (t->kind != PK_TUPLE && t->kind != PK_LIST)
        return DCP_EFORMAT;
    if (t->u.seq.n > DCP_MAX_NDIM)
        return DCP_ELIMIT;
    for (i = 0; i < t->u.seq.n; i++) {
        if (t->u.seq.v[i]->kind != PK_INT)
            return DCP_EFORMAT;
        out[i] = t->u.seq.v[i]->u.i;
    }
    *ndim = (int)t->u.seq.n;
    return DCP_OK;
}

static int get_u64(const struct pk_node *n, uint64_t *out)
{
    if (!n || n->kind != PK_INT || n->u.i < 0)
        return DCP_EFORMAT;
    *out = (uint64_t)n->u.i;
    return DCP_OK;
}

struct walk {
    struct dcp_metadata *md;
    struct dcp_err *err;
    struct dcp_htab ftab; /* md->files by name */
    /* Memo references let a small pickle name one big list many times;
     * a real chunk costs at least this many bytes of pickle. */
    uint64_t chunks_left;
};

static int walk_props(struct walk *w, const char *key,
                      const struct pk_node *props, struct md_entry *e)
{
    const struct pk_node *st, *dt = NULL, *rg = NULL;
    if (!is_class(props, "TensorProperties"))
        return dcp__err(w->err, DCP_EFORMAT,
                        "metadata: '%s': properties is not TensorProperties",
                        key);
    st = props->u.obj.state;
    if (st && st->kind == PK_TUPLE && st->u.seq.n >= 1) {
        dt = st->u.seq.v[0];
        rg = st->u.seq.n >= 3 ? st->u.seq.v[2] : NULL;
    } else if (st && st->kind == PK_DICT) {
        dt = dcp__pk_dict_get(st, "dtype");
        rg = dcp__pk_dict_get(st, "requires_grad");
    }
    if (!dt || dt->kind != PK_GLOBAL || strcmp(dt->u.g.module, "torch") != 0)
        return dcp__err(w->err, DCP_EFORMAT,
                        "metadata: '%s': missing or bad dtype", key);
    /* A dtype dcp cannot read is refused for its key only (walk_root
     * sets the entry apart): the checkpoint's other keys stay readable. */
    if (dcp_dtype_from_name(dt->u.g.name, &e->dtype) != DCP_OK) {
        e->dtype = (dcp_dtype)0;
        if (!(e->unsup = dcp__strdup(dt->u.g.name)))
            return DCP_ENOMEM;
    }
    e->requires_grad = rg && rg->kind == PK_BOOL && rg->u.b;
    return DCP_OK;
}

static int walk_chunks(struct walk *w, struct md_entry *e,
                       const struct pk_node *list)
{
    size_t i, n;
    int d;
    if (!list || list->kind != PK_LIST)
        return dcp__err(w->err, DCP_EFORMAT,
                        "metadata: '%s': chunks is not a list", e->key);
    n = list->u.seq.n;
    if (n > w->chunks_left)
        return dcp__err(w->err, DCP_ELIMIT,
                        "metadata: '%s': more chunks than the file can hold "
                        "(shared references)",
                        e->key);
    w->chunks_left -= n;
    e->chunks = dcp__calloc(n ? n : 1, sizeof(*e->chunks));
    if (!e->chunks)
        return DCP_ENOMEM;
    e->nchunks = n;
    for (i = 0; i < n; i++) {
        const struct pk_node *c = list->u.seq.v[i];
        struct md_chunk *mc = &e->chunks[i];
        int64_t *ints;
        int nd1 = -1, nd2 = -1;
        if (!is_class(c, "ChunkStorageMetadata") || !c->u.obj.state)
            return dcp__err(w->err, DCP_EFORMAT,
                            "metadata: '%s': chunk %zu is not "
                            "ChunkStorageMetadata",
                            e->key, i);
        ints = dcp__calloc(2 * (size_t)(e->ndim ? e->ndim : 1),
                           sizeof(int64_t));
        if (!ints)
            return DCP_ENOMEM;
        mc->off = ints;
        mc->size = ints + (e->ndim ? e->ndim : 1);
        if (get_ints(dcp__pk_obj_attr(c, "offsets"), mc->off, &nd1) != DCP_OK ||
            get_ints(dcp__pk_obj_attr(c, "sizes"), mc->size, &nd2) != DCP_OK ||
            nd1 != e->ndim || nd2 != e->ndim)
            return dcp__err(w->err, DCP_EFORMAT,
                            "metadata: '%s': chunk %zu has bad offsets or "
                            "sizes",
                            e->key, i);
        for (d = 0; d < e->ndim; d++) {
            int64_t end;
            if (mc->off[d] < 0 || mc->size[d] < 0 ||
                dcp__add_overflow_i64(mc->off[d], mc->size[d], &end) ||
                end > e->shape[d])
                return dcp__err(w->err, DCP_EFORMAT,
                                "metadata: '%s': chunk %zu lies outside the "
                                "global shape (dim %d)",
                                e->key, i, d);
        }
    }
    return DCP_OK;
}

static int walk_entry(struct walk *w, struct md_entry *e,
                      const struct pk_node *obj)
{
    uint64_t bytes, t;
    int d, rc;
    if (is_class(obj, "BytesStorageMetadata")) {
        e->chunks = dcp__calloc(1, sizeof(*e->chunks));
        if (!e->chunks)
            return DCP_ENOMEM;
        e->nchunks = 1;
        return DCP_OK;
    }
    if (!is_class(obj, "TensorStorageMetadata") || !obj->u.obj.state)
        return dcp__err(w->err, DCP_EFORMAT,
                        "metadata: '%s': unknown storage metadata class",
                        e->key);
    e->is_tensor = 1;
    rc = walk_props(w, e->key, dcp__pk_obj_attr(obj, "properties"), e);
    if (rc != DCP_OK)
        return rc;
    rc = get_ints(dcp__pk_obj_attr(obj, "size"), e->shape, &e->ndim);
    if (rc != DCP_OK)
        return dcp__err(w->err, rc, "metadata: '%s': bad size", e->key);
    bytes = dcp_dtype_size(e->dtype);
    for (d = 0; d < e->ndim; d++) {
        if (e->shape[d] < 0 ||
            dcp__mul_overflow_u64(bytes, (uint64_t)e->shape[d], &t) ||
            t > (uint64_t)INT64_MAX)
            return dcp__err(w->err, DCP_EFORMAT,
                            "metadata: '%s': bad global shape", e->key);
        bytes = t;
    }
    return walk_chunks(w, e, dcp__pk_obj_attr(obj, "chunks"));
}

static struct md_chunk *find_chunk(struct md_entry *e, const int64_t *off,
                                   int ndim, const struct pk_node *hint)
{
    size_t i;
    if (ndim != e->ndim)
        return NULL;
    if (hint && hint->kind == PK_INT && hint->u.i >= 0 &&
        (uint64_t)hint->u.i < e->nchunks) {
        struct md_chunk *c = &e->chunks[hint->u.i];
        if (!ndim || memcmp(c->off, off, (size_t)ndim * sizeof(*off)) == 0)
            return c;
    }
    for (i = 0; i < e->nchunks; i++)
        if (!ndim || memcmp(e->chunks[i].off, off,
                            (size_t)ndim * sizeof(*off)) == 0)
            return &e->chunks[i];
    return NULL;
}

static int walk_storage_item(struct walk *w, const struct pk_node *idx,
                             const struct pk_node *info)
{
    int64_t off[DCP_MAX_NDIM];
    const struct pk_node *offn, *tds, *rn;
    const char *fqn, *rel;
    struct md_entry *e;
    struct md_chunk *c;
    uint64_t end;
    int ndim = 0;
    long ei;
    if (!is_class(idx, "MetadataIndex") || !is_class(info, "_StorageInfo"))
        return dcp__err(w->err, DCP_EFORMAT,
                        "metadata: storage_data entry is not "
                        "MetadataIndex -> _StorageInfo");
    fqn = str_of(dcp__pk_obj_attr(idx, "fqn"));
    if (!fqn)
        return dcp__err(w->err, DCP_EFORMAT,
                        "metadata: storage_data index without fqn");
    ei = dcp__meta_find(w->md, fqn);
    if (ei < 0)
        return dcp__err(w->err, DCP_EFORMAT,
                        "metadata: storage_data names unknown key '%s'", fqn);
    e = &w->md->e[ei];
    offn = dcp__pk_obj_attr(idx, "offset");
    if (e->is_tensor) {
        if (!offn || offn->kind == PK_NONE ||
            get_ints(offn, off, &ndim) != DCP_OK)
            return dcp__err(w->err, DCP_EFORMAT,
                            "metadata: '%s': storage index without offset",
                            fqn);
        c = find_chunk(e, off, ndim, dcp__pk_obj_attr(idx, "index"));
        if (!c)
            return dcp__err(w->err, DCP_EFORMAT,
                            "metadata: '%s': storage entry for a chunk that "
                            "does not exist",
                            fqn);
    } else {
        c = &e->chunks[0];
    }
    if (c->has_storage)
        return dcp__err(w->err, DCP_EFORMAT,
                        "metadata: '%s': two storage entries for one chunk",
                        fqn);
    tds = dcp__pk_obj_attr(info, "transform_descriptors");
    c->xform = MD_XFORM_NONE;
    if (tds && tds->kind != PK_NONE &&
        !(tds->kind == PK_LIST && tds->u.seq.n == 0)) {
        /* torch's ZStandard() alone: ["stream.zstd/1"]. */
        const char *d0 = (tds->kind == PK_LIST || tds->kind == PK_TUPLE) &&
                                 tds->u.seq.n == 1
                             ? str_of(tds->u.seq.v[0])
                             : NULL;
        if (!d0 || !dcp__zstd_descriptor_ok(d0))
            return dcp__err(w->err, DCP_ENOTSUP,
                            "metadata: '%s': stream transforms other than "
                            "one '" ZSTD_DESCRIPTOR "' are not supported",
                            fqn);
        c->xform = MD_XFORM_ZSTD;
    }
    rn = dcp__pk_obj_attr(info, "relative_path");
    rel = str_of(rn);
    if (!rel || !dcp__safe_name(rel)) {
        char show[320] = "(missing)";
        if (rn && rn->kind == PK_STR)
            (void)dcp__text_escape(show, sizeof(show), rn->u.s.p, rn->u.s.len);
        return dcp__err(w->err, DCP_EUNSAFE,
                        "metadata: '%s': data file name '%s' is not a plain "
                        "file name inside the checkpoint",
                        fqn, show);
    }
    if (get_u64(dcp__pk_obj_attr(info, "offset"), &c->offset) != DCP_OK ||
        get_u64(dcp__pk_obj_attr(info, "length"), &c->length) != DCP_OK ||
        dcp__add_overflow_u64(c->offset, c->length, &end) ||
        end > (uint64_t)INT64_MAX)
        return dcp__err(w->err, DCP_EFORMAT,
                        "metadata: '%s': bad byte range in '%s'", fqn, rel);
    c->has_storage = 1;
    return dcp__meta_file_index(w->md, &w->ftab, rel, strlen(rel),
                                &c->file) == DCP_OK
               ? DCP_OK
               : dcp__err(w->err, DCP_ENOMEM, "out of memory");
}

/* A planner's data for entry key (MD_PDATA_PREFIX items): a value; an
 * item for a key the checkpoint lacks is ignored. */
static int pdata(struct walk *w, const char *key, const struct pk_node *t)
{
    size_t budget[2] = {0, 0};
    long ei = dcp__meta_find(w->md, key);
    struct md_entry *e;
    if (ei < 0)
        return DCP_OK;
    e = &w->md->e[ei];
    dcp_value_free(e->pdata);
    e->pdata = NULL;
    return dcp__value_from_node(t, budget, &e->pdata, w->err);
}

static int walk_path(struct walk *w, const struct pk_node *pd)
{
    size_t i, j;
    if (!pd || pd->kind == PK_NONE)
        return DCP_OK;
    if (pd->kind != PK_DICT)
        return DCP_OK; /* other planners' data: not ours to interpret */
    for (i = 0; i + 1 < pd->u.seq.n; i += 2) {
        const char *key = str_of(pd->u.seq.v[i]);
        const struct pk_node *t = pd->u.seq.v[i + 1];
        struct md_entry *e;
        long ei;
        if (key && !strncmp(key, MD_PDATA_PREFIX, strlen(MD_PDATA_PREFIX))) {
            int rc = pdata(w, key + strlen(MD_PDATA_PREFIX), t);
            if (rc != DCP_OK)
                return rc;
            continue;
        }
        if (!key || (t->kind != PK_TUPLE && t->kind != PK_LIST))
            continue;
        ei = dcp__meta_find(w->md, key);
        if (ei < 0 || t->u.seq.n == 0 || t->u.seq.n > 256)
            continue; /* torch keeps paths of deduplicated keys too */
        e = &w->md->e[ei];
        if (e->path)
            continue;
        e->path = dcp__calloc(t->u.seq.n, sizeof(*e->path));
        if (!e->path)
            return DCP_ENOMEM;
        e->npath = t->u.seq.n;
        for (j = 0; j < t->u.seq.n; j++) {
            const struct pk_node *c = t->u.seq.v[j];
            if (c->kind == PK_STR) {
                e->path[j].s = dcp__strdup(c->u.s.p);
                if (!e->path[j].s)
                    return DCP_ENOMEM;
            } else if (c->kind == PK_INT) {
                e->path[j].i = c->u.i;
            } else {
                return dcp__err(w->err, DCP_EFORMAT,
                                "metadata: '%s': planner_data path holds a "
                                "non-str, non-int element",
                                key);
            }
        }
    }
    return DCP_OK;
}

/* Moves the entries of unsupported dtypes from md->e to md->unsup, both
 * staying sorted. */
static int set_apart_unsup(struct dcp_metadata *md)
{
    size_t i, k = 0, nu = 0;
    for (i = 0; i < md->n; i++)
        nu += md->e[i].unsup != NULL;
    if (!nu)
        return DCP_OK;
    md->unsup = dcp__calloc(nu, sizeof(*md->unsup));
    if (!md->unsup)
        return DCP_ENOMEM;
    for (i = 0; i < md->n; i++) {
        if (md->e[i].unsup)
            md->unsup[md->nunsup++] = md->e[i];
        else
            md->e[k++] = md->e[i];
    }
    md->n = k;
    return DCP_OK;
}

static int walk_root(struct walk *w, const struct pk_node *root)
{
    const struct pk_node *sdm, *sd, *ver, *sm;
    struct dcp_metadata *md = w->md;
    size_t i, j;
    int rc;
    if (!is_class(root, "Metadata") || !root->u.obj.state ||
        root->u.obj.state->kind != PK_DICT)
        return dcp__err(w->err, DCP_EFORMAT,
                        "metadata: top-level object is not a DCP Metadata");
    sdm = dcp__pk_obj_attr(root, "state_dict_metadata");
    if (!sdm || sdm->kind != PK_DICT)
        return dcp__err(w->err, DCP_EFORMAT,
                        "metadata: state_dict_metadata is not a dict");
    md->e = dcp__calloc(sdm->u.seq.n / 2 + 1, sizeof(*md->e));
    if (!md->e)
        return DCP_ENOMEM;
    for (i = 0; i + 1 < sdm->u.seq.n; i += 2) {
        const char *key = str_of(sdm->u.seq.v[i]);
        struct md_entry *e = &md->e[md->n];
        if (!key)
            return dcp__err(w->err, DCP_EFORMAT,
                            "metadata: a state_dict_metadata key is not a "
                            "str");
        e->key = dcp__strdup(key);
        if (!e->key)
            return DCP_ENOMEM;
        md->n++;
        rc = walk_entry(w, e, sdm->u.seq.v[i + 1]);
        if (rc != DCP_OK)
            return rc;
    }
    rc = dcp__meta_sort(md, w->err);
    if (rc != DCP_OK)
        return dcp__err(w->err, DCP_EFORMAT, "metadata: duplicate key");
    sd = dcp__pk_obj_attr(root, "storage_data");
    if (!sd || sd->kind != PK_DICT)
        return dcp__err(w->err, DCP_EFORMAT,
                        "metadata: storage_data is not a dict (only "
                        "FileSystemWriter checkpoints are supported)");
    for (i = 0; i + 1 < sd->u.seq.n; i += 2) {
        rc = walk_storage_item(w, sd->u.seq.v[i], sd->u.seq.v[i + 1]);
        if (rc != DCP_OK)
            return rc;
    }
    for (i = 0; i < md->n; i++)
        for (j = 0; j < md->e[i].nchunks; j++)
            if (!md->e[i].chunks[j].has_storage)
                return dcp__err(w->err, DCP_EFORMAT,
                                "metadata: '%s': chunk %zu has no storage "
                                "entry",
                                md->e[i].key, j);
    rc = walk_path(w, dcp__pk_obj_attr(root, "planner_data"));
    if (rc != DCP_OK)
        return rc;
    rc = set_apart_unsup(md);
    if (rc != DCP_OK)
        return rc;
    ver = dcp__pk_obj_attr(root, "version");
    md->version = dcp__strdup(str_of(ver) ? str_of(ver) : "");
    if (!md->version)
        return DCP_ENOMEM;
    sm = dcp__pk_obj_attr(root, "storage_meta");
    if (is_class(sm, "StorageMeta")) {
        const char *sid = str_of(dcp__pk_obj_attr(sm, "save_id"));
        const char *cid = str_of(dcp__pk_obj_attr(sm, "checkpoint_id"));
        if (sid && !(md->save_id = dcp__strdup(sid)))
            return DCP_ENOMEM;
        if (cid && !(md->checkpoint_id = dcp__strdup(cid)))
            return DCP_ENOMEM;
    }
    return DCP_OK;
}

int dcp__meta_decode(const void *p, size_t len, struct dcp_metadata **out,
                     struct dcp_err *err)
{
    if (dcp__meta_decode_fast(p, len, out) == DCP_OK)
        return DCP_OK;
    return dcp__meta_decode_general(p, len, out, err);
}

int dcp__meta_decode_general(const void *p, size_t len,
                             struct dcp_metadata **out, struct dcp_err *err)
{
    struct pk_arena *arena = NULL;
    struct pk_node *root = NULL;
    struct dcp_metadata *md;
    struct pk_limits lim;
    struct walk w;
    int rc;
    *out = NULL;
    md = dcp__calloc(1, sizeof(*md));
    if (!md)
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    /* A node or memo slot costs at least one byte of input, so the caller's
     * byte bound (max_metadata_bytes) already bounds them; the defaults
     * (64 Mi) would refuse a 4096-rank x 2000-tensor checkpoint. */
    dcp__pk_limits_default(&lim);
    if (len > lim.max_nodes)
        lim.max_nodes = len;
    if (len > lim.max_memo)
        lim.max_memo = len;
    rc = dcp__pk_decode(p, len, meta_allow, DCP_ARRAY_LEN(meta_allow), &lim, 0,
                   &arena, &root, err);
    if (rc != DCP_OK)
        goto out_free;
    w.md = md;
    w.err = err;
    w.chunks_left = len / 8 + 1;
    memset(&w.ftab, 0, sizeof(w.ftab));
    rc = walk_root(&w, root);
    dcp__htab_release(&w.ftab);
    if (rc == DCP_OK)
        dcp__meta_index(md);
    if (rc == DCP_ENOMEM)
        (void)dcp__err(err, rc, "out of memory decoding metadata");
out_free:
    dcp__pk_arena_free(arena);
    if (rc != DCP_OK) {
        dcp__meta_free(md);
        return rc;
    }
    *out = md;
    return DCP_OK;
}

