/*
 * dcp_torch._C: the CPython extension over dcp's public headers
 * (include/dcp/ only; docs/ARCHITECTURE.md). Limited API (abi3, 3.10+).
 *
 * Types:
 *   Context   a dcp_ctx (options: io depth, I/O block, O_DIRECT and
 *             io_uring on/off, metadata and value limits); its calls are
 *             serialised by a lock of its own and run with the GIL
 *             released.
 *   PartSave  a dcp_part_save (the coordinator's begin and commit).
 *   Meta      a dcp_metadata opened from a checkpoint (restricted decoder):
 *             its entries as plain tuples, or as torch's own Metadata
 *             objects built here (no pickle), batch reads of boxes, raw
 *             records, values.
 * Errors are raised through the factory dcp_torch registers
 * (_set_error_factory): factory(code, name, message) -> exception.
 */
#define Py_LIMITED_API 0x030A0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dcp/dcp.h"
#include "dcp/dcp_comm.h"
#include "dcp/dcp_convert.h"
#include "dcp/dcp_manager.h"
#include "dcp/dcp_parts.h"

static PyObject *err_factory; /* callable(code, name, message) */

static PyObject *raise_code(int code, const char *msg)
{
    PyObject *exc;
    if (!msg || !*msg)
        msg = dcp_strerror(code);
    if (!err_factory) {
        PyErr_Format(PyExc_RuntimeError, "dcp error %d (%s): %s", code,
                     dcp_err_name(code), msg);
        return NULL;
    }
    exc = PyObject_CallFunction(err_factory, "iss", code, dcp_err_name(code),
                                msg);
    if (!exc)
        return NULL;
    PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
    Py_DECREF(exc);
    return NULL;
}

static PyObject *set_error_factory(PyObject *self, PyObject *fn)
{
    (void)self;
    if (!PyCallable_Check(fn)) {
        PyErr_SetString(PyExc_TypeError, "factory must be callable");
        return NULL;
    }
    Py_INCREF(fn);
    Py_XDECREF(err_factory);
    err_factory = fn;
    Py_RETURN_NONE;
}


/* ------------------------------------------- communicator over Python */

/*
 * dcp's communicator (dcp_comm.h, ops version 2) over a Python object,
 * dcp_torch._comm.TorchComm, which runs each collective on the caller's
 * torch.distributed process group with byte tensors. dcp calls these on
 * the thread that called dcp_save / dcp_load / dcp_request_wait, with the
 * GIL released: each takes the GIL for the Python call. A Python
 * exception is a transport failure (DCP_EIO; a timeout DCP_ETIMEOUT),
 * its text kept for the error raised afterwards. One that is not an
 * Exception (KeyboardInterrupt from a signal handler run during the
 * collective's Python code, SystemExit) is kept itself and raised instead
 * of dcp's error when the engine's call returns: never swallowed.
 */
struct tcomm {
    PyObject *py;
    int size;
    char err[512];
    PyObject *exc_type, *exc_val, *exc_tb; /* kept BaseException */
};

struct treq {
    PyObject *work;
    void *buf; /* a receive's destination */
    size_t len;
};

static int tc_fail(struct tcomm *c, const char *op)
{
    PyObject *type, *val, *tb, *str = NULL;
    const char *msg = NULL;
    int rc = DCP_EIO;
    PyErr_Fetch(&type, &val, &tb);
    if (type && PyErr_GivenExceptionMatches(type, PyExc_TimeoutError))
        rc = DCP_ETIMEOUT;
    if (val)
        str = PyObject_Str(val);
    if (str)
        msg = PyUnicode_AsUTF8AndSize(str, NULL);
    PyErr_Clear();
    (void)snprintf(c->err, sizeof(c->err), "torch.distributed %s failed: %s",
                   op, msg ? msg : "(no message)");
    Py_XDECREF(str);
    if (type && !PyErr_GivenExceptionMatches(type, PyExc_Exception) &&
        !c->exc_type) {
        c->exc_type = type; /* raised after the call (tc_reraise) */
        c->exc_val = val;
        c->exc_tb = tb;
        return rc;
    }
    Py_XDECREF(type);
    Py_XDECREF(val);
    Py_XDECREF(tb);
    return rc;
}

/* The BaseException a collective's Python code raised (tc_fail), set as
 * the current exception: 1, or 0 when there is none. Clears the
 * communicator's message too (the exception replaces dcp's error). */
static int tc_reraise(struct tcomm *c)
{
    if (!c || !c->exc_type)
        return 0;
    PyErr_Restore(c->exc_type, c->exc_val, c->exc_tb);
    c->exc_type = c->exc_val = c->exc_tb = NULL;
    c->err[0] = '\0';
    return 1;
}

/* Copies bytes object r (exactly len bytes) into buf. */
static int tc_take(struct tcomm *c, const char *op, PyObject *r, void *buf,
                   size_t len)
{
    char *p;
    Py_ssize_t n;
    if (!r)
        return tc_fail(c, op);
    if (PyBytes_AsStringAndSize(r, &p, &n) < 0) {
        Py_DECREF(r);
        return tc_fail(c, op);
    }
    if ((size_t)n != len) {
        Py_DECREF(r);
        (void)snprintf(c->err, sizeof(c->err),
                       "torch.distributed %s: %zd bytes where %zu were due",
                       op, n, len);
        return DCP_EIO;
    }
    if (len)
        memcpy(buf, p, len);
    Py_DECREF(r);
    return DCP_OK;
}

static int tc_bcast(void *impl, void *buf, size_t len, int root)
{
    struct tcomm *c = impl;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *r = PyObject_CallMethod(c->py, "bcast", "y#i", (char *)buf,
                                      (Py_ssize_t)len, root);
    int rc = tc_take(c, "broadcast", r, buf, len);
    PyGILState_Release(g);
    return rc;
}

static int tc_gather(void *impl, const void *send, size_t len, void *recv,
                     int root)
{
    struct tcomm *c = impl;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *r = PyObject_CallMethod(c->py, "gather", "y#i",
                                      (const char *)send, (Py_ssize_t)len,
                                      root);
    int rc;
    if (r && r != Py_None && recv) { /* the root's (others get None) */
        rc = tc_take(c, "gather", r, recv, len * (size_t)c->size);
    } else {
        rc = r ? DCP_OK : tc_fail(c, "gather");
        Py_XDECREF(r);
    }
    PyGILState_Release(g);
    return rc;
}

static int tc_gatherv(void *impl, const void *send, size_t len, void *recv,
                      const size_t *lens, const size_t *displs, int root)
{
    struct tcomm *c = impl;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *r = PyObject_CallMethod(c->py, "gatherv", "y#i",
                                      (const char *)send, (Py_ssize_t)len,
                                      root);
    int rc = r ? DCP_OK : tc_fail(c, "gatherv");
    if (r && r != Py_None && recv) { /* the root's (others get None) */
        Py_ssize_t i, n = PyList_Check(r) ? PyList_Size(r) : -1;
        for (i = 0; rc == DCP_OK && i < n; i++) {
            char *p;
            Py_ssize_t m;
            if (PyBytes_AsStringAndSize(PyList_GetItem(r, i), &p, &m) < 0) {
                rc = tc_fail(c, "gatherv");
            } else if ((size_t)m != lens[i]) {
                (void)snprintf(c->err, sizeof(c->err),
                               "gatherv: rank %zd sent %zd bytes, %zu due", i,
                               m, lens[i]);
                rc = DCP_EIO;
            } else if (m) {
                memcpy((char *)recv + displs[i], p, (size_t)m);
            }
        }
        if (n < 0) {
            (void)snprintf(c->err, sizeof(c->err), "gatherv: no list");
            rc = DCP_EIO;
        }
    }
    Py_XDECREF(r);
    PyGILState_Release(g);
    return rc;
}

static int tc_scatterv(void *impl, const void *send, const size_t *lens,
                       const size_t *displs, void *recv, size_t len, int root)
{
    struct tcomm *c = impl;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *lst = Py_None, *r;
    int rc;
    Py_INCREF(Py_None);
    if (send) {
        long i, n = c->size;
        Py_DECREF(lst);
        lst = PyList_New(n);
        for (i = 0; lst && i < n; i++) {
            PyObject *b = PyBytes_FromStringAndSize((const char *)send +
                                                        displs[i],
                                                    (Py_ssize_t)lens[i]);
            if (!b) {
                Py_CLEAR(lst);
                break;
            }
            PyList_SetItem(lst, i, b);
        }
    }
    r = lst ? PyObject_CallMethod(c->py, "scatterv", "Oni", lst,
                                  (Py_ssize_t)len, root)
            : NULL;
    Py_XDECREF(lst);
    rc = tc_take(c, "scatterv", r, recv, len);
    PyGILState_Release(g);
    return rc;
}

static int tc_allreduce_min(void *impl, int64_t *vals, size_t n)
{
    struct tcomm *c = impl;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *lst = PyList_New((Py_ssize_t)n), *r = NULL;
    size_t i;
    int rc = DCP_OK;
    for (i = 0; lst && i < n; i++)
        PyList_SetItem(lst, (Py_ssize_t)i, PyLong_FromLongLong(vals[i]));
    if (lst)
        r = PyObject_CallMethod(c->py, "allreduce_min", "O", lst);
    Py_XDECREF(lst);
    if (!r || !PyList_Check(r) || PyList_Size(r) != (Py_ssize_t)n)
        rc = r ? DCP_EIO : tc_fail(c, "allreduce");
    for (i = 0; rc == DCP_OK && i < n; i++)
        vals[i] = PyLong_AsLongLong(PyList_GetItem(r, (Py_ssize_t)i));
    Py_XDECREF(r);
    PyGILState_Release(g);
    return rc;
}

static int tc_barrier(void *impl)
{
    struct tcomm *c = impl;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *r = PyObject_CallMethod(c->py, "barrier", NULL);
    int rc = r ? DCP_OK : tc_fail(c, "barrier");
    Py_XDECREF(r);
    PyGILState_Release(g);
    return rc;
}

static void tc_destroy(void *impl)
{
    struct tcomm *c = impl;
    PyGILState_STATE g = PyGILState_Ensure();
    Py_XDECREF(c->py);
    Py_XDECREF(c->exc_type);
    Py_XDECREF(c->exc_val);
    Py_XDECREF(c->exc_tb);
    PyGILState_Release(g);
    free(c);
}

static int tc_start(struct tcomm *c, PyObject *work, void *buf, size_t len,
                    void **req, const char *op)
{
    struct treq *q;
    if (!work)
        return tc_fail(c, op);
    q = malloc(sizeof(*q));
    if (!q) {
        Py_DECREF(work);
        return DCP_ENOMEM;
    }
    q->work = work;
    q->buf = buf;
    q->len = len;
    *req = q;
    return DCP_OK;
}

static int tc_isend(void *impl, const void *buf, size_t len, int peer, int tag,
                    void **req)
{
    struct tcomm *c = impl;
    PyGILState_STATE g = PyGILState_Ensure();
    int rc = tc_start(c, PyObject_CallMethod(c->py, "isend", "y#ii",
                                             (const char *)buf,
                                             (Py_ssize_t)len, peer, tag),
                      NULL, 0, req, "isend");
    PyGILState_Release(g);
    return rc;
}

static int tc_irecv(void *impl, void *buf, size_t len, int peer, int tag,
                    void **req)
{
    struct tcomm *c = impl;
    PyGILState_STATE g = PyGILState_Ensure();
    int rc = tc_start(c, PyObject_CallMethod(c->py, "irecv", "nii",
                                             (Py_ssize_t)len, peer, tag),
                      buf, len, req, "irecv");
    PyGILState_Release(g);
    return rc;
}

static int tc_waitany(void *impl, void **reqs, size_t n, size_t *index)
{
    struct tcomm *c = impl;
    PyGILState_STATE g = PyGILState_Ensure();
    PyObject *lst = PyList_New((Py_ssize_t)n), *r = NULL;
    size_t i;
    Py_ssize_t k = -1;
    int rc = DCP_OK;
    for (i = 0; lst && i < n; i++) {
        PyObject *w = reqs[i] ? ((struct treq *)reqs[i])->work : Py_None;
        Py_INCREF(w);
        PyList_SetItem(lst, (Py_ssize_t)i, w);
    }
    if (lst)
        r = PyObject_CallMethod(c->py, "waitany", "O", lst);
    Py_XDECREF(lst);
    if (!r) {
        rc = tc_fail(c, "wait");
    } else {
        k = PyLong_AsSsize_t(r);
        Py_DECREF(r);
        if (k < 0 || (size_t)k >= n || !reqs[k]) {
            (void)snprintf(c->err, sizeof(c->err), "waitany: bad index");
            rc = DCP_EIO;
        }
    }
    if (rc == DCP_OK) {
        struct treq *q = reqs[k];
        if (q->buf)
            rc = tc_take(c, "irecv",
                         PyObject_CallMethod(c->py, "received", "O", q->work),
                         q->buf, q->len);
        Py_DECREF(q->work);
        free(q);
        reqs[k] = NULL;
        *index = (size_t)k;
    }
    PyGILState_Release(g);
    return rc;
}

static void tc_cancel(void *impl, void *req)
{
    struct treq *q = req;
    PyGILState_STATE g = PyGILState_Ensure();
    (void)impl;
    Py_XDECREF(q->work);
    PyGILState_Release(g);
    free(q);
}

static const struct dcp_comm_ops tc_ops = {
    DCP_COMM_OPS_VERSION, tc_bcast,   tc_gather,       tc_gatherv,
    tc_scatterv,          tc_allreduce_min, tc_barrier, tc_destroy,
    tc_isend,             tc_irecv,   tc_waitany,      tc_cancel,
    0};

/* ------------------------------------------------------------ Context */

typedef struct {
    PyObject_HEAD
    dcp_ctx *ctx;
    PyThread_type_lock lock;
    dcp_comm *comm;     /* owned; NULL: one process */
    struct tcomm *tc;   /* its implementation (owned by comm) */
} CtxObject;

static PyTypeObject *CtxType, *PartSaveType, *MetaType;

/* The context's lock taken with the GIL released (another thread may
 * hold it for a long I/O call). */
static void ctx_enter(CtxObject *c)
{
    if (!PyThread_acquire_lock(c->lock, NOWAIT_LOCK)) {
        Py_BEGIN_ALLOW_THREADS
        PyThread_acquire_lock(c->lock, WAIT_LOCK);
        Py_END_ALLOW_THREADS
    }
}

static void ctx_leave(CtxObject *c)
{
    PyThread_release_lock(c->lock);
}

/* Raises the context's error for code (its message copied under the
 * lock: call before ctx_leave), with the communicator's failure if any. */
static PyObject *ctx_raise(CtxObject *c, int code)
{
    if (tc_reraise(c->tc))
        return NULL;
    if (c->tc && c->tc->err[0]) {
        char msg[1536];
        (void)snprintf(msg, sizeof(msg), "%s (%s)", dcp_errmsg(c->ctx),
                       c->tc->err);
        c->tc->err[0] = '\0';
        return raise_code(code, msg);
    }
    return raise_code(code, dcp_errmsg(c->ctx));
}

/* After a call into libdcp under the context's lock: releases the lock,
 * raising the context's error first when rc is not DCP_OK (its message is
 * read under the lock), or the BaseException a collective's Python code
 * raised even when the call succeeded (a KeyboardInterrupt is never
 * lost). Returns 0, or -1 with the exception set. */
static int ctx_done(CtxObject *c, int rc)
{
    int failed = rc != DCP_OK || (c->tc && c->tc->exc_type);
    if (failed)
        ctx_raise(c, rc);
    ctx_leave(c);
    return failed ? -1 : 0;
}

static PyObject *Ctx_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"io_depth",     "io_block_bytes", "direct",
                             "uring",        "max_metadata_bytes",
                             "max_value_bytes", "staging_budget", "comm",
                             "rank", "size", "worker_nice", NULL};
    PyObject *pycomm = Py_None;
    int rank = 0, size = 1, nice = 0;
    unsigned int depth = 0, block = 0;
    int direct = 1, uring = 1;
    unsigned long long maxmd = 0, maxval = 0, budget = 0;
    dcp_ctx_options o;
    CtxObject *c;
    int rc;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|IIppKKKOiii", kwlist, &depth,
                                     &block, &direct, &uring, &maxmd, &maxval,
                                     &budget, &pycomm, &rank, &size, &nice))
        return NULL;
    memset(&o, 0, sizeof(o));
    o.struct_size = sizeof(o);
    o.io_depth = depth;
    o.io_block_bytes = block;
    o.io_flags = (direct ? 0u : (unsigned)DCP_IO_NO_DIRECT) |
                 (uring ? 0u : (unsigned)DCP_IO_NO_URING);
    o.max_metadata_bytes = maxmd;
    o.max_value_bytes = maxval;
    o.staging_budget = budget;
    o.worker_nice = nice;
    c = (CtxObject *)PyType_GenericAlloc(type, 0);
    if (!c)
        return NULL;
    c->lock = PyThread_allocate_lock();
    if (!c->lock) {
        Py_DECREF(c);
        return PyErr_NoMemory();
    }
    if (pycomm != Py_None) {
        c->tc = calloc(1, sizeof(*c->tc));
        if (!c->tc) {
            Py_DECREF(c);
            return PyErr_NoMemory();
        }
        Py_INCREF(pycomm);
        c->tc->py = pycomm;
        c->tc->size = size;
        rc = dcp_comm_create(&tc_ops, c->tc, rank, size, &c->comm);
        if (rc != DCP_OK) {
            Py_DECREF(pycomm);
            free(c->tc);
            c->tc = NULL;
            Py_DECREF(c);
            return raise_code(rc, "cannot make the communicator (rank, size?)");
        }
    }
    rc = dcp_ctx_create(&c->ctx, c->comm, &o);
    if (rc != DCP_OK) {
        Py_DECREF(c);
        return raise_code(rc, "cannot create a dcp context (bad options?)");
    }
    return (PyObject *)c;
}

static void Ctx_dealloc(PyObject *self)
{
    CtxObject *c = (CtxObject *)self;
    PyTypeObject *tp = Py_TYPE(self);
    if (c->ctx)
        dcp_ctx_free(c->ctx);
    if (c->comm)
        dcp_comm_free(c->comm); /* destroys c->tc, taking the GIL */
    if (c->lock)
        PyThread_free_lock(c->lock);
    ((freefunc)PyType_GetSlot(tp, Py_tp_free))(self);
    Py_DECREF(tp);
}

static int get_path(PyObject *o, PyObject **bytes)
{
    *bytes = NULL;
    return PyUnicode_FSConverter(o, bytes);
}

/* verify(path) */
static PyObject *Ctx_verify(PyObject *self, PyObject *arg)
{
    CtxObject *c = (CtxObject *)self;
    PyObject *p;
    int rc;
    if (!get_path(arg, &p))
        return NULL;
    ctx_enter(c);
    Py_BEGIN_ALLOW_THREADS
    rc = dcp_verify(c->ctx, PyBytes_AsString(p));
    Py_END_ALLOW_THREADS
    Py_DECREF(p);
    if (ctx_done(c, rc) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* clean(path, force) -> (files, bytes) */
static PyObject *Ctx_clean(PyObject *self, PyObject *args)
{
    CtxObject *c = (CtxObject *)self;
    PyObject *po, *p;
    int force = 0, rc;
    dcp_clean_result res;
    if (!PyArg_ParseTuple(args, "O|p", &po, &force) || !get_path(po, &p))
        return NULL;
    memset(&res, 0, sizeof(res));
    res.struct_size = sizeof(res);
    ctx_enter(c);
    Py_BEGIN_ALLOW_THREADS
    rc = dcp_clean(c->ctx, PyBytes_AsString(p), force ? DCP_CLEAN_FORCE : 0,
                   &res);
    Py_END_ALLOW_THREADS
    Py_DECREF(p);
    if (ctx_done(c, rc) < 0)
        return NULL;
    return Py_BuildValue("(KK)", (unsigned long long)res.files,
                         (unsigned long long)res.bytes);
}

/* convert(direction, src, dst, format, dtype, max_shard_bytes, keys,
 *         strip_prefix, add_prefix, mem_limit, flags) -> dict */
static PyObject *Ctx_convert(PyObject *self, PyObject *args)
{
    CtxObject *c = (CtxObject *)self;
    PyObject *so, *dso, *s = NULL, *d = NULL, *keys, *out = NULL;
    const char *strip = NULL, *add = NULL;
    int exp, format, dtype, rc;
    unsigned int flags;
    unsigned long long shard, mem;
    const char **kv = NULL;
    Py_ssize_t nk = 0, i;
    dcp_convert_options o;
    dcp_convert_result res;
    if (!PyArg_ParseTuple(args, "pOOiiKOzzKI", &exp, &so, &dso, &format,
                          &dtype, &shard, &keys, &strip, &add, &mem, &flags))
        return NULL;
    if (!get_path(so, &s) || !get_path(dso, &d))
        goto done;
    if (keys != Py_None) {
        nk = PyList_Size(keys);
        if (nk < 0)
            goto done;
        kv = PyMem_Calloc((size_t)(nk ? nk : 1), sizeof(*kv));
        if (!kv) {
            PyErr_NoMemory();
            goto done;
        }
        for (i = 0; i < nk; i++) {
            kv[i] = PyUnicode_AsUTF8AndSize(PyList_GetItem(keys, i), NULL);
            if (!kv[i])
                goto done;
        }
    }
    memset(&o, 0, sizeof(o));
    o.struct_size = sizeof(o);
    o.format = format;
    o.flags = flags;
    o.dtype = (dcp_dtype)dtype;
    o.max_shard_bytes = shard;
    o.keys = kv;
    o.nkeys = (size_t)nk;
    o.strip_prefix = strip;
    o.add_prefix = add;
    o.mem_limit = mem;
    memset(&res, 0, sizeof(res));
    res.struct_size = sizeof(res);
    ctx_enter(c);
    Py_BEGIN_ALLOW_THREADS
    if (exp)
        rc = dcp_export(c->ctx, PyBytes_AsString(s), PyBytes_AsString(d), &o,
                        &res);
    else
        rc = dcp_import(c->ctx, PyBytes_AsString(s), PyBytes_AsString(d), &o,
                        &res);
    Py_END_ALLOW_THREADS
    if (ctx_done(c, rc) == 0)
        out = Py_BuildValue("{s:n,s:n,s:n,s:n,s:n,s:n,s:K}", "tensors",
                            (Py_ssize_t)res.tensors, "values",
                            (Py_ssize_t)res.values, "skipped",
                            (Py_ssize_t)res.skipped, "cast",
                            (Py_ssize_t)res.cast, "kept",
                            (Py_ssize_t)res.kept, "files",
                            (Py_ssize_t)res.files, "bytes",
                            (unsigned long long)res.bytes);
done:
    PyMem_Free(kv);
    Py_XDECREF(s);
    Py_XDECREF(d);
    return out;
}

/* Sizes from a sequence of ints. */
static int get_sizes(PyObject *seq, int64_t *out, int *ndim)
{
    PyObject *t = PySequence_Tuple(seq);
    Py_ssize_t n, i;
    if (!t)
        return 0;
    n = PyTuple_Size(t);
    if (n > DCP_MAX_NDIM) {
        Py_DECREF(t);
        PyErr_Format(PyExc_ValueError, "%zd dimensions: dcp holds at most %d",
                     n, DCP_MAX_NDIM);
        return 0;
    }
    for (i = 0; i < n; i++) {
        out[i] = PyLong_AsLongLong(PyTuple_GetItem(t, i));
        if (out[i] == -1 && PyErr_Occurred()) {
            Py_DECREF(t);
            return 0;
        }
    }
    *ndim = (int)n;
    Py_DECREF(t);
    return 1;
}

/* One record of write_file: a tensor (pointer) or bytes (buffer). */
struct witem {
    int is_bytes;
    dcp_dtype dtype;
    int ndim;
    int64_t sizes[DCP_MAX_NDIM];
    const void *data;
    uint64_t nbytes;
    uint64_t off, len;
};

/*
 * write_file(path, name, save_id, items, sync) -> [(offset, length), ...]
 * items: (0, dtype, sizes, data_ptr, nbytes) for a tensor whose memory the
 * caller keeps alive and unchanged during the call; (1, bytes) for bytes.
 */
static PyObject *Ctx_write_file(PyObject *self, PyObject *args)
{
    CtxObject *c = (CtxObject *)self;
    PyObject *po, *p = NULL, *items, *out = NULL;
    const char *name, *sid;
    int sync, rc = DCP_OK, crc;
    Py_ssize_t n, i;
    struct witem *w = NULL;
    uint64_t hint = 0;
    dcp_part_file *f = NULL;
    if (!PyArg_ParseTuple(args, "OszO!p", &po, &name, &sid, &PyList_Type,
                          &items, &sync) ||
        !get_path(po, &p))
        return NULL;
    n = PyList_Size(items);
    w = PyMem_Calloc((size_t)(n ? n : 1), sizeof(*w));
    if (!w) {
        PyErr_NoMemory();
        goto done;
    }
    for (i = 0; i < n; i++) {
        PyObject *it = PyList_GetItem(items, i), *kind;
        if (!PyTuple_Check(it) || PyTuple_Size(it) < 2) {
            PyErr_SetString(PyExc_TypeError, "bad write item");
            goto done;
        }
        kind = PyTuple_GetItem(it, 0);
        w[i].is_bytes = (int)PyLong_AsLong(kind);
        if (w[i].is_bytes) {
            char *b;
            Py_ssize_t blen;
            if (PyBytes_AsStringAndSize(PyTuple_GetItem(it, 1), &b, &blen) < 0)
                goto done;
            w[i].data = b;
            w[i].nbytes = (uint64_t)blen;
        } else {
            if (PyTuple_Size(it) != 5) {
                PyErr_SetString(PyExc_TypeError, "bad tensor write item");
                goto done;
            }
            w[i].dtype = (dcp_dtype)PyLong_AsLong(PyTuple_GetItem(it, 1));
            if (!get_sizes(PyTuple_GetItem(it, 2), w[i].sizes, &w[i].ndim))
                goto done;
            w[i].data = PyLong_AsVoidPtr(PyTuple_GetItem(it, 3));
            w[i].nbytes = PyLong_AsUnsignedLongLong(PyTuple_GetItem(it, 4));
            if (PyErr_Occurred())
                goto done;
        }
        hint += dcp_part_record_bound(w[i].nbytes);
    }
    ctx_enter(c);
    Py_BEGIN_ALLOW_THREADS
    rc = dcp_part_file_open(c->ctx, PyBytes_AsString(p), name, sid, hint, &f);
    for (i = 0; rc == DCP_OK && i < n; i++) {
        if (w[i].is_bytes)
            rc = dcp_part_file_bytes(f, w[i].data, (size_t)w[i].nbytes,
                                     &w[i].off, &w[i].len);
        else
            rc = dcp_part_file_tensor(f, w[i].dtype, w[i].ndim, w[i].sizes,
                                      w[i].data, w[i].nbytes, &w[i].off,
                                      &w[i].len);
    }
    if (f) {
        crc = dcp_part_file_close(f, sync ? DCP_PART_SYNC : 0);
        if (rc == DCP_OK)
            rc = crc;
    }
    Py_END_ALLOW_THREADS
    if (ctx_done(c, rc) < 0)
        goto done;
    out = PyList_New(n);
    for (i = 0; out && i < n; i++) {
        PyObject *t = Py_BuildValue("(KK)", (unsigned long long)w[i].off,
                                    (unsigned long long)w[i].len);
        if (!t) {
            Py_CLEAR(out);
            break;
        }
        PyList_SetItem(out, i, t);
    }
done:
    PyMem_Free(w);
    Py_XDECREF(p);
    return out;
}

/* ------------------------------------------------------------ PartSave */

typedef struct {
    PyObject_HEAD
    CtxObject *c;
    dcp_part_save *s;
} PartSaveObject;

/* part_save_begin(path, flags) -> PartSave */
static PyObject *Ctx_part_save_begin(PyObject *self, PyObject *args)
{
    CtxObject *c = (CtxObject *)self;
    PyObject *po, *p;
    unsigned int flags = 0;
    dcp_part_save *s = NULL;
    PartSaveObject *o;
    int rc;
    if (!PyArg_ParseTuple(args, "O|I", &po, &flags) || !get_path(po, &p))
        return NULL;
    ctx_enter(c);
    Py_BEGIN_ALLOW_THREADS
    rc = dcp_part_save_begin(c->ctx, PyBytes_AsString(p), flags, &s);
    Py_END_ALLOW_THREADS
    Py_DECREF(p);
    if (ctx_done(c, rc) < 0)
        return NULL;
    o = (PartSaveObject *)PyType_GenericAlloc(PartSaveType, 0);
    if (!o) {
        dcp_part_save_free(s);
        return NULL;
    }
    Py_INCREF(c);
    o->c = c;
    o->s = s;
    return (PyObject *)o;
}

static void PartSave_dealloc(PyObject *self)
{
    PartSaveObject *o = (PartSaveObject *)self;
    PyTypeObject *tp = Py_TYPE(self);
    if (o->s) {
        ctx_enter(o->c);
        dcp_part_save_free(o->s);
        ctx_leave(o->c);
    }
    Py_XDECREF(o->c);
    ((freefunc)PyType_GetSlot(tp, Py_tp_free))(self);
    Py_DECREF(tp);
}

static PyObject *PartSave_info(PyObject *self, PyObject *unused)
{
    PartSaveObject *o = (PartSaveObject *)self;
    (void)unused;
    if (!o->s) {
        PyErr_SetString(PyExc_ValueError, "save closed");
        return NULL;
    }
    return Py_BuildValue("(ssO)", dcp_part_save_id(o->s),
                         dcp_part_save_tag(o->s),
                         dcp_part_save_had_checkpoint(o->s) ? Py_True
                                                            : Py_False);
}

/* commit(name or None, metadata bytes, sync) */
static PyObject *PartSave_commit(PyObject *self, PyObject *args)
{
    PartSaveObject *o = (PartSaveObject *)self;
    const char *name;
    PyObject *md;
    char *b;
    Py_ssize_t blen;
    int sync, rc;
    if (!PyArg_ParseTuple(args, "zO!p", &name, &PyBytes_Type, &md, &sync))
        return NULL;
    if (!o->s) {
        PyErr_SetString(PyExc_ValueError, "save closed");
        return NULL;
    }
    if (PyBytes_AsStringAndSize(md, &b, &blen) < 0)
        return NULL;
    ctx_enter(o->c);
    Py_BEGIN_ALLOW_THREADS
    rc = dcp_part_save_commit(o->s, name, b, (size_t)blen, sync);
    Py_END_ALLOW_THREADS
    if (ctx_done(o->c, rc) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* close(): frees the save (releases the lock when not committed). */
static PyObject *PartSave_close(PyObject *self, PyObject *unused)
{
    PartSaveObject *o = (PartSaveObject *)self;
    (void)unused;
    if (o->s) {
        ctx_enter(o->c);
        Py_BEGIN_ALLOW_THREADS
        dcp_part_save_free(o->s);
        Py_END_ALLOW_THREADS
        ctx_leave(o->c);
        o->s = NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef PartSave_methods[] = {
    {"info", PartSave_info, METH_NOARGS, "(save_id, tag, had_checkpoint)"},
    {"commit", PartSave_commit, METH_VARARGS, "commit(name, metadata, sync)"},
    {"close", PartSave_close, METH_NOARGS, "release without committing"},
    {NULL, NULL, 0, NULL}};

static PyType_Slot PartSave_slots[] = {
    {Py_tp_dealloc, (void *)PartSave_dealloc},
    {Py_tp_methods, PartSave_methods},
    {Py_tp_doc, (void *)"A save planned elsewhere (dcp_part_save)."},
    {0, NULL}};

static PyType_Spec PartSave_spec = {"dcp_torch._C.PartSave",
                                    sizeof(PartSaveObject), 0,
                                    Py_TPFLAGS_DEFAULT, PartSave_slots};

/* ---------------------------------------------------------------- Meta */

typedef struct {
    PyObject_HEAD
    CtxObject *c;
    dcp_metadata *md;
} MetaObject;

static PyObject *Ctx_metadata_open(PyObject *self, PyObject *arg)
{
    CtxObject *c = (CtxObject *)self;
    PyObject *p;
    dcp_metadata *md = NULL;
    MetaObject *o;
    int rc;
    if (!get_path(arg, &p))
        return NULL;
    ctx_enter(c);
    Py_BEGIN_ALLOW_THREADS
    rc = dcp_metadata_open(c->ctx, PyBytes_AsString(p), &md);
    Py_END_ALLOW_THREADS
    Py_DECREF(p);
    if (ctx_done(c, rc) < 0)
        return NULL;
    o = (MetaObject *)PyType_GenericAlloc(MetaType, 0);
    if (!o) {
        dcp_metadata_free(md);
        return NULL;
    }
    Py_INCREF(c);
    o->c = c;
    o->md = md;
    return (PyObject *)o;
}

static void Meta_dealloc(PyObject *self)
{
    MetaObject *o = (MetaObject *)self;
    PyTypeObject *tp = Py_TYPE(self);
    dcp_metadata_free(o->md);
    Py_XDECREF(o->c);
    ((freefunc)PyType_GetSlot(tp, Py_tp_free))(self);
    Py_DECREF(tp);
}

static PyObject *ints_tuple(int n, const int64_t *v)
{
    PyObject *t = PyTuple_New(n);
    int i;
    for (i = 0; t && i < n; i++) {
        PyObject *x = PyLong_FromLongLong(v[i]);
        if (!x) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SetItem(t, i, x);
    }
    return t;
}

static PyObject *path_tuple(const dcp_metadata *md, size_t k, size_t n)
{
    PyObject *t = PyTuple_New((Py_ssize_t)n);
    size_t i;
    for (i = 0; t && i < n; i++) {
        const char *s = NULL;
        int64_t num = 0;
        PyObject *x;
        (void)dcp_metadata_path(md, k, i, &s, &num);
        x = s ? PyUnicode_FromString(s) : PyLong_FromLongLong(num);
        if (!x) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SetItem(t, (Py_ssize_t)i, x);
    }
    return t;
}

/* info() -> (version, save_id, count) */
static PyObject *Meta_info(PyObject *self, PyObject *unused)
{
    MetaObject *o = (MetaObject *)self;
    (void)unused;
    return Py_BuildValue("(ssn)", dcp_metadata_version(o->md),
                         dcp_metadata_save_id(o->md),
                         (Py_ssize_t)dcp_metadata_count(o->md));
}

/* entries() -> [(key, is_tensor, dtype_name, shape, nchunks, nbytes,
 *               path or None)] */
static PyObject *Meta_entries(PyObject *self, PyObject *unused)
{
    MetaObject *o = (MetaObject *)self;
    size_t n = dcp_metadata_count(o->md), k;
    PyObject *out = PyList_New((Py_ssize_t)n);
    (void)unused;
    for (k = 0; out && k < n; k++) {
        dcp_entry_info e;
        PyObject *shape, *path, *t;
        (void)dcp_metadata_entry(o->md, k, &e);
        shape = ints_tuple(e.is_tensor ? e.ndim : 0, e.shape);
        path = e.npath ? path_tuple(o->md, k, e.npath)
                       : (Py_INCREF(Py_None), Py_None);
        t = (shape && path)
                ? Py_BuildValue("(sOsOnKO)", e.key,
                                e.is_tensor ? Py_True : Py_False,
                                e.is_tensor ? dcp_dtype_name(e.dtype) : "",
                                shape, (Py_ssize_t)e.nchunks,
                                (unsigned long long)e.nbytes, path)
                : NULL;
        Py_XDECREF(shape);
        Py_XDECREF(path);
        if (!t) {
            Py_CLEAR(out);
            break;
        }
        PyList_SetItem(out, (Py_ssize_t)k, t);
    }
    return out;
}

/* chunks(index) -> [(offsets, sizes, file, offset, length)] */
static PyObject *Meta_chunks(PyObject *self, PyObject *arg)
{
    MetaObject *o = (MetaObject *)self;
    Py_ssize_t k = PyLong_AsSsize_t(arg);
    dcp_entry_info e;
    PyObject *out;
    size_t j;
    if (k < 0 || dcp_metadata_entry(o->md, (size_t)k, &e) != DCP_OK) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_IndexError, "no such entry");
        return NULL;
    }
    out = PyList_New((Py_ssize_t)e.nchunks);
    for (j = 0; out && j < e.nchunks; j++) {
        dcp_chunk_info ci;
        PyObject *off, *sz, *t;
        (void)dcp_metadata_chunk(o->md, (size_t)k, j, &ci);
        off = e.is_tensor ? ints_tuple(e.ndim, ci.offsets)
                          : (Py_INCREF(Py_None), Py_None);
        sz = e.is_tensor ? ints_tuple(e.ndim, ci.sizes)
                         : (Py_INCREF(Py_None), Py_None);
        t = (off && sz) ? Py_BuildValue("(OOsKK)", off, sz, ci.file,
                                        (unsigned long long)ci.offset,
                                        (unsigned long long)ci.length)
                        : NULL;
        Py_XDECREF(off);
        Py_XDECREF(sz);
        if (!t) {
            Py_CLEAR(out);
            break;
        }
        PyList_SetItem(out, (Py_ssize_t)j, t);
    }
    return out;
}

/* An instance of cls without calling __init__, its fields set through the
 * generic setattr (as unpickling does: frozen dataclasses too). */
static PyObject *empty_args;

static PyObject *bare(PyObject *cls)
{
    /* The type's own tp_new (object.__new__ for a dataclass): the
     * instance gets the class's shared-key dict layout, as unpickling's
     * cls.__new__(cls) gives it, not a dict of its own per object. */
    newfunc tpnew = (newfunc)PyType_GetSlot((PyTypeObject *)cls, Py_tp_new);
    return tpnew((PyTypeObject *)cls, empty_args, NULL);
}

static int put(PyObject *obj, PyObject *name, PyObject *val)
{
    int rc;
    if (!val)
        return -1;
    rc = PyObject_GenericSetAttr(obj, name, val);
    Py_DECREF(val);
    return rc;
}

/* Interned attribute names. */
enum {
    A_OFFSETS, A_SIZES, A_PROPERTIES, A_SIZE, A_CHUNKS, A_DTYPE, A_LAYOUT,
    A_REQUIRES_GRAD, A_MEMORY_FORMAT, A_PIN_MEMORY, A_FQN, A_OFFSET,
    A_INDEX, A_RELATIVE_PATH, A_LENGTH, A_TRANSFORM, A_SDM, A_PLANNER_DATA,
    A_STORAGE_DATA, A_STORAGE_META, A_VERSION, A_CHECKPOINT_ID, A_SAVE_ID,
    A_LOAD_ID, A_MODULES, A_COUNT
};
static const char *attr_names[A_COUNT] = {
    "offsets", "sizes", "properties", "size", "chunks", "dtype", "layout",
    "requires_grad", "memory_format", "pin_memory", "fqn", "offset",
    "index", "relative_path", "length", "transform_descriptors",
    "state_dict_metadata", "planner_data", "storage_data", "storage_meta",
    "version", "checkpoint_id", "save_id", "load_id", "modules"};
static PyObject *attr[A_COUNT];

/* torch types, from the dict given to build(): */
struct ttypes {
    PyObject *Metadata, *TSM, *BSM, *CSM, *TP, *MI, *SI, *SM, *Size;
    PyObject *dtypes; /* dict: dtype name -> torch.dtype */
    PyObject *strided, *contiguous;
};

static int get_types(PyObject *d, struct ttypes *t)
{
#define T(field, key)                                                          \
    if (!(t->field = PyDict_GetItemString(d, key))) {                          \
        PyErr_Format(PyExc_KeyError, "torch type '%s' missing", key);          \
        return 0;                                                              \
    }
    T(Metadata, "Metadata")
    T(TSM, "TensorStorageMetadata")
    T(BSM, "BytesStorageMetadata")
    T(CSM, "ChunkStorageMetadata")
    T(TP, "TensorProperties")
    T(MI, "MetadataIndex")
    T(SI, "_StorageInfo")
    T(SM, "StorageMeta")
    T(Size, "Size")
    T(dtypes, "dtypes")
    T(strided, "strided")
    T(contiguous, "contiguous_format")
#undef T
    return 1;
}

static PyObject *make_size(const struct ttypes *t, int n, const int64_t *v)
{
    PyObject *tup = ints_tuple(n, v), *s;
    if (!tup)
        return NULL;
    s = PyObject_CallFunctionObjArgs(t->Size, tup, NULL);
    Py_DECREF(tup);
    return s;
}

static PyObject *make_props(const struct ttypes *t, const char *dtype)
{
    PyObject *p = bare(t->TP), *dt;
    if (!p)
        return NULL;
    dt = PyDict_GetItemString(t->dtypes, dtype);
    if (!dt) {
        Py_DECREF(p);
        return raise_code(DCP_ENOTSUP, "a dtype torch does not name");
    }
    Py_INCREF(dt);
    Py_INCREF(t->strided);
    Py_INCREF(t->contiguous);
    if (put(p, attr[A_DTYPE], dt) < 0 ||
        put(p, attr[A_LAYOUT], t->strided) < 0 ||
        put(p, attr[A_REQUIRES_GRAD], (Py_INCREF(Py_False), Py_False)) < 0 ||
        put(p, attr[A_MEMORY_FORMAT], t->contiguous) < 0 ||
        put(p, attr[A_PIN_MEMORY], (Py_INCREF(Py_False), Py_False)) < 0) {
        Py_DECREF(p);
        return NULL;
    }
    return p;
}

static PyObject *make_sinfo(const struct ttypes *t, const dcp_chunk_info *ci,
                            PyObject *file)
{
    PyObject *s = bare(t->SI);
    if (!s)
        return NULL;
    Py_INCREF(file);
    if (put(s, attr[A_RELATIVE_PATH], file) < 0 ||
        put(s, attr[A_OFFSET],
            PyLong_FromUnsignedLongLong((unsigned long long)ci->offset)) < 0 ||
        put(s, attr[A_LENGTH],
            PyLong_FromUnsignedLongLong((unsigned long long)ci->length)) < 0) {
        Py_DECREF(s);
        return NULL;
    }
    return s;
}

static PyObject *make_index(const struct ttypes *t, PyObject *key,
                            PyObject *offset, Py_ssize_t index)
{
    PyObject *m = bare(t->MI);
    if (!m)
        return NULL;
    if (!offset)
        Py_INCREF(Py_None);
    else
        Py_INCREF(offset);
    Py_INCREF(key);
    if (put(m, attr[A_FQN], key) < 0 ||
        put(m, attr[A_OFFSET], offset ? offset : Py_None) < 0 ||
        put(m, attr[A_INDEX],
            index >= 0 ? PyLong_FromSsize_t(index)
                       : (Py_INCREF(Py_None), Py_None)) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}

/* One entry into sdm, storage and (with a path) planner. */
/* The file name strings, one per file (shared by its chunks). */
static PyObject *file_str(PyObject *files, const char *name)
{
    PyObject *s = PyDict_GetItemString(files, name);
    if (s)
        return s; /* borrowed */
    s = PyUnicode_FromString(name);
    if (!s || PyDict_SetItemString(files, name, s) < 0) {
        Py_XDECREF(s);
        return NULL;
    }
    Py_DECREF(s);
    return s; /* borrowed: the dict holds it */
}

static int build_entry(const struct ttypes *t, const dcp_metadata *md,
                       size_t k, PyObject *sdm, PyObject *storage,
                       PyObject *planner, PyObject *files)
{
    dcp_entry_info e;
    PyObject *key, *sm = NULL;
    size_t j;
    int rc = -1;
    (void)dcp_metadata_entry(md, k, &e);
    key = PyUnicode_FromString(e.key);
    if (!key)
        return -1;
    if (e.npath) {
        PyObject *p = path_tuple(md, k, e.npath);
        if (!p || PyDict_SetItem(planner, key, p) < 0) {
            Py_XDECREF(p);
            goto out;
        }
        Py_DECREF(p);
    }
    if (!e.is_tensor) {
        dcp_chunk_info ci;
        PyObject *mi, *si;
        sm = bare(t->BSM);
        if (!sm || PyDict_SetItem(sdm, key, sm) < 0)
            goto out;
        (void)dcp_metadata_chunk(md, k, 0, &ci);
        mi = make_index(t, key, NULL, -1);
        si = mi && file_str(files, ci.file)
                 ? make_sinfo(t, &ci, file_str(files, ci.file))
                 : NULL;
        if (!si || PyDict_SetItem(storage, mi, si) < 0) {
            Py_XDECREF(mi);
            Py_XDECREF(si);
            goto out;
        }
        Py_DECREF(mi);
        Py_DECREF(si);
        rc = 0;
        goto out;
    } else {
        PyObject *chunks = PyList_New((Py_ssize_t)e.nchunks), *props, *size;
        if (!chunks)
            goto out;
        sm = bare(t->TSM);
        props = sm ? make_props(t, dcp_dtype_name(e.dtype)) : NULL;
        size = props ? make_size(t, e.ndim, e.shape) : NULL;
        if (!size || put(sm, attr[A_PROPERTIES], props) < 0 ||
            put(sm, attr[A_SIZE], size) < 0 ||
            PyObject_GenericSetAttr(sm, attr[A_CHUNKS], chunks) < 0) {
            if (!size) {
                Py_XDECREF(props);
            }
            Py_DECREF(chunks);
            goto out;
        }
        for (j = 0; j < e.nchunks; j++) {
            dcp_chunk_info ci;
            PyObject *c, *off, *sz, *mi, *si;
            (void)dcp_metadata_chunk(md, k, j, &ci);
            c = bare(t->CSM);
            off = c ? make_size(t, e.ndim, ci.offsets) : NULL;
            sz = off ? make_size(t, e.ndim, ci.sizes) : NULL;
            if (!sz) {
                Py_XDECREF(c);
                Py_XDECREF(off);
                Py_DECREF(chunks);
                goto out;
            }
            Py_INCREF(off);
            if (put(c, attr[A_OFFSETS], off) < 0 ||
                put(c, attr[A_SIZES], sz) < 0) {
                Py_DECREF(off);
                Py_DECREF(c);
                Py_DECREF(chunks);
                goto out;
            }
            PyList_SetItem(chunks, (Py_ssize_t)j, c);
            mi = make_index(t, key, off, (Py_ssize_t)j);
            Py_DECREF(off);
            si = mi && file_str(files, ci.file)
                     ? make_sinfo(t, &ci, file_str(files, ci.file))
                     : NULL;
            if (!si || PyDict_SetItem(storage, mi, si) < 0) {
                Py_XDECREF(mi);
                Py_XDECREF(si);
                Py_DECREF(chunks);
                goto out;
            }
            Py_DECREF(mi);
            Py_DECREF(si);
        }
        Py_DECREF(chunks);
        if (PyDict_SetItem(sdm, key, sm) < 0)
            goto out;
    }
    rc = 0;
out:
    Py_XDECREF(sm);
    Py_DECREF(key);
    return rc;
}

/* build(types, checkpoint_id) -> torch Metadata */
static PyObject *Meta_build(PyObject *self, PyObject *args)
{
    MetaObject *o = (MetaObject *)self;
    PyObject *types, *ckid, *m = NULL, *sdm, *storage, *planner, *smeta;
    PyObject *files;
    int gc;
    struct ttypes t;
    size_t k, n = dcp_metadata_count(o->md);
    const char *ver = dcp_metadata_version(o->md);
    const char *sid = dcp_metadata_save_id(o->md);
    if (!PyArg_ParseTuple(args, "O!O", &PyDict_Type, &types, &ckid) ||
        !get_types(types, &t))
        return NULL;
    sdm = PyDict_New();
    storage = PyDict_New();
    planner = PyDict_New();
    files = PyDict_New();
    if (!sdm || !storage || !planner || !files) {
        Py_XDECREF(files);
        goto fail;
    }
    /* Millions of objects, none of them garbage: the cyclic collector
     * would walk them all again and again while they are made (as it
     * does for pickle.load). */
    gc = PyGC_Disable();
    for (k = 0; k < n; k++)
        if (build_entry(&t, o->md, k, sdm, storage, planner, files) < 0)
            break;
    if (gc)
        PyGC_Enable();
    Py_DECREF(files);
    if (k < n)
        goto fail;
    m = bare(t.Metadata);
    smeta = m ? bare(t.SM) : NULL;
    if (!smeta)
        goto fail;
    Py_INCREF(ckid);
    if (put(smeta, attr[A_CHECKPOINT_ID], ckid) < 0 ||
        put(smeta, attr[A_SAVE_ID],
            *sid ? PyUnicode_FromString(sid)
                 : (Py_INCREF(Py_None), Py_None)) < 0 ||
        put(smeta, attr[A_LOAD_ID], (Py_INCREF(Py_None), Py_None)) < 0 ||
        put(smeta, attr[A_MODULES], PyList_New(0)) < 0 ||
        PyObject_GenericSetAttr(m, attr[A_SDM], sdm) < 0 ||
        PyObject_GenericSetAttr(m, attr[A_PLANNER_DATA], planner) < 0 ||
        PyObject_GenericSetAttr(m, attr[A_STORAGE_DATA], storage) < 0 ||
        put(m, attr[A_STORAGE_META], smeta) < 0 ||
        put(m, attr[A_VERSION],
            *ver ? PyUnicode_FromString(ver)
                 : (Py_INCREF(Py_None), Py_None)) < 0)
        goto fail;
    Py_DECREF(sdm);
    Py_DECREF(storage);
    Py_DECREF(planner);
    return m;
fail:
    Py_XDECREF(m);
    Py_XDECREF(sdm);
    Py_XDECREF(storage);
    Py_XDECREF(planner);
    return NULL;
}

/* read_boxes([(index, offsets, sizes, ptr, nbytes)], verify) */
static PyObject *Meta_read_boxes(PyObject *self, PyObject *args)
{
    MetaObject *o = (MetaObject *)self;
    PyObject *reads;
    int verify, rc, nd;
    Py_ssize_t n, i;
    dcp_box_read *r = NULL;
    int64_t *ints = NULL;
    if (!PyArg_ParseTuple(args, "O!p", &PyList_Type, &reads, &verify))
        return NULL;
    n = PyList_Size(reads);
    r = PyMem_Calloc((size_t)(n ? n : 1), sizeof(*r));
    ints = PyMem_Calloc((size_t)(n ? n : 1) * 2 * DCP_MAX_NDIM,
                        sizeof(*ints));
    if (!r || !ints) {
        PyMem_Free(r);
        PyMem_Free(ints);
        return PyErr_NoMemory();
    }
    for (i = 0; i < n; i++) {
        PyObject *it = PyList_GetItem(reads, i);
        int64_t *off = ints + (size_t)i * 2 * DCP_MAX_NDIM;
        int64_t *sz = off + DCP_MAX_NDIM;
        int nd2;
        if (!PyTuple_Check(it) || PyTuple_Size(it) != 5) {
            PyErr_SetString(PyExc_TypeError, "bad read item");
            goto fail;
        }
        r[i].index = (size_t)PyLong_AsSsize_t(PyTuple_GetItem(it, 0));
        if (!get_sizes(PyTuple_GetItem(it, 1), off, &nd) ||
            !get_sizes(PyTuple_GetItem(it, 2), sz, &nd2))
            goto fail;
        if (nd != nd2) {
            PyErr_SetString(PyExc_ValueError, "offsets and sizes differ");
            goto fail;
        }
        r[i].offsets = off;
        r[i].sizes = sz;
        r[i].buf = PyLong_AsVoidPtr(PyTuple_GetItem(it, 3));
        r[i].len = (size_t)PyLong_AsSize_t(PyTuple_GetItem(it, 4));
        if (PyErr_Occurred())
            goto fail;
    }
    ctx_enter(o->c);
    Py_BEGIN_ALLOW_THREADS
    rc = dcp_metadata_read_boxes(o->c->ctx, o->md, r, (size_t)n, verify);
    Py_END_ALLOW_THREADS
    if (ctx_done(o->c, rc) < 0)
        goto fail;
    PyMem_Free(r);
    PyMem_Free(ints);
    Py_RETURN_NONE;
fail:
    PyMem_Free(r);
    PyMem_Free(ints);
    return NULL;
}

/* read_record(index, chunk) -> bytes */
static PyObject *Meta_read_record(PyObject *self, PyObject *args)
{
    MetaObject *o = (MetaObject *)self;
    Py_ssize_t k, j;
    uint8_t *buf = NULL;
    size_t len = 0;
    PyObject *out;
    int rc;
    if (!PyArg_ParseTuple(args, "nn", &k, &j))
        return NULL;
    if (k < 0 || j < 0) {
        PyErr_SetString(PyExc_IndexError, "no such record");
        return NULL;
    }
    ctx_enter(o->c);
    Py_BEGIN_ALLOW_THREADS
    rc = dcp_metadata_read_record(o->c->ctx, o->md, (size_t)k, (size_t)j,
                                  &buf, &len);
    Py_END_ALLOW_THREADS
    if (ctx_done(o->c, rc) < 0)
        return NULL;
    out = PyBytes_FromStringAndSize((const char *)buf, (Py_ssize_t)len);
    dcp_free(buf);
    return out;
}

static PyObject *value_to_py(const dcp_value *v, int depth)
{
    size_t n, i, len;
    PyObject *out;
    const char *s;
    if (depth > 200) {
        PyErr_SetString(PyExc_RecursionError, "value nested too deeply");
        return NULL;
    }
    switch (dcp_value_type_of(v)) {
    case DCP_VALUE_NONE:
        Py_RETURN_NONE;
    case DCP_VALUE_BOOL:
        return PyBool_FromLong(dcp_value_as_bool(v));
    case DCP_VALUE_INT:
        return PyLong_FromLongLong(dcp_value_as_int(v));
    case DCP_VALUE_FLOAT:
        return PyFloat_FromDouble(dcp_value_as_float(v));
    case DCP_VALUE_STR:
        s = dcp_value_as_str(v, &len);
        return PyUnicode_FromStringAndSize(s, (Py_ssize_t)len);
    case DCP_VALUE_BYTES:
        s = dcp_value_as_bytes(v, &len);
        return PyBytes_FromStringAndSize(s, (Py_ssize_t)len);
    case DCP_VALUE_LIST:
    case DCP_VALUE_TUPLE:
        n = dcp_value_len(v);
        out = dcp_value_type_of(v) == DCP_VALUE_LIST
                  ? PyList_New((Py_ssize_t)n)
                  : PyTuple_New((Py_ssize_t)n);
        for (i = 0; out && i < n; i++) {
            PyObject *x = value_to_py(dcp_value_item(v, i), depth + 1);
            if (!x) {
                Py_CLEAR(out);
                break;
            }
            if (PyList_Check(out))
                PyList_SetItem(out, (Py_ssize_t)i, x);
            else
                PyTuple_SetItem(out, (Py_ssize_t)i, x);
        }
        return out;
    case DCP_VALUE_DICT:
        n = dcp_value_len(v);
        out = PyDict_New();
        for (i = 0; out && i < n; i++) {
            PyObject *kk = value_to_py(dcp_value_dict_key(v, i), depth + 1);
            PyObject *x = kk ? value_to_py(dcp_value_item(v, i), depth + 1)
                             : NULL;
            if (!x || PyDict_SetItem(out, kk, x) < 0) {
                Py_XDECREF(kk);
                Py_XDECREF(x);
                Py_CLEAR(out);
                break;
            }
            Py_DECREF(kk);
            Py_DECREF(x);
        }
        return out;
    }
    PyErr_SetString(PyExc_ValueError, "unknown value type");
    return NULL;
}

/* read_value(index) -> Python object (dcp's restricted decoder) */
static PyObject *Meta_read_value(PyObject *self, PyObject *arg)
{
    MetaObject *o = (MetaObject *)self;
    Py_ssize_t k = PyLong_AsSsize_t(arg);
    dcp_value *v = NULL;
    PyObject *out;
    int rc;
    if (k < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_IndexError, "no such entry");
        return NULL;
    }
    ctx_enter(o->c);
    Py_BEGIN_ALLOW_THREADS
    rc = dcp_metadata_read_value(o->c->ctx, o->md, (size_t)k, &v);
    Py_END_ALLOW_THREADS
    if (ctx_done(o->c, rc) < 0)
        return NULL;
    out = value_to_py(v, 0);
    dcp_value_free(v);
    return out;
}

/* find(key) -> index or -1 */
static PyObject *Meta_find(PyObject *self, PyObject *arg)
{
    MetaObject *o = (MetaObject *)self;
    const char *key = PyUnicode_AsUTF8AndSize(arg, NULL);
    if (!key)
        return NULL;
    return PyLong_FromLong(dcp_metadata_find(o->md, key));
}

static PyMethodDef Meta_methods[] = {
    {"info", Meta_info, METH_NOARGS, "(version, save_id, count)"},
    {"entries", Meta_entries, METH_NOARGS, "entries as tuples"},
    {"chunks", Meta_chunks, METH_O, "chunks of one entry"},
    {"build", Meta_build, METH_VARARGS, "torch Metadata, without pickle"},
    {"read_boxes", Meta_read_boxes, METH_VARARGS, "batch read"},
    {"read_record", Meta_read_record, METH_VARARGS, "a record's bytes"},
    {"read_value", Meta_read_value, METH_O, "a value, safely decoded"},
    {"find", Meta_find, METH_O, "index of a key, or -1"},
    {NULL, NULL, 0, NULL}};

static PyType_Slot Meta_slots[] = {
    {Py_tp_dealloc, (void *)Meta_dealloc},
    {Py_tp_methods, Meta_methods},
    {Py_tp_doc, (void *)"A checkpoint's metadata (dcp_metadata)."},
    {0, NULL}};

static PyType_Spec Meta_spec = {"dcp_torch._C.Meta", sizeof(MetaObject), 0,
                                Py_TPFLAGS_DEFAULT, Meta_slots};


/* ------------------------------------------------- save / load (own) */

/* A Python object as a dcp value (None, bool, int, float, str, bytes,
 * list, tuple, dict); anything else: NotImplementedError naming key. */
static dcp_value *py_to_value(PyObject *o, const char *key, int depth)
{
    dcp_value *v = NULL;
    Py_ssize_t i, n;
    if (depth > 100) {
        PyErr_Format(PyExc_ValueError, "'%s': value nested too deeply", key);
        return NULL;
    }
    if (o == Py_None)
        v = dcp_value_none();
    else if (PyBool_Check(o))
        v = dcp_value_bool(o == Py_True);
    else if (PyLong_Check(o)) {
        long long x = PyLong_AsLongLong(o);
        if (x == -1 && PyErr_Occurred())
            return NULL;
        v = dcp_value_int(x);
    } else if (PyFloat_Check(o))
        v = dcp_value_float(PyFloat_AsDouble(o));
    else if (PyUnicode_Check(o)) {
        Py_ssize_t len;
        const char *s = PyUnicode_AsUTF8AndSize(o, &len);
        if (!s)
            return NULL;
        v = dcp_value_strn(s, (size_t)len);
    } else if (PyBytes_Check(o)) {
        char *p;
        Py_ssize_t len;
        if (PyBytes_AsStringAndSize(o, &p, &len) < 0)
            return NULL;
        v = dcp_value_bytes(p, (size_t)len);
    } else if (PyList_Check(o) || PyTuple_Check(o)) {
        int list = PyList_Check(o);
        v = list ? dcp_value_list() : dcp_value_tuple();
        n = list ? PyList_Size(o) : PyTuple_Size(o);
        for (i = 0; v && i < n; i++) {
            dcp_value *x = py_to_value(list ? PyList_GetItem(o, i)
                                            : PyTuple_GetItem(o, i),
                                       key, depth + 1);
            if (!x || dcp_value_append(v, x) != DCP_OK) {
                dcp_value_free(v);
                return NULL;
            }
        }
    } else if (PyDict_Check(o)) {
        PyObject *k, *x;
        Py_ssize_t pos = 0;
        v = dcp_value_dict();
        while (v && PyDict_Next(o, &pos, &k, &x)) {
            const char *ks = PyUnicode_Check(k) ? PyUnicode_AsUTF8AndSize(k, NULL)
                                                : NULL;
            dcp_value *xv;
            if (!ks) {
                PyErr_Format(PyExc_NotImplementedError,
                             "'%s': dict keys other than str cannot be saved "
                             "by dcp", key);
                dcp_value_free(v);
                return NULL;
            }
            xv = py_to_value(x, key, depth + 1);
            if (!xv || dcp_value_dict_set(v, ks, xv) != DCP_OK) {
                dcp_value_free(v);
                return NULL;
            }
        }
    } else {
        PyErr_Format(PyExc_NotImplementedError,
                     "'%s': a %s value cannot be saved by dcp (None, bool, "
                     "int, float, str, bytes, lists, tuples and dicts of "
                     "them)",
                     key, Py_TYPE(o) ? "non-plain" : "?");
        return NULL;
    }
    if (!v && !PyErr_Occurred())
        PyErr_NoMemory();
    return v;
}

/* The state of save()/load(): entries
 *   (0, path, dtype, global_shape, offsets, sizes, ptr[, mem])
 *                                            a tensor box; mem: dcp_mem
 *                                            (DCP_MEM_HOST when absent;
 *                                            DCP_MEM_CUDA: ptr is device
 *                                            memory, staged through dcp's
 *                                            page-locked buffers)
 *   (1, path, value)                         a value
 * path: a tuple of str and int (torch's flattened path); the key is its
 * elements joined with '.'. *nvals gets the value entries' count. */
static dcp_state *build_state(PyObject *entries, size_t *nvals)
{
    dcp_state *st = NULL;
    Py_ssize_t n = PyList_Size(entries), i;
    int rc;
    *nvals = 0;
    if (n < 0)
        return NULL;
    rc = dcp_state_create(&st);
    if (rc != DCP_OK) {
        raise_code(rc, "cannot make a state");
        return NULL;
    }
    for (i = 0; i < n; i++) {
        PyObject *e = PyList_GetItem(entries, i), *path, *last;
        Py_ssize_t np, j;
        int kind, pushed = 0;
        const char *name = NULL;
        if (!PyTuple_Check(e) || PyTuple_Size(e) < 3) {
            PyErr_SetString(PyExc_TypeError, "bad state entry");
            goto fail;
        }
        kind = (int)PyLong_AsLong(PyTuple_GetItem(e, 0));
        path = PyTuple_GetItem(e, 1);
        np = PyTuple_Check(path) ? PyTuple_Size(path) : -1;
        if (np < 1) {
            PyErr_SetString(PyExc_TypeError, "bad entry path");
            goto fail;
        }
        for (j = 0; j < np; j++) {
            PyObject *el = PyTuple_GetItem(path, j);
            if (j == np - 1 && PyUnicode_Check(el)) {
                name = PyUnicode_AsUTF8AndSize(el, NULL);
                if (!name)
                    goto fail;
                break;
            }
            if (PyUnicode_Check(el)) {
                const char *sv = PyUnicode_AsUTF8AndSize(el, NULL);
                rc = sv ? dcp_state_push(st, sv) : DCP_EINVAL;
            } else {
                long long x = PyLong_AsLongLong(el);
                if (x == -1 && PyErr_Occurred())
                    goto fail;
                rc = dcp_state_push_index(st, x);
            }
            if (rc != DCP_OK) {
                raise_code(rc, "bad entry path");
                goto fail;
            }
            pushed++;
        }
        last = PyTuple_GetItem(path, np - 1);
        (void)last;
        if (kind == 0) {
            int64_t shape[DCP_MAX_NDIM], off[DCP_MAX_NDIM], sz[DCP_MAX_NDIM];
            int nd, nd2, nd3;
            long mem = DCP_MEM_HOST;
            void *ptr;
            if ((PyTuple_Size(e) != 7 && PyTuple_Size(e) != 8) ||
                !get_sizes(PyTuple_GetItem(e, 3), shape, &nd) ||
                !get_sizes(PyTuple_GetItem(e, 4), off, &nd2) ||
                !get_sizes(PyTuple_GetItem(e, 5), sz, &nd3))
                goto fail;
            ptr = PyLong_AsVoidPtr(PyTuple_GetItem(e, 6));
            if (PyErr_Occurred())
                goto fail;
            /* the 8th item, when there: where the buffer lives (dcp_mem) */
            if (PyTuple_Size(e) == 8) {
                mem = PyLong_AsLong(PyTuple_GetItem(e, 7));
                if (PyErr_Occurred())
                    goto fail;
                if (mem != DCP_MEM_HOST && mem != DCP_MEM_CUDA) {
                    PyErr_SetString(PyExc_ValueError, "bad entry memory kind");
                    goto fail;
                }
            }
            rc = dcp_state_add_tensor(
                st, name, (dcp_dtype)PyLong_AsLong(PyTuple_GetItem(e, 2)), nd,
                shape, off, sz, ptr, (dcp_mem)mem);
        } else {
            dcp_value *v = py_to_value(PyTuple_GetItem(e, 2),
                                       name ? name : "(list item)", 0);
            if (!v)
                goto fail;
            rc = dcp_state_add_value(st, name, v);
            (*nvals)++;
        }
        if (rc != DCP_OK) {
            raise_code(rc, "cannot add an entry to the state (a key used "
                           "twice, a box outside its tensor, a bad dtype?)");
            goto fail;
        }
        while (pushed--)
            (void)dcp_state_pop(st);
    }
    return st;
fail:
    dcp_state_free(st);
    return NULL;
}

/* fail: None, or (code, message): this rank could not build its state;
 * the collective call then fails on every rank with it (dcp_state_fail).
 * Returns 0, or -1 with an exception set. */
static int mark_failed(dcp_state *st, PyObject *fail)
{
    long code;
    const char *msg;
    int rc;
    if (!fail || fail == Py_None)
        return 0;
    if (!PyTuple_Check(fail) || PyTuple_Size(fail) != 2) {
        PyErr_SetString(PyExc_TypeError, "fail: (code, message) or None");
        return -1;
    }
    code = PyLong_AsLong(PyTuple_GetItem(fail, 0));
    if (code == -1 && PyErr_Occurred())
        return -1;
    msg = PyUnicode_AsUTF8AndSize(PyTuple_GetItem(fail, 1), NULL);
    if (!msg)
        return -1;
    rc = dcp_state_fail(st, (int)code, msg);
    if (rc != DCP_OK) {
        raise_code(rc, "cannot mark the state failed");
        return -1;
    }
    return 0;
}

typedef struct {
    PyObject_HEAD
    CtxObject *c;
    dcp_request *req;
    PyObject *keep; /* the entries (their tensors) until staged */
} ReqObject;

static PyTypeObject *ReqType;

/* save(entries, path, flags, no_fsync, async[, fail]) -> None or Request */
static PyObject *Ctx_save(PyObject *self, PyObject *args)
{
    CtxObject *c = (CtxObject *)self;
    PyObject *entries, *po, *p, *fail = Py_None;
    unsigned int flags;
    int nofsync, as, rc;
    size_t nv;
    dcp_state *st;
    dcp_save_options o;
    dcp_request *req = NULL;
    ReqObject *r;
    if (!PyArg_ParseTuple(args, "O!OIpp|O", &PyList_Type, &entries, &po,
                          &flags, &nofsync, &as, &fail) ||
        !get_path(po, &p))
        return NULL;
    st = build_state(entries, &nv);
    if (st && mark_failed(st, fail) < 0) {
        dcp_state_free(st);
        st = NULL;
    }
    if (!st) {
        Py_DECREF(p);
        return NULL;
    }
    memset(&o, 0, sizeof(o));
    o.struct_size = sizeof(o);
    o.no_fsync = nofsync;
    o.flags = flags;
    ctx_enter(c);
    Py_BEGIN_ALLOW_THREADS
    if (as)
        rc = dcp_save_async(c->ctx, st, PyBytes_AsString(p), &o, &req);
    else
        rc = dcp_save(c->ctx, st, PyBytes_AsString(p), &o);
    Py_END_ALLOW_THREADS
    dcp_state_free(st);
    Py_DECREF(p);
    if (ctx_done(c, rc) < 0)
        return NULL;
    if (!as)
        Py_RETURN_NONE;
    r = (ReqObject *)PyType_GenericAlloc(ReqType, 0);
    if (!r) {
        dcp_request_free(req);
        return NULL;
    }
    Py_INCREF(c);
    r->c = c;
    r->req = req;
    return (PyObject *)r;
}

static PyObject *Req_wait(PyObject *self, PyObject *unused)
{
    ReqObject *r = (ReqObject *)self;
    int rc;
    char msg[1024];
    (void)unused;
    if (!r->req) {
        PyErr_SetString(PyExc_ValueError, "request already waited for");
        return NULL;
    }
    ctx_enter(r->c);
    Py_BEGIN_ALLOW_THREADS
    rc = dcp_request_wait(r->req);
    Py_END_ALLOW_THREADS
    if (rc != DCP_OK && tc_reraise(r->c->tc)) {
        dcp_request_free(r->req);
        r->req = NULL;
        ctx_leave(r->c);
        return NULL;
    }
    if (rc != DCP_OK) {
        (void)snprintf(msg, sizeof(msg), "%s%s%s",
                       dcp_request_errmsg(r->req),
                       r->c->tc && r->c->tc->err[0] ? " " : "",
                       r->c->tc ? r->c->tc->err : "");
        if (r->c->tc)
            r->c->tc->err[0] = '\0';
    }
    dcp_request_free(r->req);
    r->req = NULL;
    ctx_leave(r->c);
    if (rc != DCP_OK)
        return raise_code(rc, msg);
    Py_RETURN_NONE;
}

static void Req_dealloc(PyObject *self)
{
    ReqObject *r = (ReqObject *)self;
    PyTypeObject *tp = Py_TYPE(self);
    if (r->req) {
        ctx_enter(r->c);
        dcp_request_free(r->req); /* abandoned on this rank */
        ctx_leave(r->c);
    }
    Py_XDECREF(r->keep);
    Py_XDECREF(r->c);
    ((freefunc)PyType_GetSlot(tp, Py_tp_free))(self);
    Py_DECREF(tp);
}

static PyMethodDef Req_methods[] = {
    {"wait", Req_wait, METH_NOARGS, "dcp_request_wait (collective)"},
    {NULL, NULL, 0, NULL}};

static PyType_Slot Req_slots[] = {
    {Py_tp_dealloc, (void *)Req_dealloc},
    {Py_tp_methods, Req_methods},
    {Py_tp_doc, (void *)"An asynchronous save in flight (dcp_request)."},
    {0, NULL}};

static PyType_Spec Req_spec = {"dcp_torch._C.Request", sizeof(ReqObject), 0,
                               Py_TPFLAGS_DEFAULT, Req_slots};

/* load(entries, path, flags[, fail]) -> {key: loaded value}
 * (tensor boxes' buffers are filled in place). */
static PyObject *Ctx_load(PyObject *self, PyObject *args)
{
    CtxObject *c = (CtxObject *)self;
    PyObject *entries, *po, *p, *out, *fail = Py_None;
    unsigned int flags;
    int rc;
    size_t nv, i, k = 0, n;
    dcp_state *st;
    dcp_load_options o;
    if (!PyArg_ParseTuple(args, "O!OI|O", &PyList_Type, &entries, &po, &flags,
                          &fail) ||
        !get_path(po, &p))
        return NULL;
    st = build_state(entries, &nv);
    if (st && mark_failed(st, fail) < 0) {
        dcp_state_free(st);
        st = NULL;
    }
    if (!st) {
        Py_DECREF(p);
        return NULL;
    }
    memset(&o, 0, sizeof(o));
    o.struct_size = sizeof(o);
    o.flags = flags;
    ctx_enter(c);
    Py_BEGIN_ALLOW_THREADS
    rc = dcp_load(c->ctx, st, PyBytes_AsString(p), &o);
    Py_END_ALLOW_THREADS
    Py_DECREF(p);
    if (ctx_done(c, rc) < 0) {
        dcp_state_free(st);
        return NULL;
    }
    /* the loaded values by key (dcp flattens as torch does) */
    n = dcp_state_count(st);
    out = PyDict_New();
    for (i = 0; out && i < n; i++) {
        const char *key = dcp_state_key(st, i);
        const dcp_value *v = key ? dcp_state_value(st, key) : NULL;
        PyObject *x;
        if (!v)
            continue;
        x = value_to_py(v, 0);
        if (!x || PyDict_SetItemString(out, key, x) < 0) {
            Py_XDECREF(x);
            Py_CLEAR(out);
            break;
        }
        Py_DECREF(x);
        k++;
    }
    (void)k;
    dcp_state_free(st);
    return out;
}


/* ------------------------------------------------------------- Manager */

typedef struct {
    PyObject_HEAD
    CtxObject *c;
    dcp_manager *m;
} MgrObject;

static PyTypeObject *MgrType;

/* manager(root, prefix, suffix, interval, keep_last, keep_every, async,
 *         no_fsync) -> Manager (collective) */
static PyObject *Ctx_manager(PyObject *self, PyObject *args)
{
    CtxObject *c = (CtxObject *)self;
    PyObject *po, *p;
    const char *prefix, *suffix;
    long long interval, keep_every;
    unsigned int keep_last;
    int as, nofsync, rc;
    dcp_manager_options o;
    dcp_save_options so;
    dcp_manager *m = NULL;
    MgrObject *r;
    if (!PyArg_ParseTuple(args, "OzzLILpp", &po, &prefix, &suffix, &interval,
                          &keep_last, &keep_every, &as, &nofsync) ||
        !get_path(po, &p))
        return NULL;
    memset(&so, 0, sizeof(so));
    so.struct_size = sizeof(so);
    so.no_fsync = nofsync;
    memset(&o, 0, sizeof(o));
    o.struct_size = sizeof(o);
    o.prefix = prefix;
    o.suffix = suffix;
    o.interval = interval;
    o.keep_last = keep_last;
    o.keep_every = keep_every;
    o.async = as;
    o.save_opts = &so;
    ctx_enter(c);
    Py_BEGIN_ALLOW_THREADS
    rc = dcp_manager_create(&m, c->ctx, PyBytes_AsString(p), &o);
    Py_END_ALLOW_THREADS
    Py_DECREF(p);
    if (ctx_done(c, rc) < 0)
        return NULL;
    r = (MgrObject *)PyType_GenericAlloc(MgrType, 0);
    if (!r) {
        dcp_manager_free(m);
        return NULL;
    }
    Py_INCREF(c);
    r->c = c;
    r->m = m;
    return (PyObject *)r;
}

static MgrObject *mgr_open(PyObject *self)
{
    MgrObject *r = (MgrObject *)self;
    if (!r->m) {
        PyErr_SetString(PyExc_ValueError, "manager closed");
        return NULL;
    }
    return r;
}

/* save(entries, step, at_boundary) -> did_save */
static PyObject *Mgr_save(PyObject *self, PyObject *args)
{
    MgrObject *r = mgr_open(self);
    PyObject *entries;
    long long step;
    int boundary, did = 1, rc;
    size_t nv;
    dcp_state *st;
    if (!r || !PyArg_ParseTuple(args, "O!Lp", &PyList_Type, &entries, &step,
                                &boundary))
        return NULL;
    st = build_state(entries, &nv);
    if (!st)
        return NULL;
    ctx_enter(r->c);
    Py_BEGIN_ALLOW_THREADS
    if (boundary)
        rc = dcp_manager_step(r->m, st, step, &did);
    else
        rc = dcp_manager_save(r->m, st, step);
    Py_END_ALLOW_THREADS
    dcp_state_free(st);
    if (ctx_done(r->c, rc) < 0)
        return NULL;
    return PyBool_FromLong(did);
}

static PyObject *Mgr_wait(PyObject *self, PyObject *unused)
{
    MgrObject *r = mgr_open(self);
    int rc;
    (void)unused;
    if (!r)
        return NULL;
    ctx_enter(r->c);
    Py_BEGIN_ALLOW_THREADS
    rc = dcp_manager_wait(r->m);
    Py_END_ALLOW_THREADS
    if (ctx_done(r->c, rc) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* latest() -> step, or -1 when there is none (DCP_ENOENT) */
static PyObject *Mgr_latest(PyObject *self, PyObject *unused)
{
    MgrObject *r = mgr_open(self);
    int64_t step = -1;
    int rc;
    (void)unused;
    if (!r)
        return NULL;
    ctx_enter(r->c);
    Py_BEGIN_ALLOW_THREADS
    rc = dcp_manager_latest(r->m, &step);
    Py_END_ALLOW_THREADS
    if (ctx_done(r->c, rc == DCP_ENOENT ? DCP_OK : rc) < 0)
        return NULL;
    return PyLong_FromLongLong(rc == DCP_ENOENT ? -1 : (long long)step);
}

static PyObject *Mgr_path(PyObject *self, PyObject *arg)
{
    MgrObject *r = mgr_open(self);
    long long step;
    char *out = NULL;
    PyObject *s;
    int rc;
    if (!r)
        return NULL;
    step = PyLong_AsLongLong(arg);
    if (step == -1 && PyErr_Occurred())
        return NULL;
    rc = dcp_manager_path(r->m, step, &out);
    if (rc != DCP_OK)
        return raise_code(rc, "bad step");
    s = PyUnicode_DecodeFSDefault(out);
    dcp_free(out);
    return s;
}

static PyObject *Mgr_request_save(PyObject *self, PyObject *unused)
{
    MgrObject *r = mgr_open(self);
    (void)unused;
    if (!r)
        return NULL;
    dcp_manager_request_save(r->m);
    Py_RETURN_NONE;
}

static PyObject *Mgr_close(PyObject *self, PyObject *unused)
{
    MgrObject *r = (MgrObject *)self;
    (void)unused;
    if (r->m) {
        ctx_enter(r->c);
        Py_BEGIN_ALLOW_THREADS
        dcp_manager_free(r->m); /* completes a save in flight */
        Py_END_ALLOW_THREADS
        ctx_leave(r->c);
        r->m = NULL;
    }
    Py_RETURN_NONE;
}

static void Mgr_dealloc(PyObject *self)
{
    MgrObject *r = (MgrObject *)self;
    PyTypeObject *tp = Py_TYPE(self);
    if (r->m) {
        ctx_enter(r->c);
        dcp_manager_free(r->m);
        ctx_leave(r->c);
    }
    Py_XDECREF(r->c);
    ((freefunc)PyType_GetSlot(tp, Py_tp_free))(self);
    Py_DECREF(tp);
}

static PyMethodDef Mgr_methods[] = {
    {"save", Mgr_save, METH_VARARGS, "dcp_manager_step / dcp_manager_save"},
    {"wait", Mgr_wait, METH_NOARGS, "dcp_manager_wait"},
    {"latest", Mgr_latest, METH_NOARGS, "dcp_manager_latest (-1: none)"},
    {"path", Mgr_path, METH_O, "dcp_manager_path"},
    {"request_save", Mgr_request_save, METH_NOARGS, "save at the next step"},
    {"close", Mgr_close, METH_NOARGS, "dcp_manager_free (collective)"},
    {NULL, NULL, 0, NULL}};

static PyType_Slot Mgr_slots[] = {
    {Py_tp_dealloc, (void *)Mgr_dealloc},
    {Py_tp_methods, Mgr_methods},
    {Py_tp_doc, (void *)"A checkpoint manager (dcp_manager)."},
    {0, NULL}};

static PyType_Spec Mgr_spec = {"dcp_torch._C.Manager", sizeof(MgrObject), 0,
                               Py_TPFLAGS_DEFAULT, Mgr_slots};

static PyMethodDef Ctx_methods[] = {
    {"verify", Ctx_verify, METH_O, "dcp_verify(path)"},
    {"clean", Ctx_clean, METH_VARARGS, "dcp_clean(path, force)"},
    {"convert", Ctx_convert, METH_VARARGS, "dcp_export / dcp_import"},
    {"write_file", Ctx_write_file, METH_VARARGS, "one data file"},
    {"part_save_begin", Ctx_part_save_begin, METH_VARARGS,
     "dcp_part_save_begin(path, flags)"},
    {"metadata_open", Ctx_metadata_open, METH_O, "dcp_metadata_open(path)"},
    {"save", Ctx_save, METH_VARARGS, "dcp_save / dcp_save_async"},
    {"load", Ctx_load, METH_VARARGS, "dcp_load"},
    {"manager", Ctx_manager, METH_VARARGS, "dcp_manager_create"},
    {NULL, NULL, 0, NULL}};

static PyType_Slot Ctx_slots[] = {
    {Py_tp_new, (void *)Ctx_new},
    {Py_tp_dealloc, (void *)Ctx_dealloc},
    {Py_tp_methods, Ctx_methods},
    {Py_tp_doc, (void *)"A dcp context (dcp_ctx)."},
    {0, NULL}};

static PyType_Spec Ctx_spec = {"dcp_torch._C.Context", sizeof(CtxObject), 0,
                               Py_TPFLAGS_DEFAULT, Ctx_slots};

/* -------------------------------------------------------------- module */

static PyObject *dtype_code(PyObject *self, PyObject *arg)
{
    const char *name = PyUnicode_AsUTF8AndSize(arg, NULL);
    dcp_dtype dt;
    (void)self;
    if (!name)
        return NULL;
    if (dcp_dtype_from_name(name, &dt) != DCP_OK)
        return PyLong_FromLong(0);
    return PyLong_FromLong((long)dt);
}

static PyObject *version(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    return PyUnicode_FromString(dcp_version_string());
}

static PyMethodDef module_methods[] = {
    {"_set_error_factory", set_error_factory, METH_O, NULL},
    {"dtype_code", dtype_code, METH_O, "dcp dtype code of a torch name"},
    {"version", version, METH_NOARGS, "libdcp's version"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C",
                                        "dcp's C engine for dcp_torch", -1,
                                        module_methods, NULL, NULL, NULL,
                                        NULL};

PyMODINIT_FUNC PyInit__C(void);
PyMODINIT_FUNC PyInit__C(void)
{
    PyObject *m = PyModule_Create(&module_def);
    int i;
    if (!m)
        return NULL;
    for (i = 0; i < A_COUNT; i++)
        if (!(attr[i] = PyUnicode_InternFromString(attr_names[i])))
            goto fail;
    if (!(empty_args = PyTuple_New(0)))
        goto fail;
    CtxType = (PyTypeObject *)PyType_FromSpec(&Ctx_spec);
    PartSaveType = (PyTypeObject *)PyType_FromSpec(&PartSave_spec);
    MetaType = (PyTypeObject *)PyType_FromSpec(&Meta_spec);
    ReqType = (PyTypeObject *)PyType_FromSpec(&Req_spec);
    MgrType = (PyTypeObject *)PyType_FromSpec(&Mgr_spec);
    if (!CtxType || !PartSaveType || !MetaType || !ReqType || !MgrType)
        goto fail;
    Py_INCREF(CtxType);
    if (PyModule_AddObject(m, "Context", (PyObject *)CtxType) < 0)
        goto fail;
#define I(n) PyModule_AddIntConstant(m, #n, n)
    if (I(DCP_PART_NO_OVERWRITE) < 0 || I(DCP_PART_NO_LOCK) < 0 ||
        I(DCP_FORMAT_AUTO) < 0 || I(DCP_FORMAT_SAFETENSORS) < 0 ||
        I(DCP_FORMAT_TORCH) < 0 || I(DCP_FORMAT_SAFETENSORS_INDEX) < 0 ||
        I(DCP_CONVERT_NO_VERIFY) < 0 || I(DCP_CONVERT_NO_FSYNC) < 0 ||
        I(DCP_CONVERT_ALLOW_OVERFLOW) < 0)
        goto fail;
#undef I
    return m;
fail:
    Py_DECREF(m);
    return NULL;
}
