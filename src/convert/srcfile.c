/*
 * Source files for import and online load (see srcfile.h).
 *
 * A torch.save file is a zip archive whose data.pkl holds the state dict;
 * it is decoded with the safe pickle decoder (allow-list: the tensor
 * globals of torchzip, nn.Parameter's rebuild, OrderedDict and the value
 * globals) and walked the way torch's flatten_state_dict traverses a state
 * dict: dicts are expanded (keys str(key)), a list is expanded when it
 * holds a tensor, a dict or an expandable list, anything else is a leaf.
 * A leaf tensor must be a CPU tensor of a supported dtype whose storage
 * record is in the archive with the right size; other leaves must be plain
 * values. Walks are depth-bounded (memo references can make cycles).
 *
 * A safetensors file gives one contiguous tensor per header entry; an
 * index (model.safetensors.index.json) names shards in its own directory,
 * each checked against the index both ways. Neither may hold a piece of a
 * larger tensor (a DCP_SHARDING_INFO offset other than 0). A directory is
 * read as Hugging Face's per-rank files (hfdir.c): each tensor assembled
 * from its pieces, a box read piece by piece.
 */
#include "srcfile.h"

#include <errno.h>
#include <float.h> /* FLT_MAX */
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dcp/dcp_convert.h"
#include "cvname.h"
#include "hfdir.h"
#include "json.h"
#include "meta.h"
#include "pickle.h"
#include "reshard.h"
#include "safetensors.h"
#include "storage.h"
#include "torchzip.h"
#include "value.h"

#define MAX_RECORDS    ((size_t)1 << 18) /* storages in one torch.save file */
#define MAX_INDEX_JSON ((uint64_t)64 << 20)
#define MAX_WALK_DEPTH 64
/* Memo references make the pickle a DAG: walking it visits shared parts
 * once per reference, so the walk and the entries are bounded. */
#define MAX_WALK_STEPS ((size_t)1 << 24)
#define MAX_ENTRIES    ((size_t)1 << 20)
/* Memory the entries of a torch.save file may take: 16 MiB plus 64 bytes
 * per byte of its data.pkl (real state dicts take 2 to 5 per byte). */
#define WALK_MEM_BASE     ((size_t)16 << 20)
#define WALK_MEM_PER_BYTE ((size_t)64)

typedef unsigned long long ull;

/* ------------------------------------------------------------ files */

/* Opens path as file *idx. A path that is not a regular file is refused
 * with nonreg (DCP_EINVAL for the caller's own path, DCP_EUNSAFE for a
 * shard an index names); O_NONBLOCK keeps a FIFO from blocking the open. */
static int add_file(struct src_index *ix, const char *path, uint32_t *idx,
                    int nonreg, struct dcp_err *err)
{
    size_t n = ix->nfiles;
    char **f = dcp__realloc(ix->files, (n + 1) * sizeof(*f));
    int *fds;
    uint64_t *sz;
    struct stat sb;
    int fd;
    if (f)
        ix->files = f;
    fds = f ? dcp__realloc(ix->fds, (n + 1) * sizeof(*fds)) : NULL;
    if (fds)
        ix->fds = fds;
    sz = fds ? dcp__realloc(ix->sizes, (n + 1) * sizeof(*sz)) : NULL;
    if (sz)
        ix->sizes = sz;
    if (!sz || !(ix->files[n] = dcp__strdup(path)))
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    ix->fds[n] = -1;
    ix->sizes[n] = 0;
    ix->nfiles = n + 1;
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return dcp__err(err, errno == ENOENT ? DCP_ENOENT : DCP_EIO,
                        "cannot open '%s': %s", path, strerror(errno));
    ix->fds[n] = fd;
    if (fstat(fd, &sb) != 0)
        return dcp__err(err, DCP_EIO, "cannot stat '%s': %s", path,
                        strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return dcp__err(err, nonreg, "'%s' is not a regular file", path);
    ix->sizes[n] = (uint64_t)sb.st_size;
    *idx = (uint32_t)n;
    return DCP_OK;
}

void dcp__src_close(struct src_index *ix)
{
    size_t i, j;
    if (!ix)
        return;
    for (i = 0; i < ix->n; i++) {
        struct src_entry *e = &ix->e[i];
        for (j = 0; j < e->npath; j++)
            dcp__free(e->path[j].s);
        dcp__free(e->path);
        dcp__free(e->key);
        dcp__free(e->pieces);
        dcp_value_free(e->value);
    }
    dcp__free(ix->e);
    for (i = 0; i < ix->nfiles; i++) {
        if (ix->fds[i] >= 0)
            (void)close(ix->fds[i]);
        dcp__free(ix->files[i]);
    }
    dcp__free(ix->files);
    dcp__free(ix->fds);
    dcp__free(ix->sizes);
    dcp__free(ix->cache);
    memset(ix, 0, sizeof(*ix));
}

static struct src_entry *new_entry(struct src_index *ix, size_t *cap)
{
    struct src_entry *e;
    if (ix->n == *cap) {
        size_t c = *cap ? *cap * 2 : 64;
        e = dcp__realloc(ix->e, c * sizeof(*e));
        if (!e)
            return NULL;
        ix->e = e;
        *cap = c;
    }
    e = &ix->e[ix->n++];
    memset(e, 0, sizeof(*e));
    return e;
}

static void c_strides(struct src_entry *e)
{
    int64_t s = 1;
    int d;
    for (d = e->ndim - 1; d >= 0; d--) {
        e->stride[d] = s;
        s *= e->shape[d] > 1 ? e->shape[d] : 1;
    }
    e->contiguous = 1;
}

/* A one-component path (a safetensors name). */
static int flat_path(struct src_entry *e, const char *name, struct dcp_err *err)
{
    e->key = dcp__strdup(name);
    e->path = dcp__calloc(1, sizeof(*e->path));
    if (!e->key || !e->path || !(e->path[0].s = dcp__strdup(name)))
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    e->npath = 1;
    return DCP_OK;
}

/* ------------------------------------------------------ safetensors */

static int add_sf_tensors(struct src_index *ix, uint32_t file,
                          const struct sf_file *sf, size_t *cap,
                          struct dcp_err *err)
{
    size_t i;
    int rc = dcp__hf_check_whole(sf, ix->files[file], err);
    for (i = 0; rc == DCP_OK && i < sf->n; i++) {
        const struct sf_tensor *t = &sf->t[i];
        struct src_entry *e = new_entry(ix, cap);
        if (!e)
            return dcp__err(err, DCP_ENOMEM, "out of memory");
        e->is_tensor = 1;
        e->dtype = t->dtype;
        e->ndim = t->ndim;
        memcpy(e->shape, t->shape, sizeof(e->shape));
        e->file = file;
        e->base = sf->data_off + t->begin;
        e->storage_bytes = t->end - t->begin;
        c_strides(e);
        rc = flat_path(e, t->name, err);
    }
    return rc;
}

static int open_safetensors(struct src_index *ix, const char *path, size_t *cap,
                            struct dcp_err *err)
{
    struct sf_file sf;
    uint32_t f;
    int rc = add_file(ix, path, &f, DCP_EINVAL, err);
    if (rc != DCP_OK)
        return rc;
    rc = dcp__sf_read(ix->fds[f], path, ix->sizes[f], &sf, err);
    if (rc != DCP_OK)
        return rc;
    rc = add_sf_tensors(ix, f, &sf, cap, err);
    dcp__sf_release(&sf);
    return rc;
}

/* A member of an index's weight_map. Sorted by shard, then by tensor
 * name, each shard's members are one run that is binary-searched: a
 * linear lookup per tensor made an index of 100,000 tensors take
 * minutes. */
struct map_ent {
    const struct json_node *key, *shard;
};

static int cmp_name(const char *a, size_t alen, const char *b, size_t blen)
{
    int c = memcmp(a, b, alen < blen ? alen : blen);
    if (c)
        return c;
    return alen < blen ? -1 : alen > blen;
}

static int cmp_map_ent(const void *a, const void *b)
{
    const struct map_ent *x = a, *y = b;
    int c = strcmp(x->shard->s, y->shard->s);
    if (c)
        return c;
    return cmp_name(x->key->s, x->key->len, y->key->s, y->key->len);
}

/* A shard named by the index: its tensors must be exactly the index's
 * entries that name it, ents[0..n) (sorted by name). */
static int check_shard(const struct map_ent *ents, size_t n, const char *shard,
                       const struct sf_file *sf, struct dcp_err *err)
{
    size_t i;
    for (i = 0; i < sf->n; i++) {
        const char *name = sf->t[i].name;
        size_t len = strlen(name), lo = 0, hi = n;
        int found = 0;
        while (lo < hi && !found) {
            size_t mid = lo + (hi - lo) / 2;
            int c = cmp_name(ents[mid].key->s, ents[mid].key->len, name, len);
            if (c == 0)
                found = 1;
            else if (c < 0)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (!found)
            return dcp__err(err, DCP_EFORMAT,
                            "tensor '%s' of shard '%s' is not mapped to "
                            "that shard by the index",
                            name, shard);
    }
    if (n != sf->n)
        return dcp__err(err, DCP_EFORMAT,
                        "the index maps %zu tensors to shard '%s', which "
                        "holds %zu",
                        n, shard, sf->n);
    return DCP_OK;
}

static int read_json_file(int fd, const char *path, uint64_t size,
                          struct json_doc **doc, struct json_node **root,
                          struct dcp_err *err)
{
    uint8_t *buf;
    int rc;
    if (size > MAX_INDEX_JSON)
        return dcp__err(err, DCP_ELIMIT,
                        "'%s' is %" PRIu64 " bytes (limit %" PRIu64 ")", path,
                        size, MAX_INDEX_JSON);
    buf = dcp__malloc(size ? (size_t)size : 1);
    if (!buf)
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    rc = dcp__fs_pread(fd, buf, (size_t)size, 0, path, err);
    if (rc == DCP_OK)
        rc = dcp__json_parse((const char *)buf, (size_t)size, 16,
                        (size_t)size / 2 + 16 < ((size_t)1 << 22)
                            ? (size_t)size / 2 + 16
                            : ((size_t)1 << 22),
                        doc, root, err);
    dcp__free(buf);
    if (rc != DCP_OK)
        (void)dcp__err_prefix(err, "'%s'", path);
    return rc;
}

static int open_index(struct src_index *ix, const char *path, size_t *cap,
                      struct dcp_err *err)
{
    struct json_doc *doc = NULL;
    struct json_node *root = NULL;
    const struct json_node *map;
    struct map_ent *ents = NULL;
    const char *slash = strrchr(path, '/'), *dup;
    size_t dlen = slash ? (size_t)(slash - path) + 1 : 0, i, j;
    uint32_t f;
    int rc = add_file(ix, path, &f, DCP_EINVAL, err);
    if (rc == DCP_OK)
        rc = read_json_file(ix->fds[f], path, ix->sizes[f], &doc, &root, err);
    if (rc != DCP_OK)
        return rc;
    map = dcp__json_get(root, "weight_map");
    if (!map || map->kind != JSON_OBJ) {
        rc = dcp__err(err, DCP_EFORMAT, "'%s' has no weight_map object", path);
        goto out;
    }
    dup = dcp__json_dup_key(map);
    if (dup) {
        rc = dcp__err(err, DCP_EFORMAT, "'%s' maps tensor '%s' twice", path,
                      dup);
        goto out;
    }
    for (i = 0; rc == DCP_OK && i < map->len; i++) {
        const struct json_node *v = json_val(map, i);
        if (v->kind != JSON_STR)
            rc = dcp__err(err, DCP_EFORMAT,
                          "'%s': tensor '%s' maps to a JSON value that is "
                          "not a file name string",
                          path, json_key(map, i)->s);
        else if (!dcp__safe_name(v->s) || strlen(v->s) != v->len)
            rc = dcp__err(err, DCP_EUNSAFE,
                          "'%s': tensor '%s' maps to '%.64s', not a plain "
                          "file name beside the index",
                          path, json_key(map, i)->s, v->s);
    }
    if (rc == DCP_OK) {
        ents = dcp__malloc((map->len ? map->len : 1) * sizeof(*ents));
        if (!ents)
            rc = dcp__err(err, DCP_ENOMEM, "out of memory");
    }
    for (i = 0; rc == DCP_OK && i < map->len; i++) {
        ents[i].key = json_key(map, i);
        ents[i].shard = json_val(map, i);
    }
    if (rc == DCP_OK)
        qsort(ents, map->len, sizeof(*ents), cmp_map_ent);
    /* One shard per run of ents. */
    for (i = 0; rc == DCP_OK && i < map->len; i = j) {
        const char *shard = ents[i].shard->s;
        struct sf_file sf;
        char *full;
        for (j = i + 1; j < map->len && strcmp(ents[j].shard->s, shard) == 0;
             j++)
            ;
        full = dcp__malloc(dlen + strlen(shard) + 1);
        if (!full) {
            rc = dcp__err(err, DCP_ENOMEM, "out of memory");
            break;
        }
        memcpy(full, path, dlen);
        memcpy(full + dlen, shard, strlen(shard) + 1);
        rc = add_file(ix, full, &f, DCP_EUNSAFE, err);
        dcp__free(full);
        if (rc != DCP_OK)
            break;
        rc = dcp__sf_read(ix->fds[f], ix->files[f], ix->sizes[f], &sf, err);
        if (rc != DCP_OK)
            break;
        rc = check_shard(ents + i, j - i, shard, &sf, err);
        if (rc == DCP_OK)
            rc = add_sf_tensors(ix, f, &sf, cap, err);
        dcp__sf_release(&sf);
    }
    dcp__free(ents);
out:
    dcp__json_free(doc);
    return rc;
}

/* ------------------------------------------- safetensors directory */

static int dir_tensor(struct src_index *ix, const struct hf_dir *d,
                      const struct hf_tensor *t, size_t *cap,
                      struct dcp_err *err)
{
    struct src_entry *e = new_entry(ix, cap);
    size_t i;
    if (!e)
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    e->is_tensor = 1;
    e->dtype = t->dtype;
    e->ndim = t->ndim;
    memcpy(e->shape, t->shape, sizeof(e->shape));
    c_strides(e);
    DCP_RETURN_IF(flat_path(e, t->key, err));
    e->pieces = dcp__calloc(t->n, sizeof(*e->pieces));
    if (!e->pieces)
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    e->npieces = t->n;
    for (i = 0; i < t->n; i++) {
        const struct hf_piece *p = &d->p[t->first + i];
        struct src_piece *q = &e->pieces[i];
        q->file = p->file; /* files opened in d's order, from 0 */
        q->base = p->data;
        memcpy(q->off, p->off, sizeof(q->off));
        memcpy(q->size, p->size, sizeof(q->size));
        e->storage_bytes += p->bytes;
    }
    return DCP_OK;
}

static int open_dir(struct src_index *ix, const char *path, size_t *cap,
                    struct dcp_err *err)
{
    struct hf_dir d;
    size_t i, plen = strlen(path);
    int dirfd = -1, rc;
    uint32_t f;
    rc = dcp__fs_open_dir(path, &dirfd, err);
    if (rc != DCP_OK)
        return rc;
    rc = dcp__hf_scan(dirfd, path, &d, err);
    dcp__fs_release(dirfd);
    if (rc == DCP_ENOENT)
        return dcp__err(err, DCP_ENOENT,
                        "'%s': a directory without *.safetensors files", path);
    if (rc != DCP_OK)
        return rc;
    for (i = 0; rc == DCP_OK && i < d.nfiles; i++) {
        char *full = dcp__malloc(plen + strlen(d.files[i]) + 2);
        if (!full) {
            rc = dcp__err(err, DCP_ENOMEM, "out of memory");
            break;
        }
        (void)snprintf(full, plen + strlen(d.files[i]) + 2, "%s/%s", path,
                       d.files[i]);
        rc = add_file(ix, full, &f, DCP_EUNSAFE, err);
        dcp__free(full);
    }
    for (i = 0; rc == DCP_OK && i < d.nt; i++)
        rc = dir_tensor(ix, &d, &d.t[i], cap, err);
    dcp__hf_release(&d);
    return rc;
}

/* ------------------------------------------------------- torch.save */

/* Globals beyond the tensor ones (which come first, see torchzip.h). */
static const struct pk_global extra_allow[] = {
    {"torch._utils", "_rebuild_parameter"},
    {"_codecs", "encode"},
    {"__builtin__", "bytes"},
    {"builtins", "bytes"},
};

struct walk {
    struct src_index *ix;
    size_t *cap;
    const struct tz_file *tf;
    uint32_t file;
    struct md_pathel path[MAX_WALK_DEPTH];
    size_t depth;
    size_t steps;      /* visits and is_terminal calls, bounded */
    size_t vbudget[2]; /* dcp__value_from_node's, for all values */
    size_t mem_left;   /* bytes the entries may still take (charge) */
    size_t mem_budget; /* mem_left at the start */
    size_t pkl_len;
    struct dcp_err *err;
};

static int is_rebuild(const struct pk_node *n)
{
    return n && n->kind == PK_OBJ && !n->newobj &&
           (dcp__pk_obj_is(n, "torch._utils", "_rebuild_tensor_v2") ||
            dcp__pk_obj_is(n, "torch._utils", "_rebuild_tensor_v3") ||
            dcp__pk_obj_is(n, "torch._utils", "_rebuild_qtensor") ||
            dcp__pk_obj_is(n, "torch._utils", "_rebuild_parameter"));
}

/* torch's _is_terminal with _keep_visiting_tensors (*steps counts the
 * calls; the caller fails when it exceeds MAX_WALK_STEPS). */
static int is_terminal(const struct pk_node *n, size_t depth, size_t *steps)
{
    size_t i;
    if (n->kind == PK_DICT)
        return 0;
    if (n->kind != PK_LIST || depth > MAX_WALK_DEPTH ||
        ++*steps > MAX_WALK_STEPS)
        return 1;
    for (i = 0; i < n->u.seq.n; i++) {
        const struct pk_node *c = n->u.seq.v[i];
        if ((c->kind == PK_DICT || c->kind == PK_LIST) &&
            !is_terminal(c, depth + 1, steps))
            return 0;
        if (is_rebuild(c))
            return 0;
    }
    return 1;
}

static int set_key_path(struct walk *w, struct src_entry *e)
{
    size_t i;
    int rc;
    e->path = dcp__calloc(w->depth ? w->depth : 1, sizeof(*e->path));
    if (!e->path)
        return DCP_ENOMEM;
    for (i = 0; i < w->depth; i++) {
        e->path[i].i = w->path[i].i;
        if (w->path[i].s && !(e->path[i].s = dcp__strdup(w->path[i].s)))
            return DCP_ENOMEM;
        e->npath = i + 1;
    }
    rc = dcp__cv_join(e->path, e->npath, &e->key);
    return rc;
}

static int tensor_leaf(struct walk *w, const struct pk_node *n,
                       struct src_entry *e)
{
    const struct tz_entry *rec, *bo;
    struct tz_tensor t;
    char name[TZ_MAX_NAME + 8];
    uint64_t want;
    int64_t s = 1;
    int d, rc;
    if (dcp__pk_obj_is(n, "torch._utils", "_rebuild_parameter")) {
        if (!n->u.obj.args || n->u.obj.args->kind != PK_TUPLE ||
            n->u.obj.args->u.seq.n < 1)
            return dcp__err(w->err, DCP_EFORMAT,
                            "'%s': malformed _rebuild_parameter", e->key);
        n = n->u.obj.args->u.seq.v[0];
    }
    rc = dcp__tz_tensor_from_node(n, &t, w->err);
    if (rc != DCP_OK)
        return dcp__err_prefix(w->err, "'%s'", e->key);
    (void)snprintf(name, sizeof(name), "data/%s", t.key);
    rec = dcp__tz_file_find(w->tf, name);
    want = t.storage_numel * dcp_dtype_size(t.dtype);
    if (!rec || rec->size != want)
        return dcp__err(
            w->err, DCP_EFORMAT,
            "'%s': storage record '%s' is %s (%" PRIu64 " bytes expected)",
            e->key, name, rec ? "of the wrong size" : "missing", want);
    bo = dcp__tz_file_find(w->tf, "byteorder");
    if (bo && bo->size != 6)
        return dcp__err(w->err, DCP_ENOTSUP, "the file is not little-endian");
    e->is_tensor = 1;
    e->dtype = t.dtype;
    e->ndim = t.ndim;
    memcpy(e->shape, t.size, sizeof(e->shape));
    memcpy(e->stride, t.stride, sizeof(e->stride));
    e->storage_offset = t.storage_offset;
    e->file = w->file;
    e->base = rec->data_off;
    e->storage_bytes = rec->size;
    e->contiguous = 1;
    for (d = t.ndim - 1; d >= 0; d--) {
        if (t.size[d] != 1 && t.stride[d] != s)
            e->contiguous = 0;
        s *= t.size[d];
    }
    return DCP_OK;
}

/* Counts the objects a value conversion would build (memo references
 * counted at every use), stopping once *left runs out: cheap, and it keeps
 * an expanding value from being built at all. */
static void count_nodes(const struct pk_node *n, size_t depth, size_t *left)
{
    size_t i;
    if (*left == 0)
        return;
    (*left)--;
    if (depth > MAX_WALK_DEPTH ||
        (n->kind != PK_TUPLE && n->kind != PK_LIST && n->kind != PK_DICT))
        return;
    for (i = 0; i < n->u.seq.n && *left; i++)
        count_nodes(n->u.seq.v[i], depth + 1, left);
}

/*
 * Charges an entry at the current path against the walk's memory budget,
 * which is tied to the size of data.pkl (WALK_MEM_BASE + WALK_MEM_PER_BYTE
 * per byte): memo references let a pickle of a few hundred bytes name a
 * dict shared at every level, whose 2^30 paths would each become an entry
 * with its own key (a 1.3 KB file took 2 GB and 5 s to refuse).
 */
static int charge(struct walk *w)
{
    size_t cost = sizeof(struct src_entry), i;
    for (i = 0; i < w->depth; i++)
        cost += sizeof(struct md_pathel) + 24 +
                (w->path[i].s ? 2 * (strlen(w->path[i].s) + 1) : 0);
    if (cost > w->mem_left)
        return dcp__err(w->err, DCP_ELIMIT,
                        "the state dict's entries take more than %zu bytes "
                        "for a data.pkl of %zu bytes (shared references "
                        "expand)",
                        w->mem_budget, w->pkl_len);
    w->mem_left -= cost;
    return DCP_OK;
}

static int leaf(struct walk *w, const struct pk_node *n)
{
    struct src_entry *e;
    int rc;
    if (w->ix->n >= MAX_ENTRIES)
        return dcp__err(w->err, DCP_ELIMIT, "more than %zu entries",
                        MAX_ENTRIES);
    rc = charge(w);
    if (rc != DCP_OK)
        return rc;
    e = new_entry(w->ix, w->cap);
    if (!e)
        return dcp__err(w->err, DCP_ENOMEM, "out of memory");
    if (w->depth == 0)
        return dcp__err(w->err, DCP_EFORMAT,
                        "the file holds a single object, not a state dict");
    if (set_key_path(w, e) != DCP_OK)
        return dcp__err(w->err, DCP_ENOMEM, "out of memory");
    if (is_rebuild(n))
        return tensor_leaf(w, n, e);
    {
        size_t left = MAX_WALK_STEPS - w->vbudget[0] + 1;
        count_nodes(n, 0, &left);
        if (left == 0)
            return dcp__err(w->err, DCP_ELIMIT,
                            "'%s': values of more than %zu objects (shared "
                            "references expand)",
                            e->key, MAX_WALK_STEPS);
    }
    rc = dcp__value_from_node(n, w->vbudget, &e->value, w->err);
    if (rc != DCP_OK)
        return dcp__err_prefix(w->err, "'%s'", e->key);
    return DCP_OK;
}

static int visit(struct walk *w, const struct pk_node *n)
{
    size_t i;
    int rc = DCP_OK;
    if (w->depth >= MAX_WALK_DEPTH)
        return dcp__err(w->err, DCP_ELIMIT, "state dict nested deeper than %d",
                        MAX_WALK_DEPTH);
    if (++w->steps > MAX_WALK_STEPS)
        return dcp__err(w->err, DCP_ELIMIT,
                        "state dict walk exceeds %zu steps (shared "
                        "references expand)",
                        MAX_WALK_STEPS);
    if (n->kind == PK_DICT) {
        for (i = 0; rc == DCP_OK && i < n->u.seq.n; i += 2) {
            const struct pk_node *k = n->u.seq.v[i];
            char num[32];
            if (k->kind == PK_INT) {
                (void)snprintf(num, sizeof(num), "%" PRId64, k->u.i);
                w->path[w->depth].s = num;
            } else if (k->kind == PK_STR) {
                w->path[w->depth].s = (char *)(uintptr_t)k->u.s.p;
            } else {
                return dcp__err(w->err, DCP_ENOTSUP,
                                "a dict key that is not a str or an int");
            }
            w->path[w->depth++].i = 0;
            rc = visit(w, n->u.seq.v[i + 1]);
            w->depth--;
        }
        return rc;
    }
    if (w->depth > 0 && (n->kind == PK_LIST || n->kind == PK_TUPLE) &&
        !is_terminal(n, 0, &w->steps)) {
        for (i = 0; rc == DCP_OK && i < n->u.seq.n; i++) {
            w->path[w->depth].s = NULL;
            w->path[w->depth++].i = (int64_t)i;
            rc = visit(w, n->u.seq.v[i]);
            w->depth--;
        }
        return rc;
    }
    return leaf(w, n);
}

struct fd_reader {
    int fd;
    const char *name;
};

static int fd_read(void *opaque, uint64_t off, void *buf, size_t len,
                   struct dcp_err *err)
{
    const struct fd_reader *r = opaque;
    return dcp__fs_pread(r->fd, buf, len, off, r->name, err);
}

static int decode_pickle(const uint8_t *pkl, size_t len, struct pk_arena **a,
                         struct pk_node **root, struct dcp_err *err)
{
    const struct pk_global *tg;
    struct pk_global *allow;
    size_t nt = dcp__tz_tensor_globals(&tg), i;
    int rc;
    allow = dcp__malloc((nt + DCP_ARRAY_LEN(extra_allow)) * sizeof(*allow));
    if (!allow)
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    for (i = 0; i < nt; i++)
        allow[i] = tg[i];
    for (i = 0; i < DCP_ARRAY_LEN(extra_allow); i++)
        allow[nt + i] = extra_allow[i];
    rc = dcp__pk_decode(pkl, len, allow, nt + DCP_ARRAY_LEN(extra_allow), NULL, 0, a,
                   root, err);
    dcp__free(allow);
    return rc;
}

static int open_torch(struct src_index *ix, const char *path,
                      uint64_t max_pickle, size_t *cap, struct dcp_err *err)
{
    struct fd_reader r;
    struct tz_file tf;
    const struct tz_entry *pe;
    struct pk_arena *arena = NULL;
    struct pk_node *root = NULL;
    uint8_t *pkl = NULL;
    struct walk w;
    uint32_t f;
    int rc = add_file(ix, path, &f, DCP_EINVAL, err);
    if (rc != DCP_OK)
        return rc;
    r.fd = ix->fds[f];
    r.name = path;
    rc = dcp__tz_file_open(&tf, ix->sizes[f], MAX_RECORDS, fd_read, &r, err);
    if (rc != DCP_OK)
        return dcp__err_prefix(err, "'%s'", path);
    pe = dcp__tz_file_find(&tf, "data.pkl");
    if (!pe) {
        rc = dcp__err(err, DCP_EFORMAT, "'%s' has no data.pkl", path);
        goto out;
    }
    rc = dcp__tz_file_read_entry(
        &tf, pe, max_pickle > SIZE_MAX ? SIZE_MAX : (size_t)max_pickle, 1,
        fd_read, &r, &pkl, err);
    if (rc == DCP_OK)
        rc = decode_pickle(pkl, (size_t)pe->size, &arena, &root, err);
    if (rc != DCP_OK) {
        (void)dcp__err_prefix(err, "'%s'", path);
        goto out;
    }
    memset(&w, 0, sizeof(w));
    w.ix = ix;
    w.cap = cap;
    w.tf = &tf;
    w.file = f;
    w.err = err;
    w.pkl_len = (size_t)pe->size;
    w.mem_budget = w.pkl_len > (SIZE_MAX - WALK_MEM_BASE) / WALK_MEM_PER_BYTE
                       ? SIZE_MAX
                       : WALK_MEM_BASE + WALK_MEM_PER_BYTE * w.pkl_len;
    w.mem_left = w.mem_budget;
    if (root->kind != PK_DICT)
        rc = dcp__err(err, DCP_EFORMAT,
                      "'%s' holds no state dict (the pickle's top object is "
                      "not a dict)",
                      path);
    else
        rc = visit(&w, root);
    if (rc != DCP_OK)
        (void)dcp__err_prefix(err, "'%s'", path);
out:
    dcp__pk_arena_free(arena);
    dcp__free(pkl);
    dcp__tz_file_release(&tf);
    return rc;
}

/* ------------------------------------------------------------- open */

static int cmp_entry(const void *a, const void *b)
{
    return strcmp(((const struct src_entry *)a)->key,
                  ((const struct src_entry *)b)->key);
}

static int sniff(const char *path, int *format, struct dcp_err *err)
{
    uint8_t m[4] = {0};
    size_t n = strlen(path);
    struct stat sb;
    ssize_t got;
    int fd;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        *format = DCP_FORMAT_SAFETENSORS_DIR;
        return DCP_OK;
    }
    if (n >= 5 && strcmp(path + n - 5, ".json") == 0) {
        *format = DCP_FORMAT_SAFETENSORS_INDEX;
        return DCP_OK;
    }
    fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return dcp__err(err, errno == ENOENT ? DCP_ENOENT : DCP_EIO,
                        "cannot open '%s': %s", path, strerror(errno));
    got = read(fd, m, sizeof(m));
    (void)close(fd);
    *format = got == 4 && m[0] == 'P' && m[1] == 'K' && m[2] == 3 && m[3] == 4
                  ? DCP_FORMAT_TORCH
                  : DCP_FORMAT_SAFETENSORS;
    return DCP_OK;
}

int dcp__src_open(const char *path, int format, uint64_t max_pickle,
                  struct src_index *ix, struct dcp_err *err)
{
    size_t cap = 0, i;
    int rc = DCP_OK;
    memset(ix, 0, sizeof(*ix));
    if (!path)
        return dcp__err(err, DCP_EINVAL, "no file");
    if (format == DCP_FORMAT_AUTO)
        rc = sniff(path, &format, err);
    if (rc != DCP_OK)
        return rc;
    ix->format = format;
    switch (format) {
    case DCP_FORMAT_SAFETENSORS:
        rc = open_safetensors(ix, path, &cap, err);
        break;
    case DCP_FORMAT_SAFETENSORS_INDEX:
        rc = open_index(ix, path, &cap, err);
        break;
    case DCP_FORMAT_TORCH:
        rc = open_torch(ix, path, max_pickle, &cap, err);
        break;
    case DCP_FORMAT_SAFETENSORS_DIR:
        rc = open_dir(ix, path, &cap, err);
        break;
    default:
        rc = dcp__err(err, DCP_EINVAL, "unknown file format %d", format);
    }
    if (rc == DCP_OK) {
        qsort(ix->e, ix->n, sizeof(*ix->e), cmp_entry);
        for (i = 1; rc == DCP_OK && i < ix->n; i++)
            if (strcmp(ix->e[i - 1].key, ix->e[i].key) == 0)
                rc = dcp__err(err, DCP_EFORMAT, "'%s': key '%s' occurs twice",
                              path, ix->e[i].key);
    }
    if (rc != DCP_OK)
        dcp__src_close(ix);
    return rc;
}

const struct src_entry *dcp__src_find(const struct src_index *ix,
                                      const char *key)
{
    size_t lo = 0, hi = ix->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(ix->e[mid].key, key);
        if (c == 0)
            return &ix->e[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* ------------------------------------------------------------- read */

static int load_cache(struct src_index *ix, const struct src_entry *e,
                      uint64_t limit, struct dcp_err *err)
{
    if (ix->cached == e)
        return DCP_OK;
    if (e->storage_bytes > limit || e->storage_bytes > SIZE_MAX)
        return dcp__err(err, DCP_ENOTSUP,
                        "'%s': a non-contiguous tensor whose storage (%" PRIu64
                        " bytes) exceeds the memory limit (%" PRIu64 ")",
                        e->key, e->storage_bytes, limit);
    if (e->storage_bytes > ix->cache_cap) {
        uint8_t *p = dcp__realloc(ix->cache, (size_t)e->storage_bytes);
        if (!p)
            return dcp__err(err, DCP_ENOMEM, "out of memory");
        ix->cache = p;
        ix->cache_cap = (size_t)e->storage_bytes;
    }
    ix->cached = NULL;
    if (e->storage_bytes)
        DCP_RETURN_IF(dcp__fs_pread(ix->fds[e->file], ix->cache,
                                    (size_t)e->storage_bytes, e->base,
                                    ix->files[e->file], err));
    ix->cached = e;
    return DCP_OK;
}

/* Copies the box (off, size) of the cached view e into dst, contiguous. */
static void gather_box(const struct src_index *ix, const struct src_entry *e,
                       const int64_t *off, const int64_t *size, uint8_t *dst)
{
    int64_t dstride[DCP_MAX_NDIM];
    dcp__box_cstrides(e->ndim, size, dstride);
    dcp__box_copy(e->ndim, dcp_dtype_size(e->dtype), size, ix->cache,
                  e->storage_offset +
                      dcp__box_at(e->ndim, off, NULL, e->stride),
                  e->stride, dst, 0, dstride);
}

/* ------------------------------------------------- quantized input */

/* The stored tensor behind a dequantized entry (e itself for another). */
static struct src_entry stored(const struct src_entry *e)
{
    struct src_entry r = *e;
    if (!e->quant)
        return r;
    r.quant = 0;
    r.dtype = e->qdtype;
    r.ndim = e->qndim;
    memcpy(r.shape, e->qshape, sizeof(r.shape));
    return r;
}

/* Reads box (off, size) of the stored tensor of e (count elements of
 * esize bytes) into a new buffer *out. */
static int read_stored(struct src_index *ix, const struct src_entry *e,
                       const int64_t *off, const int64_t *size, uint64_t limit,
                       uint8_t **out, struct dcp_err *err)
{
    struct src_entry r = stored(e);
    uint64_t n = dcp__box_numel(r.ndim, size) * dcp_dtype_size(r.dtype);
    int rc;
    *out = dcp__malloc(n ? (size_t)n : 1);
    if (!*out)
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    rc = dcp__src_read_box(ix, &r, off, size, *out, limit, err);
    /* The cache is keyed by entry address: r is gone on return, and the
     * next call's r may sit at the same address for another tensor. */
    if (ix->cached == &r)
        ix->cached = NULL;
    if (rc != DCP_OK) {
        dcp__free(*out);
        *out = NULL;
    }
    return rc;
}

/* weight * scale_inv per block of qblock x qblock, in float32. */
static int read_fp8(struct src_index *ix, const struct src_entry *e,
                    const int64_t *off, const int64_t *size, float *dst,
                    uint64_t limit, struct dcp_err *err)
{
    const struct src_entry *se = &ix->e[e->qscale];
    int64_t b = e->qblock, soff[2], ssz[2], i, j;
    uint64_t n = dcp__box_numel(2, size), ns;
    uint8_t *raw = NULL, *sraw = NULL;
    float *sc = NULL;
    int rc, crc = DCP_OK;
    soff[0] = off[0] / b;
    soff[1] = off[1] / b;
    ssz[0] = (off[0] + size[0] - 1) / b + 1 - soff[0];
    ssz[1] = (off[1] + size[1] - 1) / b + 1 - soff[1];
    ns = (uint64_t)(ssz[0] * ssz[1]);
    rc = read_stored(ix, e, off, size, limit, &raw, err);
    if (rc == DCP_OK)
        rc = read_stored(ix, se, soff, ssz, limit, &sraw, err);
    if (rc == DCP_OK && !(sc = dcp__malloc((size_t)ns * sizeof(float))))
        rc = dcp__err(err, DCP_ENOMEM, "out of memory");
    /* torch converts the weight to float32 and multiplies by the scale in
     * float32 */
    if (rc == DCP_OK)
        crc = dcp_convert_elements(dst, DCP_F32, raw, e->qdtype, (size_t)n);
    if (rc == DCP_OK && crc == DCP_OK)
        crc = dcp_convert_elements(sc, DCP_F32, sraw, se->dtype, (size_t)ns);
    if (crc != DCP_OK)
        rc = dcp__err(err, crc, "'%s': cannot convert to float32", e->key);
    for (i = 0; rc == DCP_OK && i < size[0]; i++) {
        const float *row = sc + ((off[0] + i) / b - soff[0]) * ssz[1];
        for (j = 0; j < size[1]; j++)
            dst[i * size[1] + j] *= row[(off[1] + j) / b - soff[1]];
    }
    dcp__free(raw);
    dcp__free(sraw);
    dcp__free(sc);
    return rc;
}

/* FP4 e2m1 codes * 2^(exponent - 127) rounded once to float32, as torch's
 * ldexp (exact, then 2^128 and beyond infinite; 0 * 2^128 is 0). */
static int read_mxfp4(struct src_index *ix, const struct src_entry *e,
                      const int64_t *off, const int64_t *size, float *dst,
                      uint64_t limit, struct dcp_err *err)
{
    static const double lut[16] = {0.0,  0.5,  1.0,  1.5,  2.0,  3.0,
                                   4.0,  6.0,  -0.0, -0.5, -1.0, -1.5,
                                   -2.0, -3.0, -4.0, -6.0};
    const struct src_entry *se = &ix->e[e->qscale];
    int64_t B = e->qshape[3], vpg = 2 * B, boff[4], bsz[4], ng, i, x;
    uint8_t *blk = NULL, *sc = NULL;
    double pow2[256];
    float inf;
    uint32_t infbits = 0x7f800000u;
    int rc, k;
    memcpy(&inf, &infbits, 4);
    for (pow2[127] = 1.0, k = 128; k < 256; k++)
        pow2[k] = pow2[k - 1] * 2.0;
    for (k = 126; k >= 0; k--)
        pow2[k] = pow2[k + 1] / 2.0; /* exact: 2^-127 is a double */
    boff[0] = off[0];
    boff[1] = off[1];
    boff[2] = off[2] / vpg;
    boff[3] = 0;
    bsz[0] = size[0];
    bsz[1] = size[1];
    bsz[2] = ng = (off[2] + size[2] - 1) / vpg + 1 - boff[2];
    bsz[3] = B;
    rc = read_stored(ix, e, boff, bsz, limit, &blk, err);
    if (rc == DCP_OK)
        rc = read_stored(ix, se, boff, bsz, limit, &sc, err);
    for (i = 0; rc == DCP_OK && i < size[0] * size[1]; i++)
        for (x = 0; x < size[2]; x++) {
            int64_t X = off[2] + x, g = X / vpg - boff[2], w = X % vpg;
            uint8_t byte = blk[(i * ng + g) * B + w / 2];
            /* exact in double; |v| > FLT_MAX means v >= 2^128 */
            double v =
                lut[(w & 1) ? byte >> 4 : byte & 15] * pow2[sc[i * ng + g]];
            *dst++ = v > FLT_MAX ? inf : v < -FLT_MAX ? -inf : (float)v;
        }
    dcp__free(blk);
    dcp__free(sc);
    return rc;
}

static int read_quant(struct src_index *ix, const struct src_entry *e,
                      const int64_t *off, const int64_t *size, uint8_t *dst,
                      uint64_t limit, struct dcp_err *err)
{
    float *out = (float *)(void *)dst; /* buffers of float32 elements */
    return e->quant == SRC_Q_FP8
               ? read_fp8(ix, e, off, size, out, limit, err)
               : read_mxfp4(ix, e, off, size, out, limit, err);
}

/* Index of the tensor entry named key + suffix (the key's first n bytes),
 * or (size_t)-1. */
static size_t find_pair(const struct src_index *ix, const char *key, size_t n,
                        const char *suffix)
{
    const struct src_entry *p;
    char *name = dcp__malloc(n + strlen(suffix) + 1);
    if (!name)
        return (size_t)-2;
    memcpy(name, key, n);
    memcpy(name + n, suffix, strlen(suffix) + 1);
    p = dcp__src_find(ix, name);
    dcp__free(name);
    return p && p->is_tensor ? (size_t)(p - ix->e) : (size_t)-1;
}

static int ends_with(const char *s, const char *suffix, size_t *stem)
{
    size_t n = strlen(s), k = strlen(suffix);
    *stem = n >= k ? n - k : 0;
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

static int quant_fp8(struct src_index *ix, struct src_entry *e, size_t si,
                     uint32_t block, struct dcp_err *err)
{
    const struct src_entry *s = &ix->e[si];
    int64_t need0, need1;
    if (e->ndim != 2)
        return dcp__err(err, DCP_ENOTSUP,
                        "'%s': a quantized weight of %d dims (torch "
                        "dequantizes 2-D ones)",
                        e->key, e->ndim);
    /* shapes are >= 0 and may reach INT64_MAX: no + block - 1 */
    need0 = e->shape[0] / block + (e->shape[0] % block != 0);
    need1 = e->shape[1] / block + (e->shape[1] % block != 0);
    if (s->ndim != 2 || s->shape[0] < need0 || s->shape[1] < need1)
        return dcp__err(err, DCP_EFORMAT,
                        "'%s': scales of %d dims, not at least [%" PRId64
                        ",%" PRId64 "] for blocks of %u",
                        s->key, s->ndim, need0, need1, block);
    if (dcp_convert_elements(NULL, DCP_F32, NULL, s->dtype, 0) != DCP_OK ||
        dcp_convert_elements(NULL, DCP_F32, NULL, e->dtype, 0) != DCP_OK)
        return dcp__err(err, DCP_ENOTSUP,
                        "'%s': %s or its scale's %s does not convert to "
                        "float32",
                        e->key, dcp_dtype_name(e->dtype),
                        dcp_dtype_name(s->dtype));
    e->quant = SRC_Q_FP8;
    return DCP_OK;
}

static int quant_mxfp4(struct src_index *ix, struct src_entry *e, size_t si,
                       struct dcp_err *err)
{
    const struct src_entry *s = &ix->e[si];
    if (e->ndim != 4 || e->dtype != DCP_U8 || s->dtype != DCP_U8)
        return dcp__err(err, DCP_ENOTSUP,
                        "'%s': MXFP4 blocks other than uint8 of 4 dims with "
                        "uint8 scales",
                        e->key);
    if (s->ndim != 3 || !dcp__same_ints(s->shape, e->shape, 3))
        return dcp__err(err, DCP_EFORMAT,
                        "'%s': its scales are not of the blocks' shape "
                        "without the last dim",
                        s->key);
    if (e->shape[3] > INT64_MAX / 2 / (e->shape[2] ? e->shape[2] : 1))
        return dcp__err(err, DCP_ELIMIT, "'%s': too many values", e->key);
    e->quant = SRC_Q_MXFP4;
    return DCP_OK;
}

int dcp__src_dequant(struct src_index *ix, uint32_t block, struct dcp_err *err)
{
    size_t i, stem, si;
    int rc = DCP_OK;
    if (block == 0)
        return dcp__err(err, DCP_EINVAL, "a block size of 0");
    for (i = 0; rc == DCP_OK && i < ix->n; i++) {
        struct src_entry *e = &ix->e[i];
        if (!e->is_tensor)
            continue;
        if (ends_with(e->key, ".weight", &stem))
            si = find_pair(ix, e->key, stem + 7, "_scale_inv");
        else if (ends_with(e->key, "_blocks", &stem))
            si = find_pair(ix, e->key, stem, "_scales");
        else
            continue;
        if (si == (size_t)-2)
            return dcp__err(err, DCP_ENOMEM, "out of memory");
        if (si == (size_t)-1)
            continue;
        e->qdtype = e->dtype;
        e->qndim = e->ndim;
        memcpy(e->qshape, e->shape, sizeof(e->qshape));
        e->qscale = si;
        e->qblock = block;
        rc = e->key[stem] == '_' ? quant_mxfp4(ix, e, si, err)
                                 : quant_fp8(ix, e, si, block, err);
        if (rc != DCP_OK)
            break;
        e->dtype = DCP_F32;
        if (e->quant == SRC_Q_MXFP4) {
            e->ndim = 3;
            e->shape[2] = e->qshape[2] * e->qshape[3] * 2;
            e->shape[3] = 0;
        }
    }
    return rc;
}

/* The box (off, size) of a tensor stored in pieces: the part of each
 * piece inside the box, one read per run. The pieces tile the tensor, so
 * every byte of dst is written once. */
static int read_pieces(struct src_index *ix, const struct src_entry *e,
                       const int64_t *off, const int64_t *size, uint8_t *dst,
                       struct dcp_err *err)
{
    size_t es = dcp_dtype_size(e->dtype), i;
    int64_t dstride[DCP_MAX_NDIM], pstride[DCP_MAX_NDIM];
    int64_t lo[DCP_MAX_NDIM], isz[DCP_MAX_NDIM];
    struct box_runs r;
    int d, empty;
    dcp__box_cstrides(e->ndim, size, dstride);
    for (i = 0; i < e->npieces; i++) {
        const struct src_piece *p = &e->pieces[i];
        for (d = 0, empty = 0; d < e->ndim; d++) {
            int64_t a = off[d] > p->off[d] ? off[d] : p->off[d];
            int64_t b = off[d] + size[d] < p->off[d] + p->size[d]
                            ? off[d] + size[d]
                            : p->off[d] + p->size[d];
            lo[d] = a;
            isz[d] = b > a ? b - a : 0;
            empty |= b <= a;
        }
        if (empty)
            continue;
        if (e->ndim == 0) { /* the one element */
            DCP_RETURN_IF(dcp__fs_pread(ix->fds[p->file], dst, es, p->base,
                                        ix->files[p->file], err));
            continue;
        }
        dcp__box_cstrides(e->ndim, p->size, pstride);
        dcp__box_runs_init(&r, e->ndim, isz,
                           dcp__box_at(e->ndim, lo, p->off, pstride), pstride,
                           dcp__box_at(e->ndim, lo, off, dstride), dstride);
        while (dcp__box_runs_next(&r))
            DCP_RETURN_IF(dcp__fs_pread(
                ix->fds[p->file], dst + (size_t)r.dst * es, (size_t)r.run * es,
                p->base + (uint64_t)r.src * es, ix->files[p->file], err));
    }
    return DCP_OK;
}

/* count elements of a tensor stored in pieces or quantized from linear
 * index first, as at most 2 * ndim boxes: each the largest block aligned
 * at first that fits the rest. */
static int read_linear(struct src_index *ix, const struct src_entry *e,
                       uint64_t first, uint64_t count, uint8_t *dst,
                       uint64_t limit, struct dcp_err *err)
{
    size_t es = dcp_dtype_size(e->dtype);
    int64_t idx[DCP_MAX_NDIM] = {0}, sz[DCP_MAX_NDIM] = {0};
    uint64_t rem, inner, m;
    int nd = e->ndim, d, L;
    if (nd == 0)
        return dcp__src_read_box(ix, e, idx, sz, dst, limit, err);
    while (count > 0) {
        for (rem = first, d = nd - 1; d >= 0; d--) {
            idx[d] = (int64_t)(rem % (uint64_t)e->shape[d]);
            rem /= (uint64_t)e->shape[d];
        }
        for (L = nd - 1, inner = 1;
             L > 0 && idx[L] == 0 && inner * (uint64_t)e->shape[L] <= count;
             L--)
            inner *= (uint64_t)e->shape[L];
        m = (uint64_t)(e->shape[L] - idx[L]);
        if (m > count / inner)
            m = count / inner;
        for (d = 0; d < nd; d++)
            sz[d] = d < L ? 1 : d == L ? (int64_t)m : e->shape[d];
        DCP_RETURN_IF(dcp__src_read_box(ix, e, idx, sz, dst, limit, err));
        dst += m * inner * es;
        first += m * inner;
        count -= m * inner;
    }
    return DCP_OK;
}

int dcp__src_read_box(struct src_index *ix, const struct src_entry *e,
                      const int64_t *off, const int64_t *size, void *dst,
                      uint64_t cache_limit, struct dcp_err *err)
{
    size_t es = dcp_dtype_size(e->dtype);
    int64_t dstride[DCP_MAX_NDIM];
    struct box_runs r;
    uint8_t *out = dst;
    if (dcp__box_numel(e->ndim, size) == 0)
        return DCP_OK;
    if (e->quant)
        return read_quant(ix, e, off, size, out, cache_limit, err);
    if (e->pieces)
        return read_pieces(ix, e, off, size, out, err);
    if (!e->contiguous) {
        DCP_RETURN_IF(load_cache(ix, e, cache_limit, err));
        gather_box(ix, e, off, size, out);
        return DCP_OK;
    }
    /* Straight from the file, one read per run. */
    dcp__box_cstrides(e->ndim, size, dstride);
    dcp__box_runs_init(&r, e->ndim, size,
                       e->storage_offset +
                           dcp__box_at(e->ndim, off, NULL, e->stride),
                       e->stride, 0, dstride);
    while (dcp__box_runs_next(&r))
        DCP_RETURN_IF(dcp__fs_pread(
            ix->fds[e->file], out + (size_t)r.dst * es, (size_t)r.run * es,
            e->base + (uint64_t)r.src * es, ix->files[e->file], err));
    return DCP_OK;
}

int dcp__src_read(struct src_index *ix, const struct src_entry *e,
                  uint64_t first, uint64_t count, void *dst,
                  uint64_t cache_limit, struct dcp_err *err)
{
    size_t es = dcp_dtype_size(e->dtype);
    int64_t off[DCP_MAX_NDIM], size[DCP_MAX_NDIM];
    uint8_t *out = dst;
    int nd = e->ndim, d;
    if (count == 0)
        return DCP_OK;
    if (e->pieces || e->quant)
        return read_linear(ix, e, first, count, dst, cache_limit, err);
    if (e->contiguous)
        return dcp__fs_pread(ix->fds[e->file], dst, (size_t)(count * es),
                             e->base +
                                 ((uint64_t)e->storage_offset + first) * es,
                             ix->files[e->file], err);
    DCP_RETURN_IF(load_cache(ix, e, cache_limit, err));
    /* Element by element through the view, in C order. */
    while (count > 0) {
        uint64_t rem = first;
        for (d = nd - 1; d >= 0; d--) {
            off[d] = (int64_t)(rem % (uint64_t)e->shape[d]);
            rem /= (uint64_t)e->shape[d];
            size[d] = 1;
        }
        gather_box(ix, e, off, size, out);
        out += es;
        first++;
        count--;
    }
    return DCP_OK;
}
