/* The CUDA launch hot path, in C: a Python extension built once per user and Python
 * by the system C compiler (safejit/backends/cuda/fastpath.py), with the Python path in
 * launch.py as its fallback and its reference.
 *
 * A kernel's launcher is a builtin function bound to (state, slow): the state holds the
 * kernel handle, the parameter layout read from the cubin and a packing plan (each
 * argument's exact type and how to read its value), installed by the Python path after
 * it has packed a call of those types. The launcher packs the arguments into a buffer on
 * its stack by that plan and the cubin's widths, and calls cuLaunchKernelEx with the GIL
 * released. Anything it does not take exactly as the Python path would — another type,
 * a value that does not fit its parameter, a list of dimensions, a cluster, an unknown
 * keyword, a closed module — it hands, untouched, to `slow`, the Python path, which packs
 * it or raises the typed error. So the bytes the driver sees and the errors a caller gets
 * are the Python path's; only the time differs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define STATE_NAME "safejit.cuda.launch_state"
#define MAX_PARAMS 128
#define MAX_BYTES 4096

/* How an argument's value is read (args.py: NATIVE_KINDS). */
enum { K_INT = 0, K_FLOAT = 1, K_DATA_PTR = 2, K_DATA_DOT_PTR = 3, K_BYTES = 4 };

typedef int (*launch_ex_fn)(const void *config, void *function, void **params, void **extra);

typedef struct { /* CUlaunchConfig */
  unsigned int grid[3], block[3], shared_mem;
  void *stream;
  void *attrs;
  unsigned int num_attrs;
} launch_config;

typedef struct {
  void *function; /* a CUkernel, launched as a CUfunction in the current context */
  int closed;
  int count;
  uint16_t offset[MAX_PARAMS], size[MAX_PARAMS];
  int planned;
  PyObject *types[MAX_PARAMS]; /* the plan: each argument's exact type (strong references) */
  unsigned char kinds[MAX_PARAMS];
} state;

static launch_ex_fn launch_ex;
static PyObject *stream_readers; /* type -> attribute holding the handle, or None: __cuda_stream__ */
static PyObject *torch_functions, *ensure_context, *launch_failed;
static PyObject *torch_device, *torch_raw_stream; /* once torch's CUDA is initialised */
static PyObject *s_grid, *s_block, *s_args, *s_shared_mem, *s_stream, *s_cluster, *s_cooperative;
static PyObject *s_data_ptr, *s_data, *s_ptr, *s_protocol, *s_torch;
static _Thread_local int context_ready;

static state *state_of(PyObject *capsule) { return (state *)PyCapsule_GetPointer(capsule, STATE_NAME); }

static void state_free(PyObject *capsule) {
  state *st = state_of(capsule);
  if (st == NULL) {
    PyErr_Clear();
    return;
  }
  for (int i = 0; i < st->count; i++) Py_CLEAR(st->types[i]);
  PyMem_Free(st);
}

/* new_state(function, ((offset, size), ...)) -> capsule */
static PyObject *new_state(PyObject *module, PyObject *args) {
  unsigned long long function;
  PyObject *layout;
  if (!PyArg_ParseTuple(args, "KO!", &function, &PyTuple_Type, &layout)) return NULL;
  Py_ssize_t count = PyTuple_GET_SIZE(layout);
  if (count > MAX_PARAMS) {
    PyErr_SetString(PyExc_ValueError, "more parameters than the C launch path takes");
    return NULL;
  }
  state *st = PyMem_Calloc(1, sizeof *st);
  if (st == NULL) return PyErr_NoMemory();
  st->function = (void *)(uintptr_t)function;
  st->count = (int)count;
  for (Py_ssize_t i = 0; i < count; i++) {
    unsigned int offset, size;
    if (!PyArg_ParseTuple(PyTuple_GET_ITEM(layout, i), "II", &offset, &size)) {
      PyMem_Free(st);
      return NULL;
    }
    if (size == 0 || size > MAX_BYTES || offset > MAX_BYTES - size) {
      PyMem_Free(st);
      PyErr_SetString(PyExc_ValueError, "a parameter the C launch path does not take");
      return NULL;
    }
    st->offset[i] = (uint16_t)offset;
    st->size[i] = (uint16_t)size;
  }
  PyObject *capsule = PyCapsule_New(st, STATE_NAME, state_free);
  if (capsule == NULL) PyMem_Free(st);
  return capsule;
}

/* set_plan(state, types, kinds): the plan for arguments of these exact types. */
static PyObject *set_plan(PyObject *module, PyObject *args) {
  PyObject *capsule, *types, *kinds;
  if (!PyArg_ParseTuple(args, "OO!O!", &capsule, &PyTuple_Type, &types, &PyTuple_Type, &kinds)) return NULL;
  state *st = state_of(capsule);
  if (st == NULL) return NULL;
  if (PyTuple_GET_SIZE(types) != st->count || PyTuple_GET_SIZE(kinds) != st->count) {
    PyErr_SetString(PyExc_ValueError, "a plan must name every parameter");
    return NULL;
  }
  unsigned char new_kinds[MAX_PARAMS];
  for (int i = 0; i < st->count; i++) {
    long kind = PyLong_AsLong(PyTuple_GET_ITEM(kinds, i));
    if (kind == -1 && PyErr_Occurred()) return NULL;
    int pointer = kind == K_DATA_PTR || kind == K_DATA_DOT_PTR;
    if (kind < K_INT || kind > K_BYTES || !PyType_Check(PyTuple_GET_ITEM(types, i)) ||
        (pointer && st->size[i] != 8) || (kind == K_FLOAT && st->size[i] != 4 && st->size[i] != 8) ||
        (kind == K_INT && st->size[i] != 1 && st->size[i] != 2 && st->size[i] != 4 && st->size[i] != 8)) {
      PyErr_SetString(PyExc_ValueError, "a plan the C launch path does not take");
      return NULL;
    }
    new_kinds[i] = (unsigned char)kind;
  }
  for (int i = 0; i < st->count; i++) {
    PyObject *type = PyTuple_GET_ITEM(types, i);
    Py_INCREF(type);
    Py_XSETREF(st->types[i], type);
    st->kinds[i] = new_kinds[i];
  }
  st->planned = 1;
  Py_RETURN_NONE;
}

/* close(state): the launcher hands every call to the Python path from now on. */
static PyObject *close_state(PyObject *module, PyObject *capsule) {
  state *st = state_of(capsule);
  if (st == NULL) return NULL;
  st->closed = 1;
  Py_RETURN_NONE;
}

/* configure(cuLaunchKernelEx address, stream readers, torch_functions, ensure_context, launch_failed) */
static PyObject *configure(PyObject *module, PyObject *args) {
  unsigned long long address;
  PyObject *readers, *torch, *context, *failed;
  if (!PyArg_ParseTuple(args, "KO!OOO", &address, &PyDict_Type, &readers, &torch, &context, &failed)) return NULL;
  launch_ex = (launch_ex_fn)(uintptr_t)address;
  Py_INCREF(readers);
  Py_XSETREF(stream_readers, readers);
  Py_INCREF(torch);
  Py_XSETREF(torch_functions, torch);
  Py_INCREF(context);
  Py_XSETREF(ensure_context, context);
  Py_INCREF(failed);
  Py_XSETREF(launch_failed, failed);
  Py_RETURN_NONE;
}

/* An int from `least` up that fits an unsigned int; 0 when it is one. */
static int unsigned_int(PyObject *value, long long least, unsigned int *out) {
  if (!PyLong_CheckExact(value)) return -1;
  int overflow;
  long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
  if (overflow || v < least || v > UINT_MAX) return -1;
  *out = (unsigned int)v;
  return 0;
}

static int dimension(PyObject *value, unsigned int *out) { return unsigned_int(value, 1, out); }

static int dim3(PyObject *value, unsigned int out[3]) {
  out[0] = out[1] = out[2] = 1;
  if (PyLong_CheckExact(value)) return dimension(value, &out[0]);
  if (!PyTuple_CheckExact(value)) return -1;
  Py_ssize_t n = PyTuple_GET_SIZE(value);
  if (n < 1 || n > 3) return -1;
  for (Py_ssize_t i = 0; i < n; i++)
    if (dimension(PyTuple_GET_ITEM(value, i), &out[i])) return -1;
  return 0;
}

/* An int into `size` bytes: what fits the signed or the unsigned type of that width
 * (args.encode_argument's rule), little-endian. */
static int pack_int(PyObject *value, unsigned int size, unsigned char *out) {
  int overflow;
  long long v = PyLong_AsLongLongAndOverflow(value, &overflow);
  if (v == -1 && PyErr_Occurred()) return -1;
  if (overflow > 0 && size == 8) {
    unsigned long long u = PyLong_AsUnsignedLongLong(value);
    if (u == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    memcpy(out, &u, 8);
    return 0;
  }
  if (overflow) return -1;
  if (size < 8) {
    int bits = (int)size * 8;
    long long low = -(1LL << (bits - 1)), high = (long long)((1ULL << bits) - 1);
    if (v < low || v > high) return -1;
  }
  memcpy(out, &v, size);
  return 0;
}

static int pack_float(PyObject *value, unsigned int size, unsigned char *out) {
  double d = PyFloat_AS_DOUBLE(value);
  if (size == 8) {
    memcpy(out, &d, 8);
    return 0;
  }
  float f = (float)d;
  if (isinf(f) && !isinf(d)) return -1; /* struct.pack("<f") raises OverflowError here */
  memcpy(out, &f, 4);
  return 0;
}

static int pack_pointer(PyObject *address, unsigned char *out) {
  if (address == NULL) return -1;
  int ok = PyLong_CheckExact(address);
  unsigned long long p = ok ? PyLong_AsUnsignedLongLong(address) : 0;
  Py_DECREF(address);
  if (!ok || (p == (unsigned long long)-1 && PyErr_Occurred())) return -1;
  memcpy(out, &p, 8);
  return 0;
}

static int pack_bytes(PyObject *value, unsigned int size, unsigned char *out) {
  Py_buffer view;
  if (PyObject_GetBuffer(value, &view, PyBUF_SIMPLE) < 0) return -1;
  int ok = view.len == (Py_ssize_t)size;
  if (ok) memcpy(out, view.buf, size);
  PyBuffer_Release(&view);
  return ok ? 0 : -1;
}

static int pack_one(const state *st, int i, PyObject *value, unsigned char *out) {
  switch (st->kinds[i]) {
    case K_INT:
      return pack_int(value, st->size[i], out);
    case K_FLOAT:
      return pack_float(value, st->size[i], out);
    case K_DATA_PTR: /* torch.Tensor */
      return pack_pointer(PyObject_CallMethodNoArgs(value, s_data_ptr), out);
    case K_DATA_DOT_PTR: { /* CuPy */
      PyObject *data = PyObject_GetAttr(value, s_data);
      if (data == NULL) return -1;
      PyObject *ptr = PyObject_GetAttr(data, s_ptr);
      Py_DECREF(data);
      return pack_pointer(ptr, out);
    }
    default:
      return pack_bytes(value, st->size[i], out);
  }
}

/* The stream's handle, read the way the Python path read the first of its type. */
static int stream_of(PyObject *stream, void **out) {
  PyObject *value;
  if (stream == Py_None) { /* torch's current stream when torch's CUDA is in use, else the default stream */
    *out = NULL;
    if (torch_raw_stream == NULL) {
      PyObject *torch = PyDict_GetItemWithError(PyImport_GetModuleDict(), s_torch);
      if (torch == NULL) return PyErr_Occurred() ? -1 : 0;
      PyObject *pair = PyObject_CallNoArgs(torch_functions); /* (device, raw stream) or None */
      if (pair == NULL) return -1;
      if (pair == Py_None) {
        Py_DECREF(pair);
        return 0;
      }
      if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) {
        Py_DECREF(pair);
        return -1;
      }
      torch_device = Py_NewRef(PyTuple_GET_ITEM(pair, 0));
      torch_raw_stream = Py_NewRef(PyTuple_GET_ITEM(pair, 1));
      Py_DECREF(pair);
    }
    PyObject *device = PyObject_CallNoArgs(torch_device);
    if (device == NULL) return -1;
    value = PyObject_CallOneArg(torch_raw_stream, device);
    Py_DECREF(device);
  } else if (PyLong_CheckExact(stream)) {
    value = Py_NewRef(stream);
  } else {
    PyObject *how = PyDict_GetItemWithError(stream_readers, (PyObject *)Py_TYPE(stream));
    if (how == NULL) return -1;
    if (how != Py_None) {
      value = PyObject_GetAttr(stream, how);
    } else {
      PyObject *proto = PyObject_GetAttr(stream, s_protocol);
      if (proto == NULL) return -1;
      PyObject *pair = PyCallable_Check(proto) ? PyObject_CallNoArgs(proto) : Py_NewRef(proto);
      Py_DECREF(proto);
      if (pair == NULL) return -1;
      value = PyTuple_Check(pair) && PyTuple_GET_SIZE(pair) == 2 ? Py_NewRef(PyTuple_GET_ITEM(pair, 1)) : NULL;
      Py_DECREF(pair);
    }
  }
  if (value == NULL) return -1;
  int ok = PyLong_CheckExact(value);
  unsigned long long handle = ok ? PyLong_AsUnsignedLongLong(value) : 0;
  Py_DECREF(value);
  if (!ok || (handle == (unsigned long long)-1 && PyErr_Occurred())) return -1;
  *out = (void *)(uintptr_t)handle;
  return 0;
}

/* launch(grid, block, args=(), *, shared_mem=0, stream=None, cluster=None, cooperative=False) */
static PyObject *launch(PyObject *self, PyObject *const *argv, Py_ssize_t nargs, PyObject *kwnames) {
  state *st = state_of(PyTuple_GET_ITEM(self, 0));
  PyObject *grid = NULL, *block = NULL, *args = NULL, *shared = NULL, *stream = Py_None;
  PyObject *cluster = Py_None, *cooperative = Py_False, *owned = NULL;
  if (st == NULL || nargs > 3 || launch_ex == NULL) goto slow;
  if (nargs > 0) grid = argv[0];
  if (nargs > 1) block = argv[1];
  if (nargs > 2) args = argv[2];
  Py_ssize_t keywords = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
  for (Py_ssize_t i = 0; i < keywords; i++) {
    PyObject *name = PyTuple_GET_ITEM(kwnames, i), *value = argv[nargs + i];
    if (name == s_stream) stream = value;
    else if (name == s_shared_mem) shared = value;
    else if (name == s_cluster) cluster = value;
    else if (name == s_cooperative) cooperative = value;
    else if (name == s_args && args == NULL) args = value;
    else if (name == s_grid && grid == NULL) grid = value;
    else if (name == s_block && block == NULL) block = value;
    else goto slow;
  }
  if (grid == NULL || block == NULL || cluster != Py_None || cooperative != Py_False || st->closed || !st->planned)
    goto slow;
  if (args == NULL) {
    owned = PyTuple_New(0);
  } else if (PyTuple_CheckExact(args)) {
    owned = Py_NewRef(args);
  } else if (PyList_CheckExact(args)) {
    owned = PyList_AsTuple(args); /* a snapshot: reading values can run Python code */
  } else {
    goto slow;
  }
  if (owned == NULL || PyTuple_GET_SIZE(owned) != st->count) goto slow;

  _Alignas(16) unsigned char buffer[MAX_BYTES];
  void *params[MAX_PARAMS];
  for (int i = 0; i < st->count; i++) {
    PyObject *value = PyTuple_GET_ITEM(owned, i);
    if (Py_TYPE(value) != (PyTypeObject *)st->types[i]) goto slow;
    if (pack_one(st, i, value, buffer + st->offset[i])) goto slow;
    params[i] = buffer + st->offset[i];
  }
  launch_config config = {{1, 1, 1}, {1, 1, 1}, 0, NULL, NULL, 0};
  if (dim3(grid, config.grid) || dim3(block, config.block)) goto slow;
  if (shared != NULL && unsigned_int(shared, 0, &config.shared_mem)) goto slow;
  if (stream_of(stream, &config.stream)) goto slow;
  if (!context_ready) { /* once per thread: the CUkernel launches in the current context */
    PyObject *done = PyObject_CallNoArgs(ensure_context);
    if (done == NULL) {
      Py_DECREF(owned);
      return NULL;
    }
    Py_DECREF(done);
    context_ready = 1;
  }
  if (st->closed) goto slow; /* reading the arguments ran Python code: look again */
  int error;
  Py_BEGIN_ALLOW_THREADS
  error = launch_ex(&config, st->function, params, NULL);
  Py_END_ALLOW_THREADS
  Py_DECREF(owned);
  if (error) return PyObject_CallFunction(launch_failed, "i", error);
  Py_RETURN_NONE;

slow:
  Py_XDECREF(owned);
  PyErr_Clear(); /* the Python path reads everything again and raises what is wrong */
  return PyObject_Vectorcall(PyTuple_GET_ITEM(self, 1), argv, (size_t)nargs, kwnames);
}

static PyMethodDef launch_def = {"launch", (PyCFunction)(void (*)(void))launch, METH_FASTCALL | METH_KEYWORDS,
                                 "launch(grid, block, args=(), *, shared_mem=0, stream=None, cluster=None, "
                                 "cooperative=False)"};

/* launcher(state, slow) -> the builtin launch function of one kernel */
static PyObject *launcher(PyObject *module, PyObject *args) {
  PyObject *capsule, *slow;
  if (!PyArg_ParseTuple(args, "OO", &capsule, &slow)) return NULL;
  if (state_of(capsule) == NULL) return NULL;
  if (!PyCallable_Check(slow)) {
    PyErr_SetString(PyExc_TypeError, "slow must be callable");
    return NULL;
  }
  PyObject *bound = PyTuple_Pack(2, capsule, slow);
  if (bound == NULL) return NULL;
  PyObject *function = PyCFunction_New(&launch_def, bound);
  Py_DECREF(bound);
  return function;
}

static PyMethodDef methods[] = {
    {"new_state", new_state, METH_VARARGS, "new_state(function, layout) -> state"},
    {"set_plan", set_plan, METH_VARARGS, "set_plan(state, types, kinds)"},
    {"close", close_state, METH_O, "close(state)"},
    {"configure", configure, METH_VARARGS, "configure(launch_ex, readers, torch_functions, ensure_context, failed)"},
    {"launcher", launcher, METH_VARARGS, "launcher(state, slow) -> launch function"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "safejit_cuda_launch", NULL, -1, methods};

static int intern(PyObject **slot, const char *text) {
  *slot = PyUnicode_InternFromString(text);
  return *slot == NULL ? -1 : 0;
}

PyMODINIT_FUNC PyInit_safejit_cuda_launch(void) {
  const uint16_t probe = 1;
  if (*(const unsigned char *)&probe != 1) {
    PyErr_SetString(PyExc_ImportError, "the C launch path packs little-endian values only");
    return NULL;
  }
  if (intern(&s_grid, "grid") || intern(&s_block, "block") || intern(&s_args, "args") ||
      intern(&s_shared_mem, "shared_mem") || intern(&s_stream, "stream") || intern(&s_cluster, "cluster") ||
      intern(&s_cooperative, "cooperative") || intern(&s_data_ptr, "data_ptr") || intern(&s_data, "data") ||
      intern(&s_ptr, "ptr") || intern(&s_protocol, "__cuda_stream__") || intern(&s_torch, "torch"))
    return NULL;
  return PyModule_Create(&module_def);
}
