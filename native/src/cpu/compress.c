/* cpu/compress.c - DeepSeek-V4's compressor on the CPU backend (backend.h's compress): the threads
 * take windows in turn; each entry's floats are computed in one order whatever the step holds, so a
 * window compresses alike in a prefill and in a decode. */
#include <math.h>

#include "cpu_ops.h"

typedef struct compress_task {
    const rm_compress_args * a;
} compress_task;

/* Window w's entry: per dim, a softmax over its slots' gates of their kv values. */
static void entry_of(const rm_compress_args * a, int32_t w, float * out) {
    const int32_t D = a->head_dim, R = a->ratio, W = a->overlap ? 2 * D : D, off = a->overlap ? D : 0;
    const float * ape = (const float *) a->ape->data;
    const float * kv = a->kv + (int64_t) w * R * W, * gate = a->gate + (int64_t) w * R * W;
    const float * pkv = w > 0 ? kv - (int64_t) R * W : a->prev_kv, * pgate = w > 0 ? gate - (int64_t) R * W : a->prev_gate;
    const int prev = a->overlap && pkv != NULL;
    for (int32_t d = 0; d < D; d++) {
        float mx = -INFINITY;
        for (int32_t j = 0; j < R; j++) {
            mx = fmaxf(mx, gate[(int64_t) j * W + off + d] + ape[(int64_t) j * W + off + d]);
            if (prev) {
                mx = fmaxf(mx, pgate[(int64_t) j * W + d] + ape[(int64_t) j * W + d]);
            }
        }
        float sum = 0.0f, acc = 0.0f;
        for (int32_t j = 0; j < R; j++) {
            if (prev) {
                const float e = expf(pgate[(int64_t) j * W + d] + ape[(int64_t) j * W + d] - mx);
                sum += e;
                acc += e * pkv[(int64_t) j * W + d];
            }
            const float e = expf(gate[(int64_t) j * W + off + d] + ape[(int64_t) j * W + off + d] - mx);
            sum += e;
            acc += e * kv[(int64_t) j * W + off + d];
        }
        out[d] = acc / sum;
    }
    rm_rmsnorm(out, out, (const float *) a->norm->data, D, a->eps);
    /* the last n_rot dims: one head of n_rot, interleaved pairs */
    if (a->yarn) {
        rm_rope_yarn_row(out + (D - a->n_rot), 1, a->n_rot, a->n_rot, a->pos0 + w * R, a->yarn, 0);
    } else {
        rm_rope(out + (D - a->n_rot), 1, a->n_rot, a->n_rot, a->pos0 + w * R, a->rope_base, 0);
    }
}

static void compress_task_fn(void * ctx, int ith, int nth) {
    const rm_compress_args * a = ((const compress_task *) ctx)->a;
    for (int32_t w = ith; w < a->n_win; w += nth) {
        entry_of(a, w, a->out + (int64_t) w * a->head_dim);
    }
}

void rm_cpu_compress(rm_pool * pool, const rm_compress_args * a) {
    compress_task t = {a};
    rm_pool_run(pool, compress_task_fn, &t);
}
