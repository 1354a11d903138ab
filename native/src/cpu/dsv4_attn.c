/* cpu/dsv4_attn.c - DeepSeek-V4's attention core on the CPU backend (backend.h's dsv4_attention):
 * the threads take (token, head) pairs in turn; each pair's logits are summed in one order (the
 * window's positions, then the entries), so a token attends alike in a prefill and in a decode. The
 * turn back is RoPE at the negated position. */
#include <math.h>

#include "cpu_ops.h"

uint64_t rm_dsv4_attn_host_floats(int32_t n_swa, int32_t ratio, int32_t n_ctx, int32_t n_threads) {
    return (uint64_t) n_threads * ((uint64_t) n_swa + (uint64_t) (n_ctx / (ratio > 0 ? ratio : 1)) + 1);
}

typedef struct dsv4_task {
    const rm_dsv4_attn_args * a;
    int64_t                   room;   /* floats of a thread's logits */
} dsv4_task;

static float dot(const float * x, const float * y, int32_t n) {
    float s = 0.0f;
    for (int32_t d = 0; d < n; d++) {
        s += x[d] * y[d];
    }
    return s;
}

static void attn_task(void * ctx, int ith, int nth) {
    const dsv4_task * t = ctx;
    const rm_dsv4_attn_args * a = t->a;
    const int32_t D = a->head_dim;
    float * logit = a->scratch_host + (int64_t) ith * t->room;
    for (int64_t pair = ith; pair < (int64_t) a->n_tok * a->n_head; pair += nth) {
        const int32_t i = (int32_t) (pair / a->n_head), h = (int32_t) (pair % a->n_head), p = a->pos0 + i;
        const float * q = a->q + ((int64_t) i * a->n_head + h) * D;
        const int32_t j0 = p - a->n_swa + 1 > 0 ? p - a->n_swa + 1 : 0, nw = p - j0 + 1;
        const int32_t nb = a->entries ? (p + 1) / a->ratio : 0;
        const int32_t * sel = a->sel ? a->sel + (int64_t) i * a->top_k : NULL;
        int32_t ne = 0;   /* the entries it attends to */
        while (a->entries && (sel ? ne < a->top_k && sel[ne] >= 0 : ne < nb)) {
            ne++;
        }
        float mx = a->sinks[h];
        for (int32_t j = 0; j < nw; j++) {
            logit[j] = dot(q, a->kv + (int64_t) ((j0 + j) % a->n_ring) * D, D) * a->scale;
            mx = fmaxf(mx, logit[j]);
        }
        for (int32_t s = 0; s < ne; s++) {
            logit[nw + s] = dot(q, a->entries + (int64_t) (sel ? sel[s] : s) * D, D) * a->scale;
            mx = fmaxf(mx, logit[nw + s]);
        }
        float sum = expf(a->sinks[h] - mx);
        for (int32_t j = 0; j < nw + ne; j++) {
            logit[j] = expf(logit[j] - mx);
            sum += logit[j];
        }
        float * o = a->out + ((int64_t) i * a->n_head + h) * D;
        for (int32_t d = 0; d < D; d++) {
            o[d] = 0.0f;
        }
        for (int32_t j = 0; j < nw + ne; j++) {
            const float * v = j < nw ? a->kv + (int64_t) ((j0 + j) % a->n_ring) * D
                                     : a->entries + (int64_t) (sel ? sel[j - nw] : j - nw) * D;
            const float pj = logit[j] / sum;
            for (int32_t d = 0; d < D; d++) {
                o[d] += pj * v[d];
            }
        }
        if (a->n_rot > 0 && a->yarn) {
            rm_rope_yarn_row(o + (D - a->n_rot), 1, a->n_rot, a->n_rot, -p, a->yarn, 0);
        } else if (a->n_rot > 0) {
            rm_rope(o + (D - a->n_rot), 1, a->n_rot, a->n_rot, -p, a->rope_base, 0);
        }
    }
}

void rm_cpu_dsv4_attention(rm_pool * pool, const rm_dsv4_attn_args * a) {
    const int32_t last = a->pos0 + a->n_tok;
    dsv4_task t = {a, (int64_t) a->n_swa + (a->entries ? last / a->ratio : 0) + 1};
    rm_pool_run(pool, attn_task, &t);
}
