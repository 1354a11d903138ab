/* swiglu.cuh - the gated activation of an expert: g = silu(g) * u. */
#ifndef RM_CUDA_SWIGLU_CUH
#define RM_CUDA_SWIGLU_CUH

#include "common.cuh"

cudaError_t rm_cu_swiglu(cudaStream_t st, float * g, const float * u, int64_t n);

#endif
