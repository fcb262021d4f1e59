/*
 * interop_state: the C side of the PyTorch interop tests (tests/interop/).
 * It uses only the public API, <dcp/dcp.h>.
 *
 * Usage:
 *   interop_state savefrom MANIFEST DIR
 *       Builds a state from MANIFEST (dcp_state_push/push_index/pop,
 *       dcp_state_add_tensor/add_value, so keys and planner_data paths come
 *       out as torch's flatten_state_dict makes them) and dcp_save's it to DIR.
 *       Several "tensor" lines with the same path are several boxes of one
 *       tensor, added with one dcp_state_add_tensor call each.
 *       With DCP_INTEROP_SAVE_HF=sharded (or consolidated) in the
 *       environment, dcp_save_hf writes Hugging Face safetensors files
 *       instead.
 *   interop_state savefrom-async MANIFEST DIR
 *       The same with dcp_save_async through a 64 KiB staging budget; the
 *       state and every buffer are freed as soon as the call returns,
 *       before dcp_request_wait.
 *       With DCP_INTEROP_STRIDED=1 in the environment, both save every
 *       non-empty box of one or more dimensions from the interior of a
 *       larger allocation (one ghost element on each side of every
 *       dimension, filled with 0xee bytes) with
 *       dcp_state_add_tensor_strided: the checkpoint must be the same.
 *   interop_state dumpall DIR OUTDIR
 *       Opens DIR with dcp_metadata_open, builds a state with every tensor
 *       (whole global shape, zeroed buffer) and every value (template
 *       dcp_value_none()), dcp_load's it (strict), and writes OUTDIR/manifest
 *       plus one OUTDIR/t<i>.bin per tensor. As a cross-check, every tensor
 *       is also read with dcp_metadata_read_box and every value with
 *       dcp_metadata_read_value; they must equal what dcp_load gave.
 *   interop_state loadbox DIR KEY OFFS SIZES OUTFILE
 *       dcp_load with DCP_LOAD_PARTIAL of one box of one tensor (the
 *       checkpoint may hold other keys; the load report must list no missing
 *       key and every other key as unexpected); writes the raw bytes. A KEY
 *       of a dtype dcp cannot read (dcp_metadata_unsupported) is asked for
 *       as int8 (dcp_load refuses it).
 *   interop_state readbox DIR KEY OFFS SIZES OUTFILE
 *       The same box through dcp_metadata_read_box (CRC verified).
 *   OFFS and SIZES are comma-separated integers ("2,0"), "-" for a 0-d
 *   tensor.
 *   interop_state loadinto MANIFEST DIR OUTDIR
 *       Builds a state for a load from MANIFEST: each "tensor" line is a box
 *       to fill (its buffer is first set to the byte 0xa5, so an element
 *       dcp_load does not write shows; FILE is not read, it names the output
 *       file, relative), each "value" line's VALUE is the template. Then
 *       dcp_load's DIR (strict) and writes OUTDIR/manifest: the same records
 *       in the same order, each box's loaded bytes in OUTDIR/FILE, each value
 *       as loaded.
 *
 * interop_state_mpi, the same source built with DCP_INTEROP_MPI (only where
 * MPI is found), runs under mpiexec: savefrom, savefrom-async and loadinto
 * are collective over MPI_COMM_WORLD (dcp_comm_mpi), each rank with its own
 * manifest and output directory: "{rank}" in MANIFEST and OUTDIR stands for the rank
 * (manifests/{rank}/manifest). A rank whose manifest is bad makes every rank
 * exit 1 before dcp_save/dcp_load; messages carry "[rank R]". The other
 * commands are single-process there too. The serial build reads "{rank}" as
 * 0.
 *
 * Exit status 0 on success. On failure: "interop_state: <message>" on
 * stderr (the message is dcp_errmsg() where the library failed) and exit 1;
 * exit 2 on bad usage.
 *
 * Manifest format (version 1). A text file, ASCII only, one record a line:
 *
 *   dcp-manifest 1                      first non-comment line
 *   # ...                               comment (ignored; also empty lines)
 *   tensor PATH DTYPE SHAPE OFFSETS SIZES FILE
 *   value PATH VALUE
 *   meta NAME VALUE                     information (written by dumpall)
 *
 * Tokens are separated by one or more spaces.
 *   PATH     a tuple value (below) of str and int items: the flatten path,
 *            e.g. (s"model" s"fc.weight") or (s"optim" s"param_groups" i0
 *            s"lr"). The key is the items joined with '.'.
 *   DTYPE    a torch dtype name without "torch.": float32, bfloat16, ...
 *   SHAPE, OFFSETS, SIZES
 *            dims in brackets, comma-separated, no spaces: [10,6]; [] for
 *            a 0-d tensor. SHAPE is the global shape; OFFSETS/SIZES the box.
 *   FILE     a str value: a file name relative to the manifest's directory,
 *            holding the box's elements, C order, little-endian, exactly
 *            prod(SIZES) * element size bytes.
 *   meta     dumpall writes "meta version s\"<metadata version>\"",
 *            "meta entries i<N>" and, per tensor,
 *            "meta nchunks (PATH-as-key-str i<nchunks>)", i.e.
 *            meta nchunks (s"model.w" i3).
 *
 * Values:
 *   none | true | false
 *   i<decimal int64>                    i-42
 *   f<16 lowercase hex digits>          IEEE-754 binary64 bits, most
 *                                       significant first (Python
 *                                       struct.pack('>d', x).hex())
 *   s"<chars>"                          str, UTF-8. Inside the quotes bytes
 *                                       0x21..0x7e stand for themselves
 *                                       except '"' and '\'; \" \\ and \xHH
 *                                       (any byte, two hex digits) escape.
 *                                       Writers escape every other byte.
 *   b<hex digits>                       bytes, two digits a byte (b alone:
 *                                       empty bytes)
 *   [ v v ... ]  ( v v ... )            list, tuple (items space separated)
 *   { k v k v ... }                     dict; keys are values (savefrom
 *                                       accepts str keys only)
 */
#include <dcp/dcp.h>
#include <dcp/dcp_convert.h>
#ifdef DCP_INTEROP_MPI
#include <dcp/dcp_mpi.h>
#endif

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h> /* mkdir */

#ifdef DCP_INTEROP_MPI
#define PROG "interop_state_mpi"
#else
#define PROG "interop_state"
#endif
#define MAX_DEPTH 200

#if defined(__GNUC__)
#define PRINTF_LIKE(a, b) __attribute__((format(printf, a, b)))
#else
#define PRINTF_LIKE(a, b)
#endif

/* ------------------------------------------------------------ messages */

static void fail(const char *fmt, ...) PRINTF_LIKE(1, 2);

/* The communicator of savefrom and loadinto (NULL: one process), and this
 * process's rank in it (0 without MPI). */
static dcp_comm *g_comm;
static int g_rank;

static void fail(const char *fmt, ...)
{
    va_list ap;
    fputs(PROG ": ", stderr);
    if (g_comm)
        fprintf(stderr, "[rank %d] ", g_rank);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

/* Reports a failed library call that took the context. */
static int fail_ctx(const dcp_ctx *ctx, const char *what, int rc)
{
    const char *msg = ctx ? dcp_errmsg(ctx) : "";
    fail("%s: %s (%s: %s)", what, msg && *msg ? msg : dcp_strerror(rc),
         dcp_err_name(rc), dcp_strerror(rc));
    return 1;
}

/* Reports a failed library call without a context. */
static int fail_rc(const char *what, int rc)
{
    fail("%s: %s (%s)", what, dcp_strerror(rc), dcp_err_name(rc));
    return 1;
}

/* -------------------------------------------------------------- buffers */

struct sbuf {
    char *p;
    size_t n;
    size_t cap;
    int oom;
};

static void sb_put(struct sbuf *b, const void *p, size_t n)
{
    if (b->oom)
        return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        char *np;
        while (cap < b->n + n + 1)
            cap *= 2;
        np = realloc(b->p, cap);
        if (!np) {
            b->oom = 1;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
    b->p[b->n] = '\0';
}

static void sb_puts(struct sbuf *b, const char *s)
{
    sb_put(b, s, strlen(s));
}

static void sb_printf(struct sbuf *b, const char *fmt, ...) PRINTF_LIKE(2, 3);

static void sb_printf(struct sbuf *b, const char *fmt, ...)
{
    char tmp[128];
    va_list ap;
    int n;
    va_start(ap, fmt);
    n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof(tmp)) {
        b->oom = 1;
        return;
    }
    sb_put(b, tmp, (size_t)n);
}

/* ---------------------------------------------------------------- files */

/* Reads a whole file; *out is malloc'd (at least 1 byte) and NUL-ended. */
static int read_file(const char *path, char **out, size_t *len)
{
    FILE *f = fopen(path, "rb");
    struct sbuf b = {0};
    char tmp[65536];
    size_t n;
    *out = NULL;
    *len = 0;
    if (!f) {
        fail("cannot open '%s': %s", path, strerror(errno));
        return -1;
    }
    sb_put(&b, "", 0);
    while ((n = fread(tmp, 1, sizeof(tmp), f)) > 0)
        sb_put(&b, tmp, n);
    if (ferror(f) || b.oom) {
        fail("cannot read '%s'", path);
        fclose(f);
        free(b.p);
        return -1;
    }
    fclose(f);
    *out = b.p;
    *len = b.n;
    return 0;
}

static int write_file(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) {
        fail("cannot create '%s': %s", path, strerror(errno));
        return -1;
    }
    if ((n && fwrite(p, 1, n, f) != n) || fclose(f) != 0) {
        fail("cannot write '%s'", path);
        return -1;
    }
    return 0;
}

static char *path_join(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p)
        return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

/* ------------------------------------------------------------- parsing */

struct cur {
    const char *p;
    const char *end; /* end of the line */
    int line;
    char err[512];
};

static void perr(struct cur *c, const char *what)
{
    if (!c->err[0])
        (void)snprintf(c->err, sizeof(c->err), "%s", what);
}

static void skip_ws(struct cur *c)
{
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\r'))
        c->p++;
}

static int at_delim(const struct cur *c)
{
    return c->p >= c->end || *c->p == ' ' || *c->p == '\t' || *c->p == '\r' ||
           *c->p == ']' || *c->p == ')' || *c->p == '}';
}

static int hexval(char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

static int parse_i64(struct cur *c, int64_t *out)
{
    int neg = 0;
    uint64_t v = 0, lim;
    int digits = 0;
    if (c->p < c->end && *c->p == '-') {
        neg = 1;
        c->p++;
    }
    lim = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
        unsigned d = (unsigned)(*c->p - '0');
        if (v > (lim - d) / 10) {
            perr(c, "integer out of int64 range");
            return -1;
        }
        v = v * 10 + d;
        c->p++;
        digits++;
    }
    if (!digits) {
        perr(c, "expected an integer");
        return -1;
    }
    if (neg)
        *out = v == (uint64_t)INT64_MAX + 1 ? INT64_MIN : -(int64_t)v;
    else
        *out = (int64_t)v;
    return 0;
}

/* Parses "..." (the opening quote at c->p); *out is malloc'd, NUL-ended. */
static int parse_quoted(struct cur *c, char **out, size_t *len)
{
    struct sbuf b = {0};
    *out = NULL;
    *len = 0;
    if (c->p >= c->end || *c->p != '"') {
        perr(c, "expected '\"'");
        return -1;
    }
    c->p++;
    sb_put(&b, "", 0);
    for (;;) {
        char ch;
        if (c->p >= c->end) {
            perr(c, "unterminated string");
            free(b.p);
            return -1;
        }
        ch = *c->p++;
        if (ch == '"')
            break;
        if (ch == '\\') {
            if (c->p >= c->end) {
                perr(c, "bad escape");
                free(b.p);
                return -1;
            }
            ch = *c->p++;
            if (ch == 'x') {
                int h, l;
                if (c->end - c->p < 2 || (h = hexval(c->p[0])) < 0 ||
                    (l = hexval(c->p[1])) < 0) {
                    perr(c, "bad \\x escape");
                    free(b.p);
                    return -1;
                }
                ch = (char)(unsigned char)(h * 16 + l);
                c->p += 2;
            } else if (ch != '"' && ch != '\\') {
                perr(c, "bad escape");
                free(b.p);
                return -1;
            }
        }
        sb_put(&b, &ch, 1);
    }
    if (b.oom) {
        perr(c, "out of memory");
        free(b.p);
        return -1;
    }
    *out = b.p;
    *len = b.n;
    return 0;
}

static int match_word(struct cur *c, const char *w)
{
    size_t n = strlen(w);
    if ((size_t)(c->end - c->p) >= n && memcmp(c->p, w, n) == 0) {
        const char *save = c->p;
        c->p += n;
        if (at_delim(c))
            return 1;
        c->p = save;
    }
    return 0;
}

static dcp_value *parse_value(struct cur *c, int depth);

/* Items up to the closing bracket; for a dict, key/value pairs. */
static dcp_value *parse_items(struct cur *c, dcp_value *v, char close,
                              int is_dict, int depth)
{
    for (;;) {
        dcp_value *item, *key = NULL;
        int rc;
        skip_ws(c);
        if (c->p < c->end && *c->p == close) {
            c->p++;
            return v;
        }
        if (c->p >= c->end) {
            perr(c, "unterminated container");
            dcp_value_free(v);
            return NULL;
        }
        if (is_dict) {
            key = parse_value(c, depth + 1);
            if (!key) {
                dcp_value_free(v);
                return NULL;
            }
            if (dcp_value_type_of(key) != DCP_VALUE_STR) {
                perr(c, "dict keys must be str");
                dcp_value_free(key);
                dcp_value_free(v);
                return NULL;
            }
            skip_ws(c);
        }
        item = parse_value(c, depth + 1);
        if (!item) {
            dcp_value_free(key);
            dcp_value_free(v);
            return NULL;
        }
        if (is_dict) {
            rc = dcp_value_dict_set(v, dcp_value_as_str(key, NULL), item);
            dcp_value_free(key);
        } else {
            rc = dcp_value_append(v, item);
        }
        if (rc != DCP_OK) {
            perr(c, is_dict ? "dcp_value_dict_set failed"
                            : "dcp_value_append failed");
            dcp_value_free(v);
            return NULL;
        }
    }
}

static dcp_value *parse_value(struct cur *c, int depth)
{
    dcp_value *v = NULL;
    skip_ws(c);
    if (depth > MAX_DEPTH) {
        perr(c, "value nested too deeply");
        return NULL;
    }
    if (c->p >= c->end) {
        perr(c, "expected a value");
        return NULL;
    }
    if (match_word(c, "none"))
        v = dcp_value_none();
    else if (match_word(c, "true"))
        v = dcp_value_bool(1);
    else if (match_word(c, "false"))
        v = dcp_value_bool(0);
    else if (*c->p == 'i') {
        int64_t i;
        c->p++;
        if (parse_i64(c, &i) != 0)
            return NULL;
        v = dcp_value_int(i);
    } else if (*c->p == 'f') {
        uint64_t bits = 0;
        double d;
        int k;
        c->p++;
        for (k = 0; k < 16; k++) {
            int h = c->p < c->end ? hexval(*c->p) : -1;
            if (h < 0) {
                perr(c, "float needs 16 hex digits");
                return NULL;
            }
            bits = bits << 4 | (uint64_t)h;
            c->p++;
        }
        memcpy(&d, &bits, sizeof(d));
        v = dcp_value_float(d);
    } else if (*c->p == 's') {
        char *s;
        size_t n;
        c->p++;
        if (parse_quoted(c, &s, &n) != 0)
            return NULL;
        v = dcp_value_strn(s, n);
        free(s);
    } else if (*c->p == 'b') {
        struct sbuf b = {0};
        c->p++;
        sb_put(&b, "", 0);
        while (!at_delim(c)) {
            int h = hexval(c->p[0]);
            int l = c->end - c->p >= 2 ? hexval(c->p[1]) : -1;
            char byte;
            if (h < 0 || l < 0) {
                perr(c, "bad hex in bytes");
                free(b.p);
                return NULL;
            }
            byte = (char)(unsigned char)(h * 16 + l);
            sb_put(&b, &byte, 1);
            c->p += 2;
        }
        v = b.oom ? NULL : dcp_value_bytes(b.p, b.n);
        free(b.p);
    } else if (*c->p == '[' || *c->p == '(' || *c->p == '{') {
        char open = *c->p++;
        dcp_value *seq;
        char close;
        if (open == '[') {
            seq = dcp_value_list();
            close = ']';
        } else if (open == '(') {
            seq = dcp_value_tuple();
            close = ')';
        } else {
            seq = dcp_value_dict();
            close = '}';
        }
        if (!seq) {
            perr(c, "out of memory");
            return NULL;
        }
        return parse_items(c, seq, close, open == '{', depth);
    } else {
        perr(c, "unknown value token");
        return NULL;
    }
    if (!v)
        perr(c, "out of memory");
    return v;
}

/* Parses [a,b,...] into dims; *ndim receives the count. */
static int parse_dims(struct cur *c, int64_t *dims, int *ndim)
{
    int n = 0;
    skip_ws(c);
    if (c->p >= c->end || *c->p != '[') {
        perr(c, "expected '['");
        return -1;
    }
    c->p++;
    if (c->p < c->end && *c->p == ']') {
        c->p++;
        *ndim = 0;
        return 0;
    }
    for (;;) {
        if (n >= DCP_MAX_NDIM) {
            perr(c, "too many dimensions");
            return -1;
        }
        if (parse_i64(c, &dims[n]) != 0)
            return -1;
        n++;
        if (c->p < c->end && *c->p == ',') {
            c->p++;
            continue;
        }
        if (c->p < c->end && *c->p == ']') {
            c->p++;
            break;
        }
        perr(c, "expected ',' or ']'");
        return -1;
    }
    *ndim = n;
    return 0;
}

/* A word up to the next space. */
static int parse_word(struct cur *c, char *out, size_t cap)
{
    size_t n = 0;
    skip_ws(c);
    while (!at_delim(c)) {
        if (n + 1 >= cap) {
            perr(c, "word too long");
            return -1;
        }
        out[n++] = *c->p++;
    }
    out[n] = '\0';
    if (!n) {
        perr(c, "expected a word");
        return -1;
    }
    return 0;
}

/* A path: a tuple of str and int items, at least one. */
static dcp_value *parse_path(struct cur *c)
{
    dcp_value *v;
    size_t i, n;
    skip_ws(c);
    if (c->p >= c->end || *c->p != '(') {
        perr(c, "expected a path tuple");
        return NULL;
    }
    v = parse_value(c, 0);
    if (!v)
        return NULL;
    n = dcp_value_len(v);
    if (n == 0) {
        perr(c, "empty path");
        dcp_value_free(v);
        return NULL;
    }
    for (i = 0; i < n; i++) {
        dcp_value_type t = dcp_value_type_of(dcp_value_item(v, i));
        size_t len = 0;
        if (t == DCP_VALUE_STR) {
            const char *s = dcp_value_as_str(dcp_value_item(v, i), &len);
            if (strlen(s) != len) {
                perr(c, "path item holds a NUL byte");
                dcp_value_free(v);
                return NULL;
            }
        } else if (t != DCP_VALUE_INT) {
            perr(c, "path items must be str or int");
            dcp_value_free(v);
            return NULL;
        }
    }
    return v;
}

static int at_end(struct cur *c)
{
    skip_ws(c);
    if (c->p < c->end) {
        perr(c, "trailing characters");
        return 0;
    }
    return 1;
}

/* ------------------------------------------------------------- writing */

static void put_str(struct sbuf *b, char tag, const char *s, size_t n)
{
    size_t i;
    char t[2] = {tag, '"'};
    sb_put(b, t, 2);
    for (i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch >= 0x21 && ch <= 0x7e && ch != '"' && ch != '\\')
            sb_put(b, &s[i], 1);
        else
            sb_printf(b, "\\x%02x", ch);
    }
    sb_put(b, "\"", 1);
}

static int put_value(struct sbuf *b, const dcp_value *v, int depth)
{
    size_t i, n;
    if (!v || depth > MAX_DEPTH)
        return -1;
    switch (dcp_value_type_of(v)) {
    case DCP_VALUE_NONE:
        sb_puts(b, "none");
        return 0;
    case DCP_VALUE_BOOL:
        sb_puts(b, dcp_value_as_bool(v) ? "true" : "false");
        return 0;
    case DCP_VALUE_INT:
        sb_printf(b, "i%" PRId64, dcp_value_as_int(v));
        return 0;
    case DCP_VALUE_FLOAT: {
        double d = dcp_value_as_float(v);
        uint64_t bits;
        memcpy(&bits, &d, sizeof(bits));
        sb_printf(b, "f%016" PRIx64, bits);
        return 0;
    }
    case DCP_VALUE_STR: {
        const char *s = dcp_value_as_str(v, &n);
        put_str(b, 's', s, n);
        return 0;
    }
    case DCP_VALUE_BYTES: {
        const unsigned char *p = dcp_value_as_bytes(v, &n);
        sb_puts(b, "b");
        for (i = 0; i < n; i++)
            sb_printf(b, "%02x", p[i]);
        return 0;
    }
    case DCP_VALUE_LIST:
    case DCP_VALUE_TUPLE:
        sb_puts(b, dcp_value_type_of(v) == DCP_VALUE_LIST ? "[" : "(");
        n = dcp_value_len(v);
        for (i = 0; i < n; i++) {
            if (i)
                sb_puts(b, " ");
            if (put_value(b, dcp_value_item(v, i), depth + 1) != 0)
                return -1;
        }
        sb_puts(b, dcp_value_type_of(v) == DCP_VALUE_LIST ? "]" : ")");
        return 0;
    case DCP_VALUE_DICT:
        sb_puts(b, "{");
        n = dcp_value_len(v);
        for (i = 0; i < n; i++) {
            if (i)
                sb_puts(b, " ");
            if (put_value(b, dcp_value_dict_key(v, i), depth + 1) != 0)
                return -1;
            sb_puts(b, " ");
            if (put_value(b, dcp_value_item(v, i), depth + 1) != 0)
                return -1;
        }
        sb_puts(b, "}");
        return 0;
    }
    return -1;
}

static void put_dims(struct sbuf *b, int ndim, const int64_t *d)
{
    int i;
    sb_puts(b, "[");
    for (i = 0; i < ndim; i++)
        sb_printf(b, "%s%" PRId64, i ? "," : "", d[i]);
    sb_puts(b, "]");
}

/* --------------------------------------------------------------- state */

static uint64_t numel(int ndim, const int64_t *d)
{
    uint64_t n = 1;
    int i;
    for (i = 0; i < ndim; i++)
        n *= (uint64_t)d[i];
    return n;
}

/* One leaf for add_leaf: a tensor box or a value (owned, consumed). */
struct leaf {
    int is_tensor;
    dcp_dtype dtype;
    int ndim;
    const int64_t *shape, *offsets, *sizes;
    const int64_t *strides; /* NULL: C-contiguous */
    void *buf;
    dcp_value *value;
};

/*
 * Adds a leaf under path (a tuple of str/int): pushes every component but the
 * last, adds the leaf named by the last one, and pops back to the root. A
 * last component that is a list index is pushed with dcp_state_push_index
 * and the leaf added with a NULL name (the public API documents no other
 * way to put a leaf at a list index).
 */
static int add_leaf(dcp_state *st, const dcp_value *path, struct leaf *lf,
                    char *why, size_t whylen)
{
    size_t i, n = dcp_value_len(path), pushed = 0;
    const char *name = NULL;
    const dcp_value *last = dcp_value_item(path, n - 1);
    int rc = DCP_OK;
    for (i = 0; rc == DCP_OK && i + 1 < n; i++) {
        const dcp_value *it = dcp_value_item(path, i);
        if (dcp_value_type_of(it) == DCP_VALUE_STR)
            rc = dcp_state_push(st, dcp_value_as_str(it, NULL));
        else
            rc = dcp_state_push_index(st, dcp_value_as_int(it));
        if (rc != DCP_OK)
            (void)snprintf(
                why, whylen, "dcp_state_push%s(path item %zu)",
                dcp_value_type_of(it) == DCP_VALUE_STR ? "" : "_index", i);
        else
            pushed++;
    }
    if (rc == DCP_OK) {
        if (dcp_value_type_of(last) == DCP_VALUE_STR) {
            name = dcp_value_as_str(last, NULL);
        } else {
            rc = dcp_state_push_index(st, dcp_value_as_int(last));
            if (rc == DCP_OK)
                pushed++;
            else
                (void)snprintf(why, whylen, "dcp_state_push_index(last)");
        }
    }
    if (rc == DCP_OK) {
        if (lf->is_tensor)
            rc = dcp_state_add_tensor_strided(
                st, name, lf->dtype, lf->ndim, lf->shape, lf->offsets,
                lf->sizes, lf->strides, lf->buf, DCP_MEM_HOST);
        else
            rc = dcp_state_add_value(st, name, lf->value);
        lf->value = NULL;
        if (rc != DCP_OK)
            (void)snprintf(why, whylen, "dcp_state_add_%s(name=%s%s%s)",
                           lf->is_tensor ? "tensor" : "value", name ? "'" : "",
                           name ? name : "NULL", name ? "'" : "");
    }
    dcp_value_free(lf->value);
    lf->value = NULL;
    while (pushed--) {
        int prc = dcp_state_pop(st);
        if (prc != DCP_OK && rc == DCP_OK) {
            rc = prc;
            (void)snprintf(why, whylen, "dcp_state_pop");
        }
    }
    return rc;
}

/* ------------------------------------------------------------ savefrom */

struct bufs {
    void **p;
    size_t n, cap;
};

static int bufs_add(struct bufs *b, void *p)
{
    if (b->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 64;
        void **np = realloc(b->p, cap * sizeof(*np));
        if (!np)
            return -1;
        b->p = np;
        b->cap = cap;
    }
    b->p[b->n++] = p;
    return 0;
}

static void bufs_free(struct bufs *b)
{
    size_t i;
    for (i = 0; i < b->n; i++)
        free(b->p[i]);
    free(b->p);
}

/*
 * What loadinto writes back, one record per manifest line in file order: the
 * path, and for a tensor box its dtype, dims, output file name and the
 * buffer dcp_load fills (owned by the struct bufs that st borrows from).
 */
struct rec {
    dcp_value *path;
    int is_tensor;
    dcp_dtype dtype;
    int ndim;
    int64_t shape[DCP_MAX_NDIM], offs[DCP_MAX_NDIM], sizes[DCP_MAX_NDIM];
    char *fname;
    void *buf;
    size_t nbytes;
};

struct recs {
    struct rec *p;
    size_t n, cap;
};

/* Appends r (taking its path and fname, also on failure). */
static int recs_add(struct recs *rs, struct rec *r)
{
    if (rs->n == rs->cap) {
        size_t cap = rs->cap ? rs->cap * 2 : 64;
        struct rec *np = realloc(rs->p, cap * sizeof(*np));
        if (!np) {
            dcp_value_free(r->path);
            free(r->fname);
            return -1;
        }
        rs->p = np;
        rs->cap = cap;
    }
    rs->p[rs->n++] = *r;
    return 0;
}

static void recs_free(struct recs *rs)
{
    size_t i;
    for (i = 0; i < rs->n; i++) {
        dcp_value_free(rs->p[i].path);
        free(rs->p[i].fname);
    }
    free(rs->p);
}

static char *dir_of(const char *path)
{
    const char *slash = strrchr(path, '/');
    size_t n = slash ? (size_t)(slash - path) : 1;
    char *d = malloc(n + 2);
    if (!d)
        return NULL;
    if (slash)
        memcpy(d, path, n);
    else
        d[0] = '.';
    d[n] = '\0';
    if (slash && n == 0) {
        d[0] = '/';
        d[1] = '\0';
    }
    return d;
}

/* Largest box loadinto allocates (the manifest is the test's own input). */
#define MAX_LOAD_BOX ((uint64_t)1 << 32)

/* The bytes of one box: for a save read from FILE (its size checked), for a
 * load (out not NULL) a buffer set to 0xa5. *data is malloc'd. */
static int box_data(struct cur *c, const char *mdir, const char *fname,
                    uint64_t want, const struct recs *out, char **data)
{
    char *full;
    size_t dlen = 0;
    *data = NULL;
    if (out) {
        if (fname[0] == '/' || fname[0] == '\0') {
            perr(c, "loadinto needs FILE names relative to OUTDIR");
            return -1;
        }
        if (want > MAX_LOAD_BOX) {
            perr(c, "box too large");
            return -1;
        }
        *data = malloc(want ? (size_t)want : 1);
        if (!*data) {
            perr(c, "out of memory");
            return -1;
        }
        memset(*data, 0xa5, (size_t)want);
        return 0;
    }
    full = fname[0] == '/' ? NULL : path_join(mdir, fname);
    if (read_file(full ? full : fname, data, &dlen) != 0) {
        free(full);
        perr(c, "cannot read the tensor file");
        return -1;
    }
    free(full);
    if (dlen != want) {
        (void)snprintf(c->err, sizeof(c->err),
                       "tensor file holds %zu bytes, the box needs %" PRIu64,
                       dlen, want);
        free(*data);
        *data = NULL;
        return -1;
    }
    return 0;
}

/*
 * DCP_INTEROP_STRIDED: the packed box data (sizes, elements of es bytes)
 * copied into the interior of an allocation one element larger on each
 * side of every dimension (the rest 0xee bytes). *base: the allocation
 * (NULL without memory); returns the interior's first element, strides in
 * stride.
 */
static char *to_strided(const char *data, int nd, const int64_t *sizes,
                        size_t es, int64_t *stride, char **base)
{
    int64_t dim[DCP_MAX_NDIM], idx[DCP_MAX_NDIM] = {0}, total = 1, at, n;
    int64_t k, count = (int64_t)numel(nd, sizes);
    int d;
    for (d = nd - 1; d >= 0; d--) {
        dim[d] = sizes[d] + 2;
        stride[d] = total;
        total *= dim[d];
    }
    *base = malloc((size_t)total * es);
    if (!*base)
        return NULL;
    memset(*base, 0xee, (size_t)total * es);
    for (k = 0; k < count; k++) {
        for (at = 0, d = 0; d < nd; d++)
            at += (idx[d] + 1) * stride[d];
        memcpy(*base + (size_t)at * es, data + (size_t)k * es, es);
        for (d = nd - 1; d >= 0; d--) {
            if (++idx[d] < sizes[d])
                break;
            idx[d] = 0;
        }
    }
    for (n = 0, d = 0; d < nd; d++)
        n += stride[d];
    return *base + (size_t)n * es;
}

/* Handles one "tensor" line after the tag. out: NULL for a save; for a load
 * the record list the line is appended to. */
static int line_tensor(struct cur *c, dcp_state *st, const char *mdir,
                       struct bufs *keep, struct recs *out)
{
    dcp_value *path = NULL;
    int64_t shape[DCP_MAX_NDIM], offs[DCP_MAX_NDIM], sizes[DCP_MAX_NDIM];
    int nd_shape, nd_offs, nd_sizes, rc;
    char dtname[64], why[200] = "";
    char *fname = NULL, *data = NULL, *inner = NULL, *pad = NULL;
    int64_t stride[DCP_MAX_NDIM];
    size_t flen = 0;
    dcp_dtype dt;
    struct leaf lf;
    struct rec r;
    uint64_t want;

    path = parse_path(c);
    if (!path || parse_word(c, dtname, sizeof(dtname)) != 0 ||
        parse_dims(c, shape, &nd_shape) != 0 ||
        parse_dims(c, offs, &nd_offs) != 0 ||
        parse_dims(c, sizes, &nd_sizes) != 0)
        goto bad;
    skip_ws(c);
    if (c->p >= c->end || *c->p != 's') {
        perr(c, "expected a file name s\"...\"");
        goto bad;
    }
    c->p++;
    if (parse_quoted(c, &fname, &flen) != 0 || !at_end(c))
        goto bad;
    if (nd_offs != nd_shape || nd_sizes != nd_shape) {
        perr(c, "shape, offsets and sizes differ in length");
        goto bad;
    }
    if (dcp_dtype_from_name(dtname, &dt) != DCP_OK) {
        perr(c, "unknown dtype");
        goto bad;
    }
    want = numel(nd_sizes, sizes) * dcp_dtype_size(dt);
    if (box_data(c, mdir, fname, want, out, &data) != 0)
        goto bad;
    if (bufs_add(keep, data) != 0) {
        perr(c, "out of memory");
        goto bad;
    }
    if (!out && want && nd_shape > 0 && getenv("DCP_INTEROP_STRIDED")) {
        inner = to_strided(data, nd_shape, sizes, dcp_dtype_size(dt), stride,
                           &pad);
        if (!inner || bufs_add(keep, pad) != 0) {
            free(pad);
            data = NULL; /* kept */
            perr(c, "out of memory");
            goto bad;
        }
    }
    memset(&lf, 0, sizeof(lf));
    lf.is_tensor = 1;
    lf.dtype = dt;
    lf.ndim = nd_shape;
    lf.shape = nd_shape ? shape : NULL;
    lf.offsets = nd_shape ? offs : NULL;
    lf.sizes = nd_shape ? sizes : NULL;
    lf.strides = inner ? stride : NULL;
    lf.buf = inner ? inner : want ? data : NULL; /* an empty box: NULL */
    rc = add_leaf(st, path, &lf, why, sizeof(why));
    if (rc != DCP_OK) {
        data = NULL;
        (void)snprintf(c->err, sizeof(c->err), "%s: %s (%s)", why,
                       dcp_strerror(rc), dcp_err_name(rc));
        goto bad;
    }
    if (out) {
        memset(&r, 0, sizeof(r));
        r.path = path;
        r.is_tensor = 1;
        r.dtype = dt;
        r.ndim = nd_shape;
        memcpy(r.shape, shape, sizeof(shape));
        memcpy(r.offs, offs, sizeof(offs));
        memcpy(r.sizes, sizes, sizeof(sizes));
        r.fname = fname;
        r.buf = data;
        r.nbytes = (size_t)want;
        path = NULL;
        fname = NULL;
        if (recs_add(out, &r) != 0) {
            perr(c, "out of memory");
            data = NULL;
            goto bad;
        }
    }
    dcp_value_free(path);
    free(fname);
    return 0;
bad:
    dcp_value_free(path);
    free(fname);
    free(data);
    return -1;
}

/* Handles one "value" line after the tag; out as for line_tensor. */
static int line_value(struct cur *c, dcp_state *st, struct recs *out)
{
    dcp_value *path = parse_path(c), *v = NULL;
    struct leaf lf;
    char why[200] = "";
    int rc;
    if (!path)
        return -1;
    v = parse_value(c, 0);
    if (!v || !at_end(c)) {
        dcp_value_free(v);
        dcp_value_free(path);
        return -1;
    }
    memset(&lf, 0, sizeof(lf));
    lf.value = v;
    rc = add_leaf(st, path, &lf, why, sizeof(why));
    if (rc != DCP_OK) {
        dcp_value_free(path);
        (void)snprintf(c->err, sizeof(c->err), "%s: %s (%s)", why,
                       dcp_strerror(rc), dcp_err_name(rc));
        return -1;
    }
    if (out) {
        struct rec r;
        memset(&r, 0, sizeof(r));
        r.path = path;
        if (recs_add(out, &r) != 0) {
            perr(c, "out of memory");
            return -1;
        }
        return 0;
    }
    dcp_value_free(path);
    return 0;
}

/* Parses a manifest into st; buffers that st borrows go to keep. out: NULL
 * for a save, the records to write back for a load (loadinto). */
static int read_manifest(const char *mpath, dcp_state *st, struct bufs *keep,
                         struct recs *out)
{
    char *text = NULL, *mdir = NULL;
    size_t len = 0;
    const char *p, *end;
    int lineno = 0, seen_header = 0, ret = -1;
    if (read_file(mpath, &text, &len) != 0)
        return -1;
    mdir = dir_of(mpath);
    if (!mdir) {
        fail("out of memory");
        goto out;
    }
    p = text;
    end = text + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        struct cur c;
        char tag[32];
        memset(&c, 0, sizeof(c));
        c.p = p;
        c.end = nl ? nl : end;
        c.line = ++lineno;
        p = nl ? nl + 1 : end;
        skip_ws(&c);
        if (c.p >= c.end || *c.p == '#')
            continue;
        if (parse_word(&c, tag, sizeof(tag)) != 0)
            goto bad_line;
        if (!seen_header) {
            int64_t ver;
            skip_ws(&c);
            if (strcmp(tag, "dcp-manifest") != 0 || parse_i64(&c, &ver) != 0 ||
                ver != 1 || !at_end(&c)) {
                perr(&c, "expected 'dcp-manifest 1'");
                goto bad_line;
            }
            seen_header = 1;
            continue;
        }
        if (strcmp(tag, "tensor") == 0) {
            if (line_tensor(&c, st, mdir, keep, out) != 0)
                goto bad_line;
        } else if (strcmp(tag, "value") == 0) {
            if (line_value(&c, st, out) != 0)
                goto bad_line;
        } else if (strcmp(tag, "meta") != 0) {
            perr(&c, "unknown record");
            goto bad_line;
        }
        continue;
    bad_line:
        fail("%s line %d: %s", mpath, c.line, c.err[0] ? c.err : "bad line");
        goto out;
    }
    if (!seen_header) {
        fail("%s: no 'dcp-manifest 1' header", mpath);
        goto out;
    }
    ret = 0;
out:
    free(text);
    free(mdir);
    return ret;
}

/*
 * Whether every rank passes ok (collective under MPI): a rank that cannot
 * build its state must not leave the others waiting in dcp_save/dcp_load.
 */
static int all_ok(int ok)
{
#ifdef DCP_INTEROP_MPI
    int all = 0;
    if (MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD) !=
        MPI_SUCCESS)
        return 0;
    if (ok && !all)
        fail("another rank failed");
    return all;
#else
    return ok;
#endif
}

/* s with every "{rank}" replaced by this process's rank; malloc'd. */
static char *subst_rank(const char *s)
{
    static const char tok[] = "{rank}";
    struct sbuf b = {0};
    const char *hit;
    sb_put(&b, "", 0);
    while ((hit = strstr(s, tok)) != NULL) {
        sb_put(&b, s, (size_t)(hit - s));
        sb_printf(&b, "%d", g_rank);
        s = hit + sizeof(tok) - 1;
    }
    sb_puts(&b, s);
    if (b.oom) {
        free(b.p);
        fail("out of memory");
        return NULL;
    }
    return b.p;
}

static int cmd_savefrom(const char *manifest, const char *dir, int async)
{
    dcp_state *st = NULL;
    dcp_ctx *ctx = NULL;
    dcp_request *req = NULL;
    dcp_ctx_options co;
    struct bufs keep = {0};
    dcp_save_options so;
    int rc, ret = 1;
    rc = dcp_state_create(&st);
    if (rc != DCP_OK)
        return fail_rc("dcp_state_create", rc);
    if (!all_ok(read_manifest(manifest, st, &keep, NULL) == 0))
        goto out;
    memset(&co, 0, sizeof(co));
    co.struct_size = sizeof(co);
    co.staging_budget = (uint64_t)64 << 10;
    rc = dcp_ctx_create(&ctx, g_comm, async ? &co : NULL);
    if (rc != DCP_OK) {
        fail_rc("dcp_ctx_create", rc);
        goto out;
    }
    memset(&so, 0, sizeof(so));
    so.struct_size = sizeof(so);
    so.no_fsync = 1;
    /* Save flags (enum dcp_save_flags) from the test, e.g. DCP_SAVE_ZSTD. */
    if (getenv("DCP_INTEROP_SAVE_FLAGS"))
        so.flags = (unsigned)strtoul(getenv("DCP_INTEROP_SAVE_FLAGS"), NULL, 0);
    /* Hugging Face safetensors output instead (dcp_save_hf):
     * DCP_INTEROP_SAVE_HF=sharded or consolidated. */
    if (getenv("DCP_INTEROP_SAVE_HF") && !async) {
        dcp_convert_options ho;
        memset(&ho, 0, sizeof(ho));
        ho.struct_size = sizeof(ho);
        ho.flags = DCP_CONVERT_NO_FSYNC;
        if (!strcmp(getenv("DCP_INTEROP_SAVE_HF"), "consolidated"))
            ho.flags |= DCP_CONVERT_HF_CONSOLIDATED;
        rc = dcp_save_hf(ctx, st, dir, &ho);
        if (rc != DCP_OK) {
            fail_ctx(ctx, "dcp_save_hf", rc);
            goto out;
        }
        ret = 0;
        goto out;
    }
    if (async) {
        rc = dcp_save_async(ctx, st, dir, &so, &req);
        if (rc == DCP_OK) {
            /* Staged: nothing of the state may be read from here on. */
            dcp_state_free(st);
            st = NULL;
            bufs_free(&keep);
            memset(&keep, 0, sizeof(keep));
            rc = dcp_request_wait(req);
        }
        dcp_request_free(req);
    } else {
        rc = dcp_save(ctx, st, dir, &so);
    }
    if (rc != DCP_OK) {
        fail_ctx(ctx, async ? "dcp_save_async" : "dcp_save", rc);
        goto out;
    }
    ret = 0;
out:
    dcp_ctx_free(ctx);
    dcp_state_free(st);
    bufs_free(&keep);
    return ret;
}

/* ------------------------------------------------------------- dumpall */

/* The planner_data path of entry i as a tuple value (the key alone when
 * there is none). */
static dcp_value *entry_path(const dcp_metadata *md, size_t i,
                             const dcp_entry_info *info)
{
    dcp_value *t = dcp_value_tuple();
    size_t j;
    if (!t)
        return NULL;
    if (info->npath == 0) {
        if (dcp_value_append(t, dcp_value_str(info->key)) != DCP_OK) {
            dcp_value_free(t);
            return NULL;
        }
        return t;
    }
    for (j = 0; j < info->npath; j++) {
        const char *s = NULL;
        int64_t num = 0;
        int rc = dcp_metadata_path(md, i, j, &s, &num);
        if (rc != DCP_OK ||
            dcp_value_append(t, s ? dcp_value_str(s) : dcp_value_int(num)) !=
                DCP_OK) {
            dcp_value_free(t);
            return NULL;
        }
    }
    return t;
}

/* The path's items joined with '.' (the key); malloc'd, NULL without
 * memory. */
static char *path_key(const dcp_value *path)
{
    struct sbuf b = {0};
    size_t i, n = dcp_value_len(path);
    sb_put(&b, "", 0);
    for (i = 0; i < n; i++) {
        const dcp_value *it = dcp_value_item(path, i);
        if (i)
            sb_puts(&b, ".");
        if (dcp_value_type_of(it) == DCP_VALUE_STR)
            sb_puts(&b, dcp_value_as_str(it, NULL));
        else
            sb_printf(&b, "%" PRId64, dcp_value_as_int(it));
    }
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p;
}

/* Whether the path's items joined with '.' spell key. */
static int path_spells(const dcp_value *path, const char *key)
{
    char *k = path_key(path);
    int same = k && strcmp(k, key) == 0;
    free(k);
    return same;
}

/* Adds entry i to st for a load: under its planner_data path when that path
 * spells the key and ends with a dict key, else at the root under the key
 * itself (same FQN). */
static int dump_add(dcp_state *st, const dcp_value *path,
                    const dcp_entry_info *info, void *buf, char *why,
                    size_t whylen)
{
    size_t n = dcp_value_len(path);
    struct leaf lf;
    memset(&lf, 0, sizeof(lf));
    lf.is_tensor = info->is_tensor;
    lf.dtype = info->dtype;
    lf.ndim = info->ndim;
    lf.shape = info->ndim ? info->shape : NULL;
    lf.buf = buf;
    if (!info->is_tensor)
        lf.value = dcp_value_none();
    if (path_spells(path, info->key) &&
        dcp_value_type_of(dcp_value_item(path, n - 1)) == DCP_VALUE_STR)
        return add_leaf(st, path, &lf, why, whylen);
    {
        dcp_value *root = dcp_value_tuple();
        int rc;
        if (!root || dcp_value_append(root, dcp_value_str(info->key)) != 0) {
            dcp_value_free(root);
            dcp_value_free(lf.value);
            return DCP_ENOMEM;
        }
        rc = add_leaf(st, root, &lf, why, whylen);
        dcp_value_free(root);
        return rc;
    }
}

/* What dumpall holds: the metadata, the state it loads, per entry its path
 * and (tensors) its buffer. */
struct dump {
    dcp_ctx *ctx;
    dcp_metadata *md;
    dcp_state *st;
    size_t n;
    dcp_value **paths;
    void **bufs;
    struct sbuf man;
};

static void dump_release(struct dump *d)
{
    size_t i;
    for (i = 0; i < d->n; i++) {
        if (d->paths)
            dcp_value_free(d->paths[i]);
        if (d->bufs)
            free(d->bufs[i]);
    }
    free(d->paths);
    free(d->bufs);
    free(d->man.p);
    dcp_state_free(d->st);
    dcp_metadata_free(d->md);
    dcp_ctx_free(d->ctx);
}

/* Opens dir and builds the state: every entry, tensors zeroed. */
static int dump_build(struct dump *d, const char *dir)
{
    size_t i;
    int rc = dcp_ctx_create(&d->ctx, NULL, NULL);
    if (rc != DCP_OK)
        return fail_rc("dcp_ctx_create", rc);
    rc = dcp_metadata_open(d->ctx, dir, &d->md);
    if (rc != DCP_OK)
        return fail_ctx(d->ctx, "dcp_metadata_open", rc);
    d->n = dcp_metadata_count(d->md);
    d->paths = calloc(d->n + 1, sizeof(*d->paths));
    d->bufs = calloc(d->n + 1, sizeof(*d->bufs));
    rc = dcp_state_create(&d->st);
    if (!d->paths || !d->bufs || rc != DCP_OK) {
        fail("out of memory");
        return 1;
    }
    for (i = 0; i < d->n; i++) {
        dcp_entry_info info;
        char why[200] = "";
        rc = dcp_metadata_entry(d->md, i, &info);
        if (rc != DCP_OK)
            return fail_ctx(d->ctx, "dcp_metadata_entry", rc);
        d->paths[i] = entry_path(d->md, i, &info);
        if (!d->paths[i]) {
            fail("entry %zu (%s): cannot read its planner_data path", i,
                 info.key);
            return 1;
        }
        if (info.is_tensor) {
            uint64_t want =
                numel(info.ndim, info.shape) * dcp_dtype_size(info.dtype);
            if (want != info.nbytes) {
                fail("entry '%s': nbytes %" PRIu64 " but shape and dtype "
                     "give %" PRIu64,
                     info.key, info.nbytes, want);
                return 1;
            }
            d->bufs[i] = calloc(want ? (size_t)want : 1, 1);
            if (!d->bufs[i]) {
                fail("out of memory");
                return 1;
            }
        }
        rc = dump_add(d->st, d->paths[i], &info,
                      info.nbytes ? d->bufs[i] : NULL, why, sizeof(why));
        if (rc != DCP_OK) {
            fail("entry '%s': %s: %s (%s)", info.key, why, dcp_strerror(rc),
                 dcp_err_name(rc));
            return 1;
        }
    }
    return 0;
}

/* Writes tensor entry i (its line and t<i>.bin) and checks that
 * dcp_metadata_read_box reads the bytes dcp_load gave. */
static int dump_tensor(struct dump *d, size_t i, const dcp_entry_info *info,
                       const char *outdir)
{
    int64_t zeros[DCP_MAX_NDIM] = {0};
    char fname[64];
    char *full;
    void *check;
    int rc;
    (void)snprintf(fname, sizeof(fname), "t%zu.bin", i);
    sb_puts(&d->man, "tensor ");
    (void)put_value(&d->man, d->paths[i], 0);
    sb_printf(&d->man, " %s ", dcp_dtype_name(info->dtype));
    put_dims(&d->man, info->ndim, info->shape);
    sb_puts(&d->man, " ");
    put_dims(&d->man, info->ndim, zeros);
    sb_puts(&d->man, " ");
    put_dims(&d->man, info->ndim, info->shape);
    sb_puts(&d->man, " ");
    put_str(&d->man, 's', fname, strlen(fname));
    sb_puts(&d->man, "\nmeta nchunks (");
    put_str(&d->man, 's', info->key, strlen(info->key));
    sb_printf(&d->man, " i%zu)\n", info->nchunks);
    full = path_join(outdir, fname);
    if (!full || write_file(full, d->bufs[i], (size_t)info->nbytes) != 0) {
        free(full);
        return 1;
    }
    free(full);
    check = calloc(info->nbytes ? (size_t)info->nbytes : 1, 1);
    if (!check) {
        fail("out of memory");
        return 1;
    }
    rc = dcp_metadata_read_box(d->ctx, d->md, i, NULL, NULL, check,
                               (size_t)info->nbytes, 1);
    if (rc != DCP_OK) {
        free(check);
        return fail_ctx(d->ctx, "dcp_metadata_read_box", rc);
    }
    rc = memcmp(check, d->bufs[i], (size_t)info->nbytes);
    free(check);
    if (rc != 0) {
        fail("'%s': dcp_metadata_read_box and dcp_load disagree", info->key);
        return 1;
    }
    return 0;
}

/* Writes value entry i and checks that dcp_metadata_read_value gives the
 * value dcp_load gave. */
static int dump_value(struct dump *d, size_t i, const dcp_entry_info *info)
{
    const dcp_value *v = dcp_state_value(d->st, info->key);
    dcp_value *check = NULL;
    int rc, same;
    if (!v) {
        fail("'%s': dcp_state_value gives NULL after dcp_load", info->key);
        return 1;
    }
    sb_puts(&d->man, "value ");
    (void)put_value(&d->man, d->paths[i], 0);
    sb_puts(&d->man, " ");
    if (put_value(&d->man, v, 0) != 0) {
        fail("'%s': value nested too deeply to dump", info->key);
        return 1;
    }
    sb_puts(&d->man, "\n");
    rc = dcp_metadata_read_value(d->ctx, d->md, i, &check);
    if (rc != DCP_OK)
        return fail_ctx(d->ctx, "dcp_metadata_read_value", rc);
    same = dcp_value_equal(check, v);
    dcp_value_free(check);
    if (!same) {
        fail("'%s': dcp_metadata_read_value and dcp_load disagree", info->key);
        return 1;
    }
    return 0;
}

static int cmd_dumpall(const char *dir, const char *outdir)
{
    struct dump d;
    dcp_load_options lo;
    const char *version;
    char *mpath = NULL;
    size_t i;
    int rc, ret = 1;

    memset(&d, 0, sizeof(d));
    if (dump_build(&d, dir) != 0)
        goto out;
    memset(&lo, 0, sizeof(lo));
    lo.struct_size = sizeof(lo);
    rc = dcp_load(d.ctx, d.st, dir, &lo);
    if (rc != DCP_OK) {
        fail_ctx(d.ctx, "dcp_load", rc);
        goto out;
    }
    if (mkdir(outdir, 0777) != 0 && errno != EEXIST) {
        fail("cannot create '%s': %s", outdir, strerror(errno));
        goto out;
    }
    version = dcp_metadata_version(d.md);
    sb_puts(&d.man, "dcp-manifest 1\n# written by interop_state dumpall\n");
    sb_puts(&d.man, "meta version ");
    put_str(&d.man, 's', version, strlen(version));
    sb_printf(&d.man, "\nmeta entries i%zu\n", d.n);
    for (i = 0; i < d.n; i++) {
        dcp_entry_info info;
        rc = dcp_metadata_entry(d.md, i, &info);
        if (rc != DCP_OK) {
            fail_ctx(d.ctx, "dcp_metadata_entry", rc);
            goto out;
        }
        if (info.is_tensor ? dump_tensor(&d, i, &info, outdir) != 0
                           : dump_value(&d, i, &info) != 0)
            goto out;
    }
    if (d.man.oom) {
        fail("out of memory");
        goto out;
    }
    mpath = path_join(outdir, "manifest");
    if (!mpath || write_file(mpath, d.man.p, d.man.n) != 0)
        goto out;
    ret = 0;
out:
    free(mpath);
    dump_release(&d);
    return ret;
}

/* ------------------------------------------------------------ loadinto */

/* Writes one record of OUTDIR/manifest (and a box's OUTDIR/FILE). */
static int put_rec(struct sbuf *man, const struct rec *r, const dcp_state *st,
                   const char *outdir)
{
    const dcp_value *v;
    char *key, *full;
    int ret;
    if (r->is_tensor) {
        sb_puts(man, "tensor ");
        (void)put_value(man, r->path, 0);
        sb_printf(man, " %s ", dcp_dtype_name(r->dtype));
        put_dims(man, r->ndim, r->shape);
        sb_puts(man, " ");
        put_dims(man, r->ndim, r->offs);
        sb_puts(man, " ");
        put_dims(man, r->ndim, r->sizes);
        sb_puts(man, " ");
        put_str(man, 's', r->fname, strlen(r->fname));
        sb_puts(man, "\n");
        full = path_join(outdir, r->fname);
        ret = full ? write_file(full, r->buf, r->nbytes) : -1;
        free(full);
        return ret;
    }
    key = path_key(r->path);
    v = key ? dcp_state_value(st, key) : NULL;
    if (!v) {
        fail("'%s': dcp_state_value gives NULL after dcp_load",
             key ? key : "?");
        free(key);
        return -1;
    }
    free(key);
    sb_puts(man, "value ");
    (void)put_value(man, r->path, 0);
    sb_puts(man, " ");
    if (put_value(man, v, 0) != 0) {
        fail("a loaded value nested too deeply to write");
        return -1;
    }
    sb_puts(man, "\n");
    return 0;
}

static int write_loaded(const struct recs *rs, const dcp_state *st,
                        const char *outdir)
{
    struct sbuf man = {0};
    char *mpath = NULL;
    size_t i;
    int ret = -1;
    if (mkdir(outdir, 0777) != 0 && errno != EEXIST) {
        fail("cannot create '%s': %s", outdir, strerror(errno));
        return -1;
    }
    sb_puts(&man, "dcp-manifest 1\n# written by " PROG " loadinto\n");
    for (i = 0; i < rs->n; i++)
        if (put_rec(&man, &rs->p[i], st, outdir) != 0)
            goto out;
    if (man.oom) {
        fail("out of memory");
        goto out;
    }
    mpath = path_join(outdir, "manifest");
    if (!mpath || write_file(mpath, man.p, man.n) != 0)
        goto out;
    ret = 0;
out:
    free(mpath);
    free(man.p);
    return ret;
}

static int cmd_loadinto(const char *manifest, const char *dir,
                        const char *outdir)
{
    dcp_state *st = NULL;
    dcp_ctx *ctx = NULL;
    struct bufs keep = {0};
    struct recs recs = {0};
    dcp_load_options lo;
    int rc, ret = 1;
    rc = dcp_state_create(&st);
    if (rc != DCP_OK)
        return fail_rc("dcp_state_create", rc);
    if (!all_ok(read_manifest(manifest, st, &keep, &recs) == 0))
        goto out;
    rc = dcp_ctx_create(&ctx, g_comm, NULL);
    if (rc != DCP_OK) {
        fail_rc("dcp_ctx_create", rc);
        goto out;
    }
    memset(&lo, 0, sizeof(lo));
    lo.struct_size = sizeof(lo);
    rc = dcp_load(ctx, st, dir, &lo);
    if (rc != DCP_OK) {
        fail_ctx(ctx, "dcp_load", rc);
        goto out;
    }
    if (write_loaded(&recs, st, outdir) != 0)
        goto out;
    ret = 0;
out:
    dcp_ctx_free(ctx);
    dcp_state_free(st);
    recs_free(&recs);
    bufs_free(&keep);
    return ret;
}

/* ------------------------------------------------------- loadbox/readbox */

/* Parses "1,2,3" (or "-" / "" for none) into at most DCP_MAX_NDIM dims. */
static int parse_csv(const char *s, int64_t *dims, int *n)
{
    struct cur c;
    int k = 0;
    memset(&c, 0, sizeof(c));
    *n = 0;
    if (strcmp(s, "-") == 0 || *s == '\0')
        return 0;
    c.p = s;
    c.end = s + strlen(s);
    for (;;) {
        if (k >= DCP_MAX_NDIM || parse_i64(&c, &dims[k]) != 0)
            return -1;
        k++;
        if (c.p == c.end)
            break;
        if (*c.p != ',')
            return -1;
        c.p++;
    }
    *n = k;
    return 0;
}

/* Loads one box of key through dcp_load with DCP_LOAD_PARTIAL; the report
 * must list no missing key and every other key as unexpected. */
static int box_by_load(dcp_ctx *ctx, const dcp_metadata *md, const char *dir,
                       const char *key, const dcp_entry_info *info,
                       const int64_t *offs, const int64_t *sizes, void *buf)
{
    dcp_state *st = NULL;
    dcp_load_options lo;
    const char *const *keys = NULL;
    size_t nmiss, nunexp, total = dcp_metadata_count(md);
    int rc = dcp_state_create(&st), ret = 1;
    if (rc != DCP_OK)
        return fail_rc("dcp_state_create", rc);
    rc = dcp_state_add_tensor(st, key, info->dtype, info->ndim,
                              info->ndim ? info->shape : NULL, offs, sizes, buf,
                              DCP_MEM_HOST);
    if (rc != DCP_OK) {
        fail_rc("dcp_state_add_tensor", rc);
        goto out;
    }
    memset(&lo, 0, sizeof(lo));
    lo.struct_size = sizeof(lo);
    lo.flags = DCP_LOAD_PARTIAL;
    rc = dcp_load(ctx, st, dir, &lo);
    if (rc != DCP_OK) {
        fail_ctx(ctx, "dcp_load", rc);
        goto out;
    }
    nmiss = dcp_load_report(ctx, 0, &keys);
    if (nmiss != 0) {
        fail("load report: %zu missing keys (first '%s'), expected none", nmiss,
             keys && keys[0] ? keys[0] : "?");
        goto out;
    }
    nunexp = dcp_load_report(ctx, 1, &keys);
    if (nunexp != total - 1) {
        fail("load report: %zu unexpected keys, expected %zu", nunexp,
             total - 1);
        goto out;
    }
    ret = 0;
out:
    dcp_state_free(st);
    return ret;
}

static int cmd_box(int use_load, const char *dir, const char *key,
                   const char *soffs, const char *ssizes, const char *outfile)
{
    dcp_ctx *ctx = NULL;
    dcp_metadata *md = NULL;
    int64_t offs[DCP_MAX_NDIM], sizes[DCP_MAX_NDIM];
    int noffs, nsizes, rc, ret = 1;
    dcp_entry_info info;
    void *buf = NULL;
    uint64_t nbytes;
    long idx;

    if (parse_csv(soffs, offs, &noffs) != 0 ||
        parse_csv(ssizes, sizes, &nsizes) != 0 || noffs != nsizes) {
        fail("bad OFFS/SIZES '%s' '%s'", soffs, ssizes);
        return 2;
    }
    rc = dcp_ctx_create(&ctx, NULL, NULL);
    if (rc != DCP_OK)
        return fail_rc("dcp_ctx_create", rc);
    rc = dcp_metadata_open(ctx, dir, &md);
    if (rc != DCP_OK) {
        fail_ctx(ctx, "dcp_metadata_open", rc);
        goto out;
    }
    idx = dcp_metadata_find(md, key);
    if (idx < 0 && use_load) {
        /* A key of a dtype dcp cannot read (dcp_metadata_unsupported):
         * asked for as int8 bytes, which dcp_load must refuse by name. */
        size_t i, nu = dcp_metadata_unsupported_count(md);
        for (i = 0; i < nu; i++)
            if (dcp_metadata_unsupported(md, i, &info, NULL) == DCP_OK &&
                !strcmp(info.key, key))
                break;
        if (i < nu)
            info.dtype = DCP_I8;
        else
            idx = -2;
    }
    if (idx == -2 || (idx < 0 && !use_load)) {
        fail("no key '%s' in %s", key, dir);
        goto out;
    }
    rc = idx >= 0 ? dcp_metadata_entry(md, (size_t)idx, &info) : DCP_OK;
    if (rc != DCP_OK) {
        fail_ctx(ctx, "dcp_metadata_entry", rc);
        goto out;
    }
    if (!info.is_tensor || info.ndim != noffs) {
        fail("'%s' is not a %d-d tensor", key, noffs);
        goto out;
    }
    nbytes = numel(noffs, sizes) * dcp_dtype_size(info.dtype);
    buf = calloc(nbytes ? (size_t)nbytes : 1, 1);
    if (!buf) {
        fail("out of memory");
        goto out;
    }
    if (use_load) {
        if (box_by_load(ctx, md, dir, key, &info, noffs ? offs : NULL,
                        noffs ? sizes : NULL, nbytes ? buf : NULL) != 0)
            goto out;
    } else {
        rc =
            dcp_metadata_read_box(ctx, md, (size_t)idx, noffs ? offs : NULL,
                                  noffs ? sizes : NULL, buf, (size_t)nbytes, 1);
        if (rc != DCP_OK) {
            fail_ctx(ctx, "dcp_metadata_read_box", rc);
            goto out;
        }
    }
    if (write_file(outfile, buf, (size_t)nbytes) != 0)
        goto out;
    ret = 0;
out:
    free(buf);
    dcp_metadata_free(md);
    dcp_ctx_free(ctx);
    return ret;
}

/* ---------------------------------------------------------------- main */

static int usage(void)
{
    fputs("usage: " PROG " savefrom MANIFEST DIR\n"
          "       " PROG " loadinto MANIFEST DIR OUTDIR\n"
          "       " PROG " dumpall DIR OUTDIR\n"
          "       " PROG " savefrom-async MANIFEST DIR\n"
          "       " PROG " loadbox DIR KEY OFFS SIZES OUTFILE\n"
          "       " PROG " readbox DIR KEY OFFS SIZES OUTFILE\n",
          stderr);
    return 2;
}

/* savefrom (async: savefrom-async) and loadinto with "{rank}" in
 * MANIFEST and OUTDIR replaced. */
static int cmd_ranked(int load, const char *manifest, const char *dir,
                      const char *outdir, int async)
{
    char *m = subst_rank(manifest), *o = load ? subst_rank(outdir) : NULL;
    int ret = 1;
    if (!all_ok(m && (!load || o)))
        goto out;
    ret = load ? cmd_loadinto(m, dir, o) : cmd_savefrom(m, dir, async);
out:
    free(m);
    free(o);
    return ret;
}

static int run_cmd(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "savefrom") == 0)
        return cmd_ranked(0, argv[2], argv[3], NULL, 0);
    if (argc == 5 && strcmp(argv[1], "loadinto") == 0)
        return cmd_ranked(1, argv[2], argv[3], argv[4], 0);
    if (argc == 4 && strcmp(argv[1], "savefrom-async") == 0)
        return cmd_ranked(0, argv[2], argv[3], NULL, 1);
    if (argc == 4 && strcmp(argv[1], "dumpall") == 0)
        return cmd_dumpall(argv[2], argv[3]);
    if (argc == 7 && strcmp(argv[1], "loadbox") == 0)
        return cmd_box(1, argv[2], argv[3], argv[4], argv[5], argv[6]);
    if (argc == 7 && strcmp(argv[1], "readbox") == 0)
        return cmd_box(0, argv[2], argv[3], argv[4], argv[5], argv[6]);
    return usage();
}

#ifdef DCP_INTEROP_MPI
int main(int argc, char **argv)
{
    dcp_comm *comm = NULL;
    int rc, ret = 1;
    if (MPI_Init(&argc, &argv) != MPI_SUCCESS) {
        fail("MPI_Init failed");
        return 1;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    rc = dcp_comm_mpi(&comm, MPI_COMM_WORLD);
    if (rc != DCP_OK) {
        fail_rc("dcp_comm_mpi", rc);
        goto out;
    }
    g_comm = comm;
    ret = run_cmd(argc, argv);
out:
    g_comm = NULL;
    dcp_comm_free(comm);
    MPI_Finalize();
    return ret;
}
#else
int main(int argc, char **argv)
{
    return run_cmd(argc, argv);
}
#endif
