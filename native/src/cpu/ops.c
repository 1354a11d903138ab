/* ops.c - the CPU backend: matrix products over quantized weights, attention, small ops.
 *
 * Matrix products follow ggml: activations are quantized once to the weight type's vec_dot_type
 * (Q8_0 / Q8_K blocks), then each weight row is dotted against every token's row while it is hot
 * in cache. Rows are split across the pool's threads, so all threads work on every matrix. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../backend.h"
#include "../status.h"
#include "../types.h"
#include "dispatch.h"

typedef struct cpu_ctx {
    rm_pool * pool;
    uint8_t * xq;                 /* quantized activations: n_batch rows of up to max_in */
    uint64_t  xq_cap;
    float *   scores;             /* attention scores: n_threads rows of n_ctx */
    int32_t   n_ctx;
} cpu_ctx;

typedef struct mm_task {
    const rm_matmul_args *   a;
    const rm_type_traits *   tt;
    rm_vec_dot_fn            vec_dot;    /* the best kernel for the weight type (dispatch.c) */
    rm_from_float_fn         quantize;   /* and for its activation type */
    const uint8_t *          wdata;
    const uint8_t *          xq;
    uint64_t                 xq_stride;
} mm_task;

static void quantize_task(void * p, int ith, int nth) {
    mm_task * t = p;
    int64_t lo, hi;
    rm_split(t->a->n_tok, ith, nth, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) {
        t->quantize(t->a->x + i * t->a->x_stride, (uint8_t *) t->xq + i * t->xq_stride, t->a->w->ne[0]);
    }
}

static void matmul_task(void * p, int ith, int nth) {
    const mm_task * t = p;
    const rm_matmul_args * a = t->a;
    const int64_t n_in = a->w->ne[0];
    const uint64_t rb = a->w->row_bytes;
    int64_t lo, hi;
    rm_split(a->w->ne[1], ith, nth, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) {
        const uint8_t * wrow = t->wdata + (uint64_t) r * rb;
        for (int32_t i = 0; i < a->n_tok; i++) {
            float v;
            t->vec_dot(n_in, &v, wrow, t->xq + (uint64_t) i * t->xq_stride);
            float * y = a->y + (int64_t) i * a->y_stride + r;
            *y = a->accumulate ? *y + v : v;
        }
    }
}

static void cpu_matmul(rm_backend * be, const rm_matmul_args * a) {
    cpu_ctx * c = be->ctx;
    const rm_type_traits * tt = rm_type_traits_get(a->w->type);
    mm_task t = {a, tt, rm_cpu_vec_dot(a->w->type), rm_cpu_quantize(tt->vec_dot_type),
                 rm_weight_matrix(a->w, a->mat), NULL, 0};
    if (t.tt->vec_dot_type == RM_TYPE_F32) {
        t.xq = (const uint8_t *) a->x;
        t.xq_stride = (uint64_t) a->x_stride * sizeof(float);
    } else {
        t.xq = c->xq;
        t.xq_stride = rm_row_bytes(t.tt->vec_dot_type, a->w->ne[0]);
        RM_ASSERT(t.xq_stride * (uint64_t) a->n_tok <= c->xq_cap);
        rm_pool_run(c->pool, quantize_task, &t);
    }
    rm_pool_run(c->pool, matmul_task, &t);
}

typedef struct attn_task {
    const rm_attn_args * a;
    cpu_ctx *            c;
} attn_task;

static void attn_task_fn(void * p, int ith, int nth) {
    const attn_task * t = p;
    const rm_attn_args * a = t->a;
    const int32_t D = a->head_dim, group = a->n_head / a->n_head_kv;
    const int64_t q_stride = (int64_t) a->n_head * D, kv_stride = (int64_t) a->n_head_kv * D;
    const float scale = 1.0f / sqrtf((float) D);
    float * scores = t->c->scores + (int64_t) ith * t->c->n_ctx;
    int64_t lo, hi;
    rm_split((int64_t) a->n_tok * a->n_head, ith, nth, &lo, &hi);
    for (int64_t job = lo; job < hi; job++) {
        const int32_t i = (int32_t) (job / a->n_head), h = (int32_t) (job % a->n_head);
        const int32_t n_kv = a->pos0 + i + 1;
        const float * q = a->q + i * q_stride + (int64_t) h * D;
        const int64_t kv_off = (int64_t) (h / group) * D;
        for (int32_t p = 0; p < n_kv; p++) {
            const float * k = a->k_cache + p * kv_stride + kv_off;
            float s = 0.0f;
            for (int32_t d = 0; d < D; d++) {
                s += q[d] * k[d];
            }
            scores[p] = s * scale;
        }
        rm_softmax(scores, n_kv);
        float * out = a->out + i * q_stride + (int64_t) h * D;
        memset(out, 0, sizeof(float) * (size_t) D);
        for (int32_t p = 0; p < n_kv; p++) {
            const float * v = a->v_cache + p * kv_stride + kv_off;
            const float w = scores[p];
            for (int32_t d = 0; d < D; d++) {
                out[d] += w * v[d];
            }
        }
    }
}

static void cpu_attention(rm_backend * be, const rm_attn_args * a) {
    attn_task t = {a, be->ctx};
    rm_pool_run(((cpu_ctx *) be->ctx)->pool, attn_task_fn, &t);
}

rm_backend * rm_backend_cpu_new(rm_pool * pool, int32_t n_batch, int64_t max_in, int32_t n_ctx) {
    rm_backend * be = calloc(1, sizeof(*be));
    cpu_ctx * c = calloc(1, sizeof(*c));
    if (!be || !c) {
        free(be);
        free(c);
        return NULL;
    }
    c->pool = pool;
    c->n_ctx = n_ctx;
    c->xq_cap = (uint64_t) n_batch * (uint64_t) (max_in / 32 + 1) * 72 + 64;  /* room for F16 activations, the widest */
    c->xq = malloc(c->xq_cap);
    c->scores = malloc(sizeof(float) * (size_t) n_ctx * (size_t) rm_pool_size(pool));
    if (!c->xq || !c->scores) {
        free(c->xq);
        free(c->scores);
        free(c);
        free(be);
        return NULL;
    }
    be->name = "cpu";
    be->ctx = c;
    be->matmul = cpu_matmul;
    be->attention = cpu_attention;
    return be;
}

void rm_backend_cpu_free(rm_backend * be) {
    if (!be) {
        return;
    }
    cpu_ctx * c = be->ctx;
    free(c->xq);
    free(c->scores);
    free(c);
    free(be);
}

void rm_rmsnorm(float * y, const float * x, const float * w, int64_t n, float eps) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; i++) {
        ss += (double) x[i] * x[i];
    }
    const float scale = 1.0f / sqrtf((float) (ss / (double) n) + eps);
    for (int64_t i = 0; i < n; i++) {
        y[i] = x[i] * scale * w[i];
    }
}

void rm_rope(float * x, int32_t n_head, int32_t head_dim, int32_t n_rot, int32_t pos, float base, int neox) {
    const int32_t half = n_rot / 2;
    for (int32_t i = 0; i < half; i++) {
        const float inv_freq = 1.0f / powf(base, (float) (2 * i) / (float) n_rot);
        const float angle = (float) pos * inv_freq;
        const float c = cosf(angle), s = sinf(angle);
        for (int32_t h = 0; h < n_head; h++) {
            float * v = x + (int64_t) h * head_dim;
            const int32_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
            const float x0 = v[a], x1 = v[b];
            v[a] = x0 * c - x1 * s;
            v[b] = x0 * s + x1 * c;
        }
    }
}

void rm_softmax(float * x, int64_t n) {
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        mx = x[i] > mx ? x[i] : mx;
    }
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++) {
        x[i] = expf(x[i] - mx);
        sum += x[i];
    }
    const float inv = (float) (1.0 / sum);
    for (int64_t i = 0; i < n; i++) {
        x[i] *= inv;
    }
}
