/* cpu/dsv4_attn.c - DeepSeek-V4's attention core on the CPU backend (backend.h's dsv4_attention).
 * Its one key head serves every query head, so the threads take a token and up to
 * RM_ATTN_ROWS_AT_ONCE of its heads in turn, and the instruction set's attention kernels read each
 * key and value once for those heads (the scores of a head depend on its row and the key alone, the
 * values' sums run over the positions in order: a token attends alike in a prefill and in a decode).
 * The window's positions come first, then the entries; the turn back is RoPE at the negated
 * position. */
#include <math.h>

#include "cpu_ops.h"
#include "dispatch.h"

#define HEADS_AT_ONCE RM_ATTN_ROWS_AT_ONCE

uint64_t rm_dsv4_attn_host_floats(int32_t n_swa, int32_t ratio, int32_t n_ctx, int32_t n_threads) {
    return (uint64_t) n_threads * HEADS_AT_ONCE * ((uint64_t) n_swa + (uint64_t) (n_ctx / (ratio > 0 ? ratio : 1)) + 1);
}

typedef struct dsv4_task {
    const rm_dsv4_attn_args * a;
    int64_t                   room;   /* floats of one head's scores */
    rm_attn_scores_rows_fn    scores;
    rm_attn_values_rows_fn    values;
    rm_exp_sum_fn             exp_sum;
    rm_max_fn                 max_of;
} dsv4_task;

/* The scores of nr heads against n rows of kv (D floats apart) into s[r * room + at ..]. */
static void scores_of(const dsv4_task * t, int nr, const float * const q[], const float * kv, int32_t n, float * s,
                      int32_t at) {
    if (n > 0) {
        t->scores(t->a->head_dim, n, nr, q, kv, t->a->head_dim, t->a->scale, s + at, t->room);
    }
}

static void values_of(const dsv4_task * t, int nr, const float * s, int32_t at, const float * kv, int32_t n,
                      float * const out[]) {
    if (n > 0) {
        t->values(t->a->head_dim, n, nr, s + at, t->room, kv, t->a->head_dim, out);
    }
}

static void attn_task(void * ctx, int ith, int nth) {
    const dsv4_task * t = ctx;
    const rm_dsv4_attn_args * a = t->a;
    const int32_t D = a->head_dim, groups = (a->n_head + HEADS_AT_ONCE - 1) / HEADS_AT_ONCE;
    float * s = a->scratch_host + (int64_t) ith * HEADS_AT_ONCE * t->room;
    for (int64_t job = ith; job < (int64_t) a->n_tok * groups; job += nth) {
        const int32_t i = (int32_t) (job / groups), h0 = (int32_t) (job % groups) * HEADS_AT_ONCE, p = a->pos0 + i;
        const int nr = a->n_head - h0 < HEADS_AT_ONCE ? a->n_head - h0 : HEADS_AT_ONCE;
        const float * q[HEADS_AT_ONCE];
        float * out[HEADS_AT_ONCE];
        for (int r = 0; r < nr; r++) {
            q[r] = a->q + ((int64_t) i * a->n_head + h0 + r) * D;
            out[r] = a->out + ((int64_t) i * a->n_head + h0 + r) * D;
        }
        /* the window p - n_swa < j <= p: one run of the ring's rows, or two where it wraps */
        const int32_t j0 = p - a->n_swa + 1 > 0 ? p - a->n_swa + 1 : 0, nw = p - j0 + 1;
        const int32_t r0 = j0 % a->n_ring, first = r0 + nw > a->n_ring ? a->n_ring - r0 : nw;
        const int32_t nb = a->entries ? (p + 1) / a->ratio : 0;
        const int32_t * sel = a->sel ? a->sel + (int64_t) i * a->top_k : NULL;
        int32_t ne = 0;   /* the entries it attends to */
        while (a->entries && (sel ? ne < a->top_k && sel[ne] >= 0 : ne < nb)) {
            ne++;
        }
        scores_of(t, nr, q, a->kv + (int64_t) r0 * D, first, s, 0);
        scores_of(t, nr, q, a->kv, nw - first, s, first);
        if (sel) {
            for (int32_t e = 0; e < ne; e++) {
                scores_of(t, nr, q, a->entries + (int64_t) sel[e] * D, 1, s, nw + e);
            }
        } else {
            scores_of(t, nr, q, a->entries, ne, s, nw);
        }
        float sum[HEADS_AT_ONCE];
        for (int r = 0; r < nr; r++) {   /* a sink logit per head takes a share but adds nothing */
            float * sr = s + r * t->room;
            const float mx = t->max_of(sr, nw + ne, a->sinks[h0 + r]);
            sum[r] = t->exp_sum(sr, nw + ne, mx) + expf(a->sinks[h0 + r] - mx);
            for (int32_t d = 0; d < D; d++) {
                out[r][d] = 0.0f;
            }
        }
        values_of(t, nr, s, 0, a->kv + (int64_t) r0 * D, first, out);
        values_of(t, nr, s, first, a->kv, nw - first, out);
        if (sel) {
            for (int32_t e = 0; e < ne; e++) {
                values_of(t, nr, s, nw + e, a->entries + (int64_t) sel[e] * D, 1, out);
            }
        } else {
            values_of(t, nr, s, nw, a->entries, ne, out);
        }
        for (int r = 0; r < nr; r++) {
            const float inv = 1.0f / sum[r];
            for (int32_t d = 0; d < D; d++) {
                out[r][d] *= inv;
            }
            if (a->n_rot > 0 && a->yarn) {
                rm_rope_yarn_row(out[r] + (D - a->n_rot), 1, a->n_rot, a->n_rot, -p, a->yarn, 0);
            } else if (a->n_rot > 0) {
                rm_rope(out[r] + (D - a->n_rot), 1, a->n_rot, a->n_rot, -p, a->rope_base, 0);
            }
        }
    }
}

void rm_cpu_dsv4_attention(rm_pool * pool, const rm_dsv4_attn_args * a) {
    const int32_t last = a->pos0 + a->n_tok;
    dsv4_task t = {a, (int64_t) a->n_swa + (a->entries ? last / a->ratio : 0) + 1, rm_cpu_attn_scores_rows(),
                   rm_cpu_attn_values_rows(), rm_cpu_exp_sum(), rm_cpu_max()};
    rm_pool_run(pool, attn_task, &t);
}
