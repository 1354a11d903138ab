/* attention.cuh - causal attention of n_tok consecutive tokens over a layer's KV cache (decode is
 * n_tok = 1, prefill any n_tok), grouped-query heads, in fp32 with an online softmax. */
#ifndef RM_CUDA_ATTENTION_CUH
#define RM_CUDA_ATTENTION_CUH

#include "common.cuh"

#define RM_CU_ATTN_MAX_HEAD_DIM 512

/* As rm_attn_args (backend.h): token t attends to positions [0, pos0 + t], the last a->window of
 * them when window > 0 (from a ring of a->ring rows when ring > 0), with sinks_dev (n_head floats in device memory, or NULL) joining each
 * softmax. head_dim <= 512 (RM_CU_ATTN_MAX_HEAD_DIM). */
cudaError_t rm_cu_attention(cudaStream_t st, const rm_attn_args * a, const float * sinks_dev);

#endif
