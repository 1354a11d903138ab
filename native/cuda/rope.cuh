/* rope.cuh - rotary position embedding in place, "norm" (adjacent pairs, GPT-J/llama) or "neox"
 * (pairs half a rotation apart) as in rm_rope (cpu/ops.c). */
#ifndef RM_CUDA_ROPE_CUH
#define RM_CUDA_ROPE_CUH

#include "common.cuh"

/* x: n_tok rows of n_head*head_dim; token t is at position pos0 + t; the first n_rot dims rotate. */
cudaError_t rm_cu_rope(cudaStream_t st, float * x, int32_t n_tok, int32_t n_head, int32_t head_dim, int32_t n_rot,
                       int32_t pos0, float base, int neox);

/* The same with pair i's frequency divided by div[i] (device memory, n_rot / 2 floats; rm_rope_div). */
cudaError_t rm_cu_rope_div(cudaStream_t st, float * x, int32_t n_tok, int32_t n_head, int32_t head_dim, int32_t n_rot,
                           int32_t pos0, float base, int neox, const float * div);

/* The same with YaRN (rm_rope_yarn, backend.h; host math rm_rope_yarn_row in yarn.c). */
cudaError_t rm_cu_rope_yarn(cudaStream_t st, float * x, int32_t n_tok, int32_t n_head, int32_t head_dim, int32_t n_rot,
                            int32_t pos0, rm_rope_yarn y, int neox);

#endif
