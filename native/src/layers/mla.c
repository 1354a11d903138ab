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
 * Everything goes through the session's backend (backend.h): the projections, norms and RoPE as
 * its small ops, the attention core as its mla_attention (cpu/mla.c on the CPU). */
#include "mla.h"

#include <math.h>

#include "profile.h"
#include "types.h"

/* The scratch on the session's backend, in floats, laid out in this order. */
typedef struct mla_layout {
    uint64_t lat;     /* n_batch rows of kv_lora_rank + n_rot (+ DI): the new tokens' cache rows */
    uint64_t qlat;    /* n_batch rows of n_head * (kv_lora_rank + n_rot): absorbed queries, [Kb_h^T q_nope | q_rope] */
    uint64_t olat;    /* n_batch rows of n_head * kv_lora_rank: weighted latent sums; before them the q low rank */
    uint64_t iq;      /* sparse attention: n_batch rows of HI * DI, the indexer's queries */
    uint64_t iw;      /* and n_batch rows of HI, its heads' weights */
    uint64_t end;
} mla_layout;

/* B tokens, H heads, R rotary dims, latents of C, and the indexer's HI heads of DI (0 without) */
static mla_layout layout_of(int64_t B, int64_t H, int64_t R, int64_t C, int64_t HI, int64_t DI) {
    mla_layout l;
    l.lat = 0;
    l.qlat = l.lat + (uint64_t) (B * (C + R + DI));
    l.olat = l.qlat + (uint64_t) (B * H * (C + R));
    l.iq = l.olat + (uint64_t) (B * H * C);
    l.iw = l.iq + (uint64_t) (B * HI * DI);
    l.end = l.iw + (uint64_t) (B * HI);
    return l;
}

uint64_t rm_mla_scratch_floats(const rm_size_params * p) {
    if (p->kv_lora_rank <= 0) {
        return 0;
    }
    return layout_of(p->n_batch, p->n_head, p->n_rot, p->kv_lora_rank, p->index_n_head, p->index_head_dim).end;
}

static void mm(rm_session * s, const rm_weight * w, int64_t mat, const float * x, int64_t x_stride, int32_t n,
               float * y, int64_t y_stride, int accumulate) {
    rm_matmul_args a = {w, mat, x, x_stride, n, y, y_stride, accumulate};
    s->be->ops->matmul(s->be, &a);
}

/* Bytes of the first n elements of a cache row of type (a whole number of its blocks: the latent
 * and the indexer's key each start on one, as the session checks). */
static uint64_t row_prefix_bytes(int32_t type, int64_t n) {
    const rm_type_traits * t = rm_type_traits_get(type);
    return (uint64_t) (n / t->block_elems) * t->block_bytes;
}

/* Layer il's latents in session o's cache: n_ctx rows of kv_lora_rank + n_rot, k_row_bytes each
 * (F32, or the session's type_k). */
static uint8_t * layer_cache(const rm_session * o, int il) {
    return (uint8_t *) o->k_cache + (uint64_t) il * (uint64_t) o->n_ctx * o->k_row_bytes;
}

/* The attention core of the step's sequences (s->runs, each over its own session's latents) into
 * s->attn: the backend's op (rm_mla_args). */
static void attend(rm_session * s, int il, float * scratch, const mla_layout * l, float scale) {
    const rm_hparams * hp = &s->m->hp;
    const rm_layer * L = &s->m->layers[il];
    const int sparse = (L->kind & (RM_LAYER_DSA_INDEX | RM_LAYER_DSA_SHARED)) != 0;
    const int32_t keep = sparse ? (hp->index_top_k < s->n_ctx ? hp->index_top_k : s->n_ctx) : 0;
    rm_mla_seq seqs[64];   /* a step's sequences, 64 at a time (a token's floats do not depend on which go with it) */
    for (int32_t r0 = 0; r0 < s->n_runs; r0 += 64) {
        const int32_t c = s->n_runs - r0 < 64 ? s->n_runs - r0 : 64;
        for (int32_t r = 0; r < c; r++) {
            const rm_seq_run * run = &s->runs[r0 + r];
            seqs[r] = (rm_mla_seq) {layer_cache(run->s, il), run->row0, run->n, run->pos};
        }
        const rm_mla_args a = {&L->wk_b, &L->wv_b, s->q, scratch + l->qlat, scratch + l->olat, s->attn, seqs, c,
                               hp->n_head, hp->head_dim, hp->n_rot, hp->kv_lora_rank, hp->head_dim_v, s->n_ctx, scale,
                               s->mla_host, s->type_k, s->k_row_bytes, keep, s->dsa_sel,
                               row_prefix_bytes(s->type_k, (int64_t) hp->kv_lora_rank + hp->n_rot), s->dsa_host};
        s->be->ops->mla_attention(s->be, &a);
    }
}

/* DeepSeek sparse attention: each token's top_k positions by the layer's indexer (its queries in
 * iq and heads' weights in iw, its keys already cached beside the latents) into s->dsa_sel. */
static void pick(rm_session * s, int il, const mla_layout * l) {
    const rm_hparams * hp = &s->m->hp;
    const int32_t keep = hp->index_top_k < s->n_ctx ? hp->index_top_k : s->n_ctx;
    rm_mla_seq seqs[64];
    for (int32_t r0 = 0; r0 < s->n_runs; r0 += 64) {
        const int32_t c = s->n_runs - r0 < 64 ? s->n_runs - r0 : 64;
        for (int32_t r = 0; r < c; r++) {
            const rm_seq_run * run = &s->runs[r0 + r];
            seqs[r] = (rm_mla_seq) {layer_cache(run->s, il), run->row0, run->n, run->pos};
        }
        const int64_t latent = (int64_t) hp->kv_lora_rank + hp->n_rot;
        const rm_dsa_args a = {s->mla + l->iq, s->mla + l->iw, seqs, c, hp->index_n_head, hp->index_head_dim, keep,
                               s->type_k, s->k_row_bytes, row_prefix_bytes(s->type_k, latent), s->n_ctx, s->dsa_sel,
                               s->dsa_host + rm_dsa_gather_floats(hp, s->n_ctx)};
        s->be->ops->dsa_select(s->be, &a);
    }
}

void rm_mla_block(rm_session * s, int il, int32_t n) {
    const rm_model * m = s->m;
    const rm_hparams * hp = &m->hp;
    const rm_layer * L = &m->layers[il];
    rm_backend * be = s->be;
    const int64_t E = hp->n_embd, H = hp->n_head, D = hp->head_dim, R = hp->n_rot, DV = hp->head_dim_v;
    const int64_t C = hp->kv_lora_rank, LA = C + R, QL = hp->q_lora_rank;
    const int64_t HI = hp->index_n_head, DI = hp->index_head_dim, LW = rm_mla_row(hp);   /* DI: 0 without sparse attention */
    const int indexed = (L->kind & RM_LAYER_DSA_INDEX) != 0;
    int pick_any = 0;   /* a token of the step sees more than top_k positions: the indexer's queries are needed */
    for (int32_t r = 0; r < s->n_runs && indexed; r++) {
        pick_any |= s->runs[r].pos + s->runs[r].n > hp->index_top_k;
    }
    const mla_layout l = layout_of(s->n_batch, H, R, C, HI, DI);
    float * scratch = s->mla, * lat = scratch + l.lat;
    const int neox = m->arch->rope == RM_ROPE_NEOX;
    const int idx_neox = (m->arch->flags & RM_ARCH_DSA_ROPE_NEOX) ? 1 : neox;   /* the indexer's RoPE */

    be->ops->rmsnorm(be, s->xn, s->x, &L->attn_norm, n, E, hp->rms_eps);
    if (L->kind & RM_LAYER_MLA_Q_LORA) {
        float * qa = scratch + l.olat;   /* free until the attention core; q_lora_rank <= n_head * kv_lora_rank */
        mm(s, &L->wq_a, 0, s->xn, E, n, qa, QL, 0);
        be->ops->rmsnorm(be, qa, qa, &L->q_a_norm, n, QL, hp->rms_eps);
        mm(s, &L->wq_b, 0, qa, QL, n, s->q, H * D, 0);
        if (pick_any) {   /* the indexer's queries from the same low rank, its heads' weights from the input */
            mm(s, &L->idx_wq_b, 0, qa, QL, n, scratch + l.iq, HI * DI, 0);
            mm(s, &L->idx_proj, 0, s->xn, E, n, scratch + l.iw, HI, 0);
            be->ops->scale(be, scratch + l.iw, n * HI, 1.0f / sqrtf((float) (HI * DI)));
        }
    } else {
        mm(s, &L->wq, 0, s->xn, E, n, s->q, H * D, 0);
    }
    mm(s, &L->wkv_a, 0, s->xn, E, n, lat, LW, 0);
    for (int32_t t = 0; t < n; t++) {   /* the latent rows are strided: one norm per row */
        be->ops->rmsnorm(be, lat + t * LW, lat + t * LW, &L->kv_a_norm, 1, C, hp->rms_eps);
    }
    if (indexed) {   /* the indexer's key after each latent, LayerNorm'd */
        mm(s, &L->idx_wk, 0, s->xn, E, n, lat + LA, LW, 0);
        for (int32_t t = 0; t < n; t++) {
            be->ops->layernorm(be, lat + t * LW + LA, lat + t * LW + LA, &L->idx_k_norm, &L->idx_k_norm_b, 1, DI, 1e-6f);
        }
    } else if (DI > 0) {   /* a layer that takes the previous one's positions caches no key of its own */
        for (int32_t t = 0; t < n; t++) {
            be->ops->zero(be, lat + t * LW + LA, sizeof(float) * (uint64_t) DI);
        }
    }
    rm_prof_mark(s, RM_PROF_ATTN_IN);
    /* per sequence: RoPE on each head's last n_rot dims and on the shared rotary key after the
     * latent (and on the first n_rot dims of the indexer's queries and key), from the run's
     * position, and the rows into its session's cache */
    rm_rope_yarn y = {0};
    if (hp->rope_yarn_factor > 0.0f) {   /* YaRN with DeepSeek's scale of cos and sin (model.c) */
        rm_rope_yarn_of(hp, &y);
        y.mscale = hp->yarn_rope_mult;
    }
    for (int32_t r = 0; r < s->n_runs; r++) {
        const rm_seq_run * run = &s->runs[r];
        float * q = s->q + (int64_t) run->row0 * H * D + (D - R), * lr = lat + (int64_t) run->row0 * LW;
        float * iq = scratch + l.iq + (int64_t) run->row0 * HI * DI;
        if (hp->rope_yarn_factor > 0.0f) {
            be->ops->rope_yarn(be, q, run->n, (int32_t) H, (int32_t) D, (int32_t) R, run->pos, &y, neox);
            be->ops->rope_yarn(be, lr + C, run->n, 1, (int32_t) LW, (int32_t) R, run->pos, &y, neox);
            if (pick_any) {
                be->ops->rope_yarn(be, iq, run->n, (int32_t) HI, (int32_t) DI, (int32_t) R, run->pos, &y, idx_neox);
            }
            if (indexed) {
                be->ops->rope_yarn(be, lr + LA, run->n, 1, (int32_t) LW, (int32_t) R, run->pos, &y, idx_neox);
            }
        } else {
            be->ops->rope(be, q, run->n, (int32_t) H, (int32_t) D, (int32_t) R, run->pos, hp->rope_base, neox);
            be->ops->rope(be, lr + C, run->n, 1, (int32_t) LW, (int32_t) R, run->pos, hp->rope_base, neox);
            if (pick_any) {
                be->ops->rope(be, iq, run->n, (int32_t) HI, (int32_t) DI, (int32_t) R, run->pos, hp->rope_base, idx_neox);
            }
            if (indexed) {
                be->ops->rope(be, lr + LA, run->n, 1, (int32_t) LW, (int32_t) R, run->pos, hp->rope_base, idx_neox);
            }
        }
        uint8_t * dst = layer_cache(run->s, il) + (uint64_t) run->pos * run->s->k_row_bytes;
        if (run->s->type_k == RM_TYPE_F32) {
            be->ops->copy(be, dst, lr, sizeof(float) * (uint64_t) run->n * (uint64_t) LW);
        } else {   /* another type: the CPU backend's host memory, row by row */
            const rm_type_traits * t = rm_type_traits_get(run->s->type_k);
            for (int32_t i = 0; i < run->n; i++) {
                t->from_float(lr + (int64_t) i * LW, dst + (uint64_t) i * run->s->k_row_bytes, LW);
            }
        }
    }
    if (pick_any) {
        pick(s, il, &l);
    }
    const float scale = hp->kq_scale > 0.0f ? hp->kq_scale : 1.0f / sqrtf((float) D);
    attend(s, il, scratch, &l, scale);
    rm_prof_mark(s, RM_PROF_ATTN);
    mm(s, &L->wo, 0, s->attn, H * DV, n, s->x, E, 1);   /* x += Wo attn */
    rm_prof_mark(s, RM_PROF_ATTN_OUT);
}
