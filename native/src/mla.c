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
#include "types.h"

/* The scratch, in floats, laid out in this order. */
typedef struct mla_layout {
    uint64_t lat;     /* n_batch rows of kv_lora_rank + n_rot: the new tokens' latents; later the q low rank */
    uint64_t qlat;    /* n_batch rows of n_head * kv_lora_rank: absorbed queries */
    uint64_t olat;    /* n_batch rows of n_head * kv_lora_rank: weighted latent sums; also the q low rank */
    uint64_t kb;      /* kv_lora_rank rows of nope: one head's Kb_h^T as floats */
    uint64_t kexp;    /* n_ctx rows of nope: one head's expanded keys */
    uint64_t vexp;    /* n_ctx rows of head_dim_v: one head's expanded values */
    uint64_t scores;  /* n_ctx */
    uint64_t end;
} mla_layout;

static mla_layout layout_of(int64_t B, int64_t n_ctx, int64_t H, int64_t D, int64_t R, int64_t DV, int64_t C) {
    mla_layout l;
    l.lat = 0;
    l.qlat = l.lat + (uint64_t) (B * (C + R));
    l.olat = l.qlat + (uint64_t) (B * H * C);
    l.kb = l.olat + (uint64_t) (B * H * C);
    l.kexp = l.kb + (uint64_t) (C * (D - R));
    l.vexp = l.kexp + (uint64_t) (n_ctx * (D - R));
    l.scores = l.vexp + (uint64_t) (n_ctx * DV);
    l.end = l.scores + (uint64_t) n_ctx;
    return l;
}

uint64_t rm_mla_scratch_floats(const rm_size_params * p) {
    if (p->kv_lora_rank <= 0) {
        return 0;
    }
    return layout_of(p->n_batch, p->n_ctx, p->n_head, p->head_dim, p->n_rot, p->head_dim_v, p->kv_lora_rank).end;
}

static void mm(rm_session * s, const rm_weight * w, int64_t mat, const float * x, int64_t x_stride, int32_t n,
               float * y, int64_t y_stride, int accumulate) {
    rm_matmul_args a = {w, mat, x, x_stride, n, y, y_stride, accumulate};
    s->be->ops->matmul(s->be, &a);
}

static float dot(const float * a, const float * b, int64_t n) {
    float acc = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        acc += a[i] * b[i];
    }
    return acc;
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

/* Absorbed: head h's query as a latent, attention over the cached latents, then Vb_h. */
static void attend_absorbed(rm_session * s, const rm_layer * L, const float * q, const float * cache, int32_t n,
                            float * scratch, const mla_layout * l, float scale) {
    const rm_hparams * hp = &s->m->hp;
    const int64_t H = hp->n_head, D = hp->head_dim, R = hp->n_rot, NP = D - R, DV = hp->head_dim_v;
    const int64_t C = hp->kv_lora_rank, LA = C + R;
    float * qlat = scratch + l->qlat, * olat = scratch + l->olat, * sc = scratch + l->scores;
    for (int64_t h = 0; h < H; h++) {   /* qlat[t, h] = Kb_h^T q_nope[t, h] */
        mm(s, &L->wk_b, h, q + h * D, H * D, n, qlat + h * C, H * C, 0);
    }
    for (int32_t t = 0; t < n; t++) {
        const int32_t m = s->n_past + t + 1;   /* causal: positions [0, n_past + t] */
        for (int64_t h = 0; h < H; h++) {
            const float * ql = qlat + ((int64_t) t * H + h) * C, * qr = q + ((int64_t) t * H + h) * D + NP;
            for (int32_t j = 0; j < m; j++) {
                const float * cj = cache + (int64_t) j * LA;
                sc[j] = (dot(ql, cj, C) + dot(qr, cj + C, R)) * scale;
            }
            weighted_sum(sc, m, cache, LA, C, olat + ((int64_t) t * H + h) * C);
        }
    }
    for (int64_t h = 0; h < H; h++) {   /* attn[t, h] = Vb_h olat[t, h] */
        mm(s, &L->wv_b, h, olat + h * C, H * C, n, s->attn + h * DV, H * DV, 0);
    }
}

/* Expanded: each head's keys and values for every cached position, then plain attention. */
static void attend_expanded(rm_session * s, const rm_layer * L, const float * q, const float * cache, int32_t n,
                            float * scratch, const mla_layout * l, float scale) {
    const rm_hparams * hp = &s->m->hp;
    const int64_t H = hp->n_head, D = hp->head_dim, R = hp->n_rot, NP = D - R, DV = hp->head_dim_v;
    const int64_t C = hp->kv_lora_rank, LA = C + R;
    const int32_t P = s->n_past + n;
    float * kb = scratch + l->kb, * kexp = scratch + l->kexp, * vexp = scratch + l->vexp, * sc = scratch + l->scores;
    const rm_type_traits * tt = rm_type_traits_get(L->wk_b.type);
    for (int64_t h = 0; h < H; h++) {
        const uint8_t * kbh = rm_weight_matrix(&L->wk_b, h);
        for (int64_t r = 0; r < C; r++) {   /* Kb_h^T: row r holds the nope weights of latent dim r */
            tt->to_float(kbh + (uint64_t) r * L->wk_b.row_bytes, kb + r * NP, NP);
        }
        for (int32_t j = 0; j < P; j++) {   /* k_nope[j] = Kb_h c_j */
            const float * cj = cache + (int64_t) j * LA;
            float * kj = kexp + (int64_t) j * NP;
            memset(kj, 0, sizeof(float) * (size_t) NP);
            for (int64_t r = 0; r < C; r++) {
                const float c = cj[r];
                const float * kr = kb + r * NP;
                for (int64_t d = 0; d < NP; d++) {
                    kj[d] += c * kr[d];
                }
            }
        }
        for (int32_t j = 0; j < P; j += s->n_batch) {   /* v[j] = Vb_h c_j, n_batch rows at a time */
            const int32_t c = P - j < s->n_batch ? P - j : s->n_batch;
            mm(s, &L->wv_b, h, cache + (int64_t) j * LA, LA, c, vexp + (int64_t) j * DV, DV, 0);
        }
        for (int32_t t = 0; t < n; t++) {
            const int32_t m = s->n_past + t + 1;
            const float * qt = q + ((int64_t) t * H + h) * D;
            for (int32_t j = 0; j < m; j++) {
                sc[j] = (dot(qt, kexp + (int64_t) j * NP, NP) + dot(qt + NP, cache + (int64_t) j * LA + C, R)) * scale;
            }
            weighted_sum(sc, m, vexp, DV, DV, s->attn + ((int64_t) t * H + h) * DV);
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
    const mla_layout l = layout_of(s->n_batch, s->n_ctx, H, D, R, DV, C);
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
    be->ops->rope(be, s->q + (D - R), n, (int32_t) H, (int32_t) D, (int32_t) R, s->n_past, hp->rope_base, neox);
    be->ops->rope(be, lat + C, n, 1, (int32_t) LA, (int32_t) R, s->n_past, hp->rope_base, neox);
    float * cache = s->k_cache + (int64_t) il * s->n_ctx * LA;
    be->ops->copy(be, cache + (int64_t) s->n_past * LA, lat, sizeof(float) * (uint64_t) n * (uint64_t) LA);
    const float scale = 1.0f / sqrtf((float) D);
    if (n == 1) {
        attend_absorbed(s, L, s->q, cache, n, scratch, &l, scale);
    } else {
        attend_expanded(s, L, s->q, cache, n, scratch, &l, scale);
    }
    rm_prof_mark(s, RM_PROF_ATTN);
    mm(s, &L->wo, 0, s->attn, H * DV, n, s->x, E, 1);   /* x += Wo attn */
    rm_prof_mark(s, RM_PROF_ATTN_OUT);
}
