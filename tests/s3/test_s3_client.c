/*
 * The S3 client against a real server: moto's standalone server started on
 * loopback by tests/s3/s3_env.py, which also runs the fault proxy
 * (tests/s3/s3_fault_proxy.py) and passes both through the environment.
 * Every request is bounded (connect/stall timeouts, retry budget), so no
 * test can hang; ctest's TIMEOUT is the outer bound.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "s3.h"
#include "test.h"

static const char *bucket;

static struct dcp__s3 *client(int via_proxy, int attempts, const char *b)
{
    struct dcp__s3_config c = {0};
    c.endpoint = via_proxy ? getenv("DCP_S3_PROXY") : NULL;
    c.part_size = 5u << 20;
    c.max_in_flight = 4;
    c.stall_timeout_ms = 1000;
    c.connect_timeout_ms = 2000;
    c.backoff_base_ms = 10;
    c.backoff_cap_ms = 200;
    c.retry_budget_ms = 30000;
    c.max_attempts = attempts;
    struct dcp__s3 *s3 = NULL;
    struct dcp_err err = {0};
    if (dcp__s3_create(&c, b ? b : bucket, &s3, &err) != DCP_OK)
        fprintf(stderr, "create: %s\n", err.msg);
    return s3;
}

static void faults(const char *mode, int n)
{
    FILE *f = fopen(getenv("DCP_S3_FAULTS"), "w");
    if (f) {
        if (mode)
            fprintf(f, "%s %d\n", mode, n);
        fclose(f);
    }
}

static uint8_t *pattern(size_t n, unsigned seed)
{
    uint8_t *p = malloc(n ? n : 1);
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 17, x ^= x << 5;
        p[i] = (uint8_t)x;
    }
    return p;
}

/* PUT then GET (whole and ranged) then HEAD of one size. */
static int roundtrip(struct dcp__s3 *s3, const char *key, size_t n, int mpu)
{
    struct dcp_err err = {0};
    uint8_t *src = pattern(n, (unsigned)n);
    int rc = mpu ? dcp__s3_put_multipart(s3, key, src, n, 0, &err)
                 : dcp__s3_put(s3, key, src, n, 0, &err);
    if (rc) {
        fprintf(stderr, "put %s: %s\n", key, err.msg);
        free(src);
        return rc;
    }
    void *got = NULL;
    size_t gl = 0;
    rc = dcp__s3_get(s3, key, n + 1, &got, &gl, &err);
    if (rc || gl != n || (n && memcmp(got, src, n))) {
        fprintf(stderr, "get %s: rc %d len %zu/%zu %s\n", key, rc, gl, n,
                err.msg);
        rc = rc ? rc : -100;
    }
    dcp__free(got);
    struct dcp__s3_stat st;
    if (!rc && (rc = dcp__s3_head(s3, key, &st, &err)) == 0 &&
        st.size != (int64_t)n)
        rc = -101;
    /* ranged reads at odd offsets */
    size_t offs[] = {0, 1, 7, n / 3, n > 3 ? n - 3 : 0};
    for (size_t i = 0; !rc && n && i < DCP_ARRAY_LEN(offs); i++) {
        size_t o = offs[i] < n ? offs[i] : 0,
               l = n - o > 3 ? (n - o) / 2 + 1 : n - o;
        uint8_t *b = malloc(l ? l : 1);
        rc = dcp__s3_get_range(s3, key, (int64_t)o, b, l, &err);
        if (rc || memcmp(b, src + o, l)) {
            fprintf(stderr, "range %s %zu+%zu: %d %s\n", key, o, l, rc,
                    err.msg);
            rc = rc ? rc : -102;
        }
        free(b);
    }
    free(src);
    return rc;
}

TEST(sizes)
{
    struct dcp__s3 *s3 = client(0, 4, NULL);
    ASSERT(s3);
    ASSERT_EQ(roundtrip(s3, "sizes/zero", 0, 0), 0);
    ASSERT_EQ(roundtrip(s3, "sizes/one", 1, 0), 0);
    ASSERT_EQ(roundtrip(s3, "sizes/5m1", (5u << 20) + 1, 0), 0);
    ASSERT_EQ(roundtrip(s3, "sizes/mpu20m", 20u << 20, 1), 0);
    ASSERT_EQ(roundtrip(s3, "sizes/mpu-odd", (11u << 20) + 3, 1), 0);
    size_t nu = 9;
    struct dcp_err err = {0};
    ASSERT_EQ(dcp__s3_count_uploads(s3, "sizes/", &nu, &err), 0);
    ASSERT_EQ(nu, 0);
    /* a range past the end is an error, not a short read */
    uint8_t b[4];
    ASSERT(dcp__s3_get_range(s3, "sizes/one", 0, b, 4, &err) != 0);
    ASSERT(strstr(err.msg, "sizes/one"));
    dcp__s3_free(s3);
}

static const char *odd_keys[] = {
    "odd/a b c",     "odd/pl+us",
    "odd/pct%20x",   "odd/eq=1&x",
    "odd/ti~de",     "odd/\303\274nic\303\266de \342\202\254.bin",
    "odd/dots/../x", "odd/semi;colon,comma'quote\"<amp>&",
};

static int collect(const char *key, int64_t size, void *ud)
{
    (void)size;
    for (size_t i = 0; i < DCP_ARRAY_LEN(odd_keys); i++)
        if (strcmp(key, odd_keys[i]) == 0)
            (*(unsigned *)ud) |= 1u << i;
    return 0;
}

TEST(odd_keys)
{
    struct dcp__s3 *s3 = client(0, 4, NULL);
    ASSERT(s3);
    for (size_t i = 0; i < DCP_ARRAY_LEN(odd_keys); i++)
        ASSERT_EQ(roundtrip(s3, odd_keys[i], 100 + i, 0), 0);
    unsigned seen = 0;
    struct dcp_err err = {0};
    ASSERT_EQ(dcp__s3_list(s3, "odd/", 100, collect, &seen, &err), 0);
    ASSERT_EQ(seen, (1u << DCP_ARRAY_LEN(odd_keys)) - 1);
    ASSERT_EQ(dcp__s3_check_key("bad\nkey", &err), DCP_EINVAL);
    ASSERT_EQ(dcp__s3_check_key("bad\xc3", &err), DCP_EINVAL);
    dcp__s3_free(s3);
}

static int count_any(const char *key, int64_t size, void *ud)
{
    (void)key;
    (void)size;
    (*(size_t *)ud)++;
    return 0;
}

static int count_fn(const char *key, int64_t size, void *ud)
{
    (void)key;
    if (size != 3)
        return -1000;
    (*(size_t *)ud)++;
    return 0;
}

TEST(list_continuation)
{
    struct dcp__s3 *s3 = client(0, 4, NULL);
    ASSERT(s3);
    enum { N = 1100 };
    static char names[N][32];
    const char *ks[N];
    struct dcp_err err = {0};
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof(names[i]), "many/k%05d", i);
        ks[i] = names[i];
        ASSERT_EQ(dcp__s3_put(s3, ks[i], "abc", 3, 0, &err), 0);
    }
    size_t n = 0;
    ASSERT_EQ(dcp__s3_list(s3, "many/", 5000, count_fn, &n, &err), 0);
    ASSERT_EQ(n, N);
    n = 0; /* the bound holds */
    ASSERT_EQ(dcp__s3_list(s3, "many/", 1050, count_fn, &n, &err), DCP_ELIMIT);
    ASSERT_EQ(dcp__s3_delete_many(s3, ks, N, &err), 0);
    n = 0;
    ASSERT_EQ(dcp__s3_list(s3, "many/", 5000, count_fn, &n, &err), 0);
    ASSERT_EQ(n, 0);
    dcp__s3_free(s3);
}

/* A delimited listing: the keys directly under the prefix and each deeper
 * "directory" once (size -1), across pages. */
struct seen_d {
    int keys, dirs, other;
};

static int delim_fn(const char *key, int64_t size, void *ud)
{
    struct seen_d *s = ud;
    if (size < 0 && !strncmp(key, "dl/d", 4) && key[strlen(key) - 1] == '/')
        s->dirs++;
    else if (size >= 0 && !strncmp(key, "dl/k", 4) && !strchr(key + 3, '/'))
        s->keys++;
    else
        s->other++;
    return 0;
}

TEST(list_delimited)
{
    struct dcp__s3 *s3 = client(0, 4, NULL);
    struct dcp_err err = {0};
    struct seen_d sd = {0, 0, 0};
    char key[64];
    ASSERT(s3);
    for (int i = 0; i < 5; i++) {
        snprintf(key, sizeof(key), "dl/k%d", i);
        ASSERT_EQ(dcp__s3_put(s3, key, "x", 1, 0, &err), 0);
    }
    for (int i = 0; i < 1003; i++) { /* 1003 directories: two pages */
        snprintf(key, sizeof(key), "dl/d%04d/x", i);
        ASSERT_EQ(dcp__s3_put(s3, key, "x", 1, 0, &err), 0);
        if (i < 3) {
            snprintf(key, sizeof(key), "dl/d%04d/y/z", i);
            ASSERT_EQ(dcp__s3_put(s3, key, "x", 1, 0, &err), 0);
        }
    }
    ASSERT_EQ(dcp__s3_list_delim(s3, "dl/", 1, 5000, delim_fn, &sd, &err), 0);
    ASSERT_EQ(sd.keys, 5);
    ASSERT_EQ(sd.dirs, 1003);
    ASSERT_EQ(sd.other, 0);
    ASSERT_EQ(dcp__s3_list_delim(s3, "dl/", 1, 1000, delim_fn, &sd, &err),
              DCP_ELIMIT);
    dcp__s3_free(s3);
}

/* ListMultipartUploads past one page (1000 uploads): every upload once,
 * with its id, aborted through the listing. */
static int abort_listed(const char *key, const char *upid, void *ud)
{
    struct dcp__s3 *s3 = ud;
    struct dcp_err err = {0};
    return dcp__s3_mpu_abort(s3, key, upid, &err);
}

TEST(upload_listing)
{
    struct dcp__s3 *s3 = client(0, 4, NULL);
    struct dcp_err err = {0};
    char key[64], upid[DCP__S3_UPID_MAX];
    size_t nu = 0;
    ASSERT(s3);
    for (int i = 0; i < 1003; i++) {
        snprintf(key, sizeof(key), "ups/k%04d", i);
        ASSERT_EQ(dcp__s3_mpu_create(s3, key, upid, sizeof(upid), &err), 0);
    }
    ASSERT_EQ(dcp__s3_count_uploads(s3, "ups/", &nu, &err), 0);
    ASSERT_EQ(nu, 1003);
    ASSERT_EQ(dcp__s3_list_uploads(s3, "ups/", 1002, abort_listed, s3, &err),
              DCP_ELIMIT);
    ASSERT_EQ(dcp__s3_count_uploads(s3, "ups/", &nu, &err), 0);
    ASSERT_EQ(nu, 1);
    ASSERT_EQ(dcp__s3_list_uploads(s3, "ups/", 10, abort_listed, s3, &err), 0);
    ASSERT_EQ(dcp__s3_count_uploads(s3, "ups/", &nu, &err), 0);
    ASSERT_EQ(nu, 0);
    dcp__s3_free(s3);
}

TEST(exclusive_and_errors)
{
    struct dcp__s3 *s3 = client(0, 2, NULL);
    ASSERT(s3);
    struct dcp_err err = {0};
    ASSERT_EQ(dcp__s3_put(s3, "excl/x", "1", 1, DCP__S3_PUT_EXCLUSIVE, &err),
              0);
    ASSERT_EQ(dcp__s3_put(s3, "excl/x", "2", 1, DCP__S3_PUT_EXCLUSIVE, &err),
              DCP_EEXIST);
    ASSERT(strstr(err.msg, "excl/x") && strstr(err.msg, "412"));
    /* an exclusive multipart complete onto an existing key: refused, and
     * the upload aborted */
    uint8_t *big = pattern((6u << 20) + 1, 5);
    ASSERT_EQ(dcp__s3_put_multipart(s3, "excl/x", big, (6u << 20) + 1,
                                    DCP__S3_PUT_EXCLUSIVE, &err),
              DCP_EEXIST);
    free(big);
    size_t nu = 9;
    ASSERT_EQ(dcp__s3_count_uploads(s3, "excl/", &nu, &err), 0);
    ASSERT_EQ(nu, 0);
    void *b = NULL;
    size_t bl = 0;
    ASSERT_EQ(dcp__s3_get(s3, "excl/x", 10, &b, &bl, &err), 0);
    ASSERT(bl == 1 && ((char *)b)[0] == '1');
    dcp__free(b);
    ASSERT_EQ(dcp__s3_get(s3, "excl/missing", 10, &b, &bl, &err), DCP_ENOENT);
    ASSERT(strstr(err.msg, "excl/missing"));
    /* a body over the caller's limit */
    ASSERT_EQ(dcp__s3_put(s3, "excl/big", "0123456789", 10, 0, &err), 0);
    ASSERT_EQ(dcp__s3_get(s3, "excl/big", 5, &b, &bl, &err), DCP_ELIMIT);
    dcp__s3_free(s3);

    struct dcp__s3 *nb = client(0, 2, "dcp-no-such-bucket");
    ASSERT(nb);
    ASSERT_EQ(dcp__s3_get(nb, "k", 10, &b, &bl, &err), DCP_ENOENT);
    ASSERT(strstr(err.msg, "dcp-no-such-bucket") &&
           strstr(err.msg, "no such bucket"));
    dcp__s3_free(nb);

    char *bk, *px;
    ASSERT_EQ(dcp__s3_parse_url("s3://my-bucket/a/b/", &bk, &px, &err), 0);
    ASSERT(!strcmp(bk, "my-bucket") && !strcmp(px, "a/b"));
    dcp__free(bk);
    dcp__free(px);
    ASSERT_EQ(dcp__s3_parse_url("s3://My_Bucket/x", &bk, &px, &err),
              DCP_EINVAL);
    ASSERT_EQ(dcp__s3_parse_url("s3://192.168.1.1/x", &bk, &px, &err),
              DCP_EINVAL);
    ASSERT_EQ(dcp__s3_parse_url("s3://ab/x", &bk, &px, &err), DCP_EINVAL);
    ASSERT_EQ(dcp__s3_parse_url("file:///x", &bk, &px, &err), DCP_EINVAL);
}

/* Each fault once or twice: retried and succeeding, bytes exact. */
TEST(faults_retried)
{
    struct dcp__s3 *s3 = client(1, 5, NULL);
    ASSERT(s3);
    const char *modes[] = {"slowdown", "reset",  "stall",
                           "truncate", "badlen", "badetag"};
    for (size_t i = 0; i < DCP_ARRAY_LEN(modes); i++) {
        faults(modes[i], 2);
        time_t t0 = time(NULL);
        int rc = roundtrip(s3, "faults/obj", 70000, 0);
        faults(NULL, 0);
        if (rc)
            fprintf(stderr, "fault %s: rc %d\n", modes[i], rc);
        ASSERT_EQ(rc, 0);
        ASSERT(time(NULL) - t0 < 30);
    }
    faults("slowdown_put", 3); /* parts retried */
    ASSERT_EQ(roundtrip(s3, "faults/mpu", 12u << 20, 1), 0);
    faults(NULL, 0);
    dcp__s3_free(s3);
}

/* Each fault for ever: a clear error naming the object, bounded in time. */
TEST(faults_fatal)
{
    struct dcp__s3 *s3 = client(1, 3, NULL);
    ASSERT(s3);
    struct dcp_err err = {0};
    uint8_t buf[100];
    struct {
        const char *mode;
        int put;
        int code;
        const char *text;
    } cs[] = {
        {"slowdown", 1, DCP_EIO, "SlowDown"},
        {"badcrc", 1, DCP_ECORRUPT, "CRC32"},
        {"oddetag", 1, DCP_ECORRUPT, "hex digits"},
        {"reset", 0, DCP_EIO, "offset"},
        {"stall", 0, DCP_ETIMEOUT, "offset"},
        {"truncate", 0, DCP_ECORRUPT, "offset"},
        {"badlen", 0, DCP_ECORRUPT, "Content-Length"},
    };
    ASSERT_EQ(dcp__s3_put(s3, "fatal/obj", NULL, 0, 0, &err), 0);
    uint8_t *src = pattern(100, 1);
    ASSERT_EQ(dcp__s3_put(s3, "fatal/obj", src, 100, 0, &err), 0);
    for (size_t i = 0; i < DCP_ARRAY_LEN(cs); i++) {
        faults(cs[i].mode, 1000);
        time_t t0 = time(NULL);
        int rc = cs[i].put
                     ? dcp__s3_put(s3, "fatal/obj", src, 100, 0, &err)
                     : dcp__s3_get_range(s3, "fatal/obj", 10, buf, 80, &err);
        faults(NULL, 0);
        fprintf(stderr, "  %s: %s\n", cs[i].mode, err.msg);
        ASSERT_EQ(rc, cs[i].code);
        ASSERT(strstr(err.msg, "fatal/obj") && strstr(err.msg, cs[i].text));
        ASSERT(time(NULL) - t0 < 30);
    }
    /* Without checksums (when_required), and for bodies up to 1 MiB with
     * them, the ETag must be the MD5 sent (Content-MD5): a wrong one is not
     * trusted, unless the answer names SSE-KMS (S3's ETag is no MD5 then;
     * a KMS key id alone is not that); a larger body with checksums: the
     * server checked the CRC, the ETag only goes into the part list (its
     * hex checked above). */
    {
        setenv("AWS_REQUEST_CHECKSUM_CALCULATION", "WHEN_REQUIRED", 1);
        struct dcp__s3 *q = client(1, 3, NULL);
        unsetenv("AWS_REQUEST_CHECKSUM_CALCULATION");
        ASSERT(q != NULL);
        ASSERT_EQ(dcp__s3_put(q, "fatal/obj", src, 100, 0, &err), 0);
        faults("badetag", 1000);
        int rc = dcp__s3_put(q, "fatal/obj", src, 100, 0, &err);
        faults(NULL, 0);
        fprintf(stderr, "  badetag, no checksums: %s\n", err.msg);
        ASSERT_EQ(rc, DCP_ECORRUPT);
        ASSERT(strstr(err.msg, "fatal/obj") && strstr(err.msg, "MD5"));
        faults("badetag_kms", 1000);
        ASSERT_EQ(dcp__s3_put(q, "fatal/obj", src, 100, 0, &err), DCP_OK);
        faults("badetag_kmsid", 1000);
        rc = dcp__s3_put(q, "fatal/obj", src, 100, 0, &err);
        faults(NULL, 0);
        ASSERT_EQ(rc, DCP_ECORRUPT);
        dcp__s3_free(q);
        faults("badetag", 1000);
        rc = dcp__s3_put(s3, "fatal/obj", src, 100, 0, &err);
        faults(NULL, 0);
        ASSERT_EQ(rc, DCP_ECORRUPT);
        ASSERT(strstr(err.msg, "MD5"));
        uint8_t *two = pattern(2u << 20, 5);
        faults("badetag", 1000);
        rc = dcp__s3_put(s3, "fatal/two", two, 2u << 20, 0, &err);
        faults(NULL, 0);
        ASSERT_EQ(rc, DCP_OK);
        free(two);
    }
    /* many attempts allowed, but the total budget ends the retries */
    {
        struct dcp__s3_config c = {0};
        c.endpoint = getenv("DCP_S3_PROXY");
        c.max_attempts = 1000;
        c.retry_budget_ms = 1500;
        c.backoff_base_ms = 10;
        c.backoff_cap_ms = 100;
        struct dcp__s3 *q = NULL;
        ASSERT_EQ(dcp__s3_create(&c, bucket, &q, &err), 0);
        faults("slowdown", 100000);
        time_t t0 = time(NULL);
        int rc = dcp__s3_get_range(q, "fatal/obj", 0, buf, 10, &err);
        faults(NULL, 0);
        dcp__s3_free(q);
        fprintf(stderr, "  budget: %s\n", err.msg);
        ASSERT_EQ(rc, DCP_ETIMEOUT);
        ASSERT(strstr(err.msg, "fatal/obj") && strstr(err.msg, "budget"));
        ASSERT(time(NULL) - t0 < 10);
    }
    /* a body trickling at 20 bytes/s, above the stall limit: the budget
     * ends it, DCP_ETIMEOUT naming the object, never a truncated object;
     * a listing timing out is named by its query */
    {
        struct dcp__s3_config c = {0};
        c.endpoint = getenv("DCP_S3_PROXY");
        c.max_attempts = 3;
        c.retry_budget_ms = 1500;
        c.stall_timeout_ms = 1000;
        c.backoff_base_ms = 10;
        c.backoff_cap_ms = 100;
        struct dcp__s3 *q = NULL;
        void *whole = NULL;
        size_t wl = 0, nk = 0;
        ASSERT_EQ(dcp__s3_create(&c, bucket, &q, &err), 0);
        faults("trickle", 100000);
        time_t t0 = time(NULL);
        int rc = dcp__s3_get_range(q, "fatal/obj", 0, buf, 100, &err);
        fprintf(stderr, "  trickle: %s\n", err.msg);
        ASSERT_EQ(rc, DCP_ETIMEOUT);
        ASSERT(strstr(err.msg, "s3://dcp-test/fatal/obj: GET") &&
               strstr(err.msg, "timed out"));
        rc = dcp__s3_get(q, "fatal/obj", 1000, &whole, &wl, &err);
        ASSERT_EQ(rc, DCP_ETIMEOUT);
        ASSERT(strstr(err.msg, "fatal/obj") && strstr(err.msg, "timed out"));
        rc = dcp__s3_list(q, "fatal/", 100, count_any, &nk, &err);
        faults(NULL, 0);
        fprintf(stderr, "  trickle, listing: %s\n", err.msg);
        ASSERT_EQ(rc, DCP_ETIMEOUT);
        ASSERT(strstr(err.msg, "?list-type=2&") &&
               strstr(err.msg, "prefix=fatal%2F"));
        ASSERT(time(NULL) - t0 < 15);
        dcp__s3_free(q);
    }
    /* a multipart upload whose parts keep failing is aborted */
    uint8_t *big = pattern(11u << 20, 3);
    faults("slowdown_put", 1000);
    ASSERT_EQ(dcp__s3_put_multipart(s3, "fatal/mpu", big, 11u << 20, 0, &err),
              DCP_EIO);
    faults(NULL, 0);
    size_t nu = 9;
    ASSERT_EQ(dcp__s3_count_uploads(s3, "fatal/", &nu, &err), 0);
    ASSERT_EQ(nu, 0);
    struct dcp__s3_stat st;
    ASSERT_EQ(dcp__s3_head(s3, "fatal/mpu", &st, &err), DCP_ENOENT);
    free(big);
    free(src);
    dcp__s3_free(s3);
}

/* One client from several threads at once (the shared connection pool). */
struct thr {
    struct dcp__s3 *s3;
    int id, rc;
};

static void *thr_main(void *u)
{
    struct thr *t = u;
    char key[64];
    for (int i = 0; i < 8 && t->rc == 0; i++) {
        snprintf(key, sizeof(key), "threads/t%d/k%d", t->id, i);
        t->rc = roundtrip(t->s3, key, 1000u * (unsigned)(t->id + i + 1), 0);
    }
    return NULL;
}

TEST(threads)
{
    struct dcp__s3 *s3 = client(0, 4, NULL);
    ASSERT(s3);
    struct thr t[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        t[i] = (struct thr){s3, i, 0};
        ASSERT_EQ(pthread_create(&th[i], NULL, thr_main, &t[i]), 0);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++)
        ASSERT_EQ(t[i].rc, 0);
    size_t n = 0;
    struct dcp_err err = {0};
    ASSERT_EQ(dcp__s3_list(s3, "threads/", 100, count_any, &n, &err), 0);
    ASSERT_EQ(n, 32);
    dcp__s3_free(s3);
}

/* Under --auth, moto verifies every signature (botocore's S3SigV4Auth);
 * radosgw always does (DCP_S3_SIGCHECK): these pass only if ours is right,
 * and wrong credentials are refused. */
TEST(auth)
{
    struct dcp__s3 *s3 = client(0, 2, NULL);
    ASSERT(s3);
    ASSERT_EQ(roundtrip(s3, "auth/plain", 1000, 0), 0);
    ASSERT_EQ(roundtrip(s3, "auth/a b+c=d~e", 10, 0), 0);
    ASSERT_EQ(roundtrip(s3, "auth/mpu", (6u << 20) + 1, 1), 0);
    size_t n = 0;
    struct dcp_err err = {0};
    ASSERT_EQ(dcp__s3_list(s3, "auth/", 100, count_any, &n, &err), 0);
    ASSERT_EQ(n, 3); /* plain, a b+c=d~e, mpu */
    ASSERT_EQ(
        dcp__s3_put(s3, "auth/plain", "x", 1, DCP__S3_PUT_EXCLUSIVE, &err),
        DCP_EEXIST);
    dcp__s3_free(s3);

    /* temporary credentials (moto's STS, --auth): x-amz-security-token
     * signed and sent */
    struct dcp__s3_config c = {0};
    if (getenv("DCP_S3_AUTH")) {
        c.access_key = getenv("DCP_S3_TMP_KEY");
        c.secret_key = getenv("DCP_S3_TMP_SECRET");
        c.session_token = getenv("DCP_S3_TMP_TOKEN");
        c.max_attempts = 2;
        ASSERT(c.access_key && c.secret_key && c.session_token);
        ASSERT_EQ(dcp__s3_create(&c, bucket, &s3, &err), 0);
        ASSERT_EQ(roundtrip(s3, "auth/token", 1000, 0), 0);
        dcp__s3_free(s3);
        c.session_token = "not-the-token";
        ASSERT_EQ(dcp__s3_create(&c, bucket, &s3, &err), 0);
        ASSERT_EQ(dcp__s3_put(s3, "auth/token2", "x", 1, 0, &err),
                  DCP_EINVAL);
        fprintf(stderr, "  wrong token: %s\n", err.msg);
        ASSERT(strstr(err.msg, "auth/token2") &&
               strstr(err.msg, "InvalidToken"));
        dcp__s3_free(s3);
    }

    c = (struct dcp__s3_config){0};
    c.secret_key = "wrong-secret";
    c.max_attempts = 2;
    ASSERT_EQ(dcp__s3_create(&c, bucket, &s3, &err), 0);
    void *b = NULL;
    size_t bl = 0;
    ASSERT_EQ(dcp__s3_get(s3, "auth/plain", 100, &b, &bl, &err), DCP_EINVAL);
    fprintf(stderr, "  wrong secret: %s\n", err.msg);
    ASSERT(strstr(err.msg, "dcp-test") && strstr(err.msg, "access denied") &&
           strstr(err.msg, "403"));
    dcp__s3_free(s3);
    c.secret_key = NULL;
    c.access_key = "AKIANOSUCHKEY0000000";
    ASSERT_EQ(dcp__s3_create(&c, bucket, &s3, &err), 0);
    ASSERT_EQ(dcp__s3_put(s3, "auth/new", "x", 1, 0, &err), DCP_EINVAL);
    fprintf(stderr, "  wrong key id: %s\n", err.msg);
    ASSERT(strstr(err.msg, "dcp-test") && strstr(err.msg, "access denied"));
    dcp__s3_free(s3);
}

/* Hostile listing answers through the proxy (200, a matching length): a
 * body cut before its first entry, no IsTruncated, a key outside the
 * prefix, a page served again under the same token -- each refused with
 * DCP_EFORMAT naming the listing, never read as fewer (or no) keys; a
 * CompleteMultipartUpload answer cut short likewise. */
TEST(list_hostile)
{
    struct dcp__s3 *s3 = client(1, 2, NULL);
    struct dcp_err err = {0};
    char upid[DCP__S3_UPID_MAX];
    size_t n = 0;
    static const char *ks[] = {"hl/a", "hl/b", "hl/c/x"};
    static const char *modes[] = {"list_cut", "list_notrunc", "list_foreign",
                                  "list_loop"};
    ASSERT(s3);
    for (size_t i = 0; i < DCP_ARRAY_LEN(ks); i++)
        ASSERT_EQ(dcp__s3_put(s3, ks[i], "abc", 3, 0, &err), 0);
    ASSERT_EQ(dcp__s3_list(s3, "hl/", 5000, count_fn, &n, &err), 0);
    ASSERT_EQ(n, 3);
    for (size_t i = 0; i < DCP_ARRAY_LEN(modes); i++) {
        for (int delim = 0; delim < 2; delim++) {
            faults(modes[i], 100000);
            n = 0;
            int rc = dcp__s3_list_delim(s3, "hl/", delim, 5000, count_any, &n,
                                        &err);
            faults(NULL, 0);
            fprintf(stderr, "  %s: %s\n", modes[i], err.msg);
            ASSERT_EQ(rc, DCP_EFORMAT);
            ASSERT(strstr(err.msg, "s3://") && strstr(err.msg, "hl/") &&
                   strstr(err.msg, "listing page"));
        }
    }
    ASSERT_EQ(dcp__s3_mpu_create(s3, "hl/up", upid, sizeof(upid), &err), 0);
    for (size_t i = 0; i < 3; i++) { /* list_loop is ListObjectsV2's */
        faults(modes[i], 100000);
        n = 0;
        int rc = dcp__s3_count_uploads(s3, "hl/", &n, &err);
        faults(NULL, 0);
        fprintf(stderr, "  uploads, %s: %s\n", modes[i], err.msg);
        ASSERT_EQ(rc, DCP_EFORMAT);
        ASSERT(strstr(err.msg, "hl/") && strstr(err.msg, "listing page"));
    }
    ASSERT_EQ(dcp__s3_mpu_abort(s3, "hl/up", upid, &err), 0);
    {
        uint8_t *src = pattern(6u << 20, 3);
        faults("complete_cut", 1);
        int rc = dcp__s3_put_multipart(s3, "hl/mpu", src, 6u << 20, 0, &err);
        faults(NULL, 0);
        fprintf(stderr, "  complete_cut: %s\n", err.msg);
        ASSERT_EQ(rc, DCP_EFORMAT);
        ASSERT(strstr(err.msg, "hl/mpu") &&
               strstr(err.msg, "CompleteMultipartUploadResult"));
        free(src);
    }
    ASSERT_EQ(dcp__s3_delete_many(s3, ks, DCP_ARRAY_LEN(ks), &err), 0);
    (void)dcp__s3_delete(s3, "hl/mpu", &err);
    dcp__s3_free(s3);
}

int main(void)
{
    bucket = getenv("DCP_S3_BUCKET");
    if (!bucket || !getenv("DCP_S3_PROXY")) {
        printf("SKIP: run through tests/s3/s3_env.py\n");
        return 77;
    }
    if (getenv("DCP_S3_AUTH")) {
        RUN(auth);
        return TEST_SUMMARY();
    }
    RUN(sizes);
    RUN(odd_keys);
    RUN(threads);
    RUN(list_continuation);
    RUN(upload_listing);
    RUN(list_delimited);
    RUN(exclusive_and_errors);
    RUN(list_hostile);
    RUN(faults_retried);
    RUN(faults_fatal);
    if (getenv("DCP_S3_SIGCHECK"))
        RUN(auth);
    return TEST_SUMMARY();
}
