/* cpu/dsa.c - DeepSeek sparse attention's lightning indexer on the CPU backend (backend.h's
 * dsa_select and layernorm; the layer's math is in layers/mla.c).
 *
 * A token at position p that sees more than top_k positions attends to the top_k positions j with
 * the best score sum_h w_h relu(q_h . k_j), k_j the indexer's key cached after position j's latent.
 * The scores of one token are computed over tiles of RM_ATTN_TILE positions, the threads taking
 * the next tile from a shared counter; each score sums the heads in order, so it is the same float
 * whichever thread computes it and however many tokens the step has. The pick is a selection of
 * the top_k-th best score, then one ascending pass keeping the positions above it and, of those
 * equal to it, the earliest. */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "cpu_ops.h"
#include "dispatch.h"
#include "threads.h"
#include "types.h"

uint64_t rm_dsa_gather_floats(const rm_hparams * hp, int32_t n_ctx) {
    if (hp->kv_lora_rank <= 0 || hp->index_head_dim <= 0) {
        return 0;
    }
    const uint64_t keep = (uint64_t) (hp->index_top_k < n_ctx ? hp->index_top_k : n_ctx);
    return keep * (uint64_t) (hp->kv_lora_rank + hp->n_rot);
}

/* After the gathered latents: the scores of n_ctx positions, a copy the selection reorders, and
 * per thread a tile of keys as floats and one head's scores over it. */
static uint64_t thread_floats(int32_t head_dim) { return (uint64_t) RM_ATTN_TILE * ((uint64_t) head_dim + 1); }

uint64_t rm_dsa_host_floats(const rm_hparams * hp, int32_t n_ctx, int32_t n_threads) {
    if (hp->kv_lora_rank <= 0 || hp->index_head_dim <= 0) {
        return 0;
    }
    return rm_dsa_gather_floats(hp, n_ctx) + 2 * (uint64_t) n_ctx +
           (uint64_t) n_threads * thread_floats(hp->index_head_dim);
}

typedef struct dsa_task {
    const rm_dsa_args * a;
    const uint8_t *     cache;
    const float *       q, * w;      /* the token's queries and head weights */
    float *             scores;      /* n positions */
    float *             thread;      /* thread_floats each */
    int32_t             n;           /* positions the token sees */
    atomic_int          next;        /* the next tile */
    rm_to_float_fn      to_float;    /* NULL: F32 keys, read in place */
    rm_attn_scores_fn   dot;
} dsa_task;

static void score_task(void * ctx, int ith, int nth) {
    dsa_task * t = ctx;
    const rm_dsa_args * a = t->a;
    const int64_t D = a->head_dim;
    float * keys = t->thread + (uint64_t) ith * thread_floats(a->head_dim), * hs = keys + RM_ATTN_TILE * D;
    for (;;) {
        const int32_t j0 = RM_ATTN_TILE * atomic_fetch_add_explicit(&t->next, 1, memory_order_relaxed);
        if (j0 >= t->n) {
            break;
        }
        const int32_t c = t->n - j0 < RM_ATTN_TILE ? t->n - j0 : RM_ATTN_TILE;
        const uint8_t * row = t->cache + (uint64_t) j0 * a->row_bytes + a->key_off;
        const float * k = keys;
        int64_t stride = D;
        if (t->to_float) {
            for (int32_t j = 0; j < c; j++) {
                t->to_float(row + (uint64_t) j * a->row_bytes, keys + (int64_t) j * D, D);
            }
        } else {   /* F32 rows: the keys in place, a row apart */
            k = (const float *) row;
            stride = (int64_t) (a->row_bytes / sizeof(float));
        }
        float * out = t->scores + j0;
        for (int32_t h = 0; h < a->n_head; h++) {
            t->dot(D, c, t->q + (int64_t) h * D, k, stride, 1.0f, hs);
            const float wh = t->w[h];
            for (int32_t j = 0; j < c; j++) {
                const float r = hs[j] > 0.0f ? hs[j] : 0.0f;
                out[j] = h == 0 ? wh * r : out[j] + wh * r;
            }
        }
    }
    (void) nth;
}

float rm_cpu_kth_largest(float * v, int32_t n, int32_t k) {
    int32_t lo = 0, hi = n - 1;
    const int32_t want = k - 1;
    while (lo < hi) {
        const float pivot = v[lo + (hi - lo) / 2];
        int32_t i = lo, j = hi;
        while (i <= j) {   /* descending: larger first */
            while (v[i] > pivot) i++;
            while (v[j] < pivot) j--;
            if (i <= j) {
                const float x = v[i];
                v[i] = v[j];
                v[j] = x;
                i++;
                j--;
            }
        }
        if (want <= j) {
            hi = j;
        } else if (want >= i) {
            lo = i;
        } else {
            break;   /* v[want] equals the pivot */
        }
    }
    return v[want];
}

void rm_cpu_top_k(const float * scores, float * copy, int32_t n, int32_t k, int32_t * out) {
    memcpy(copy, scores, sizeof(float) * (size_t) n);
    const float kth = rm_cpu_kth_largest(copy, n, k);
    int32_t above = 0;
    for (int32_t j = 0; j < n; j++) {
        above += scores[j] > kth;
    }
    int32_t ties = k - above, m = 0;
    for (int32_t j = 0; j < n && m < k; j++) {
        if (scores[j] > kth || (scores[j] == kth && ties-- > 0)) {
            out[m++] = j;
        }
    }
}

void rm_cpu_dsa_select(rm_pool * pool, const rm_dsa_args * a) {
    const int32_t K = a->top_k;
    float * scores = a->scratch_host, * copy = scores + a->n_ctx, * thread = copy + a->n_ctx;
    const rm_to_float_fn to_float = a->type == RM_TYPE_F32 ? NULL : rm_cpu_dequantize(a->type);
    for (int32_t s = 0; s < a->n_seqs; s++) {
        const rm_mla_seq * seq = &a->seqs_host[s];
        for (int32_t i = 0; i < seq->n; i++) {
            const int32_t n = seq->pos + i + 1, row = seq->row0 + i;
            if (n <= K) {
                continue;   /* it sees no more than top_k: all of them */
            }
            dsa_task t = {a, seq->cache, a->q + (int64_t) row * a->n_head * a->head_dim, a->w + (int64_t) row * a->n_head,
                          scores, thread, n, 0, to_float, rm_cpu_attn_scores()};
            atomic_init(&t.next, 0);
            rm_pool_run(pool, score_task, &t);
            rm_cpu_top_k(scores, copy, n, K, a->sel_host + (int64_t) row * K);
        }
    }
}

void rm_cpu_layernorm(float * y, const float * x, const float * w, const float * b, int64_t n_rows, int64_t n,
                      float eps) {
    for (int64_t r = 0; r < n_rows; r++) {
        const float * xr = x + r * n;
        float * yr = y + r * n;
        double sum = 0.0, sq = 0.0;
        for (int64_t j = 0; j < n; j++) {
            sum += xr[j];
        }
        const float mean = (float) (sum / (double) n);
        for (int64_t j = 0; j < n; j++) {
            const float d = xr[j] - mean;
            sq += (double) d * d;
        }
        const float inv = 1.0f / sqrtf((float) (sq / (double) n) + eps);
        for (int64_t j = 0; j < n; j++) {
            yr[j] = (xr[j] - mean) * inv * w[j] + b[j];
        }
    }
}
