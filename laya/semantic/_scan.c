/* The int8 pass of laya.semantic.vectorindex: which stored rows may reach their threshold?
 *
 * VectorIndex (see its docstring) bounds every stored vector's similarity to a
 * query by one dot product over a few dozen columns: the head of its rotated
 * coordinates and its length beyond them. Over 10,000 rows in float32 that
 * product reads 1.3 MB and, on the router's hot path, pushes everything else
 * out of the core's cache. Here the rows are stored as one byte per column
 * (a quarter of the bytes) and scanned 16 rows at a time: with AVX-512 VNNI where
 * the CPU has it, else with AVX2 (most x86 CPUs of the last ten years). Both give
 * the same integer sums; `select()` picks one (the tests run both).
 *
 * Rounding never drops a row that meets its threshold. The Python side folds
 * each row's own rounding error into its floor; this file adds the query's
 * (see `slack` below). Only rows that pass are scored in full, in float32
 * (`refine`), so the answer stays the brute-force answer. `search()` does all
 * of VectorIndex.search in one call; `scan()` is the int8 pass alone.
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
#define MAX_QUADS 64 /* 256 columns; more could overflow the int32 sums (256 * 255 * 32000 is just under 2^31) */
#define QUERY_STEPS 32000.0f /* the query is rounded to 16 bits: its rounding costs almost nothing */

#define VNNI __attribute__((target("avx512f,avx512bw,avx512vnni")))
#define AVX2 __attribute__((target("avx2,fma")))
/* Plain C that the compiler vectorises, once per instruction set, picked at load (GCC's ifuncs). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__linux__)
#define PORTABLE __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define PORTABLE
#endif

enum { NONE, WITH_AVX2, WITH_VNNI };
static int level = NONE; /* the kernel in use: the best this CPU has, or what select() chose */

/* The rows of `rows` whose bound reaches their floor, written to `out`; returns how many.
 * `hi` and `lo`: the rounded query's high and low bytes (query = 256 * hi + lo), 4 per quad. */
VNNI static Py_ssize_t
scan_vnni(const uint8_t *rows, Py_ssize_t blocks, int quads, const int8_t *hi, const int8_t *lo,
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

/* The same sums with AVX2: each row's bytes widened to 16 bits and multiplied by the 16-bit query
 * (`value`), two columns per 32-bit lane, the lanes' pairs added at the end of the block. */
AVX2 static Py_ssize_t
scan_avx2(const uint8_t *rows, Py_ssize_t blocks, int quads, const int16_t *value, const float *floors,
          float scale, float offset, int32_t *out)
{
    __m256i qv[MAX_QUADS];
    for (int p = 0; p < quads; p++) {
        int64_t four;
        memcpy(&four, value + QUAD * p, sizeof four);
        qv[p] = _mm256_set1_epi64x(four);
    }
    const __m256 vscale = _mm256_set1_ps(scale), voffset = _mm256_set1_ps(offset);
    /* hadd_epi32 of two accumulators gives rows 0 1 4 5 2 3 6 7 (per 128-bit half): put them in order */
    const __m256i order = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
    const size_t stride = (size_t)quads * BLOCK_ROWS * QUAD;
    Py_ssize_t count = 0;
    for (Py_ssize_t b = 0; b < blocks; b++) {
        const uint8_t *x = rows + (size_t)b * stride;
        __m256i acc[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                          _mm256_setzero_si256()}; /* rows 4k..4k+3, two lanes each */
        for (int p = 0; p < quads; p++) {
            const uint8_t *quad = x + (size_t)p * BLOCK_ROWS * QUAD;
            for (int k = 0; k < 4; k++) {
                __m256i w = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(quad + 16 * k)));
                acc[k] = _mm256_add_epi32(acc[k], _mm256_madd_epi16(w, qv[p]));
            }
        }
        for (int half = 0; half < 2; half++) {
            __m256i dot = _mm256_permutevar8x32_epi32(_mm256_hadd_epi32(acc[2 * half], acc[2 * half + 1]), order);
            __m256 bound = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), vscale, voffset);
            const float *floor = floors + b * BLOCK_ROWS + 8 * half;
            int hit = _mm256_movemask_ps(_mm256_cmp_ps(bound, _mm256_loadu_ps(floor), _CMP_GE_OQ));
            while (hit) {
                out[count++] = (int32_t)(b * BLOCK_ROWS + 8 * half + __builtin_ctz(hit));
                hit &= hit - 1;
            }
        }
    }
    return count;
}

static int
best_level(void)
{
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
            && __builtin_cpu_supports("avx512vnni"))
        return WITH_VNNI;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        return WITH_AVX2;
#endif
    return NONE;
}

static const char *const LEVEL_NAMES[] = {"none", "avx2", "avx512-vnni"};

static PyObject *
supported(PyObject *self, PyObject *unused)
{
    return PyBool_FromLong(level != NONE);
}

static PyObject *
kernel(PyObject *self, PyObject *unused)
{
    return PyUnicode_FromString(LEVEL_NAMES[level]);
}

/* select(name) -> the name before: use a kernel this CPU has ("avx2" on a VNNI CPU, to test it). */
static PyObject *
select_kernel(PyObject *self, PyObject *args)
{
    const char *name;
    if (!PyArg_ParseTuple(args, "s", &name))
        return NULL;
    int before = level, best = best_level();
    for (int wanted = NONE; wanted <= WITH_VNNI; wanted++) {
        if (strcmp(name, LEVEL_NAMES[wanted]) == 0) {
            if (wanted > best) {
                PyErr_Format(PyExc_ValueError, "select: this CPU cannot run the %s kernel (its best: %s)", name,
                             LEVEL_NAMES[best]);
                return NULL;
            }
            level = wanted;
            return PyUnicode_FromString(LEVEL_NAMES[before]);
        }
    }
    PyErr_Format(PyExc_ValueError, "select: no kernel %R; use \"avx2\", \"avx512-vnni\" or \"none\"", args);
    return NULL;
}

/* The query side rounded to 16 bits, as high and low bytes (value = 256 * hi + lo), and the
 * bound's step and offset: bound = step * dot + offset, never below the true bound. */
typedef struct {
    int16_t value[MAX_QUADS * QUAD];
    int8_t hi[MAX_QUADS * QUAD], lo[MAX_QUADS * QUAD];
    float step, offset;
} Rounded;

static void
round_query(const float *q, Py_ssize_t columns, double row_norm, Rounded *r)
{
    float largest = 0.0f;
    for (Py_ssize_t j = 0; j < columns; j++)
        largest = fmaxf(largest, fabsf(q[j]));
    r->step = largest > 0.0f ? largest / QUERY_STEPS : 1.0f;
    double total = 0.0, lost = 0.0;
    for (Py_ssize_t j = 0; j < columns; j++) {
        int32_t v = (int32_t)lrintf(q[j] / r->step);
        int32_t h = (v + 128) >> 8;
        r->value[j] = (int16_t)v;
        r->hi[j] = (int8_t)h;
        r->lo[j] = (int8_t)(v - 256 * h);
        total += v;
        double miss = (double)q[j] - (double)r->step * v;
        lost += miss * miss;
    }
    /* The stored bytes are value + 128: their dot with the query is 128 * sum(query) too many, taken
     * off in float32 once per row. By Cauchy-Schwarz the query's rounding moves the dot by at most
     * |lost| * |row|. Float32 rounds the int32 dot, the product and the offset each by at most 2^-24
     * of their size (|step * dot| is at most |bias| + 2); 2^-22 of that covers all three. */
    double bias = -128.0 * r->step * total;
    double slack = sqrt(lost) * row_norm + ldexp(fabs(bias) + 2.0, -22);
    r->offset = (float)(bias + slack);
}

/* The query's side of the bound: its coordinates on the head axes (`axes`: dim rows of `head` floats,
 * summed in double, so that their rounding stays far below the floors' slack), its length beyond
 * them, then zeros to `columns`; each times its column's scale. Returns the side's squared length. */
PORTABLE static double
query_side(const float *query, const float *axes, Py_ssize_t dim, Py_ssize_t head, const float *scales,
           Py_ssize_t columns, float *side)
{
    double sums[MAX_QUADS * QUAD] = {0};
    double length = 0.0;
    for (Py_ssize_t d = 0; d < dim; d++) {
        const double x = query[d];
        const float *axis = axes + d * head;
        for (Py_ssize_t j = 0; j < head; j++)
            sums[j] += x * axis[j];
        length += x * x;
    }
    double inside = 0.0;
    for (Py_ssize_t j = 0; j < columns; j++) {
        side[j] = (float)sums[j];
        inside += j < head ? sums[j] * sums[j] : 0.0;
    }
    /* The slack under the root covers the cancellation of a short tail (as in vectorindex.py). */
    side[head] = (float)sqrt(fmax(0.0, length - inside) + 1e-6);
    double reach = inside + (double)side[head] * side[head];
    for (Py_ssize_t j = 0; j <= head; j++)
        side[j] *= scales[j];
    return reach;
}

/* Each candidate's full similarity, summed in 16 lanes of float32 (as a BLAS product sums, and the
 * same on every CPU); keep those that reach their threshold. Returns how many were kept, moved to the
 * front of `found`. */
PORTABLE static Py_ssize_t
refine(const float *vectors, Py_ssize_t size, Py_ssize_t dim, const float *query, const float *thresholds,
       int32_t *found, float *scores, Py_ssize_t count)
{
    Py_ssize_t kept = 0;
    for (Py_ssize_t c = 0; c < count; c++) {
        if (found[c] >= size)
            continue; /* a padding row (its floor is +inf, so only a caller's bad floors get here) */
        const float *row = vectors + (size_t)found[c] * dim;
        float lanes[16] = {0};
        Py_ssize_t d = 0;
        for (; d + 16 <= dim; d += 16)
            for (int k = 0; k < 16; k++)
                lanes[k] += row[d + k] * query[d + k];
        float score = 0.0f;
        for (int k = 0; k < 16; k++)
            score += lanes[k];
        for (; d < dim; d++)
            score += row[d] * query[d];
        if (score >= thresholds[found[c]]) {
            found[kept] = found[c];
            scores[kept++] = score;
        }
    }
    return kept;
}

/* The kept rows best first: by `order` (lower first), then score (higher first), then row. A few
 * dozen at most: an insertion sort. */
static void
best_first(int32_t *found, float *scores, Py_ssize_t count, const int32_t *order)
{
    for (Py_ssize_t i = 1; i < count; i++) {
        int32_t row = found[i];
        float score = scores[i];
        Py_ssize_t j = i;
        while (j > 0) {
            int32_t other = found[j - 1];
            int before = order[row] < order[other]
                || (order[row] == order[other] && (score > scores[j - 1] || (score == scores[j - 1] && row < other)));
            if (!before)
                break;
            found[j] = other;
            scores[j] = scores[j - 1];
            j--;
        }
        found[j] = row;
        scores[j] = score;
    }
}

/* sum = the table's rows `id`, added in order. */
PORTABLE static void
add_rows(const float *table, Py_ssize_t dim, const int32_t *id, Py_ssize_t count, float *sum)
{
    for (Py_ssize_t d = 0; d < dim; d++)
        sum[d] = 0.0f;
    for (Py_ssize_t i = 0; i < count; i++) {
        const float *row = table + (size_t)id[i] * dim;
        for (Py_ssize_t d = 0; d < dim; d++)
            sum[d] += row[d];
    }
}

/* The int8 pass with the kernel in use. */
static Py_ssize_t
scan_rows(const uint8_t *rows, Py_ssize_t n, Py_ssize_t columns, const Rounded *r, const float *floors, int32_t *out)
{
    int quads = (int)(columns / QUAD);
    if (level == WITH_VNNI)
        return scan_vnni(rows, n / BLOCK_ROWS, quads, r->hi, r->lo, floors, r->step, r->offset, out);
    return scan_avx2(rows, n / BLOCK_ROWS, quads, r->value, floors, r->step, r->offset, out);
}

static int
layout_ok(Py_ssize_t columns, Py_ssize_t n, Py_ssize_t rows_len)
{
    if (columns % QUAD || columns / QUAD > MAX_QUADS || n % BLOCK_ROWS || rows_len != n * columns) {
        PyErr_SetString(PyExc_ValueError, "_scan: buffer sizes do not match the layout (see _scan.c)");
        return 0;
    }
    if (level == NONE) {
        PyErr_SetString(PyExc_RuntimeError, "_scan: this CPU has neither AVX2 nor AVX-512 VNNI (check supported())");
        return 0;
    }
    return 1;
}

/* scan(rows, side, floors, row_norm, out) -> count: the int8 pass alone.
 *
 * rows:     the layout above (uint8), len(floors) / 16 blocks of 16 * columns bytes
 * side:     float32, the query's side of the bound, one entry per column, already multiplied by
 *           each column's scale (so that side . rounded_row approximates the bound)
 * floors:   float32, one per row (padding rows: +inf), each threshold less the row's own rounding error
 * row_norm: the largest length of a rounded row (the query's rounding error is at most its own
 *           length times this)
 * out:      int32, writable, at least len(floors) entries
 */
static PyObject *
scan(PyObject *self, PyObject *args)
{
    Py_buffer rows, side, floors, out;
    double row_norm;
    if (!PyArg_ParseTuple(args, "y*y*y*dw*", &rows, &side, &floors, &row_norm, &out))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t columns = side.len / (Py_ssize_t)sizeof(float), n = floors.len / (Py_ssize_t)sizeof(float);
    if (layout_ok(columns, n, rows.len) && out.len >= n * (Py_ssize_t)sizeof(int32_t)) {
        Rounded r;
        round_query((const float *)side.buf, columns, row_norm, &r);
        Py_ssize_t count = scan_rows((const uint8_t *)rows.buf, n, columns, &r, (const float *)floors.buf,
                                     (int32_t *)out.buf);
        result = PyLong_FromSsize_t(count);
    } else if (!PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "_scan: out is shorter than floors");
    }
    PyBuffer_Release(&rows);
    PyBuffer_Release(&side);
    PyBuffer_Release(&floors);
    PyBuffer_Release(&out);
    return result;
}

/* search(query, axes, scales, rows, floors, row_norm, longest, vectors, thresholds, order, found, scores) -> count
 *
 * The whole of VectorIndex.search in one call: the query's side of the bound (its head on `axes`,
 * float32, dim x head; its length beyond), the int8 pass, then the candidates scored in full
 * against `vectors` (float32, rows x dim) and kept where they reach `thresholds`. Their indices go
 * to `found` (int32) and their similarities to `scores` (float32), both at least len(floors) long,
 * best first: by `order` (int32, one per row; lower first), then similarity, then row.
 * Returns -1, with nothing written, when the side's squared length is over `longest` (the floors
 * paid for rounding up to that length): the caller takes the float32 path.
 */
static PyObject *
search(PyObject *self, PyObject *args)
{
    Py_buffer query, axes, scales, rows, floors, vectors, thresholds, order, found, scores;
    double row_norm, longest;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*ddy*y*y*w*w*", &query, &axes, &scales, &rows, &floors, &row_norm,
                          &longest, &vectors, &thresholds, &order, &found, &scores))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t dim = query.len / (Py_ssize_t)sizeof(float), columns = scales.len / (Py_ssize_t)sizeof(float);
    Py_ssize_t n = floors.len / (Py_ssize_t)sizeof(float), size = thresholds.len / (Py_ssize_t)sizeof(float);
    Py_ssize_t head = dim ? axes.len / (Py_ssize_t)sizeof(float) / dim : 0;
    if (!layout_ok(columns, n, rows.len))
        goto done;
    if (head + 1 > columns || axes.len != dim * head * (Py_ssize_t)sizeof(float) || size > n
            || vectors.len != size * dim * (Py_ssize_t)sizeof(float) || order.len != size * (Py_ssize_t)sizeof(int32_t)
            || found.len < n * (Py_ssize_t)sizeof(int32_t) || scores.len < n * (Py_ssize_t)sizeof(float)) {
        PyErr_SetString(PyExc_ValueError, "_scan.search: buffer sizes do not agree (see _scan.c)");
        goto done;
    }
    float side[MAX_QUADS * QUAD];
    if (query_side((const float *)query.buf, (const float *)axes.buf, dim, head, (const float *)scales.buf,
                   columns, side) > longest) {
        result = PyLong_FromLong(-1);
        goto done;
    }
    Rounded r;
    round_query(side, columns, row_norm, &r);
    int32_t *out = (int32_t *)found.buf;
    Py_ssize_t count = scan_rows((const uint8_t *)rows.buf, n, columns, &r, (const float *)floors.buf, out);
    count = refine((const float *)vectors.buf, size, dim, (const float *)query.buf, (const float *)thresholds.buf, out,
                   (float *)scores.buf, count);
    best_first(out, (float *)scores.buf, count, (const int32_t *)order.buf);
    result = PyLong_FromSsize_t(count);
done:
    PyBuffer_Release(&query);
    PyBuffer_Release(&axes);
    PyBuffer_Release(&scales);
    PyBuffer_Release(&rows);
    PyBuffer_Release(&floors);
    PyBuffer_Release(&vectors);
    PyBuffer_Release(&thresholds);
    PyBuffer_Release(&order);
    PyBuffer_Release(&found);
    PyBuffer_Release(&scores);
    return result;
}

/* embed(table, ids, out) -> length: out = the sum of table's rows `ids` (int32), divided by its length
 * (left as is when that is 0); returns the length before. The embedder's sum (laya/semantic/embedder.py),
 * in 16 float32 lanes per step as numpy sums a row's columns: numpy's three calls cost more than the sum. */
static PyObject *
embed(PyObject *self, PyObject *args)
{
    Py_buffer table, ids, out;
    if (!PyArg_ParseTuple(args, "y*y*w*", &table, &ids, &out))
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t dim = out.len / (Py_ssize_t)sizeof(float), count = ids.len / (Py_ssize_t)sizeof(int32_t);
    Py_ssize_t rows = dim ? table.len / (Py_ssize_t)sizeof(float) / dim : 0;
    const int32_t *id = (const int32_t *)ids.buf;
    int ok = dim > 0 && table.len == rows * dim * (Py_ssize_t)sizeof(float);
    for (Py_ssize_t i = 0; ok && i < count; i++)
        ok = id[i] >= 0 && id[i] < rows;
    if (!ok) {
        PyErr_SetString(PyExc_ValueError, "_scan.embed: an id outside the table, or sizes that do not agree");
    } else {
        float *sum = (float *)out.buf;
        add_rows((const float *)table.buf, dim, id, count, sum);
        double length = 0.0;
        for (Py_ssize_t d = 0; d < dim; d++)
            length += (double)sum[d] * sum[d];
        length = sqrt(length);
        if (length > 0.0)
            for (Py_ssize_t d = 0; d < dim; d++)
                sum[d] = (float)(sum[d] / length);
        result = PyFloat_FromDouble(length);
    }
    PyBuffer_Release(&table);
    PyBuffer_Release(&ids);
    PyBuffer_Release(&out);
    return result;
}

static PyMethodDef methods[] = {
    {"supported", supported, METH_NOARGS, "Whether a kernel is in use (this CPU has AVX2 or AVX-512 VNNI)."},
    {"kernel", kernel, METH_NOARGS, "The kernel in use: \"avx512-vnni\", \"avx2\" or \"none\"."},
    {"select", select_kernel, METH_VARARGS, "Use another kernel this CPU has; returns the one before."},
    {"scan", scan, METH_VARARGS, "The rows whose int8 bound reaches their floor (see _scan.c)."},
    {"embed", embed, METH_VARARGS, "The embedder's normalised row sum (see _scan.c)."},
    {"search", search, METH_VARARGS, "VectorIndex.search in one call: bound, int8 pass, full scores (see _scan.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_scan", NULL, -1, methods};

PyMODINIT_FUNC
PyInit__scan(void)
{
    level = best_level();
    return PyModule_Create(&module);
}
