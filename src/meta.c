/*
 * .metadata: decoding PyTorch's pickled Metadata object into struct
 * dcp_metadata, validating it, and encoding it back.
 *
 * Decoding runs the safe pickle decoder with an allow-list of exactly the
 * classes DCP's FileSystemWriter pickles (and their older module paths),
 * then walks the resulting tree with explicit type checks; a tree of the
 * wrong shape is DCP_EFORMAT naming what was expected. Nothing is executed.
 *
 * Encoding writes protocol 2 (readable by every Python 3 pickle), with
 * strings and classes memoized, in the object shapes torch itself produces
 * (NEWOBJ + BUILD of the dataclass __dict__, TensorProperties' 5-tuple
 * state, torch.Size by REDUCE).
 */
#include "meta.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "pickle.h"

#define M_DCP "torch.distributed.checkpoint.metadata"
#define M_OLD "torch.distributed._shard.sharded_tensor.metadata"
#define M_FS "torch.distributed.checkpoint.filesystem"

static const struct pk_global meta_allow[] = {
    {M_DCP, "Metadata"},
    {M_DCP, "TensorStorageMetadata"},
    {M_DCP, "BytesStorageMetadata"},
    {M_DCP, "ChunkStorageMetadata"},
    {M_DCP, "TensorProperties"},
    {M_DCP, "StorageMeta"},
    {M_DCP, "MetadataIndex"},
    {M_DCP, "_MEM_FORMAT_ENCODING"},
    {M_OLD, "TensorProperties"},
    {M_OLD, "MEM_FORMAT_ENCODING"},
    {M_FS, "_StorageInfo"},
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
    {"torch", "qint8"},
    {"torch", "quint8"},
    {"torch", "qint32"},
};

static int is_class(const struct pk_node *n, const char *name)
{
    return n && n->kind == PK_OBJ &&
           (pk_obj_is(n, M_DCP, name) || pk_obj_is(n, M_OLD, name) ||
            pk_obj_is(n, M_FS, name));
}

static const char *str_of(const struct pk_node *n)
{
    return n && n->kind == PK_STR ? n->u.s.p : NULL;
}

/* torch.Size((a, b, ...)) or a plain tuple/list of ints. */
static int get_ints(const struct pk_node *n, int64_t *out, int *ndim)
{
    const struct pk_node *t = n;
    size_t i;
    if (!n)
        return DCP_EFORMAT;
    if (n->kind == PK_OBJ) {
        if (!pk_obj_is(n, "torch", "Size") || !n->u.obj.args ||
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
    struct md_ftab ftab; /* md->files by name */
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
        dt = pk_dict_get(st, "dtype");
        rg = pk_dict_get(st, "requires_grad");
    }
    if (!dt || dt->kind != PK_GLOBAL || strcmp(dt->u.g.module, "torch") != 0)
        return dcp__err(w->err, DCP_EFORMAT,
                        "metadata: '%s': missing or bad dtype", key);
    if (dcp_dtype_from_name(dt->u.g.name, &e->dtype) != DCP_OK)
        return dcp__err(w->err, DCP_ENOTSUP,
                        "metadata: '%s': dtype torch.%s is not supported",
                        key, dt->u.g.name);
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
        if (get_ints(pk_obj_attr(c, "offsets"), mc->off, &nd1) != DCP_OK ||
            get_ints(pk_obj_attr(c, "sizes"), mc->size, &nd2) != DCP_OK ||
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
    rc = walk_props(w, e->key, pk_obj_attr(obj, "properties"), e);
    if (rc != DCP_OK)
        return rc;
    rc = get_ints(pk_obj_attr(obj, "size"), e->shape, &e->ndim);
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
    return walk_chunks(w, e, pk_obj_attr(obj, "chunks"));
}

static int cmp_entry(const void *a, const void *b)
{
    return strcmp(((const struct md_entry *)a)->key,
                  ((const struct md_entry *)b)->key);
}

int dcp__meta_sort(struct dcp_metadata *md, struct dcp_err *err)
{
    size_t i;
    if (md->n > 1)
        qsort(md->e, md->n, sizeof(*md->e), cmp_entry);
    for (i = 1; i < md->n; i++)
        if (strcmp(md->e[i - 1].key, md->e[i].key) == 0)
            return dcp__err(err, DCP_EPLAN, "duplicate key '%s'",
                            md->e[i].key);
    return DCP_OK;
}

long dcp__meta_find(const struct dcp_metadata *md, const char *key)
{
    size_t lo = 0, hi = md->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(md->e[mid].key, key);
        if (c == 0)
            return (long)mid;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return -1;
}

int dcp__safe_name(const char *name)
{
    const char *p;
    if (!name || !*name || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
        return 0;
    if (strlen(name) > 255)
        return 0;
    for (p = name; *p; p++)
        if (*p == '/' || *p == '\\' || (unsigned char)*p < 0x20)
            return 0;
    return 1;
}

static size_t name_hash(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ULL;
    size_t i;
    for (i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 1099511628211ULL;
    }
    return (size_t)h;
}

/* Index of a data file name in md->files, added if new. A hash table: a
 * checkpoint has a file or more per rank, and every storage item names
 * one (8 Mi items x 4096 files for 4096 ranks x 2000 tensors). */
int dcp__meta_file_index(struct dcp_metadata *md, struct md_ftab *t,
                         const char *name, size_t len, uint32_t *out)
{
    size_t h, i;
    char **nf;
    if ((md->nfiles + 1) * 2 > t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 64;
        uint32_t *nt = dcp__calloc(cap, sizeof(*nt));
        if (!nt)
            return DCP_ENOMEM;
        for (i = 0; i < md->nfiles; i++) {
            h = name_hash(md->files[i], strlen(md->files[i])) & (cap - 1);
            while (nt[h])
                h = (h + 1) & (cap - 1);
            nt[h] = (uint32_t)(i + 1);
        }
        dcp__free(t->tab);
        t->tab = nt;
        t->cap = cap;
    }
    h = name_hash(name, len) & (t->cap - 1);
    while (t->tab[h]) {
        const char *f = md->files[t->tab[h] - 1];
        if (strncmp(f, name, len) == 0 && f[len] == '\0') {
            *out = t->tab[h] - 1;
            return DCP_OK;
        }
        h = (h + 1) & (t->cap - 1);
    }
    if (md->nfiles >= UINT32_MAX - 1)
        return DCP_ELIMIT;
    nf = dcp__realloc(md->files, (md->nfiles + 1) * sizeof(*nf));
    if (!nf)
        return DCP_ENOMEM;
    md->files = nf;
    md->files[md->nfiles] = dcp__strndup(name, len);
    if (!md->files[md->nfiles])
        return DCP_ENOMEM;
    t->tab[h] = (uint32_t)(md->nfiles + 1);
    *out = (uint32_t)md->nfiles++;
    return DCP_OK;
}

/* Finds the chunk of e whose offsets equal off, trying the hint first. */
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
    const struct pk_node *offn, *tds;
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
    fqn = str_of(pk_obj_attr(idx, "fqn"));
    if (!fqn)
        return dcp__err(w->err, DCP_EFORMAT,
                        "metadata: storage_data index without fqn");
    ei = dcp__meta_find(w->md, fqn);
    if (ei < 0)
        return dcp__err(w->err, DCP_EFORMAT,
                        "metadata: storage_data names unknown key '%s'", fqn);
    e = &w->md->e[ei];
    offn = pk_obj_attr(idx, "offset");
    if (e->is_tensor) {
        if (!offn || offn->kind == PK_NONE ||
            get_ints(offn, off, &ndim) != DCP_OK)
            return dcp__err(w->err, DCP_EFORMAT,
                            "metadata: '%s': storage index without offset",
                            fqn);
        c = find_chunk(e, off, ndim, pk_obj_attr(idx, "index"));
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
    tds = pk_obj_attr(info, "transform_descriptors");
    if (tds && tds->kind != PK_NONE &&
        !(tds->kind == PK_LIST && tds->u.seq.n == 0))
        return dcp__err(w->err, DCP_ENOTSUP,
                        "metadata: '%s': stream transforms (compression "
                        "extensions) are not supported",
                        fqn);
    rel = str_of(pk_obj_attr(info, "relative_path"));
    if (!rel || !dcp__safe_name(rel))
        return dcp__err(w->err, DCP_EUNSAFE,
                        "metadata: '%s': data file name '%s' is not a plain "
                        "file name inside the checkpoint",
                        fqn, rel ? rel : "(missing)");
    if (get_u64(pk_obj_attr(info, "offset"), &c->offset) != DCP_OK ||
        get_u64(pk_obj_attr(info, "length"), &c->length) != DCP_OK ||
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
    sdm = pk_obj_attr(root, "state_dict_metadata");
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
    sd = pk_obj_attr(root, "storage_data");
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
    rc = walk_path(w, pk_obj_attr(root, "planner_data"));
    if (rc != DCP_OK)
        return rc;
    ver = pk_obj_attr(root, "version");
    md->version = dcp__strdup(str_of(ver) ? str_of(ver) : "");
    if (!md->version)
        return DCP_ENOMEM;
    sm = pk_obj_attr(root, "storage_meta");
    if (is_class(sm, "StorageMeta")) {
        const char *sid = str_of(pk_obj_attr(sm, "save_id"));
        const char *cid = str_of(pk_obj_attr(sm, "checkpoint_id"));
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
    pk_limits_default(&lim);
    if (len > lim.max_nodes)
        lim.max_nodes = len;
    if (len > lim.max_memo)
        lim.max_memo = len;
    rc = pk_decode(p, len, meta_allow, DCP_ARRAY_LEN(meta_allow), &lim, 0,
                   &arena, &root, err);
    if (rc != DCP_OK)
        goto out_free;
    w.md = md;
    w.err = err;
    w.chunks_left = len / 8 + 1;
    w.ftab.tab = NULL;
    w.ftab.cap = 0;
    rc = walk_root(&w, root);
    dcp__free(w.ftab.tab);
    if (rc == DCP_OK)
        dcp__meta_index(md);
    if (rc == DCP_ENOMEM)
        (void)dcp__err(err, rc, "out of memory decoding metadata");
out_free:
    pk_arena_free(arena);
    if (rc != DCP_OK) {
        dcp__meta_free(md);
        return rc;
    }
    *out = md;
    return DCP_OK;
}

void dcp__meta_free(struct dcp_metadata *md)
{
    size_t i, j;
    if (!md)
        return;
    for (i = 0; i < md->n; i++) {
        struct md_entry *e = &md->e[i];
        /* With a pool (md->ints), chunks' offsets and sizes live in it. */
        for (j = 0; !md->ints && e->chunks && j < e->nchunks; j++)
            dcp__free(e->chunks[j].off);
        if (!md->chunk_block)
            dcp__free(e->chunks);
        for (j = 0; j < e->npath; j++)
            dcp__free(e->path[j].s);
        dcp__free(e->path);
        dcp__free(e->key);
    }
    dcp__free(md->e);
    for (i = 0; i < md->nfiles; i++)
        dcp__free(md->files[i]);
    dcp__free(md->files);
    dcp__free(md->version);
    dcp__free(md->checkpoint_id);
    dcp__free(md->save_id);
    dcp__free(md->ints);
    dcp__free(md->chunk_block);
    dcp__free(md->dir);
    dcp__free(md);
}

/* ------------------------------------------------------- load planning */

void dcp__meta_index(struct dcp_metadata *md)
{
    size_t i, j;
    for (i = 0; i < md->n; i++) {
        struct md_entry *e = &md->e[i];
        e->sorted0 = e->is_tensor && e->ndim > 0;
        e->maxlen0 = 0;
        for (j = 0; e->sorted0 && j < e->nchunks; j++) {
            const struct md_chunk *c = &e->chunks[j];
            if (j && c->off[0] < e->chunks[j - 1].off[0])
                e->sorted0 = 0;
            if (c->size[0] > e->maxlen0)
                e->maxlen0 = c->size[0];
        }
    }
}

static int overlaps(int ndim, const int64_t *ao, const int64_t *as,
                    const int64_t *bo, const int64_t *bs)
{
    int d;
    for (d = 0; d < ndim; d++) {
        int64_t lo = ao[d] > bo[d] ? ao[d] : bo[d];
        int64_t hi = ao[d] + as[d] < bo[d] + bs[d] ? ao[d] + as[d]
                                                   : bo[d] + bs[d];
        if (hi <= lo)
            return 0;
    }
    return 1;
}

size_t dcp__meta_overlapping(const struct md_entry *e, const int64_t *off,
                             const int64_t *size, uint8_t *mark)
{
    size_t lo = 0, hi = e->nchunks, i, n = 0;
    if (!e->is_tensor)
        return 0;
    if (e->ndim == 0) { /* a 0-d tensor: its one chunk */
        if (e->nchunks && !mark[0]) {
            mark[0] = 1;
            n = 1;
        }
        return n;
    }
    if (e->sorted0) {
        /* First chunk that may reach the box: start > off[0] - maxlen0. */
        int64_t from = off[0] - e->maxlen0;
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            if (e->chunks[mid].off[0] <= from)
                lo = mid + 1;
            else
                hi = mid;
        }
        hi = e->nchunks;
    }
    for (i = lo; i < hi; i++) {
        const struct md_chunk *c = &e->chunks[i];
        if (e->sorted0 && c->off[0] >= off[0] + size[0])
            break;
        if (!mark[i] && overlaps(e->ndim, c->off, c->size, off, size)) {
            mark[i] = 1;
            n++;
        }
    }
    return n;
}

/* ------------------------------------------------------------- tiling */

/* A chunk with its extent along the dimension at hand (qsort has no
 * context argument, so the key travels with the element). */
struct sweep {
    int64_t start;
    int64_t end;
    const struct md_chunk *c;
};

static int cmp_sweep(const void *a, const void *b)
{
    const struct sweep *x = a, *y = b;
    if (x->start != y->start)
        return x->start < y->start ? -1 : 1;
    if (x->end != y->end)
        return x->end < y->end ? -1 : 1;
    return 0;
}

/*
 * Whether two of the non-empty chunks v[0..n) overlap, for the layouts
 * that are grids at every level (row, column, 2-D blocks, and bricks):
 * along the first dimension not in used, the chunks' extents must be equal
 * or disjoint; two chunks of different extents then cannot overlap, and
 * those of one extent overlap iff they do in the other dimensions (checked
 * recursively; equal in all of them, they do). O(n * ndim) when v arrives
 * sorted, as a plan's chunks do. Returns 1 (overlap), 0 (none), or 2 when
 * some extents overlap without being equal: the pairwise sweep decides.
 */
static int grid_overlap(struct sweep *v, size_t n, int ndim, unsigned used)
{
    size_t i, a;
    int64_t reach;
    int d, r;
    if (n < 2)
        return 0;
    for (d = 0; d < ndim && (used >> d & 1); d++)
        ;
    if (d == ndim)
        return 1;
    for (i = 0; i < n; i++) {
        v[i].start = v[i].c->off[d];
        v[i].end = v[i].start + v[i].c->size[d];
    }
    for (i = 1; i < n && cmp_sweep(&v[i - 1], &v[i]) <= 0; i++)
        ;
    if (i < n)
        qsort(v, n, sizeof(*v), cmp_sweep);
    reach = v[0].end;
    for (a = 0, i = 1; i <= n; i++) {
        if (i < n && v[i].start == v[a].start && v[i].end == v[a].end)
            continue;
        if (i < n && v[i].start < reach)
            return 2;
        if (i - a > 1) {
            r = grid_overlap(v + a, i - a, ndim, used | 1u << d);
            if (r)
                return r;
        }
        if (i < n && v[i].end > reach)
            reach = v[i].end;
        a = i;
    }
    return 0;
}

/* dcp__box_numel, inline: the checks below run it per chunk and dim. */
static inline uint64_t numel_of(int ndim, const int64_t *size)
{
    uint64_t n = 1;
    int d;
    for (d = 0; d < ndim; d++)
        n *= (uint64_t)size[d];
    return n;
}

static int boxes_overlap(const struct md_chunk *a, const struct md_chunk *b,
                         int ndim)
{
    int d;
    for (d = 0; d < ndim; d++)
        if (a->off[d] >= b->off[d] + b->size[d] ||
            b->off[d] >= a->off[d] + a->size[d])
            return 0;
    return 1;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

/* Number of values in sorted s[0..n) below x. */
static size_t count_below(const int64_t *s, size_t n, int64_t x)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (s[mid] < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/*
 * The dimension to sweep along: the one where the overlap scan below
 * compares the fewest pairs. Sweeping along d, a chunk is compared with the
 * chunks that start inside its extent along d; that count, summed over the
 * chunks, is exact and costs one sort per dimension. Row sharding picks
 * dim 0, column sharding dim 1, whatever the extents; the scan is then
 * O(n). Returns -1 when memory runs out.
 */
static int sweep_dim(const struct md_entry *e)
{
    int64_t *s;
    uint64_t best_cost = UINT64_MAX;
    size_t i, n = 0;
    int d, best = 0, cut = -1;
    if (e->ndim < 2)
        return 0;
    /* Shortcut: chunks that span every dimension but one (row, column
     * sharding) are cheapest to sweep along that one. */
    for (d = 0; d < e->ndim && cut != -2; d++) {
        for (i = 0; i < e->nchunks; i++)
            if (numel_of(e->ndim, e->chunks[i].size) &&
                (e->chunks[i].off[d] || e->chunks[i].size[d] != e->shape[d]))
                break;
        if (i < e->nchunks)
            cut = cut == -1 ? d : -2;
    }
    if (cut >= 0)
        return cut;
    s = dcp__malloc((e->nchunks ? e->nchunks : 1) * sizeof(*s));
    if (!s)
        return -1;
    for (d = 0; d < e->ndim; d++) {
        uint64_t cost = 0;
        n = 0;
        for (i = 0; i < e->nchunks; i++)
            if (numel_of(e->ndim, e->chunks[i].size))
                s[n++] = e->chunks[i].off[d];
        qsort(s, n, sizeof(*s), cmp_i64);
        for (i = 0; i < e->nchunks; i++) {
            const int64_t lo = e->chunks[i].off[d];
            const int64_t hi = lo + e->chunks[i].size[d];
            if (numel_of(e->ndim, e->chunks[i].size))
                cost += count_below(s, n, hi) - count_below(s, n, lo);
        }
        if (cost < best_cost) {
            best_cost = cost;
            best = d;
        }
    }
    dcp__free(s);
    return best;
}

int dcp__meta_check_tiling(const struct md_entry *e, struct dcp_err *err)
{
    struct sweep *v;
    uint64_t total = 1, sum = 0;
    size_t i, j, n = 0;
    int d, best, r;
    if (!e->is_tensor)
        return DCP_OK;
    for (d = 0; d < e->ndim; d++)
        total *= (uint64_t)e->shape[d];
    if (e->ndim == 0)
        return e->nchunks == 1 ? DCP_OK
                               : dcp__err(err, DCP_EFORMAT,
                                          "'%s': a 0-d tensor with %zu chunks",
                                          e->key, e->nchunks);
    v = dcp__malloc((e->nchunks ? e->nchunks : 1) * sizeof(*v));
    if (!v)
        return DCP_ENOMEM;
    for (i = 0; i < e->nchunks; i++) {
        uint64_t vol = numel_of(e->ndim, e->chunks[i].size);
        sum += vol;
        if (vol)
            v[n++].c = &e->chunks[i];
    }
    r = grid_overlap(v, n, e->ndim, 0);
    if (r == 2) { /* not a grid: sweep along the cheapest dimension */
        best = sweep_dim(e);
        if (best < 0) {
            dcp__free(v);
            return DCP_ENOMEM;
        }
        for (i = 0; i < n; i++) {
            v[i].start = v[i].c->off[best];
            v[i].end = v[i].start + v[i].c->size[best];
        }
        for (i = 1; i < n && v[i - 1].start <= v[i].start; i++)
            ;
        if (i < n) /* often sorted already: chunks listed by offsets */
            qsort(v, n, sizeof(*v), cmp_sweep);
        for (r = 0, i = 0; !r && i < n; i++)
            for (j = i + 1; !r && j < n && v[j].start < v[i].end; j++)
                r = boxes_overlap(v[i].c, v[j].c, e->ndim);
    }
    dcp__free(v);
    if (r)
        return dcp__err(err, DCP_EFORMAT, "'%s': stored chunks overlap",
                        e->key);
    if (sum != total)
        return dcp__err(err, DCP_EFORMAT,
                        "'%s': stored chunks cover %" PRIu64 " of %" PRIu64
                        " elements",
                        e->key, sum, total);
    return DCP_OK;
}

/* ------------------------------------------------------------- encode */

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
        return pkw_get(&x->w, *slot);
    return pkw_str_memo(&x->w, s, strlen(s), slot);
}

static int enc_glob(struct enc *x, const char *module, const char *name,
                    uint32_t *slot)
{
    if (slot && *slot != ENC_NONE)
        return pkw_get(&x->w, *slot);
    return pkw_global_memo(&x->w, module, name, slot);
}

static int enc_key(struct enc *x, const char *s)
{
    return pkw_str_memo(&x->w, s, strlen(s), NULL);
}

static int enc_size(struct enc *x, const int64_t *v, int n)
{
    int i, rc = enc_glob(x, "torch", "Size", &x->slot[EG_SIZE]);
    if (rc == DCP_OK && n > 3)
        rc = pkw_mark(&x->w);
    for (i = 0; rc == DCP_OK && i < n; i++)
        rc = pkw_int(&x->w, v[i]);
    if (rc == DCP_OK)
        rc = pkw_tuple(&x->w, (size_t)n);
    if (rc == DCP_OK)
        rc = pkw_tuple(&x->w, 1);
    return rc == DCP_OK ? pkw_op(&x->w, PK_OP_REDUCE) : rc;
}

/* cls() with an empty __dict__ filled by BUILD: opens the state dict. */
static int enc_obj_open(struct enc *x, const char *module, const char *name,
                        uint32_t *slot)
{
    int rc = enc_glob(x, module, name, slot);
    if (rc == DCP_OK)
        rc = pkw_empty_tuple(&x->w);
    if (rc == DCP_OK)
        rc = pkw_op(&x->w, PK_OP_NEWOBJ);
    if (rc == DCP_OK)
        rc = pkw_empty_dict(&x->w);
    return rc == DCP_OK ? pkw_mark(&x->w) : rc;
}

static int enc_obj_close(struct enc *x)
{
    int rc = pkw_op(&x->w, PK_OP_SETITEMS);
    return rc == DCP_OK ? pkw_op(&x->w, PK_OP_BUILD) : rc;
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

/* The same encoding as pkw_int. */
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
    int rc = enc_glob(x, M_DCP, "TensorProperties", NULL);
    if (rc == DCP_OK)
        rc = pkw_empty_tuple(w);
    if (rc == DCP_OK)
        rc = pkw_op(w, PK_OP_NEWOBJ);
    if (rc == DCP_OK)
        rc = pkw_mark(w);
    if (rc == DCP_OK)
        rc = enc_glob(x, "torch", dcp_dtype_name(e->dtype), NULL);
    if (rc != DCP_OK)
        return rc;
    if (x->have_props) {
        rc = pkw_get(w, x->layout);
        if (rc == DCP_OK)
            rc = pkw_bool(w, e->requires_grad);
        if (rc == DCP_OK)
            rc = pkw_get(w, x->memfmt);
    } else {
        rc = enc_glob(x, "torch.serialization", "_get_layout", NULL);
        if (rc == DCP_OK)
            rc = enc_key(x, "torch.strided");
        if (rc == DCP_OK)
            rc = pkw_tuple(w, 1);
        if (rc == DCP_OK)
            rc = pkw_op(w, PK_OP_REDUCE);
        if (rc == DCP_OK)
            rc = pkw_put(w, &x->layout);
        if (rc == DCP_OK)
            rc = pkw_bool(w, e->requires_grad);
        if (rc == DCP_OK)
            rc = enc_glob(x, M_DCP, "_MEM_FORMAT_ENCODING", NULL);
        if (rc == DCP_OK)
            rc = pkw_int(w, 0);
        if (rc == DCP_OK)
            rc = pkw_tuple(w, 1);
        if (rc == DCP_OK)
            rc = pkw_op(w, PK_OP_REDUCE);
        if (rc == DCP_OK)
            rc = pkw_put(w, &x->memfmt);
        x->have_props = rc == DCP_OK;
    }
    if (rc == DCP_OK)
        rc = pkw_bool(w, 0); /* pin_memory */
    if (rc == DCP_OK)
        rc = pkw_op(w, PK_OP_TUPLE);
    return rc == DCP_OK ? pkw_op(w, PK_OP_BUILD) : rc;
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
            rc = pkw_op(&x->w, op);
        if (rc == DCP_OK)
            rc = pkw_mark(&x->w);
    }
    return rc;
}

static int enc_batch_end(struct enc *x, size_t n, uint8_t op)
{
    return n ? pkw_op(&x->w, op) : DCP_OK;
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
    rc = enc_obj_open(x, M_DCP, "ChunkStorageMetadata", &x->slot[EG_CHUNK]);
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
    int rc = enc_obj_open(x, M_DCP, "TensorStorageMetadata", NULL);
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
        rc = pkw_empty_list(&x->w);
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
        rc = pkw_empty_dict(&x->w);
    for (i = 0; rc == DCP_OK && i < md->n; i++) {
        const struct md_entry *e = &md->e[i];
        rc = enc_batch(x, i, PK_OP_SETITEMS);
        if (rc == DCP_OK)
            rc = pkw_str_memo(&x->w, e->key, strlen(e->key), &x->ekey[i]);
        if (rc != DCP_OK)
            break;
        if (e->is_tensor) {
            rc = enc_tensor_md(x, e);
        } else {
            rc = enc_glob(x, M_DCP, "BytesStorageMetadata", NULL);
            if (rc == DCP_OK)
                rc = pkw_empty_tuple(&x->w);
            if (rc == DCP_OK)
                rc = pkw_op(&x->w, PK_OP_NEWOBJ);
        }
    }
    return rc == DCP_OK ? enc_batch_end(x, md->n, PK_OP_SETITEMS) : rc;
}

static int enc_planner_data(struct enc *x, const struct dcp_metadata *md)
{
    size_t i, j;
    int rc = enc_key(x, "planner_data");
    if (rc == DCP_OK)
        rc = pkw_empty_dict(&x->w);
    for (i = 0; rc == DCP_OK && i < md->n; i++) {
        const struct md_entry *e = &md->e[i];
        rc = enc_batch(x, i, PK_OP_SETITEMS);
        if (rc == DCP_OK)
            rc = enc_str(x, e->key, &x->ekey[i]);
        if (rc == DCP_OK && e->npath > 3)
            rc = pkw_mark(&x->w);
        for (j = 0; rc == DCP_OK && j < e->npath; j++)
            rc = e->path[j].s ? enc_key(x, e->path[j].s)
                              : pkw_int(&x->w, e->path[j].i);
        if (rc == DCP_OK && e->npath == 0)
            rc = enc_str(x, e->key, &x->ekey[i]); /* no path: flat */
        if (rc == DCP_OK)
            rc = pkw_tuple(&x->w, e->npath ? e->npath : 1);
    }
    return rc == DCP_OK ? enc_batch_end(x, md->n, PK_OP_SETITEMS) : rc;
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
        x->fkey[c->file] != ENC_NONE) {
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
    rc = enc_obj_open(x, M_DCP, "MetadataIndex", &x->slot[EG_MDINDEX]);
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
        rc = e->is_tensor ? pkw_int(&x->w, (int64_t)j) : pkw_none(&x->w);
    if (rc == DCP_OK)
        rc = enc_obj_close(x);
    if (rc == DCP_OK)
        rc = enc_obj_open(x, M_FS, "_StorageInfo", &x->slot[EG_SINFO]);
    if (rc == DCP_OK)
        rc = enc_str(x, "relative_path", &x->slot[EK_RELPATH]);
    if (rc == DCP_OK)
        rc = enc_str(x, md->files[c->file], &x->fkey[c->file]);
    if (rc == DCP_OK)
        rc = enc_str(x, "offset", &x->slot[EK_OFFSET]);
    if (rc == DCP_OK)
        rc = pkw_int(&x->w, (int64_t)c->offset);
    if (rc == DCP_OK)
        rc = enc_str(x, "length", &x->slot[EK_LENGTH]);
    if (rc == DCP_OK)
        rc = pkw_int(&x->w, (int64_t)c->length);
    return rc == DCP_OK ? enc_obj_close(x) : rc;
}

static int enc_storage_data(struct enc *x, const struct dcp_metadata *md)
{
    size_t i, j, item = 0;
    int rc = enc_key(x, "storage_data");
    if (rc == DCP_OK)
        rc = pkw_empty_dict(&x->w);
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
        rc = enc_obj_open(x, M_DCP, "StorageMeta", NULL);
    if (rc == DCP_OK)
        rc = enc_key(x, "checkpoint_id");
    if (rc == DCP_OK)
        rc = md->checkpoint_id ? enc_key(x, md->checkpoint_id)
                               : pkw_none(&x->w);
    if (rc == DCP_OK)
        rc = enc_key(x, "save_id");
    if (rc == DCP_OK)
        rc = md->save_id ? enc_key(x, md->save_id) : pkw_none(&x->w);
    if (rc == DCP_OK)
        rc = enc_key(x, "load_id");
    if (rc == DCP_OK)
        rc = pkw_none(&x->w);
    if (rc == DCP_OK)
        rc = enc_key(x, "modules");
    if (rc == DCP_OK)
        rc = pkw_empty_list(&x->w);
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
    pk_writer_init(&x.w, out);
    rc = pkw_proto(&x.w);
    if (rc == DCP_OK)
        rc = enc_obj_open(&x, M_DCP, "Metadata", NULL);
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
        rc = pkw_stop(&x.w);
    pk_writer_release(&x.w);
    dcp__free(x.ekey);
    dcp__free(x.fkey);
    return rc;
}
