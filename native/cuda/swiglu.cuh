/* swiglu.cuh - the gated activation of an expert: g = silu(g) * u. */
#ifndef RM_CUDA_SWIGLU_CUH
#define RM_CUDA_SWIGLU_CUH

#include "common.cuh"

cudaError_t rm_cu_swiglu(cudaStream_t st, float * g, const float * u, int64_t n);

/* gpt-oss's clamped form (RM_SWIGLU_OAI_*, host math rm_swiglu_clamp_ref in yarn.c). */
cudaError_t rm_cu_swiglu_clamp(cudaStream_t st, float * g, const float * u, int64_t n, float alpha, float limit);

#endif
