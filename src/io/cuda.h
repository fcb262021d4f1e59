/*
 * CUDA runtime, opened at run time: the few libcudart functions dcp needs
 * to stage device buffers (device to host copies into page-locked memory)
 * and to load into them (host to device copies). No CUDA header or library
 * is needed to build dcp; the function types are declared in cuda.c.
 *
 * Every function returns DCP_OK, or DCP_ENOTSUP when libcudart cannot be
 * opened and DCP_EIO when a CUDA call fails, with cudaGetErrorName and
 * cudaGetErrorString in the message. Thread safe (libcudart is).
 */
#ifndef DCP_CUDA_H
#define DCP_CUDA_H

#include <stddef.h>

#include "util.h"

/*
 * Opens libcudart once per process: the file named by the environment
 * variable DCP_CUDART, otherwise libcudart.so, .so.13, .so.12, .so.11.0.
 * A failure is not remembered (a later call tries again); success is.
 */
int dcp__cuda_open(struct dcp_err *err);

/* cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, legacy default stream). */
int dcp__cuda_copy_async(void *dst, const void *src, size_t n,
                         struct dcp_err *err);

/* cudaStreamSynchronize(legacy default stream): the copies issued before
 * are complete. */
int dcp__cuda_sync(struct dcp_err *err);

/* cudaMemcpy(dst, src, n, cudaMemcpyDefault): synchronous. */
int dcp__cuda_copy(void *dst, const void *src, size_t n, struct dcp_err *err);

/* cudaHostRegister(p, n, cudaHostRegisterPortable) / cudaHostUnregister. */
int dcp__cuda_host_register(void *p, size_t n, struct dcp_err *err);
void dcp__cuda_host_unregister(void *p);

#endif /* DCP_CUDA_H */
