/* route.cuh - the router: softmax over each token's expert logits, the top k, renormalised when
 * the architecture asks for it; as rm_route_token (cpu/ops.c), ties going to the lower index. */
#ifndef RM_CUDA_ROUTE_CUH
#define RM_CUDA_ROUTE_CUH

#include "common.cuh"

#define RM_CU_ROUTE_MAX_EXPERTS 512

/* logits: n_tok rows of n_expert (<= 512); out: n_tok * k routes (residual cleared). */
cudaError_t rm_cu_route(cudaStream_t st, const float * logits, int32_t n_tok, int32_t n_expert, int32_t k, int norm,
                        rm_route * out);

/* The DeepSeek/GLM router (rm_gating_params, gating.c's rules), a block per token; bias: n_expert
 * floats or NULL. */
cudaError_t rm_cu_route_gated(cudaStream_t st, const float * logits, const float * bias, const rm_gating_params * g,
                              int32_t n_tok, int32_t n_expert, int32_t k, rm_route * out);

#endif
