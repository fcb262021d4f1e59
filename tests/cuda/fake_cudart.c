/*
 * A stand-in for libcudart, for testing dcp's CUDA path on machines
 * without a GPU (CI). "Device" memory is a host mapping with no access
 * rights (PROT_NONE): dcp dereferencing a device pointer on the host
 * crashes the test. Copies go through a shadow mapping at the same offsets.
 * It also checks what a real driver would make slow or wrong: asynchronous
 * device-to-host copies into memory that is not page-locked
 * (cudaHostRegister) are counted, registrations must pair with
 * unregistrations, and the k-th cudaMemcpyAsync can be made to fail.
 *
 * Only the functions dcp and tests/cuda/cuda_roundtrip.c call exist, with
 * CUDA's prototypes (error codes: 0 success, 1 cudaErrorInvalidValue,
 * 2 cudaErrorMemoryAllocation).
 */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#define API __attribute__((visibility("default")))

/* CUDA's prototypes, as libcudart exports them. */
API int cudaGetDeviceCount(int *n);
API int cudaMalloc(void **p, size_t n);
API int cudaFree(void *p);
API int cudaMemcpy(void *dst, const void *src, size_t n, int kind);
API int cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind,
                        void *stream);
API int cudaStreamSynchronize(void *s);
API int cudaDeviceSynchronize(void);
API int cudaHostRegister(void *p, size_t n, unsigned flags);
API int cudaHostUnregister(void *p);
API const char *cudaGetErrorName(int e);
API const char *cudaGetErrorString(int e);
API void fake_cudart_stats(long *copies, long *pageable, long *registered,
                           long *bad_unreg);
API void fake_cudart_fail_async_after(long k);

#define DEV_BYTES ((size_t)512 << 20)
#define MAX_REG   64

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static uint8_t *dev_base, *shadow;
static size_t dev_used;
static struct {
    const uint8_t *p;
    size_t n;
} reg[MAX_REG];
static int nreg;
static long async_copies, pageable_async, fail_async_at, bad_unregister;

/* Fake-only: statistics, and failure injection. */
API void fake_cudart_stats(long *copies, long *pageable, long *registered,
                           long *bad_unreg)
{
    pthread_mutex_lock(&mu);
    *copies = async_copies;
    *pageable = pageable_async;
    *registered = nreg;
    *bad_unreg = bad_unregister;
    pthread_mutex_unlock(&mu);
}

API void fake_cudart_fail_async_after(long k)
{
    pthread_mutex_lock(&mu);
    fail_async_at = k ? async_copies + k : 0;
    pthread_mutex_unlock(&mu);
}

static int init(void)
{
    if (dev_base)
        return 0;
    dev_base = mmap(NULL, DEV_BYTES, PROT_NONE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    shadow = mmap(NULL, DEV_BYTES, PROT_READ | PROT_WRITE,
                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (dev_base == MAP_FAILED || shadow == MAP_FAILED) {
        dev_base = NULL;
        return 2;
    }
    return 0;
}

static int is_dev(const void *p)
{
    const uint8_t *b = p;
    return dev_base && b >= dev_base && b < dev_base + DEV_BYTES;
}

/* The accessible address for p (device pointers go to the shadow). */
static void *real(const void *p, size_t n, int *bad)
{
    const uint8_t *b = p;
    if (!is_dev(p))
        return (void *)(uintptr_t)p;
    if ((size_t)(b - dev_base) + n > dev_used)
        *bad = 1;
    return shadow + (b - dev_base);
}

static int is_pinned(const void *p, size_t n)
{
    const uint8_t *b = p;
    int i;
    for (i = 0; i < nreg; i++)
        if (b >= reg[i].p && b + n <= reg[i].p + reg[i].n)
            return 1;
    return 0;
}

API int cudaGetDeviceCount(int *n)
{
    *n = 1;
    return 0;
}

API int cudaMalloc(void **p, size_t n)
{
    int rc;
    pthread_mutex_lock(&mu);
    rc = init();
    if (!rc && dev_used + n + 256 > DEV_BYTES)
        rc = 2;
    if (!rc) {
        *p = dev_base + dev_used;
        dev_used += (n + 255) / 256 * 256;
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

API int cudaFree(void *p)
{
    return p && !is_dev(p) ? 1 : 0;
}

static int copy(void *dst, const void *src, size_t n)
{
    int bad = 0;
    void *d = real(dst, n, &bad);
    const void *s = real(src, n, &bad);
    if (bad)
        return 1;
    memmove(d, s, n);
    return 0;
}

API int cudaMemcpy(void *dst, const void *src, size_t n, int kind)
{
    int rc;
    (void)kind;
    pthread_mutex_lock(&mu);
    rc = copy(dst, src, n);
    pthread_mutex_unlock(&mu);
    return rc;
}

API int cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind,
                        void *stream)
{
    int rc;
    (void)kind;
    pthread_mutex_lock(&mu);
    async_copies++;
    if (fail_async_at && async_copies >= fail_async_at) {
        pthread_mutex_unlock(&mu);
        return 1;
    }
    if (stream != NULL) {
        pthread_mutex_unlock(&mu);
        return 1; /* dcp uses the legacy default stream */
    }
    if (is_dev(src) && !is_dev(dst) && !is_pinned(dst, n))
        pageable_async++;
    rc = copy(dst, src, n);
    pthread_mutex_unlock(&mu);
    return rc;
}

API int cudaStreamSynchronize(void *s)
{
    return s == NULL ? 0 : 1;
}

API int cudaDeviceSynchronize(void)
{
    return 0;
}

API int cudaHostRegister(void *p, size_t n, unsigned flags)
{
    int rc = 0;
    (void)flags;
    pthread_mutex_lock(&mu);
    if (nreg == MAX_REG || is_pinned(p, 1)) {
        rc = 1;
    } else {
        reg[nreg].p = p;
        reg[nreg].n = n;
        nreg++;
    }
    pthread_mutex_unlock(&mu);
    return rc;
}

API int cudaHostUnregister(void *p)
{
    int i, rc = 1;
    pthread_mutex_lock(&mu);
    for (i = 0; i < nreg; i++)
        if (reg[i].p == p) {
            reg[i] = reg[--nreg];
            rc = 0;
            break;
        }
    if (rc)
        bad_unregister++;
    pthread_mutex_unlock(&mu);
    return rc;
}

API const char *cudaGetErrorName(int e)
{
    return e == 0   ? "cudaSuccess"
           : e == 1 ? "cudaErrorInvalidValue"
                    : "cudaErrorMemoryAllocation";
}

API const char *cudaGetErrorString(int e)
{
    return e == 0 ? "no error" : e == 1 ? "invalid argument" : "out of memory";
}
