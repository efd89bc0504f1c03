/* Python binding of the zstd frame index; the decoder itself is _zstdindex_core.h. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define ZI_MALLOC PyMem_RawMalloc
#define ZI_REALLOC PyMem_RawRealloc
#define ZI_FREE PyMem_RawFree
#include "_zstdindex_core.h"

static PyObject *CorruptError;   /* args: (offset into the input, reason) */
static PyObject *TooLargeError;  /* args: (reason,) */

/* ---------------------------------------------------------------- the Python object */

typedef struct {
    PyObject_HEAD
    Frame fr;
    Py_buffer view;  /* the compressed input, held while blocks remain to decode */
    int has_view;
    Py_ssize_t step_budget;
    Py_ssize_t steps_per_byte;
    /* Set while a call works on the frame with the GIL released: the frame and its buffers are
     * one thread's at a time. Tested and set with the GIL held, so a second thread is refused
     * (RuntimeError) instead of racing; callers use one index per thread (prune's workers do). */
    int busy;
} FrameIndexObject;

/* Take the frame for this call; raises RuntimeError if another thread has it. */
static int acquire(FrameIndexObject *self) {
    if (self->busy) {
        PyErr_SetString(PyExc_RuntimeError, "this FrameIndex is in use by another thread");
        return -1;
    }
    self->busy = 1;
    return 0;
}

static void release(FrameIndexObject *self) { self->busy = 0; }

static void release_input(FrameIndexObject *self) {
    if (self->has_view) {
        PyBuffer_Release(&self->view);
        self->has_view = 0;
    }
}

static void FrameIndex_dealloc(FrameIndexObject *self) {
    release_input(self);
    zi_release(&self->fr.ix);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The frame's failure as the exception it is (raised again by every later call). */
static PyObject *raise_failed(const Frame *fr) {
    if (fr->failed.too_large)
        PyErr_SetObject(TooLargeError, Py_BuildValue("(s)", fr->failed.reason));
    else
        PyErr_SetObject(CorruptError, Py_BuildValue("(ns)", (Py_ssize_t)fr->failed.offset, fr->failed.reason));
    return NULL;
}

/* Decode until `upto` bytes are indexed (or the frame ends); the input is let go once it has.
 * The decoding runs without the GIL: the core calls no Python API and allocates with
 * PyMem_Raw*, the input stays pinned by the held buffer view. The caller holds `busy`. */
static int extend(FrameIndexObject *self, uint64_t upto) {
    int rc = 0;
    if (!self->fr.done && self->fr.out < upto) {
        Py_BEGIN_ALLOW_THREADS
        rc = zi_extend(&self->fr, upto);
        Py_END_ALLOW_THREADS
    }
    if (rc < 0) {
        release_input(self);
        raise_failed(&self->fr);
        return -1;
    }
    if (self->fr.done)
        release_input(self);
    return 0;
}

static PyObject *read_locked(FrameIndexObject *self, unsigned long long pos, unsigned long long length);

static PyObject *FrameIndex_read(FrameIndexObject *self, PyObject *args) {
    unsigned long long pos, length;
    if (!PyArg_ParseTuple(args, "KK", &pos, &length))
        return NULL;
    if (acquire(self) < 0)
        return NULL;
    PyObject *out = read_locked(self, pos, length);
    release(self);
    return out;
}

static PyObject *read_locked(FrameIndexObject *self, unsigned long long pos, unsigned long long length) {
    if (self->fr.has_failed)
        return raise_failed(&self->fr);
    uint64_t end = length > UINT64_MAX - pos ? UINT64_MAX : pos + length;
    if (extend(self, end) < 0)
        return NULL;
    if (pos >= self->fr.out)
        return PyBytes_FromStringAndSize(NULL, 0);
    if (length > self->fr.out - pos)
        length = self->fr.out - pos;
    if (length > (unsigned long long)PY_SSIZE_T_MAX)
        return PyErr_NoMemory();
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)length);
    if (!out)
        return NULL;
    const char *why = NULL;
    uint8_t *dst = (uint8_t *)PyBytes_AS_STRING(out);  /* not shared yet: filled without the GIL */
    int64_t budget = self->step_budget + self->steps_per_byte * (int64_t)length;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = resolve(&self->fr.ix, dst, pos, length, budget, &why);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        Py_DECREF(out);
        PyErr_SetObject(TooLargeError, Py_BuildValue("(s)", why));
        return NULL;
    }
    return out;
}

static PyObject *FrameIndex_decode_all(FrameIndexObject *self, PyObject *unused) {
    (void)unused;
    if (acquire(self) < 0)
        return NULL;
    PyObject *out;
    if (self->fr.has_failed)
        out = raise_failed(&self->fr);
    else if (extend(self, UINT64_MAX) < 0)
        out = NULL;
    else
        out = PyLong_FromSize_t(self->fr.pos);
    release(self);
    return out;
}

static PyObject *FrameIndex_get_size(FrameIndexObject *self, void *closure) {
    (void)closure;
    if (acquire(self) < 0)
        return NULL;
    PyObject *out;
    if (self->fr.has_failed)
        out = raise_failed(&self->fr);
    else if (self->fr.has_fcs)
        out = PyLong_FromUnsignedLongLong(self->fr.fcs);  /* decoding checks the frame holds it */
    else if (extend(self, UINT64_MAX) < 0)
        out = NULL;
    else
        out = PyLong_FromUnsignedLongLong(self->fr.out);
    release(self);
    return out;
}

static PyObject *FrameIndex_get_nbytes(FrameIndexObject *self, void *closure) {
    (void)closure;
    if (acquire(self) < 0)  /* another thread may be growing the buffers */
        return NULL;
    PyObject *out = PyLong_FromSize_t(zi_nbytes(&self->fr.ix));
    release(self);
    return out;
}

static PyMethodDef FrameIndex_methods[] = {
    {"read", (PyCFunction)FrameIndex_read, METH_VARARGS,
     "read(offset, length) -> bytes: the frame's content at [offset, offset+length), shorter at its end;\n"
     "blocks up to it are decoded first."},
    {"decode_all", (PyCFunction)FrameIndex_decode_all, METH_NOARGS,
     "decode_all() -> int: decode every block; returns the input bytes the frame takes."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef FrameIndex_getset[] = {
    {"size", (getter)FrameIndex_get_size, NULL, "bytes the frame regenerates", NULL},
    {"nbytes", (getter)FrameIndex_get_nbytes, NULL, "memory the index holds now", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject FrameIndexType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "rocm_audit.formats._zstdindex.FrameIndex",
    .tp_basicsize = sizeof(FrameIndexObject),
    .tp_dealloc = (destructor)FrameIndex_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Random access into one zstd frame, made by index_frame().",
    .tp_methods = FrameIndex_methods,
    .tp_getset = FrameIndex_getset,
};

static PyObject *py_index_frame(PyObject *module, PyObject *args, PyObject *kwargs) {
    (void)module;
    static char *kwlist[] = {"data", "max_records", "max_literals", "step_budget", "steps_per_byte", NULL};
    Py_buffer view;
    Py_ssize_t max_records, max_literals, step_budget, steps_per_byte;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "y*nnnn", kwlist, &view, &max_records, &max_literals,
                                     &step_budget, &steps_per_byte))
        return NULL;
    if (step_budget < 0 || steps_per_byte < 0 || steps_per_byte > (1 << 20)) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "step budgets must be small and not negative");
        return NULL;
    }
    FrameIndexObject *self = PyObject_New(FrameIndexObject, &FrameIndexType);
    if (!self) {
        PyBuffer_Release(&view);
        return NULL;
    }
    memset(&self->fr, 0, sizeof self->fr);
    self->view = view;
    self->has_view = 1;
    self->fr.ix.max = max_records > 0 ? (size_t)max_records : 0;
    if (self->fr.ix.max > UINT32_MAX)  /* the table numbers records in 32 bits */
        self->fr.ix.max = UINT32_MAX;
    self->fr.ix.maxlits = max_literals > 0 ? (size_t)max_literals : 0;
    if (self->fr.ix.maxlits > LIT_RLE_FLAG - 1)
        self->fr.ix.maxlits = LIT_RLE_FLAG - 1;
    self->step_budget = step_budget;
    self->steps_per_byte = steps_per_byte;
    self->busy = 0;
    if (zi_open(&self->fr, view.buf, (size_t)view.len) < 0) {
        raise_failed(&self->fr);
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static PyMethodDef module_methods[] = {
    {"index_frame", (PyCFunction)(void (*)(void))py_index_frame, METH_VARARGS | METH_KEYWORDS,
     "index_frame(data, max_records, max_literals, step_budget, steps_per_byte) -> FrameIndex of the zstd\n"
     "frame at data[0] (its header read; blocks are decoded as reads need them). A read may take\n"
     "step_budget + steps_per_byte * length resolution steps."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "_zstdindex",
                                       "Random access into a zstd frame without its window.", -1, module_methods,
                                       NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__zstdindex(void) {
    if (zi_init() < 0) {
        PyErr_SetString(PyExc_SystemError, "zstd predefined tables do not build");
        return NULL;
    }
    if (PyType_Ready(&FrameIndexType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (!m)
        return NULL;
    CorruptError = PyErr_NewException("rocm_audit.formats._zstdindex.Corrupt", PyExc_ValueError, NULL);
    TooLargeError = PyErr_NewException("rocm_audit.formats._zstdindex.TooLarge", PyExc_Exception, NULL);
    if (!CorruptError || !TooLargeError)
        return NULL;
    Py_INCREF(&FrameIndexType);
    PyModule_AddObject(m, "FrameIndex", (PyObject *)&FrameIndexType);
    PyModule_AddObject(m, "Corrupt", CorruptError);
    PyModule_AddObject(m, "TooLarge", TooLargeError);
    return m;
}
