/* sizes.c - the bytes of every buffer a session allocates (sizes.h), and rm_session_sizes_get. */
#include "sizes.h"

#include <stdio.h>

#include "backend.h"
#include "devweights.h"
#include "mla.h"
#include "split.h"
#include "status.h"
#include "types.h"

int32_t rm_session_batch(int32_t n_ctx, int32_t n_batch) {
    const int32_t b = n_batch > 0 ? n_batch : 512;   /* llama.cpp's n_ubatch */
    return b < n_ctx ? b : n_ctx;
}

int32_t rm_kv_ring_rows(int32_t n_ctx, int32_t n_batch, int32_t n_swa) {
    const int64_t r = (int64_t) n_swa + n_batch;
    return r < n_ctx ? (int32_t) r : n_ctx;
}

rm_size_params rm_size_params_of(const rm_hparams * hp, int32_t n_ctx, int32_t n_batch, uint64_t stage_expert_bytes) {
    return (rm_size_params){
        .struct_size = sizeof(rm_size_params),
        .n_layer = hp->n_layer, .n_embd = hp->n_embd, .n_head = hp->n_head, .n_head_kv = hp->n_head_kv,
        .head_dim = hp->head_dim, .n_expert = hp->n_expert, .n_expert_used = hp->n_expert_used,
        .n_ff_exp = hp->n_ff_exp, .n_ff_shexp = hp->n_ff_shexp, .n_vocab = hp->n_vocab,
        .n_ctx = n_ctx, .n_batch = n_batch, .stage_expert_bytes = stage_expert_bytes,
        .n_ff = hp->n_ff, .kv_lora_rank = hp->kv_lora_rank, .n_rot = hp->n_rot, .head_dim_v = hp->head_dim_v,
        .n_layer_linear = hp->n_layer_linear, .ssm_d_conv = hp->ssm_d_conv,
        .ssm_conv_dim = 2 * hp->ssm_n_k * hp->ssm_d_state + hp->ssm_d_inner, .ssm_n_v = hp->ssm_n_v,
        .ssm_d_state = hp->ssm_d_state, .ssm_head_v = hp->ssm_n_v > 0 ? hp->ssm_d_inner / hp->ssm_n_v : 0,
        .n_swa = hp->n_swa, .n_layer_swa = hp->n_layer_swa,
        .n_head_kv_swa = hp->n_head_kv_swa, .head_dim_swa = hp->head_dim_swa, .n_head_swa = hp->n_head_swa,
        .index_head_dim = hp->index_head_dim, .index_n_head = hp->index_n_head,
        .hc_count = hp->hc_count, .hc_low_rank = hp->hc_low_rank,
        .n_layer_ple = hp->n_ple, .ple_ngram = hp->ple_ngram, .ple_conv_kernel = hp->ple_conv_kernel,
        .ple_embd = hp->n_ple_head * hp->n_embd_per_layer, .n_layer_csa = hp->n_layer_csa,
        .n_layer_hca = hp->n_layer_hca,
    };
}

uint64_t rm_ple_state_at(const rm_size_params * p, int32_t ple_index) {
    const uint64_t dn = (uint64_t) (p->ssm_d_conv - 1) * (uint64_t) p->ssm_conv_dim * (uint64_t) p->n_layer_linear;
    const uint64_t conv = (uint64_t) (p->ple_conv_kernel - 1) * (uint64_t) p->ple_ngram * (uint64_t) p->hc_count *
                          (uint64_t) p->n_embd;
    return dn + (uint64_t) ple_index * conv;
}

void rm_recurrent_buf_bytes(const rm_size_params * p, uint64_t out[RM_RECURRENT_BUF_COUNT]) {
    for (int i = 0; i < RM_RECURRENT_BUF_COUNT; i++) out[i] = 0;
    if (p->ssm_n_v <= 0) return;
    const uint64_t f = sizeof(float), B = (uint64_t) p->n_batch, NL = (uint64_t) p->n_layer_linear;
    const uint64_t C = (uint64_t) p->ssm_conv_dim, NV = (uint64_t) p->ssm_n_v;
    const uint64_t DI = NV * (uint64_t) p->ssm_head_v, Q = (uint64_t) p->n_head * (uint64_t) p->head_dim;
    const uint64_t sizes[RM_RECURRENT_BUF_COUNT] = {
        [RM_RECURRENT_BUF_CONV_STATE] = f * (p->n_layer_ple > 0 ? rm_ple_state_at(p, p->n_layer_ple) +
                                                                  (uint64_t) (p->ple_ngram - 1)
                                                                : NL * (uint64_t) (p->ssm_d_conv - 1) * C),
        [RM_RECURRENT_BUF_SSM_STATE] = f * NL * NV * (uint64_t) rm_gdn_state_floats(p->ssm_d_state, p->ssm_head_v),
        [RM_RECURRENT_BUF_MIXED] = f * B * C,  [RM_RECURRENT_BUF_CONV_OUT] = f * B * C,
        [RM_RECURRENT_BUF_Z] = f * B * DI,     [RM_RECURRENT_BUF_BA] = f * B * 2 * NV,
        [RM_RECURRENT_BUF_G] = f * B * NV,     [RM_RECURRENT_BUF_BETA] = f * B * NV,
        [RM_RECURRENT_BUF_CORE] = f * B * DI,  [RM_RECURRENT_BUF_CONV_W] = f * C * (uint64_t) p->ssm_d_conv,
        [RM_RECURRENT_BUF_CHUNK] = f * NV * (uint64_t) rm_gdn_chunk_scratch(p->ssm_d_state, p->ssm_head_v),
        [RM_RECURRENT_BUF_QG] = f * B * 2 * Q, [RM_RECURRENT_BUF_GATE] = f * B * Q,
    };
    for (int i = 0; i < RM_RECURRENT_BUF_COUNT; i++) out[i] = sizes[i];
}

uint64_t rm_kv_row_bytes(int32_t type, int64_t n) {
    static const int32_t cache_types[] = {RM_TYPE_F32, RM_TYPE_F16, RM_TYPE_BF16, RM_TYPE_Q8_0, RM_TYPE_Q4_0,
                                          RM_TYPE_Q4_1, RM_TYPE_Q5_0, RM_TYPE_Q5_1, RM_TYPE_IQ4_NL};
    for (size_t i = 0; i < sizeof(cache_types) / sizeof(cache_types[0]); i++) {
        const rm_type_traits * t = cache_types[i] == type ? rm_type_traits_get(type) : NULL;
        if (t && t->to_float && t->from_float && n % t->block_elems == 0) {
            return (uint64_t) (n / t->block_elems) * (uint64_t) t->block_bytes;
        }
    }
    return 0;
}

int rm_kv_types_ok(int32_t type_k, int32_t type_v, int32_t head_dim, int32_t head_dim_v, int32_t latent) {
    if (latent > 0) {   /* one latent row per position in the K cache; V's type names none of it, but is a type */
        return rm_kv_row_bytes(type_k, latent) > 0 && rm_kv_row_bytes(type_v, 256) > 0;   /* 256: any type's blocks */
    }
    return rm_kv_row_bytes(type_k, head_dim) > 0 && rm_kv_row_bytes(type_v, head_dim_v > 0 ? head_dim_v : head_dim) > 0;
}

const char * rm_kv_types_why(int32_t type_k, int32_t type_v, int32_t head_dim, int32_t head_dim_v, int32_t latent) {
    static _Thread_local char why[256];
    const rm_type_traits * tk = rm_type_traits_get(type_k), * tv = rm_type_traits_get(type_v);
    const char * nk = tk && tk->name ? tk->name : "?", * nv = tv && tv->name ? tv->name : "?";
    if (latent > 0) {
        snprintf(why, sizeof(why), "cache types %s/%s: multi-head latent attention's latent cache (rows of %d) takes "
                 "one of F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL as its K type, with the row a multiple of its block, "
                 "and any of them as V", nk, nv, (int) latent);
    } else {
        const int32_t dv = head_dim_v > 0 ? head_dim_v : head_dim;
        snprintf(why, sizeof(why), "cache types %s/%s: each must be one of F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, "
                 "Q5_1, with its heads' width (keys %d, values %d) a multiple of its block", nk, nv, (int) head_dim,
                 (int) dv);
    }
    return why;
}

void rm_session_buf_bytes(const rm_size_params * p, uint64_t out[RM_SESSION_BUF_COUNT]) {
    const uint64_t f = sizeof(float), B = (uint64_t) p->n_batch, E = (uint64_t) p->n_embd;
    /* the query rows of a step: the wider layer kind's (Step-3.5's sliding layers have more heads) */
    const uint64_t NH_SWA = (uint64_t) (p->n_head_swa > 0 ? p->n_head_swa : p->n_head);
    const uint64_t Q_SWA = NH_SWA * (uint64_t) (p->head_dim_swa > 0 ? p->head_dim_swa : p->head_dim);
    const uint64_t Q_FULL = (uint64_t) p->n_head * (uint64_t) p->head_dim;
    const uint64_t Q = Q_SWA > Q_FULL ? Q_SWA : Q_FULL;
    const uint64_t KV_SCRATCH = (uint64_t) (p->n_head_kv_swa > 0 ? p->n_head_kv_swa : p->n_head_kv) *
                                (uint64_t) (p->head_dim_swa > 0 ? p->head_dim_swa : p->head_dim);
    const uint64_t KV = (uint64_t) p->n_head_kv * (uint64_t) p->head_dim;
    /* the k and v rows of a step: the widest layer's */
    uint64_t KV_STEP = KV_SCRATCH > KV ? KV_SCRATCH : KV;
    /* the k rows also hold a head-gated layer's gates (one per query head) once the keys are cached */
    const uint64_t NH = NH_SWA > (uint64_t) p->n_head ? NH_SWA : (uint64_t) p->n_head;
    KV_STEP = KV_STEP > NH ? KV_STEP : NH;
    uint64_t F = (uint64_t) (p->n_ff_exp > p->n_ff_shexp ? p->n_ff_exp : p->n_ff_shexp);
    F = (uint64_t) p->n_ff > F ? (uint64_t) p->n_ff : F;   /* leading dense layers use the same gate/up buffers */
    /* MLA caches one latent (kv_lora_rank + n_rot, and the sparse attention indexer's key) per position
     * in the K cache and no V */
    const uint64_t K_ROW = p->kv_lora_rank > 0 ? (uint64_t) p->kv_lora_rank + (uint64_t) p->n_rot +
                                                     (uint64_t) p->index_head_dim : KV;
    const int32_t DV = p->head_dim_v > 0 ? p->head_dim_v : p->head_dim;
    const uint64_t V_ROW = p->kv_lora_rank > 0 ? 0 : (uint64_t) p->n_head_kv * (uint64_t) DV;
    uint64_t ATT = p->head_dim_v > p->head_dim ? (uint64_t) p->n_head * (uint64_t) p->head_dim_v : Q;
    ATT = ATT > Q ? ATT : Q;
    ATT = ATT > E ? ATT : E;   /* also the dense FFN's output beside the experts (Gemma 4's) */
    /* linear-attention layers keep a recurrent state instead (rm_recurrent_buf_bytes) */
    const uint64_t cached = (uint64_t) (p->n_layer - p->n_layer_linear) * (uint64_t) p->n_ctx;
    const uint64_t L = B < RM_LOGIT_ROWS ? B : RM_LOGIT_ROWS;
    const int32_t n_swa_layers = p->n_swa > 0 && p->n_layer_swa > 0 ? p->n_layer_swa : 0;
    /* the sliding layers' rings, of their own row width where it differs (Gemma 4) */
    const uint64_t RINGS = (uint64_t) n_swa_layers * (uint64_t) rm_kv_ring_rows(p->n_ctx, p->n_batch, p->n_swa);
    const uint64_t POS = cached - (uint64_t) n_swa_layers * (uint64_t) p->n_ctx;
    const uint64_t KV_SWA = p->kv_lora_rank > 0 ? K_ROW
                            : (uint64_t) (p->n_head_kv_swa > 0 ? p->n_head_kv_swa : p->n_head_kv) *
                                  (uint64_t) (p->head_dim_swa > 0 ? p->head_dim_swa : p->head_dim);
    const uint64_t V_SWA = (uint64_t) (p->n_head_kv_swa > 0 ? p->n_head_kv_swa : p->n_head_kv) *
                           (uint64_t) rm_head_dim_v_swa(p->head_dim, DV, p->head_dim_swa > 0 ? p->head_dim_swa : p->head_dim);
    const uint64_t V_STEP = KV_STEP > V_ROW ? (KV_STEP > V_SWA ? KV_STEP : V_SWA) : (V_ROW > V_SWA ? V_ROW : V_SWA);
    const uint64_t sizes[RM_SESSION_BUF_COUNT] = {
        [RM_SESSION_BUF_K_CACHE] = POS * rm_kv_row_bytes(p->type_k, (int64_t) K_ROW) +
                                   RINGS * rm_kv_row_bytes(p->type_k, (int64_t) KV_SWA),
        [RM_SESSION_BUF_V_CACHE] = POS * rm_kv_row_bytes(p->type_v, (int64_t) V_ROW) +
                                   RINGS * (V_ROW ? rm_kv_row_bytes(p->type_v, (int64_t) V_SWA) : 0),
        [RM_SESSION_BUF_X] = f * B * E,       [RM_SESSION_BUF_XN] = f * B * E,
        [RM_SESSION_BUF_Q] = f * B * Q,       [RM_SESSION_BUF_K] = f * B * KV_STEP,
        [RM_SESSION_BUF_V] = f * B * V_STEP,  [RM_SESSION_BUF_ATTN] = f * B * ATT,
        [RM_SESSION_BUF_MOE] = f * B * E,     [RM_SESSION_BUF_ROUTER] = f * B * (uint64_t) p->n_expert,
        /* eg: also an expert's gate and up rows side by side (llama.cpp's fused ffn_gate_up_exps) */
        [RM_SESSION_BUF_EX] = f * B * E,      [RM_SESSION_BUF_EG] = f * B * (F > 2 * (uint64_t) p->n_ff_exp ? F : 2 * (uint64_t) p->n_ff_exp),
        [RM_SESSION_BUF_EU] = f * B * F,      [RM_SESSION_BUF_ED] = f * B * E,
        [RM_SESSION_BUF_ECAL] = f * B * E,    [RM_SESSION_BUF_SHGATE] = f * B,
        [RM_SESSION_BUF_LOGITS] = f * L * (uint64_t) p->n_vocab,
        [RM_SESSION_BUF_MLA] = f * rm_mla_scratch_floats(p),
        /* hyper-connections (hyper.c): the streams, their norms and gates, the gates' low rank, the weights */
        [RM_SESSION_BUF_HC] = f * B * (3 * (uint64_t) p->hc_count * E + (uint64_t) p->hc_low_rank + (uint64_t) p->hc_count),
    };
    for (int i = 0; i < RM_SESSION_BUF_COUNT; i++) out[i] = sizes[i];
}

void rm_split_buf_bytes(const rm_size_params * p, uint64_t out[RM_SPLIT_BUF_COUNT]) {
    const uint64_t f = sizeof(float), E = (uint64_t) p->n_embd, F = (uint64_t) p->n_ff_exp;
    const uint64_t S = (uint64_t) p->n_batch * (uint64_t) p->n_expert_used;   /* slots */
    const uint64_t sizes[RM_SPLIT_BUF_COUNT] = {
        [RM_SPLIT_BUF_ROUTES] = sizeof(rm_route) * S, [RM_SPLIT_BUF_IDX] = sizeof(int32_t) * S,
        [RM_SPLIT_BUF_SCALE] = sizeof(float) * S,
        [RM_SPLIT_BUF_XC] = f * S * E, [RM_SPLIT_BUF_GC] = f * S * F, [RM_SPLIT_BUF_UC] = f * S * F,
        [RM_SPLIT_BUF_DC] = f * S * E, [RM_SPLIT_BUF_GF] = f * S * F, [RM_SPLIT_BUF_UF] = f * S * F,
        [RM_SPLIT_BUF_HF] = f * S * F, [RM_SPLIT_BUF_DF] = f * S * E, [RM_SPLIT_BUF_HR] = f * S * E,
        [RM_SPLIT_BUF_TAB] = rm_split_layout_for((int64_t) S).end,
    };
    for (int i = 0; i < RM_SPLIT_BUF_COUNT; i++) out[i] = sizes[i];
}

uint64_t rm_split_stage_buf_bytes(const rm_size_params * p) {
    return RM_SPLIT_STAGE_MAX * rm_dev_round_up(p->stage_expert_bytes);
}

uint64_t rm_device_expert_table_bytes(int32_t n_layer, int32_t n_expert) {
    if (n_layer < 0 || n_expert < 0) return 0;
    return sizeof(const uint8_t *) * (uint64_t) n_layer * 3 * (uint64_t) n_expert;
}

rm_status rm_session_sizes_get(const rm_size_params * p, rm_session_sizes * out) {
    rm_clear_error();
    if (p == NULL || out == NULL) return rm_fail(RM_E_INVALID_ARG, "%s: params and out must not be NULL", __func__);
    if (p->struct_size != sizeof(rm_size_params) || out->struct_size != sizeof(rm_session_sizes))
        return rm_fail(RM_E_INVALID_ARG, "%s: struct_size %u, %u != %zu, %zu (mismatched header)", __func__,
                       p->struct_size, out->struct_size, sizeof(rm_size_params), sizeof(rm_session_sizes));
    const struct { const char * name; int32_t v; } need[] = {
        {"n_layer", p->n_layer}, {"n_embd", p->n_embd}, {"n_head", p->n_head}, {"n_head_kv", p->n_head_kv},
        {"head_dim", p->head_dim}, {"n_expert", p->n_expert}, {"n_expert_used", p->n_expert_used},
        {"n_ff_exp", p->n_ff_exp}, {"n_vocab", p->n_vocab}, {"n_ctx", p->n_ctx},
    };
    for (size_t i = 0; i < sizeof(need) / sizeof(need[0]); i++) {
        if (need[i].v <= 0) return rm_fail(RM_E_INVALID_ARG, "%s: %s is %d, must be > 0", __func__, need[i].name, (int) need[i].v);
    }
    if (p->n_ff_shexp < 0) return rm_fail(RM_E_INVALID_ARG, "%s: n_ff_shexp is %d, must be >= 0", __func__, (int) p->n_ff_shexp);
    if (p->index_head_dim < 0) return rm_fail(RM_E_INVALID_ARG, "%s: index_head_dim is %d, must be >= 0", __func__,
                                              (int) p->index_head_dim);
    /* the latent, and with sparse attention the whole row (the indexer's key starts on a block) */
    const int32_t latent = p->kv_lora_rank > 0 ? p->kv_lora_rank + p->n_rot : 0;
    for (int32_t w = latent; ; w += p->index_head_dim) {
        if (!rm_kv_types_ok(p->type_k, p->type_v, p->head_dim, p->head_dim_v, w)) {
            return rm_fail(RM_E_UNSUPPORTED_TYPE, "%s: %s", __func__, rm_kv_types_why(p->type_k, p->type_v, p->head_dim,
                                                                                     p->head_dim_v, w));
        }
        if (w != latent || latent == 0 || p->index_head_dim == 0) break;
    }
    rm_size_params q = *p;
    q.n_batch = rm_session_batch(p->n_ctx, p->n_batch);
    uint64_t s[RM_SESSION_BUF_COUNT], d[RM_SPLIT_BUF_COUNT];
    rm_session_buf_bytes(&q, s);
    rm_split_buf_bytes(&q, d);
    *out = (rm_session_sizes){.struct_size = sizeof(rm_session_sizes)};
    out->kv_cache = s[RM_SESSION_BUF_K_CACHE] + s[RM_SESSION_BUF_V_CACHE];
    if (p->kv_lora_rank == 0 && p->index_head_dim > 0 && p->n_layer_linear > 0) {   /* QSA (qwen4exp): each attention
                                                                                        layer's indexer keys */
        out->kv_cache += sizeof(float) * (uint64_t) (p->n_layer - p->n_layer_linear) * (uint64_t) p->n_ctx *
                         (uint64_t) p->index_head_dim;
    }
    /* DeepSeek-V4's compressors (dsv4.c): entries of the context's windows and the rings of their rows, kv and gate
     * (CSA: the attention's and the indexer's, each two series wide) */
    const uint64_t D = (uint64_t) p->head_dim, ID = (uint64_t) p->index_head_dim;
    const uint64_t csa = (uint64_t) rm_dsv4_entry_rows(p->n_ctx, 4) * (D + ID) + 2 * (uint64_t) rm_dsv4_ring_rows(4, 1) *
                         (2 * D + 2 * ID);
    const uint64_t hca = (uint64_t) rm_dsv4_entry_rows(p->n_ctx, 128) * D + 2 * (uint64_t) rm_dsv4_ring_rows(128, 0) * D;
    out->kv_cache += sizeof(float) * ((uint64_t) p->n_layer_csa * csa + (uint64_t) p->n_layer_hca * hca);
    for (int i = RM_SESSION_BUF_V_CACHE + 1; i < RM_SESSION_BUF_COUNT; i++) out->activations += s[i];
    for (int i = RM_SPLIT_BUF_ROUTES; i <= RM_SPLIT_BUF_SCALE; i++) out->split_routing += d[i];
    for (int i = RM_SPLIT_BUF_SCALE + 1; i < RM_SPLIT_BUF_COUNT; i++) out->split_scratch += d[i];
    out->split_stage = rm_split_stage_buf_bytes(&q);
    uint64_t r[RM_RECURRENT_BUF_COUNT];
    rm_recurrent_buf_bytes(&q, r);
    for (int i = 0; i < RM_RECURRENT_BUF_COUNT; i++) out->recurrent_state += r[i];
    out->recurrent_state += RM_HYBRID_CHECKPOINTS * (r[RM_RECURRENT_BUF_CONV_STATE] + r[RM_RECURRENT_BUF_SSM_STATE]);
    return RM_OK;
}
