/*
 * .metadata fast path: decodes the pickle layout dcp__meta_encode writes
 * (protocol 2; strings and classes memoized; objects as NEWOBJ + BUILD of a
 * dict filled by MARK ... SETITEMS batches; torch.Size by REDUCE) straight
 * into struct dcp_metadata, without building a pickle tree.
 *
 * The general decoder (meta.c: safe pickle VM, then a walk over the tree)
 * costs about 40 ns per opcode and holds the whole tree; a 4096-rank x
 * 2000-tensor checkpoint has 8 Mi chunks and 887 MiB of .metadata, which
 * took it 20 s and 8 GiB. Here each opcode is a byte compare and the only
 * memory is the result.
 *
 * It is a recognizer, not a second decoder: at the first byte that is not
 * exactly what it expects -- another writer's layout (Python's pickler
 * PUTs every object and uses other opcodes), or anything the general
 * decoder would refuse -- it gives up (META_FAST_DECLINE) and the general
 * decoder runs and produces the error. So it never decides an error, and
 * whatever it accepts it decodes exactly as the general decoder would (a
 * unit test compares the two on the same bytes). It performs the same
 * checks as meta.c's walk: known classes, supported dtypes, chunks inside
 * the global shape, one storage entry per chunk, safe file names, valid
 * UTF-8 strings, bounded sizes.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "meta.h"
#include "pickle.h"
#include "text.h"

#define DECLINE META_FAST_DECLINE

/* For the few helpers the per-item paths call millions of times, which the
 * compiler would otherwise keep out of line. */
#define HOT static inline __attribute__((always_inline))

/* The classes the layout uses. */
enum {
    G_NONE,
    G_METADATA,
    G_TSM, /* TensorStorageMetadata */
    G_BSM, /* BytesStorageMetadata */
    G_CSM, /* ChunkStorageMetadata */
    G_PROPS,
    G_STORAGE_META,
    G_MDINDEX,
    G_SINFO,
    G_MEMFMT_ENC,
    G_SIZE,
    G_GET_LAYOUT,
    G_DTYPE /* torch.<dtype>: the dtype is in the memo entry */
};

static const struct {
    const char *module, *name;
    int id;
} classes[] = {
    {MD_MOD_DCP, "Metadata", G_METADATA},
    {MD_MOD_DCP, "TensorStorageMetadata", G_TSM},
    {MD_MOD_DCP, "BytesStorageMetadata", G_BSM},
    {MD_MOD_DCP, "ChunkStorageMetadata", G_CSM},
    {MD_MOD_DCP, "TensorProperties", G_PROPS},
    {MD_MOD_DCP, "StorageMeta", G_STORAGE_META},
    {MD_MOD_DCP, "MetadataIndex", G_MDINDEX},
    {MD_MOD_DCP, "_MEM_FORMAT_ENCODING", G_MEMFMT_ENC},
    {MD_MOD_FS, "_StorageInfo", G_SINFO},
    {"torch", "Size", G_SIZE},
    {"torch.serialization", "_get_layout", G_GET_LAYOUT},
};

/* The attribute names: a memoized string carries its word. */
enum {
    W_NONE,
    W_STATE_DICT_METADATA,
    W_PLANNER_DATA,
    W_STORAGE_DATA,
    W_STORAGE_META,
    W_VERSION,
    W_PROPERTIES,
    W_SIZE,
    W_CHUNKS,
    W_OFFSETS,
    W_SIZES,
    W_FQN,
    W_OFFSET,
    W_INDEX,
    W_RELATIVE_PATH,
    W_LENGTH,
    W_CHECKPOINT_ID,
    W_SAVE_ID,
    W_LOAD_ID,
    W_MODULES,
    W_TORCH_STRIDED
};

static const char *const words[] = {
    "",           "state_dict_metadata", "planner_data", "storage_data",
    "storage_meta", "version",           "properties",   "size",
    "chunks",     "offsets",             "sizes",        "fqn",
    "offset",     "index",               "relative_path", "length",
    "checkpoint_id", "save_id",          "load_id",      "modules",
    "torch.strided",
};

/* A memo slot: what the writer stored under that index. */
enum { MK_EMPTY, MK_STR, MK_GLOBAL, MK_LAYOUT, MK_MEMFMT };

struct mslot {
    uint8_t kind;
    uint8_t word;  /* MK_STR: W_* */
    uint8_t id;    /* MK_GLOBAL: G_* */
    uint8_t dtype; /* MK_GLOBAL, G_DTYPE */
    uint32_t len;  /* MK_STR */
    const char *s; /* MK_STR: into the input */
    uint32_t entry; /* MK_STR as an fqn: md entry + 1, 0 = not yet */
    uint32_t file;  /* MK_STR as a file name: md->files index + 1 */
};

/*
 * At scale nearly all of the input is two items repeated millions of times
 * as dcp__meta_encode writes them, with GETs of memoized classes and
 * strings: a ChunkStorageMetadata, and a storage_data (MetadataIndex,
 * _StorageInfo) pair. Once the memo holds those classes and strings, the
 * items' bytes between their ints (and the GETs of key and file name) are
 * known: a template's segments. An item that matches them is read with a
 * few compares, exactly as the op-by-op path would read it; any other (a
 * first occurrence, another writer's, a mutation) is read by that path
 * from its start.
 */
struct tpl {
    uint8_t built;
    uint8_t n[5];
    uint8_t b[5][24];
    uint64_t w[5][3]; /* b as words, and which of their bytes count */
    uint64_t mask[5][3];
};

struct fd {
    const uint8_t *p, *end;
    struct mslot *memo;
    size_t nmemo;
    struct dcp_metadata *md;
    size_t cape;  /* md->e capacity */
    int64_t *ints; /* chunk offsets and sizes, in order */
    size_t nints, capints;
    /* Every entry's chunks, in order (md->chunk_block once read); entry
     * i's start at cstart[i]. */
    struct md_chunk *chunks;
    size_t capchunks;
    size_t *cstart;
    struct dcp_htab ftab;
    int have_sdm, have_pd, have_sd, have_sm, have_ver;
    size_t nchunks; /* in state_dict_metadata */
    size_t nstored; /* chunks given their storage entry */
    /* Memo index + 1 of a slot holding each class and word (0: none yet),
     * and the fast items' templates built from them (see tpl). */
    uint32_t gix[G_DTYPE + 1];
    uint32_t wix[W_TORCH_STRIDED + 1];
    struct tpl tchunk[DCP_MAX_NDIM + 1]; /* per ndim */
    struct tpl titem;                    /* storage item, any ndim */
    struct tpl titem_nd[DCP_MAX_NDIM + 1];
};

/* A string as read: into the input, with its word. */
struct fstr {
    const char *s;
    uint32_t len;
    uint8_t word;
    size_t slot; /* memoized: its memo index + 1, else 0 (an index, as
                    the memo moves when it grows) */
};

static struct mslot *slot_of(struct fd *f, const struct fstr *k)
{
    return k->slot ? &f->memo[k->slot - 1] : NULL;
}

#define NEED(f, n) ((size_t)((f)->end - (f)->p) >= (size_t)(n))

static inline uint32_t le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
           (uint32_t)p[3] << 24;
}

static int word_of(const char *s, uint32_t len)
{
    size_t i;
    for (i = 1; i < DCP_ARRAY_LEN(words); i++)
        if (strlen(words[i]) == len && memcmp(words[i], s, len) == 0)
            return (int)i;
    return W_NONE;
}

/* BINPUT / LONG_BINPUT, if present: *idx and 1; else 0; -1 on bad input. */
static inline int take_put(struct fd *f, uint32_t *idx)
{
    if (f->p < f->end && *f->p == 'q' && NEED(f, 2)) {
        *idx = f->p[1];
        f->p += 2;
        return 1;
    }
    if (f->p < f->end && *f->p == 'r' && NEED(f, 5)) {
        *idx = le32(f->p + 1);
        f->p += 5;
        return 1;
    }
    return 0;
}

/* The slot a PUT writes: indices are dense, as Python's and dcp's writers
 * number them; a sparse or reused index is not this layout. */
static struct mslot *put_slot(struct fd *f, uint32_t idx)
{
    if (idx != f->nmemo)
        return NULL;
    if (f->nmemo % 1024 == 0) {
        struct mslot *m;
        /* At most one slot per 2 bytes of input, so this is bounded. */
        if (f->nmemo > (size_t)(f->end - f->p))
            return NULL;
        m = dcp__realloc(f->memo, (f->nmemo + 1024) * sizeof(*m));
        if (!m)
            return NULL;
        f->memo = m;
    }
    memset(&f->memo[f->nmemo], 0, sizeof(f->memo[0]));
    return &f->memo[f->nmemo++];
}

/* BINGET / LONG_BINGET: the slot, or NULL when the next op is not a GET
 * or names nothing. */
HOT struct mslot *take_get(struct fd *f)
{
    uint32_t idx;
    if (f->p < f->end && *f->p == 'h' && NEED(f, 2)) {
        idx = f->p[1];
        f->p += 2;
    } else if (f->p < f->end && *f->p == 'j' && NEED(f, 5)) {
        idx = le32(f->p + 1);
        f->p += 5;
    } else {
        return NULL;
    }
    return idx < f->nmemo ? &f->memo[idx] : NULL;
}

static inline int rd_op(struct fd *f, uint8_t op)
{
    if (f->p < f->end && *f->p == op) {
        f->p++;
        return DCP_OK;
    }
    return DECLINE;
}

/* A str: BINUNICODE (then PUT) or a GET of one. */
static int rd_str(struct fd *f, struct fstr *out)
{
    struct mslot *m;
    uint32_t n, idx;
    if (f->p < f->end && *f->p != 'X') {
        m = take_get(f);
        if (!m || m->kind != MK_STR)
            return DECLINE;
        out->s = m->s;
        out->len = m->len;
        out->word = m->word;
        out->slot = (size_t)(m - f->memo) + 1;
        return DCP_OK;
    }
    if (f->p < f->end) {
        if (!NEED(f, 5))
            return DECLINE;
        n = le32(f->p + 1);
        if (!NEED(f, 5 + (size_t)n))
            return DECLINE;
        out->s = (const char *)f->p + 5;
        out->len = n;
        f->p += 5 + (size_t)n;
        /* The general decoder keeps C strings: no NUL inside. */
        if (memchr(out->s, '\0', n) ||
            !dcp__utf8_valid(out->s, n, DCP__UTF8_SURROGATES))
            return DECLINE;
        out->word = (uint8_t)word_of(out->s, n);
        out->slot = 0;
        if (take_put(f, &idx)) {
            if (!(m = put_slot(f, idx)))
                return DECLINE;
            m->kind = MK_STR;
            m->s = out->s;
            m->len = n;
            m->word = out->word;
            out->slot = (size_t)(m - f->memo) + 1;
            if (!f->wix[out->word])
                f->wix[out->word] = (uint32_t)out->slot;
        }
        return DCP_OK;
    }
    return DECLINE;
}

/* GLOBAL "module\nname\n" (then PUT) or a GET of one: the class id. */
static int rd_global_slow(struct fd *f, int *id, dcp_dtype *dt);

static inline int rd_global(struct fd *f, int *id, dcp_dtype *dt)
{
    struct mslot *m;
    if (f->p < f->end && *f->p == 'c')
        return rd_global_slow(f, id, dt);
    m = take_get(f);
    if (!m || m->kind != MK_GLOBAL)
        return DECLINE;
    *id = m->id;
    if (dt)
        *dt = (dcp_dtype)m->dtype;
    return DCP_OK;
}

static int rd_global_slow(struct fd *f, int *id, dcp_dtype *dt)
{
    const uint8_t *mod, *nl1, *name, *nl2;
    struct mslot *m, tmp;
    uint32_t idx;
    size_t i;
    /* called at a 'c' (GLOBAL) opcode */
    mod = f->p + 1;
    nl1 = memchr(mod, '\n', (size_t)(f->end - mod));
    if (!nl1)
        return DECLINE;
    name = nl1 + 1;
    nl2 = memchr(name, '\n', (size_t)(f->end - name));
    if (!nl2)
        return DECLINE;
    f->p = nl2 + 1;
    memset(&tmp, 0, sizeof(tmp));
    tmp.kind = MK_GLOBAL;
    for (i = 0; i < DCP_ARRAY_LEN(classes); i++)
        if (strlen(classes[i].module) == (size_t)(nl1 - mod) &&
            memcmp(classes[i].module, mod, (size_t)(nl1 - mod)) == 0 &&
            strlen(classes[i].name) == (size_t)(nl2 - name) &&
            memcmp(classes[i].name, name, (size_t)(nl2 - name)) == 0)
            tmp.id = (uint8_t)classes[i].id;
    if (tmp.id == G_NONE && nl1 - mod == 5 && memcmp(mod, "torch", 5) == 0) {
        char nm[32];
        dcp_dtype d;
        if ((size_t)(nl2 - name) >= sizeof(nm))
            return DECLINE;
        memcpy(nm, name, (size_t)(nl2 - name));
        nm[nl2 - name] = '\0';
        if (dcp_dtype_from_name(nm, &d) != DCP_OK)
            return DECLINE; /* the general decoder names it */
        tmp.id = G_DTYPE;
        tmp.dtype = (uint8_t)d;
    }
    if (tmp.id == G_NONE)
        return DECLINE;
    m = &tmp;
    if (take_put(f, &idx)) {
        if (!(m = put_slot(f, idx)))
            return DECLINE;
        *m = tmp;
        if (!f->gix[tmp.id])
            f->gix[tmp.id] = idx + 1;
    }
    *id = m->id;
    if (dt)
        *dt = (dcp_dtype)m->dtype;
    return DCP_OK;
}

/* BININT1 / BININT2 / BININT / LONG1 (up to 8 bytes). */
HOT int rd_int(struct fd *f, int64_t *v)
{
    const uint8_t *p = f->p;
    size_t n, i;
    uint64_t u = 0;
    if (p >= f->end)
        return DECLINE;
    switch (*p) {
    case 'K':
        if (!NEED(f, 2))
            return DECLINE;
        *v = p[1];
        f->p += 2;
        return DCP_OK;
    case 'M':
        if (!NEED(f, 3))
            return DECLINE;
        *v = (int64_t)(p[1] | (uint32_t)p[2] << 8);
        f->p += 3;
        return DCP_OK;
    case 'J':
        if (!NEED(f, 5))
            return DECLINE;
        *v = (int32_t)le32(p + 1);
        f->p += 5;
        return DCP_OK;
    case 0x8a: /* LONG1 */
        if (!NEED(f, 2) || p[1] == 0 || p[1] > 8 || !NEED(f, 2 + (size_t)p[1]))
            return DECLINE;
        n = p[1];
        for (i = 0; i < n; i++)
            u |= (uint64_t)p[2 + i] << (8 * i);
        if (n < 8 && (p[1 + n] & 0x80)) /* sign-extend */
            u |= ~(uint64_t)0 << (8 * n);
        memcpy(v, &u, sizeof(*v));
        f->p += 2 + n;
        return DCP_OK;
    default:
        return DECLINE;
    }
}

/* torch.Size((ints...)) as dcp__meta_encode writes it; *n receives the
 * count (at most DCP_MAX_NDIM). */
static int rd_size(struct fd *f, int64_t *v, int *n)
{
    int id, k = 0, marked;
    if (rd_global(f, &id, NULL) != DCP_OK || id != G_SIZE)
        return DECLINE;
    marked = rd_op(f, '(') == DCP_OK;
    while (f->p < f->end && (*f->p == 'K' || *f->p == 'M' || *f->p == 'J' ||
                             *f->p == 0x8a)) {
        if (k == DCP_MAX_NDIM || rd_int(f, &v[k]) != DCP_OK)
            return DECLINE;
        k++;
    }
    if (f->p >= f->end)
        return DECLINE;
    if (marked) { /* n > 3: MARK ints TUPLE */
        if (k <= 3 || *f->p != 't')
            return DECLINE;
    } else if (!((k == 0 && *f->p == ')') ||
                 (k >= 1 && k <= 3 && *f->p == 0x85 + k - 1))) {
        return DECLINE;
    }
    f->p++;
    if (rd_op(f, 0x85) != DCP_OK || rd_op(f, 'R') != DCP_OK)
        return DECLINE;
    *n = k;
    return DCP_OK;
}

/* cls() and the start of its __dict__: GLOBAL ) NEWOBJ } ( */
static int rd_obj_open(struct fd *f, int want)
{
    int id;
    if (rd_global(f, &id, NULL) != DCP_OK || id != want ||
        rd_op(f, ')') != DCP_OK || rd_op(f, 0x81) != DCP_OK ||
        rd_op(f, '}') != DCP_OK || rd_op(f, '(') != DCP_OK)
        return DECLINE;
    return DCP_OK;
}

static int rd_obj_close(struct fd *f)
{
    return rd_op(f, 'u') == DCP_OK && rd_op(f, 'b') == DCP_OK ? DCP_OK
                                                              : DECLINE;
}

/* Attribute key: a str that must be the word w. */
static inline int rd_word(struct fd *f, int w)
{
    struct fstr k;
    if (NEED(f, 2) && f->p[0] == 'h' && f->p[1] < f->nmemo &&
        f->memo[f->p[1]].kind == MK_STR) { /* the usual case */
        int ok = f->memo[f->p[1]].word == w;
        f->p += 2;
        return ok ? DCP_OK : DECLINE;
    }
    return rd_str(f, &k) == DCP_OK && k.word == w ? DCP_OK : DECLINE;
}

/*
 * The items of a container filled by batches: EMPTY_DICT / EMPTY_LIST was
 * read; then MARK items SETITEMS (APPENDS) any number of times. Returns 1
 * when an item follows, 0 at the end, DECLINE on bad input; *open tracks
 * whether a batch is open.
 */
static int next_item(struct fd *f, int *open, uint8_t close_op)
{
    for (;;) {
        if (f->p >= f->end)
            return DECLINE;
        if (*open) {
            if (*f->p != close_op)
                return 1;
            f->p++;
            *open = 0;
            continue;
        }
        if (*f->p != '(')
            return 0;
        f->p++;
        *open = 1;
    }
}

/* ------------------------------------------------------- fast items */

/* A GET of memo index i, as the encoder writes it. */
static uint8_t *tpl_get(uint8_t *p, uint32_t i)
{
    if (i < 256) {
        p[0] = 'h';
        p[1] = (uint8_t)i;
        return p + 2;
    }
    p[0] = 'j';
    p[1] = (uint8_t)i;
    p[2] = (uint8_t)(i >> 8);
    p[3] = (uint8_t)(i >> 16);
    p[4] = (uint8_t)(i >> 24);
    return p + 5;
}

/* The end of a torch.Size's ints: the tuple, TUPLE1, REDUCE. */
static uint8_t *tpl_size_end(uint8_t *p, int nd)
{
    *p++ = nd == 0 ? ')' : nd <= 3 ? (uint8_t)(0x85 + nd - 1) : 't';
    *p++ = 0x85;
    *p++ = 'R';
    return p;
}

/* GET cls, EMPTY_TUPLE, NEWOBJ, EMPTY_DICT, MARK */
static uint8_t *tpl_obj_open(uint8_t *p, uint32_t cls)
{
    p = tpl_get(p, cls);
    p[0] = ')';
    p[1] = 0x81;
    p[2] = '}';
    p[3] = '(';
    return p + 4;
}

/* Ends segment i at p. */
static void tpl_seg(struct tpl *t, int i, const uint8_t *p)
{
    uint8_t m[24];
    t->n[i] = (uint8_t)(p - t->b[i]);
    memset(m, 0, sizeof(m));
    memset(m, 0xff, t->n[i]);
    memset(t->b[i] + t->n[i], 0, sizeof(t->b[i]) - t->n[i]);
    memcpy(t->w[i], t->b[i], sizeof(t->w[i]));
    memcpy(t->mask[i], m, sizeof(t->mask[i]));
}

/* Memo indices of the classes and words a template needs, or 0. */
static int tpl_ix(const struct fd *f, const int *g, size_t ng, const int *w,
                  size_t nw, uint32_t *out)
{
    size_t i;
    for (i = 0; i < ng; i++)
        if (!(out[i] = f->gix[g[i]]))
            return 0;
    for (i = 0; i < nw; i++)
        if (!(out[ng + i] = f->wix[w[i]]))
            return 0;
    for (i = 0; i < ng + nw; i++)
        out[i]--;
    return 1;
}

/* ChunkStorageMetadata of ndim nd: obj offsets Size( | ) sizes Size( | ) */
static int tpl_chunk(struct fd *f, int nd)
{
    static const int g[] = {G_CSM, G_SIZE}, w[] = {W_OFFSETS, W_SIZES};
    struct tpl *t = &f->tchunk[nd];
    uint32_t ix[4];
    uint8_t *p;
    if (t->built)
        return 1;
    if (!tpl_ix(f, g, 2, w, 2, ix))
        return 0;
    p = tpl_obj_open(t->b[0], ix[0]);
    p = tpl_get(tpl_get(p, ix[2]), ix[1]);
    if (nd > 3)
        *p++ = '(';
    tpl_seg(t, 0, p);
    p = tpl_get(tpl_get(tpl_size_end(t->b[1], nd), ix[3]), ix[1]);
    if (nd > 3)
        *p++ = '(';
    tpl_seg(t, 1, p);
    p = tpl_size_end(t->b[2], nd);
    p[0] = 'u';
    p[1] = 'b';
    tpl_seg(t, 2, p + 2);
    t->built = 1;
    return 1;
}

/*
 * A storage_data item: MetadataIndex: fqn <key> | offset Size( <ints> )
 * index <int> | _StorageInfo: relative_path <name> | offset <int> |
 * length <int> |. The segments around the key and the name (titem) are
 * the same for every ndim; those around the offsets (titem_nd) are not.
 */
static int tpl_item(struct fd *f, int nd)
{
    static const int g[] = {G_MDINDEX, G_SINFO, G_SIZE},
                     w[] = {W_FQN, W_RELATIVE_PATH, W_OFFSET, W_LENGTH,
                            W_INDEX};
    struct tpl *t = &f->titem, *tn = &f->titem_nd[nd];
    uint32_t ix[8];
    uint8_t *p;
    if (t->built && tn->built)
        return 1;
    if (!tpl_ix(f, g, 3, w, 5, ix))
        return 0;
    tpl_seg(t, 0, tpl_get(tpl_obj_open(t->b[0], ix[0]), ix[3]));
    p = t->b[1];
    p[0] = 'u';
    p[1] = 'b';
    tpl_seg(t, 1, tpl_get(tpl_obj_open(p + 2, ix[1]), ix[4]));
    tpl_seg(t, 2, tpl_get(t->b[2], ix[5]));
    tpl_seg(t, 3, tpl_get(t->b[3], ix[6]));
    p = t->b[4];
    p[0] = 'u';
    p[1] = 'b';
    tpl_seg(t, 4, p + 2);
    p = tpl_get(tpl_get(tn->b[0], ix[5]), ix[2]);
    if (nd > 3)
        *p++ = '(';
    tpl_seg(tn, 0, p);
    tpl_seg(tn, 1, tpl_get(tpl_size_end(tn->b[1], nd), ix[7]));
    t->built = tn->built = 1;
    return 1;
}

/* Reads segment i of t, if the input has it next: three word compares
 * while 24 bytes are left. */
HOT int tpl_eat(struct fd *f, const struct tpl *t, int i)
{
    if (NEED(f, 24)) {
        uint64_t v[3];
        memcpy(v, f->p, sizeof(v));
        if (((v[0] ^ t->w[i][0]) & t->mask[i][0]) |
            ((v[1] ^ t->w[i][1]) & t->mask[i][1]) |
            ((v[2] ^ t->w[i][2]) & t->mask[i][2]))
            return 0;
    } else if (!NEED(f, t->n[i]) || memcmp(f->p, t->b[i], t->n[i]) != 0) {
        return 0;
    }
    f->p += t->n[i];
    return 1;
}

/* n ints, as rd_size reads them. */
HOT int tpl_ints(struct fd *f, int64_t *v, int n)
{
    int d;
    for (d = 0; d < n; d++)
        if (rd_int(f, &v[d]) != DCP_OK)
            return 0;
    return 1;
}

/* ------------------------------------------------ state_dict_metadata */

static int rd_props(struct fd *f, struct md_entry *e)
{
    int id;
    dcp_dtype dt;
    struct mslot *m;
    uint32_t idx;
    if (rd_global(f, &id, NULL) != DCP_OK || id != G_PROPS ||
        rd_op(f, ')') != DCP_OK || rd_op(f, 0x81) != DCP_OK ||
        rd_op(f, '(') != DCP_OK)
        return DECLINE;
    if (rd_global(f, &id, &dt) != DCP_OK || id != G_DTYPE)
        return DECLINE;
    e->dtype = dt;
    /* layout: torch.serialization._get_layout("torch.strided"), memoized */
    m = take_get(f);
    if (!m) {
        if (rd_global(f, &id, NULL) != DCP_OK || id != G_GET_LAYOUT ||
            rd_word(f, W_TORCH_STRIDED) != DCP_OK || rd_op(f, 0x85) ||
            rd_op(f, 'R') || take_put(f, &idx) != 1 || !(m = put_slot(f, idx)))
            return DECLINE;
        m->kind = MK_LAYOUT;
    } else if (m->kind != MK_LAYOUT) {
        return DECLINE;
    }
    if (f->p < f->end && (*f->p == 0x88 || *f->p == 0x89))
        e->requires_grad = *f->p++ == 0x88;
    else
        return DECLINE;
    /* memory_format: _MEM_FORMAT_ENCODING(0), memoized */
    m = take_get(f);
    if (!m) {
        int64_t v;
        if (rd_global(f, &id, NULL) != DCP_OK || id != G_MEMFMT_ENC ||
            rd_int(f, &v) != DCP_OK || rd_op(f, 0x85) || rd_op(f, 'R') ||
            take_put(f, &idx) != 1 || !(m = put_slot(f, idx)))
            return DECLINE;
        m->kind = MK_MEMFMT;
    } else if (m->kind != MK_MEMFMT) {
        return DECLINE;
    }
    if (f->p >= f->end || (*f->p != 0x88 && *f->p != 0x89)) /* pin_memory */
        return DECLINE;
    f->p++;
    return rd_op(f, 't') == DCP_OK && rd_op(f, 'b') == DCP_OK ? DCP_OK
                                                              : DECLINE;
}

/* The next chunk, zeroed (f->nchunks counts them); NULL when out of
 * memory. Each takes a few input bytes at least, which bounds them. */
static struct md_chunk *chunk_new(struct fd *f)
{
    struct md_chunk *c;
    if (f->nchunks == f->capchunks &&
        dcp__grow_huge((void **)&f->chunks, &f->capchunks, f->nchunks,
                       f->nchunks + 1, sizeof(*c), 1024) != DCP_OK)
        return NULL;
    c = &f->chunks[f->nchunks++];
    c->off = c->size = NULL; /* not memset: rep stos is slow */
    c->file = 0;
    c->offset = 0;
    c->length = 0;
    c->has_storage = 0;
    c->xform = MD_XFORM_NONE; /* the fast path declines transforms */
    return c;
}

static int64_t *ints_room(struct fd *f, size_t n)
{
    if (f->capints - f->nints < n &&
        (f->nints > SIZE_MAX - n ||
         dcp__grow_huge((void **)&f->ints, &f->capints, f->nints, f->nints + n,
                        sizeof(*f->ints), 1024) != DCP_OK))
        return NULL;
    return f->ints + f->nints;
}

/*
 * The arrays sized for what dcp writes, about 110 bytes per chunk of ndim
 * 2: pages never written stay virtual, and the arrays seldom move. They
 * grow past it as needed; when even this much is not to be had, they
 * start small.
 */
static void reserve_arrays(struct fd *f, size_t len)
{
    size_t nc = len / 64 + 1024;
    f->chunks = dcp__malloc(nc * sizeof(*f->chunks));
    f->ints = dcp__malloc(4 * nc * sizeof(*f->ints));
    if (!f->chunks || !f->ints) {
        dcp__free(f->chunks);
        dcp__free(f->ints);
        f->chunks = NULL;
        f->ints = NULL;
        return;
    }
    dcp__advise_huge(f->chunks, nc * sizeof(*f->chunks));
    dcp__advise_huge(f->ints, 4 * nc * sizeof(*f->ints));
    f->capchunks = nc;
    f->capints = 4 * nc;
}

/*
 * One ChunkStorageMetadata. Its offsets and sizes go to f->ints; until the
 * pool stops moving, the chunk keeps their position in its offset field
 * (rd_done turns it into pointers).
 */
static int rd_chunk(struct fd *f, struct md_entry *e, struct md_chunk *c)
{
    int slot = e->ndim ? e->ndim : 1, n1 = -1, n2 = -1, d;
    int64_t *v = ints_room(f, 2 * (size_t)slot);
    const uint8_t *p0 = f->p;
    const struct tpl *t = &f->tchunk[e->ndim];
    if (!v)
        return DECLINE;
    v[0] = v[slot] = 0;
    if ((t->built || tpl_chunk(f, e->ndim)) && tpl_eat(f, t, 0) &&
        tpl_ints(f, v, e->ndim) && tpl_eat(f, t, 1) &&
        tpl_ints(f, v + slot, e->ndim) && tpl_eat(f, t, 2)) {
        n1 = n2 = e->ndim;
    } else {
        f->p = p0;
        v[0] = v[slot] = 0;
        if (rd_obj_open(f, G_CSM) != DCP_OK ||
            rd_word(f, W_OFFSETS) != DCP_OK || rd_size(f, v, &n1) != DCP_OK ||
            rd_word(f, W_SIZES) != DCP_OK ||
            rd_size(f, v + slot, &n2) != DCP_OK || rd_obj_close(f) != DCP_OK)
            return DECLINE;
    }
    if (n1 != e->ndim || n2 != e->ndim)
        return DECLINE;
    for (d = 0; d < e->ndim; d++) {
        int64_t end;
        if (v[d] < 0 || v[slot + d] < 0 ||
            dcp__add_overflow_i64(v[d], v[slot + d], &end) ||
            end > e->shape[d])
            return DECLINE;
    }
    c->offset = f->nints;
    f->nints += 2 * (size_t)slot;
    return DCP_OK;
}

static int rd_tensor_md(struct fd *f, struct md_entry *e)
{
    uint64_t bytes, t;
    int open = 0, more, d;
    e->is_tensor = 1;
    if (rd_word(f, W_PROPERTIES) != DCP_OK || rd_props(f, e) != DCP_OK ||
        rd_word(f, W_SIZE) != DCP_OK || rd_size(f, e->shape, &e->ndim) ||
        rd_word(f, W_CHUNKS) != DCP_OK || rd_op(f, ']') != DCP_OK)
        return DECLINE;
    bytes = dcp_dtype_size(e->dtype);
    for (d = 0; d < e->ndim; d++) {
        if (e->shape[d] < 0 ||
            dcp__mul_overflow_u64(bytes, (uint64_t)e->shape[d], &t) ||
            t > (uint64_t)INT64_MAX)
            return DECLINE;
        bytes = t;
    }
    while ((more = next_item(f, &open, 'e')) == 1) {
        struct md_chunk *c = chunk_new(f);
        if (!c || rd_chunk(f, e, c) != DCP_OK)
            return DECLINE;
        e->nchunks++;
    }
    if (more != 0)
        return DECLINE;
    return rd_obj_close(f);
}

static int rd_sdm(struct fd *f)
{
    struct dcp_metadata *md = f->md;
    int open = 0, more, id;
    if (rd_op(f, '}') != DCP_OK)
        return DECLINE;
    while ((more = next_item(f, &open, 'u')) == 1) {
        struct md_entry *e;
        struct fstr k;
        if (md->n == f->cape) {
            size_t cap = f->cape ? 2 * f->cape : 64, *cs;
            e = dcp__realloc(md->e, cap * sizeof(*e));
            if (!e)
                return DECLINE;
            md->e = e;
            cs = dcp__realloc(f->cstart, cap * sizeof(*cs));
            if (!cs)
                return DECLINE;
            f->cstart = cs;
            f->cape = cap;
        }
        f->cstart[md->n] = f->nchunks;
        e = &md->e[md->n];
        memset(e, 0, sizeof(*e));
        if (rd_str(f, &k) != DCP_OK)
            return DECLINE;
        e->key = dcp__strndup(k.s, k.len);
        if (!e->key)
            return DECLINE;
        md->n++;
        if (rd_global(f, &id, NULL) != DCP_OK)
            return DECLINE;
        if (id == G_BSM) {
            if (rd_op(f, ')') != DCP_OK || rd_op(f, 0x81) != DCP_OK ||
                !chunk_new(f))
                return DECLINE;
            e->nchunks = 1;
            continue;
        }
        if (id != G_TSM || rd_op(f, ')') != DCP_OK ||
            rd_op(f, 0x81) != DCP_OK || rd_op(f, '}') != DCP_OK ||
            rd_op(f, '(') != DCP_OK || rd_tensor_md(f, e) != DCP_OK)
            return DECLINE;
    }
    return more == 0 ? DCP_OK : DECLINE;
}

/* Sorts the entries (duplicates decline) and makes the chunks' offsets and
 * sizes pointers into the final pool, which md takes. */
static int rd_sdm_done(struct fd *f)
{
    struct dcp_metadata *md = f->md;
    struct dcp_err err;
    size_t i, j;
    memset(&err, 0, sizeof(err));
    /* No more chunks are read: the entries can point into the block (and
     * one chunk past a value's or an empty tensor's would not hurt). */
    if (!f->chunks && !(f->chunks = dcp__calloc(1, sizeof(*f->chunks))))
        return DECLINE;
    for (i = 0; i < md->n; i++)
        md->e[i].chunks = f->chunks + f->cstart[i];
    md->chunk_block = f->chunks;
    f->chunks = NULL;
    if (dcp__meta_sort(md, &err) != DCP_OK)
        return DECLINE;
    if (!f->ints && !(f->ints = dcp__malloc(sizeof(int64_t))))
        return DECLINE;
    md->ints = f->ints;
    f->ints = NULL; /* md owns it; no more chunks are read */
    for (i = 0; i < md->n; i++) {
        struct md_entry *e = &md->e[i];
        int slot = e->ndim ? e->ndim : 1;
        for (j = 0; e->is_tensor && j < e->nchunks; j++) {
            struct md_chunk *c = &e->chunks[j];
            c->off = md->ints + c->offset;
            c->size = c->off + slot;
            c->offset = 0;
        }
    }
    return DCP_OK;
}

/* ------------------------------------------------------- planner_data */

static int rd_planner_data(struct fd *f)
{
    int open = 0, more;
    if (rd_op(f, '}') != DCP_OK)
        return DECLINE;
    while ((more = next_item(f, &open, 'u')) == 1) {
        struct md_pathel path[3 + 256];
        struct fstr k, s;
        struct md_entry *e = NULL;
        size_t n = 0, i;
        int marked;
        long ei;
        if (rd_str(f, &k) != DCP_OK)
            return DECLINE;
        marked = rd_op(f, '(') == DCP_OK;
        for (;;) { /* elements: str or int */
            if (f->p >= f->end || n == DCP_ARRAY_LEN(path))
                return DECLINE;
            if (*f->p == 'X' || *f->p == 'h' || *f->p == 'j') {
                if (rd_str(f, &s) != DCP_OK)
                    return DECLINE;
                path[n].s = (char *)(uintptr_t)s.s;
                path[n].i = s.len;
            } else if (*f->p == 'K' || *f->p == 'M' || *f->p == 'J' ||
                       *f->p == 0x8a) {
                if (rd_int(f, &path[n].i) != DCP_OK)
                    return DECLINE;
                path[n].s = NULL;
            } else {
                break;
            }
            n++;
        }
        if (marked ? (n <= 3 || rd_op(f, 't') != DCP_OK)
                   : (n < 1 || n > 3 || rd_op(f, (uint8_t)(0x85 + n - 1))))
            return DECLINE;
        /* As walk_path: a known key's first path, 1..256 elements. */
        if (k.slot && slot_of(f, &k)->entry) {
            ei = (long)slot_of(f, &k)->entry - 1;
        } else {
            char *key = dcp__strndup(k.s, k.len);
            if (!key)
                return DECLINE;
            ei = dcp__meta_find(f->md, key);
            dcp__free(key);
        }
        if (ei >= 0)
            e = &f->md->e[ei];
        if (!e || n > 256 || e->path)
            continue;
        e->path = dcp__calloc(n, sizeof(*e->path));
        if (!e->path)
            return DECLINE;
        e->npath = n;
        for (i = 0; i < n; i++) {
            if (path[i].s) {
                e->path[i].s = dcp__strndup(path[i].s, (size_t)path[i].i);
                if (!e->path[i].s)
                    return DECLINE;
            } else {
                e->path[i].i = path[i].i;
            }
        }
    }
    return more == 0 ? DCP_OK : DECLINE;
}

/* ------------------------------------------------------- storage_data */

/* The entry an fqn names; memoized fqns remember it. */
static struct md_entry *fqn_entry(struct fd *f, const struct fstr *k)
{
    struct mslot *m = slot_of(f, k);
    long ei;
    char *key;
    if (m && m->entry)
        return &f->md->e[m->entry - 1];
    key = dcp__strndup(k->s, k->len);
    if (!key)
        return NULL;
    ei = dcp__meta_find(f->md, key);
    dcp__free(key);
    if (ei < 0)
        return NULL;
    if (m)
        m->entry = (uint32_t)ei + 1;
    return &f->md->e[ei];
}

/* A storage item that matches the template: 1, or 0 with the input
 * untouched. What it cannot decide itself (a first occurrence of a key or
 * a name, an index that is not the chunk's, a second entry for a chunk)
 * it leaves to the op-by-op path. */
static int rd_storage_fast(struct fd *f)
{
    const uint8_t *p0 = f->p;
    const struct mslot *m;
    const struct md_entry *e;
    struct md_chunk *c;
    int64_t off[DCP_MAX_NDIM], index, o, l;
    uint64_t end;
    uint32_t file;
    if (!f->titem.built && !tpl_item(f, 0))
        return 0; /* not yet: a slot is unknown */
    if (!tpl_eat(f, &f->titem, 0) || !(m = take_get(f)) || m->kind != MK_STR ||
        !m->entry)
        goto no;
    e = &f->md->e[m->entry - 1];
    if (!e->is_tensor ||
        (!f->titem_nd[e->ndim].built && !tpl_item(f, e->ndim)) ||
        !tpl_eat(f, &f->titem_nd[e->ndim], 0) || !tpl_ints(f, off, e->ndim) ||
        !tpl_eat(f, &f->titem_nd[e->ndim], 1) || rd_int(f, &index) ||
        !tpl_eat(f, &f->titem, 1) || !(m = take_get(f)) || m->kind != MK_STR ||
        !m->file)
        goto no;
    file = m->file - 1;
    if (!tpl_eat(f, &f->titem, 2) || rd_int(f, &o) ||
        !tpl_eat(f, &f->titem, 3) || rd_int(f, &l) || !tpl_eat(f, &f->titem, 4))
        goto no;
    if (index < 0 || (uint64_t)index >= e->nchunks ||
        !dcp__same_ints(e->chunks[index].off, off, e->ndim))
        goto no;
    c = &e->chunks[index];
    if (c->has_storage || o < 0 || l < 0 ||
        dcp__add_overflow_u64((uint64_t)o, (uint64_t)l, &end) ||
        end > (uint64_t)INT64_MAX)
        goto no;
    c->offset = (uint64_t)o;
    c->length = (uint64_t)l;
    c->file = file;
    c->has_storage = 1;
    f->nstored++;
    return 1;
no:
    f->p = p0;
    return 0;
}

static int rd_storage_item(struct fd *f)
{
    int64_t off[DCP_MAX_NDIM], index = -1, v;
    struct fstr k, rel;
    struct md_entry *e;
    struct md_chunk *c = NULL;
    uint64_t end;
    int ndim = 0;
    size_t i;
    if (rd_obj_open(f, G_MDINDEX) != DCP_OK || rd_word(f, W_FQN) != DCP_OK ||
        rd_str(f, &k) != DCP_OK || !(e = fqn_entry(f, &k)))
        return DECLINE;
    if (e->is_tensor) {
        if (rd_word(f, W_OFFSET) != DCP_OK || rd_size(f, off, &ndim) ||
            ndim != e->ndim || rd_word(f, W_INDEX) != DCP_OK ||
            rd_int(f, &index) != DCP_OK)
            return DECLINE;
        /* As find_chunk: the index is a hint, the offsets decide. */
        if (index >= 0 && (uint64_t)index < e->nchunks &&
            dcp__same_ints(e->chunks[index].off, off, ndim))
            c = &e->chunks[index];
        for (i = 0; !c && i < e->nchunks; i++)
            if (!ndim || memcmp(e->chunks[i].off, off,
                                (size_t)ndim * sizeof(*off)) == 0)
                c = &e->chunks[i];
        if (!c)
            return DECLINE;
    } else {
        if (rd_word(f, W_INDEX) != DCP_OK || rd_op(f, 'N') != DCP_OK)
            return DECLINE;
        c = &e->chunks[0];
    }
    if (c->has_storage || rd_obj_close(f) != DCP_OK ||
        rd_obj_open(f, G_SINFO) != DCP_OK ||
        rd_word(f, W_RELATIVE_PATH) != DCP_OK || rd_str(f, &rel) != DCP_OK ||
        rel.len == 0 || rel.len > 255 ||
        rd_word(f, W_OFFSET) != DCP_OK || rd_int(f, &v) != DCP_OK || v < 0)
        return DECLINE;
    c->offset = (uint64_t)v;
    if (rd_word(f, W_LENGTH) != DCP_OK || rd_int(f, &v) != DCP_OK || v < 0 ||
        rd_obj_close(f) != DCP_OK)
        return DECLINE;
    c->length = (uint64_t)v;
    if (dcp__add_overflow_u64(c->offset, c->length, &end) ||
        end > (uint64_t)INT64_MAX)
        return DECLINE;
    /* A memoized name was checked when first met (its slot has a file). */
    if (rel.slot && slot_of(f, &rel)->file) {
        c->file = slot_of(f, &rel)->file - 1;
    } else {
        char name[256];
        memcpy(name, rel.s, rel.len);
        name[rel.len] = '\0';
        if (!dcp__safe_name(name) ||
            dcp__meta_file_index(f->md, &f->ftab, rel.s, rel.len, &c->file))
            return DECLINE;
        if (rel.slot)
            slot_of(f, &rel)->file = c->file + 1;
    }
    c->has_storage = 1;
    f->nstored++;
    return DCP_OK;
}

static int rd_storage_data(struct fd *f)
{
    int open = 0, more;
    if (rd_op(f, '}') != DCP_OK)
        return DECLINE;
    while ((more = next_item(f, &open, 'u')) == 1)
        if (!rd_storage_fast(f) && rd_storage_item(f) != DCP_OK)
            return DECLINE;
    return more == 0 ? DCP_OK : DECLINE;
}

/* ------------------------------------------------------------ the rest */

/* A str or None; *out a copy of the str (NULL for None). */
static int rd_opt_str(struct fd *f, char **out)
{
    struct fstr s;
    if (rd_op(f, 'N') == DCP_OK) {
        *out = NULL;
        return DCP_OK;
    }
    if (rd_str(f, &s) != DCP_OK || !(*out = dcp__strndup(s.s, s.len)))
        return DECLINE;
    return DCP_OK;
}

static int rd_storage_meta(struct fd *f)
{
    struct dcp_metadata *md = f->md;
    char *load = NULL;
    if (rd_obj_open(f, G_STORAGE_META) != DCP_OK ||
        rd_word(f, W_CHECKPOINT_ID) != DCP_OK ||
        rd_opt_str(f, &md->checkpoint_id) != DCP_OK ||
        rd_word(f, W_SAVE_ID) != DCP_OK ||
        rd_opt_str(f, &md->save_id) != DCP_OK ||
        rd_word(f, W_LOAD_ID) != DCP_OK || rd_opt_str(f, &load) != DCP_OK)
        return DECLINE;
    dcp__free(load);
    if (rd_word(f, W_MODULES) != DCP_OK || rd_op(f, ']') != DCP_OK)
        return DECLINE;
    return rd_obj_close(f);
}

static int rd_root(struct fd *f)
{
    struct dcp_metadata *md = f->md;
    int open = 0, more;
    if (rd_op(f, 0x80) != DCP_OK || rd_op(f, 2) != DCP_OK ||
        rd_obj_open(f, G_METADATA) != DCP_OK)
        return DECLINE;
    open = 1; /* rd_obj_open read the MARK */
    while ((more = next_item(f, &open, 'u')) == 1) {
        struct fstr k;
        int rc = DECLINE;
        if (rd_str(f, &k) != DCP_OK)
            return DECLINE;
        switch (k.word) {
        case W_STATE_DICT_METADATA:
            if (f->have_sdm++)
                return DECLINE;
            rc = rd_sdm(f);
            if (rc == DCP_OK)
                rc = rd_sdm_done(f);
            break;
        case W_PLANNER_DATA:
            if (!f->have_sdm || f->have_pd++)
                return DECLINE;
            rc = rd_planner_data(f);
            break;
        case W_STORAGE_DATA:
            if (!f->have_sdm || f->have_sd++)
                return DECLINE;
            rc = rd_storage_data(f);
            break;
        case W_STORAGE_META:
            if (f->have_sm++)
                return DECLINE;
            rc = rd_storage_meta(f);
            break;
        case W_VERSION:
            if (f->have_ver++)
                return DECLINE;
            rc = rd_opt_str(f, &md->version);
            if (rc == DCP_OK && !md->version)
                rc = DECLINE; /* None: let the general decoder decide */
            break;
        default:
            break;
        }
        if (rc != DCP_OK)
            return DECLINE;
    }
    if (more != 0 || rd_op(f, 'b') != DCP_OK || rd_op(f, '.') != DCP_OK ||
        f->p != f->end || !f->have_sdm || !f->have_sd || !f->have_ver)
        return DECLINE;
    /* Each storage entry marked a distinct chunk (a second one for the
     * same chunk declined): every chunk has one iff the counts match. */
    return f->nstored == f->nchunks ? DCP_OK : DECLINE;
}

int dcp__meta_decode_fast(const uint8_t *p, size_t len,
                          struct dcp_metadata **out)
{
    struct fd f;
    int rc;
    *out = NULL;
    memset(&f, 0, sizeof(f));
    f.p = p;
    f.end = p + len;
    f.md = dcp__calloc(1, sizeof(*f.md));
    if (!f.md)
        return DECLINE;
    reserve_arrays(&f, len);
    rc = rd_root(&f);
    dcp__free(f.memo);
    dcp__htab_release(&f.ftab);
    dcp__free(f.cstart);
    dcp__free(f.chunks); /* unless md took it */
    if (rc == DCP_OK && !f.md->e && !(f.md->e = dcp__calloc(1, sizeof(*f.md->e))))
        rc = DECLINE;
    if (rc != DCP_OK) {
        /* Chunks not yet pointing into md->ints hold positions, not
         * pointers: free with the pool set so they are not freed. */
        if (!f.md->ints) {
            f.md->ints = f.ints;
            f.ints = NULL;
            if (!f.md->ints)
                f.md->ints = dcp__malloc(sizeof(int64_t));
            if (!f.md->ints) { /* free the chunks by hand */
                size_t i;
                for (i = 0; i < f.md->n; i++) {
                    if (!f.md->chunk_block)
                        dcp__free(f.md->e[i].chunks);
                    f.md->e[i].chunks = NULL;
                    f.md->e[i].nchunks = 0;
                }
            }
        }
        dcp__free(f.ints);
        dcp__meta_free(f.md);
        return DECLINE;
    }
    dcp__meta_index(f.md);
    *out = f.md;
    return DCP_OK;
}
