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
    Index ix;
    uint64_t content;
    size_t consumed;
    Py_ssize_t step_budget;
    Py_ssize_t steps_per_byte;
} FrameIndexObject;

static void FrameIndex_dealloc(FrameIndexObject *self) {
    PyMem_RawFree(self->ix.coarse);
    PyMem_RawFree(self->ix.rec);
    PyMem_RawFree(self->ix.lits);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *FrameIndex_read(FrameIndexObject *self, PyObject *args) {
    unsigned long long pos, length;
    if (!PyArg_ParseTuple(args, "KK", &pos, &length))
        return NULL;
    if (pos >= self->content)
        return PyBytes_FromStringAndSize(NULL, 0);
    if (length > self->content - pos)
        length = self->content - pos;
    if (length > (unsigned long long)PY_SSIZE_T_MAX)
        return PyErr_NoMemory();
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)length);
    if (!out)
        return NULL;
    const char *why = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = resolve(&self->ix, (uint8_t *)PyBytes_AS_STRING(out), pos, length,
                 self->step_budget + self->steps_per_byte * (int64_t)length, &why);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        Py_DECREF(out);
        PyErr_SetObject(TooLargeError, Py_BuildValue("(s)", why));
        return NULL;
    }
    return out;
}

static PyObject *FrameIndex_get_size(FrameIndexObject *self, void *closure) {
    (void)closure;
    return PyLong_FromUnsignedLongLong(self->content);
}

static PyObject *FrameIndex_get_consumed(FrameIndexObject *self, void *closure) {
    (void)closure;
    return PyLong_FromSize_t(self->consumed);
}

static PyObject *FrameIndex_get_records(FrameIndexObject *self, void *closure) {
    (void)closure;
    return PyLong_FromSize_t(self->ix.n);
}

static PyObject *FrameIndex_get_nbytes(FrameIndexObject *self, void *closure) {
    (void)closure;
    return PyLong_FromSize_t(self->ix.cap * sizeof(Record) + self->ix.litcap + self->ix.ncoarse * sizeof(uint32_t));
}

static PyMethodDef FrameIndex_methods[] = {
    {"read", (PyCFunction)FrameIndex_read, METH_VARARGS,
     "read(offset, length) -> bytes: the frame's content at [offset, offset+length), shorter at its end."},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef FrameIndex_getset[] = {
    {"size", (getter)FrameIndex_get_size, NULL, "bytes the frame regenerates", NULL},
    {"consumed", (getter)FrameIndex_get_consumed, NULL, "input bytes the frame takes", NULL},
    {"records", (getter)FrameIndex_get_records, NULL, "records kept (sequences, raw and RLE blocks)", NULL},
    {"nbytes", (getter)FrameIndex_get_nbytes, NULL, "memory the index holds", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject FrameIndexType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "rocm_audit.formats._zstdindex.FrameIndex",
    .tp_basicsize = sizeof(FrameIndexObject),
    .tp_dealloc = (destructor)FrameIndex_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Random access into one zstd frame, built by index_frame().",
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
    memset(&self->ix, 0, sizeof self->ix);
    self->ix.max = max_records > 0 ? (size_t)max_records : 0;
    self->ix.maxlits = max_literals > 0 ? (size_t)max_literals : 0;
    if (self->ix.maxlits > LIT_RLE_FLAG - 1)
        self->ix.maxlits = LIT_RLE_FLAG - 1;
    self->step_budget = step_budget;
    self->steps_per_byte = steps_per_byte;
    Fail f = {0, NULL, 0};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = index_frame(&self->ix, &f, view.buf, (size_t)view.len, &self->content, &self->consumed);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&view);
    if (rc < 0) {
        Py_DECREF(self);
        if (f.too_large)
            PyErr_SetObject(TooLargeError, Py_BuildValue("(s)", f.reason));
        else
            PyErr_SetObject(CorruptError, Py_BuildValue("(ns)", (Py_ssize_t)f.offset, f.reason));
        return NULL;
    }
    if (build_coarse(&self->ix, self->content) < 0) {
        Py_DECREF(self);
        PyErr_SetObject(TooLargeError, Py_BuildValue("(s)", "out of memory for the index"));
        return NULL;
    }
    if (self->ix.cap > self->ix.n && self->ix.n) {  /* give back the doubling slack */
        Record *r = PyMem_RawRealloc(self->ix.rec, self->ix.n * sizeof(Record));
        if (r) {
            self->ix.rec = r;
            self->ix.cap = self->ix.n;
        }
    }
    if (self->ix.litcap > self->ix.nlits && self->ix.nlits) {
        uint8_t *p = PyMem_RawRealloc(self->ix.lits, self->ix.nlits);
        if (p) {
            self->ix.lits = p;
            self->ix.litcap = self->ix.nlits;
        }
    }
    return (PyObject *)self;
}

static PyMethodDef module_methods[] = {
    {"index_frame", (PyCFunction)(void (*)(void))py_index_frame, METH_VARARGS | METH_KEYWORDS,
     "index_frame(data, max_records, max_literals, step_budget, steps_per_byte) -> FrameIndex of the zstd\n"
     "frame at data[0]; a read may take step_budget + steps_per_byte * length resolution steps."},
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
