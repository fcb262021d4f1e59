/*
 * S3 client: see s3.h. SigV4 is computed here with OpenSSL's libcrypto
 * rather than by libcurl's CURLOPT_AWS_SIGV4, so that the signature does not
 * depend on the curl version (its SigV4 code changed over 7.75 .. 8.x in
 * which headers it signs and what it hashes for an upload fed by a read
 * callback; Debian 12's 7.88 was not audited for x-amz-security-token and
 * UNSIGNED-PAYLOAD) and is checked by a signer no one here wrote: the s3.auth
 * test runs moto with botocore's verification on. Every request of one call
 * runs on one curl multi handle, so parts, ranges and deletes go many at a
 * time; a share handle keeps the connection pool, DNS and TLS sessions
 * across calls.
 */
#include "s3.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h> /* strcasecmp */
#include <time.h>

#include <curl/curl.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "crc32.h"

#define S3_RESP_MAX  (16u << 20) /* listing and error bodies */
#define S3_ETAG_MAX  80
/* Bodies up to this size carry Content-MD5 (their ETag checked) even with
 * checksums: every S3 store checks Content-MD5, and for .metadata and the
 * lock it costs nothing; larger bodies rely on the CRC checksum alone. */
#define MD5_SMALL    ((size_t)1 << 20)
#define S3_MAX_PARTS 10000
#define S3_MIN_PART  (5u << 20)
#define S3_UNSIGNED  "UNSIGNED-PAYLOAD"
#define S3_BIG_XFER  ((size_t)1 << 20) /* bodies from 1 MiB ... */
#define S3_XFER_BUF  ((size_t)512 << 10) /* ... move in 512 KiB */

/* HTTP requests sent by this process (dcp__s3_requests). */
static _Atomic uint64_t n_get, n_other;

uint64_t dcp__s3_requests(int get)
{
    return atomic_load(get ? &n_get : &n_other);
}

struct dcp__s3 {
    char *bucket, *ak, *sk, *token, *region;
    char *base;     /* scheme://authority[/bucket] for URLs */
    char *host;     /* Host header value */
    char *uri_base; /* "/bucket" (path style) or "" (virtual host) */
    struct dcp__s3_config c;
    CURLSH *share;
    pthread_mutex_t locks[CURL_LOCK_DATA_LAST];
    int share_ok;
    /* Data PUTs carry x-amz-checksum-crc32 and multipart uploads are
     * created with CRC32 checksums (the server verifies every part):
     * unless AWS_REQUEST_CHECKSUM_CALCULATION is "when_required". */
    int checksums;
};

/* ------------------------------------------------------------- utilities */

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static const char *env_first(const char *a, const char *b)
{
    const char *v = a ? getenv(a) : NULL;
    if (v && *v)
        return v;
    v = b ? getenv(b) : NULL;
    return v && *v ? v : NULL;
}

static void hexify(const uint8_t *d, size_t n, char *out)
{
    static const char hx[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = hx[d[i] >> 4];
        out[2 * i + 1] = hx[d[i] & 15];
    }
    out[2 * n] = 0;
}

static int sha256_hex(const void *d, size_t n, char out[65])
{
    uint8_t md[32];
    unsigned int ml = 0;
    if (!EVP_Digest(d, n, md, &ml, EVP_sha256(), NULL) || ml != 32)
        return -1;
    hexify(md, 32, out);
    return 0;
}

static int hmac256(const uint8_t *k, size_t kl, const char *m, uint8_t out[32])
{
    unsigned int ol = 0;
    if (!HMAC(EVP_sha256(), k, (int)kl, (const unsigned char *)m, strlen(m),
              out, &ol) ||
        ol != 32)
        return -1;
    return 0;
}

/* MD5 of d: hex (for the ETag check) and base64 (Content-MD5). */
static int md5_both(const void *d, size_t n, char hex[33], char b64[25])
{
    uint8_t md[16];
    unsigned int ml = 0;
    if (!EVP_Digest(d, n, md, &ml, EVP_md5(), NULL) || ml != 16)
        return -1;
    hexify(md, 16, hex);
    EVP_EncodeBlock((unsigned char *)b64, md, 16);
    return 0;
}

static const void *find_mem(const void *h, size_t hl, const char *n, size_t nl)
{
    const char *p = h;
    for (size_t i = 0; i + nl <= hl; i++)
        if (memcmp(p + i, n, nl) == 0)
            return p + i;
    return NULL;
}

static int unreserved(unsigned char c)
{
    return isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~';
}

/* SigV4 URI encoding of s into b; keep_slash for object key paths. */
static int uri_encode(struct dcp_buf *b, const char *s, int keep_slash)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        int rc = (unreserved(*p) || (keep_slash && *p == '/'))
                     ? dcp__buf_put_u8(b, *p)
                     : dcp__buf_printf(b, "%%%02X", *p);
        if (rc != DCP_OK)
            return rc;
    }
    return DCP_OK;
}

/* Valid UTF-8 without control characters, 1..max bytes. */
static int check_utf8(const char *s, size_t max, size_t *lenp)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t n = 0;
    while (p[n]) {
        unsigned char c = p[n];
        size_t k;
        uint32_t cp;
        if (c < 0x80) {
            if (c < 0x20 || c == 0x7f)
                return -1;
            n++;
            continue;
        } else if ((c & 0xe0) == 0xc0) {
            k = 1, cp = c & 0x1f;
        } else if ((c & 0xf0) == 0xe0) {
            k = 2, cp = c & 0x0f;
        } else if ((c & 0xf8) == 0xf0) {
            k = 3, cp = c & 0x07;
        } else {
            return -1;
        }
        for (size_t i = 1; i <= k; i++) {
            if ((p[n + i] & 0xc0) != 0x80)
                return -1;
            cp = (cp << 6) | (p[n + i] & 0x3f);
        }
        if ((k == 1 && cp < 0x80) || (k == 2 && cp < 0x800) ||
            (k == 3 && cp < 0x10000) || cp > 0x10ffff ||
            (cp >= 0xd800 && cp <= 0xdfff))
            return -1;
        n += k + 1;
        if (n > max)
            return -1;
    }
    if (n > max)
        return -1;
    *lenp = n;
    return 0;
}

int dcp__s3_check_key(const char *key, struct dcp_err *err)
{
    size_t n = 0;
    if (!key || !*key || check_utf8(key, 1024, &n) != 0)
        return dcp__err(err, DCP_EINVAL,
                        "invalid S3 object key '%.64s': 1..1024 bytes of "
                        "UTF-8 without control characters",
                        key ? key : "(null)");
    return DCP_OK;
}

static int check_bucket(const char *b)
{
    size_t n = strlen(b);
    if (n < 3 || n > 63)
        return -1;
    for (size_t i = 0; i < n; i++) {
        char c = b[i];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
              c == '-'))
            return -1;
    }
    if (!isalnum((unsigned char)b[0]) || !isalnum((unsigned char)b[n - 1]))
        return -1;
    if (strstr(b, "..") || strstr(b, ".-") || strstr(b, "-."))
        return -1;
    int dots = 0, digits_only = 1;
    for (size_t i = 0; i < n; i++) {
        if (b[i] == '.')
            dots++;
        else if (!isdigit((unsigned char)b[i]))
            digits_only = 0;
    }
    if (dots == 3 && digits_only)
        return -1; /* looks like an IPv4 address */
    return 0;
}

int dcp__s3_parse_url(const char *url, char **bucket, char **prefix,
                      struct dcp_err *err)
{
    *bucket = NULL;
    *prefix = NULL;
    if (!url || strncmp(url, "s3://", 5) != 0)
        return dcp__err(err, DCP_EINVAL, "'%.200s' is not an s3:// URL",
                        url ? url : "(null)");
    const char *b = url + 5;
    const char *slash = strchr(b, '/');
    size_t bl = slash ? (size_t)(slash - b) : strlen(b);
    char *bk = dcp__strndup(b, bl);
    if (!bk)
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    if (check_bucket(bk) != 0) {
        dcp__err(err, DCP_EINVAL,
                 "invalid S3 bucket name '%.80s' in '%.200s': 3..63 of "
                 "a-z 0-9 . -, starting and ending with a letter or digit",
                 bk, url);
        dcp__free(bk);
        return DCP_EINVAL;
    }
    const char *p = slash ? slash + 1 : "";
    size_t pl = strlen(p);
    while (pl > 0 && p[pl - 1] == '/')
        pl--;
    char *px = dcp__strndup(p, pl);
    if (!px) {
        dcp__free(bk);
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    }
    size_t n;
    if (pl > 0 && check_utf8(px, 1000, &n) != 0) {
        dcp__err(err, DCP_EINVAL,
                 "invalid S3 key prefix in '%.200s': at most 1000 bytes of "
                 "UTF-8 without control characters",
                 url);
        dcp__free(bk);
        dcp__free(px);
        return DCP_EINVAL;
    }
    *bucket = bk;
    *prefix = px;
    return DCP_OK;
}

/* ---------------------------------------------------------- the client */

static void share_lock(CURL *h, curl_lock_data d, curl_lock_access a, void *u)
{
    (void)h;
    (void)a;
    struct dcp__s3 *s3 = u;
    pthread_mutex_lock(&s3->locks[d]);
}

static void share_unlock(CURL *h, curl_lock_data d, void *u)
{
    (void)h;
    struct dcp__s3 *s3 = u;
    pthread_mutex_unlock(&s3->locks[d]);
}

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc = CURLE_FAILED_INIT;
static void curl_init_once(void)
{
    curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

void dcp__s3_free(struct dcp__s3 *s3)
{
    if (!s3)
        return;
    if (s3->share)
        curl_share_cleanup(s3->share);
    if (s3->share_ok)
        for (int i = 0; i < CURL_LOCK_DATA_LAST; i++)
            pthread_mutex_destroy(&s3->locks[i]);
    dcp__free(s3->bucket);
    dcp__free(s3->ak);
    if (s3->sk) {
        memset(s3->sk, 0, strlen(s3->sk));
        dcp__free(s3->sk);
    }
    dcp__free(s3->token);
    dcp__free(s3->region);
    dcp__free(s3->base);
    dcp__free(s3->host);
    dcp__free(s3->uri_base);
    dcp__free(s3);
}

static char *dup_or_null(const char *s)
{
    return s ? dcp__strdup(s) : NULL;
}

int dcp__s3_create(const struct dcp__s3_config *cfg, const char *bucket,
                   struct dcp__s3 **out, struct dcp_err *err)
{
    *out = NULL;
    struct dcp__s3_config zero = {0};
    if (!cfg)
        cfg = &zero;
    if (!bucket || check_bucket(bucket) != 0)
        return dcp__err(err, DCP_EINVAL, "invalid S3 bucket name '%.80s'",
                        bucket ? bucket : "(null)");
    pthread_once(&curl_once, curl_init_once);
    if (curl_init_rc != CURLE_OK)
        return dcp__err(err, DCP_EIO, "libcurl initialisation failed: %s",
                        curl_easy_strerror(curl_init_rc));
    const char *ak = cfg->access_key ? cfg->access_key
                                     : env_first("AWS_ACCESS_KEY_ID", NULL);
    const char *sk = cfg->secret_key ? cfg->secret_key
                                     : env_first("AWS_SECRET_ACCESS_KEY", NULL);
    const char *tok = cfg->session_token ? cfg->session_token
                                         : env_first("AWS_SESSION_TOKEN", NULL);
    const char *region = cfg->region
                             ? cfg->region
                             : env_first("AWS_REGION", "AWS_DEFAULT_REGION");
    const char *ep = cfg->endpoint
                         ? cfg->endpoint
                         : env_first("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL");
    if (!ak || !sk)
        return dcp__err(err, DCP_EINVAL,
                        "s3://%s: no credentials (set AWS_ACCESS_KEY_ID and "
                        "AWS_SECRET_ACCESS_KEY)",
                        bucket);
    if (!region)
        region = "us-east-1";
    for (const char *p = region; *p; p++)
        if (!(isalnum((unsigned char)*p) || *p == '-'))
            return dcp__err(err, DCP_EINVAL, "invalid AWS region '%.40s'",
                            region);
    if (tok && strpbrk(tok, "\r\n"))
        return dcp__err(err, DCP_EINVAL, "AWS_SESSION_TOKEN holds a newline");

    struct dcp__s3 *s3 = dcp__calloc(1, sizeof(*s3));
    if (!s3)
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    s3->c = *cfg;
    s3->c.access_key = s3->c.secret_key = s3->c.session_token = NULL;
    s3->c.region = s3->c.endpoint = NULL;
    if (s3->c.connect_timeout_ms <= 0)
        s3->c.connect_timeout_ms = 5000;
    if (s3->c.stall_timeout_ms <= 0)
        s3->c.stall_timeout_ms = 10000;
    if (s3->c.max_attempts <= 0)
        s3->c.max_attempts = 8;
    if (s3->c.retry_budget_ms <= 0)
        s3->c.retry_budget_ms = 120000;
    if (s3->c.backoff_base_ms <= 0)
        s3->c.backoff_base_ms = 100;
    if (s3->c.backoff_cap_ms <= 0)
        s3->c.backoff_cap_ms = 5000;
    if (s3->c.max_in_flight <= 0)
        s3->c.max_in_flight = 16;
    if (s3->c.max_in_flight > 256)
        s3->c.max_in_flight = 256;
    if (s3->c.part_size == 0)
        s3->c.part_size = 8u << 20;
    {
        const char *ck = env_first("AWS_REQUEST_CHECKSUM_CALCULATION", NULL);
        s3->checksums = !ck || strcasecmp(ck, "when_required") != 0;
    }
    if (s3->c.part_size < S3_MIN_PART || s3->c.part_size > ((size_t)5 << 30)) {
        dcp__s3_free(s3);
        return dcp__err(err, DCP_EINVAL,
                        "S3 part size %zu outside 5 MiB .. 5 GiB",
                        cfg->part_size);
    }

    s3->bucket = dcp__strdup(bucket);
    s3->ak = dcp__strdup(ak);
    s3->sk = dcp__strdup(sk);
    s3->token = dup_or_null(tok);
    s3->region = dcp__strdup(region);
    struct dcp_buf base = {0}, host = {0}, ub = {0};
    int rc = DCP_OK;
    int path_style;
    if (ep) {
        const char *a = NULL;
        if (strncmp(ep, "http://", 7) == 0)
            a = ep + 7;
        else if (strncmp(ep, "https://", 8) == 0)
            a = ep + 8;
        size_t al = a ? strcspn(a, "/") : 0;
        if (!a || al == 0 || (a[al] && strcmp(a + al, "/") != 0) ||
            strpbrk(ep, " \r\n@?#")) {
            dcp__s3_free(s3);
            return dcp__err(err, DCP_EINVAL,
                            "invalid S3 endpoint '%.200s': want "
                            "http[s]://host[:port]",
                            ep);
        }
        path_style = s3->c.addressing != 2;
        size_t schl = (size_t)(a - ep);
        if (path_style) {
            rc = dcp__buf_printf(&host, "%.*s", (int)al, a);
            if (!rc)
                rc = dcp__buf_printf(&base, "%.*s%.*s", (int)schl, ep, (int)al,
                                     a);
        } else {
            rc = dcp__buf_printf(&host, "%s.%.*s", bucket, (int)al, a);
            if (!rc)
                rc = dcp__buf_printf(&base, "%.*s%s.%.*s", (int)schl, ep,
                                     bucket, (int)al, a);
        }
    } else {
        path_style = s3->c.addressing == 1;
        if (path_style) {
            rc = dcp__buf_printf(&host, "s3.%s.amazonaws.com", region);
            if (!rc)
                rc = dcp__buf_printf(&base, "https://s3.%s.amazonaws.com",
                                     region);
        } else {
            rc = dcp__buf_printf(&host, "%s.s3.%s.amazonaws.com", bucket,
                                 region);
            if (!rc)
                rc = dcp__buf_printf(&base, "https://%s.s3.%s.amazonaws.com",
                                     bucket, region);
        }
    }
    if (!rc)
        rc = path_style ? dcp__buf_printf(&ub, "/%s", bucket)
                        : dcp__buf_put_u8(&ub, 0);
    if (!rc)
        rc = dcp__buf_put_u8(&base, 0);
    if (!rc)
        rc = dcp__buf_put_u8(&host, 0);
    if (!rc && path_style)
        rc = dcp__buf_put_u8(&ub, 0);
    s3->base = (char *)base.p;
    s3->host = (char *)host.p;
    s3->uri_base = (char *)ub.p;
    if (rc || !s3->bucket || !s3->ak || !s3->sk || !s3->region ||
        (tok && !s3->token) || !s3->base || !s3->host || !s3->uri_base) {
        dcp__s3_free(s3);
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    }
    for (int i = 0; i < CURL_LOCK_DATA_LAST; i++)
        pthread_mutex_init(&s3->locks[i], NULL);
    s3->share_ok = 1;
    s3->share = curl_share_init();
    if (!s3->share) {
        dcp__s3_free(s3);
        return dcp__err(err, DCP_ENOMEM, "out of memory (curl share)");
    }
    curl_share_setopt(s3->share, CURLSHOPT_LOCKFUNC, share_lock);
    curl_share_setopt(s3->share, CURLSHOPT_UNLOCKFUNC, share_unlock);
    curl_share_setopt(s3->share, CURLSHOPT_USERDATA, s3);
    curl_share_setopt(s3->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
    curl_share_setopt(s3->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
    curl_share_setopt(s3->share, CURLSHOPT_SHARE, CURL_LOCK_DATA_CONNECT);
    *out = s3;
    return DCP_OK;
}

/* ------------------------------------------------------------- requests */

enum req_kind { RQ_PLAIN, RQ_GET_RANGE, RQ_GET_ALL, RQ_PUT_DATA };

struct req {
    /* what to send */
    const char *method;
    const char *key;  /* NULL: the bucket itself */
    char *query;      /* canonical query string, owned */
    const char *hdr1; /* an extra header line, or NULL */
    const char *hdr2;
    const uint8_t *body;
    size_t body_len;
    int sign_body; /* hash the body (small XML bodies) */
    enum req_kind kind;
    int64_t off;      /* ranged get */
    uint8_t *dst;     /* ranged get: caller's buffer of body_len... */
    size_t want;      /* ...bytes wanted */
    size_t resp_max;  /* RQ_GET_ALL / RQ_PLAIN body limit */
    int no_range;     /* RQ_GET_ALL: the object is empty (416 to bytes=0-) */
    /* RQ_PUT_DATA without checksums or up to MD5_SMALL bytes: the body's
     * MD5, the expected ETag (Content-MD5); "" for a larger body with
     * checksums (the server checks the CRC) */
    char md5_hex[33];
    char md5_b64[25];
    /* A signed x-amz-checksum-* header, "name:value", or "" */
    char ck_hdr[48];
    /* per attempt */
    CURL *h;
    struct curl_slist *hl;
    size_t sent, got;
    int overflow;
    struct dcp_buf resp;
    char etag[S3_ETAG_MAX];
    char ck_resp[16]; /* x-amz-checksum-crc32 of the answer, if any */
    char sse[32];     /* x-amz-server-side-encryption of the answer */
    int ssec;         /* the answer names an SSE-C algorithm */
    char crange[96];
    int64_t clen;
    char cerr[CURL_ERROR_SIZE];
    /* outcome */
    int attempts;
    uint64_t t0, not_before;
    int active, done;
    long status;
    char out_etag[S3_ETAG_MAX];
};

static size_t on_read(char *p, size_t sz, size_t nm, void *u)
{
    struct req *r = u;
    size_t n = sz * nm, left = r->body_len - r->sent;
    if (n > left)
        n = left;
    if (n == 0)
        return 0;
    memcpy(p, r->body + r->sent, n);
    r->sent += n;
    return n;
}

static int on_seek(void *u, curl_off_t off, int origin)
{
    struct req *r = u;
    if (origin != SEEK_SET || off < 0 || (uint64_t)off > r->body_len)
        return CURL_SEEKFUNC_FAIL;
    r->sent = (size_t)off;
    return CURL_SEEKFUNC_OK;
}

static size_t on_write(char *p, size_t sz, size_t nm, void *u)
{
    struct req *r = u;
    size_t n = sz * nm;
    long st = 0;
    curl_easy_getinfo(r->h, CURLINFO_RESPONSE_CODE, &st);
    if (r->kind == RQ_GET_RANGE && st / 100 == 2) {
        if (n > r->want - r->got) {
            r->overflow = 1;
            return 0;
        }
        memcpy(r->dst + r->got, p, n);
        r->got += n;
        return n;
    }
    size_t lim =
        (r->kind == RQ_GET_ALL && st / 100 == 2) ? r->resp_max : S3_RESP_MAX;
    if (n > lim - r->resp.len) {
        r->overflow = 1;
        return 0;
    }
    if (dcp__buf_put(&r->resp, p, n) != DCP_OK)
        return 0;
    r->got += n;
    return n;
}

static void hdr_value(const char *p, size_t n, const char *name, char *out,
                      size_t cap)
{
    size_t nl = strlen(name);
    if (n <= nl || strncasecmp(p, name, nl) != 0 || p[nl] != ':')
        return;
    p += nl + 1;
    n -= nl + 1;
    while (n && (*p == ' ' || *p == '\t'))
        p++, n--;
    while (n && (p[n - 1] == '\r' || p[n - 1] == '\n' || p[n - 1] == ' '))
        n--;
    if (n >= cap)
        n = cap - 1; /* too long: kept truncated, fails the comparison */
    memcpy(out, p, n);
    out[n] = 0;
}

static size_t on_header(char *p, size_t sz, size_t nm, void *u)
{
    struct req *r = u;
    size_t n = sz * nm;
    if (n >= 5 && strncmp(p, "HTTP/", 5) == 0) { /* a new response */
        r->etag[0] = r->crange[0] = r->ck_resp[0] = r->sse[0] = 0;
        r->ssec = 0;
        r->clen = -1;
        return n;
    }
    char cl[32] = "", alg[32] = "";
    hdr_value(p, n, "ETag", r->etag, sizeof(r->etag));
    hdr_value(p, n, "x-amz-checksum-crc32", r->ck_resp, sizeof(r->ck_resp));
    hdr_value(p, n, "x-amz-server-side-encryption", r->sse, sizeof(r->sse));
    hdr_value(p, n, "x-amz-server-side-encryption-customer-algorithm", alg,
              sizeof(alg));
    if (alg[0])
        r->ssec = 1;
    hdr_value(p, n, "Content-Range", r->crange, sizeof(r->crange));
    hdr_value(p, n, "Content-Length", cl, sizeof(cl));
    if (cl[0]) {
        char *e;
        errno = 0;
        long long v = strtoll(cl, &e, 10);
        r->clen = (*e || errno || v < 0) ? -2 : (int64_t)v;
    }
    return n;
}

static int add_hdr(struct curl_slist **l, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int add_hdr(struct curl_slist **l, const char *fmt, ...)
{
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof(line))
        return DCP_ELIMIT;
    struct curl_slist *t = curl_slist_append(*l, line);
    if (!t)
        return DCP_ENOMEM;
    *l = t;
    return DCP_OK;
}

/* Builds the URL and signed headers and arms r->h for one attempt. */
static int prepare(struct dcp__s3 *s3, struct req *r)
{
    struct dcp_buf uri = {0}, url = {0}, creq = {0}, sts = {0};
    int rc = DCP_OK;
    char amzdate[17], day[9], phash[65], chash[65];
    uint8_t k1[32], k2[32], k3[32], k4[32], sig[32];
    char sighex[65], signed_hdrs[128];
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(amzdate, sizeof(amzdate), "%Y%m%dT%H%M%SZ", &tm);
    strftime(day, sizeof(day), "%Y%m%d", &tm);

    rc = dcp__buf_printf(&uri, "%s/", s3->uri_base);
    if (!rc && r->key)
        rc = uri_encode(&uri, r->key, 1);
    if (!rc && !r->key && uri.len > 1 && s3->uri_base[0])
        uri.len--; /* "/bucket", not "/bucket/" */
    if (!rc)
        rc = dcp__buf_put_u8(&uri, 0);
    if (!rc)
        rc = dcp__buf_printf(&url, "%s%s%s%s", s3->base, (char *)uri.p,
                             r->query[0] ? "?" : "", r->query);
    if (rc)
        goto out;
    if (r->sign_body) {
        if (sha256_hex(r->body ? (const void *)r->body : "", r->body_len,
                       phash) != 0) {
            rc = DCP_EIO;
            goto out;
        }
    } else {
        strcpy(phash, S3_UNSIGNED);
    }
    /* The signed headers, sorted: host, the checksum header if any
     * (x-amz-checksum-* sorts before x-amz-content-sha256), ... */
    {
        const char *colon = strchr(r->ck_hdr, ':');
        (void)snprintf(signed_hdrs, sizeof(signed_hdrs),
                       "host;%.*s%sx-amz-content-sha256;x-amz-date%s",
                       colon ? (int)(colon - r->ck_hdr) : 0, r->ck_hdr,
                       colon ? ";" : "",
                       s3->token ? ";x-amz-security-token" : "");
    }
    rc = dcp__buf_printf(&creq, "%s\n%s\n%s\nhost:%s\n%s%s", r->method,
                         (char *)uri.p, r->query, s3->host, r->ck_hdr,
                         r->ck_hdr[0] ? "\n" : "");
    if (!rc)
        rc = dcp__buf_printf(&creq,
                             "x-amz-content-sha256:%s\nx-amz-date:%s\n", phash,
                             amzdate);
    if (!rc && s3->token)
        rc = dcp__buf_printf(&creq, "x-amz-security-token:%s\n", s3->token);
    if (!rc)
        rc = dcp__buf_printf(&creq, "\n%s\n%s", signed_hdrs, phash);
    if (rc || sha256_hex(creq.p, creq.len, chash) != 0) {
        rc = rc ? rc : DCP_EIO;
        goto out;
    }
    rc =
        dcp__buf_printf(&sts, "AWS4-HMAC-SHA256\n%s\n%s/%s/s3/aws4_request\n%s",
                        amzdate, day, s3->region, chash);
    if (!rc)
        rc = dcp__buf_put_u8(&sts, 0);
    if (rc)
        goto out;
    {
        struct dcp_buf kk = {0};
        rc = dcp__buf_printf(&kk, "AWS4%s", s3->sk);
        if (!rc &&
            (hmac256(kk.p, kk.len, day, k1) ||
             hmac256(k1, 32, s3->region, k2) || hmac256(k2, 32, "s3", k3) ||
             hmac256(k3, 32, "aws4_request", k4) ||
             hmac256(k4, 32, (char *)sts.p, sig)))
            rc = DCP_EIO;
        if (kk.p)
            memset(kk.p, 0, kk.cap);
        dcp__buf_free(&kk);
        if (rc)
            goto out;
    }
    hexify(sig, 32, sighex);

    curl_slist_free_all(r->hl);
    r->hl = NULL;
    rc = add_hdr(&r->hl, "Host: %s", s3->host);
    if (!rc)
        rc = add_hdr(&r->hl, "x-amz-date: %s", amzdate);
    if (!rc)
        rc = add_hdr(&r->hl, "x-amz-content-sha256: %s", phash);
    if (!rc && s3->token)
        rc = add_hdr(&r->hl, "x-amz-security-token: %s", s3->token);
    if (!rc && r->ck_hdr[0]) {
        const char *colon = strchr(r->ck_hdr, ':');
        rc = add_hdr(&r->hl, "%.*s: %s", (int)(colon - r->ck_hdr), r->ck_hdr,
                     colon + 1);
    }
    if (!rc)
        rc = add_hdr(&r->hl,
                     "Authorization: AWS4-HMAC-SHA256 Credential=%s/%s/%s/s3/"
                     "aws4_request, SignedHeaders=%s, Signature=%s",
                     s3->ak, day, s3->region, signed_hdrs, sighex);
    if (!rc)
        rc = add_hdr(&r->hl, "Expect:");
    if (!rc && r->kind == RQ_PUT_DATA && r->md5_hex[0])
        rc = add_hdr(&r->hl, "Content-MD5: %s", r->md5_b64);
    if (!rc && strcmp(r->method, "POST") == 0)
        rc = add_hdr(&r->hl, "Content-Type: application/xml");
    if (!rc && r->kind == RQ_GET_RANGE)
        rc = add_hdr(&r->hl, "Range: bytes=%" PRId64 "-%" PRId64, r->off,
                     r->off + (int64_t)r->want - 1);
    /* A whole GET asks bytes=0- so that Content-Range states the total:
     * a body short but consistent with its own Content-Length is caught. */
    if (!rc && r->kind == RQ_GET_ALL && !r->no_range)
        rc = add_hdr(&r->hl, "Range: bytes=0-");
    if (!rc && r->hdr1)
        rc = add_hdr(&r->hl, "%s", r->hdr1);
    if (!rc && r->hdr2)
        rc = add_hdr(&r->hl, "%s", r->hdr2);
    if (rc)
        goto out;

    CURL *h = r->h;
    curl_easy_reset(h);
    r->sent = r->got = 0;
    r->overflow = 0;
    r->resp.len = 0;
    r->etag[0] = r->crange[0] = r->cerr[0] = 0;
    r->clen = -1;
    r->status = 0;
    curl_easy_setopt(h, CURLOPT_URL, (char *)url.p);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, r->hl);
    curl_easy_setopt(h, CURLOPT_SHARE, s3->share);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_PATH_AS_IS, 1L);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, s3->c.connect_timeout_ms);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME,
                     (s3->c.stall_timeout_ms + 999) / 1000);
    /* No attempt outlives the request's budget: a server trickling bytes
     * faster than the stall limit is still cut when the budget ends. */
    {
        uint64_t used = now_ms() - r->t0;
        long left = used >= (uint64_t)s3->c.retry_budget_ms
                        ? 1000
                        : s3->c.retry_budget_ms - (long)used;
        curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, left < 1000 ? 1000L : left);
    }
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, r->cerr);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, r);
    curl_easy_setopt(h, CURLOPT_PRIVATE, r);
    /* Large bodies move through larger buffers than curl's defaults
     * (16 KiB down, 64 KiB up): fewer callbacks and system calls. */
    if (r->kind == RQ_GET_RANGE && r->want >= S3_BIG_XFER)
        curl_easy_setopt(h, CURLOPT_BUFFERSIZE, (long)S3_XFER_BUF);
    if (strcmp(r->method, "HEAD") == 0) {
        curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    } else if (strcmp(r->method, "PUT") == 0) {
        if (r->body_len >= S3_BIG_XFER)
            curl_easy_setopt(h, CURLOPT_UPLOAD_BUFFERSIZE, (long)S3_XFER_BUF);
        curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(h, CURLOPT_READFUNCTION, on_read);
        curl_easy_setopt(h, CURLOPT_READDATA, r);
        curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, on_seek);
        curl_easy_setopt(h, CURLOPT_SEEKDATA, r);
        curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)r->body_len);
    } else if (strcmp(r->method, "POST") == 0) {
        curl_easy_setopt(h, CURLOPT_POST, 1L);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS,
                         r->body ? (const char *)r->body : "");
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE,
                         (curl_off_t)r->body_len);
    } else if (strcmp(r->method, "DELETE") == 0) {
        curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, "DELETE");
    }
    /* curl copies the URL; r->hl and r->body live until the request ends */
out:
    dcp__buf_free(&uri);
    dcp__buf_free(&url);
    dcp__buf_free(&creq);
    dcp__buf_free(&sts);
    return rc;
}

/* Decodes XML character entities of s[0..n) into out (cap bytes). */
static int xml_decode(const char *s, size_t n, char *out, size_t cap)
{
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        char c = s[i];
        if (c == '&') {
            const char *semi = memchr(s + i, ';', n - i);
            if (!semi || semi - (s + i) > 10)
                return -1;
            size_t el = (size_t)(semi - (s + i)) + 1;
            unsigned long cp;
            if (el == 5 && !strncmp(s + i, "&amp;", 5))
                cp = '&';
            else if (el == 4 && !strncmp(s + i, "&lt;", 4))
                cp = '<';
            else if (el == 4 && !strncmp(s + i, "&gt;", 4))
                cp = '>';
            else if (el == 6 && !strncmp(s + i, "&quot;", 6))
                cp = '"';
            else if (el == 6 && !strncmp(s + i, "&apos;", 6))
                cp = '\'';
            else if (el > 3 && s[i + 1] == '#') {
                char tmp[12];
                memcpy(tmp, s + i + 2, el - 3);
                tmp[el - 3] = 0;
                char *e;
                cp = (tmp[0] == 'x') ? strtoul(tmp + 1, &e, 16)
                                     : strtoul(tmp, &e, 10);
                if (*e || cp == 0 || cp > 0x10ffff)
                    return -1;
            } else {
                return -1;
            }
            uint8_t u[4];
            size_t k;
            if (cp < 0x80)
                u[0] = (uint8_t)cp, k = 1;
            else if (cp < 0x800)
                u[0] = (uint8_t)(0xc0 | (cp >> 6)),
                u[1] = (uint8_t)(0x80 | (cp & 63)), k = 2;
            else if (cp < 0x10000)
                u[0] = (uint8_t)(0xe0 | (cp >> 12)),
                u[1] = (uint8_t)(0x80 | ((cp >> 6) & 63)),
                u[2] = (uint8_t)(0x80 | (cp & 63)), k = 3;
            else
                u[0] = (uint8_t)(0xf0 | (cp >> 18)),
                u[1] = (uint8_t)(0x80 | ((cp >> 12) & 63)),
                u[2] = (uint8_t)(0x80 | ((cp >> 6) & 63)),
                u[3] = (uint8_t)(0x80 | (cp & 63)), k = 4;
            if (o + k >= cap)
                return -1;
            memcpy(out + o, u, k);
            o += k;
            i += el;
        } else {
            if (o + 1 >= cap)
                return -1;
            out[o++] = c;
            i++;
        }
    }
    out[o] = 0;
    return 0;
}

/*
 * Finds <tag>text</tag> in s[*pos..end); decodes text into out. Returns 1
 * found (and moves *pos past it), 0 not found, -1 malformed / too long.
 */
static int xml_next(const char *s, size_t end, size_t *pos, const char *tag,
                    char *out, size_t cap)
{
    char open[64], close[64];
    snprintf(open, sizeof(open), "<%s>", tag);
    snprintf(close, sizeof(close), "</%s>", tag);
    size_t ol = strlen(open), cl = strlen(close);
    for (size_t i = *pos; i + ol <= end; i++) {
        if (memcmp(s + i, open, ol) != 0)
            continue;
        size_t a = i + ol;
        for (size_t j = a; j + cl <= end; j++) {
            if (memcmp(s + j, close, cl) == 0) {
                if (out && xml_decode(s + a, j - a, out, cap) != 0)
                    return -1;
                *pos = j + cl;
                return 1;
            }
        }
        return -1;
    }
    return 0;
}

static void resp_code(struct req *r, char *code, size_t cap)
{
    size_t pos = 0;
    code[0] = 0;
    if (r->resp.len && xml_next((const char *)r->resp.p, r->resp.len, &pos,
                                "Code", code, cap) != 1)
        code[0] = 0;
    for (char *p = code; *p; p++)
        if (!isalnum((unsigned char)*p))
            *p = '?'; /* the server's text is printed: keep it tame */
}

static int hex32(const char *s)
{
    size_t i;
    for (i = 0; i < 32; i++)
        if (!isxdigit((unsigned char)s[i]))
            return 0;
    return s[32] == '\0';
}

static const char *etag_bare(const char *e, char *buf, size_t cap)
{
    size_t n = strlen(e);
    if (n >= 2 && e[0] == '"' && e[n - 1] == '"')
        e++, n -= 2;
    if (n >= cap)
        n = cap - 1;
    memcpy(buf, e, n);
    buf[n] = 0;
    return buf;
}

/*
 * Judges one finished attempt: 0 done, 1 retry, or a final DCP_E code.
 * *code_out is the DCP code to report if a retry is not possible; msg the
 * reason.
 */
static int judge(struct dcp__s3 *s3, struct req *r, CURLcode cc, int *code_out,
                 char *msg, size_t cap)
{
    char code[64];
    const char *obj = r->key ? r->key : "";
    curl_easy_getinfo(r->h, CURLINFO_RESPONSE_CODE, &r->status);
    if (cc != CURLE_OK) {
        if (r->overflow) {
            snprintf(msg, cap, "body longer than %s at offset %" PRId64,
                     r->kind == RQ_GET_RANGE ? "the range asked" : "the limit",
                     r->off + (int64_t)r->got);
            *code_out = r->kind == RQ_GET_RANGE ? DCP_ECORRUPT : DCP_ELIMIT;
            return r->kind == RQ_GET_RANGE ? 1 : *code_out;
        }
        snprintf(msg, cap, "%s (%s) at offset %" PRId64,
                 r->cerr[0] ? r->cerr : curl_easy_strerror(cc),
                 curl_easy_strerror(cc), r->off + (int64_t)r->got);
        switch ((int)cc) {
        case CURLE_OPERATION_TIMEDOUT:
            *code_out = DCP_ETIMEOUT;
            return 1;
        case CURLE_PARTIAL_FILE:
            *code_out = DCP_ECORRUPT;
            return 1;
        case CURLE_COULDNT_CONNECT:
        case CURLE_COULDNT_RESOLVE_HOST:
        case CURLE_SEND_ERROR:
        case CURLE_SEND_FAIL_REWIND:
        case CURLE_RECV_ERROR:
        case CURLE_GOT_NOTHING:
        case CURLE_SSL_CONNECT_ERROR:
        case CURLE_HTTP2:
        case CURLE_HTTP2_STREAM:
        case CURLE_WEIRD_SERVER_REPLY:
            *code_out = DCP_EIO;
            return 1;
        default:
            *code_out = DCP_EIO;
            return DCP_EIO;
        }
    }
    long st = r->status;
    if (st / 100 == 2) {
        /* A body must match its declared length (curl checks short ones) */
        if (r->clen >= 0 && strcmp(r->method, "HEAD") != 0 &&
            (uint64_t)r->clen != r->got) {
            snprintf(msg, cap,
                     "HTTP %ld: Content-Length %" PRId64 " but %zu bytes", st,
                     r->clen, r->got);
            *code_out = DCP_ECORRUPT;
            return 1;
        }
        if (r->kind == RQ_GET_RANGE) {
            char want[96];
            int64_t last = r->off + (int64_t)r->want - 1;
            snprintf(want, sizeof(want), "bytes %" PRId64 "-%" PRId64 "/",
                     r->off, last);
            if (st != 206 || r->got != r->want ||
                (uint64_t)r->clen != r->want ||
                strncmp(r->crange, want, strlen(want)) != 0) {
                snprintf(msg, cap,
                         "HTTP %ld: asked bytes %" PRId64 "-%" PRId64
                         ", got %zu bytes, Content-Length %" PRId64
                         ", Content-Range '%.60s'",
                         st, r->off, last, r->got, r->clen, r->crange);
                *code_out = DCP_ECORRUPT;
                return 1;
            }
        }
        if (r->kind == RQ_GET_ALL) {
            char want[64];
            snprintf(want, sizeof(want), "bytes 0-%zu/%zu",
                     r->got ? r->got - 1 : 0, r->got);
            int bad = st == 206 ? (r->got == 0 || strcmp(r->crange, want))
                                : (r->no_range && r->got != 0);
            if (bad) {
                snprintf(msg, cap,
                         "HTTP %ld: got %zu bytes, Content-Range '%.60s'", st,
                         r->got, r->crange);
                *code_out = DCP_ECORRUPT;
                return 1;
            }
        }
        if (r->kind == RQ_PUT_DATA) {
            char bare[S3_ETAG_MAX];
            const char *ck = strchr(r->ck_hdr, ':');
            etag_bare(r->etag, bare, sizeof(bare));
            /* The ETag goes into the completion's part list: 32 hex
             * digits (S3's, whatever the encryption), nothing else. */
            if (!hex32(bare)) {
                snprintf(msg, cap,
                         "HTTP %ld: ETag '%.40s' is not 32 hex digits", st,
                         bare);
                *code_out = DCP_ECORRUPT;
                return 1;
            }
            /* With an MD5 sent (Content-MD5: no checksums, or a small
             * body) the ETag must be it, except where S3 does not make it
             * the MD5: SSE-KMS and SSE-C. With checksums the server
             * checked the CRC (BadDigest); a CRC it states must be the
             * one sent. */
            if (r->md5_hex[0] && strncmp(r->sse, "aws:kms", 7) != 0 &&
                !r->ssec && strcmp(bare, r->md5_hex) != 0) {
                snprintf(msg, cap,
                         "HTTP %ld: ETag '%.40s' is not the MD5 %s of the "
                         "%zu bytes sent",
                         st, bare, r->md5_hex, r->body_len);
                *code_out = DCP_ECORRUPT;
                return 1;
            }
            if (ck && r->ck_resp[0] && strcmp(r->ck_resp, ck + 1) != 0) {
                snprintf(msg, cap,
                         "HTTP %ld: checksum CRC32 '%.15s' is not the CRC32 "
                         "%s of the %zu bytes sent",
                         st, r->ck_resp, ck + 1, r->body_len);
                *code_out = DCP_ECORRUPT;
                return 1;
            }
        }
        /* CompleteMultipartUpload may answer 200 with an <Error> body */
        if (r->resp.len && r->kind == RQ_PLAIN &&
            strcmp(r->method, "POST") == 0 &&
            find_mem(r->resp.p, r->resp.len, "<Error>", 7)) {
            resp_code(r, code, sizeof(code));
            snprintf(msg, cap, "HTTP %ld with error %s", st, code);
            *code_out = DCP_EIO;
            return strcmp(code, "InternalError") == 0 ||
                           strcmp(code, "SlowDown") == 0
                       ? 1
                       : DCP_EIO;
        }
        memcpy(r->out_etag, r->etag, sizeof(r->out_etag));
        return 0;
    }
    resp_code(r, code, sizeof(code));
    snprintf(msg, cap, "HTTP %ld%s%s", st, code[0] ? " " : "", code);
    if (st == 416 && r->kind == RQ_GET_ALL && !r->no_range) {
        r->no_range = 1; /* bytes=0- of an empty object: ask it whole */
        r->attempts--;
        *code_out = DCP_ECORRUPT;
        return 1;
    }
    (void)s3;
    (void)obj;
    /* 501: the store does not implement what was asked (a header such as
     * If-Match): asking again will not help. */
    if (st == 501)
        return *code_out = DCP_ENOTSUP;
    if (st >= 500 || strcmp(code, "RequestTimeout") == 0 ||
        strcmp(code, "SlowDown") == 0 || st == 409) {
        *code_out = st == 409 ? DCP_EEXIST : DCP_EIO;
        return 1;
    }
    /* A body that changed on the way (the server's own MD5, CRC32 or
     * SHA-256 check): sent again, DCP_ECORRUPT if it keeps failing. */
    if (st == 400 && (strcmp(code, "BadDigest") == 0 ||
                      strcmp(code, "XAmzContentSHA256Mismatch") == 0 ||
                      strcmp(code, "InvalidDigest") == 0)) {
        *code_out = DCP_ECORRUPT;
        return 1;
    }
    if (st == 403 || st == 401 || st == 400)
        return *code_out = DCP_EINVAL;
    if (st == 404)
        return *code_out = DCP_ENOENT;
    if (st == 412)
        return *code_out = DCP_EEXIST;
    if (st == 416)
        return *code_out = DCP_ECORRUPT;
    return *code_out = DCP_EINVAL;
}

struct rng {
    uint64_t s;
};
static uint64_t rng_next(struct rng *g)
{
    uint64_t x = g->s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return g->s = x;
}

static void req_release(struct req *r)
{
    if (r->h)
        curl_easy_cleanup(r->h);
    r->h = NULL;
    curl_slist_free_all(r->hl);
    r->hl = NULL;
    dcp__buf_free(&r->resp);
    dcp__free(r->query);
    r->query = NULL;
}

static void checked_forget(void);

static int fail_msg(struct dcp__s3 *s3, struct req *r, int code,
                    const char *why, struct dcp_err *err)
{
    if (code == DCP_ENOENT && strstr(why, "NoSuchBucket")) {
        checked_forget(); /* the next open checks again */
        return dcp__err(err, code, "s3://%s: no such bucket (%s)", s3->bucket,
                        why);
    }
    if (code == DCP_EINVAL && (strstr(why, "HTTP 403") || strstr(why, "401"))) {
        checked_forget();
        return dcp__err(err, code,
                        "s3://%s/%s: access denied, check the credentials "
                        "and the bucket's policy (%s)",
                        s3->bucket, r->key ? r->key : "", why);
    }
    /* A request of the bucket (a listing) is named by its query. */
    return dcp__err(err, code, "s3://%s/%s%s%.200s: %s %s after %d attempt%s",
                    s3->bucket, r->key ? r->key : "",
                    !r->key && r->query && r->query[0] ? "?" : "",
                    !r->key && r->query ? r->query : "", r->method, why,
                    r->attempts, r->attempts == 1 ? "" : "s");
}

/*
 * Runs n requests, at most max_in_flight at once, each retried on its own.
 * Stops at the first final failure (the others are abandoned) and returns it.
 */
static int run_reqs(struct dcp__s3 *s3, struct req *rs, size_t n,
                    struct dcp_err *err)
{
    CURLM *m = curl_multi_init();
    if (!m)
        return dcp__err(err, DCP_ENOMEM, "out of memory (curl multi)");
    struct rng g = {now_ms() ^ ((uint64_t)(uintptr_t)rs << 16) ^ 0x9e3779b9u};
    size_t active = 0, done = 0;
    int rc = DCP_OK;
    uint64_t t0 = now_ms();
    for (size_t i = 0; i < n; i++) {
        rs[i].t0 = t0;
        rs[i].not_before = 0;
        rs[i].attempts = 0;
        rs[i].active = rs[i].done = 0;
        if (!rs[i].h && !(rs[i].h = curl_easy_init())) {
            curl_multi_cleanup(m);
            return dcp__err(err, DCP_ENOMEM, "out of memory (curl easy)");
        }
    }
    while (done < n && rc == DCP_OK) {
        uint64_t now = now_ms();
        long wait = 100;
        for (size_t i = 0; i < n && active < (size_t)s3->c.max_in_flight; i++) {
            struct req *r = &rs[i];
            if (r->done || r->active)
                continue;
            if (r->not_before > now) {
                if ((long)(r->not_before - now) < wait)
                    wait = (long)(r->not_before - now);
                continue;
            }
            rc = prepare(s3, r);
            if (rc != DCP_OK) {
                dcp__err(err, rc, "s3://%s/%s: cannot build the request",
                         s3->bucket, r->key ? r->key : "");
                break;
            }
            r->attempts++;
            atomic_fetch_add(strcmp(r->method, "GET") == 0 ? &n_get : &n_other,
                             1);
            if (curl_multi_add_handle(m, r->h) != CURLM_OK) {
                rc = dcp__err(err, DCP_ENOMEM, "curl_multi_add_handle");
                break;
            }
            r->active = 1;
            active++;
            wait = 0;
        }
        if (rc != DCP_OK)
            break;
        int running = 0;
        if (curl_multi_perform(m, &running) != CURLM_OK) {
            rc = dcp__err(err, DCP_EIO, "curl_multi_perform failed");
            break;
        }
        CURLMsg *msg;
        int q;
        while ((msg = curl_multi_info_read(m, &q)) != NULL) {
            if (msg->msg != CURLMSG_DONE)
                continue;
            struct req *r = NULL;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&r);
            CURLcode cc = msg->data.result;
            curl_multi_remove_handle(m, msg->easy_handle);
            r->active = 0;
            active--;
            char why[600];
            int code = DCP_EIO;
            int v = judge(s3, r, cc, &code, why, sizeof(why));
            if (v == 0) {
                r->done = 1;
                done++;
                continue;
            }
            if (v == 1 && r->attempts < s3->c.max_attempts) {
                uint64_t cap = (uint64_t)s3->c.backoff_cap_ms;
                uint64_t exp = (uint64_t)s3->c.backoff_base_ms
                               << (r->attempts < 20 ? r->attempts : 20);
                uint64_t lim = exp < cap ? exp : cap;
                uint64_t d = rng_next(&g) % (lim + 1);
                uint64_t t = now_ms();
                if (t + d - r->t0 <= (uint64_t)s3->c.retry_budget_ms) {
                    r->not_before = t + d;
                    continue;
                }
                code = DCP_ETIMEOUT;
                size_t wl = strlen(why);
                snprintf(why + wl, sizeof(why) - wl,
                         "; retry budget of %ld ms spent",
                         s3->c.retry_budget_ms);
            }
            rc = fail_msg(s3, r, code, why, err);
            break;
        }
        if (rc != DCP_OK || done == n)
            break;
        int nfd = 0;
        if (curl_multi_poll(m, NULL, 0,
                            (int)(active ? (wait > 50 ? 50 : wait) : wait),
                            &nfd) != CURLM_OK) {
            rc = dcp__err(err, DCP_EIO, "curl_multi_poll failed");
            break;
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (rs[i].active) {
            curl_multi_remove_handle(m, rs[i].h);
            rs[i].active = 0;
        }
    }
    curl_multi_cleanup(m);
    return rc;
}

/* The end of a batch: runs the n requests rs when rc (their setup) is
 * DCP_OK, then releases them and frees rs. Returns the first failure. */
static int run_batch(struct dcp__s3 *s3, struct req *rs, size_t n, int rc,
                     struct dcp_err *err)
{
    if (rc == DCP_OK)
        rc = run_reqs(s3, rs, n, err);
    for (size_t i = 0; i < n; i++)
        req_release(&rs[i]);
    dcp__free(rs);
    return rc;
}

static int set_query(struct req *r, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static int set_query(struct req *r, const char *fmt, ...)
{
    struct dcp_buf b = {0};
    va_list ap;
    va_start(ap, fmt);
    char tmp[4096];
    int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof(tmp))
        return DCP_ELIMIT;
    if (dcp__buf_put(&b, tmp, (size_t)n) || dcp__buf_put_u8(&b, 0)) {
        dcp__buf_free(&b);
        return DCP_ENOMEM;
    }
    dcp__free(r->query);
    r->query = (char *)b.p;
    return DCP_OK;
}

static char *enc_dup(const char *s)
{
    struct dcp_buf b = {0};
    if (uri_encode(&b, s, 0) || dcp__buf_put_u8(&b, 0)) {
        dcp__buf_free(&b);
        return NULL;
    }
    return (char *)b.p;
}

static int one(struct dcp__s3 *s3, struct req *r, struct dcp_err *err)
{
    if (!r->query && set_query(r, "%s", "") != DCP_OK) {
        req_release(r);
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    }
    int rc = run_reqs(s3, r, 1, err);
    return rc;
}

/* ----------------------------------------------------------- operations */

static int stop_first(const char *key, int64_t size, void *ud)
{
    (void)key;
    (void)size;
    (void)ud;
    return 1;
}

/* Prefixes this process found listable lately (dcp__s3_check_bucket), by
 * the SHA-256 of everything the answer depends on. */
#define CHECKED_N      32
#define CHECKED_TTL_MS 60000u
static pthread_mutex_t checked_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    unsigned char id[32];
    uint64_t at; /* now_ms() of the check; 0: unused */
} checked[CHECKED_N];

static int check_id(const struct dcp__s3 *s3, const char *prefix,
                    unsigned char id[32])
{
    const char *parts[] = {s3->base, s3->host,  s3->bucket, s3->ak,
                           s3->sk,   s3->token, s3->region, prefix};
    struct dcp_buf b = {0};
    unsigned ml = 0;
    int rc = DCP_OK;
    for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]) && !rc; i++) {
        const char *v = parts[i] ? parts[i] : "";
        rc = dcp__buf_put(&b, v, strlen(v) + 1);
    }
    if (!rc && (!EVP_Digest(b.p, b.len, id, &ml, EVP_sha256(), NULL) ||
                ml != 32))
        rc = DCP_EIO;
    dcp__buf_free(&b);
    return rc;
}

int dcp__s3_check_bucket(struct dcp__s3 *s3, const char *prefix,
                         struct dcp_err *err)
{
    unsigned char id[32];
    int have = check_id(s3, prefix, id) == DCP_OK, rc;
    uint64_t t = now_ms();
    if (have) {
        int hit = 0;
        (void)pthread_mutex_lock(&checked_mu);
        for (int i = 0; i < CHECKED_N && !hit; i++)
            hit = checked[i].at && t - checked[i].at < CHECKED_TTL_MS &&
                  memcmp(checked[i].id, id, 32) == 0;
        (void)pthread_mutex_unlock(&checked_mu);
        if (hit)
            return DCP_OK;
    }
    /* One listing of at most one key: a missing bucket and refused
     * credentials fail here, by name. */
    rc = dcp__s3_list(s3, prefix, 1, stop_first, NULL, err);
    if (rc == 1)
        rc = DCP_OK;
    if (rc == DCP_OK && have) {
        int slot = -1;
        (void)pthread_mutex_lock(&checked_mu);
        for (int i = 0; i < CHECKED_N && slot < 0; i++) /* its expired one */
            if (checked[i].at && memcmp(checked[i].id, id, 32) == 0)
                slot = i;
        if (slot < 0) {
            slot = 0;
            for (int i = 1; i < CHECKED_N; i++) /* else the oldest goes */
                if (checked[i].at < checked[slot].at)
                    slot = i;
        }
        memcpy(checked[slot].id, id, 32);
        checked[slot].at = t ? t : 1;
        (void)pthread_mutex_unlock(&checked_mu);
    }
    return rc;
}

/* A missing bucket or refused credentials anywhere: every check is done
 * again at the next open (a bucket deleted and made again, a policy
 * changed, must not wait out the minute). */
static void checked_forget(void)
{
    (void)pthread_mutex_lock(&checked_mu);
    memset(checked, 0, sizeof(checked));
    (void)pthread_mutex_unlock(&checked_mu);
}

int dcp__s3_head(struct dcp__s3 *s3, const char *key, struct dcp__s3_stat *st,
                 struct dcp_err *err)
{
    DCP_RETURN_IF(dcp__s3_check_key(key, err));
    struct req r = {.method = "HEAD", .key = key, .kind = RQ_PLAIN};
    int rc = one(s3, &r, err);
    if (rc == DCP_OK) {
        if (r.clen < 0)
            rc = dcp__err(err, DCP_ECORRUPT,
                          "s3://%s/%s: HEAD answered without a valid "
                          "Content-Length",
                          s3->bucket, key);
        st->size = r.clen;
        etag_bare(r.etag, st->etag, sizeof(st->etag));
    }
    req_release(&r);
    return rc;
}

int dcp__s3_get_range(struct dcp__s3 *s3, const char *key, int64_t off,
                      void *buf, size_t len, struct dcp_err *err)
{
    DCP_RETURN_IF(dcp__s3_check_key(key, err));
    int64_t end;
    if (off < 0 || len > INT64_MAX ||
        dcp__add_overflow_i64(off, (int64_t)len, &end))
        return dcp__err(err, DCP_EINVAL,
                        "s3://%s/%s: bad range offset %" PRId64 " length %zu",
                        s3->bucket, key, off, len);
    if (len == 0)
        return DCP_OK;
    /* Large ranges go as several requests in flight. */
    size_t piece = s3->c.part_size;
    size_t n = (len + piece - 1) / piece;
    struct req *rs = dcp__calloc(n, sizeof(*rs));
    if (!rs)
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    int rc = DCP_OK;
    for (size_t i = 0; i < n && rc == DCP_OK; i++) {
        size_t o = i * piece;
        rs[i].method = "GET";
        rs[i].key = key;
        rs[i].kind = RQ_GET_RANGE;
        rs[i].off = off + (int64_t)o;
        rs[i].dst = (uint8_t *)buf + o;
        rs[i].want = len - o < piece ? len - o : piece;
        if (set_query(&rs[i], "%s", ""))
            rc = dcp__err(err, DCP_ENOMEM, "out of memory");
    }
    return run_batch(s3, rs, n, rc, err);
}

int dcp__s3_get_ranges(struct dcp__s3 *s3, const char *key, size_t n,
                       const int64_t *offs, const size_t *lens, void **bufs,
                       struct dcp_err *err)
{
    DCP_RETURN_IF(dcp__s3_check_key(key, err));
    if (n == 0)
        return DCP_OK;
    struct req *rs = dcp__calloc(n, sizeof(*rs));
    if (!rs)
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    int rc = DCP_OK;
    for (size_t i = 0; i < n && rc == DCP_OK; i++) {
        int64_t end;
        if (offs[i] < 0 || lens[i] == 0 || lens[i] > s3->c.part_size ||
            dcp__add_overflow_i64(offs[i], (int64_t)lens[i], &end)) {
            rc = dcp__err(err, DCP_EINVAL,
                          "s3://%s/%s: bad range offset %" PRId64 " length %zu",
                          s3->bucket, key, offs[i], lens[i]);
            break;
        }
        rs[i].method = "GET";
        rs[i].key = key;
        rs[i].kind = RQ_GET_RANGE;
        rs[i].off = offs[i];
        rs[i].dst = bufs[i];
        rs[i].want = lens[i];
        if (set_query(&rs[i], "%s", ""))
            rc = dcp__err(err, DCP_ENOMEM, "out of memory");
    }
    return run_batch(s3, rs, n, rc, err);
}

/* An ETag fit to send back in If-Match: 1..DCP__S3_ETAG-2 visible ASCII
 * characters (a hostile answer cannot inject a header line; a longer one
 * was cut by on_header). */
static int etag_sendable(const char *e)
{
    size_t n = strlen(e);
    if (n == 0 || n >= DCP__S3_ETAG - 1 || strncmp(e, "W/", 2) == 0)
        return 0; /* none, cut, or weak (never S3's: no strong match) */
    for (; *e; e++)
        if (*e < 0x21 || *e > 0x7e)
            return 0;
    return 1;
}

int dcp__s3_get_etag(struct dcp__s3 *s3, const char *key, size_t max,
                     void **buf, size_t *len, char etag[DCP__S3_ETAG],
                     struct dcp_err *err)
{
    *buf = NULL;
    *len = 0;
    if (etag)
        etag[0] = '\0';
    DCP_RETURN_IF(dcp__s3_check_key(key, err));
    struct req r = {.method = "GET", .key = key, .kind = RQ_GET_ALL};
    r.resp_max = max;
    int rc = one(s3, &r, err);
    if (rc == DCP_OK && etag && etag_sendable(r.out_etag))
        memcpy(etag, r.out_etag, strlen(r.out_etag) + 1);
    if (rc == DCP_OK) {
        if (r.resp.len == 0) {
            dcp__buf_free(&r.resp);
            *buf = dcp__malloc(1);
            if (!*buf)
                rc = dcp__err(err, DCP_ENOMEM, "out of memory");
        } else {
            *buf = r.resp.p;
            *len = r.resp.len;
            r.resp.p = NULL;
            r.resp.len = r.resp.cap = 0;
        }
    }
    req_release(&r);
    return rc;
}

int dcp__s3_get(struct dcp__s3 *s3, const char *key, size_t max, void **buf,
                size_t *len, struct dcp_err *err)
{
    return dcp__s3_get_etag(s3, key, max, buf, len, NULL, err);
}

/* The CRC-32 of d (S3's CRC32 checksum) in base64: 8 characters. */
static void crc_b64(const void *d, size_t n, char out[9])
{
    uint32_t c = n ? dcp__crc32(0, d, n) : 0;
    unsigned char be[4] = {(unsigned char)(c >> 24), (unsigned char)(c >> 16),
                           (unsigned char)(c >> 8), (unsigned char)c};
    EVP_EncodeBlock((unsigned char *)out, be, 4);
}

static int put_prep(struct dcp__s3 *s3, struct req *r, const char *key,
                    const void *buf, size_t len)
{
    r->method = "PUT";
    r->key = key;
    r->kind = RQ_PUT_DATA;
    r->body = buf;
    r->body_len = len;
    r->ck_hdr[0] = '\0';
    r->md5_hex[0] = '\0';
    if (s3->checksums) {
        char b64[9];
        crc_b64(buf, len, b64);
        (void)snprintf(r->ck_hdr, sizeof(r->ck_hdr), "x-amz-checksum-crc32:%s",
                       b64);
        if (len > MD5_SMALL)
            return DCP_OK; /* the CRC is the check: no MD5 to compute */
    }
    return md5_both(len ? buf : "", len, r->md5_hex, r->md5_b64) == 0 ? DCP_OK
                                                                      : DCP_EIO;
}

/* A sent part's tag for complete: "<ETag>[:<crc32 base64>]", the ETag
 * the server answered (32 hex digits: judge checked it). */
static void part_tag(const struct req *r, char tag[DCP__S3_TAG])
{
    char bare[S3_ETAG_MAX];
    const char *ck = strchr(r->ck_hdr, ':');
    etag_bare(r->out_etag, bare, sizeof(bare));
    (void)snprintf(tag, DCP__S3_TAG, "%.32s%s%s", bare, ck ? ":" : "",
                   ck ? ck + 1 : "");
}

int dcp__s3_put(struct dcp__s3 *s3, const char *key, const void *buf,
                size_t len, unsigned flags, struct dcp_err *err)
{
    return dcp__s3_put_if(s3, key, buf, len, flags, NULL, err);
}

/* Endpoints (by base URL) whose If-Match wants the ETag unquoted: radosgw
 * 16 compares it with its stored ETag as is, refusing the quoted form RFC
 * 9110 gives and AWS and moto take. Learned at the first conditional PUT
 * one form refused and the other took. */
#define BARE_N 8
static pthread_mutex_t bare_mu = PTHREAD_MUTEX_INITIALIZER;
static char bare_base[BARE_N][256];

static int bare_first(const struct dcp__s3 *s3)
{
    int hit = 0;
    (void)pthread_mutex_lock(&bare_mu);
    for (int i = 0; i < BARE_N && !hit; i++)
        hit = strcmp(bare_base[i], s3->base) == 0;
    (void)pthread_mutex_unlock(&bare_mu);
    return hit;
}

static void bare_learn(const struct dcp__s3 *s3, int bare)
{
    static unsigned next;
    if (strlen(s3->base) >= sizeof(bare_base[0]))
        return;
    (void)pthread_mutex_lock(&bare_mu);
    int i = 0;
    while (i < BARE_N && strcmp(bare_base[i], s3->base) != 0)
        i++;
    if (bare && i == BARE_N)
        memcpy(bare_base[next++ % BARE_N], s3->base, strlen(s3->base) + 1);
    else if (!bare && i < BARE_N)
        bare_base[i][0] = '\0';
    (void)pthread_mutex_unlock(&bare_mu);
}

/* One PUT of buf with the conditions: flags' If-None-Match, and If-Match
 * with etag (NULL: none) quoted or bare. */
static int put_once(struct dcp__s3 *s3, const char *key, const void *buf,
                    size_t len, unsigned flags, const char *etag, int bare,
                    char code[64], struct dcp_err *err)
{
    char cond[DCP__S3_ETAG + 16];
    struct req r = {0};
    size_t el = etag ? strlen(etag) : 0;
    int quoted = el >= 2 && etag[0] == '"' && etag[el - 1] == '"';
    code[0] = '\0';
    if (put_prep(s3, &r, key, buf, len) != DCP_OK)
        return dcp__err(err, DCP_EIO, "MD5 failed");
    if (flags & DCP__S3_PUT_EXCLUSIVE)
        r.hdr1 = "If-None-Match: *";
    if (etag) {
        if (bare && quoted)
            (void)snprintf(cond, sizeof(cond), "If-Match: %.*s",
                           (int)(el - 2), etag + 1);
        else if (!bare && !quoted)
            (void)snprintf(cond, sizeof(cond), "If-Match: \"%s\"", etag);
        else
            (void)snprintf(cond, sizeof(cond), "If-Match: %s", etag);
        r.hdr2 = cond;
    }
    int rc = one(s3, &r, err);
    if (rc != DCP_OK)
        resp_code(&r, code, 64);
    req_release(&r);
    return rc;
}

int dcp__s3_put_if(struct dcp__s3 *s3, const char *key, const void *buf,
                   size_t len, unsigned flags, const char *if_match,
                   struct dcp_err *err)
{
    char code[64];
    DCP_RETURN_IF(dcp__s3_check_key(key, err));
    if (len > ((size_t)5 << 30))
        return dcp__err(err, DCP_ELIMIT,
                        "s3://%s/%s: %zu bytes is over S3's 5 GiB for one "
                        "PUT (use multipart)",
                        s3->bucket, key, len);
    if (if_match && !etag_sendable(if_match))
        return dcp__err(err, DCP_EINVAL,
                        "s3://%s/%s: unusable ETag for If-Match", s3->bucket,
                        key);
    int bare = if_match && bare_first(s3);
    int rc = put_once(s3, key, buf, len, flags, if_match, bare, code, err);
    if (rc == DCP_EEXIST && if_match) {
        /* 412: refused as it was, or only its form? The other form once;
         * its answer counts only if it took the PUT. */
        struct dcp_err e2 = {0};
        char code2[64];
        if (put_once(s3, key, buf, len, flags, if_match, !bare, code2, &e2) ==
            DCP_OK) {
            bare_learn(s3, !bare);
            rc = DCP_OK;
        }
    }
    if (if_match && (rc == DCP_EEXIST ||
                     (rc == DCP_ENOENT && strcmp(code, "NoSuchBucket") != 0)))
        /* If-Match refused (412), or the key gone (404 NoSuchKey): not
         * the version the caller saw. */
        rc = dcp__err(err, DCP_EBUSY,
                      "s3://%s/%s is no longer the version %s: another "
                      "writer replaced or removed it",
                      s3->bucket, key, if_match);
    return rc;
}

int dcp__s3_delete(struct dcp__s3 *s3, const char *key, struct dcp_err *err)
{
    return dcp__s3_delete_many(s3, &key, 1, err);
}

int dcp__s3_delete_many(struct dcp__s3 *s3, const char *const *keys, size_t n,
                        struct dcp_err *err)
{
    for (size_t i = 0; i < n; i++)
        DCP_RETURN_IF(dcp__s3_check_key(keys[i], err));
    if (n == 0)
        return DCP_OK;
    struct req *rs = dcp__calloc(n, sizeof(*rs));
    if (!rs)
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    int rc = DCP_OK;
    for (size_t i = 0; i < n && rc == DCP_OK; i++) {
        rs[i].method = "DELETE";
        rs[i].key = keys[i];
        if (set_query(&rs[i], "%s", ""))
            rc = dcp__err(err, DCP_ENOMEM, "out of memory");
    }
    return run_batch(s3, rs, n, rc, err);
}

int dcp__s3_list(struct dcp__s3 *s3, const char *prefix, size_t max_keys,
                 dcp__s3_list_fn fn, void *ud, struct dcp_err *err)
{
    return dcp__s3_list_delim(s3, prefix, 0, max_keys, fn, ud, err);
}

/*
 * The answers of the listings are hostile input like any other: a body cut
 * short (before its first entry too) must not read as fewer keys, a page
 * served again must not loop. An answer x[0..xl) must be one whole
 * document of its root element ("<root" first, "</root>" last, an XML
 * declaration and whitespace around only); a listing page must also say
 * IsTruncated, "true" or "false" (list_doc: *trunc 1 or 0).
 */
static int list_doc_root(const char *x, size_t xl, const char *root)
{
    char open[48], close[48];
    size_t a = 0, b = xl, ol, cl;
    (void)snprintf(open, sizeof(open), "<%s", root);
    (void)snprintf(close, sizeof(close), "</%s>", root);
    ol = strlen(open);
    cl = strlen(close);
    /* (S3 may send spaces before a completion's answer to keep the
     * connection alive.) */
    while (a < b && isspace((unsigned char)x[a]))
        a++;
    if (b - a >= 5 && !memcmp(x + a, "<?xml", 5)) {
        const char *e = find_mem(x + a, b - a, "?>", 2);
        if (!e)
            return -1;
        a = (size_t)(e - x) + 2;
    }
    while (a < b && isspace((unsigned char)x[a]))
        a++;
    while (b > a && isspace((unsigned char)x[b - 1]))
        b--;
    if (b - a < ol + cl || memcmp(x + a, open, ol) != 0 ||
        (x[a + ol] != '>' && x[a + ol] != ' ') ||
        memcmp(x + b - cl, close, cl) != 0)
        return -1;
    return 0;
}

static int list_doc(const char *x, size_t xl, const char *root, int *trunc)
{
    char t[8];
    size_t p = 0;
    if (list_doc_root(x, xl, root) != 0)
        return -1;
    if (xml_next(x, xl, &p, "IsTruncated", t, sizeof(t)) != 1)
        return -1;
    if (strcmp(t, "true") && strcmp(t, "false"))
        return -1;
    *trunc = t[0] == 't';
    return 0;
}

/* One listing in progress (dcp__s3_list_delim, dcp__s3_list_uploads). */
struct lst {
    struct dcp__s3 *s3;
    const char *prefix; /* as asked, not encoded */
    size_t plen, max, n;
    int delim, page;
    char *key;  /* the entry being read */
    char *last; /* the previous key (Contents, Upload) */
    char *lastp; /* the previous common prefix */
    char *tok;   /* the continuation token (or key marker) sent, decoded */
};

#define LST_KEY 4200 /* a key's decoded bytes, with its NUL */

static int lst_init(struct lst *l, struct dcp__s3 *s3, const char *prefix,
                    int delim, size_t max)
{
    memset(l, 0, sizeof(*l));
    l->s3 = s3;
    l->prefix = prefix ? prefix : "";
    l->plen = strlen(l->prefix);
    l->delim = delim;
    l->max = max;
    l->key = dcp__malloc(4 * LST_KEY);
    if (!l->key)
        return DCP_ENOMEM;
    l->last = l->key + LST_KEY;
    l->lastp = l->last + LST_KEY;
    l->tok = l->lastp + LST_KEY;
    l->last[0] = l->lastp[0] = l->tok[0] = '\0';
    return DCP_OK;
}

/*
 * Whether l->key may be the next entry of its kind (pfx: a common prefix):
 * under the prefix asked for; delimited, a key with no '/' after it, a
 * common prefix ending at its first '/'; after the previous entry (S3
 * lists in UTF-8 binary order, which strcmp is: an entry again or out of
 * order is a page served twice). Uploads (ordered 0) are not checked for
 * order: S3 sorts them, moto does not; their markers must change instead.
 */
static int lst_entry_ok(struct lst *l, int pfx, int ordered)
{
    size_t kl = strlen(l->key);
    char *last = pfx ? l->lastp : l->last;
    const char *slash;
    int c;
    if (kl < l->plen || memcmp(l->key, l->prefix, l->plen) != 0)
        return 0;
    slash = memchr(l->key + l->plen, '/', kl - l->plen);
    if (l->delim && (pfx ? slash != l->key + kl - 1 : slash != NULL))
        return 0;
    c = last[0] ? strcmp(l->key, last) : 1;
    if (ordered && c <= 0)
        return 0;
    memcpy(last, l->key, kl + 1);
    return 1;
}

static int lst_bad(struct lst *l, struct dcp_err *err, const char *what)
{
    return dcp__err(err, DCP_EFORMAT,
                    "s3://%s/%s: listing page %d refused: %s", l->s3->bucket,
                    l->prefix, l->page + 1, what);
}

static int lst_count(struct lst *l, struct dcp_err *err)
{
    if (++l->n > l->max)
        return dcp__err(err, DCP_ELIMIT,
                        "s3://%s/%s: more than %zu keys under the prefix",
                        l->s3->bucket, l->prefix, l->max);
    return DCP_OK;
}

/* The <CommonPrefixes><Prefix>p</Prefix></CommonPrefixes> of a delimited
 * listing page x[0..xl), each through fn(p, -1, ud); *got counts the
 * page's entries. */
static int list_prefixes(struct lst *l, const char *x, size_t xl, size_t *got,
                         dcp__s3_list_fn fn, void *ud, struct dcp_err *err)
{
    size_t pos = 0;
    for (;;) {
        const char *c = find_mem(x + pos, xl - pos, "<CommonPrefixes>", 16);
        const char *e;
        size_t cpos, p2;
        int u;
        if (!c)
            return DCP_OK;
        cpos = (size_t)(c - x);
        e = find_mem(c, xl - cpos, "</CommonPrefixes>", 17);
        p2 = cpos;
        if (!e ||
            xml_next(x, (size_t)(e - x), &p2, "Prefix", l->key, LST_KEY) != 1)
            return lst_bad(l, err, "malformed common prefix");
        if (!lst_entry_ok(l, 1, 1))
            return lst_bad(l, err, "common prefix outside the prefix, "
                                   "repeated or out of order");
        DCP_RETURN_IF(lst_count(l, err));
        ++*got;
        if ((u = fn(l->key, -1, ud)) != 0)
            return u;
        pos = (size_t)(e - x) + 17;
    }
}

/* The <Contents> entries of a listing page x[0..xl), each through
 * fn(key, size, ud); *got counts them. */
static int list_contents(struct lst *l, const char *x, size_t xl, size_t *got,
                         dcp__s3_list_fn fn, void *ud, struct dcp_err *err)
{
    size_t pos = 0;
    for (;;) {
        const char *c = find_mem(x + pos, xl - pos, "<Contents>", 10), *e;
        size_t cpos, cend, p2;
        char sz[32], *ep;
        long long size = -1;
        int u;
        if (!c)
            return DCP_OK;
        cpos = (size_t)(c - x);
        e = find_mem(c, xl - cpos, "</Contents>", 11);
        if (!e)
            return lst_bad(l, err, "malformed entry");
        cend = (size_t)(e - x);
        p2 = cpos;
        if (xml_next(x, cend, &p2, "Key", l->key, LST_KEY) != 1)
            return lst_bad(l, err, "entry without a valid Key");
        p2 = cpos;
        if (xml_next(x, cend, &p2, "Size", sz, sizeof(sz)) == 1) {
            errno = 0;
            size = strtoll(sz, &ep, 10);
            if (*ep || errno || !sz[0] || size < 0)
                size = -1;
        }
        if (size < 0)
            return dcp__err(err, DCP_EFORMAT,
                            "s3://%s/%s: listing entry with a bad Size",
                            l->s3->bucket, l->key);
        if (!lst_entry_ok(l, 0, 1))
            return lst_bad(l, err, "key outside the prefix, repeated or out "
                                   "of order");
        DCP_RETURN_IF(lst_count(l, err));
        ++*got;
        if ((u = fn(l->key, (int64_t)size, ud)) != 0)
            return u;
        pos = cend + 11;
    }
}

/*
 * The continuation of a page that said IsTruncated true: a token (tag)
 * that is there, is not the one just sent, after a page that had entries,
 * within a million pages -- else the listing could go round for ever.
 * The token goes into l->tok and, encoded, *enc.
 */
static int lst_next(struct lst *l, const char *x, size_t xl, const char *tag,
                    size_t got, char **enc, struct dcp_err *err)
{
    char next[2048];
    size_t p = 0;
    if (xml_next(x, xl, &p, tag, next, sizeof(next)) != 1 || !next[0])
        return lst_bad(l, err, "truncated without a valid continuation");
    if (!strcmp(next, l->tok))
        return lst_bad(l, err, "the continuation sent came back");
    if (got == 0 || l->page >= 1000000)
        return lst_bad(l, err, "truncated without entries");
    memcpy(l->tok, next, strlen(next) + 1);
    if (!(*enc = enc_dup(next)))
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    return DCP_OK;
}

int dcp__s3_list_delim(struct dcp__s3 *s3, const char *prefix, int delim,
                       size_t max_keys, dcp__s3_list_fn fn, void *ud,
                       struct dcp_err *err)
{
    struct lst l;
    char *token = NULL, *pfx = enc_dup(prefix ? prefix : "");
    int rc = pfx ? lst_init(&l, s3, prefix, delim, max_keys) : DCP_ENOMEM;
    if (rc != DCP_OK) {
        dcp__free(pfx);
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    }
    for (; rc == DCP_OK; l.page++) {
        struct req r = {.method = "GET", .kind = RQ_PLAIN};
        /* Query parameters in byte order (SigV4's canonical query). */
        const char *dl = delim ? "delimiter=%2F&" : "";
        /* No more keys than could still be taken, and one beyond (the
         * DCP_ELIMIT check): a bucket check lists 2, not 1000. */
        size_t rem = max_keys - l.n, pg = rem >= 999 ? 1000 : rem + 1, got = 0;
        int trunc = 0;
        if (token)
            rc = set_query(&r,
                           "continuation-token=%s&%slist-type=2&max-keys=%zu"
                           "&prefix=%s",
                           token, dl, pg, pfx);
        else
            rc = set_query(&r, "%slist-type=2&max-keys=%zu&prefix=%s", dl, pg,
                           pfx);
        dcp__free(token);
        token = NULL;
        if (rc)
            rc = dcp__err(err, rc, "s3://%s/%s: list query too long",
                          s3->bucket, l.prefix);
        if (rc == DCP_OK)
            rc = one(s3, &r, err);
        if (rc == DCP_OK &&
            list_doc((const char *)r.resp.p, r.resp.len, "ListBucketResult",
                     &trunc) != 0)
            rc = lst_bad(&l, err, "not one whole ListBucketResult with "
                                  "IsTruncated true or false");
        if (rc == DCP_OK)
            rc = list_contents(&l, (const char *)r.resp.p, r.resp.len, &got,
                               fn, ud, err);
        if (rc == DCP_OK && delim)
            rc = list_prefixes(&l, (const char *)r.resp.p, r.resp.len, &got,
                               fn, ud, err);
        if (rc == DCP_OK && trunc)
            rc = lst_next(&l, (const char *)r.resp.p, r.resp.len,
                          "NextContinuationToken", got, &token, err);
        req_release(&r);
        if (!token)
            break;
    }
    dcp__free(token);
    dcp__free(pfx);
    dcp__free(l.key);
    return rc;
}

/* The <Upload> entries of an upload listing page x[0..xl), each through
 * fn(key, upid, ud); *got counts them. */
static int upload_entries(struct lst *l, const char *x, size_t xl,
                          size_t *got, dcp__s3_upload_fn fn, void *ud,
                          struct dcp_err *err)
{
    size_t pos = 0;
    for (;;) {
        const char *c = find_mem(x + pos, xl - pos, "<Upload>", 8), *e;
        size_t cpos, cend, p2;
        char upid[DCP__S3_UPID_MAX];
        int u;
        if (!c)
            return DCP_OK;
        cpos = (size_t)(c - x);
        e = find_mem(c, xl - cpos, "</Upload>", 9);
        if (!e)
            return lst_bad(l, err, "malformed upload entry");
        cend = (size_t)(e - x);
        p2 = cpos;
        if (xml_next(x, cend, &p2, "Key", l->key, LST_KEY) != 1 ||
            (p2 = cpos, xml_next(x, cend, &p2, "UploadId", upid,
                                 sizeof(upid)) != 1) ||
            !upid[0])
            return lst_bad(l, err,
                           "upload entry without a valid Key or UploadId");
        if (!lst_entry_ok(l, 0, 0))
            return lst_bad(l, err, "upload of a key outside the prefix");
        if (++l->n > l->max)
            return dcp__err(err, DCP_ELIMIT,
                            "s3://%s/%s: more than %zu uploads under the "
                            "prefix",
                            l->s3->bucket, l->prefix, l->max);
        ++*got;
        if ((u = fn(l->key, upid, ud)) != 0)
            return u;
        pos = cend + 9;
    }
}

/* The markers of a truncated upload listing page: both there, not the
 * pair just sent (l->tok holds "key\nupid"), encoded in *km and *um. */
static int upload_next(struct lst *l, const char *x, size_t xl, size_t got,
                       char **km, char **um, struct dcp_err *err)
{
    char nk[2048], nu[DCP__S3_UPID_MAX], both[sizeof(nk) + sizeof(nu)];
    size_t p3 = 0, p4 = 0;
    if (xml_next(x, xl, &p3, "NextKeyMarker", nk, sizeof(nk)) != 1 ||
        xml_next(x, xl, &p4, "NextUploadIdMarker", nu, sizeof(nu)) != 1 ||
        !nk[0])
        return lst_bad(l, err, "truncated upload listing without valid "
                               "markers");
    (void)snprintf(both, sizeof(both), "%s\n%s", nk, nu);
    if (!strcmp(both, l->tok))
        return lst_bad(l, err, "the markers sent came back");
    if (got == 0 || l->page >= 100000)
        return lst_bad(l, err, "truncated without entries");
    if (strlen(both) >= LST_KEY)
        return lst_bad(l, err, "markers too long");
    memcpy(l->tok, both, strlen(both) + 1);
    if (!(*km = enc_dup(nk)) || !(*um = enc_dup(nu)))
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    return DCP_OK;
}

int dcp__s3_list_uploads(struct dcp__s3 *s3, const char *prefix,
                         size_t max, dcp__s3_upload_fn fn, void *ud,
                         struct dcp_err *err)
{
    struct lst l;
    char *pfx = enc_dup(prefix ? prefix : ""), *kmark = NULL, *umark = NULL;
    int rc = pfx ? lst_init(&l, s3, prefix, 0, max) : DCP_ENOMEM;
    if (rc != DCP_OK) {
        dcp__free(pfx);
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    }
    for (; rc == DCP_OK; l.page++) {
        struct req r = {.method = "GET", .kind = RQ_PLAIN};
        size_t got = 0;
        int trunc = 0;
        if (kmark)
            rc = set_query(&r,
                           "key-marker=%s&prefix=%s&upload-id-marker=%s"
                           "&uploads=",
                           kmark, pfx, umark);
        else
            rc = set_query(&r, "prefix=%s&uploads=", pfx);
        dcp__free(kmark);
        dcp__free(umark);
        kmark = umark = NULL;
        if (rc)
            rc = dcp__err(err, rc, "s3://%s: prefix too long", s3->bucket);
        if (rc == DCP_OK)
            rc = one(s3, &r, err);
        if (rc == DCP_OK &&
            list_doc((const char *)r.resp.p, r.resp.len,
                     "ListMultipartUploadsResult", &trunc) != 0)
            rc = lst_bad(&l, err, "not one whole ListMultipartUploadsResult "
                                  "with IsTruncated true or false");
        if (rc == DCP_OK)
            rc = upload_entries(&l, (const char *)r.resp.p, r.resp.len, &got,
                                fn, ud, err);
        if (rc == DCP_OK && trunc)
            rc = upload_next(&l, (const char *)r.resp.p, r.resp.len, got,
                             &kmark, &umark, err);
        req_release(&r);
        if (!kmark)
            break;
    }
    dcp__free(kmark);
    dcp__free(umark);
    dcp__free(pfx);
    dcp__free(l.key);
    return rc;
}

static int count_one(const char *key, const char *upid, void *ud)
{
    (void)key;
    (void)upid;
    ++*(size_t *)ud;
    return 0;
}

int dcp__s3_count_uploads(struct dcp__s3 *s3, const char *prefix, size_t *count,
                          struct dcp_err *err)
{
    *count = 0;
    return dcp__s3_list_uploads(s3, prefix, 1000000, count_one, count, err);
}

int dcp__s3_mpu_abort(struct dcp__s3 *s3, const char *key, const char *upid,
                      struct dcp_err *err)
{
    struct req r = {.method = "DELETE", .key = key};
    struct dcp_err e2 = {0};
    if (!err)
        err = &e2;
    char *eid = enc_dup(upid);
    int rc = eid ? set_query(&r, "uploadId=%s", eid) : DCP_ENOMEM;
    dcp__free(eid);
    if (rc == DCP_OK)
        rc = one(s3, &r, err);
    else
        rc = dcp__err(err, rc, "s3://%s/%s: cannot abort upload", s3->bucket,
                      key);
    req_release(&r);
    return rc;
}

int dcp__s3_mpu_create(struct dcp__s3 *s3, const char *key, char *upid,
                       size_t cap, struct dcp_err *err)
{
    DCP_RETURN_IF(dcp__s3_check_key(key, err));
    struct req c = {.method = "POST", .key = key, .sign_body = 1};
    int rc = set_query(&c, "uploads=");
    if (s3->checksums) /* every part then carries its CRC32 (put_prep) */
        (void)snprintf(c.ck_hdr, sizeof(c.ck_hdr),
                       "x-amz-checksum-algorithm:CRC32");
    upid[0] = '\0';
    if (rc == DCP_OK)
        rc = one(s3, &c, err);
    if (rc == DCP_OK) {
        size_t pos = 0;
        if (xml_next((const char *)c.resp.p, c.resp.len, &pos, "UploadId", upid,
                     cap) != 1 ||
            !upid[0])
            rc = dcp__err(err, DCP_EFORMAT,
                          "s3://%s/%s: CreateMultipartUpload answer without "
                          "a valid UploadId",
                          s3->bucket, key);
    }
    req_release(&c);
    return rc;
}

int dcp__s3_mpu_part(struct dcp__s3 *s3, const char *key, const char *upid,
                     unsigned partno, const void *buf, size_t len,
                     char tag[DCP__S3_TAG], struct dcp_err *err)
{
    struct req r = {0};
    if (partno < 1 || partno > S3_MAX_PARTS)
        return dcp__err(err, DCP_ELIMIT,
                        "s3://%s/%s: part %u is over S3's %d parts", s3->bucket,
                        key, partno, S3_MAX_PARTS);
    if (put_prep(s3, &r, key, buf, len) != DCP_OK)
        return dcp__err(err, DCP_EIO, "MD5 failed");
    char *eid = enc_dup(upid);
    int rc = eid ? set_query(&r, "partNumber=%u&uploadId=%s", partno, eid)
                 : DCP_ENOMEM;
    dcp__free(eid);
    if (rc != DCP_OK) {
        req_release(&r);
        return dcp__err(err, rc, "s3://%s/%s: cannot send part %u", s3->bucket,
                        key, partno);
    }
    rc = one(s3, &r, err);
    if (rc == DCP_OK)
        part_tag(&r, tag);
    req_release(&r);
    return rc;
}

int dcp__s3_mpu_complete(struct dcp__s3 *s3, const char *key, const char *upid,
                         size_t nparts, const char (*tags)[DCP__S3_TAG],
                         unsigned flags, struct dcp_err *err)
{
    struct dcp_buf xml = {0};
    int rc;
    if (flags & DCP__S3_PUT_EXCLUSIVE) {
        /* Not every store honours If-None-Match on a completion (radosgw
         * 16 replaces the object): a key that exists already is refused
         * here on any store; a race with another writer only where the
         * condition is honoured (AWS S3, moto). */
        struct dcp__s3_stat st;
        struct dcp_err e2;
        rc = dcp__s3_head(s3, key, &st, &e2);
        if (rc == DCP_OK)
            return dcp__err(err, DCP_EEXIST, "s3://%s/%s: already exists",
                            s3->bucket, key);
        if (rc != DCP_ENOENT) {
            *err = e2;
            return rc;
        }
    }
    rc = dcp__buf_printf(&xml, "<CompleteMultipartUpload>");
    for (size_t i = 0; i < nparts && rc == DCP_OK; i++) {
        const char *ck = strchr(tags[i], ':');
        rc = dcp__buf_printf(&xml,
                             "<Part><PartNumber>%zu</PartNumber><ETag>\"%.32s\""
                             "</ETag>",
                             i + 1, tags[i]);
        if (rc == DCP_OK && ck)
            rc = dcp__buf_printf(&xml, "<ChecksumCRC32>%s</ChecksumCRC32>",
                                 ck + 1);
        if (rc == DCP_OK)
            rc = dcp__buf_printf(&xml, "</Part>");
    }
    if (rc == DCP_OK)
        rc = dcp__buf_printf(&xml, "</CompleteMultipartUpload>");
    if (rc != DCP_OK) {
        dcp__buf_free(&xml);
        return dcp__err(err, DCP_ENOMEM, "out of memory");
    }
    struct req f = {.method = "POST", .key = key, .sign_body = 1};
    f.body = xml.p;
    f.body_len = xml.len;
    if (flags & DCP__S3_PUT_EXCLUSIVE)
        f.hdr1 = "If-None-Match: *";
    char *eid = enc_dup(upid);
    rc = eid ? set_query(&f, "uploadId=%s", eid) : DCP_ENOMEM;
    dcp__free(eid);
    if (rc == DCP_OK)
        rc = one(s3, &f, err);
    else
        rc = dcp__err(err, rc, "s3://%s/%s: cannot complete upload", s3->bucket,
                      key);
    /* A 200 whose body is neither an <Error> (judge) nor the whole result
     * (a body cut short, a proxy's page): the object's state is unknown,
     * which the caller must not take for a completed upload. */
    if (rc == DCP_OK &&
        list_doc_root((const char *)f.resp.p, f.resp.len,
                      "CompleteMultipartUploadResult") != 0)
        rc = dcp__err(err, DCP_EFORMAT,
                      "s3://%s/%s: CompleteMultipartUpload answered 200 "
                      "without a whole CompleteMultipartUploadResult",
                      s3->bucket, key);
    req_release(&f);
    dcp__buf_free(&xml);
    return rc;
}

int dcp__s3_put_multipart(struct dcp__s3 *s3, const char *key, const void *buf,
                          size_t len, unsigned flags, struct dcp_err *err)
{
    DCP_RETURN_IF(dcp__s3_check_key(key, err));
    size_t ps = s3->c.part_size;
    size_t np = len ? (len + ps - 1) / ps : 1;
    if (np > S3_MAX_PARTS)
        return dcp__err(err, DCP_ELIMIT,
                        "s3://%s/%s: %zu bytes need %zu parts of %zu, over "
                        "S3's %d",
                        s3->bucket, key, len, np, ps, S3_MAX_PARTS);
    char upid[1100];
    int rc = dcp__s3_mpu_create(s3, key, upid, sizeof(upid), err);
    if (rc != DCP_OK)
        return rc;
    char *eid = enc_dup(upid);
    struct req *rs = dcp__calloc(np, sizeof(*rs));
    char(*tags)[DCP__S3_TAG] = dcp__calloc(np, sizeof(*tags));
    if (!eid || !rs || !tags) {
        rc = dcp__err(err, DCP_ENOMEM, "out of memory");
        goto abort;
    }
    for (size_t i = 0; i < np && rc == DCP_OK; i++) {
        size_t o = i * ps, l = len - o < ps ? len - o : ps;
        if (put_prep(s3, &rs[i], key, (const uint8_t *)buf + o, l) != DCP_OK)
            rc = dcp__err(err, DCP_EIO, "MD5 failed");
        else if (set_query(&rs[i], "partNumber=%zu&uploadId=%s", i + 1, eid))
            rc = dcp__err(err, DCP_ENOMEM, "out of memory");
        rs[i].off = (int64_t)o;
    }
    if (rc == DCP_OK)
        rc = run_reqs(s3, rs, np, err);
    for (size_t i = 0; i < np && rc == DCP_OK; i++)
        part_tag(&rs[i], tags[i]);
    if (rc == DCP_OK)
        rc = dcp__s3_mpu_complete(s3, key, upid, np,
                                  (const char(*)[DCP__S3_TAG])tags, flags, err);
abort:
    if (rc != DCP_OK && dcp__s3_mpu_abort(s3, key, upid, NULL) != DCP_OK)
        dcp__err_prefix(err, "and aborting upload %.40s failed", upid);
    if (rs)
        for (size_t i = 0; i < np; i++)
            req_release(&rs[i]);
    dcp__free(rs);
    dcp__free(tags);
    dcp__free(eid);
    return rc;
}
