/* mla.c - multi-head latent attention (mla.h), as DeepSeek-V2 defines it and llama.cpp stores it.
 *
 * Per token: q = Wq_b norm(Wq_a x) (or Wq x), split per head into a part without RoPE (nope =
 * head_dim - n_rot) and a rotary part; the latent [c | k_r] = Wkv_a x, c normalised, k_r rotated
 * once for all heads. Head h's key at position j is [Kb_h c_j | k_r,j] and its value Vb_h c_j,
 * with Kb_h (nope x kv_lora_rank) and Vb_h (head_dim_v x kv_lora_rank) the up-projections.
 *
 * Absorbed:  q_nope . Kb_h c_j = (Kb_h^T q_nope) . c_j, so a head's query becomes a latent
 *            (attn_k_b is stored as Kb_h^T, a plain matrix of kv_lora_rank rows), attention runs
 *            over the cached latents, and Vb_h is applied once to the weighted latent sum.
 * Expanded:  every cached latent is up-projected into the head's keys and values first.
 *
 * The activations are host memory (the CPU backend); the projections go through the backend's
 * matmul, the attention core through the CPU kernel set's attention halves. */
#include "mla.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "cpu/dispatch.h"
#include "profile.h"
#include "threads.h"
#include "types.h"

/* The scratch on the session's backend, in floats, laid out in this order. */
typedef struct mla_layout {
    uint64_t lat;     /* n_batch rows of kv_lora_rank + n_rot: the new tokens' latents */
    uint64_t qlat;    /* n_batch rows of n_head * (kv_lora_rank + n_rot): absorbed queries, [Kb_h^T q_nope | q_rope] */
    uint64_t olat;    /* n_batch rows of n_head * kv_lora_rank: weighted latent sums; before them the q low rank */
    uint64_t end;
} mla_layout;

static mla_layout layout_of(int64_t B, int64_t H, int64_t R, int64_t C) {
    mla_layout l;
    l.lat = 0;
    l.qlat = l.lat + (uint64_t) (B * (C + R));
    l.olat = l.qlat + (uint64_t) (B * H * (C + R));
    l.end = l.olat + (uint64_t) (B * H * C);
    return l;
}

uint64_t rm_mla_scratch_floats(const rm_size_params * p) {
    if (p->kv_lora_rank <= 0) {
        return 0;
    }
    return layout_of(p->n_batch, p->n_head, p->n_rot, p->kv_lora_rank).end;
}

static void mm(rm_session * s, const rm_weight * w, int64_t mat, const float * x, int64_t x_stride, int32_t n,
               float * y, int64_t y_stride, int accumulate) {
    rm_matmul_args a = {w, mat, x, x_stride, n, y, y_stride, accumulate};
    s->be->ops->matmul(s->be, &a);
}

/* y[h] = W_h x[h] for every head h of a 3-D weight (one matrix per head), in one dispatch when
 * the backend batches products. */
static void mm_heads(rm_session * s, const rm_weight * w, const float * x, int64_t x_head, int64_t x_stride,
                     int32_t n, float * y, int64_t y_head, int64_t y_stride) {
    const int64_t H = w->ne[2];
    rm_mm_item items[256];
    for (int64_t h0 = 0; h0 < H; h0 += 256) {
        const int32_t c = (int32_t) (H - h0 < 256 ? H - h0 : 256);
        for (int32_t i = 0; i < c; i++) {
            items[i] = (rm_mm_item) {{w, h0 + i, x + (h0 + i) * x_head, x_stride, n, y + (h0 + i) * y_head, y_stride, 0},
                                     NULL, 0};
        }
        if (s->be->ops->matmul_many) {
            s->be->ops->matmul_many(s->be, items, c);
        } else {
            for (int32_t i = 0; i < c; i++) {
                s->be->ops->matmul(s->be, &items[i].a);
            }
        }
    }
}

/* Both forms work in tiles of about 32 KiB, so what a loop reads again and again stays in the
 * core's first-level cache instead of coming from the second level once per position: a block
 * of an up-projection's rows passes over every position before the next block, and a block of
 * keys or values over a block of queries (the expanded form's tokens of one head, the absorbed
 * form's heads of one token, which share every latent). A block's partial sums are added with
 * axpy. */
#define MLA_TILE_FLOATS 8192
#define MLA_QUERIES     32   /* expanded: tokens sharing one pass over a block of keys and values */
#define MLA_KEYS        32   /* expanded: positions in a block of keys and values */
#define MLA_HEADS       16   /* absorbed: heads sharing one pass over a block of latents */
#define MLA_LATENTS     16   /* absorbed: latents in a block */

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

/* nq query rows; query r sees positions [0, m0 + r * m_step) and writes its output row. */
typedef struct mla_queries {
    const float * q;
    int64_t       q_stride;
    int32_t       nq, m0, m_step;
    float *       out;
    int64_t       out_stride;
} mla_queries;

/* Softmax attention of a block of queries, a block of positions at a time for all of them: the
 * scores (sc: nq rows, sc_stride apart), then the weighted sums (tmp: dv floats). */
static void attend_queries(const mla_kernels * k, const mla_kv * kv, const mla_queries * qs, float scale, float * sc,
                           int64_t sc_stride, float * tmp) {
    const int32_t last = qs->m0 + (qs->nq - 1) * qs->m_step;   /* positions the last query sees */
    for (int32_t j0 = 0; j0 < last; j0 += kv->block) {
        for (int32_t r = 0; r < qs->nq; r++) {
            const int32_t m = qs->m0 + r * qs->m_step, c = m - j0 < kv->block ? m - j0 : kv->block;
            if (c > 0) {
                k->scores(kv->dk, c, qs->q + r * qs->q_stride, kv->k + (int64_t) j0 * kv->k_stride, kv->k_stride, scale,
                          sc + r * sc_stride + j0);
            }
        }
    }
    for (int32_t r = 0; r < qs->nq; r++) {
        rm_softmax(sc + r * sc_stride, qs->m0 + r * qs->m_step);
    }
    for (int32_t j0 = 0; j0 < last; j0 += kv->block) {
        for (int32_t r = 0; r < qs->nq; r++) {
            const int32_t m = qs->m0 + r * qs->m_step, c = m - j0 < kv->block ? m - j0 : kv->block;
            float * out = qs->out + r * qs->out_stride;
            if (c > 0) {
                k->values(kv->dv, c, sc + r * sc_stride + j0, kv->v + (int64_t) j0 * kv->v_stride, kv->v_stride,
                          j0 == 0 ? out : tmp, 0);
                if (j0 > 0) {
                    k->axpy(kv->dv, 1.0f, tmp, out);
                }
            }
        }
    }
}

/* One step's attention, split over the pool's threads by head, each thread taking the next head
 * (or block of heads) from a shared counter: a descheduled thread then holds up one, not a fixed
 * share. The score and weighted-sum loops are the CPU kernel set's attention halves
 * (rm_attn_scores_fn, rm_attn_values_fn), as plain attention uses them (cpu/ops.c).
 *
 * Expanded: the n tokens of one sequence at positions pos.., over its latents in cache.
 * Absorbed: n tokens of one position each, token i of the sequence runs[i] (a batch of several
 * sequences decoding: each reads its own session's latents). */
typedef struct mla_task {
    const rm_session * s;        /* whose scratch */
    const rm_layer *   L;
    int                il;
    const float *      q;        /* n rows of n_head * head_dim */
    const float *      cache;    /* expanded: this layer's latents, rows of kv_lora_rank + n_rot */
    const rm_seq_run * runs;     /* absorbed: n runs of one token */
    float *            qlat;     /* absorbed: n rows of n_head * (kv_lora_rank + n_rot) */
    float *            olat;     /* absorbed: n rows of n_head * kv_lora_rank */
    float *            out;      /* expanded: n rows of n_head * head_dim_v */
    float *            thread;   /* rm_mla_thread_floats floats per thread */
    atomic_llong       next;     /* absorbed: the next (token, block of heads); expanded: head */
    uint64_t           per_thread;
    int32_t            n, pos;
    float              scale;
    rm_attn_scores_fn  scores;
    rm_attn_values_fn  values;
    rm_axpy_fn         axpy;
} mla_task;

/* Layer il's latents in session o's cache: n_ctx rows of kv_lora_rank + n_rot. */
static float * layer_cache(const rm_session * o, int il) {
    const rm_hparams * hp = &o->m->hp;
    return o->k_cache + (int64_t) il * o->n_ctx * (hp->kv_lora_rank + hp->n_rot);
}

/* Absorbed: head h's query is [Kb_h^T q_nope | q_rope], a row as wide as a cached latent, so its
 * scores are one dot product per position over the whole latent row; the weighted sums of the
 * latents go to olat (Vb_h is applied after, for all heads at once). A thread takes a block of
 * one token's heads at a time; they read each block of latents together. */
static void absorbed_task(void * ctx, int ith, int nth) {
    mla_task * t = ctx;
    const rm_hparams * hp = &t->s->m->hp;
    const int64_t H = hp->n_head, D = hp->head_dim, R = hp->n_rot, NP = D - R, C = hp->kv_lora_rank, LA = C + R;
    /* heads per block: up to MLA_HEADS, fewer when there would be under two blocks per thread */
    const int64_t spread = ((int64_t) H * t->n + 2 * nth - 1) / (2 * nth);
    const int64_t hb = spread < 1 ? 1 : spread > MLA_HEADS ? MLA_HEADS : spread, per = (H + hb - 1) / hb;
    const mla_kernels k = {t->scores, t->values, t->axpy};
    float * sc = t->thread + (uint64_t) ith * t->per_thread, * tmp = sc + (int64_t) MLA_HEADS * t->s->n_ctx;
    for (;;) {
        const int64_t item = atomic_fetch_add_explicit(&t->next, 1, memory_order_relaxed);
        if (item >= (int64_t) t->n * per) {
            break;
        }
        const int64_t i = item / per, h0 = (item % per) * hb, nh = H - h0 < hb ? H - h0 : hb;
        for (int64_t h = h0; h < h0 + nh; h++) {
            memcpy(t->qlat + (i * H + h) * LA + C, t->q + (i * H + h) * D + NP, sizeof(float) * (size_t) R);
        }
        const float * cache = layer_cache(t->runs[i].s, t->il);
        const mla_kv kv = {cache, LA, LA, cache, LA, C, MLA_LATENTS};
        const mla_queries qs = {t->qlat + (i * H + h0) * LA, LA, (int32_t) nh, t->runs[i].pos + 1, 0,
                                t->olat + (i * H + h0) * C, C};   /* causal: positions [0, pos] */
        attend_queries(&k, &kv, &qs, t->scale, sc, t->s->n_ctx, tmp);
    }
}

/* Head h's up-projections as floats: kb = Kb_h^T (C rows of NP), vb = Vb_h (DV rows of C). */
static void head_weights(const rm_layer * L, int64_t h, int64_t C, int64_t NP, int64_t DV, float * kb, float * vb) {
    const rm_type_traits * tk = rm_type_traits_get(L->wk_b.type), * tv = rm_type_traits_get(L->wv_b.type);
    const uint8_t * kbh = rm_weight_matrix(&L->wk_b, h), * vbh = rm_weight_matrix(&L->wv_b, h);
    for (int64_t r = 0; r < C; r++) {
        tk->to_float(kbh + (uint64_t) r * L->wk_b.row_bytes, kb + r * NP, NP);
    }
    for (int64_t d = 0; d < DV; d++) {
        tv->to_float(vbh + (uint64_t) d * L->wv_b.row_bytes, vb + d * C, C);
    }
}

/* kexp[j] = [Kb_h c_j | k_rope,j] (rows of D = NP + R) for positions [0, P): Kb_h^T's rows in
 * blocks, each block's partial sum over every position before the next. */
static void expand_keys(const mla_kernels * k, const float * cache, int64_t C, int64_t R, int32_t P, const float * kb,
                        int64_t NP, float * kexp, float * tmp) {
    const int64_t LA = C + R, D = NP + R, rows = NP < MLA_TILE_FLOATS ? MLA_TILE_FLOATS / NP : 1;
    for (int64_t r0 = 0; r0 < C; r0 += rows) {
        const int64_t rc = C - r0 < rows ? C - r0 : rows;
        for (int32_t j = 0; j < P; j++) {
            const float * cj = cache + (int64_t) j * LA;
            float * kj = kexp + (int64_t) j * D;
            k->values(NP, rc, cj + r0, kb + r0 * NP, NP, r0 == 0 ? kj : tmp, 0);   /* sum_r c_j[r] Kb_h^T[r] */
            if (r0 > 0) {
                k->axpy(NP, 1.0f, tmp, kj);
            }
        }
    }
    for (int32_t j = 0; j < P; j++) {
        memcpy(kexp + (int64_t) j * D + NP, cache + (int64_t) j * LA + C, sizeof(float) * (size_t) R);
    }
}

/* vexp[j] = Vb_h c_j (rows of DV) for positions [0, P): Vb_h's rows in blocks. */
static void expand_values(const mla_kernels * k, const float * cache, int64_t C, int64_t R, int32_t P, const float * vb,
                          int64_t DV, float * vexp) {
    const int64_t LA = C + R, rows = C < MLA_TILE_FLOATS ? MLA_TILE_FLOATS / C : 1;
    for (int64_t d0 = 0; d0 < DV; d0 += rows) {
        const int64_t dc = DV - d0 < rows ? DV - d0 : rows;
        for (int32_t j = 0; j < P; j++) {
            k->scores(C, dc, cache + (int64_t) j * LA, vb + d0 * C, C, 1.0f, vexp + (int64_t) j * DV + d0);
        }
    }
}

/* Expanded: head h's keys [Kb_h c_j | k_rope,j] (rows of head_dim) and values Vb_h c_j for every
 * cached position, then plain attention into the session's attn rows. */
static void expanded_task(void * ctx, int ith, int nth) {
    mla_task * t = ctx;
    const rm_session * s = t->s;
    const rm_hparams * hp = &s->m->hp;
    const int64_t H = hp->n_head, D = hp->head_dim, R = hp->n_rot, NP = D - R, DV = hp->head_dim_v;
    const int64_t C = hp->kv_lora_rank;
    const int32_t P = t->pos + t->n;
    const mla_kernels k = {t->scores, t->values, t->axpy};
    float * kb = t->thread + (uint64_t) ith * t->per_thread;   /* C rows of NP: Kb_h^T */
    float * vb = kb + C * NP;                                  /* DV rows of C: Vb_h */
    float * kexp = vb + DV * C, * vexp = kexp + (int64_t) s->n_ctx * D, * sc = vexp + (int64_t) s->n_ctx * DV;
    float * tmp = sc + (int64_t) MLA_QUERIES * s->n_ctx;       /* max(NP, DV): a block's partial sum */
    for (;;) {
        const int64_t h = atomic_fetch_add_explicit(&t->next, 1, memory_order_relaxed);
        if (h >= H) {
            break;
        }
        head_weights(t->L, h, C, NP, DV, kb, vb);
        expand_keys(&k, t->cache, C, R, P, kb, NP, kexp, tmp);
        expand_values(&k, t->cache, C, R, P, vb, DV, vexp);
        const mla_kv kv = {kexp, D, D, vexp, DV, DV, MLA_KEYS};
        for (int32_t i0 = 0; i0 < t->n; i0 += MLA_QUERIES) {   /* causal: token i sees [0, pos + i] */
            const mla_queries qs = {t->q + ((int64_t) i0 * H + h) * D, H * D,
                                    t->n - i0 < MLA_QUERIES ? t->n - i0 : MLA_QUERIES, t->pos + i0 + 1, 1,
                                    t->out + ((int64_t) i0 * H + h) * DV, H * DV};
            attend_queries(&k, &kv, &qs, t->scale, sc, s->n_ctx, tmp);
        }
    }
    (void) nth;
}

uint64_t rm_mla_thread_floats(const rm_hparams * hp, int32_t n_ctx) {
    if (hp->kv_lora_rank <= 0) {
        return 0;
    }
    const uint64_t C = (uint64_t) hp->kv_lora_rank, D = (uint64_t) hp->head_dim;
    const uint64_t NP = (uint64_t) (hp->head_dim - hp->n_rot), DV = (uint64_t) hp->head_dim_v;
    const uint64_t expanded = C * NP + DV * C + (uint64_t) n_ctx * (D + DV + MLA_QUERIES) + (NP > DV ? NP : DV);
    const uint64_t absorbed = (uint64_t) n_ctx * MLA_HEADS + C;
    return expanded > absorbed ? expanded : absorbed;
}

/* The attention of the step's sequences (s->runs) into s->attn. A run of several tokens (a
 * prompt's) runs the expanded form over its own session's latents, reading each head's
 * up-projections once per run (a run's tokens share them, other runs do not: the expansion is of
 * that session's cache); runs of one token (decoding) that follow each other in the batch
 * (rm_batch_eval puts them first) run the absorbed form together, so each head's up-projections
 * are read once for all of them. */
static void attend(rm_session * s, int il, float * scratch, const mla_layout * l, float scale) {
    const rm_hparams * hp = &s->m->hp;
    const rm_layer * L = &s->m->layers[il];
    const int64_t H = hp->n_head, D = hp->head_dim, DV = hp->head_dim_v, C = hp->kv_lora_rank, LA = C + hp->n_rot;
    for (int32_t r = 0; r < s->n_runs;) {
        const rm_seq_run * run = &s->runs[r];
        mla_task t = {s, L, il, s->q + (int64_t) run->row0 * H * D, NULL, NULL, NULL, NULL, NULL, s->mla_host, 0,
                      rm_mla_thread_floats(hp, s->n_ctx), run->n, run->pos, scale, rm_cpu_attn_scores(),
                      rm_cpu_attn_values(), rm_cpu_axpy()};
        atomic_init(&t.next, 0);
        if (run->n > 1) {
            t.cache = layer_cache(run->s, il);
            t.out = s->attn + (int64_t) run->row0 * H * DV;
            rm_pool_run(s->m->pool, expanded_task, &t);
            r++;
            continue;
        }
        int32_t g = 1;   /* this and the following runs of one token */
        while (r + g < s->n_runs && s->runs[r + g].n == 1) {
            g++;
        }
        t.runs = run, t.n = g;
        t.qlat = scratch + l->qlat + (int64_t) run->row0 * H * LA;
        t.olat = scratch + l->olat + (int64_t) run->row0 * H * C;
        mm_heads(s, &L->wk_b, t.q, D, H * D, g, t.qlat, LA, H * LA);   /* qlat[h] = Kb_h^T q_nope[h] */
        rm_pool_run(s->m->pool, absorbed_task, &t);
        mm_heads(s, &L->wv_b, t.olat, C, H * C, g, s->attn + (int64_t) run->row0 * H * DV, DV, H * DV);   /* attn[h] = Vb_h olat[h] */
        r += g;
    }
}

void rm_mla_block(rm_session * s, int il, int32_t n) {
    const rm_model * m = s->m;
    const rm_hparams * hp = &m->hp;
    const rm_layer * L = &m->layers[il];
    rm_backend * be = s->be;
    const int64_t E = hp->n_embd, H = hp->n_head, D = hp->head_dim, R = hp->n_rot, DV = hp->head_dim_v;
    const int64_t C = hp->kv_lora_rank, LA = C + R, QL = hp->q_lora_rank;
    const mla_layout l = layout_of(s->n_batch, H, R, C);
    float * scratch = s->mla, * lat = scratch + l.lat;
    const int neox = m->arch->rope == RM_ROPE_NEOX;

    be->ops->rmsnorm(be, s->xn, s->x, &L->attn_norm, n, E, hp->rms_eps);
    if (L->kind & RM_LAYER_MLA_Q_LORA) {
        float * qa = scratch + l.olat;   /* free until the attention core; q_lora_rank <= n_head * kv_lora_rank */
        mm(s, &L->wq_a, 0, s->xn, E, n, qa, QL, 0);
        be->ops->rmsnorm(be, qa, qa, &L->q_a_norm, n, QL, hp->rms_eps);
        mm(s, &L->wq_b, 0, qa, QL, n, s->q, H * D, 0);
    } else {
        mm(s, &L->wq, 0, s->xn, E, n, s->q, H * D, 0);
    }
    mm(s, &L->wkv_a, 0, s->xn, E, n, lat, LA, 0);
    for (int32_t t = 0; t < n; t++) {   /* the latent rows are strided: one norm per row */
        be->ops->rmsnorm(be, lat + t * LA, lat + t * LA, &L->kv_a_norm, 1, C, hp->rms_eps);
    }
    rm_prof_mark(s, RM_PROF_ATTN_IN);
    /* per sequence: RoPE on each head's last n_rot dims and on the shared rotary key after the
     * latent, from the run's position, and the latents into its session's cache */
    rm_rope_yarn y = {0};
    if (hp->rope_yarn_factor > 0.0f) {   /* YaRN with DeepSeek's scale of cos and sin (model.c) */
        rm_rope_yarn_of(hp, &y);
        y.mscale = hp->yarn_rope_mult;
    }
    for (int32_t r = 0; r < s->n_runs; r++) {
        const rm_seq_run * run = &s->runs[r];
        float * q = s->q + (int64_t) run->row0 * H * D + (D - R), * lr = lat + (int64_t) run->row0 * LA;
        if (hp->rope_yarn_factor > 0.0f) {
            be->ops->rope_yarn(be, q, run->n, (int32_t) H, (int32_t) D, (int32_t) R, run->pos, &y, neox);
            be->ops->rope_yarn(be, lr + C, run->n, 1, (int32_t) LA, (int32_t) R, run->pos, &y, neox);
        } else {
            be->ops->rope(be, q, run->n, (int32_t) H, (int32_t) D, (int32_t) R, run->pos, hp->rope_base, neox);
            be->ops->rope(be, lr + C, run->n, 1, (int32_t) LA, (int32_t) R, run->pos, hp->rope_base, neox);
        }
        be->ops->copy(be, layer_cache(run->s, il) + (int64_t) run->pos * LA, lr,
                      sizeof(float) * (uint64_t) run->n * (uint64_t) LA);
    }
    const float scale = hp->kq_scale > 0.0f ? hp->kq_scale : 1.0f / sqrtf((float) D);
    attend(s, il, scratch, &l, scale);
    rm_prof_mark(s, RM_PROF_ATTN);
    mm(s, &L->wo, 0, s->attn, H * DV, n, s->x, E, 1);   /* x += Wo attn */
    rm_prof_mark(s, RM_PROF_ATTN_OUT);
}
