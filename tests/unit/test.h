/*
 * Minimal unit-test harness (after libuv's test/task.h). A test file defines
 * TEST(name) functions and a main that runs them with RUN(name); each ASSERT
 * prints both sides and fails the current test. main ends with
 * TEST_SUMMARY(), which prints "N passed, N failed" and returns the exit
 * status.
 */
#ifndef DCP_TEST_H
#define DCP_TEST_H

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int test_failed_;
static int test_npass_, test_nfail_;

#define TEST(name) static void test_##name(void)

#define RUN(name)                                                              \
    do {                                                                       \
        test_failed_ = 0;                                                      \
        test_##name();                                                         \
        if (test_failed_) {                                                    \
            test_nfail_++;                                                     \
            fprintf(stderr, "FAIL %s\n", #name);                               \
        } else {                                                               \
            test_npass_++;                                                     \
            fprintf(stderr, "ok   %s\n", #name);                               \
        }                                                                      \
    } while (0)

#define TEST_SUMMARY()                                                         \
    (printf("%d passed, %d failed\n", test_npass_, test_nfail_),               \
     test_nfail_ ? 1 : 0)

#define FAIL_AT_(fmt, ...)                                                     \
    do {                                                                       \
        fprintf(stderr, "%s:%d: " fmt "\n", __FILE__, __LINE__, __VA_ARGS__);  \
        test_failed_ = 1;                                                      \
        return;                                                                \
    } while (0)

#define ASSERT(c)                                                              \
    do {                                                                       \
        if (!(c))                                                              \
            FAIL_AT_("assertion failed: %s", #c);                              \
    } while (0)

#define ASSERT_EQ(a, b)                                                        \
    do {                                                                       \
        long long a_ = (long long)(a), b_ = (long long)(b);                    \
        if (a_ != b_)                                                          \
            FAIL_AT_("%s == %s: %lld != %lld", #a, #b, a_, b_);                \
    } while (0)

#define ASSERT_U64_EQ(a, b)                                                    \
    do {                                                                       \
        uint64_t a_ = (uint64_t)(a), b_ = (uint64_t)(b);                       \
        if (a_ != b_)                                                          \
            FAIL_AT_("%s == %s: %" PRIu64 " != %" PRIu64, #a, #b, a_, b_);     \
    } while (0)

#define ASSERT_STR_EQ(a, b)                                                    \
    do {                                                                       \
        const char *a_ = (a), *b_ = (b);                                       \
        if (!a_ || !b_ || strcmp(a_, b_) != 0)                                 \
            FAIL_AT_("%s == %s: \"%s\" != \"%s\"", #a, #b,                     \
                     a_ ? a_ : "(null)", b_ ? b_ : "(null)");                  \
    } while (0)

#define ASSERT_MEM_EQ(a, b, n)                                                 \
    do {                                                                       \
        if (memcmp((a), (b), (n)) != 0)                                        \
            FAIL_AT_("%s == %s: %zu bytes differ", #a, #b, (size_t)(n));       \
    } while (0)

/* rc is a dcp return code: prints its name on failure. */
#define ASSERT_OK(rc)                                                          \
    do {                                                                       \
        int rc_ = (rc);                                                        \
        if (rc_ != 0)                                                          \
            FAIL_AT_("%s: %s (%d)", #rc, dcp_err_name(rc_), rc_);              \
    } while (0)

#define ASSERT_RC(rc, want)                                                    \
    do {                                                                       \
        int rc_ = (rc), w_ = (want);                                           \
        if (rc_ != w_)                                                         \
            FAIL_AT_("%s: got %s (%d), want %s (%d)", #rc, dcp_err_name(rc_),  \
                     rc_, dcp_err_name(w_), w_);                               \
    } while (0)

#endif /* DCP_TEST_H */
