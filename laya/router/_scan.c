/* The int8 pass of laya.router.vectorindex: which stored rows may reach their threshold?
 *
 * VectorIndex (see its docstring) bounds every stored vector's similarity to a
 * query by one dot product over a few dozen columns: the head of its rotated
 * coordinates and its length beyond them. Over 10,000 rows in float32 that
 * product reads 1.3 MB and, on the router's hot path, pushes everything else
 * out of the core's cache. Here the rows are stored as one byte per column
 * (a quarter of the bytes) and scanned with AVX-512 VNNI, 16 rows at a time.
 *
 * Rounding never drops a row that meets its threshold. The Python side folds
 * each row's own rounding error into its floor; this file adds the query's
 * (see `slack` below). Only rows that pass are scored in full, in float32, by
 * the caller: the answer stays the brute-force answer.
 *
 * Layout of `rows` (built by vectorindex.py): blocks of 16 rows; in each block,
 * the columns in quads of 4; in each quad, the 16 rows' 4 bytes side by side
 * (64 bytes, one load). A byte is the rounded column value plus 128 (VNNI
 * multiplies unsigned by signed bytes; the 128 is taken off again below).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define BLOCK_ROWS 16
#define QUAD 4
#define MAX_QUADS 64
#define QUERY_STEPS 32000.0f /* the query is rounded to 16 bits: its rounding costs almost nothing */

#define VNNI __attribute__((target("avx512f,avx512bw,avx512vnni")))

/* The rows of `rows` whose bound reaches their floor, written to `out`; returns how many.
 * `hi` and `lo`: the rounded query's high and low bytes (query = 256 * hi + lo), 4 per quad. */
VNNI static Py_ssize_t
scan_blocks(const uint8_t *rows, Py_ssize_t blocks, int quads, const int8_t *hi, const int8_t *lo,
            const float *floors, float scale, float offset, int32_t *out)
{
    __m512i qh[MAX_QUADS], ql[MAX_QUADS];
    for (int p = 0; p < quads; p++) {
        int32_t h, l;
        memcpy(&h, hi + QUAD * p, sizeof h);
        memcpy(&l, lo + QUAD * p, sizeof l);
        qh[p] = _mm512_set1_epi32(h);
        ql[p] = _mm512_set1_epi32(l);
    }
    const __m512 vscale = _mm512_set1_ps(scale), voffset = _mm512_set1_ps(offset);
    const size_t stride = (size_t)quads * BLOCK_ROWS * QUAD;
    Py_ssize_t count = 0;
    for (Py_ssize_t b = 0; b < blocks; b++) {
        const uint8_t *x = rows + (size_t)b * stride;
        /* Two accumulators, high and low query bytes, over the same loads. The OoO core overlaps the
         * blocks' chains of dependent instructions. */
        __m512i ah = _mm512_setzero_si512(), al = _mm512_setzero_si512();
        for (int p = 0; p < quads; p++) {
            __m512i w = _mm512_loadu_si512((const void *)(x + (size_t)p * BLOCK_ROWS * QUAD));
            ah = _mm512_dpbusd_epi32(ah, w, qh[p]);
            al = _mm512_dpbusd_epi32(al, w, ql[p]);
        }
        __m512i dot = _mm512_add_epi32(_mm512_slli_epi32(ah, 8), al);
        __m512 bound = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), vscale, voffset);
        __mmask16 hit = _mm512_cmp_ps_mask(bound, _mm512_loadu_ps(floors + b * BLOCK_ROWS), _CMP_GE_OQ);
        while (hit) {
            out[count++] = (int32_t)(b * BLOCK_ROWS + __builtin_ctz(hit));
            hit &= hit - 1;
        }
    }
    return count;
}

static int
vnni_available(void)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
        && __builtin_cpu_supports("avx512vnni");
#else
    return 0;
#endif
}

static PyObject *
supported(PyObject *self, PyObject *unused)
{
    return PyBool_FromLong(vnni_available());
}

/* scan(rows, query, floors, row_norm, out) -> count
 *
 * rows:     the layout above (uint8), len(floors) / 16 blocks of 16 * columns bytes
 * query:    float32, one entry per column, already multiplied by each column's scale
 *           (so that query . rounded_row approximates the bound)
 * floors:   float32, one per row (padding rows: +inf), each threshold less the row's own rounding error
 * row_norm: the largest length of a rounded row (the query's rounding error is at most its own
 *           length times this)
 * out:      int32, writable, at least len(floors) entries
 */
static PyObject *
scan(PyObject *self, PyObject *args)
{
    Py_buffer rows, query, floors, out;
    double row_norm;
    if (!PyArg_ParseTuple(args, "y*y*y*dw*", &rows, &query, &floors, &row_norm, &out))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t columns = query.len / (Py_ssize_t)sizeof(float);
    Py_ssize_t n = floors.len / (Py_ssize_t)sizeof(float);
    if (columns % QUAD || columns / QUAD > MAX_QUADS || n % BLOCK_ROWS
            || rows.len != n * columns || out.len < n * (Py_ssize_t)sizeof(int32_t)) {
        PyErr_SetString(PyExc_ValueError, "scan: buffer sizes do not match the layout (see _scan.c)");
        goto done;
    }
    if (!vnni_available()) {
        PyErr_SetString(PyExc_RuntimeError, "scan: this CPU has no AVX-512 VNNI (check supported() first)");
        goto done;
    }
    /* Round the query to 16 bits, t per step; remember what the rounding lost. */
    const float *q = (const float *)query.buf;
    float largest = 0.0f;
    for (Py_ssize_t j = 0; j < columns; j++)
        largest = fmaxf(largest, fabsf(q[j]));
    float step = largest > 0.0f ? largest / QUERY_STEPS : 1.0f;
    int8_t hi[MAX_QUADS * QUAD], lo[MAX_QUADS * QUAD];
    double total = 0.0, lost = 0.0;
    for (Py_ssize_t j = 0; j < columns; j++) {
        int32_t v = (int32_t)lrintf(q[j] / step);
        int32_t h = (v + 128) >> 8;
        hi[j] = (int8_t)h;
        lo[j] = (int8_t)(v - 256 * h);
        total += v;
        lost += ((double)q[j] - (double)step * v) * ((double)q[j] - (double)step * v);
    }
    /* The stored bytes are value + 128: their dot with the query is 128 * sum(query) too many, taken
     * off in float32 once per row. By Cauchy-Schwarz the query's rounding moves the dot by at most
     * |lost| * |row|. Float32 rounds the int32 dot, the product and the offset each by at most 2^-24
     * of their size (|step * dot| is at most |bias| + 2); 2^-22 of that covers all three. */
    double bias = -128.0 * step * total;
    double slack = sqrt(lost) * row_norm + ldexp(fabs(bias) + 2.0, -22);
    float offset = (float)(bias + slack);
    Py_ssize_t count;
    Py_BEGIN_ALLOW_THREADS
    count = scan_blocks((const uint8_t *)rows.buf, n / BLOCK_ROWS, (int)(columns / QUAD), hi, lo,
                        (const float *)floors.buf, step, offset, (int32_t *)out.buf);
    Py_END_ALLOW_THREADS
    result = PyLong_FromSsize_t(count);
done:
    PyBuffer_Release(&rows);
    PyBuffer_Release(&query);
    PyBuffer_Release(&floors);
    PyBuffer_Release(&out);
    return result;
}

static PyMethodDef methods[] = {
    {"supported", supported, METH_NOARGS, "Whether this CPU runs scan() (AVX-512 with VNNI)."},
    {"scan", scan, METH_VARARGS, "The rows whose int8 bound reaches their floor (see _scan.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_scan", NULL, -1, methods};

PyMODINIT_FUNC
PyInit__scan(void)
{
    return PyModule_Create(&module);
}
