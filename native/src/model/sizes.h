/* sizes.h - internal: the bytes of every buffer a session allocates, computed in one place.
 *
 * The session (session.c), the split's device backends (standin.c, native/cuda) and the public
 * rm_session_sizes_get all take their numbers from here, so what a planner is told a session
 * needs is what the session then allocates. Each function fills an array in the order its
 * caller allocates, indexed by the enums below. */
#ifndef RM_SIZES_H
#define RM_SIZES_H

#include "model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Rows of the output head computed per backend call (bounds the device buffer for logits). */
#define RM_LOGIT_ROWS 16

/* The session's tokens per step: n_batch (<= 0: 256), at most n_ctx. */
int32_t rm_session_batch(int32_t n_ctx, int32_t n_batch);

/* The positions a sliding-window layer's cache keeps: the window plus one step of tokens, so that
 * every token of a step still finds its whole window after the step's keys are written (at most
 * n_ctx). Position p lives in row p % rows. */
int32_t rm_kv_ring_rows(int32_t n_ctx, int32_t n_batch, int32_t n_swa);

/* A DeepSeek-V4 compressor's state (dsv4.c): the rows of its last window (two with CSA's overlapping
 * series) in a ring, and an entry per window of the context. */
static inline int32_t rm_dsv4_ring_rows(int32_t ratio, int overlap) { return overlap ? 2 * ratio : ratio; }
static inline int64_t rm_dsv4_entry_rows(int32_t n_ctx, int32_t ratio) { return (int64_t) n_ctx / ratio + 1; }

/* The size parameters of a session of model hp, n_ctx positions and n_batch (as clamped) tokens
 * per step; stage_expert_bytes: rm_split_stage_bytes, or 0 when the device stages no residuals. */
rm_size_params rm_size_params_of(const rm_hparams * hp, int32_t n_ctx, int32_t n_batch, uint64_t stage_expert_bytes);

/* Bytes of a cache row of n elements of type (rm_session_params.type_k/type_v): n / block_elems
 * blocks; 0 for a type that is not a cache type or does not divide n. */
uint64_t rm_kv_row_bytes(int32_t type, int64_t n);

/* 1 when a session of these cache types can be made for key heads of head_dim and value heads of
 * head_dim_v (0: head_dim), or with multi-head
 * latent attention for latent rows of `latent` (kv_lora_rank + n_rot; 0 without MLA: its latents
 * take type_k, and no V is cached); else rm_kv_types_why says why (a thread's own buffer). */
int          rm_kv_types_ok(int32_t type_k, int32_t type_v, int32_t head_dim, int32_t head_dim_v, int32_t latent);
const char * rm_kv_types_why(int32_t type_k, int32_t type_v, int32_t head_dim, int32_t head_dim_v, int32_t latent);

/* The forward pass's buffers (rm_session), on the session's backend. */
enum {
    RM_SESSION_BUF_K_CACHE, RM_SESSION_BUF_V_CACHE,
    RM_SESSION_BUF_X, RM_SESSION_BUF_XN, RM_SESSION_BUF_Q, RM_SESSION_BUF_K, RM_SESSION_BUF_V,
    RM_SESSION_BUF_ATTN, RM_SESSION_BUF_MOE, RM_SESSION_BUF_ROUTER, RM_SESSION_BUF_EX,
    RM_SESSION_BUF_EG, RM_SESSION_BUF_EU, RM_SESSION_BUF_ED, RM_SESSION_BUF_ECAL,
    RM_SESSION_BUF_SHGATE, RM_SESSION_BUF_LOGITS, RM_SESSION_BUF_MLA, RM_SESSION_BUF_HC,
    RM_SESSION_BUF_COUNT
};
void rm_session_buf_bytes(const rm_size_params * p, uint64_t out[RM_SESSION_BUF_COUNT]);

/* A device backend's per-session buffers for the CPU/GPU split: each slot's route, token row and
 * weight, then the split's scratch (split.h names them) and its plan tables. They depend on
 * n_batch and the shapes, not on n_ctx (a backend may pass 0 for it). */
enum {
    RM_SPLIT_BUF_ROUTES, RM_SPLIT_BUF_IDX, RM_SPLIT_BUF_SCALE,
    RM_SPLIT_BUF_XC, RM_SPLIT_BUF_GC, RM_SPLIT_BUF_UC, RM_SPLIT_BUF_DC, RM_SPLIT_BUF_GF,
    RM_SPLIT_BUF_UF, RM_SPLIT_BUF_HF, RM_SPLIT_BUF_DF, RM_SPLIT_BUF_HR, RM_SPLIT_BUF_TAB,
    RM_SPLIT_BUF_COUNT
};
void rm_split_buf_bytes(const rm_size_params * p, uint64_t out[RM_SPLIT_BUF_COUNT]);

/* Checkpoints of a session's recurrent states kept for prefix reuse (rm_session_checkpoint), each
 * a copy of the conv and delta-rule states; counted in rm_session_sizes' recurrent_state. */
#define RM_HYBRID_CHECKPOINTS 4

/* A hybrid model's host buffers (deltanet.c), present when the model has linear-attention keys
 * (ssm_n_v > 0): the recurrent states of its linear layers, their scratch for a step of n_batch
 * tokens, and the gated attention's q-and-gate rows. */
enum {
    RM_RECURRENT_BUF_CONV_STATE, RM_RECURRENT_BUF_SSM_STATE,
    RM_RECURRENT_BUF_MIXED, RM_RECURRENT_BUF_CONV_OUT, RM_RECURRENT_BUF_Z, RM_RECURRENT_BUF_BA,
    RM_RECURRENT_BUF_G, RM_RECURRENT_BUF_BETA, RM_RECURRENT_BUF_CORE, RM_RECURRENT_BUF_CONV_W,
    RM_RECURRENT_BUF_CHUNK, RM_RECURRENT_BUF_QG, RM_RECURRENT_BUF_GATE,
    RM_RECURRENT_BUF_COUNT
};
void rm_recurrent_buf_bytes(const rm_size_params * p, uint64_t out[RM_RECURRENT_BUF_COUNT]);
/* PLE (qwen4exp) keeps its state in the conv state, after the linear layers' DeltaNet conv states:
 * each PLE layer's dilated conv ((ple_conv_kernel - 1) * ple_ngram rows of hc_count * n_embd floats,
 * oldest first), then the session's last ple_ngram - 1 tokens (one int32 each, oldest first, the
 * token + 1: 0 is none, before the start). Where PLE layer i's starts, in floats from the conv
 * state's start; i = n_layer_ple: where the tokens start. */
uint64_t rm_ple_state_at(const rm_size_params * p, int32_t ple_index);

/* The prefill staging buffer: RM_SPLIT_STAGE_MAX experts' residuals; 0 without staging. */
uint64_t rm_split_stage_buf_bytes(const rm_size_params * p);

#ifdef __cplusplus
}
#endif

#endif
