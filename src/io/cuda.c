/*
 * libcudart through dlopen. The prototypes below are CUDA's own (runtime
 * API, stable since CUDA 4): cudaError_t is an int-sized enum, streams are
 * pointers, cudaMemcpyDefault is 4 and cudaHostRegisterPortable is 1. The
 * legacy default stream (NULL) synchronises with the other blocking streams,
 * so a copy issued on it sees the work the caller queued there before.
 */
#include "cuda.h"

#include <dlfcn.h> /* dlopen, dlsym, dlerror */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h> /* getenv */
#include <string.h>

typedef int cuda_error;
typedef void *cuda_stream;

#define CUDA_MEMCPY_DEFAULT         4
#define CUDA_HOST_REGISTER_PORTABLE 1u

struct cudart {
    void *lib;
    cuda_error (*memcpy_async)(void *, const void *, size_t, int, cuda_stream);
    cuda_error (*memcpy_sync)(void *, const void *, size_t, int);
    cuda_error (*stream_sync)(cuda_stream);
    cuda_error (*host_register)(void *, size_t, unsigned);
    cuda_error (*host_unregister)(void *);
    const char *(*error_name)(cuda_error);
    const char *(*error_string)(cuda_error);
};

static struct cudart rt;
static pthread_mutex_t rt_lock = PTHREAD_MUTEX_INITIALIZER;

/* dlsym returns an object pointer; C11 has no conversion from it to a
 * function pointer, POSIX guarantees the representation is the same. */
#define RESOLVE(field, name)                   \
    do {                                       \
        void *sym_ = dlsym(lib, name);         \
        if (!sym_) {                           \
            missing = name;                    \
            goto out_close;                    \
        }                                      \
        memcpy(&r.field, &sym_, sizeof(sym_)); \
    } while (0)

static int try_open(const char *file, struct dcp_buf *why)
{
    struct cudart r;
    const char *missing = NULL, *e;
    void *lib = dlopen(file, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        e = dlerror();
        (void)dcp__buf_printf(why, "%s'%s' (%s)", why->len ? ", " : "", file,
                              e ? e : "cannot open");
        return DCP_ENOTSUP;
    }
    memset(&r, 0, sizeof(r));
    r.lib = lib;
    RESOLVE(memcpy_async, "cudaMemcpyAsync");
    RESOLVE(memcpy_sync, "cudaMemcpy");
    RESOLVE(stream_sync, "cudaStreamSynchronize");
    RESOLVE(host_register, "cudaHostRegister");
    RESOLVE(host_unregister, "cudaHostUnregister");
    RESOLVE(error_name, "cudaGetErrorName");
    RESOLVE(error_string, "cudaGetErrorString");
    rt = r;
    return DCP_OK;
out_close:
    (void)dcp__buf_printf(why, "%s'%s' (no symbol %s)", why->len ? ", " : "",
                          file, missing);
    (void)dlclose(lib);
    return DCP_ENOTSUP;
}

int dcp__cuda_open(struct dcp_err *err)
{
    static const char *const names[] = {"libcudart.so", "libcudart.so.13",
                                        "libcudart.so.12", "libcudart.so.11.0"};
    /* getenv is only unsafe against a concurrent setenv, which a program
     * that runs dcp calls concurrently has no business doing. */
    const char *env = getenv("DCP_CUDART"); /* NOLINT(concurrency-mt-unsafe) */
    struct dcp_buf why = {0};
    size_t i;
    int rc = DCP_ENOTSUP;
    (void)pthread_mutex_lock(&rt_lock);
    if (rt.lib) {
        rc = DCP_OK;
    } else if (env && *env) {
        rc = try_open(env, &why);
    } else {
        for (i = 0; i < DCP_ARRAY_LEN(names) && rc != DCP_OK; i++)
            rc = try_open(names[i], &why);
    }
    (void)pthread_mutex_unlock(&rt_lock);
    if (rc != DCP_OK)
        (void)dcp__err(err, rc,
                       "CUDA memory needs libcudart, which could not be "
                       "loaded%s: tried %s",
                       env && *env ? " (from DCP_CUDART)" : "",
                       why.p ? (const char *)why.p : "nothing");
    dcp__buf_free(&why);
    return rc;
}

/* The table is written once, under rt_lock, before any caller can have got
 * DCP_OK from dcp__cuda_open; readers below only run after that. */
static int cuda_fail(struct dcp_err *err, cuda_error e, const char *what)
{
    return dcp__err(err, DCP_EIO, "%s failed: %s (%s)", what,
                    rt.error_name ? rt.error_name(e) : "?",
                    rt.error_string ? rt.error_string(e) : "?");
}

int dcp__cuda_copy_async(void *dst, const void *src, size_t n,
                         struct dcp_err *err)
{
    cuda_error e = rt.memcpy_async(dst, src, n, CUDA_MEMCPY_DEFAULT, NULL);
    return e ? cuda_fail(err, e, "cudaMemcpyAsync") : DCP_OK;
}

int dcp__cuda_sync(struct dcp_err *err)
{
    cuda_error e = rt.stream_sync(NULL);
    return e ? cuda_fail(err, e, "cudaStreamSynchronize") : DCP_OK;
}

int dcp__cuda_copy(void *dst, const void *src, size_t n, struct dcp_err *err)
{
    cuda_error e = rt.memcpy_sync(dst, src, n, CUDA_MEMCPY_DEFAULT);
    return e ? cuda_fail(err, e, "cudaMemcpy") : DCP_OK;
}

int dcp__cuda_host_register(void *p, size_t n, struct dcp_err *err)
{
    cuda_error e = rt.host_register(p, n, CUDA_HOST_REGISTER_PORTABLE);
    return e ? cuda_fail(err, e, "cudaHostRegister") : DCP_OK;
}

void dcp__cuda_host_unregister(void *p)
{
    if (rt.host_unregister)
        (void)rt.host_unregister(p);
}
