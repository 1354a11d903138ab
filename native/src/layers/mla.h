/* mla.h - internal: multi-head latent attention (DeepSeek-V2/V3, Kimi-K2, GLM-4.7-Flash).
 *
 * The cache holds one latent row per position and layer: the normalised compressed KV
 * (kv_lora_rank floats) and the rotary key shared by all heads (n_rot floats), instead of every
 * head's K and V. Decode reads it in the absorbed form (each head's key up-projection folded
 * into its query, the value up-projection applied after attention); prefill expands the latent
 * into per-head keys and values. Both compute the same attention: tests/test_arch_deepseek.py runs a prompt one token
 * at a time (absorbed) and as one batch (expanded). */
#ifndef RM_MLA_H
#define RM_MLA_H

#include "session.h"

/* Floats of the session's MLA scratch (RM_SESSION_BUF_MLA); 0 without MLA. */
uint64_t rm_mla_scratch_floats(const rm_size_params * p);

/* The attention of layer il for the n tokens of the step's sequences (s->runs: each run's rows
 * at its positions, over its own session's latent cache): x += Wo attn(x). The projections and
 * norms run over all n rows at once; RoPE and the cache per run, the attention core as the
 * backend's mla_attention. */
void rm_mla_block(rm_session * s, int il, int32_t n);

#endif
