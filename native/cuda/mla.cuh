/* mla.cuh - multi-head latent attention's core over a sequence's cached latents (backend.h's
 * mla_attention), in the absorbed form for every token: a head's query as a latent, attention over
 * the cached latents, the weighted latent sums out. */
#ifndef RM_CUDA_MLA_CUH
#define RM_CUDA_MLA_CUH

#include "common.cuh"

/* Latent rows of at most this many floats (kv_lora_rank + n_rot: 576 for DeepSeek-V3). */
#define RM_CU_MLA_MAX_LATENT 1024

/* qlat rows (n_tok of n_head * (C + R)): [.., C + R) of head h gets q's head h [D - R, D) (the
 * rotary part, which the absorbed query keeps as it is). */
cudaError_t rm_cu_mla_rope_part(cudaStream_t st, const float * q, float * qlat, int32_t n_tok, int32_t n_head,
                                int32_t D, int32_t R, int32_t C);

/* olat[t, h] (C floats) = sum_j softmax_j(scale * qlat[t, h] . cache[j]) cache[j][0, C) over
 * positions j in [0, pos + t], for the n_tok tokens of one sequence (cache: rows of C + R). */
cudaError_t rm_cu_mla_latent_attention(cudaStream_t st, const float * qlat, const float * cache, float * olat,
                                       int32_t n_tok, int32_t pos, int32_t n_head, int32_t C, int32_t R, float scale);

#endif
