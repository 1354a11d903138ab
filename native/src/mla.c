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
 * matmul, the attention core is plain loops. */
#include "mla.h"

#include <math.h>
#include <string.h>

#include "profile.h"
#include "threads.h"
#include "types.h"

/* The scratch on the session's backend, in floats, laid out in this order. */
typedef struct mla_layout {
    uint64_t lat;     /* n_batch rows of kv_lora_rank + n_rot: the new tokens' latents */
    uint64_t qlat;    /* n_batch rows of n_head * kv_lora_rank: absorbed queries */
    uint64_t olat;    /* n_batch rows of n_head * kv_lora_rank: weighted latent sums; before them the q low rank */
    uint64_t end;
} mla_layout;

static mla_layout layout_of(int64_t B, int64_t H, int64_t R, int64_t C) {
    mla_layout l;
    l.lat = 0;
    l.qlat = l.lat + (uint64_t) (B * (C + R));
    l.olat = l.qlat + (uint64_t) (B * H * C);
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

/* Eight partial sums, so the compiler can keep them in one vector register. */
static float dot(const float * a, const float * b, int64_t n) {
    float acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        for (int k = 0; k < 8; k++) {
            acc[k] += a[i + k] * b[i + k];
        }
    }
    float sum = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; i < n; i++) {
        sum += a[i] * b[i];
    }
    return sum;
}

/* out = sum_j softmax(scores)_j v_j over m positions (v rows of width w, stride v_stride). */
static void weighted_sum(float * scores, int32_t m, const float * v, int64_t v_stride, int64_t w, float * out) {
    rm_softmax(scores, m);
    memset(out, 0, sizeof(float) * (size_t) w);
    for (int32_t j = 0; j < m; j++) {
        const float p = scores[j];
        const float * vj = v + (int64_t) j * v_stride;
        for (int64_t d = 0; d < w; d++) {
            out[d] += p * vj[d];
        }
    }
}

/* One step's attention, split over the pool's threads by head. */
typedef struct mla_task {
    const rm_session * s;
    const rm_layer *   L;
    const float *      q;        /* n rows of n_head * head_dim */
    const float *      cache;    /* this layer's latents, rows of kv_lora_rank + n_rot */
    const float *      qlat;     /* absorbed: n rows of n_head * kv_lora_rank */
    float *            olat;     /* absorbed: n rows of n_head * kv_lora_rank */
    float *            thread;   /* rm_mla_thread_floats floats per thread */
    uint64_t           per_thread;
    int32_t            n;
    float              scale;
} mla_task;

/* Absorbed: scores against the cached latents with head h's query folded into latent space;
 * the weighted latent sums go to olat (Vb_h is applied after, for all heads at once). */
static void absorbed_task(void * ctx, int ith, int nth) {
    const mla_task * t = ctx;
    const rm_hparams * hp = &t->s->m->hp;
    const int64_t H = hp->n_head, D = hp->head_dim, R = hp->n_rot, NP = D - R, C = hp->kv_lora_rank, LA = C + R;
    float * sc = t->thread + (uint64_t) ith * t->per_thread;
    int64_t h0, h1;
    rm_split(H, ith, nth, &h0, &h1);
    for (int32_t i = 0; i < t->n; i++) {
        const int32_t m = t->s->n_past + i + 1;   /* causal: positions [0, n_past + i] */
        for (int64_t h = h0; h < h1; h++) {
            const float * ql = t->qlat + ((int64_t) i * H + h) * C, * qr = t->q + ((int64_t) i * H + h) * D + NP;
            for (int32_t j = 0; j < m; j++) {
                const float * cj = t->cache + (int64_t) j * LA;
                sc[j] = (dot(ql, cj, C) + dot(qr, cj + C, R)) * t->scale;
            }
            weighted_sum(sc, m, t->cache, LA, C, t->olat + ((int64_t) i * H + h) * C);
        }
    }
}

/* Expanded: head h's keys Kb_h c_j and values Vb_h c_j for every cached position, then plain
 * attention into the session's attn rows. */
static void expanded_task(void * ctx, int ith, int nth) {
    const mla_task * t = ctx;
    const rm_session * s = t->s;
    const rm_hparams * hp = &s->m->hp;
    const rm_layer * L = t->L;
    const int64_t H = hp->n_head, D = hp->head_dim, R = hp->n_rot, NP = D - R, DV = hp->head_dim_v;
    const int64_t C = hp->kv_lora_rank, LA = C + R;
    const int32_t P = s->n_past + t->n;
    float * kb = t->thread + (uint64_t) ith * t->per_thread;   /* C rows of NP: Kb_h^T */
    float * vb = kb + C * NP;                                  /* DV rows of C: Vb_h */
    float * kexp = vb + DV * C, * vexp = kexp + (int64_t) s->n_ctx * NP, * sc = vexp + (int64_t) s->n_ctx * DV;
    const rm_type_traits * tk = rm_type_traits_get(L->wk_b.type), * tv = rm_type_traits_get(L->wv_b.type);
    int64_t h0, h1;
    rm_split(H, ith, nth, &h0, &h1);
    for (int64_t h = h0; h < h1; h++) {
        const uint8_t * kbh = rm_weight_matrix(&L->wk_b, h), * vbh = rm_weight_matrix(&L->wv_b, h);
        for (int64_t r = 0; r < C; r++) {
            tk->to_float(kbh + (uint64_t) r * L->wk_b.row_bytes, kb + r * NP, NP);
        }
        for (int64_t d = 0; d < DV; d++) {
            tv->to_float(vbh + (uint64_t) d * L->wv_b.row_bytes, vb + d * C, C);
        }
        for (int32_t j = 0; j < P; j++) {
            const float * cj = t->cache + (int64_t) j * LA;
            float * kj = kexp + (int64_t) j * NP;
            memset(kj, 0, sizeof(float) * (size_t) NP);
            for (int64_t r = 0; r < C; r++) {   /* k_nope[j] = sum_r c_j[r] Kb_h^T[r] */
                const float c = cj[r];
                const float * kr = kb + r * NP;
                for (int64_t d = 0; d < NP; d++) {
                    kj[d] += c * kr[d];
                }
            }
            for (int64_t d = 0; d < DV; d++) {
                vexp[(int64_t) j * DV + d] = dot(vb + d * C, cj, C);
            }
        }
        for (int32_t i = 0; i < t->n; i++) {
            const int32_t m = s->n_past + i + 1;
            const float * qi = t->q + ((int64_t) i * H + h) * D;
            for (int32_t j = 0; j < m; j++) {
                sc[j] = (dot(qi, kexp + (int64_t) j * NP, NP) + dot(qi + NP, t->cache + (int64_t) j * LA + C, R)) * t->scale;
            }
            weighted_sum(sc, m, vexp, DV, DV, s->attn + ((int64_t) i * H + h) * DV);
        }
    }
}

uint64_t rm_mla_thread_floats(const rm_hparams * hp, int32_t n_ctx) {
    if (hp->kv_lora_rank <= 0) {
        return 0;
    }
    const uint64_t C = (uint64_t) hp->kv_lora_rank, NP = (uint64_t) (hp->head_dim - hp->n_rot), DV = (uint64_t) hp->head_dim_v;
    return C * NP + DV * C + (uint64_t) n_ctx * (NP + DV + 1);
}

static void attend(rm_session * s, const rm_layer * L, const float * cache, int32_t n, float * scratch,
                   const mla_layout * l, float scale) {
    const rm_hparams * hp = &s->m->hp;
    const int64_t H = hp->n_head, D = hp->head_dim, DV = hp->head_dim_v, C = hp->kv_lora_rank;
    mla_task t = {s, L, s->q, cache, scratch + l->qlat, scratch + l->olat, s->mla_host,
                  rm_mla_thread_floats(hp, s->n_ctx), n, scale};
    if (n > 1) {
        rm_pool_run(s->m->pool, expanded_task, &t);
        return;
    }
    mm_heads(s, &L->wk_b, s->q, D, H * D, n, scratch + l->qlat, C, H * C);   /* qlat[h] = Kb_h^T q_nope[h] */
    rm_pool_run(s->m->pool, absorbed_task, &t);
    mm_heads(s, &L->wv_b, t.olat, C, H * C, n, s->attn, DV, H * DV);        /* attn[h] = Vb_h olat[h] */
}

/* YaRN's RoPE on interleaved pairs (rm_rope's NORM layout) of n rows: per row n_head heads of
 * `stride` floats, the first n_rot of each rotated. Pair i's angle blends pos * f_i (extrapolation)
 * and pos * f_i / factor (interpolation) by a ramp over the pairs between the correction dims,
 * those that complete beta_fast (32) and beta_slow (1) turns in the original context. */
#define YARN_BETA_FAST 32.0f
#define YARN_BETA_SLOW 1.0f

static float yarn_corr_dim(int32_t n_rot, int32_t orig_ctx, float turns, float base) {
    return (float) n_rot * logf((float) orig_ctx / (turns * 2.0f * 3.14159265358979f)) / (2.0f * logf(base));
}

static void rope_yarn(float * x, int32_t n, int32_t n_head, int64_t stride, int64_t row, int32_t n_rot, int32_t pos0,
                      const rm_hparams * hp) {
    const float lo = fmaxf(0.0f, floorf(yarn_corr_dim(n_rot, hp->yarn_orig_ctx, YARN_BETA_FAST, hp->rope_base)));
    const float hi = fminf((float) (n_rot - 1), ceilf(yarn_corr_dim(n_rot, hp->yarn_orig_ctx, YARN_BETA_SLOW, hp->rope_base)));
    for (int32_t t = 0; t < n; t++) {
        for (int32_t i = 0; i < n_rot / 2; i++) {
            const float extrap = (float) (pos0 + t) / powf(hp->rope_base, (float) (2 * i) / (float) n_rot);
            const float ramp = fminf(1.0f, fmaxf(0.0f, ((float) i - lo) / fmaxf(0.001f, hi - lo)));
            const float angle = extrap / hp->yarn_factor * ramp + extrap * (1.0f - ramp);
            const float c = cosf(angle) * hp->yarn_rope_mult, sn = sinf(angle) * hp->yarn_rope_mult;
            for (int32_t h = 0; h < n_head; h++) {
                float * v = x + t * row + h * stride;
                const float x0 = v[2 * i], x1 = v[2 * i + 1];
                v[2 * i] = x0 * c - x1 * sn;
                v[2 * i + 1] = x0 * sn + x1 * c;
            }
        }
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
    /* RoPE on each head's last n_rot dims, and on the shared rotary key after the latent */
    if (hp->yarn_factor > 0.0f) {
        rope_yarn(s->q + (D - R), n, (int32_t) H, D, H * D, (int32_t) R, s->n_past, hp);
        rope_yarn(lat + C, n, 1, LA, LA, (int32_t) R, s->n_past, hp);
    } else {
        be->ops->rope(be, s->q + (D - R), n, (int32_t) H, (int32_t) D, (int32_t) R, s->n_past, hp->rope_base, neox);
        be->ops->rope(be, lat + C, n, 1, (int32_t) LA, (int32_t) R, s->n_past, hp->rope_base, neox);
    }
    float * cache = s->k_cache + (int64_t) il * s->n_ctx * LA;
    be->ops->copy(be, cache + (int64_t) s->n_past * LA, lat, sizeof(float) * (uint64_t) n * (uint64_t) LA);
    const float scale = hp->kq_scale > 0.0f ? hp->kq_scale : 1.0f / sqrtf((float) D);
    attend(s, L, cache, n, scratch, &l, scale);
    rm_prof_mark(s, RM_PROF_ATTN);
    mm(s, &L->wo, 0, s->attn, H * DV, n, s->x, E, 1);   /* x += Wo attn */
    rm_prof_mark(s, RM_PROF_ATTN_OUT);
}
