/* cpu/mla.c - multi-head latent attention's core on the CPU backend (backend.h's mla_attention;
 * the layer's math and its projections are in mla.c).
 *
 * Absorbed:  q_nope . Kb_h c_j = (Kb_h^T q_nope) . c_j, so a head's query becomes a latent
 *            (attn_k_b is stored as Kb_h^T, a plain matrix of kv_lora_rank rows), attention runs
 *            over the cached latents, and Vb_h is applied once to the weighted latent sum.
 * Expanded:  every cached latent is up-projected into the head's keys and values first.
 *
 * Absorbed, the step is plain attention with one kv head: keys are whole latent rows, values their
 * first kv_lora_rank floats (rm_attn_args.v_in_k), and the heads' latent queries share every row
 * of the cache, so it runs cpu/ops.c's attention (through the backend's table, as ops.c calls this
 * file): tiles of positions converted once for all heads from the cache's type, an online softmax
 * over segments, and at depth one token's positions split between the threads by segments.
 * Expanded, a cache of another type than F32 is read as floats a latent at a time for each block
 * of the up-projection, so nothing of its size is ever held as floats. */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "cpu_ops.h"
#include "dispatch.h"
#include "threads.h"
#include "types.h"

/* The expanded form works in tiles of about 32 KiB, so what a loop reads again and again stays in
 * the core's first-level cache instead of coming from the second level once per position: a block
 * of an up-projection's rows passes over every position before the next block, and a block of
 * keys or values over a block of one head's tokens. A block's partial sums are added with axpy. */
#define MLA_TILE_FLOATS 8192
#define MLA_QUERIES     32   /* tokens sharing one pass over a block of keys and values */
#define MLA_KEYS        32   /* positions in a block of keys and values */

typedef struct mla_kernels {
    rm_attn_scores_fn scores;
    rm_attn_values_fn values;
    rm_axpy_fn        axpy;
} mla_kernels;

/* What a block of queries attends to: keys and values in rows, a block of positions at a time. */
typedef struct mla_kv {
    const float * k;   /* keys: rows of dk floats, k_stride apart */
    int64_t       k_stride, dk;
    const float * v;   /* values: rows of dv floats, v_stride apart */
    int64_t       v_stride, dv;
    int32_t       block;   /* positions per block */
} mla_kv;

/* nq query rows; query r sees positions [0, m0 + r) and writes its output row. */
typedef struct mla_queries {
    const float * q;
    int64_t       q_stride;
    int32_t       nq, m0;
    float *       out;
    int64_t       out_stride;
} mla_queries;

/* Softmax attention of a block of queries, a block of positions at a time for all of them: the
 * scores (sc: nq rows, sc_stride apart), then the weighted sums (tmp: dv floats). */
static void attend_queries(const mla_kernels * k, const mla_kv * kv, const mla_queries * qs, float scale, float * sc,
                           int64_t sc_stride, float * tmp) {
    const int32_t last = qs->m0 + qs->nq - 1;   /* positions the last query sees */
    for (int32_t j0 = 0; j0 < last; j0 += kv->block) {
        const float * kb = kv->k + (int64_t) j0 * kv->k_stride;
        for (int32_t r = 0; r < qs->nq; r++) {
            const int32_t m = qs->m0 + r, c = m - j0 < kv->block ? m - j0 : kv->block;
            if (c > 0) {
                k->scores(kv->dk, c, qs->q + r * qs->q_stride, kb, kv->k_stride, scale, sc + r * sc_stride + j0);
            }
        }
    }
    for (int32_t r = 0; r < qs->nq; r++) {
        rm_softmax_sink(sc + r * sc_stride, qs->m0 + r, -INFINITY);   /* rm_softmax (ops.c would make a cycle) */
    }
    for (int32_t j0 = 0; j0 < last; j0 += kv->block) {
        const float * vb = kv->v + (int64_t) j0 * kv->v_stride;
        for (int32_t r = 0; r < qs->nq; r++) {
            const int32_t m = qs->m0 + r, c = m - j0 < kv->block ? m - j0 : kv->block;
            float * out = qs->out + r * qs->out_stride;
            if (c > 0) {
                k->values(kv->dv, c, sc + r * sc_stride + j0, vb, kv->v_stride, j0 == 0 ? out : tmp, 0);
                if (j0 > 0) {
                    k->axpy(kv->dv, 1.0f, tmp, out);
                }
            }
        }
    }
}

/* An expanded step: the n tokens of one sequence at positions pos.., over its latents in cache,
 * split over the pool's threads by head, each thread taking the next head from a shared counter (a
 * descheduled thread then holds up one, not a fixed share). The score and weighted-sum loops are
 * the CPU kernel set's attention halves (rm_attn_scores_fn, rm_attn_values_fn). */
typedef struct mla_task {
    const rm_mla_args * a;
    const float *      q;        /* n rows of n_head * head_dim */
    const void *       cache;    /* this layer's latents, rows of kv_lora_rank + n_rot (a->type) */
    float *            out;      /* n rows of n_head * head_dim_v */
    float *            thread;   /* rm_mla_thread_floats floats per thread */
    atomic_llong       next;     /* the next head */
    uint64_t           per_thread;
    int32_t            n, pos;
    float              scale;
    rm_attn_scores_fn  scores;
    rm_attn_values_fn  values;
    rm_axpy_fn         axpy;
} mla_task;

/* Head h's up-projections as floats: kb = Kb_h^T (C rows of NP), vb = Vb_h (DV rows of C). */
static void head_weights(const rm_mla_args * a, int64_t h, int64_t C, int64_t NP, int64_t DV, float * kb, float * vb) {
    const rm_type_traits * tk = rm_type_traits_get(a->wk_b->type), * tv = rm_type_traits_get(a->wv_b->type);
    const uint8_t * kbh = rm_weight_matrix(a->wk_b, h), * vbh = rm_weight_matrix(a->wv_b, h);
    for (int64_t r = 0; r < C; r++) {
        tk->to_float(kbh + (uint64_t) r * a->wk_b->row_bytes, kb + r * NP, NP);
    }
    for (int64_t d = 0; d < DV; d++) {
        tv->to_float(vbh + (uint64_t) d * a->wv_b->row_bytes, vb + d * C, C);
    }
}

/* The cached latents of one sequence: F32 rows in place, or rows of another type made floats one
 * at a time into row (LA floats). */
typedef struct mla_latents {
    const void *   cache;
    uint64_t       row_bytes;
    rm_to_float_fn to_float;   /* NULL: F32 */
    float *        row;
} mla_latents;

static const float * latent(const mla_latents * l, int32_t j, int64_t LA) {
    if (!l->to_float) {
        return (const float *) ((const uint8_t *) l->cache + (uint64_t) j * l->row_bytes);
    }
    l->to_float((const uint8_t *) l->cache + (uint64_t) j * l->row_bytes, l->row, LA);
    return l->row;
}

/* kexp[j] = [Kb_h c_j | k_rope,j] (rows of D = NP + R) for positions [0, P): Kb_h^T's rows in
 * blocks, each block's partial sum over every position before the next. */
static void expand_keys(const mla_kernels * k, const mla_latents * cache, int64_t C, int64_t R, int32_t P,
                        const float * kb, int64_t NP, float * kexp, float * tmp) {
    const int64_t LA = C + R, D = NP + R, rows = NP < MLA_TILE_FLOATS ? MLA_TILE_FLOATS / NP : 1;
    for (int64_t r0 = 0; r0 < C; r0 += rows) {
        const int64_t rc = C - r0 < rows ? C - r0 : rows;
        for (int32_t j = 0; j < P; j++) {
            const float * cj = latent(cache, j, LA);
            float * kj = kexp + (int64_t) j * D;
            k->values(NP, rc, cj + r0, kb + r0 * NP, NP, r0 == 0 ? kj : tmp, 0);   /* sum_r c_j[r] Kb_h^T[r] */
            if (r0 > 0) {
                k->axpy(NP, 1.0f, tmp, kj);
            }
        }
    }
    for (int32_t j = 0; j < P; j++) {
        memcpy(kexp + (int64_t) j * D + NP, latent(cache, j, LA) + C, sizeof(float) * (size_t) R);
    }
}

/* vexp[j] = Vb_h c_j (rows of DV) for positions [0, P): Vb_h's rows in blocks. */
static void expand_values(const mla_kernels * k, const mla_latents * cache, int64_t C, int64_t R, int32_t P,
                          const float * vb, int64_t DV, float * vexp) {
    const int64_t LA = C + R, rows = C < MLA_TILE_FLOATS ? MLA_TILE_FLOATS / C : 1;
    for (int64_t d0 = 0; d0 < DV; d0 += rows) {
        const int64_t dc = DV - d0 < rows ? DV - d0 : rows;
        for (int32_t j = 0; j < P; j++) {
            k->scores(C, dc, latent(cache, j, LA), vb + d0 * C, C, 1.0f, vexp + (int64_t) j * DV + d0);
        }
    }
}

/* Expanded: head h's keys [Kb_h c_j | k_rope,j] (rows of head_dim) and values Vb_h c_j for every
 * cached position, then plain attention into the session's attn rows. */
static void expanded_task(void * ctx, int ith, int nth) {
    mla_task * t = ctx;
    const rm_mla_args * a = t->a;
    const int64_t H = a->n_head, D = a->head_dim, R = a->n_rot, NP = D - R, DV = a->head_dim_v;
    const int64_t C = a->kv_lora_rank;
    const int32_t P = t->pos + t->n;
    const mla_kernels k = {t->scores, t->values, t->axpy};
    float * kb = t->thread + (uint64_t) ith * t->per_thread;   /* C rows of NP: Kb_h^T */
    float * vb = kb + C * NP;                                  /* DV rows of C: Vb_h */
    float * kexp = vb + DV * C, * vexp = kexp + (int64_t) a->n_ctx * D, * sc = vexp + (int64_t) a->n_ctx * DV;
    float * tmp = sc + (int64_t) MLA_QUERIES * a->n_ctx;       /* max(NP, DV): a block's partial sum */
    const mla_latents lat = {t->cache, a->row_bytes, a->type == RM_TYPE_F32 ? NULL : rm_cpu_dequantize(a->type),
                             tmp + (NP > DV ? NP : DV)};      /* row: one latent as floats */
    for (;;) {
        const int64_t h = atomic_fetch_add_explicit(&t->next, 1, memory_order_relaxed);
        if (h >= H) {
            break;
        }
        head_weights(a, h, C, NP, DV, kb, vb);
        expand_keys(&k, &lat, C, R, P, kb, NP, kexp, tmp);
        expand_values(&k, &lat, C, R, P, vb, DV, vexp);
        const mla_kv kv = {kexp, D, D, vexp, DV, DV, MLA_KEYS};
        for (int32_t i0 = 0; i0 < t->n; i0 += MLA_QUERIES) {   /* causal: token i sees [0, pos + i] */
            const mla_queries qs = {t->q + ((int64_t) i0 * H + h) * D, H * D,
                                    t->n - i0 < MLA_QUERIES ? t->n - i0 : MLA_QUERIES, t->pos + i0 + 1,
                                    t->out + ((int64_t) i0 * H + h) * DV, H * DV};
            attend_queries(&k, &kv, &qs, t->scale, sc, a->n_ctx, tmp);
        }
    }
    (void) nth;
}

/* Per thread: the expanded form's scratch (a head's up-projections, its keys and values for every
 * position, a block's scores and partial sums, a latent as floats). The absorbed form's attention
 * takes the whole of it (all threads') as its scratch; where that is short of what the attention
 * needs (small contexts), the attention takes the backend's own, for the same floats. */
static uint64_t thread_floats(int32_t head_dim, int32_t n_rot, int32_t kv_lora_rank, int32_t head_dim_v, int32_t n_ctx) {
    if (kv_lora_rank <= 0) {
        return 0;
    }
    const uint64_t C = (uint64_t) kv_lora_rank, D = (uint64_t) head_dim;
    const uint64_t NP = (uint64_t) (head_dim - n_rot), DV = (uint64_t) head_dim_v;
    const uint64_t LA = C + (uint64_t) n_rot;   /* with a cache of another type: a latent as floats */
    return C * NP + DV * C + (uint64_t) n_ctx * (D + DV + MLA_QUERIES) + (NP > DV ? NP : DV) + LA;
}

uint64_t rm_mla_thread_floats(const rm_hparams * hp, int32_t n_ctx) {
    return thread_floats(hp->head_dim, hp->n_rot, hp->kv_lora_rank, hp->head_dim_v, n_ctx);
}

/* y[h] = W_h x[h] for every head h of a 3-D weight (one matrix per head), in one dispatch. */
static void mm_heads(rm_backend * be, const rm_weight * w, const float * x, int64_t x_head, int64_t x_stride, int32_t n,
                     float * y, int64_t y_head, int64_t y_stride) {
    const int64_t H = w->ne[2];
    rm_mm_item items[256];
    for (int64_t h0 = 0; h0 < H; h0 += 256) {
        const int32_t c = (int32_t) (H - h0 < 256 ? H - h0 : 256);
        for (int32_t i = 0; i < c; i++) {
            items[i] = (rm_mm_item) {{w, h0 + i, x + (h0 + i) * x_head, x_stride, n, y + (h0 + i) * y_head, y_stride, 0},
                                     NULL, 0};
        }
        be->ops->matmul_many(be, items, c);
    }
}

/* The absorbed attention of the token of q row `row` at position pos over the latents in cache:
 * its latent queries (qlat) against the rows, into olat. With sparse attention, the rows it attends
 * to (its top_k picked ones, or all it sees) are first gathered into gather_host, in ascending
 * position, since a cached row also holds the indexer's key. */
static void absorbed_token(rm_backend * be, const rm_mla_args * a, int32_t row, const void * cache, int32_t pos,
                           int64_t scratch_floats) {
    const int64_t H = a->n_head, C = a->kv_lora_rank, LA = C + a->n_rot;
    const void * rows = cache;
    int32_t n = pos + 1;
    if (a->top_k > 0) {
        const int32_t * sel = n > a->top_k ? a->sel_host + (int64_t) row * a->top_k : NULL;
        n = sel ? a->top_k : n;
        uint8_t * g = (uint8_t *) a->gather_host;
        for (int32_t j = 0; j < n; j++) {
            memcpy(g + (uint64_t) j * a->lat_bytes, (const uint8_t *) cache + (uint64_t) (sel ? sel[j] : j) * a->row_bytes,
                   (size_t) a->lat_bytes);
        }
        rows = g;
    }
    const rm_attn_args at = {.q = a->qlat + (int64_t) row * H * LA, .k_cache = (const float *) rows,
                             .out = a->olat + (int64_t) row * H * C, .n_tok = 1, .pos0 = n - 1,
                             .n_head = (int32_t) H, .n_head_kv = 1, .head_dim = (int32_t) LA,
                             .type_k = a->type, .type_v = a->type, .scratch = a->thread_host,
                             .scale = a->scale, .head_dim_v = (int32_t) C, .scratch_floats = scratch_floats,
                             .v_in_k = 1};   /* one kv head: the latent rows; values their first C floats */
    be->ops->attention(be, &at);   /* the CPU backend's (cpu/ops.c) */
}

/* The absorbed form for g tokens of consecutive q rows from row0, token i over seqs[i]'s cache at
 * seqs[i].pos: each head's up-projections read once for all of them. */
static void absorbed(rm_backend * be, const rm_mla_args * a, int32_t row0, int32_t g, const rm_mla_seq * seqs,
                     int64_t scratch_floats) {
    const int64_t H = a->n_head, D = a->head_dim, DV = a->head_dim_v, C = a->kv_lora_rank, R = a->n_rot, LA = C + R;
    const float * q = a->q + (int64_t) row0 * H * D;
    float * qlat = a->qlat + (int64_t) row0 * H * LA, * olat = a->olat + (int64_t) row0 * H * C;
    mm_heads(be, a->wk_b, q, D, H * D, g, qlat, LA, H * LA);   /* qlat[h] = [Kb_h^T q_nope[h] | q_rope[h]] */
    for (int64_t i = 0; i < (int64_t) g * H; i++) {
        memcpy(qlat + i * LA + C, q + i * D + (D - R), sizeof(float) * (size_t) R);
    }
    for (int32_t i = 0; i < g; i++) {
        absorbed_token(be, a, row0 + i, seqs[i].cache, seqs[i].pos, scratch_floats);
    }
    mm_heads(be, a->wv_b, olat, C, H * C, g, a->out + (int64_t) row0 * H * DV, DV, H * DV);   /* out[h] = Vb_h olat[h] */
}

/* The step's sequences (rm_mla_args): one of several tokens (a prompt's) runs the expanded form
 * over its own latents, reading each head's up-projections once for its tokens (the expansion is
 * of that sequence's cache); runs of one token (decoding) that follow each other run the
 * absorbed form together, so each head's up-projections are read once for all of them, and then
 * each token's attention over its own latents. With sparse attention, a prompt's tokens that see
 * more than top_k positions run the absorbed form over their picked ones. */
void rm_cpu_mla_attention(rm_backend * be, rm_pool * pool, const rm_mla_args * a) {
    const int64_t H = a->n_head, D = a->head_dim, DV = a->head_dim_v;
    const uint64_t per_thread = thread_floats(a->head_dim, a->n_rot, a->kv_lora_rank, a->head_dim_v, a->n_ctx);
    const int64_t scratch_floats = (int64_t) (per_thread * (uint64_t) rm_pool_size(pool));
    for (int32_t r = 0; r < a->n_seqs;) {
        const rm_mla_seq * seq = &a->seqs_host[r];
        const float * q = a->q + (int64_t) seq->row0 * H * D;
        if (seq->n > 1) {
            /* the tokens that see all they see (without sparse attention, every one) run expanded */
            const int32_t dense = a->top_k <= 0 ? seq->n
                                  : a->top_k - seq->pos <= 0 ? 0 : a->top_k - seq->pos < seq->n ? a->top_k - seq->pos : seq->n;
            if (dense > 0) {
                mla_task t = {a, q, seq->cache, a->out + (int64_t) seq->row0 * H * DV, a->thread_host, 0, per_thread,
                              dense, seq->pos, a->scale, rm_cpu_attn_scores(), rm_cpu_attn_values(), rm_cpu_axpy()};
                atomic_init(&t.next, 0);
                rm_pool_run(pool, expanded_task, &t);
            }
            for (int32_t i0 = dense; i0 < seq->n; i0 += 64) {   /* the rest over their picked positions */
                rm_mla_seq tail[64];
                const int32_t g = seq->n - i0 < 64 ? seq->n - i0 : 64;
                for (int32_t i = 0; i < g; i++) {
                    tail[i] = (rm_mla_seq) {seq->cache, seq->row0 + i0 + i, 1, seq->pos + i0 + i};
                }
                absorbed(be, a, seq->row0 + i0, g, tail, scratch_floats);
            }
            r++;
            continue;
        }
        int32_t g = 1;   /* this and the following sequences of one token */
        while (r + g < a->n_seqs && a->seqs_host[r + g].n == 1) {
            g++;
        }
        absorbed(be, a, seq->row0, g, seq, scratch_floats);
        r += g;
    }
}
