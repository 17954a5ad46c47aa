/* The typo table's two hot loops in C: a key's variant hashes, and the probe of the packed
 * shards. identity_server/typo_table.py holds the design and the same loops in Python, which
 * run when this module is not built; tests/unit/test_typo_native.py checks that both give the
 * same answers. Neither function calls back into Python code or releases the GIL, so the
 * shards it reads cannot change under it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* variant_hashes(key, base, seed) -> list[int]
 * The polynomial hash h = h * base + ord(c) (mod 2**64, from seed) of key, then of each string
 * one deletion away from key, the deletion of the last character first: the order of
 * typo_table.variant_hashes. Without key[i] the hash is prefix(i) * base**(n-1-i) + suffix(i+1),
 * so one pass gives them all. */
static PyObject *
variant_hashes(PyObject *self, PyObject *args)
{
    PyObject *key;
    unsigned long long base, seed;
    if (!PyArg_ParseTuple(args, "UKK:variant_hashes", &key, &base, &seed))
        return NULL;
    Py_ssize_t n = PyUnicode_GET_LENGTH(key);
    int kind = PyUnicode_KIND(key);
    const void *data = PyUnicode_DATA(key);
    uint64_t *prefix = PyMem_Malloc((size_t)(n + 1) * sizeof(uint64_t));
    if (prefix == NULL)
        return PyErr_NoMemory();
    PyObject *out = PyList_New(n + 1);
    if (out == NULL) {
        PyMem_Free(prefix);
        return NULL;
    }
    uint64_t h = seed;
    prefix[0] = h;
    for (Py_ssize_t i = 0; i < n; i++) {
        h = h * base + (uint64_t)PyUnicode_READ(kind, data, i);
        prefix[i + 1] = h;
    }
    PyObject *item = PyLong_FromUnsignedLongLong(h);
    if (item == NULL)
        goto fail;
    PyList_SET_ITEM(out, 0, item);
    uint64_t suffix = 0, power = 1;
    for (Py_ssize_t i = n - 1, slot = 1; i >= 0; i--, slot++) {
        item = PyLong_FromUnsignedLongLong(prefix[i] * power + suffix);
        if (item == NULL)
            goto fail;
        PyList_SET_ITEM(out, slot, item);
        suffix += (uint64_t)PyUnicode_READ(kind, data, i) * power;
        power *= base;
    }
    PyMem_Free(prefix);
    return out;
fail:
    PyMem_Free(prefix);
    Py_DECREF(out);
    return NULL;
}

/* probe(hashes, shards, anchors, found) -> None
 * For each variant hash, the words of its bucket in its shard whose high bits equal the
 * hash's: each names an anchor number, whose key (anchors[number]) is added to the set found.
 * shards: the table's list of _Shard tuples (words, bucket_starts, shift, bucket_mask,
 * hash_mask, number_mask, ...), the two views over C-contiguous arrays of uint64 words and of
 * uint32 or uint64 bucket starts.
 *
 * A key's probes land in random places of a table of hundreds of MB, so each costs cache and
 * TLB misses, not instructions. They are taken a chunk at a time in three passes (find each
 * bucket's start, then its words, then read them), each pass prefetching what the next reads,
 * so that the misses of a chunk's probes overlap instead of following one another. */
#define SHARD_SHIFT 60
#define CHUNK 32

typedef struct {
    const uint64_t *words;
    Py_ssize_t n_words;
    const void *starts;
    Py_ssize_t starts_itemsize;
    uint64_t hash_mask, number_mask, wanted, bucket, first, last;
} Probe;

static int
read_field(PyObject *shard, Py_ssize_t field, uint64_t *out)
{
    unsigned long long v = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(shard, field));
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        return -1;
    *out = (uint64_t)v;
    return 0;
}

/* The probe of one hash: its shard's arrays and masks, and its bucket. */
static int
locate(Probe *p, unsigned long long hashed, PyObject *shards)
{
    Py_ssize_t s = (Py_ssize_t)(hashed >> SHARD_SHIFT);
    if (s >= PyList_GET_SIZE(shards)) {
        PyErr_SetString(PyExc_ValueError, "probe: fewer shards than the hash bits name");
        return -1;
    }
    PyObject *shard = PyList_GET_ITEM(shards, s);
    if (!PyTuple_Check(shard) || PyTuple_GET_SIZE(shard) < 6
        || !PyMemoryView_Check(PyTuple_GET_ITEM(shard, 0))
        || !PyMemoryView_Check(PyTuple_GET_ITEM(shard, 1))) {
        PyErr_SetString(PyExc_TypeError, "probe: a shard is not a _Shard");
        return -1;
    }
    Py_buffer *words = PyMemoryView_GET_BUFFER(PyTuple_GET_ITEM(shard, 0));
    Py_buffer *starts = PyMemoryView_GET_BUFFER(PyTuple_GET_ITEM(shard, 1));
    uint64_t shift, bucket_mask;
    if (read_field(shard, 2, &shift) || read_field(shard, 3, &bucket_mask)
        || read_field(shard, 4, &p->hash_mask) || read_field(shard, 5, &p->number_mask))
        return -1;
    if (words->itemsize != 8 || (starts->itemsize != 4 && starts->itemsize != 8)
        || !PyBuffer_IsContiguous(words, 'C') || !PyBuffer_IsContiguous(starts, 'C')
        || shift > 63) {
        PyErr_SetString(PyExc_TypeError, "probe: unexpected shard layout");
        return -1;
    }
    p->words = (const uint64_t *)words->buf;
    p->n_words = words->len / 8;
    p->starts = starts->buf;
    p->starts_itemsize = starts->itemsize;
    p->wanted = (uint64_t)hashed & p->hash_mask;
    p->bucket = (p->wanted >> shift) & bucket_mask;
    if ((Py_ssize_t)p->bucket + 1 >= starts->len / starts->itemsize) {
        PyErr_SetString(PyExc_IndexError, "probe: bucket beyond the directory");
        return -1;
    }
    return 0;
}

static PyObject *
probe(PyObject *self, PyObject *args)
{
    PyObject *hashes, *shards, *anchors, *found;
    if (!PyArg_ParseTuple(args, "O!O!O!O!:probe", &PyList_Type, &hashes, &PyList_Type, &shards,
                          &PyList_Type, &anchors, &PySet_Type, &found))
        return NULL;
    Py_ssize_t count = PyList_GET_SIZE(hashes), n_anchors = PyList_GET_SIZE(anchors);
    Probe chunk[CHUNK];
    for (Py_ssize_t done = 0; done < count; done += CHUNK) {
        int size = (int)(count - done < CHUNK ? count - done : CHUNK);
        for (int i = 0; i < size; i++) {  /* each bucket, and prefetch its start */
            Probe *p = &chunk[i];
            unsigned long long hashed = PyLong_AsUnsignedLongLong(
                PyList_GET_ITEM(hashes, done + i));
            if (hashed == (unsigned long long)-1 && PyErr_Occurred())
                return NULL;
            if (locate(p, hashed, shards) < 0)
                return NULL;
            __builtin_prefetch((const char *)p->starts + p->bucket * p->starts_itemsize);
        }
        for (int i = 0; i < size; i++) {  /* each bucket's words, and prefetch the first */
            Probe *p = &chunk[i];
            if (p->starts_itemsize == 4) {
                const uint32_t *at = (const uint32_t *)p->starts + p->bucket;
                p->first = at[0];
                p->last = at[1];
            } else {
                const uint64_t *at = (const uint64_t *)p->starts + p->bucket;
                p->first = at[0];
                p->last = at[1];
            }
            if (p->last > (uint64_t)p->n_words)
                p->last = (uint64_t)p->n_words;
            if (p->first < p->last)
                __builtin_prefetch(p->words + p->first);
        }
        for (int i = 0; i < size; i++) {  /* the words that carry the hash name the anchors */
            Probe *p = &chunk[i];
            for (uint64_t w = p->first; w < p->last; w++) {
                if ((p->words[w] & p->hash_mask) != p->wanted)
                    continue;
                uint64_t number = p->words[w] & p->number_mask;
                if (number >= (uint64_t)n_anchors) {
                    PyErr_SetString(PyExc_IndexError, "probe: anchor number beyond the anchors");
                    return NULL;
                }
                if (PySet_Add(found, PyList_GET_ITEM(anchors, (Py_ssize_t)number)) < 0)
                    return NULL;
            }
        }
    }
    Py_RETURN_NONE;
}

/* probe_overlay(hashes, overlay, found) -> None
 * Add to the set found the anchor keys the overlay (a dict: variant hash -> a key, or a set of
 * keys) files under any of the hashes. */
static PyObject *
probe_overlay(PyObject *self, PyObject *args)
{
    PyObject *hashes, *overlay, *found;
    if (!PyArg_ParseTuple(args, "O!O!O!:probe_overlay", &PyList_Type, &hashes, &PyDict_Type,
                          &overlay, &PySet_Type, &found))
        return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(hashes); i++) {
        PyObject *hit = PyDict_GetItemWithError(overlay, PyList_GET_ITEM(hashes, i));
        if (hit == NULL) {
            if (PyErr_Occurred())
                return NULL;
            continue;
        }
        if (PyUnicode_Check(hit)) {
            if (PySet_Add(found, hit) < 0)
                return NULL;
            continue;
        }
        PyObject *keys = PyObject_GetIter(hit);  /* several keys: a set (rare) */
        if (keys == NULL)
            return NULL;
        PyObject *k;
        while ((k = PyIter_Next(keys)) != NULL) {
            int failed = PySet_Add(found, k) < 0;
            Py_DECREF(k);
            if (failed) {
                Py_DECREF(keys);
                return NULL;
            }
        }
        Py_DECREF(keys);
        if (PyErr_Occurred())
            return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"variant_hashes", variant_hashes, METH_VARARGS,
     "variant_hashes(key, base, seed): the hashes of key and of each deletion variant."},
    {"probe", probe, METH_VARARGS,
     "probe(hashes, shards, anchors, found): add the anchors the packed shards file under "
     "the hashes to found."},
    {"probe_overlay", probe_overlay, METH_VARARGS,
     "probe_overlay(hashes, overlay, found): add the anchors the overlay files under the "
     "hashes to found."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_typo_native",
    "The typo table's variant hashing and shard probe in C (see typo_table.py).", -1, methods,
};

PyMODINIT_FUNC
PyInit__typo_native(void)
{
    return PyModule_Create(&module);
}
