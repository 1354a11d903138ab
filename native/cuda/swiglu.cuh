/* swiglu.cuh - the gated activation of an expert: g = silu(g) * u. */
#ifndef RM_CUDA_SWIGLU_CUH
#define RM_CUDA_SWIGLU_CUH

#include "common.cuh"

cudaError_t rm_cu_swiglu(cudaStream_t st, float * g, const float * u, int64_t n);

/* gpt-oss's clamped form (RM_SWIGLU_OAI_*, host math rm_swiglu_clamp_ref in yarn.c). */
cudaError_t rm_cu_swiglu_clamp(cudaStream_t st, float * g, const float * u, int64_t n, float alpha, float limit);

/* Gemma 4's: g = gelu(g) * u (tanh form, rm_gelu), over n_rows rows of width, g_stride and u_stride
 * floats apart. */
cudaError_t rm_cu_geglu(cudaStream_t st, float * g, int64_t g_stride, const float * u, int64_t u_stride, int64_t width,
                        int64_t n_rows);

/* x *= f over n floats. */
cudaError_t rm_cu_scale(cudaStream_t st, float * x, int64_t n, float f);

#endif
